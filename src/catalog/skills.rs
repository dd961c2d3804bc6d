//! A tenant's skills (SEP-2640) in its catalog snapshot: each server's
//! `skills/list` entries exposed as `server__<frontmatter.name>` (or the
//! bare name, under the tools' naming and collision rules, as prompts
//! are), hashed for approvals over everything an approval binds to (the
//! skill's URI, its frontmatter and its file manifest: every file's URI,
//! digest and size), withheld while unapproved. A skill is instructions
//! for a model: a changed skill is a rug-pull risk as a changed tool is.
//!
//! Two skills of one server with the same name are both left out, and the
//! server's `skills_error` names them (the specification forbids a host to
//! prefer one silently); a name two servers expose refuses both servers'
//! skills, as for prompts.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use super::{Catalog, ServerInput};
use crate::config::names;
use rmcp::model::{Skill, SkillResources};

/// One exposed skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogSkill {
    /// The exposed name, unique among the tenant's skills.
    pub name: String,
    /// The configured name of the server providing it.
    pub server: String,
    /// Index of that server in the tenant's configuration.
    pub server_index: usize,
    /// The resource URI of its `SKILL.md` (its identity on its server).
    pub uri: String,
    /// `frontmatter.name`: its name on its server.
    pub upstream_name: String,
    /// `frontmatter.description`.
    pub description: String,
    /// The whole frontmatter as JSON text (keys sorted).
    pub frontmatter_json: String,
    /// Its files (`SKILL.md` first, then in the server's order), or `None`
    /// for a `"dynamic"` skill (no digests to bind to or check).
    pub files: Option<Vec<SkillFileEntry>>,
    /// Stable hash of the definition (hex): what approvals record.
    pub definition_hash: String,
}

/// One file of a skill's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFileEntry {
    /// Its resource URI.
    pub uri: String,
    /// `sha256:` and 64 lowercase hex digits.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
}

/// A skill withheld because its definition is not approved.
#[derive(Debug, Clone)]
pub struct WithheldSkill {
    /// The skill as it would be exposed (current hash).
    pub skill: CatalogSkill,
    /// The approved hash, when the skill changed since its approval.
    pub approved_hash: Option<String>,
}

/// What one server's skills are, for [`Catalog::with_skills`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SkillInput<'a> {
    /// What a connected server listed (`Err`: why its skills are refused);
    /// `None` for a server not connected or without skills.
    pub listed: Option<&'a Result<Vec<Skill>, String>>,
    /// `Some` for a server with `definitions: approved`: only the skills
    /// whose definition hash these approvals record are exposed.
    pub approved: Option<&'a crate::approvals::ServerApprovals>,
}

/// The JSON text of `value` with every object's keys sorted: the same
/// frontmatter always gives the same text, whatever order the server sent.
#[must_use]
pub fn canonical_json(value: &serde_json::Value) -> String {
    fn sorted(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                // serde_json's map keeps insertion order only with
                // `preserve_order`; inserting sorted is right either way.
                serde_json::Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&map[k])))
                        .collect(),
                )
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(sorted).collect())
            }
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// The definition hash of skill entry `skill` exposed as `name` by
/// `server`: SHA-256, domain-tagged (`skill`) and each field
/// length-prefixed, over the names, the `SKILL.md` URI, the frontmatter
/// (canonical JSON) and each file's URI, digest and size (or `dynamic`);
/// 32 hex digits, as for tools. What `skills/get` answers at fetch time
/// is hashed alike and must give the approved hash.
#[must_use]
pub fn skill_hash(name: &str, server: &str, skill: &Skill) -> String {
    let frontmatter = serde_json::to_value(&skill.frontmatter).unwrap_or_default();
    let mut hasher = Sha256::new();
    let mut field = |text: &str| {
        hasher.update((text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    };
    field("skill");
    field(name);
    field(server);
    field(&skill.uri);
    field(&canonical_json(&frontmatter));
    match &skill.resources {
        SkillResources::Files(files) => {
            field(&files.len().to_string());
            for file in files {
                field(&file.uri);
                field(&file.digest);
                field(&file.size.to_string());
            }
        }
        _ => field("dynamic"),
    }
    hex::encode(&hasher.finalize()[..16])
}

/// The version of a snapshot's skills (in catalog order).
pub(super) fn skills_version(skills: &[CatalogSkill]) -> String {
    version_of(skills)
}

/// The version of these skills (in catalog order): a content hash over
/// their definitions, which [`Catalog::skills_version`] is for all of a
/// snapshot's (a caller who sees fewer gets the version of those).
pub fn version_of<'a>(skills: impl IntoIterator<Item = &'a CatalogSkill>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"skills");
    for skill in skills {
        hasher.update(skill.definition_hash.as_bytes());
    }
    hex::encode(&hasher.finalize()[..12])
}

