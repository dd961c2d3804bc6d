//! The configuration of approved definitions (the rug-pull guard): the
//! top-level `approvals: {file: PATH}` block and each server's
//! `definitions: any|approved`. The approvals file itself (its format,
//! loading and saving) is [`crate::approvals`].

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::fields::Errors;
use super::{ServerConfig, TenantConfig};

/// The `approvals:` block as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApprovals {
    /// The approvals file, relative to the configuration file's directory.
    pub(crate) file: Option<String>,
}

/// Which tool definitions of a server are served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Definitions {
    /// Every tool the server lists (the default): today's behaviour.
    #[default]
    Any,
    /// Only tools whose current definition hash is recorded in the
    /// approvals file; a new or changed tool is withheld until approved.
    Approved,
}

/// The validated `approvals:` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalsConfig {
    /// The approvals file (resolved against the configuration file's
    /// directory). A missing file means nothing is approved yet.
    pub file: PathBuf,
}

/// Validates `approvals:`; a relative `file` is taken from `base` (the
/// configuration file's directory).
pub(super) fn approvals(
    errors: &mut Errors,
    raw: RawApprovals,
    base: &Path,
) -> Option<ApprovalsConfig> {
    match raw.file.as_deref().map(str::trim) {
        None | Some("") => {
            errors.push(
                "approvals.file",
                "required: the approvals file written by `toolgate approve`, such as \
                 approvals.yaml (relative to this file's directory)",
            );
            None
        }
        Some(file) => {
            let file = base.join(file);
            if file.file_name().is_none() || file.is_dir() {
                errors.push("approvals.file", "must name a file, not a directory");
                return None;
            }
            Some(ApprovalsConfig { file })
        }
    }
}

/// What servers with `definitions: approved` need of the rest of the file:
/// an approvals file to read approvals from.
pub(super) fn requirements(
    errors: &mut Errors,
    tenants: &[TenantConfig],
    approvals: Option<&ApprovalsConfig>,
) {
    if approvals.is_some() {
        return;
    }
    for (t, tenant) in tenants.iter().enumerate() {
        for (s, server) in tenant.servers.iter().enumerate() {
            if server.definitions == Definitions::Approved {
                errors.push(
                    format!("tenants[{t}].servers[{s}].definitions"),
                    "`approved` needs the top-level `approvals: {file: PATH}` (where \
                     `toolgate approve` records the approved definitions)",
                );
            }
        }
    }
}

impl ServerConfig {
    /// Whether only approved definitions of this server are served.
    pub fn needs_approval(&self) -> bool {
        self.definitions == Definitions::Approved
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn load(yaml: &str) -> Result<Config, crate::config::ConfigError> {
        let env: HashMap<String, String> = HashMap::new();
        Config::from_yaml(yaml, "t.yaml", Path::new("/etc/toolgate"), &env)
    }

    fn tenant(definitions: &str) -> String {
        format!(
            "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: s\n        \
             url: http://127.0.0.1:1/mcp\n{definitions}"
        )
    }

    #[test]
    fn definitions_default_to_any_and_approved_needs_a_file() {
        let config = load(&tenant("")).unwrap();
        assert_eq!(config.tenants[0].servers[0].definitions, Definitions::Any);
        assert!(config.approvals.is_none());

        let error = load(&tenant("        definitions: approved\n"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("tenants[0].servers[0].definitions: `approved` needs"),
            "{error}"
        );

        let config = load(&format!(
            "approvals:\n  file: approvals.yaml\n{}",
            tenant("        definitions: approved\n")
        ))
        .unwrap();
        assert!(config.tenants[0].servers[0].needs_approval());
        assert_eq!(
            config.approvals.unwrap().file,
            Path::new("/etc/toolgate/approvals.yaml")
        );
    }

    #[test]
    fn bad_values_name_their_path() {
        let error = load(&tenant("        definitions: some\n"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("definitions"), "{error}");
        assert!(error.contains("`any`"), "{error}");
        let error = load(&format!("approvals: {{}}\n{}", tenant("")))
            .unwrap_err()
            .to_string();
        assert!(error.contains("approvals.file: required"), "{error}");
        let error = load(&format!("approvals: {{path: x}}\n{}", tenant("")))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `path`"), "{error}");
    }

    #[test]
    fn changing_definitions_changes_the_fingerprint() {
        let any = load(&format!("approvals: {{file: a.yaml}}\n{}", tenant(""))).unwrap();
        let approved = load(&format!(
            "approvals: {{file: a.yaml}}\n{}",
            tenant("        definitions: approved\n")
        ))
        .unwrap();
        assert_ne!(
            any.tenants[0].servers[0].fingerprint(),
            approved.tenants[0].servers[0].fingerprint()
        );
    }
}
