//! Approved tool definitions (the rug-pull guard): the approvals file that
//! `toolgate approve` writes and reviewers read in diffs. Following the
//! file while serving is the registry's (`registry::approvals`).
//!
//! A server with `definitions: approved` serves only the tools whose
//! current definition hash (see [`crate::catalog::CatalogTool`]) is recorded
//! here for its tenant and server; a new or changed tool is withheld until
//! an operator approves it. The file is YAML, sorted and stable, so that a
//! change shows in a diff as the lines of the tools that changed:
//!
//! ```yaml
//! # Approved tool definitions (toolgate approve). ...
//! version: 1
//! tenants:
//!   acme:
//!     github:
//!       github__search:
//!         hash: "4c5e0d6f1f0a9e4b8a2b7c1d3e5f6a7b"
//!         description: "Search repositories by keyword."
//! ```
//!
//! Prompts of such servers are guarded alike, in a parallel top-level
//! `prompts:` map of the same shape (tenant → server → exposed prompt name →
//! approval). A file with approved prompts is `version: 2`; a file without
//! any stays `version: 1`, byte for byte as before.
//!
//! Skills (SEP-2640) are guarded alike too, in a top-level `skills:` map
//! of the same shape (tenant → server → exposed skill name → approval; the
//! hash binds the skill's URI, frontmatter and every file's digest). A
//! file with approved skills is `version: 3`.
//!
//! A missing file means nothing is approved yet. The file is read at start
//! and reloaded when its content changes (polled) and on SIGHUP; a
//! malformed file is refused with its name and line, and the previous
//! approvals stay in force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The format version this gateway writes for a file without prompts.
pub const FORMAT_VERSION: u32 = 1;

/// The format version of a file that approves prompts (its `prompts:`
/// map is not empty); this gateway reads both.
pub const FORMAT_VERSION_PROMPTS: u32 = 2;

/// The format version of a file that approves skills (its `skills:` map
/// is not empty); this gateway reads all three.
pub const FORMAT_VERSION_SKILLS: u32 = 3;

/// Most characters of a description kept in the file and shown in diffs.
pub const EXCERPT_CHARS: usize = 80;

/// One approved definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// The approved definition hash (hex).
    pub hash: String,
    /// A one-line excerpt of the approved description, for reviewers
    /// (never compared: the hash covers the whole definition).
    pub description: String,
}

/// One server's approvals: exposed tool name → approval.
pub type ServerApprovals = BTreeMap<String, Approval>;

/// No approvals (a server the file does not mention).
static NONE_APPROVED: ServerApprovals = BTreeMap::new();

/// Every approval: tenant → server → exposed tool name → approval, and
/// the same for prompts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Approvals {
    tenants: BTreeMap<String, BTreeMap<String, ServerApprovals>>,
    prompts: BTreeMap<String, BTreeMap<String, ServerApprovals>>,
    skills: BTreeMap<String, BTreeMap<String, ServerApprovals>>,
}

/// Why an approvals file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalsError {
    /// The file exists but could not be read.
    #[error("cannot read the approvals file {}: {source}", .file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid approvals file.
    #[error("{}{}: {message}", .file.display(), .line.map(|l| format!(":{l}")).unwrap_or_default())]
    Malformed {
        /// The file.
        file: PathBuf,
        /// The line at fault (1-based), when known.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The file could not be written.
    #[error("cannot write the approvals file {}: {source}", .file.display())]
    Write {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an approvals file: `version`, `tenants`, `prompts` and `skills`"
)]
struct RawFile {
    version: u32,
    #[serde(default)]
    tenants: RawTenants,
    #[serde(default)]
    prompts: RawTenants,
    #[serde(default)]
    skills: RawTenants,
}

/// Tenant → server → exposed name → approval, as written.
type RawTenants = BTreeMap<String, BTreeMap<String, BTreeMap<String, RawApproval>>>;

/// One tool's entry as written.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a tool's approval: `hash` and `description`"
)]
struct RawApproval {
    #[serde(deserialize_with = "hash")]
    hash: String,
    #[serde(default)]
    description: String,
}

/// A definition hash: 32 lowercase hexadecimal digits.
fn hash<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(text)
    } else {
        Err(serde::de::Error::custom(
            "`hash` must be a definition hash of 32 lowercase hexadecimal digits",
        ))
    }
}

