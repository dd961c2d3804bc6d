//! The configuration of the audit trail (`audit:`): where records go, how
//! much of a call's arguments they keep, and whether calls fail when no
//! record can be written. The domain types and their validation from the
//! raw block.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::fields::{Errors, at_least_one, resolve};
use super::raw::RawValue;
use super::{Environment, Secret};

/// Records waiting for the writer at most, by default.
pub const DEFAULT_AUDIT_QUEUE: usize = 4096;

/// The fewest bytes `audit.digest_key` may have.
const MIN_DIGEST_KEY_BYTES: usize = 32;

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
    /// The HMAC key of the arguments' digest: `{env: VAR}` or `{file:
    /// PATH}` only.
    pub(crate) digest_key: Option<RawValue>,
    /// Records waiting for the writer at most.
    pub(crate) queue: Option<usize>,
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
    /// The HMAC-SHA-256 (keyed with `digest_key`) and size of
    /// `arguments_json` as received (the default): enough to prove what
    /// was sent, without keeping it.
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
    /// The key of the arguments' HMAC (`digest_key`, at least 32 bytes,
    /// from a secret source); `None`: a
    /// random key per process, so digests cannot be compared across
    /// processes or replicas.
    pub digest_key: Option<Secret>,
    /// Records waiting for the writer at most (`queue`, default
    /// [`DEFAULT_AUDIT_QUEUE`]). With `required`, every call being sent
    /// upstream holds a place in it until its record is queued.
    pub queue: usize,
}

/// Validates `audit:`; relative paths are taken from `base` (the
/// configuration file's directory), secret sources read from `env`.
pub(super) fn audit(
    errors: &mut Errors,
    raw: RawAudit,
    base: &Path,
    env: &dyn Environment,
) -> Option<AuditConfig> {
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
    let digest_key = raw
        .digest_key
        .as_ref()
        .and_then(|value| digest_key(errors, value, base, env));
    let queue = at_least_one(errors, "audit.queue", raw.queue, DEFAULT_AUDIT_QUEUE);
    (errors.0.len() == before).then(|| AuditConfig {
        destination: destination.expect("checked above"),
        arguments,
        required: raw.required,
        digest_key,
        queue,
    })
}

/// `audit.digest_key`: from a secret source (a literal would put the key
/// beside the records it protects, in a file many can read), at least
/// [`MIN_DIGEST_KEY_BYTES`] bytes once surrounding whitespace is trimmed.
fn digest_key(
    errors: &mut Errors,
    value: &RawValue,
    base: &Path,
    env: &dyn Environment,
) -> Option<Secret> {
    const PATH: &str = "audit.digest_key";
    if let RawValue::Literal(_) = value {
        errors.push(
            PATH,
            "must come from a secret source, `{ env: VAR }` or `{ file: PATH }`, not a literal \
             in the configuration file (make a key with `openssl rand -base64 48`)",
        );
        return None;
    }
    let secret = resolve(
        errors,
        PATH,
        value,
        &super::sources::Sources::file(base, env),
    )?;
    let key = secret.expose().trim();
    if key.len() < MIN_DIGEST_KEY_BYTES {
        errors.push(
            PATH,
            format!(
                "must be at least {MIN_DIGEST_KEY_BYTES} bytes; it has {} (make a key with \
                 `openssl rand -base64 48`)",
                key.len()
            ),
        );
        return None;
    }
    Some(Secret::sourced(key))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::Config;

    const KEY: &str = "k3y-0123456789abcdef0123456789abcdef";

    fn load(audit: &str) -> Result<Config, String> {
        let yaml = format!(
            "{audit}tenants:\n  - name: acme\n    tokens: [acme-token]\n    servers:\n      - name: t\n        url: \"http://127.0.0.1:9/mcp\"\n"
        );
        let env: HashMap<String, String> = [
            ("DIGEST_KEY".to_owned(), format!("{KEY}\n")),
            ("SHORT_KEY".to_owned(), "0123456789abcdef".to_owned()),
        ]
        .into();
        Config::from_yaml(&yaml, "test.yaml", Path::new("/etc/toolgate"), &env)
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
        assert_eq!(audit.digest_key, None);
        assert_eq!(audit.queue, DEFAULT_AUDIT_QUEUE);
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
        let err = load("audit:\n  path: a.jsonl\n  queue: 0\n").unwrap_err();
        assert!(err.contains("audit.queue"), "{err}");
    }

    #[test]
    fn the_digest_key_comes_from_a_secret_source_and_is_long_enough() {
        let audit = load("audit:\n  path: a.jsonl\n  digest_key: { env: DIGEST_KEY }\n")
            .unwrap()
            .audit
            .unwrap();
        assert_eq!(
            audit.digest_key.as_ref().map(Secret::expose),
            Some(KEY),
            "trimmed"
        );
        let err = load(&format!(
            "audit:\n  path: a.jsonl\n  digest_key: \"{KEY}\"\n"
        ))
        .unwrap_err();
        assert!(
            err.contains("audit.digest_key: must come from a secret source"),
            "{err}"
        );
        assert!(!err.contains(KEY), "the literal is not echoed: {err}");
        let err = load("audit:\n  path: a.jsonl\n  digest_key: { env: SHORT_KEY }\n").unwrap_err();
        assert!(
            err.contains("audit.digest_key: must be at least 32 bytes; it has 16"),
            "{err}"
        );
        let err = load("audit:\n  path: a.jsonl\n  digest_key: { env: NO_SUCH }\n").unwrap_err();
        assert!(
            err.contains("audit.digest_key: environment variable NO_SUCH is not set"),
            "{err}"
        );
    }
}
