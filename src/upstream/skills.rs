//! Skills (SEP-2640, the `io.modelcontextprotocol/skills` extension) on a
//! live session: `skills/list` read to the end at connect and when the
//! server's lists change, `skills/get` for one skill's current entry, and
//! its files read with `resources/read` and checked against the entry's
//! manifest (size and SHA-256 digest of the raw bytes, and the `SKILL.md`
//! frontmatter against the entry's).
//!
//! Only a session of protocol 2026-07-28 or later whose server declares
//! the extension is asked (the extension is specified against that
//! revision; servers bind its methods to it). toolgate's own client
//! capabilities declare the extension too (`handler.rs`).
//!
//! Entries are rmcp's wire types ([`Skill`]), checked here beyond what
//! decoding them checks: every structural rule of the specification
//! ([`Skill::validate`]) and its per-skill limits, each error naming the
//! entry and field at fault.

use std::time::Duration;

use base64::Engine;
use rmcp::model::{
    ClientRequest, GetSkillRequest, GetSkillRequestParams, ListSkillsRequest,
    PaginatedRequestParams, ReadResourceRequest, ReadResourceRequestParams, ResourceContents,
    ServerResult,
};
pub use rmcp::model::{SKILL_MD, SKILLS_EXTENSION_ID, Skill, SkillResource, SkillResources};
use rmcp::service::{Peer, RoleClient};
use serde::{Deserialize, Serialize};

use super::listing::{Paging, list_all};
use super::{Request, Session, UpstreamError};
use crate::credentials::Redaction;

/// Most files one skill may list (the specification's limit, `SKILL.md`
/// included).
pub const MAX_SKILL_FILES: usize = 512;

/// Most bytes one skill's files may add up to (the specification's limit:
/// 16 MiB).
pub const MAX_SKILL_BYTES: u64 = 16 * 1024 * 1024;

/// Whether a session with these server capabilities, of this protocol
/// revision, offers skills: the server declares the extension and the
/// session speaks 2026-07-28 or later (`stateless`).
#[must_use]
pub fn offers_skills(capabilities: &rmcp::model::ServerCapabilities, stateless: bool) -> bool {
    stateless && capabilities.supports_skills()
}

/// Checks one entry as the specification requires of it (its URI ends in
/// `/SKILL.md` after a segment equal to `frontmatter.name`, a valid name,
/// a non-empty description, a complete manifest of files within the
/// skill's directory, each listed once with a well-formed digest) and its
/// limits (at most [`MAX_SKILL_FILES`] files and [`MAX_SKILL_BYTES`]
/// bytes).
///
/// # Errors
/// What is wrong, naming the field (`uri`, `frontmatter.name`,
/// `resources[i].digest`, ...).
pub fn check_entry(skill: &Skill) -> Result<(), String> {
    use rmcp::model::SkillValidationError as E;
    if skill.frontmatter.description.trim().is_empty()
        || skill.frontmatter.description.chars().count() > 1024
    {
        return Err("frontmatter.description: must hold 1 to 1024 characters".to_owned());
    }
    if let Err(error) = skill.validate() {
        let field = match &error {
            E::UriNotSkillMd(_) | E::DuplicateSkill(_) => "uri".to_owned(),
            E::InvalidName(_) | E::NameMismatch { .. } => "frontmatter.name".to_owned(),
            E::MissingSkillMd(_) => "resources".to_owned(),
            E::DuplicateResource(uri)
            | E::ResourceOutsideSkill { uri, .. }
            | E::MalformedDigest { uri, .. } => {
                let index = manifest_index(skill, uri);
                let leaf = if matches!(error, E::MalformedDigest { .. }) {
                    ".digest"
                } else {
                    ".uri"
                };
                format!("resources[{index}]{leaf}")
            }
            _ => "entry".to_owned(),
        };
        return Err(format!("{field}: {error}"));
    }
    if let SkillResources::Files(files) = &skill.resources {
        if files.len() > MAX_SKILL_FILES {
            return Err(format!(
                "resources: {} files, over the specification's limit of {MAX_SKILL_FILES}",
                files.len()
            ));
        }
        let total: u64 = files.iter().map(|f| f.size).fold(0, u64::saturating_add);
        if total > MAX_SKILL_BYTES {
            return Err(format!(
                "resources: {total} bytes in all, over the specification's limit of \
                 {MAX_SKILL_BYTES}"
            ));
        }
    }
    Ok(())
}