impl Approvals {
    /// No approvals at all.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the text of an approvals file; `file` names it in errors.
    /// A file of only comments and blank lines approves nothing.
    ///
    /// # Errors
    /// The text is not a valid approvals file (with the line at fault).
    pub fn parse(text: &str, file: &Path) -> Result<Self, ApprovalsError> {
        let malformed = |line: Option<usize>, message: String| ApprovalsError::Malformed {
            file: file.to_owned(),
            line,
            message,
        };
        if text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            return Ok(Self::new());
        }
        let deserializer = yaml_serde::Deserializer::from_str(text);
        let raw: RawFile = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let line = inner.location().map(|l| l.line());
            // The YAML library appends " at line L column C"; the line is
            // shown once, after the file name.
            let mut message = inner.to_string();
            if let Some(at) = message.find(" at line ") {
                message.truncate(at);
            }
            let message = if path == "." || message.starts_with(&path) {
                message
            } else {
                format!("{path}: {message}")
            };
            malformed(line, message)
        })?;
        if ![
            FORMAT_VERSION,
            FORMAT_VERSION_PROMPTS,
            FORMAT_VERSION_SKILLS,
        ]
        .contains(&raw.version)
        {
            let line = text
                .lines()
                .position(|l| l.starts_with("version:"))
                .map(|i| i + 1);
            return Err(malformed(
                line,
                format!(
                    "version {} is not supported (this gateway reads versions {FORMAT_VERSION}, \
                     {FORMAT_VERSION_PROMPTS} and {FORMAT_VERSION_SKILLS})",
                    raw.version
                ),
            ));
        }
        Ok(Self {
            tenants: cooked(raw.tenants),
            prompts: cooked(raw.prompts),
            skills: cooked(raw.skills),
        })
    }

    /// The file's text: a header comment, then every tenant, server and
    /// tool in sorted order, one field per line, so that equal approvals
    /// always render alike and a change touches only its own lines.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# Approved tool definitions, written by `toolgate approve`.\n\
             # A tool of a server with `definitions: approved` is served only while its\n\
             # current definition hash is recorded here; review changes in the diff.\n",
        );
        let version = if !self.skills.is_empty() {
            FORMAT_VERSION_SKILLS
        } else if !self.prompts.is_empty() {
            FORMAT_VERSION_PROMPTS
        } else {
            FORMAT_VERSION
        };
        out.push_str(&format!("version: {version}\n"));
        render_map(&mut out, "tenants", &self.tenants);
        if !self.prompts.is_empty() {
            render_map(&mut out, "prompts", &self.prompts);
        }
        if !self.skills.is_empty() {
            render_map(&mut out, "skills", &self.skills);
        }
        out
    }

    /// The approval of `tool` (an exposed name) of `tenant`'s `server`.
    pub fn get(&self, tenant: &str, server: &str, tool: &str) -> Option<&Approval> {
        self.tenants.get(tenant)?.get(server)?.get(tool)
    }

    /// The approvals of `tenant`'s `server` (empty when the file does not
    /// mention it).
    pub fn server(&self, tenant: &str, server: &str) -> &ServerApprovals {
        self.tenants
            .get(tenant)
            .and_then(|servers| servers.get(server))
            .unwrap_or(&NONE_APPROVED)
    }

    /// The prompt approvals of `tenant`'s `server` (empty when the file
    /// does not mention it).
    pub fn server_prompts(&self, tenant: &str, server: &str) -> &ServerApprovals {
        self.prompts
            .get(tenant)
            .and_then(|servers| servers.get(server))
            .unwrap_or(&NONE_APPROVED)
    }

    /// Replaces the prompt approvals of `tenant`'s `server` with
    /// `prompts` (an empty map is dropped: a file without prompts stays
    /// version 1).
    pub fn set_server_prompts(&mut self, tenant: &str, server: &str, prompts: ServerApprovals) {
        if prompts.is_empty() {
            if let Some(servers) = self.prompts.get_mut(tenant) {
                servers.remove(server);
                if servers.is_empty() {
                    self.prompts.remove(tenant);
                }
            }
            return;
        }
        self.prompts
            .entry(tenant.to_owned())
            .or_default()
            .insert(server.to_owned(), prompts);
    }

    /// The skill approvals of `tenant`'s `server` (empty when the file
    /// does not mention it).
    pub fn server_skills(&self, tenant: &str, server: &str) -> &ServerApprovals {
        self.skills
            .get(tenant)
            .and_then(|servers| servers.get(server))
            .unwrap_or(&NONE_APPROVED)
    }

    /// Replaces the skill approvals of `tenant`'s `server` with `skills`
    /// (an empty map is dropped: a file without skills keeps its version).
    pub fn set_server_skills(&mut self, tenant: &str, server: &str, skills: ServerApprovals) {
        if skills.is_empty() {
            if let Some(servers) = self.skills.get_mut(tenant) {
                servers.remove(server);
                if servers.is_empty() {
                    self.skills.remove(tenant);
                }
            }
            return;
        }
        self.skills
            .entry(tenant.to_owned())
            .or_default()
            .insert(server.to_owned(), skills);
    }

    /// How many skills are approved in all.
    pub fn skill_count(&self) -> usize {
        self.skills
            .values()
            .flat_map(BTreeMap::values)
            .map(BTreeMap::len)
            .sum()
    }

    /// The skill approvals of `tenant`, by server.
    pub fn tenant_skills(&self, tenant: &str) -> Option<&BTreeMap<String, ServerApprovals>> {
        self.skills.get(tenant)
    }

    /// How many prompts are approved in all.
    pub fn prompt_count(&self) -> usize {
        self.prompts
            .values()
            .flat_map(BTreeMap::values)
            .map(BTreeMap::len)
            .sum()
    }

    /// Whether the file records `tenant`'s `server` at all.
    pub fn has_server(&self, tenant: &str, server: &str) -> bool {
        self.tenants
            .get(tenant)
            .is_some_and(|servers| servers.contains_key(server))
    }

    /// The approvals of `tenant`, by server.
    pub fn tenant(&self, tenant: &str) -> Option<&BTreeMap<String, ServerApprovals>> {
        self.tenants.get(tenant)
    }

    /// The prompt approvals of `tenant`, by server.
    pub fn tenant_prompts(&self, tenant: &str) -> Option<&BTreeMap<String, ServerApprovals>> {
        self.prompts.get(tenant)
    }

    /// Every tenant the file records.
    pub fn tenant_names(&self) -> impl Iterator<Item = &str> {
        self.tenants.keys().map(String::as_str)
    }

    /// Replaces the approvals of `tenant`'s `server` with `tools`.
    pub fn set_server(&mut self, tenant: &str, server: &str, tools: ServerApprovals) {
        self.tenants
            .entry(tenant.to_owned())
            .or_default()
            .insert(server.to_owned(), tools);
    }

    /// Keeps the servers for which `keep(tenant, server)` holds, and the
    /// tenants left with at least one.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &str) -> bool) {
        for (tenant, servers) in &mut self.tenants {
            servers.retain(|server, _| keep(tenant, server));
        }
        self.tenants.retain(|_, servers| !servers.is_empty());
        for (tenant, servers) in &mut self.prompts {
            servers.retain(|server, _| keep(tenant, server));
        }
        self.prompts.retain(|_, servers| !servers.is_empty());
        for (tenant, servers) in &mut self.skills {
            servers.retain(|server, _| keep(tenant, server));
        }
        self.skills.retain(|_, servers| !servers.is_empty());
    }

    /// How many tools are approved in all.
    pub fn tool_count(&self) -> usize {
        self.tenants
            .values()
            .flat_map(BTreeMap::values)
            .map(BTreeMap::len)
            .sum()
    }
}

