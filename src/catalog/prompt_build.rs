//! Adding the servers' prompts to a catalog snapshot: exposed names
//! (`server__prompt`, or bare) under the tools' naming and checking rules,
//! collisions among prompts only (two servers exposing one prompt name
//! lose their prompts, both), withholding unapproved definitions, and the
//! prompts' own content-derived version. A prompt failure never touches a
//! server's tools.

use std::collections::HashMap;

use super::hash::{prompt_hash, prompts_version};
use super::prompts::{CatalogPrompt, PromptArgument, WithheldPrompt};
use super::{Catalog, ServerInput};
use crate::config::names;

/// What one server's prompts are, for [`Catalog::with_prompts`].
#[derive(Debug, Clone, Copy, Default)]
pub struct PromptInput<'a> {
    /// What a connected server listed (`Err`: why its prompts are
    /// refused); `None` for a server not connected or without prompts.
    pub listed: Option<&'a Result<Vec<rmcp::model::Prompt>, String>>,
    /// `Some` for a server with `definitions: approved`: only the prompts
    /// whose definition hash these approvals record are exposed.
    pub approved: Option<&'a crate::approvals::ServerApprovals>,
}

impl Catalog {
    /// This snapshot with the servers' prompts: `prompts[i]` is what
    /// server `inputs[i]` offers. Tools and the tools' version are
    /// unchanged.
    #[must_use]
    pub fn with_prompts(
        mut self,
        inputs: &[ServerInput<'_>],
        prompts: &[PromptInput<'_>],
        limits: &crate::config::Limits,
    ) -> Catalog {
        // Each server's candidates, or why its prompts are refused.
        let mut parts: Vec<Option<Result<Vec<CatalogPrompt>, String>>> = inputs
            .iter()
            .zip(prompts)
            .enumerate()
            .map(|(index, (input, prompts))| {
                prompts.listed.map(|listed| match listed {
                    Ok(listed) => server_prompts(index, input, listed, limits),
                    Err(reason) => Err(reason.clone()),
                })
            })
            .collect();
        // A name two servers expose refuses both servers' prompts.
        let names = parts.iter().enumerate().flat_map(|(index, part)| {
            let list = match part {
                Some(Ok(list)) => list.as_slice(),
                _ => &[],
            };
            list.iter().map(move |p| (index, p.name.as_str()))
        });
        let mut refusals =
            super::build::clashing_names(names, |index| inputs[index].name, "prompt");
        let mut all = Vec::new();
        for (index, part) in parts.iter_mut().enumerate() {
            let status = &mut self.servers[index];
            match (part.take(), refusals.remove(&index)) {
                (None, _) => {}
                (Some(Err(reason)), _) | (Some(Ok(_)), Some(reason)) => {
                    status.prompts_error = Some(reason);
                }
                (Some(Ok(mut list)), None) => {
                    status.withheld_prompts = withhold(&mut list, prompts[index].approved);
                    status.prompt_count = u32::try_from(list.len()).unwrap_or(u32::MAX);
                    all.append(&mut list);
                }
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        self.prompt_index = all
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        self.prompts_version = prompts_version(&all);
        self.prompts = all;
        self
    }

    /// The prompt exposed as `name` would be, were its definition
    /// approved: with the server that lists it.
    pub fn withheld_prompt(&self, name: &str) -> Option<(&super::ServerStatus, &WithheldPrompt)> {
        self.servers().iter().find_map(|server| {
            server
                .withheld_prompts
                .iter()
                .find(|w| w.prompt.name == name)
                .map(|w| (server, w))
        })
    }
}

/// Takes the prompts whose definitions `approved` does not record out of
/// `prompts` (none when `approved` is `None`), sorted by name. A withheld
/// prompt still claims its name.
fn withhold(
    prompts: &mut Vec<CatalogPrompt>,
    approved: Option<&crate::approvals::ServerApprovals>,
) -> Vec<WithheldPrompt> {
    super::build::withhold_definitions(
        prompts,
        approved,
        |prompt| (&prompt.name, &prompt.definition_hash),
        |prompt, approved_hash| WithheldPrompt {
            prompt,
            approved_hash,
        },
    )
}

/// The exposed prompts of one server, or why its prompts are refused.
fn server_prompts(
    server_index: usize,
    input: &ServerInput<'_>,
    listed: &[rmcp::model::Prompt],
    limits: &crate::config::Limits,
) -> Result<Vec<CatalogPrompt>, String> {
    if listed.len() > limits.max_prompts_per_server {
        return Err(format!(
            "server `{}` lists {} prompts, over limits.max_prompts_per_server ({})",
            input.name,
            listed.len(),
            limits.max_prompts_per_server
        ));
    }
    let mut seen = HashMap::new();
    let mut prompts = Vec::with_capacity(listed.len());
    for prompt in listed {
        let upstream_name = prompt.name.as_str();
        if seen.insert(upstream_name, ()).is_some() {
            return Err(format!(
                "server `{}` lists the prompt `{}` more than once",
                input.name,
                super::build::printable(upstream_name)
            ));
        }
        let exposed = names::expose(input.name, upstream_name, input.bare);
        if !names::is_valid_exposed(&exposed) {
            return Err(format!(
                "prompt `{}` of server `{}` would be exposed as `{}`, which does not match \
                 ^[a-zA-Z0-9_-]{{1,64}}$; the server's prompts are refused",
                super::build::printable(upstream_name),
                input.name,
                super::build::printable(&exposed)
            ));
        }
        let prompt = catalog_prompt(server_index, input.name, exposed, prompt);
        let chars = prompt.description.chars().count()
            + prompt
                .arguments
                .iter()
                .map(|a| a.description.chars().count())
                .sum::<usize>();
        if chars > limits.max_description_chars {
            return Err(format!(
                "prompt `{}` of server `{}` has {chars} characters of descriptions, over \
                 limits.max_description_chars ({}); the server's prompts are refused",
                prompt.upstream_name, input.name, limits.max_description_chars
            ));
        }
        prompts.push(prompt);
    }
    Ok(prompts)
}

fn catalog_prompt(
    server_index: usize,
    server: &str,
    exposed: String,
    prompt: &rmcp::model::Prompt,
) -> CatalogPrompt {
    let text = |t: &Option<String>| t.clone().unwrap_or_default();
    let mut prompt = CatalogPrompt {
        name: exposed,
        server: server.to_owned(),
        server_index,
        upstream_name: prompt.name.clone(),
        title: text(&prompt.title),
        description: text(&prompt.description),
        arguments: prompt
            .arguments
            .iter()
            .flatten()
            .map(|a| PromptArgument {
                name: a.name.clone(),
                title: text(&a.title),
                description: text(&a.description),
                required: a.required == Some(true),
            })
            .collect(),
        definition_hash: String::new(),
    };
    prompt.definition_hash = prompt_hash(&prompt);
    prompt
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{InputState, ServerState};
    use crate::config::ToolFilter;

    fn prompt(name: &str) -> rmcp::model::Prompt {
        rmcp::model::Prompt::new(
            name,
            Some(format!("renders {name}")),
            Some(vec![
                rmcp::model::PromptArgument::new("city").with_required(true),
            ]),
        )
    }

    fn tool(name: &str) -> rmcp::model::Tool {
        rmcp::model::Tool::new(
            name.to_owned(),
            "d",
            std::sync::Arc::new(serde_json::Map::new()),
        )
    }

    fn build(
        servers: &[(&str, bool, &[rmcp::model::Tool])],
        prompts: &[PromptInput<'_>],
    ) -> Catalog {
        let filter = ToolFilter::default();
        let overrides = HashMap::new();
        let inputs: Vec<_> = servers
            .iter()
            .map(|&(name, bare, tools)| ServerInput {
                name,
                transport: "stdio",
                bare,
                filter: &filter,
                overrides: &overrides,
                state: InputState::Listed(tools),
                approved: None,
            })
            .collect();
        let limits = crate::config::Limits::default();
        Catalog::build(&inputs, &limits).with_prompts(&inputs, prompts, &limits)
    }

    fn listed(result: &Result<Vec<rmcp::model::Prompt>, String>) -> PromptInput<'_> {
        PromptInput {
            listed: Some(result),
            approved: None,
        }
    }

    #[test]
    fn names_arguments_and_a_version_of_their_own() {
        let a = Ok(vec![prompt("review"), prompt("plan")]);
        let catalog = build(&[("repo", false, &[tool("x")])], &[listed(&a)]);
        let names: Vec<_> = catalog.prompts().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["repo__plan", "repo__review"]);
        let review = catalog.prompt("repo__review").unwrap();
        assert_eq!(
            (review.upstream_name.as_str(), review.server.as_str()),
            ("review", "repo")
        );
        assert_eq!(review.arguments[0].name, "city");
        assert!(review.arguments[0].required);
        assert_eq!(catalog.servers()[0].prompt_count, 2);
        // The tools' version does not move with prompts; the prompts' does.
        let b = Ok(vec![prompt("review")]);
        let other = build(&[("repo", false, &[tool("x")])], &[listed(&b)]);
        assert_eq!(catalog.version(), other.version());
        assert_ne!(catalog.prompts_version(), other.prompts_version());
        let again = build(&[("repo", false, &[tool("x")])], &[listed(&a)]);
        assert_eq!(catalog.prompts_version(), again.prompts_version());
    }

    #[test]
    fn the_hash_covers_every_field_and_differs_from_a_tools() {
        let base = prompt("p");
        let hash = |p: rmcp::model::Prompt| {
            let listing = Ok(vec![p]);
            build(&[("s", false, &[])], &[listed(&listing)]).prompts()[0]
                .definition_hash
                .clone()
        };
        let h = hash(base.clone());
        let mut changed = base.clone();
        changed.description = Some("other".to_owned());
        assert_ne!(h, hash(changed));
        let mut changed = base.clone();
        changed.title = Some("t".to_owned());
        assert_ne!(h, hash(changed));
        for change in [
            |a: &mut rmcp::model::PromptArgument| a.required = Some(false),
            |a: &mut rmcp::model::PromptArgument| a.description = Some("d".to_owned()),
            |a: &mut rmcp::model::PromptArgument| a.title = Some("t".to_owned()),
            |a: &mut rmcp::model::PromptArgument| a.name = "town".to_owned(),
        ] {
            let mut changed = base.clone();
            change(&mut changed.arguments.as_mut().unwrap()[0]);
            assert_ne!(h, hash(changed));
        }
        assert_eq!(h, hash(base));
    }

    #[test]
    fn a_name_two_servers_expose_refuses_both_servers_prompts_not_their_tools() {
        let a = Ok(vec![prompt("review")]);
        let b = Ok(vec![prompt("review"), prompt("other")]);
        let c = Ok(vec![prompt("review")]);
        // A tool may share a prompt's name.
        let tools = [tool("review")];
        let catalog = build(
            &[
                ("one", true, &tools),
                ("two", true, &[]),
                ("three", false, &[]),
            ],
            &[listed(&a), listed(&b), listed(&c)],
        );
        let names: Vec<_> = catalog.prompts().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["three__review"]);
        assert_eq!(catalog.tools()[0].name, "review");
        for status in &catalog.servers()[..2] {
            let reason = status.prompts_error.as_deref().expect("refused");
            assert!(
                reason.contains("`one`") && reason.contains("`two`") && reason.contains("`review`"),
                "{reason}"
            );
            assert_eq!(status.state, ServerState::Connected);
            assert_eq!(status.prompt_count, 0);
        }
        assert_eq!(catalog.servers()[2].prompts_error, None);
    }

    #[test]
    fn a_failed_listing_or_too_many_refuse_the_prompts_only() {
        let failed = Err("prompts/list failed: boom".to_owned());
        let tools = [tool("t")];
        let catalog = build(&[("s", false, &tools)], &[listed(&failed)]);
        assert_eq!(catalog.tools().len(), 1);
        assert!(catalog.prompts().is_empty());
        assert_eq!(
            catalog.servers()[0].prompts_error.as_deref(),
            Some("prompts/list failed: boom")
        );
        let filter = ToolFilter::default();
        let overrides = HashMap::new();
        let inputs = [ServerInput {
            name: "s",
            transport: "stdio",
            bare: false,
            filter: &filter,
            overrides: &overrides,
            state: InputState::Listed(&tools),
            approved: None,
        }];
        let limits = crate::config::Limits {
            max_prompts_per_server: 1,
            ..Default::default()
        };
        let two = Ok(vec![prompt("a"), prompt("b")]);
        let catalog =
            Catalog::build(&inputs, &limits).with_prompts(&inputs, &[listed(&two)], &limits);
        let reason = catalog.servers()[0].prompts_error.clone().unwrap();
        assert!(reason.contains("max_prompts_per_server (1)"), "{reason}");
        assert_eq!(catalog.tools().len(), 1);
    }

    #[test]
    fn unapproved_prompts_are_withheld() {
        use crate::approvals::{Approval, ServerApprovals};
        let listing = Ok(vec![prompt("kept"), prompt("changed"), prompt("new")]);
        let everything = build(&[("s", false, &[])], &[listed(&listing)]);
        let hash = |name: &str| everything.prompt(name).unwrap().definition_hash.clone();
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
        let input = PromptInput {
            listed: Some(&listing),
            approved: Some(&approved),
        };
        let catalog = build(&[("s", false, &[])], &[input]);
        let names: Vec<_> = catalog.prompts().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["s__kept"]);
        let withheld: Vec<_> = catalog.servers()[0]
            .withheld_prompts
            .iter()
            .map(|w| (w.prompt.name.as_str(), w.approved_hash.clone()))
            .collect();
        assert_eq!(
            withheld,
            [("s__changed", Some("0".repeat(32))), ("s__new", None)]
        );
        let (server, changed) = catalog.withheld_prompt("s__changed").unwrap();
        assert_eq!(server.name, "s");
        assert_eq!(changed.prompt.definition_hash, hash("s__changed"));
    }
}

#[cfg(test)]
mod properties {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::catalog::InputState;
    use crate::config::ToolFilter;