/// The position of the (last) file `uri` in `skill`'s manifest.
fn manifest_index(skill: &Skill, uri: &str) -> usize {
    match &skill.resources {
        SkillResources::Files(files) => files.iter().rposition(|f| f.uri == uri).unwrap_or(0),
        _ => 0,
    }
}

/// Checks a whole listing: each entry ([`check_entry`], the error naming
/// `skills[i]` and its URI) and no URI listed twice.
///
/// # Errors
/// The first entry at fault, in words.
pub fn check_listing(skills: &[Skill]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::with_capacity(skills.len());
    for (index, skill) in skills.iter().enumerate() {
        let at = |message: String| {
            format!(
                "skills[{index}] ({}): {message}",
                crate::upstream::truncate(&skill.uri, 200)
            )
        };
        check_entry(skill).map_err(at)?;
        if !seen.insert(skill.uri.as_str()) {
            return Err(at("uri: listed twice".to_owned()));
        }
    }
    Ok(())
}

/// Parses the text of a `skills/list` or `skills/get` answer that rmcp
/// could not decode as one, so that the error names the field at fault
/// (`skills[1].resources[0].size: invalid type ...`).
///
/// # Errors
/// The path and what is wrong there.
pub fn parse_strictly<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        format!("{path}: {}", e.into_inner())
    })
}

/// Every skill of the server, all pages (bounded as tools are), each
/// checked ([`check_listing`]), or why not, in words: a failure refuses
/// the server's skills only.
pub(super) async fn list_all_skills(
    peer: &Peer<RoleClient>,
    max_pages: u32,
    redaction: &Redaction,
) -> Result<Vec<Skill>, String> {
    let skills = list_all(max_pages, |cursor| async move {
        let request = ListSkillsRequest {
            params: cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c))),
            ..Default::default()
        };
        let answer = peer
            .send_request(ClientRequest::ListSkillsRequest(request))
            .await
            .map_err(|e| UpstreamError::from_service(e, redaction))?;
        let page = list_page(answer).map_err(UpstreamError::Protocol)?;
        Ok((page.skills, page.next_cursor))
    })
    .await
    .map_err(|e| match e {
        Paging::Page(e) => format!("skills/list failed: {e}"),
        Paging::TooManyPages(pages) => format!(
            "skills/list returned more than {pages} pages (raise max_list_pages if this is real)"
        ),
        Paging::RepeatedCursor => {
            "skills/list repeated the cursor of an earlier page; the listing would never end"
                .to_owned()
        }
    })?;
    check_listing(&skills).map_err(|e| format!("skills/list answered an invalid entry: {e}"))?;
    Ok(skills)
}

/// At connect: every skill of a session that offers skills, within the
/// connect's `(deadline, timeout)`; `None` for one that does not; `Err`
/// (logged) saying why its skills are refused.
pub(super) async fn list_at_connect(
    peer: &Peer<RoleClient>,
    max_pages: u32,
    redaction: &Redaction,
    (deadline, timeout): (tokio::time::Instant, Duration),
    label: &super::Label,
) -> Option<Result<Vec<Skill>, String>> {
    let info = peer.peer_info()?;
    if !offers_skills(&info.capabilities, !info.protocol_version.has_initialize()) {
        return None;
    }
    let listed = tokio::time::timeout_at(deadline, list_all_skills(peer, max_pages, redaction))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "skills/list did not end within the connect timeout ({})",
                humantime::format_duration(timeout)
            ))
        });
    if let Err(reason) = &listed {
        tracing::warn!(tenant = %label.tenant, server = %label.server, %reason, "the server's skills are refused; its tools are kept");
    }
    Some(listed)
}

/// One page of `skills/list` out of the server's answer.
fn list_page(answer: ServerResult) -> Result<rmcp::model::ListSkillsResult, String> {
    match answer {
        ServerResult::ListSkillsResult(page) => Ok(page),
        ServerResult::CustomResult(custom) => parse_strictly(custom.0)
            .map_err(|e| format!("the answer to skills/list is not a skills list: {e}")),
        _ => Err(
            "the answer to skills/list is not a skills list (`skills` missing or malformed)"
                .to_owned(),
        ),
    }
}

/// A file of a skill as read and checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillFile {
    /// Its resource URI.
    pub uri: String,
    /// Its MIME type, when the server gave one.
    pub mime_type: Option<String>,
    /// Its bytes: text (UTF-8) or binary.
    pub content: FileContent,
    /// `sha256:` and the 64 hex digits of its bytes (checked against the
    /// manifest, unless the skill is dynamic).
    pub digest: String,
    /// Its length in bytes.
    pub size: u64,
}

