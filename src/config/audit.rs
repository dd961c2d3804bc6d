//! The configuration of the audit trail (`audit:`): where records go, how
//! much of a call's arguments they keep, and whether calls fail when no
//! record can be written. The domain types and their validation from the
//! raw block.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::fields::Errors;

/// The `audit:` block as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAudit {
    /// A file path (relative to the configuration file's directory), or
    /// `-` for standard output.
    pub(crate) path: Option<String>,
    /// `digest` (default), `none` or `full`.
    pub(crate) arguments: Option<String>,
    /// Fail calls with UNAVAILABLE when no record can be written.
    #[serde(default)]
    pub(crate) required: bool,
}

/// Where audit records are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditDestination {
    /// Standard output (`path: "-"`), one JSON object per line.
    Stdout,
    /// A JSON-lines file, appended to; reopened when moved (rotation) and
    /// on SIGHUP.
    File(PathBuf),
}

/// How much of a call's arguments a record keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AuditArguments {
    /// The SHA-256 and size of `arguments_json` as received (the default):
    /// enough to prove what was sent, without keeping it.
    #[default]
    Digest,
    /// Nothing of the arguments.
    None,
    /// The digest and the arguments themselves, with every configured
    /// credential value redacted.
    Full,
}

/// The validated `audit:` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// Where records go.
    pub destination: AuditDestination,
    /// How much of the arguments records keep.
    pub arguments: AuditArguments,
    /// When true, a call whose record cannot be written fails
    /// (UNAVAILABLE, reason AUDIT_UNAVAILABLE) instead of being served
    /// unaudited; when false, the failure is counted
    /// (`toolgate_audit_failures_total`) and logged.
    pub required: bool,
}

/// Validates `audit:`; relative paths are taken from `base` (the
/// configuration file's directory).
pub(super) fn audit(errors: &mut Errors, raw: RawAudit, base: &Path) -> Option<AuditConfig> {
    let before = errors.0.len();
    let destination = match raw.path.as_deref().map(str::trim) {
        None | Some("") => {
            errors.push(
                "audit.path",
                "required: a JSON-lines file such as /var/log/toolgate/audit.jsonl, or `-` for \
                 standard output",
            );
            None
        }
        Some("-") => Some(AuditDestination::Stdout),
        Some(path) => {
            let path = base.join(path);
            if path.file_name().is_none() {
                errors.push("audit.path", "must name a file, not a directory");
                None
            } else {
                Some(AuditDestination::File(path))
            }
        }
    };
    let arguments = match raw.arguments.as_deref() {
        None | Some("digest") => AuditArguments::Digest,
        Some("none") => AuditArguments::None,
        Some("full") => AuditArguments::Full,
        Some(other) => {
            errors.push(
                "audit.arguments",
                format!("`{other}` is not one of `digest`, `none`, `full`"),
            );
            AuditArguments::Digest
        }
    };
    (errors.0.len() == before).then(|| AuditConfig {
        destination: destination.expect("checked above"),
        arguments,
        required: raw.required,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::Config;

    fn load(audit: &str) -> Result<Config, String> {
        let yaml = format!(
            "{audit}tenants:\n  - name: acme\n    tokens: [acme-token]\n    servers:\n      - name: t\n        url: \"http://127.0.0.1:9/mcp\"\n"
        );
        Config::from_yaml(
            &yaml,
            "test.yaml",
            Path::new("/etc/toolgate"),
            &HashMap::new(),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_paths() {
        assert_eq!(load("").unwrap().audit, None);
        let audit = load("audit:\n  path: audit/calls.jsonl\n")
            .unwrap()
            .audit
            .unwrap();
        assert_eq!(
            audit.destination,
            AuditDestination::File(PathBuf::from("/etc/toolgate/audit/calls.jsonl")),
            "relative to the configuration file's directory"
        );
        assert_eq!(audit.arguments, AuditArguments::Digest);
        assert!(!audit.required);
        let audit = load("audit:\n  path: \"-\"\n  arguments: full\n  required: true\n")
            .unwrap()
            .audit
            .unwrap();
        assert_eq!(audit.destination, AuditDestination::Stdout);
        assert_eq!(audit.arguments, AuditArguments::Full);
        assert!(audit.required);
    }

    #[test]
    fn errors_name_the_field() {
        let err = load("audit:\n  arguments: none\n").unwrap_err();
        assert!(err.contains("audit.path: required"), "{err}");
        let err = load("audit:\n  path: a.jsonl\n  arguments: all\n").unwrap_err();
        assert!(
            err.contains("audit.arguments: `all` is not one of `digest`, `none`, `full`"),
            "{err}"
        );
        let err = load("audit:\n  path: a.jsonl\n  sync: true\n").unwrap_err();
        assert!(err.contains("sync"), "{err}");
    }
}