impl Catalog {
    /// This snapshot with the servers' skills: `skills[i]` is what server
    /// `inputs[i]` offers. Tools and prompts are unchanged.
    #[must_use]
    pub fn with_skills(
        mut self,
        inputs: &[ServerInput<'_>],
        skills: &[SkillInput<'_>],
        limits: &crate::config::Limits,
    ) -> Catalog {
        let mut parts: Vec<Option<Result<ServerSkills, String>>> = inputs
            .iter()
            .zip(skills)
            .enumerate()
            .map(|(index, (input, skills))| {
                skills.listed.map(|listed| match listed {
                    Ok(listed) => server_skills(index, input, listed, limits),
                    Err(reason) => Err(reason.clone()),
                })
            })
            .collect();
        // A name two servers expose refuses both servers' skills.
        let names = parts.iter().enumerate().flat_map(|(index, part)| {
            let list = match part {
                Some(Ok((list, _))) => list.as_slice(),
                _ => &[],
            };
            list.iter().map(move |s| (index, s.name.as_str()))
        });
        let mut refusals = super::build::clashing_names(names, |index| inputs[index].name, "skill");
        let mut all = Vec::new();
        for (index, part) in parts.iter_mut().enumerate() {
            let status = &mut self.servers[index];
            match (part.take(), refusals.remove(&index)) {
                (None, _) => {}
                (Some(Err(reason)), _) | (Some(Ok(_)), Some(reason)) => {
                    status.skills_error = Some(reason);
                }
                (Some(Ok((mut list, left_out))), None) => {
                    status.skills_error = left_out;
                    status.withheld_skills = super::build::withhold_definitions(
                        &mut list,
                        skills[index].approved,
                        |skill| (&skill.name, &skill.definition_hash),
                        |skill, approved_hash| WithheldSkill {
                            skill,
                            approved_hash,
                        },
                    );
                    status.skill_count = u32::try_from(list.len()).unwrap_or(u32::MAX);
                    all.append(&mut list);
                }
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        self.skill_index = all
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        self.skills_version = skills_version(&all);
        self.skills = all;
        self
    }

    /// Every exposed skill, sorted by name.
    pub fn skills(&self) -> &[CatalogSkill] {
        &self.skills
    }

    /// The skill exposed as `name`, if any.
    pub fn skill(&self, name: &str) -> Option<&CatalogSkill> {
        self.skill_index.get(name).map(|&i| &self.skills[i])
    }

    /// The content-derived version of the skills: changes exactly when a
    /// skill is added, removed or changed.
    pub fn skills_version(&self) -> &str {
        &self.skills_version
    }

    /// The skill exposed as `name` would be, were its definition approved:
    /// with the server that lists it.
    pub fn withheld_skill(&self, name: &str) -> Option<(&super::ServerStatus, &WithheldSkill)> {
        self.servers().iter().find_map(|server| {
            server
                .withheld_skills
                .iter()
                .find(|w| w.skill.name == name)
                .map(|w| (server, w))
        })
    }
}

/// One server's exposed skills, and what was left out of them (in words).
type ServerSkills = (Vec<CatalogSkill>, Option<String>);

/// The exposed skills of one server and what was left out of them (two
/// skills sharing a name), or why its skills are refused.
fn server_skills(
    server_index: usize,
    input: &ServerInput<'_>,
    listed: &[Skill],
    limits: &crate::config::Limits,
) -> Result<ServerSkills, String> {
    if listed.len() > limits.max_prompts_per_server {
        return Err(format!(
            "server `{}` lists {} skills, over limits.max_prompts_per_server ({}), which \
             bounds skills too",
            input.name,
            listed.len(),
            limits.max_prompts_per_server
        ));
    }
    let mut by_name: HashMap<&str, Vec<&Skill>> = HashMap::new();
    for skill in listed {
        by_name.entry(skill.name()).or_default().push(skill);
    }
    let mut skills = Vec::with_capacity(listed.len());
    let mut shared: Vec<String> = Vec::new();
    for skill in listed {
        let upstream_name = skill.name();
        let same = &by_name[upstream_name];
        if same.len() > 1 {
            if std::ptr::eq(same[0], skill) {
                let uris: Vec<String> = same
                    .iter()
                    .map(|s| super::build::printable(&s.uri))
                    .collect();
                shared.push(format!(
                    "`{}` ({})",
                    super::build::printable(upstream_name),
                    uris.join(", ")
                ));
            }
            continue;
        }
        let exposed = names::expose(input.name, upstream_name, input.bare);
        if !names::is_valid_exposed(&exposed) {
            return Err(format!(
                "skill `{}` of server `{}` would be exposed as `{}`, which does not match \
                 ^[a-zA-Z0-9_-]{{1,64}}$; the server's skills are refused",
                super::build::printable(upstream_name),
                input.name,
                super::build::printable(&exposed)
            ));
        }
        let chars = skill.frontmatter.description.chars().count();
        if chars > limits.max_description_chars {
            return Err(format!(
                "skill `{upstream_name}` of server `{}` has a description of {chars} characters, \
                 over limits.max_description_chars ({}); the server's skills are refused",
                input.name, limits.max_description_chars
            ));
        }
        skills.push(catalog_skill(server_index, input.name, exposed, skill));
    }
    let left_out = (!shared.is_empty()).then(|| {
        format!(
            "skills sharing a name on server `{}` are left out (a name must pick one skill): {}",
            input.name,
            shared.join("; ")
        )
    });
    Ok((skills, left_out))
}

/// One listed skill as exposed.
fn catalog_skill(
    server_index: usize,
    server: &str,
    exposed: String,
    skill: &Skill,
) -> CatalogSkill {
    let frontmatter = serde_json::to_value(&skill.frontmatter).unwrap_or_default();
    let files = match &skill.resources {
        SkillResources::Files(files) => {
            let mut entries: Vec<SkillFileEntry> = files
                .iter()
                .map(|f| SkillFileEntry {
                    uri: f.uri.clone(),
                    digest: f.digest.clone(),
                    size: f.size,
                })
                .collect();
            // SKILL.md first (a stable sort keeps the server's order).
            entries.sort_by_key(|f| f.uri != skill.uri);
            Some(entries)
        }
        _ => None,
    };
    CatalogSkill {
        definition_hash: skill_hash(&exposed, server, skill),
        name: exposed,
        server: server.to_owned(),
        server_index,
        uri: skill.uri.clone(),
        upstream_name: skill.name().to_owned(),
        description: skill.frontmatter.description.clone(),
        frontmatter_json: canonical_json(&frontmatter),
        files,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::InputState;
    use crate::config::ToolFilter;
    use rmcp::model::{SkillFrontmatter, SkillResource};

    pub(crate) fn skill(name: &str, files: &[(&str, &[u8])]) -> Skill {
        let uri = format!("skill://{name}/SKILL.md");
        let mut resources = vec![SkillResource::from_bytes(&uri, b"---\n---\n")];
        resources.extend(files.iter().map(|(path, bytes)| {
            SkillResource::from_bytes(format!("skill://{name}/{path}"), bytes)
        }));
        Skill::new(
            uri,
            SkillFrontmatter::new(name, format!("does {name}")),
            SkillResources::Files(resources),
        )
    }

    fn build(servers: &[(&str, bool)], skills: &[SkillInput<'_>]) -> Catalog {
        let filter = ToolFilter::default();
        let overrides = HashMap::new();
        let inputs: Vec<_> = servers
            .iter()
            .map(|&(name, bare)| ServerInput {
                name,
                transport: "stdio",
                bare,
                filter: &filter,
                overrides: &overrides,
                state: InputState::Listed(&[]),
                approved: None,
            })
            .collect();
        let limits = crate::config::Limits::default();
        Catalog::build(&inputs, &limits).with_skills(&inputs, skills, &limits)
    }

    fn listed(result: &Result<Vec<Skill>, String>) -> SkillInput<'_> {
        SkillInput {
            listed: Some(result),
            approved: None,
        }
    }

    #[test]
    fn namespaced_with_their_manifest_and_skill_md_first() {
        let mut refunds = skill("refunds", &[("a.md", b"a")]);
        if let SkillResources::Files(files) = &mut refunds.resources {
            files.reverse();
        }
        let listing = Ok(vec![refunds, skill("git", &[])]);
        let catalog = build(&[("docs", false)], &[listed(&listing)]);
        let names: Vec<_> = catalog.skills().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["docs__git", "docs__refunds"]);
        let refunds = catalog.skill("docs__refunds").unwrap();
        assert_eq!(refunds.upstream_name, "refunds");
        let files = refunds.files.as_ref().unwrap();
        assert_eq!(files[0].uri, "skill://refunds/SKILL.md");
        assert_eq!(files[1].uri, "skill://refunds/a.md");
        assert_eq!(files[1].size, 1);
        assert_eq!(catalog.servers()[0].skill_count, 2);
        assert!(!catalog.skills_version().is_empty());
    }

    #[test]
    fn the_hash_binds_the_uri_frontmatter_and_every_file() {
        let base = skill("s", &[("a.md", b"a")]);
        let hash = |s: &Skill| skill_hash("x__s", "x", s);
        let h = hash(&base);
        assert_eq!(h.len(), 32);
        let mut changed = base.clone();
        changed.frontmatter.description = "other".to_owned();
        assert_ne!(h, hash(&changed));
        let mut changed = base.clone();
        changed.frontmatter = changed.frontmatter.with_field("license", "MIT");
        assert_ne!(h, hash(&changed));
        let mut changed = base.clone();
        if let SkillResources::Files(files) = &mut changed.resources {
            files[1] = SkillResource::from_bytes(files[1].uri.clone(), b"b");
        }
        assert_ne!(h, hash(&changed));
        let mut changed = base.clone();
        if let SkillResources::Files(files) = &mut changed.resources {
            files.pop();
        }
        assert_ne!(h, hash(&changed));
        let mut changed = base.clone();
        changed.resources = SkillResources::Dynamic;
        assert_ne!(h, hash(&changed));
        assert_ne!(h, skill_hash("y__s", "y", &base));
        assert_eq!(h, hash(&base.clone()));
        // Key order on the wire does not matter.
        let a = serde_json::json!({"b": 1, "a": {"d": 2, "c": 3}});
        let b = serde_json::json!({"a": {"c": 3, "d": 2}, "b": 1});
        assert_eq!(canonical_json(&a), canonical_json(&b));
    }

    #[test]
    fn names_shared_on_a_server_are_left_out_and_said() {
        let mut other = skill("refunds", &[]);
        other.uri = "skill://acme/refunds/SKILL.md".to_owned();
        let listing = Ok(vec![skill("refunds", &[]), other, skill("git", &[])]);
        let catalog = build(&[("s", false)], &[listed(&listing)]);
        let names: Vec<_> = catalog.skills().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["s__git"]);
        let reason = catalog.servers()[0].skills_error.as_deref().unwrap();
        assert!(
            reason.contains("`refunds`") && reason.contains("skill://acme/refunds/SKILL.md"),
            "{reason}"
        );
    }

    #[test]
    fn a_name_two_servers_expose_refuses_both_a_failed_listing_one() {
        let a = Ok(vec![skill("git", &[])]);
        let b = Ok(vec![skill("git", &[])]);
        let failed = Err("skills/list failed: boom".to_owned());
        let catalog = build(
            &[("one", true), ("two", true), ("three", false)],
            &[listed(&a), listed(&b), listed(&failed)],
        );
        assert!(catalog.skills().is_empty());
        for status in &catalog.servers()[..2] {
            assert!(status.skills_error.as_deref().unwrap().contains("`git`"));
        }
        assert_eq!(
            catalog.servers()[2].skills_error.as_deref(),
            Some("skills/list failed: boom")
        );
        // A server that offers no skills has neither skills nor an error.
        let catalog = build(&[("none", false)], &[SkillInput::default()]);
        assert_eq!(catalog.servers()[0].skills_error, None);
        assert_eq!(catalog.servers()[0].skill_count, 0);
    }

    #[test]
    fn unapproved_skills_are_withheld() {
        use crate::approvals::{Approval, ServerApprovals};
        let listing = Ok(vec![
            skill("kept", &[]),
            skill("changed", &[]),
            skill("new", &[]),
        ]);
        let everything = build(&[("s", false)], &[listed(&listing)]);
        let hash = |name: &str| everything.skill(name).unwrap().definition_hash.clone();
        let approved: ServerApprovals =
            [("s__kept", hash("s__kept")), ("s__changed", "0".repeat(32))]
                .into_iter()
                .map(|(name, hash)| {
                    (
                        name.to_owned(),
                        Approval {
                            hash,
                            description: String::new(),
                        },
                    )
                })
                .collect();
        let input = SkillInput {
            listed: Some(&listing),
            approved: Some(&approved),
        };
        let catalog = build(&[("s", false)], &[input]);
        let names: Vec<_> = catalog.skills().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["s__kept"]);
        let (server, changed) = catalog.withheld_skill("s__changed").unwrap();
        assert_eq!(server.name, "s");
        assert_eq!(changed.approved_hash, Some("0".repeat(32)));
        assert!(
            catalog
                .withheld_skill("s__new")
                .unwrap()
                .1
                .approved_hash
                .is_none()
        );
    }
}