/// The bytes of a [`SkillFile`]: as JSON (what guards see),
/// `{"text": "..."}` or `{"blob": "<base64>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileContent {
    /// A text resource.
    Text(String),
    /// A binary resource (its blob, decoded; base64 in JSON).
    Blob(#[serde(with = "base64_bytes")] Vec<u8>),
}

/// Bytes as a standard base64 string in JSON.
mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// Why a file of a skill is not what its entry says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// Its bytes differ from the manifest's size or digest.
    #[error("{0}")]
    Digest(String),
    /// Its `SKILL.md` frontmatter differs from the entry's.
    #[error("{0}")]
    Frontmatter(String),
}

impl Session {
    /// The server's current entry for the skill whose `SKILL.md` is at
    /// `uri` (`skills/get`), checked as a listed entry is.
    ///
    /// # Errors
    /// As [`Session::request`]; `Protocol` for an answer that is not a
    /// valid skill entry (naming the field), or an entry for another URI.
    pub async fn get_skill(&self, uri: &str, timeout: Duration) -> Result<Skill, UpstreamError> {
        let request = Request::new(
            ClientRequest::GetSkillRequest(GetSkillRequest::new(GetSkillRequestParams::new(uri))),
            timeout,
        );
        let skill = match self.request(&request).await? {
            ServerResult::GetSkillResult(result) => result.skill,
            ServerResult::CustomResult(custom) => {
                parse_strictly::<rmcp::model::GetSkillResult>(custom.0)
                    .map_err(|e| UpstreamError::Protocol(format!("the answer to skills/get: {e}")))?
                    .skill
            }
            _ => {
                return Err(UpstreamError::Protocol(
                    "the answer to skills/get is not a skill (`skill` missing or malformed)"
                        .to_owned(),
                ));
            }
        };
        check_entry(&skill).map_err(|e| {
            UpstreamError::Protocol(format!("skills/get answered an invalid entry: {e}"))
        })?;
        if skill.uri != uri {
            return Err(UpstreamError::Protocol(format!(
                "skills/get for {uri} answered the entry of {}",
                crate::upstream::truncate(&skill.uri, 200)
            )));
        }
        Ok(skill)
    }

    /// Every skill of the server, all pages, as at connect; `None` when
    /// the session does not offer skills ([`offers_skills`]), `Err` saying
    /// why its skills are refused.
    pub async fn list_skills(
        &self,
        max_pages: u32,
        timeout: Duration,
    ) -> Option<Result<Vec<Skill>, String>> {
        if !offers_skills(&self.server_capabilities(), self.is_stateless()) {
            return None;
        }
        if let Some(bearer) = &self.bearer
            && let Err(e) = bearer.refresh().await
        {
            return Some(Err(format!("skills/list failed: {e}")));
        }
        Some(
            tokio::time::timeout(timeout, async {
                let live = self
                    .hold()
                    .await
                    .map_err(|e| format!("skills/list failed: {e}"))?;
                list_all_skills(&live, max_pages, &self.redaction).await
            })
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "skills/list did not end within {}",
                    humantime::format_duration(timeout)
                ))
            }),
        )
    }

    /// Reads the file `uri` (`resources/read`) as it is: text as UTF-8
    /// bytes, a blob decoded. Nothing is redacted here (the digest covers
    /// the server's bytes); [`redact_file`] is for what is handed out.
    ///
    /// # Errors
    /// As [`Session::request`]; `Protocol` for an answer without the
    /// file's contents, questions (a skill file asks nothing), or a blob
    /// that is not base64.
    pub async fn read_skill_file(
        &self,
        uri: &str,
        timeout: Duration,
    ) -> Result<SkillFile, UpstreamError> {
        let request = Request::new(
            ClientRequest::ReadResourceRequest(ReadResourceRequest::new(
                ReadResourceRequestParams::new(uri),
            )),
            timeout,
        );
        let ServerResult::ReadResourceResult(result) = self.request(&request).await? else {
            return Err(UpstreamError::Protocol(format!(
                "the answer to resources/read of skill file {} is not its contents",
                crate::upstream::truncate(uri, 200)
            )));
        };
        file_of(uri, result.contents).map_err(UpstreamError::Protocol)
    }
}

