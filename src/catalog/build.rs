//! Building a catalog snapshot from what each server listed: filtering,
//! namespacing, name and shape checks, collision refusal, withholding
//! unapproved definitions.

use std::collections::HashMap;
use std::sync::Arc;

use super::hash::{catalog_version, definition_hash};
use super::{
    Annotations, Catalog, CatalogTool, InputState, ServerInput, ServerPart, ServerState,
    ServerStatus, WithheldTool,
};
use crate::config::names;

impl Catalog {
    /// Builds a snapshot from the servers' states, in configuration order.
    pub fn build(inputs: &[ServerInput<'_>], limits: &crate::config::Limits) -> Catalog {
        Self::build_with(inputs, |server_index, input, listed| {
            Self::server_part(server_index, input, listed, limits)
        })
    }

    /// The part of the catalog that `listed`, a listing of server
    /// `server_index` (described by `input`), gives.
    pub fn server_part(
        server_index: usize,
        input: &ServerInput<'_>,
        listed: &[rmcp::model::Tool],
        limits: &crate::config::Limits,
    ) -> ServerPart {
        Arc::new(server_tools(server_index, input, listed, limits))
    }

    /// [`Catalog::build`] with each listing's part given by `part`, called
    /// with the server's index, its input and the listing (its current one,
    /// or the last one of a server that is down). `part` must return what
    /// [`Catalog::server_part`] returns for the same arguments (a part kept
    /// from an earlier build of the same listing, index and limits).
    pub fn build_with(
        inputs: &[ServerInput<'_>],
        mut part: impl FnMut(usize, &ServerInput<'_>, &[rmcp::model::Tool]) -> ServerPart,
    ) -> Catalog {
        // First pass: each connected server's candidate tools, or why the
        // server is refused on its own account.
        let mut candidates: Vec<Option<ServerPart>> = Vec::with_capacity(inputs.len());
        let mut down_routes = HashMap::new();
        for (server_index, input) in inputs.iter().enumerate() {
            if let InputState::Failed {
                last_tools: Some(tools),
                ..
            } = &input.state
                && let Ok(tools) = part(server_index, input, tools).as_ref()
            {
                for tool in tools {
                    down_routes.insert(tool.name.clone(), server_index);
                }
            }
            candidates.push(match &input.state {
                InputState::Listed(tools) => Some(part(server_index, input, tools)),
                _ => None,
            });
        }

        // Second pass: an exposed name claimed by two servers refuses both.
        let mut claims: HashMap<&str, usize> = HashMap::new();
        let mut collisions: Vec<(usize, usize, String)> = Vec::new();
        for (server_index, tools) in candidates.iter().enumerate() {
            let Some(Ok(tools)) = tools.as_deref() else {
                continue;
            };
            for tool in tools {
                if let Some(&other) = claims.get(tool.name.as_str()) {
                    collisions.push((other, server_index, tool.name.clone()));
                } else {
                    claims.insert(&tool.name, server_index);
                }
            }
        }
        let mut refusals: HashMap<usize, String> = HashMap::new();
        for (first, second, exposed) in collisions {
            let (a, b) = (inputs[first].name, inputs[second].name);
            let reason = format!(
                "servers `{a}` and `{b}` both expose the tool name `{exposed}`; \
                 neither is used (rename a server, drop `bare`, or filter one tool out)"
            );
            refusals.entry(first).or_insert_with(|| reason.clone());
            refusals.entry(second).or_insert(reason);
        }

        let mut tools = Vec::new();
        let mut servers = Vec::with_capacity(inputs.len());
        for (server_index, (input, candidate)) in inputs.iter().zip(candidates).enumerate() {
            let (state, mut server_tools) = match (&input.state, candidate) {
                (InputState::Connecting, _) => (ServerState::Connecting, Vec::new()),
                (InputState::Idle, _) => (ServerState::Idle, Vec::new()),
                (InputState::Failed { reason, .. }, _) => {
                    (ServerState::Failed((*reason).to_owned()), Vec::new())
                }
                (InputState::AuthorizationRequired(reason), _) => (
                    ServerState::AuthorizationRequired((*reason).to_owned()),
                    Vec::new(),
                ),
                (InputState::Listed(_), candidate) => match candidate.as_deref() {
                    Some(Err(reason)) => (ServerState::Refused(reason.clone()), Vec::new()),
                    Some(Ok(list)) => match refusals.remove(&server_index) {
                        Some(reason) => (ServerState::Refused(reason), Vec::new()),
                        // The part is shared with later builds: copied,
                        // not rebuilt.
                        None => (ServerState::Connected, list.clone()),
                    },
                    None => (ServerState::Connected, Vec::new()),
                },
            };
            let withheld = withhold(&mut server_tools, input.approved);
            servers.push(ServerStatus {
                name: input.name.to_owned(),
                transport: input.transport,
                state,
                tool_count: u32::try_from(server_tools.len()).unwrap_or(u32::MAX),
                withheld,
                prompt_count: 0,
                withheld_prompts: Vec::new(),
                prompts_error: None,
                skill_count: 0,
                withheld_skills: Vec::new(),
                skills_error: None,
            });
            tools.append(&mut server_tools);
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let index: HashMap<String, usize> = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let version = catalog_version(&tools);
        // A name that is live now is not "down".
        down_routes.retain(|name, _| !index.contains_key(name));
        Catalog {
            search_index: std::sync::OnceLock::new(),
            derived: std::sync::RwLock::default(),
            tools,
            index,
            servers,
            down_routes,
            namespaced: inputs.iter().map(|input| !input.bare).collect(),
            version,
            prompts: Vec::new(),
            prompt_index: HashMap::new(),
            prompts_version: String::new(),
            skills: Vec::new(),
            skill_index: HashMap::new(),
            skills_version: String::new(),
            stamp: 0,
        }
    }
}

/// Takes the tools whose definitions `approved` does not record out of
/// `tools` (none when `approved` is `None`: `definitions: any`), sorted by
/// name. A withheld tool still claims its name: two servers exposing one
/// name are refused whether or not either is approved.
fn withhold(
    tools: &mut Vec<CatalogTool>,
    approved: Option<&crate::approvals::ServerApprovals>,
) -> Vec<WithheldTool> {
    withhold_definitions(
        tools,
        approved,
        |tool| (&tool.name, &tool.definition_hash),
        |tool, approved_hash| WithheldTool {
            tool,
            approved_hash,
        },
    )
}

/// Which servers lose every offering of `kind` (`"prompt"`, `"skill"`)
/// because another server exposes one of the same name: `names` yields
/// each server's exposed names by server index; the answer maps a
/// refused server's index to the reason, naming both servers.
pub(super) fn clashing_names<'a>(
    names: impl Iterator<Item = (usize, &'a str)>,
    server: impl Fn(usize) -> &'a str,
    kind: &str,
) -> HashMap<usize, String> {
    let mut claims: HashMap<&str, usize> = HashMap::new();
    let mut refusals: HashMap<usize, String> = HashMap::new();
    for (index, name) in names {
        match claims.get(name) {
            Some(&other) if other != index => {
                let reason = format!(
                    "servers `{}` and `{}` both expose the {kind} name `{name}`; neither \
                     server's {kind}s are used (rename a server or drop `bare`)",
                    server(other),
                    server(index),
                );
                refusals.entry(other).or_insert_with(|| reason.clone());
                refusals.entry(index).or_insert(reason);
            }
            _ => {
                claims.insert(name, index);
            }
        }
    }
    refusals
}

/// Takes the definitions (tools, prompts) whose exposed name and hash
/// (`name_and_hash`) `approved` does not record out of `items`, each made
/// a withheld entry by `withheld` with the approved hash when there is one;
/// sorted by name. None when `approved` is `None` (`definitions: any`).
pub(super) fn withhold_definitions<T: Clone, W>(
    items: &mut Vec<T>,
    approved: Option<&crate::approvals::ServerApprovals>,
    name_and_hash: impl Fn(&T) -> (&str, &str),
    withheld: impl Fn(T, Option<String>) -> W,
) -> Vec<W> {
    let Some(approved) = approved else {
        return Vec::new();
    };
    let mut taken: Vec<(T, Option<String>)> = Vec::new();
    items.retain(|item| {
        let (name, hash) = name_and_hash(item);
        let approval = approved.get(name);
        if approval.is_some_and(|a| a.hash == hash) {
            return true;
        }
        taken.push((item.clone(), approval.map(|a| a.hash.clone())));
        false
    });
    taken.sort_by(|a, b| name_and_hash(&a.0).0.cmp(name_and_hash(&b.0).0));
    taken
        .into_iter()
        .map(|(item, approved_hash)| withheld(item, approved_hash))
        .collect()
}

/// The exposed tools of one connected server, or why it is refused.
fn server_tools(
    server_index: usize,
    input: &ServerInput<'_>,
    listed: &[rmcp::model::Tool],
    limits: &crate::config::Limits,
) -> Result<Vec<CatalogTool>, String> {
    if listed.len() > limits.max_tools_per_server {
        return Err(format!(
            "server `{}` lists {} tools, over limits.max_tools_per_server ({})",
            input.name,
            listed.len(),
            limits.max_tools_per_server
        ));
    }
    let mut seen = HashMap::new();
    let mut tools = Vec::new();
    for tool in listed {
        let upstream_name = tool.name.as_ref();
        if !input.filter.allows(upstream_name) {
            continue;
        }
        if seen.insert(upstream_name, ()).is_some() {
            return Err(format!(
                "server `{}` lists the tool `{}` more than once",
                input.name,
                printable(upstream_name)
            ));
        }
        let exposed = names::expose(input.name, upstream_name, input.bare);
        if !names::is_valid_exposed(&exposed) {
            return Err(format!(
                "tool `{}` of server `{}` would be exposed as `{}`, which does not match \
                 ^[a-zA-Z0-9_-]{{1,64}}$; the server is refused (filter the tool out with \
                 `tools.deny` to use the rest)",
                printable(upstream_name),
                input.name,
                printable(&exposed)
            ));
        }
        let tool = catalog_tool(
            server_index,
            input.name,
            exposed,
            tool,
            input.overrides.get(upstream_name),
        );
        check_shape(&tool, input.name, limits)?;
        tools.push(tool);
    }
    Ok(tools)
}

/// Refuses a definition that would make the gateway hold or pass on more
/// than the limits allow.
fn check_shape(
    tool: &CatalogTool,
    server: &str,
    limits: &crate::config::Limits,
) -> Result<(), String> {
    let refuse = |what: String| {
        Err(format!(
            "tool `{}` of server `{server}` {what}; the server is refused (filter the tool out \
             with `tools.deny` to use the rest)",
            tool.upstream_name
        ))
    };
    let chars = tool.description.chars().count();
    if chars > limits.max_description_chars {
        return refuse(format!(
            "has a {chars}-character description, over limits.max_description_chars ({})",
            limits.max_description_chars
        ));
    }
    for (which, schema) in [
        ("input", &tool.input_schema_json),
        ("output", &tool.output_schema_json),
    ] {
        if schema.len() > limits.max_schema_bytes {
            return refuse(format!(
                "has a {}-byte {which} schema, over limits.max_schema_bytes ({})",
                schema.len(),
                limits.max_schema_bytes
            ));
        }
        if !schema.is_empty() {
            let depth = serde_json::from_str::<serde_json::Value>(schema)
                .map(|v| json_depth(&v))
                .unwrap_or(0);
            if depth > limits.max_schema_depth {
                return refuse(format!(
                    "has an {which} schema nested {depth} deep, over limits.max_schema_depth ({})",
                    limits.max_schema_depth
                ));
            }
        }
    }
    Ok(())
}

/// Nesting depth of a JSON value (a scalar is 0).
fn json_depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Array(items) => 1 + items.iter().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Object(map) => 1 + map.values().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// A name made safe to show: control characters escaped, long names cut.
pub(super) fn printable(name: &str) -> String {
    let mut shown: String = name.chars().take(80).flat_map(char::escape_debug).collect();
    if name.chars().count() > 80 {
        shown.push('…');
    }
    shown
}

fn catalog_tool(
    server_index: usize,
    server: &str,
    exposed: String,
    tool: &rmcp::model::Tool,
    overrides: Option<&crate::config::ToolOverride>,
) -> CatalogTool {
    let annotations = tool.annotations.as_ref();
    let title = tool
        .title
        .clone()
        .or_else(|| annotations.and_then(|a| a.title.clone()))
        .unwrap_or_default();
    let input_schema_json = if overrides.is_some_and(|o| o.hide_defaults) {
        let mut schema = serde_json::Value::Object(tool.input_schema.as_ref().clone());
        strip_defaults(&mut schema);
        schema.to_string()
    } else {
        serde_json::to_string(tool.input_schema.as_ref()).unwrap_or_default()
    };
    let output_schema_json = tool
        .output_schema
        .as_ref()
        .map(|s| serde_json::to_string(s.as_ref()).unwrap_or_default())
        .unwrap_or_default();
    let annotations = Annotations {
        read_only: annotations.and_then(|a| a.read_only_hint),
        destructive: annotations.and_then(|a| a.destructive_hint),
        idempotent: annotations.and_then(|a| a.idempotent_hint),
        open_world: annotations.and_then(|a| a.open_world_hint),
    };
    let mut tool = CatalogTool {
        name: exposed,
        server: server.to_owned(),
        server_index,
        upstream_name: tool.name.to_string(),
        description: overrides
            .and_then(|o| o.description.clone())
            .unwrap_or_else(|| tool.description.as_deref().unwrap_or_default().to_owned()),
        title: overrides.and_then(|o| o.title.clone()).unwrap_or(title),
        input_schema_json,
        output_schema_json,
        annotations,
        definition_hash: String::new(),
    };
    tool.definition_hash = definition_hash(&tool);
    tool
}

/// Removes `default` from every property schema (nested ones too).
fn strip_defaults(schema: &mut serde_json::Value) {
    if let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for property in properties.values_mut() {
            if let Some(object) = property.as_object_mut() {
                object.remove("default");
            }
            strip_defaults(property);
        }
    }
    if let Some(items) = schema.get_mut("items") {
        strip_defaults(items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ToolFilter;

    fn tool(name: &str) -> rmcp::model::Tool {
        rmcp::model::Tool::new(
            name.to_owned(),
            format!("does {name}"),
            Arc::new(serde_json::Map::new()),
        )
    }

    fn input<'a>(
        name: &'a str,
        bare: bool,
        filter: &'a ToolFilter,
        tools: &'a [rmcp::model::Tool],
    ) -> ServerInput<'a> {
        ServerInput {
            name,
            transport: "stdio",
            bare,
            filter,
            overrides: no_overrides(),
            state: InputState::Listed(tools),
            approved: None,
        }
    }

    fn no_overrides() -> &'static std::collections::HashMap<String, crate::config::ToolOverride> {
        static EMPTY: std::sync::OnceLock<
            std::collections::HashMap<String, crate::config::ToolOverride>,
        > = std::sync::OnceLock::new();
        EMPTY.get_or_init(Default::default)
    }

    #[test]
    fn namespaces_and_routes() {
        let filter = ToolFilter::default();
        let a = [tool("search"), tool("fetch")];
        let catalog = Catalog::build(&[input("repo", false, &filter, &a)], &Default::default());
        let names: Vec<_> = catalog.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["repo__fetch", "repo__search"]);
        let routed = catalog.get("repo__search").unwrap();
        assert_eq!(
            (routed.server.as_str(), routed.upstream_name.as_str()),
            ("repo", "search")
        );
    }

    #[test]
    fn collisions_refuse_both_servers() {
        let filter = ToolFilter::default();
        let a = [tool("search")];
        let b = [tool("search")];
        let c = [tool("other")];
        let catalog = Catalog::build(
            &[
                input("one", true, &filter, &a),
                input("two", true, &filter, &b),
                input("three", false, &filter, &c),
            ],
            &Default::default(),
        );
        assert_eq!(catalog.tools().len(), 1);
        for status in &catalog.servers()[..2] {
            let ServerState::Refused(reason) = &status.state else {
                panic!("expected refusal: {status:?}");
            };
            assert!(
                reason.contains("`one`") && reason.contains("`two`"),
                "{reason}"
            );
        }
        assert_eq!(catalog.servers()[2].state, ServerState::Connected);
    }

    #[test]
    fn invalid_names_refuse_the_server_naming_both() {
        let filter = ToolFilter::default();
        let a = [tool("ok"), tool("has space")];
        let catalog = Catalog::build(&[input("srv", false, &filter, &a)], &Default::default());
        assert!(catalog.tools().is_empty());
        let ServerState::Refused(reason) = &catalog.servers()[0].state else {
            panic!("expected refusal");
        };
        assert!(
            reason.contains("`has space`") && reason.contains("`srv`"),
            "{reason}"
        );
    }

    #[test]
    fn version_changes_exactly_with_content() {
        let filter = ToolFilter::default();
        let a = [tool("x")];
        let v1 = Catalog::build(&[input("s", false, &filter, &a)], &Default::default())
            .version()
            .to_owned();
        let v1_again = Catalog::build(&[input("s", false, &filter, &a)], &Default::default())
            .version()
            .to_owned();
        let b = [tool("y")];
        let v2 = Catalog::build(&[input("s", false, &filter, &b)], &Default::default())
            .version()
            .to_owned();
        assert_eq!(v1, v1_again);
        assert_ne!(v1, v2);
    }

    #[test]
    fn unapproved_definitions_are_withheld_and_recorded() {
        use crate::approvals::{Approval, ServerApprovals};
        let filter = ToolFilter::default();
        let listed = [tool("kept"), tool("changed"), tool("new")];
        let everything =
            Catalog::build(&[input("s", false, &filter, &listed)], &Default::default());
        let hash = |name: &str| everything.get(name).unwrap().definition_hash.clone();
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
        let mut server = input("s", false, &filter, &listed);
        server.approved = Some(&approved);
        let catalog = Catalog::build(&[server], &Default::default());
        let names: Vec<_> = catalog.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["s__kept"]);
        let status = &catalog.servers()[0];
        assert_eq!(
            (status.state.clone(), status.tool_count),
            (ServerState::Connected, 1)
        );
        let withheld: Vec<_> = status
            .withheld
            .iter()
            .map(|w| (w.tool.name.as_str(), w.approved_hash.clone()))
            .collect();
        assert_eq!(
            withheld,
            [("s__changed", Some("0".repeat(32))), ("s__new", None)]
        );
        let (server, changed) = catalog.withheld("s__changed").unwrap();
        assert_eq!(server.name, "s");
        assert_eq!(changed.tool.definition_hash, hash("s__changed"));
        assert!(catalog.withheld("s__kept").is_none());
        // Withheld tools are not part of the served catalog's version.
        let only_kept = [tool("kept")];
        let kept = Catalog::build(
            &[input("s", false, &filter, &only_kept)],
            &Default::default(),
        );
        assert_eq!(catalog.version(), kept.version());

        // Nothing approved (no file yet): everything is withheld.
        let none = ServerApprovals::new();
        let mut server = input("s", false, &filter, &listed);
        server.approved = Some(&none);
        let catalog = Catalog::build(&[server], &Default::default());
        assert!(catalog.tools().is_empty());
        assert_eq!(catalog.servers()[0].withheld.len(), 3);
    }