/// The approvals as parsed from their raw form.
fn cooked(raw: RawTenants) -> BTreeMap<String, BTreeMap<String, ServerApprovals>> {
    raw.into_iter()
        .map(|(tenant, servers)| {
            let servers = servers
                .into_iter()
                .map(|(server, entries)| {
                    let entries = entries
                        .into_iter()
                        .map(|(name, raw)| {
                            (
                                name,
                                Approval {
                                    hash: raw.hash,
                                    description: raw.description,
                                },
                            )
                        })
                        .collect();
                    (server, entries)
                })
                .collect();
            (tenant, servers)
        })
        .collect()
}

/// Renders one top-level map (`tenants` or `prompts`): every tenant,
/// server and name in sorted order, one field per line.
fn render_map(
    out: &mut String,
    top: &str,
    map: &BTreeMap<String, BTreeMap<String, ServerApprovals>>,
) {
    if map.is_empty() {
        out.push_str(&format!("{top}: {{}}\n"));
        return;
    }
    out.push_str(&format!("{top}:\n"));
    for (tenant, servers) in map {
        if servers.is_empty() {
            out.push_str(&format!("  {}: {{}}\n", key(tenant)));
            continue;
        }
        out.push_str(&format!("  {}:\n", key(tenant)));
        for (server, entries) in servers {
            if entries.is_empty() {
                out.push_str(&format!("    {}: {{}}\n", key(server)));
                continue;
            }
            out.push_str(&format!("    {}:\n", key(server)));
            for (name, approval) in entries {
                out.push_str(&format!("      {}:\n", key(name)));
                out.push_str(&format!("        hash: {}\n", quote(&approval.hash)));
                out.push_str(&format!(
                    "        description: {}\n",
                    quote(&excerpt(&approval.description))
                ));
            }
        }
    }
}

