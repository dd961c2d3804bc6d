//! What caller authentication puts into the request extensions: the
//! [`Subject`] a call acts for and the [`Caller`] (how it proved itself).

use std::sync::Arc;

/// The metadata key naming the end user a call acts for.
pub const SUBJECT_METADATA: &str = "x-toolgate-subject";

/// Longest subject accepted, in bytes.
pub const MAX_SUBJECT_LEN: usize = 256;

/// The end user (or workload) a call acts for: the `x-toolgate-subject`
/// metadata, an opaque id trusted because the tenant's token is. `None`
/// means the tenant itself. Per-user upstream credentials are kept per
/// (tenant, subject, server); one subject's never serves another.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Subject(Option<Arc<str>>);

impl Subject {
    /// The tenant itself (no end user).
    pub fn tenant() -> Self {
        Self(None)
    }

    /// An end user's subject.
    ///
    /// # Errors
    /// Empty, longer than [`MAX_SUBJECT_LEN`] bytes, or with a byte outside
    /// visible ASCII (`!` to `~`).
    pub fn named(id: &str) -> Result<Self, &'static str> {
        if id.is_empty() {
            return Err("the x-toolgate-subject metadata is empty");
        }
        if id.len() > MAX_SUBJECT_LEN {
            return Err("the x-toolgate-subject metadata is longer than 256 bytes");
        }
        if !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the x-toolgate-subject metadata must be visible ASCII (no spaces or control characters)",
            );
        }
        Ok(Self(Some(Arc::from(id))))
    }

    /// The subject's id; `None` for the tenant itself.
    pub fn id(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The id as stored and keyed: the empty string for the tenant itself.
    pub fn key(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }

    /// Reads the subject from request metadata.
    ///
    /// # Errors
    /// The metadata is present but not a valid subject.
    pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> Result<Self, &'static str> {
        Self::from_headers(metadata.as_ref())
    }

    /// Reads the subject from request headers.
    ///
    /// # Errors
    /// The header is present but not a valid subject.
    pub fn from_headers(headers: &http::HeaderMap) -> Result<Self, &'static str> {
        match headers.get(SUBJECT_METADATA) {
            None => Ok(Self::tenant()),
            Some(value) => value
                .to_str()
                .map_err(|_| "the x-toolgate-subject metadata must be visible ASCII")
                .and_then(Self::named),
        }
    }
}

/// Who is calling, as proven by its credential: put into the request
/// extensions next to the tenant and the [`Subject`], for policy and
/// audit. Never holds the credential itself.
#[derive(Debug, Clone)]
pub struct Caller {
    /// How the caller proved who it is.
    pub identity: CallerIdentity,
    /// The verified claims of a JWT caller; an empty object for a static
    /// token.
    pub claims: Arc<serde_json::Value>,
}

impl Caller {
    /// A caller with a static token: `tokens[index]` of its tenant.
    pub fn static_token(index: usize) -> Self {
        Self {
            identity: CallerIdentity::Token { index },
            claims: Arc::new(serde_json::Value::Object(serde_json::Map::new())),
        }
    }
}

/// How a caller proved who it is (never the credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerIdentity {
    /// A static bearer token: its position in the tenant's `tokens`.
    Token {
        /// The index in `tenants[].tokens`.
        index: usize,
    },
    /// A JWT from a configured issuer.
    Jwt {
        /// The `iss` claim.
        issuer: String,
        /// The `sub` claim.
        subject: String,
    },
}

impl std::fmt::Display for CallerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallerIdentity::Token { index } => write!(f, "token[{index}]"),
            CallerIdentity::Jwt { issuer, subject } => write!(f, "jwt {issuer} {subject}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_bounded_visible_ascii() {
        assert_eq!(
            Subject::named("user-42@example").unwrap().id(),
            Some("user-42@example")
        );
        assert!(Subject::named("").is_err());
        assert!(Subject::named("a b").is_err());
        assert!(Subject::named(&"x".repeat(257)).is_err());
        assert!(Subject::named(&"x".repeat(256)).is_ok());
        assert_eq!(Subject::tenant().key(), "");
    }
}
