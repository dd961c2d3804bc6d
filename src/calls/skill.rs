//! `GetSkill` as an operation of the pipeline: a skill of the caller's
//! catalog (SEP-2640), with policy, approvals and its pin as for a
//! prompt, fetched from its server and verified.
//!
//! The send step asks the server for the skill's current entry
//! (`skills/get`): an entry whose definition hash is not the catalog's
//! (the listed, approved one) is refused (`SKILL_DEFINITION_CHANGED`),
//! and the server's skills are listed again. Then `SKILL.md` and the files
//! asked for are read (`resources/read`), within
//! `limits.max_message_bytes` by the manifest's sizes, and each is checked
//! against the manifest's size and SHA-256 digest, `SKILL.md`'s
//! frontmatter against the entry's: any mismatch refuses the whole fetch
//! (`SKILL_DIGEST_MISMATCH`, `SKILL_FRONTMATTER_MISMATCH`) naming the
//! file. A `"dynamic"` skill has no digests: only its `SKILL.md` is read
//! (frontmatter checked) and the answer says it is unverified. The requests
//! share the call's one upstream timeout. Guards see the verified fetch
//! (`TARGET_KIND_SKILL`): a skill is instructions for a model.

use rmcp::model::JsonObject;
use serde::{Deserialize, Serialize};

use super::Origin;
use super::error::{CallError, Feature, Target, quoted};
use super::pipeline::{Operation, Reached, Routed, Sending, Upstream};
use super::rounds::Method;
use super::route;
use super::viewer::Viewer;
use crate::catalog::{Catalog, CatalogSkill, ServerState};
use crate::pb::guard::TargetKind;
use crate::registry::{Resolved, Tenant};
use crate::upstream::skills::{self, Mismatch, Skill, SkillFile, SkillResources};
use crate::upstream::{ListKind, UpstreamError};

/// Most paths one GetSkill may name (a skill has at most this many files).
const MAX_PATHS: usize = skills::MAX_SKILL_FILES;

/// One skill to fetch.
#[derive(Debug, Default)]
pub struct SkillGet {
    /// The exposed name.
    pub name: String,
    /// The definition hash the caller's plan saw (empty: none pinned).
    pub definition_hash: String,
    /// Every file of the manifest, not only `SKILL.md`.
    pub with_files: bool,
    /// These files too, by path relative to the skill's root.
    pub paths: Vec<String>,
}

/// What a fetch answers: the server's current entry and the files read,
/// `SKILL.md` first, each checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FetchedSkill {
    /// The exposed name.
    pub name: String,
    /// Its definition hash (the catalog's, which the entry hashes to).
    pub definition_hash: String,
    /// The entry `skills/get` answered (the listed definition).
    pub entry: Skill,
    /// The files read, `SKILL.md` first, then in manifest order.
    pub files: Vec<SkillFile>,
    /// Whether sizes and digests were checked (false: a dynamic skill).
    pub verified: bool,
}

/// Whether the policy lets the caller fetch `skill`.
fn permitted(viewer: &Viewer<'_>, skill: &CatalogSkill) -> Result<(), CallError> {
    if viewer
        .policy
        .is_none_or(|p| p.allows_skill(viewer.caller, viewer.subject, skill))
    {
        Ok(())
    } else {
        Err(CallError::NotPermitted {
            server: skill.server.clone(),
            target: Target::skill(skill.name.clone()),
        })
    }
}

/// The path of `uri` relative to the root of the skill whose `SKILL.md`
/// is at `skill_uri` (the URI itself when it is not under that root).
#[must_use]
pub fn relative_path<'a>(skill_uri: &str, uri: &'a str) -> &'a str {
    skill_uri
        .strip_suffix(skills::SKILL_MD)
        .and_then(|root| uri.strip_prefix(root))
        .unwrap_or(uri)
}

