//! The name rules, shared by configuration (tenant and server names) and
//! the catalog (exposed tool names): `server__tool`, or the tool's own
//! name for bare servers, always matching `^[a-zA-Z0-9_-]{1,64}$`.

/// Separates the server namespace from the tool's own name.
pub const DELIMITER: &str = "__";

/// Longest exposed name model providers accept.
pub const MAX_NAME_LEN: usize = 64;

/// The exposed name of `tool` on `server`.
pub fn expose(server: &str, tool: &str, bare: bool) -> String {
    if bare {
        tool.to_owned()
    } else {
        format!("{server}{DELIMITER}{tool}")
    }
}

/// Whether `name` matches `^[a-zA-Z0-9_-]{1,64}$`.
pub fn is_valid_exposed(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` may name a server: a valid exposed name without the
/// delimiter, so that `server__tool` splits in exactly one way.
pub fn is_valid_server_name(name: &str) -> bool {
    is_valid_exposed(name) && !name.contains(DELIMITER)
}

/// Whether `name` may name a tenant: 1 to 64 of `a-zA-Z0-9._-`.
pub fn is_valid_tenant_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Whether `name` is a valid name of a stored secret (`{stored: NAME}`):
/// the tenant name rule.
pub fn is_valid_secret_name(name: &str) -> bool {
    is_valid_tenant_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_with_and_without_prefix() {
        assert_eq!(expose("repo", "search", false), "repo__search");
        assert_eq!(expose("repo", "search", true), "search");
    }

    #[test]
    fn validates_the_provider_pattern() {
        assert!(is_valid_exposed("a"));
        assert!(is_valid_exposed(&"x".repeat(64)));
        assert!(!is_valid_exposed(&"x".repeat(65)));
        assert!(!is_valid_exposed(""));
        assert!(!is_valid_exposed("has space"));
        assert!(!is_valid_exposed("dot.ted"));
        assert!(!is_valid_exposed("ünïcode"));
        assert!(is_valid_server_name("my-server_1"));
        assert!(!is_valid_server_name("a__b"));
    }
}