    use crate::catalog::build::properties::servers;

    proptest! {
        #[test]
        fn exposed_prompts_route_back_and_no_name_is_claimed_twice(servers in servers()) {
            let filter = ToolFilter::default();
            let overrides = HashMap::new();
            let listings: Vec<Result<Vec<rmcp::model::Prompt>, String>> = servers
                .iter()
                .map(|(_, _, names)| {
                    Ok(names.iter().map(|n| rmcp::model::Prompt::new(n, None::<String>, None)).collect())
                })
                .collect();
            let inputs: Vec<ServerInput<'_>> = servers
                .iter()
                .map(|(name, bare, _)| ServerInput {
                    name,
                    transport: "http",
                    bare: *bare,
                    filter: &filter,
                    overrides: &overrides,
                    state: InputState::Listed(&[]),
                    approved: None,
                })
                .collect();
            let prompts: Vec<PromptInput<'_>> = listings
                .iter()
                .map(|listed| PromptInput { listed: Some(listed), approved: None })
                .collect();
            let limits = crate::config::Limits::default();
            let catalog = Catalog::build(&inputs, &limits).with_prompts(&inputs, &prompts, &limits);

            let mut names = HashSet::new();
            for prompt in catalog.prompts() {
                prop_assert!(names.insert(prompt.name.clone()), "duplicate {}", prompt.name);
                let (server, bare, _) = &servers[prompt.server_index];
                prop_assert_eq!(&prompt.server, server);
                prop_assert_eq!(&prompt.name, &names::expose(server, &prompt.upstream_name, *bare));
                prop_assert!(names::is_valid_exposed(&prompt.name));
                let routed = catalog.prompt(&prompt.name).unwrap();
                prop_assert_eq!(&routed.upstream_name, &prompt.upstream_name);
            }
            // A name claimed by two servers whose prompts are served is
            // exposed by neither.
            let mut claims: HashMap<String, usize> = HashMap::new();
            for (i, (server, bare, prompt_names)) in servers.iter().enumerate() {
                if catalog.servers()[i].prompts_error.is_some() {
                    continue;
                }
                for p in prompt_names {
                    *claims.entry(names::expose(server, p, *bare)).or_default() += 1;
                }
            }
            for (exposed, count) in claims {
                prop_assert!(count == 1, "{exposed} claimed {count} times");
            }
            // Tools are untouched by prompts.
            prop_assert!(catalog.tools().is_empty());
        }
    }
}