impl SkillGet {
    /// The URIs to read of `entry`: `SKILL.md`, then (for a skill with a
    /// manifest) every file or those at `paths`, in manifest order.
    ///
    /// # Errors
    /// SKILL_FILE_NOT_LISTED for a path the manifest does not list.
    fn wanted(&self, name: &str, entry: &Skill) -> Result<Vec<skills::SkillResource>, CallError> {
        let SkillResources::Files(files) = &entry.resources else {
            return Ok(Vec::new());
        };
        for path in &self.paths {
            if !files
                .iter()
                .any(|f| relative_path(&entry.uri, &f.uri) == path)
            {
                return Err(CallError::SkillFileNotListed {
                    skill: name.to_owned(),
                    path: quoted(path).into_owned(),
                });
            }
        }
        let mut wanted: Vec<skills::SkillResource> = files
            .iter()
            .filter(|f| {
                f.uri == entry.uri
                    || self.with_files
                    || self
                        .paths
                        .iter()
                        .any(|p| relative_path(&entry.uri, &f.uri) == p)
            })
            .cloned()
            .collect();
        wanted.sort_by_key(|f| f.uri != entry.uri);
        Ok(wanted)
    }
}

impl Operation for SkillGet {
    type Output = FetchedSkill;
    type Extra = ();

    const FEATURE: Option<Feature> = Some(Feature::Skills);
    const GUARDED: Option<TargetKind> = Some(TargetKind::Skill);
    const ROUNDS: Option<Method> = None;
    const IDEMPOTENT: bool = true;

    fn span(&self, tenant: &str) -> tracing::Span {
        super::rpc_span("GetSkill", tenant)
    }

    fn describe(&self, record: &mut crate::audit::Record, tenant: &Tenant) {
        record.skill = Some(quoted(&self.name).into_owned());
        if let Some(skill) = tenant.catalog().skill(&self.name) {
            record.uri = Some(skill.uri.clone());
        }
    }