/// A map key or plain value as YAML: bare when it is a plain word that
/// YAML reads back as the same string, else double-quoted.
fn key(text: &str) -> String {
    let plain = text
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !matches!(
            text.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n" | "null"
        );
    if plain { text.to_owned() } else { quote(text) }
}

/// `text` as a YAML double-quoted scalar (JSON string syntax, which YAML
/// reads alike).
fn quote(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
}

/// A one-line excerpt of a description: whitespace runs (newlines too)
/// become one space, characters YAML cannot hold unescaped become `?`,
/// and at most [`EXCERPT_CHARS`] characters are kept (then `…`).
pub fn excerpt(description: &str) -> String {
    let mut out = String::new();
    let mut chars = 0;
    let words = description.split_whitespace();
    for (i, word) in words.enumerate() {
        if i > 0 {
            if chars == EXCERPT_CHARS {
                out.push('…');
                return out;
            }
            out.push(' ');
            chars += 1;
        }
        for c in word.chars() {
            if chars == EXCERPT_CHARS {
                out.push('…');
                return out;
            }
            let printable = !c.is_control() && !matches!(c, '\u{feff}' | '\u{fffe}' | '\u{ffff}');
            out.push(if printable { c } else { '?' });
            chars += 1;
        }
    }
    out
}

/// The file's content and its digest; `None` when the file does not exist.
///
/// # Errors
/// The file exists but cannot be read, or is malformed.
pub fn read(file: &Path) -> Result<Option<(Approvals, [u8; 32])>, ApprovalsError> {
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ApprovalsError::Read {
                file: file.to_owned(),
                source,
            });
        }
    };
    let digest = Sha256::digest(&bytes).into();
    let text = String::from_utf8(bytes).map_err(|_| ApprovalsError::Malformed {
        file: file.to_owned(),
        line: None,
        message: "not UTF-8 text".to_owned(),
    })?;
    Ok(Some((Approvals::parse(&text, file)?, digest)))
}

/// Writes `approvals` to `file` atomically (a temporary file in the same
/// directory, then a rename): the gateway never reads half a file.
///
/// # Errors
/// The file cannot be written.
pub fn write(file: &Path, approvals: &Approvals) -> Result<(), ApprovalsError> {
    let failed = |source| ApprovalsError::Write {
        file: file.to_owned(),
        source,
    };
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = file.with_file_name(format!(
        ".{}.{}.tmp",
        name.unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, approvals.render()).map_err(failed)?;
    std::fs::rename(&tmp, file).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        failed(e)
    })
}

/// The approvals a gateway starts with: the configured file's, or none
/// when no file is configured or it does not exist yet (a warning naming
/// the file: every tool of a `definitions: approved` server is withheld
/// until `toolgate approve` writes it).
///
/// # Errors
/// The file exists but cannot be read, or is malformed.
pub fn initial(
    config: Option<&crate::config::ApprovalsConfig>,
) -> Result<(Approvals, Option<[u8; 32]>), ApprovalsError> {
    let Some(config) = config else {
        return Ok((Approvals::new(), None));
    };
    match read(&config.file)? {
        Some((approvals, digest)) => {
            tracing::info!(
                file = %config.file.display(),
                tools = approvals.tool_count(),
                "approvals loaded"
            );
            Ok((approvals, Some(digest)))
        }
        None => {
            warn_missing(&config.file);
            Ok((Approvals::new(), None))
        }
    }
}