    #[test]
    fn a_withheld_tool_still_claims_its_name() {
        use crate::approvals::ServerApprovals;
        let filter = ToolFilter::default();
        let a = [tool("x")];
        let b = [tool("x")];
        let none = ServerApprovals::new();
        let mut first = input("one", true, &filter, &a);
        first.approved = Some(&none);
        let catalog = Catalog::build(
            &[first, input("two", true, &filter, &b)],
            &Default::default(),
        );
        assert!(catalog.tools().is_empty());
        assert!(
            catalog
                .servers()
                .iter()
                .all(|s| matches!(s.state, ServerState::Refused(_)))
        );
    }
}

#[cfg(test)]
pub(super) mod properties {
    use std::collections::{HashMap, HashSet};
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::config::ToolFilter;

    fn tools(names: &[String]) -> Vec<rmcp::model::Tool> {
        names
            .iter()
            .map(|n| rmcp::model::Tool::new(n.clone(), "d", Arc::new(serde_json::Map::new())))
            .collect()
    }

    /// Servers: (name, bare, tool or prompt names). Names are drawn from
    /// small alphabets so that collisions (including `a__b` shapes) happen
    /// often.
    pub(in crate::catalog) fn servers() -> impl Strategy<Value = Vec<(String, bool, Vec<String>)>> {
        let server = (
            "[ab][ab-]{0,2}",
            any::<bool>(),
            prop::collection::vec("[ab_]{1,6}|[ !.]{1,2}", 0..6),
        );
        prop::collection::vec(server, 1..5).prop_map(|mut servers| {
            // Configuration guarantees distinct server names without `__`.
            let mut seen = HashSet::new();
            servers.retain(|(name, _, _)| !name.contains("__") && seen.insert(name.clone()));
            for (_, _, names) in &mut servers {
                let mut unique = HashSet::new();
                names.retain(|n| unique.insert(n.clone()));
            }
            servers
        })
    }