    fn audited_arguments(&self) -> Option<std::borrow::Cow<'_, str>> {
        None
    }

    fn check(&self) -> Result<(), CallError> {
        if self.name.is_empty() || self.name.len() > super::error::MAX_TOOL_NAME {
            return Err(CallError::SkillNotFound {
                name: quoted(&self.name).into_owned(),
            });
        }
        if let Some(path) = self
            .paths
            .iter()
            .find(|p| p.is_empty() || p.len() > super::error::MAX_TARGET_NAME)
            .or(self.paths.get(MAX_PATHS))
        {
            return Err(CallError::SkillFileNotListed {
                skill: quoted(&self.name).into_owned(),
                path: quoted(path).into_owned(),
            });
        }
        Ok(())
    }

    async fn resolve(
        &self,
        origin: &Origin,
        reached: &mut Reached,
    ) -> Result<Routed<()>, CallError> {
        let name = self.name.as_str();
        let Resolved { tenant, catalog } =
            route::resolve_when(&origin.tenant, origin.deadline, |catalog| {
                catalog.skill(name).is_some()
            })
            .await?;
        let viewer = Viewer {
            policy: tenant.policy().map(AsRef::as_ref),
            caller: &origin.caller,
            subject: &origin.subject,
        };
        let Some(skill) = catalog.skill(name) else {
            return Err(not_listed(&catalog, name, &viewer, reached));
        };
        reached.server = Some(skill.server.clone());
        reached.definition_hash = Some(skill.definition_hash.clone());
        permitted(&viewer, skill)?;
        if !self.definition_hash.is_empty() && self.definition_hash != skill.definition_hash {
            return Err(CallError::SkillDefinitionChanged {
                skill: skill.name.clone(),
                since: "chosen",
                expected_hash: quoted(&self.definition_hash).into_owned(),
                current_hash: skill.definition_hash.clone(),
            });
        }
        Ok(Routed {
            index: skill.server_index,
            server: skill.server.clone(),
            // The skill's identity on its server: its SKILL.md's URI.
            upstream_name: skill.uri.clone(),
            target: Target::skill(name),
            definition_hash: skill.definition_hash.clone(),
            // A fetch changes nothing: a retry is safe.
            idempotent: true,
            tenant: tenant.clone(),
            kind: (),
        })
    }

    fn arguments(&self, _routed: &Routed<()>, _limit: usize) -> Result<JsonObject, CallError> {
        Ok(JsonObject::new())
    }

    async fn send(
        &self,
        sending: Sending<'_, ()>,
    ) -> Result<Result<Upstream<FetchedSkill>, UpstreamError>, CallError> {
        let routed = sending.routed;
        let session = sending.session;
        let name = routed.target.name.as_str();
        // One deadline for the fetch, however many requests it takes.
        let deadline = tokio::time::Instant::now() + sending.timeout;
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        let entry = match session.get_skill(&routed.upstream_name, left()).await {
            Ok(entry) => entry,
            // -32602: the server serves no such skill (any more). Listed
            // again, the catalog catches up.
            Err(UpstreamError::JsonRpc { code, .. })
                if code == super::classify::jsonrpc::INVALID_PARAMS =>
            {
                session.events().list_changed(ListKind::Skills);
                return Err(CallError::SkillNotFound {
                    name: name.to_owned(),
                });
            }
            Err(error) => return Ok(Err(error)),
        };
        // What the server serves now must be what was listed (and, under
        // `definitions: approved`, approved).
        let current = crate::catalog::skills::skill_hash(name, &routed.server, &entry);
        if current != routed.definition_hash {
            // Listed again: the catalog catches up (and withholds the
            // changed skill until it is approved).
            session.events().list_changed(ListKind::Skills);
            return Err(CallError::SkillDefinitionChanged {
                skill: name.to_owned(),
                since: "listed",
                expected_hash: routed.definition_hash.clone(),
                current_hash: current,
            });
        }
        let wanted = self.wanted(name, &entry)?;
        let limit = routed.tenant.limits().max_message_bytes;
        let listed: u64 = wanted.iter().map(|f| f.size).fold(0, u64::saturating_add);
        if listed > limit as u64 {
            return Err(CallError::ResponseTooLarge {
                server: routed.server.clone(),
                tool: routed.target.clone(),
                size: usize::try_from(listed).unwrap_or(usize::MAX),
                limit,
            });
        }
        let verified = !wanted.is_empty();
        let uris: Vec<&str> = if verified {
            wanted.iter().map(|f| f.uri.as_str()).collect()
        } else {
            vec![entry.uri.as_str()]
        };
        let mut files = Vec::with_capacity(uris.len());
        let mut read: u64 = 0;
        for (index, uri) in uris.iter().enumerate() {
            if left().is_zero() {
                return Ok(Err(UpstreamError::Timeout(sending.timeout)));
            }
            let file = match session.read_skill_file(uri, left()).await {
                Ok(file) => file,
                // The call's timeout, whichever request ran it out.
                Err(UpstreamError::Timeout(_)) => {
                    return Ok(Err(UpstreamError::Timeout(sending.timeout)));
                }
                Err(error) => return Ok(Err(error)),
            };
            let mismatch = |mismatch: Mismatch| CallError::SkillMismatch {
                server: routed.server.clone(),
                skill: name.to_owned(),
                uri: (*uri).to_owned(),
                frontmatter: matches!(mismatch, Mismatch::Frontmatter(_)),
                reason: mismatch.to_string(),
            };
            if let Some(listed) = wanted.get(index) {
                skills::verify(&file, listed).map_err(mismatch)?;
            }
            if *uri == entry.uri {
                skills::verify_frontmatter(file.content.bytes(), &entry).map_err(mismatch)?;
            }
            read = read.saturating_add(file.size);
            if read > limit as u64 {
                return Err(CallError::ResponseTooLarge {
                    server: routed.server.clone(),
                    tool: routed.target.clone(),
                    size: usize::try_from(read).unwrap_or(usize::MAX),
                    limit,
                });
            }
            files.push(file);
        }
        if session.redacts_results() {
            for file in &mut files {
                skills::redact_file(file, session.redaction());
            }
        }
        Ok(Ok(Upstream::Complete(FetchedSkill {
            name: name.to_owned(),
            definition_hash: current,
            entry,
            files,
            verified,
        })))
    }
}