/// Logs that the approvals file does not exist (nothing is approved).
pub fn warn_missing(file: &Path) {
    tracing::warn!(
        file = %file.display(),
        "the approvals file does not exist: nothing is approved yet, so every tool of a \
         `definitions: approved` server is withheld until `toolgate approve` writes it"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(hash: &str, description: &str) -> Approval {
        Approval {
            hash: hash.to_owned(),
            description: description.to_owned(),
        }
    }

    const H1: &str = "0123456789abcdef0123456789abcdef";
    const H2: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn renders_sorted_and_reads_back() {
        let mut approvals = Approvals::new();
        approvals.set_server(
            "zeta",
            "srv",
            [("srv__b".to_owned(), approval(H2, "Second\n  tool."))].into(),
        );
        approvals.set_server(
            "acme",
            "github",
            [
                (
                    "github__search".to_owned(),
                    approval(H1, "Search \"repos\"."),
                ),
                ("github__fetch".to_owned(), approval(H2, "")),
            ]
            .into(),
        );
        approvals.set_server("acme", "empty", ServerApprovals::new());
        approvals.set_server("true", "y", [("1x".to_owned(), approval(H1, "d"))].into());
        let text = approvals.render();
        let expected_order = [
            "acme:",
            "empty: {}",
            "github:",
            "github__fetch:",
            "github__search:",
            "\"true\":",
            "\"y\":",
            "\"1x\":",
            "zeta:",
        ];
        let mut at = 0;
        for needle in expected_order {
            let found = text[at..]
                .find(needle)
                .unwrap_or_else(|| panic!("{needle} after {at} in\n{text}"));
            at += found;
        }
        assert!(text.contains("description: \"Second tool.\""), "{text}");
        assert!(
            text.contains("description: \"Search \\\"repos\\\".\""),
            "{text}"
        );
        let back = Approvals::parse(&text, Path::new("a.yaml")).unwrap();
        // Descriptions are kept as excerpts.
        let mut expected = approvals.clone();
        expected.set_server(
            "zeta",
            "srv",
            [("srv__b".to_owned(), approval(H2, "Second tool."))].into(),
        );
        assert_eq!(back, expected);
        assert_eq!(back.render(), text, "rendering is stable");
    }

    #[test]
    fn empty_and_comment_only_files_approve_nothing() {
        for text in ["", "\n", "# nothing yet\n"] {
            assert_eq!(
                Approvals::parse(text, Path::new("a.yaml")).unwrap(),
                Approvals::new()
            );
        }
        let text = Approvals::new().render();
        assert!(text.contains("tenants: {}"), "{text}");
        assert_eq!(
            Approvals::parse(&text, Path::new("a.yaml")).unwrap(),
            Approvals::new()
        );
    }

    #[test]
    fn malformed_files_name_the_file_and_line() {
        let cases = [
            (
                "version: 1\ntenants:\n  acme:\n    s:\n      s__t:\n        hash: nothex\n",
                6,
                "32 lowercase hexadecimal",
            ),
            (
                "version: 1\ntenants:\n  acme:\n    s:\n      s__t:\n        hash: 0123456789abcdef0123456789abcdef\n        extra: 1\n",
                7,
                "unknown field",
            ),
            ("version: 4\ntenants: {}\n", 1, "version 4"),
            ("version: 1\ntenants:\n  - a\n", 3, "invalid type"),
            ("version: 1\ntenants: {\n", 3, ""),
        ];
        for (text, line, needle) in cases {
            let error =
                Approvals::parse(text, Path::new("/etc/toolgate/approvals.yaml")).expect_err(text);
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("/etc/toolgate/approvals.yaml:{line}: ")),
                "{message}"
            );
            assert!(message.contains(needle), "{message}");
        }
    }

    #[test]
    fn prompts_make_a_version_2_file_and_read_back() {
        let mut approvals = Approvals::new();
        approvals.set_server(
            "acme",
            "s",
            [("s__t".to_owned(), approval(H1, "tool"))].into(),
        );
        let v1 = approvals.render();
        assert!(
            v1.contains("version: 1\n") && !v1.contains("prompts"),
            "{v1}"
        );
        // An empty prompt map changes nothing: old files stay byte-identical.
        approvals.set_server_prompts("acme", "s", ServerApprovals::new());
        assert_eq!(approvals.render(), v1);
        approvals.set_server_prompts(
            "acme",
            "s",
            [("s__review".to_owned(), approval(H2, "Review code."))].into(),
        );
        let v2 = approvals.render();
        assert!(v2.contains("version: 2\n"), "{v2}");
        assert!(
            v2.ends_with(
                "prompts:\n  acme:\n    s:\n      s__review:\n        hash: \"fedcba9876543210fedcba9876543210\"\n        description: \"Review code.\"\n"
            ),
            "{v2}"
        );
        let back = Approvals::parse(&v2, Path::new("a.yaml")).unwrap();
        assert_eq!(back, approvals);
        assert_eq!(back.server_prompts("acme", "s")["s__review"].hash, H2);
        assert!(back.server("acme", "s").contains_key("s__t"));
        assert_eq!((back.tool_count(), back.prompt_count()), (1, 1));
        // Forgetting the server forgets its prompts too.
        let mut gone = back.clone();
        gone.retain(|_, _| false);
        assert_eq!(gone.prompt_count(), 0);
        assert_eq!(gone.render(), Approvals::new().render());
    }

    #[test]
    fn skills_make_a_version_3_file_and_read_back() {
        let mut approvals = Approvals::new();
        approvals.set_server_prompts(
            "acme",
            "s",
            [("s__review".to_owned(), approval(H2, "Review code."))].into(),
        );
        let v2 = approvals.render();
        approvals.set_server_skills("acme", "s", ServerApprovals::new());
        assert_eq!(approvals.render(), v2);
        approvals.set_server_skills(
            "acme",
            "s",
            [("s__refunds".to_owned(), approval(H1, "Process refunds."))].into(),
        );
        let v3 = approvals.render();
        assert!(v3.contains("version: 3\n"), "{v3}");
        assert!(
            v3.contains("skills:\n  acme:\n    s:\n      s__refunds:\n"),
            "{v3}"
        );
        let back = Approvals::parse(&v3, Path::new("a.yaml")).unwrap();
        assert_eq!(back, approvals);
        assert_eq!(back.server_skills("acme", "s")["s__refunds"].hash, H1);
        assert_eq!((back.prompt_count(), back.skill_count()), (1, 1));
        let mut gone = back.clone();
        gone.retain(|_, _| false);
        assert_eq!(gone.skill_count(), 0);
        let error = Approvals::parse("version: 4\n", Path::new("a.yaml")).unwrap_err();
        assert!(error.to_string().contains("1, 2 and 3"), "{error}");
    }

    #[test]
    fn excerpts_are_one_bounded_line() {
        assert_eq!(excerpt("  Search\n\tthe   web.  "), "Search the web.");
        assert_eq!(excerpt("a\u{7}b\u{feff}"), "a?b?");
        let long = "word ".repeat(40);
        let cut = excerpt(&long);
        assert_eq!(cut.chars().count(), EXCERPT_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(
            excerpt(&"x".repeat(EXCERPT_CHARS)),
            "x".repeat(EXCERPT_CHARS)
        );
    }

    #[test]
    fn set_and_retain_keep_other_entries() {
        let mut approvals = Approvals::new();
        approvals.set_server("a", "s1", [("s1__t".to_owned(), approval(H1, ""))].into());
        approvals.set_server("a", "s2", [("s2__t".to_owned(), approval(H1, ""))].into());
        approvals.set_server("b", "s1", [("s1__t".to_owned(), approval(H1, ""))].into());
        approvals.set_server("a", "s1", [("s1__u".to_owned(), approval(H2, ""))].into());
        assert_eq!(approvals.get("a", "s1", "s1__u").unwrap().hash, H2);
        assert!(approvals.get("a", "s1", "s1__t").is_none());
        assert!(approvals.get("a", "s2", "s2__t").is_some());
        approvals.retain(|tenant, _| tenant != "b");
        assert!(approvals.tenant("b").is_none());
        assert_eq!(approvals.tool_count(), 2);
        assert!(approvals.server("x", "y").is_empty());
    }

    #[test]
    fn writes_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("approvals.yaml");
        assert!(read(&file).unwrap().is_none());
        let mut approvals = Approvals::new();
        approvals.set_server("a", "s", [("s__t".to_owned(), approval(H1, "d"))].into());
        write(&file, &approvals).unwrap();
        let (back, _) = read(&file).unwrap().unwrap();
        assert_eq!(back, approvals);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["approvals.yaml"], "no temporary file is left");
    }
}