/// The file `uri` out of a `resources/read` answer's contents: the one
/// content of that URI (or the only content).
fn file_of(uri: &str, contents: Vec<ResourceContents>) -> Result<SkillFile, String> {
    let only = contents.len() == 1;
    let content = contents
        .into_iter()
        .find(|c| {
            only || match c {
                ResourceContents::TextResourceContents { uri: u, .. }
                | ResourceContents::BlobResourceContents { uri: u, .. } => u == uri,
                _ => false,
            }
        })
        .ok_or_else(|| {
            format!(
                "resources/read of skill file {} answered no contents of that URI",
                crate::upstream::truncate(uri, 200)
            )
        })?;
    let (mime_type, content) = match content {
        ResourceContents::TextResourceContents {
            mime_type, text, ..
        } => (mime_type, FileContent::Text(text)),
        ResourceContents::BlobResourceContents {
            mime_type, blob, ..
        } => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(blob.as_bytes())
                .map_err(|e| {
                    format!(
                        "skill file {}: its blob is not base64 ({e})",
                        crate::upstream::truncate(uri, 200)
                    )
                })?;
            (mime_type, FileContent::Blob(bytes))
        }
        _ => {
            return Err(format!(
                "skill file {}: a kind of resource contents toolgate does not know",
                crate::upstream::truncate(uri, 200)
            ));
        }
    };
    let bytes = content.bytes();
    Ok(SkillFile {
        uri: uri.to_owned(),
        mime_type,
        digest: rmcp::model::sha256_digest(bytes),
        size: bytes.len() as u64,
        content,
    })
}

impl FileContent {
    /// Its raw bytes (a text's UTF-8).
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        match self {
            FileContent::Text(text) => text.as_bytes(),
            FileContent::Blob(bytes) => bytes,
        }
    }
}

/// Checks `file` against its manifest entry `listed`: the same size, then
/// the same digest.
///
/// # Errors
/// [`Mismatch::Digest`] naming the file, what the manifest says and what
/// was read.
pub fn verify(file: &SkillFile, listed: &SkillResource) -> Result<(), Mismatch> {
    listed
        .verify(file.content.bytes())
        .map_err(|e| Mismatch::Digest(crate::upstream::truncate(&e.to_string(), 600)))
}

/// Checks that the YAML frontmatter at the head of `skill_md` (the text of
/// a skill's `SKILL.md`) is, field by field, the entry's `frontmatter`.
///
/// # Errors
/// [`Mismatch::Frontmatter`]: no frontmatter, YAML that does not parse,
/// or the first field that differs.
pub fn verify_frontmatter(skill_md: &[u8], entry: &Skill) -> Result<(), Mismatch> {
    let wrong = |message: String| Mismatch::Frontmatter(format!("SKILL.md {message}"));
    let text = std::str::from_utf8(skill_md).map_err(|_| wrong("is not UTF-8".to_owned()))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let body = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or_else(|| wrong("does not begin with YAML frontmatter (`---`)".to_owned()))?;
    let end = body
        .match_indices("\n---")
        .map(|(i, _)| i)
        .find(|&i| {
            let rest = &body[i + 4..];
            rest.is_empty() || rest.starts_with('\n') || rest.starts_with("\r\n")
        })
        .ok_or_else(|| wrong("has no end to its frontmatter (`---`)".to_owned()))?;
    let yaml = &body[..end];
    let found: serde_json::Value = yaml_serde::from_str(yaml)
        .map_err(|e| wrong(format!("frontmatter is not valid YAML: {e}")))?;
    let serde_json::Value::Object(found) = found else {
        return Err(wrong("frontmatter is not a mapping".to_owned()));
    };
    let expected = match serde_json::to_value(&entry.frontmatter) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => return Err(wrong("entry's frontmatter is not an object".to_owned())),
    };
    let keys: std::collections::BTreeSet<&String> = found.keys().chain(expected.keys()).collect();
    for key in keys {
        if found.get(key) != expected.get(key) {
            return Err(wrong(format!(
                "frontmatter field `{}` differs from the skill entry's",
                crate::upstream::truncate(key, 100)
            )));
        }
    }
    Ok(())
}

