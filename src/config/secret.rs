//! Secret values and where they come from.
//!
//! A [`Secret`] never shows its value through `Debug` or `Display`; the only
//! way to read it is [`Secret::expose`], which is called where the value is
//! handed to a transport (an HTTP header, a child's environment) or compared
//! with a caller's token.

use std::fmt;
use std::path::{Path, PathBuf};

/// A value that must never appear in logs, errors or responses.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// Read from a secret source (`{env: ...}`, `{file: ...}`) rather than
    /// written as a literal in the config file.
    sourced: bool,
}

impl Secret {
    /// Wraps a value as a secret (as if written literally in the config).
    pub fn new(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            sourced: false,
        }
    }

    /// Wraps a value read from a secret source (`{env:}`, `{file:}`).
    pub fn sourced(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            sourced: true,
        }
    }

    /// Returns the secret value. Call only where the value is used.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// Whether the value came from a secret source rather than a literal.
    pub fn is_sourced(&self) -> bool {
        self.sourced
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where a configured value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// A literal written in the config file.
    Literal(String),
    /// The gateway's environment variable of this name.
    Env(String),
    /// The contents of this file, one trailing newline trimmed.
    File(PathBuf),
}

/// Read access to the process environment.
///
/// Configuration never calls `std::env::var` directly, so tests can supply
/// their own variables without touching the real environment.
pub trait Environment: Send + Sync + fmt::Debug {
    /// The value of variable `name`, if set and valid Unicode.
    fn var(&self, name: &str) -> Option<String>;
}

/// The real process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Environment for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl<S: std::hash::BuildHasher + Send + Sync> Environment
    for std::collections::HashMap<String, String, S>
{
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// Why a secret source could not be resolved. Never contains the value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SourceError {
    /// The environment variable is not set.
    #[error("environment variable {0} is not set")]
    EnvMissing(String),
    /// The environment variable is set but empty.
    #[error("environment variable {0} is empty")]
    EnvEmpty(String),
    /// The file could not be read.
    #[error("cannot read file {path}: {reason}")]
    FileUnreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error, as text.
        reason: String,
    },
    /// The file is empty (after trimming one trailing newline).
    #[error("file {0} is empty")]
    FileEmpty(PathBuf),
}

impl ValueSource {
    /// Resolves the source to its value.
    ///
    /// # Errors
    /// A variable that is unset or empty, or a file that is unreadable or
    /// empty. A literal always resolves, even when empty.
    pub fn resolve(&self, env: &dyn Environment, base: &Path) -> Result<Secret, SourceError> {
        match self {
            ValueSource::Literal(value) => Ok(Secret::new(value.clone())),
            ValueSource::Env(name) => match env.var(name) {
                None => Err(SourceError::EnvMissing(name.clone())),
                Some(value) if value.is_empty() => Err(SourceError::EnvEmpty(name.clone())),
                Some(value) => Ok(Secret::sourced(value)),
            },
            ValueSource::File(path) => {
                let path = base.join(path);
                let mut text =
                    std::fs::read_to_string(&path).map_err(|e| SourceError::FileUnreadable {
                        path: path.clone(),
                        reason: e.kind().to_string(),
                    })?;
                if text.ends_with('\n') {
                    text.pop();
                    if text.ends_with('\r') {
                        text.pop();
                    }
                }
                if text.is_empty() {
                    return Err(SourceError::FileEmpty(path));
                }
                Ok(Secret::sourced(text))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn debug_and_display_hide_the_value() {
        let secret = Secret::new("hunter2");
        assert!(!format!("{secret:?}").contains("hunter2"));
        assert!(!format!("{secret}").contains("hunter2"));
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn env_source_reports_missing_and_empty() {
        let env: HashMap<String, String> = [("EMPTY".to_string(), String::new())].into();
        let base = Path::new(".");
        assert_eq!(
            ValueSource::Env("NOPE".into()).resolve(&env, base),
            Err(SourceError::EnvMissing("NOPE".into()))
        );
        assert_eq!(
            ValueSource::Env("EMPTY".into()).resolve(&env, base),
            Err(SourceError::EnvEmpty("EMPTY".into()))
        );
    }

    #[test]
    fn file_source_trims_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc\n\n").unwrap();
        let value = ValueSource::File(path.clone())
            .resolve(&HashMap::<String, String>::new(), dir.path())
            .unwrap();
        assert_eq!(value.expose(), "abc\n");
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            ValueSource::File(path).resolve(&HashMap::<String, String>::new(), dir.path()),
            Err(SourceError::FileEmpty(_))
        ));
    }
}
