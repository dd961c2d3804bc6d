//! `ListSkills` and `GetSkill` (SEP-2640 skills): a tenant's skills under
//! exposed names, with policy and approvals as for prompts, and a fetched
//! skill as a `GetSkillResponse` (`GetSkill` is a call of the pipeline:
//! [`crate::calls::SkillGet`]).

use globset::GlobSet;
use tonic::{Request, Status};

use super::{Gateway, convert, listing};
use crate::calls::viewer::{self, Viewer};
use crate::calls::{FetchedSkill, Outcome, Recorded, Reply, SkillGet, Unencodable};
use crate::catalog::CatalogSkill;
use crate::pb;
use crate::upstream::skills::{FileContent, SkillResources};

/// `ListSkills`.
pub(super) async fn list(
    gateway: &Gateway,
    request: Request<pb::ListSkillsRequest>,
) -> Result<pb::ListSkillsResponse, Status> {
    let (tenant, _busy) = gateway.listing_tenant(&request)?;
    let filter = Filter::new(request.get_ref())?;
    let catalog = super::settled_catalog(&tenant, &request, "ListSkills").await;
    let (caller, subject) = super::caller_of(&request);
    let policy = viewer::policy_for(&tenant, &catalog);
    let viewer = Viewer {
        policy: policy.as_deref(),
        caller: &caller,
        subject: &subject,
    };
    // A skill the policy denies is neither listed nor counted, and its
    // withheld definition not shown.
    let allowed = |skill: &CatalogSkill| {
        viewer
            .policy
            .is_none_or(|p| p.allows_skill(viewer.caller, viewer.subject, skill))
    };
    let seen: Vec<&CatalogSkill> = catalog.skills().iter().filter(|s| allowed(s)).collect();
    let skills = seen
        .iter()
        .filter(|s| filter.allows(s))
        .map(|s| skill(s))
        .collect();
    let mut servers = convert::server_statuses(&catalog);
    for (status, server) in servers.iter_mut().zip(catalog.servers()) {
        status.skill_count = u32::try_from(seen.iter().filter(|s| s.server == server.name).count())
            .unwrap_or(u32::MAX);
        status.withheld_skills = server
            .withheld_skills
            .iter()
            .filter(|w| allowed(&w.skill))
            .map(|w| w.skill.name.clone())
            .collect();
        status.skills_error = server.skills_error.clone().unwrap_or_default();
    }
    listing::show_consent_in(&tenant, &catalog, &viewer, &mut servers).await;
    listing::show_circuits(gateway.calls().breakers(), &tenant, &subject, &mut servers);
    // The caller's own version: the catalog's when it sees every skill.
    let skills_version = if seen.len() == catalog.skills().len() {
        catalog.skills_version().to_owned()
    } else {
        crate::catalog::skills::version_of(seen.iter().copied())
    };
    Ok(pb::ListSkillsResponse {
        skills,
        skills_version,
        servers,
    })
}

/// `GetSkill`.
///
/// # Errors
/// The status the call ends with.
pub(super) async fn get(
    gateway: &Gateway,
    request: Request<pb::GetSkillRequest>,
) -> Result<pb::GetSkillResponse, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let origin = gateway.origin(&request, tenant, "GetSkill");
    let request = request.into_inner();
    let get = SkillGet {
        name: request.name,
        definition_hash: request.definition_hash,
        with_files: request.with_files,
        paths: request.paths,
    };
    Ok(gateway.calls.run(origin, get).await?)
}

/// One catalog skill as a `Skill` message.
fn skill(skill: &CatalogSkill) -> pb::Skill {
    pb::Skill {
        name: skill.name.clone(),
        server: skill.server.clone(),
        uri: skill.uri.clone(),
        skill_name: skill.upstream_name.clone(),
        description: skill.description.clone(),
        frontmatter_json: skill.frontmatter_json.clone(),
        files: skill
            .files
            .iter()
            .flatten()
            .map(|f| pb::SkillFile {
                uri: f.uri.clone(),
                path: crate::calls::relative_path(&skill.uri, &f.uri).to_owned(),
                digest: f.digest.clone(),
                size: f.size,
            })
            .collect(),
        dynamic: skill.files.is_none(),
        definition_hash: skill.definition_hash.clone(),
    }
}

impl Reply<FetchedSkill> for pb::GetSkillResponse {
    fn encode(outcome: Outcome<FetchedSkill>, server: &str) -> Result<Self, Unencodable> {
        let Outcome::Done(fetched) = outcome else {
            return Err(Unencodable("a skill fetch asked questions".to_owned()));
        };
        let entry = &fetched.entry;
        let frontmatter = serde_json::to_value(&entry.frontmatter).unwrap_or_default();
        let files = match &entry.resources {
            SkillResources::Files(files) => {
                let mut files: Vec<pb::SkillFile> = files
                    .iter()
                    .map(|f| pb::SkillFile {
                        uri: f.uri.clone(),
                        path: crate::calls::relative_path(&entry.uri, &f.uri).to_owned(),
                        digest: f.digest.clone(),
                        size: f.size,
                    })
                    .collect();
                files.sort_by_key(|f| f.uri != entry.uri);
                files
            }
            _ => Vec::new(),
        };
        Ok(Self {
            skill: Some(pb::Skill {
                // The catalog's: the send step checked the entry hashes to
                // the listed definition.
                name: fetched.name,
                server: server.to_owned(),
                uri: entry.uri.clone(),
                skill_name: entry.frontmatter.name.clone(),
                description: entry.frontmatter.description.clone(),
                frontmatter_json: crate::catalog::skills::canonical_json(&frontmatter),
                dynamic: !matches!(entry.resources, SkillResources::Files(_)),
                files,
                definition_hash: fetched.definition_hash,
            }),
            files: fetched
                .files
                .into_iter()
                .map(|f| pb::SkillFileContent {
                    path: crate::calls::relative_path(&entry.uri, &f.uri).to_owned(),
                    uri: f.uri,
                    mime_type: f.mime_type.unwrap_or_default(),
                    content: Some(match f.content {
                        FileContent::Text(text) => pb::skill_file_content::Content::Text(text),
                        FileContent::Blob(bytes) => pb::skill_file_content::Content::Blob(bytes),
                    }),
                    digest: f.digest,
                    size: f.size,
                })
                .collect(),
            verified: fetched.verified,
        })
    }

    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }
}

impl Recorded for pb::GetSkillResponse {
    fn recorded_bytes(&self, _guarded: bool) -> Option<u64> {
        Some(prost::Message::encoded_len(self) as u64)
    }
}

/// A validated ListSkillsRequest filter (as ListPrompts': servers and
/// globs over exposed names).
struct Filter {
    servers: Vec<String>,
    names: Option<GlobSet>,
}

impl Filter {
    /// # Errors
    /// INVALID_ARGUMENT naming a glob that does not parse.
    fn new(request: &pb::ListSkillsRequest) -> Result<Self, Status> {
        let names = listing::glob_set("name_globs", &request.name_globs)?;
        Ok(Self {
            servers: request.servers.clone(),
            names,
        })
    }

    fn allows(&self, skill: &CatalogSkill) -> bool {
        (self.servers.is_empty() || self.servers.contains(&skill.server))
            && self.names.as_ref().is_none_or(|n| n.is_match(&skill.name))
    }
}