/// Takes every configured credential out of a text file handed out (when
/// the server's results are redacted); binary files are left alone.
pub fn redact_file(file: &mut SkillFile, redaction: &Redaction) {
    if let FileContent::Text(text) = &mut file.content {
        redaction.redact_in_place(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::SkillFrontmatter;
    use serde_json::json;

    fn entry(files: &[(&str, &[u8])]) -> Skill {
        Skill::new(
            "skill://acme/refunds/SKILL.md",
            SkillFrontmatter::new("refunds", "Process refunds.").with_field("license", "MIT"),
            SkillResources::Files(
                files
                    .iter()
                    .map(|(uri, bytes)| SkillResource::from_bytes(*uri, bytes))
                    .collect(),
            ),
        )
    }

    const MD: &[u8] =
        b"---\nname: refunds\ndescription: Process refunds.\nlicense: MIT\n---\n\n# Refunds\n";

    #[test]
    fn a_valid_entry_passes_and_each_rule_names_its_field() {
        let good = entry(&[("skill://acme/refunds/SKILL.md", MD)]);
        assert_eq!(check_entry(&good), Ok(()));
        let mut bad = good.clone();
        bad.uri = "skill://acme/refunds/README.md".to_owned();
        assert!(check_entry(&bad).unwrap_err().starts_with("uri: "));
        let mut bad = good.clone();
        bad.frontmatter.name = "other".to_owned();
        assert!(
            check_entry(&bad)
                .unwrap_err()
                .starts_with("frontmatter.name: ")
        );
        let mut bad = good.clone();
        bad.frontmatter.description = " ".to_owned();
        assert!(
            check_entry(&bad)
                .unwrap_err()
                .starts_with("frontmatter.description: ")
        );
        let mut bad = entry(&[
            ("skill://acme/refunds/SKILL.md", MD),
            ("skill://acme/refunds/a.md", b"a"),
        ]);
        if let SkillResources::Files(files) = &mut bad.resources {
            files[1].digest = "sha256:ABC".to_owned();
        }
        let error = check_entry(&bad).unwrap_err();
        assert!(error.starts_with("resources[1].digest: "), "{error}");
        let bad = entry(&[
            ("skill://acme/refunds/SKILL.md", MD),
            ("skill://acme/other/a.md", b"a"),
        ]);
        let error = check_entry(&bad).unwrap_err();
        assert!(error.starts_with("resources[1].uri: "), "{error}");
        let bad = entry(&[("skill://acme/refunds/a.md", b"a")]);
        assert!(check_entry(&bad).unwrap_err().starts_with("resources: "));
        // Dynamic skills have no manifest to check.
        let mut dynamic = good.clone();
        dynamic.resources = SkillResources::Dynamic;
        assert_eq!(check_entry(&dynamic), Ok(()));
    }

    #[test]
    fn the_limits_are_the_specifications() {
        let mut big = entry(&[("skill://acme/refunds/SKILL.md", MD)]);
        if let SkillResources::Files(files) = &mut big.resources {
            files[0].size = MAX_SKILL_BYTES + 1;
        }
        assert!(check_entry(&big).unwrap_err().contains("16777216"));
        let many: Vec<(String, Vec<u8>)> = (0..MAX_SKILL_FILES)
            .map(|i| (format!("skill://acme/refunds/f{i}.md"), vec![]))
            .collect();
        let mut files: Vec<(&str, &[u8])> = vec![("skill://acme/refunds/SKILL.md", MD)];
        files.extend(many.iter().map(|(u, b)| (u.as_str(), b.as_slice())));
        assert!(
            check_entry(&entry(&files))
                .unwrap_err()
                .contains("513 files")
        );
    }

    #[test]
    fn a_listing_names_the_entry_at_fault_and_refuses_a_uri_twice() {
        let good = entry(&[("skill://acme/refunds/SKILL.md", MD)]);
        let mut bad = good.clone();
        bad.frontmatter.name = "x".to_owned();
        let error = check_listing(&[good.clone(), bad]).unwrap_err();
        assert!(
            error.starts_with("skills[1] (skill://acme/refunds/SKILL.md): frontmatter.name"),
            "{error}"
        );
        let error = check_listing(&[good.clone(), good]).unwrap_err();
        assert!(
            error.contains("skills[1]") && error.contains("listed twice"),
            "{error}"
        );
    }

    #[test]
    fn strict_parsing_names_the_path() {
        let wire = json!({
            "resultType": "complete",
            "skills": [{
                "uri": "skill://a/SKILL.md",
                "frontmatter": {"name": "a", "description": "d"},
                "resources": [{"uri": "skill://a/SKILL.md", "digest": "sha256:00", "size": -1}]
            }]
        });
        let error = parse_strictly::<rmcp::model::ListSkillsResult>(wire).unwrap_err();
        assert!(error.starts_with("skills[0].resources"), "{error}");
        let wire = json!({"skills": [{"uri": "skill://a/SKILL.md", "frontmatter": {"name": "a", "description": "d"}, "resources": "static"}]});
        let error = parse_strictly::<rmcp::model::ListSkillsResult>(wire).unwrap_err();
        assert!(error.starts_with("skills[0].resources"), "{error}");
        let wire = json!({"skills": [{"uri": "skill://a/SKILL.md", "frontmatter": {"description": "d"}, "resources": "dynamic"}]});
        let error = parse_strictly::<rmcp::model::ListSkillsResult>(wire).unwrap_err();
        assert!(error.contains("name"), "{error}");
    }

    #[test]
    fn digests_and_sizes_are_checked_on_the_raw_bytes() {
        let listed = SkillResource::from_bytes("skill://a/x.bin", b"\x00\x01binary");
        let read = |content: FileContent| {
            let bytes = content.bytes().to_vec();
            SkillFile {
                uri: "skill://a/x.bin".to_owned(),
                mime_type: None,
                digest: rmcp::model::sha256_digest(&bytes),
                size: bytes.len() as u64,
                content,
            }
        };
        assert_eq!(
            verify(
                &read(FileContent::Blob(b"\x00\x01binary".to_vec())),
                &listed
            ),
            Ok(())
        );
        let Err(Mismatch::Digest(why)) = verify(
            &read(FileContent::Blob(b"\x00\x01binarY".to_vec())),
            &listed,
        ) else {
            panic!("a changed byte must mismatch");
        };
        assert!(
            why.contains("skill://a/x.bin") && why.contains("digest"),
            "{why}"
        );
        let Err(Mismatch::Digest(why)) = verify(&read(FileContent::Text("short".into())), &listed)
        else {
            panic!("another size must mismatch");
        };
        assert!(why.contains("5 bytes"), "{why}");
        // A blob is decoded before it is hashed.
        let blob = base64::engine::general_purpose::STANDARD.encode(b"\x00\x01binary");
        let file = file_of(
            "skill://a/x.bin",
            vec![ResourceContents::BlobResourceContents {
                uri: "skill://a/x.bin".to_owned(),
                mime_type: None,
                blob,
                meta: None,
            }],
        )
        .unwrap();
        assert_eq!(verify(&file, &listed), Ok(()));
    }

    #[test]
    fn a_file_reads_as_json_with_its_blob_in_base64() {
        let file = SkillFile {
            uri: "skill://a/x.bin".to_owned(),
            mime_type: None,
            content: FileContent::Blob(vec![0, 255]),
            digest: rmcp::model::sha256_digest(&[0, 255]),
            size: 2,
        };
        let json = serde_json::to_value(&file).unwrap();
        assert_eq!(json["content"], json!({"blob": "AP8="}));
        assert_eq!(serde_json::from_value::<SkillFile>(json).unwrap(), file);
        let text = serde_json::to_value(FileContent::Text("hi".to_owned())).unwrap();
        assert_eq!(text, json!({"text": "hi"}));
    }

    #[test]
    fn the_frontmatter_must_be_the_entrys_field_by_field() {
        let skill = entry(&[("skill://acme/refunds/SKILL.md", MD)]);
        assert_eq!(verify_frontmatter(MD, &skill), Ok(()));
        let crlf = MD
            .iter()
            .flat_map(|&b| {
                if b == b'\n' {
                    vec![b'\r', b'\n']
                } else {
                    vec![b]
                }
            })
            .collect::<Vec<u8>>();
        assert_eq!(verify_frontmatter(&crlf, &skill), Ok(()));
        let other = b"---\nname: refunds\ndescription: Process refunds.\nlicense: GPL\n---\n";
        let Err(Mismatch::Frontmatter(why)) = verify_frontmatter(other, &skill) else {
            panic!("a changed field must mismatch");
        };
        assert!(why.contains("`license`"), "{why}");
        let extra = b"---\nname: refunds\ndescription: Process refunds.\nlicense: MIT\nx: 1\n---\n";
        assert!(verify_frontmatter(extra, &skill).is_err());
        assert!(verify_frontmatter(b"# no frontmatter\n", &skill).is_err());
        assert!(verify_frontmatter(b"---\nname: [\n---\n", &skill).is_err());
    }
}