/// Why `name`, not among the catalog's skills, cannot be fetched:
/// withheld for want of approval, its server down, or unknown.
fn not_listed(
    catalog: &Catalog,
    name: &str,
    viewer: &Viewer<'_>,
    reached: &mut Reached,
) -> CallError {
    if let Some((server, withheld)) = catalog.withheld_skill(name) {
        if let Err(refused) = permitted(viewer, &withheld.skill) {
            return refused;
        }
        reached.server = Some(server.name.clone());
        return CallError::DefinitionNotApproved {
            server: server.name.clone(),
            tool: Target::skill(name),
            definition_hash: withheld.skill.definition_hash.clone(),
            approved_hash: withheld.approved_hash.clone(),
        };
    }
    // A name in the namespace of a server that is down is unavailable.
    if let Some(server) = catalog.down_server_for(name) {
        reached.server = Some(server.name.clone());
        return CallError::ServerUnavailable {
            server: server.name.clone(),
            tool: Target::skill(name),
            reason: match &server.state {
                ServerState::Failed(reason) | ServerState::AuthorizationRequired(reason) => {
                    reason.clone()
                }
                _ => "still connecting".to_owned(),
            },
        };
    }
    CallError::SkillNotFound {
        name: quoted(name).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{SkillFrontmatter, SkillResource};

    fn entry() -> Skill {
        Skill::new(
            "skill://acme/refunds/SKILL.md",
            SkillFrontmatter::new("refunds", "Refunds."),
            SkillResources::Files(vec![
                SkillResource::from_bytes("skill://acme/refunds/examples/a.md", b"a"),
                SkillResource::from_bytes("skill://acme/refunds/SKILL.md", b"md"),
                SkillResource::from_bytes("skill://acme/refunds/b.md", b"b"),
            ]),
        )
    }

    fn uris(files: &[SkillResource]) -> Vec<&str> {
        files.iter().map(|f| f.uri.as_str()).collect()
    }

    #[test]
    fn skill_md_first_then_what_was_asked_in_manifest_order() {
        let only = SkillGet::default();
        assert_eq!(
            uris(&only.wanted("s__refunds", &entry()).unwrap()),
            ["skill://acme/refunds/SKILL.md"]
        );
        let all = SkillGet {
            with_files: true,
            ..SkillGet::default()
        };
        assert_eq!(
            uris(&all.wanted("s__refunds", &entry()).unwrap()),
            [
                "skill://acme/refunds/SKILL.md",
                "skill://acme/refunds/examples/a.md",
                "skill://acme/refunds/b.md"
            ]
        );
        let some = SkillGet {
            paths: vec!["b.md".to_owned()],
            ..SkillGet::default()
        };
        assert_eq!(
            uris(&some.wanted("s__refunds", &entry()).unwrap()),
            ["skill://acme/refunds/SKILL.md", "skill://acme/refunds/b.md"]
        );
        let unlisted = SkillGet {
            paths: vec!["../other/SKILL.md".to_owned()],
            ..SkillGet::default()
        };
        assert!(matches!(
            unlisted.wanted("s__refunds", &entry()),
            Err(CallError::SkillFileNotListed { .. })
        ));
        // A dynamic skill has no manifest: SKILL.md alone, unverified.
        let mut dynamic = entry();
        dynamic.resources = SkillResources::Dynamic;
        assert!(all.wanted("s__refunds", &dynamic).unwrap().is_empty());
        assert_eq!(
            relative_path(
                "skill://acme/refunds/SKILL.md",
                "skill://acme/refunds/examples/a.md"
            ),
            "examples/a.md"
        );
    }
}