    proptest! {
        #[test]
        fn exposing_then_routing_is_the_identity(servers in servers()) {
            let filter = ToolFilter::default();
            let overrides = HashMap::new();
            let listed: Vec<Vec<rmcp::model::Tool>> = servers.iter().map(|(_, _, n)| tools(n)).collect();
            let inputs: Vec<ServerInput<'_>> = servers
                .iter()
                .zip(&listed)
                .map(|((name, bare, _), tools)| ServerInput {
                    name,
                    transport: "http",
                    bare: *bare,
                    filter: &filter,
                    overrides: &overrides,
                    state: InputState::Listed(tools),
                    approved: None,
                })
                .collect();
            let catalog = Catalog::build(&inputs, &crate::config::Limits::default());

            // No two tools map to one name.
            let mut names = HashSet::new();
            for tool in catalog.tools() {
                prop_assert!(names.insert(tool.name.clone()), "duplicate {}", tool.name);
            }
            // Every exposed tool routes back to exactly its server and tool,
            // and its name is what exposing gives and is valid.
            for tool in catalog.tools() {
                let (server, bare, _) = &servers[tool.server_index];
                prop_assert_eq!(&tool.server, server);
                prop_assert_eq!(&tool.name, &names::expose(server, &tool.upstream_name, *bare));
                prop_assert!(names::is_valid_exposed(&tool.name));
                let routed = catalog.get(&tool.name).unwrap();
                prop_assert_eq!((&routed.server, &routed.upstream_name), (&tool.server, &tool.upstream_name));
            }
            // A name claimed by two connected servers is exposed by neither.
            let mut claims: HashMap<String, usize> = HashMap::new();
            for (i, (server, bare, tool_names)) in servers.iter().enumerate() {
                if catalog.servers()[i].state != ServerState::Connected {
                    continue;
                }
                for t in tool_names {
                    *claims.entry(names::expose(server, t, *bare)).or_default() += 1;
                }
            }
            for (exposed, count) in claims {
                prop_assert!(count == 1, "{exposed} claimed {count} times by connected servers");
            }
        }
    }
}
