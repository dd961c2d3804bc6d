//! The transport's listings: the tenant's federated catalog as the caller
//! sees it under policy (tools and prompts by exposed `server__name`,
//! resources and templates with their server in `toolgate/server`), all
//! in one response (the transport has no pagination). And the routing of
//! a resource URI, which on this transport comes without its server.

use std::sync::Arc;

use rmcp::model::JsonObject;

use super::content::{self, SERVER_KEY};
use super::{rounds, structs};
use crate::callers::{Caller, Subject};
use crate::calls::CallError;
use crate::catalog::{Catalog, CatalogPrompt, CatalogTool};
use crate::pb;
use crate::pb::mcp;
use crate::policy::{ResourceUri, View};
use crate::registry::Tenant;

/// A listing's response: who may cache it (what a caller sees depends on
/// who the caller is: never `public`).
fn private() -> i32 {
    mcp::CacheScope::Private.into()
}

/// A catalog snapshot's tools as the transport's messages, converted once
/// per snapshot (schemas parsed into Structs), in catalog order.
struct McpTools(Vec<mcp::Tool>);

/// The tools `view` lets the caller see (`None`: all).
pub(super) fn tools(catalog: &Catalog, view: Option<&View>) -> mcp::ListToolsResponse {
    let all = catalog.derived(|catalog| McpTools(catalog.tools().iter().map(tool).collect()));
    mcp::ListToolsResponse {
        common: Some(rounds::complete()),
        tools: all
            .0
            .iter()
            .enumerate()
            .filter(|(index, _)| view.is_none_or(|v| v.allows_index(*index)))
            .map(|(_, tool)| tool.clone())
            .collect(),
        ttl: None,
        cache_scope: private(),
    }
}

/// A JSON Schema held as text, as a Struct (none when empty or not an
/// object: the catalog only keeps object schemas).
fn schema(json: &str) -> Option<prost_types::Struct> {
    match serde_json::from_str(json) {
        Ok(serde_json::Value::Object(object)) => Some(structs::to_struct(object)),
        _ => None,
    }
}

fn tool(tool: &CatalogTool) -> mcp::Tool {
    let hints = &tool.annotations;
    let mut server = JsonObject::new();
    server.insert(SERVER_KEY.to_owned(), tool.server.clone().into());
    mcp::Tool {
        name: tool.name.clone(),
        title: tool.title.clone(),
        description: tool.description.clone(),
        input_schema: schema(&tool.input_schema_json),
        output_schema: schema(&tool.output_schema_json),
        annotations: Some(mcp::ToolAnnotations {
            title: tool.title.clone(),
            read_only_hint: hints.read_only.unwrap_or(false),
            // The specification's defaults where the server said nothing.
            destructive_hint: hints.destructive.unwrap_or(true),
            idempotent_hint: hints.idempotent.unwrap_or(false),
            open_world_hint: hints.open_world.unwrap_or(true),
        }),
        icons: Vec::new(),
        metadata: Some(structs::to_struct(server)),
    }
}

/// The prompts `allowed`.
pub(super) fn prompts(
    catalog: &Catalog,
    allowed: impl Fn(&CatalogPrompt) -> bool,
) -> mcp::ListPromptsResponse {
    mcp::ListPromptsResponse {
        common: Some(rounds::complete()),
        prompts: catalog
            .prompts()
            .iter()
            .filter(|p| allowed(p))
            .map(|prompt| mcp::Prompt {
                name: prompt.name.clone(),
                title: prompt.title.clone(),
                description: prompt.description.clone(),
                arguments: prompt
                    .arguments
                    .iter()
                    .map(|a| mcp::prompt::Argument {
                        name: a.name.clone(),
                        title: a.title.clone(),
                        description: a.description.clone(),
                        required: a.required,
                    })
                    .collect(),
                icons: Vec::new(),
                metadata: content::metadata(None, Some(&prompt.server)),
            })
            .collect(),
        ttl: None,
        cache_scope: private(),
    }
}

/// The resources of a listing.
pub(super) fn resources(listing: pb::ListResourcesResponse) -> mcp::ListResourcesResponse {
    mcp::ListResourcesResponse {
        common: Some(rounds::complete()),
        resources: listing
            .resources
            .into_iter()
            .map(|r| mcp::Resource {
                metadata: content::metadata(None, Some(&r.server)),
                uri: r.uri,
                name: r.name,
                title: r.title,
                description: r.description,
                mime_type: r.mime_type,
                annotations: None,
                size: r.size.unwrap_or_default(),
                icons: Vec::new(),
            })
            .collect(),
        ttl: None,
        cache_scope: private(),
    }
}

/// The templates of a listing.
pub(super) fn templates(listing: pb::ListResourcesResponse) -> mcp::ListResourceTemplatesResponse {
    mcp::ListResourceTemplatesResponse {
        common: Some(rounds::complete()),
        resource_templates: listing
            .resource_templates
            .into_iter()
            .map(|t| mcp::ResourceTemplate {
                metadata: content::metadata(None, Some(&t.server)),
                uri_template: t.uri_template,
                name: t.name,
                title: t.title,
                description: t.description,
                mime_type: t.mime_type,
                annotations: None,
                icons: Vec::new(),
            })
            .collect(),
        ttl: None,
        cache_scope: private(),
    }
}

/// The server a request names in `common.metadata["toolgate/server"]`.
///
/// # Errors
/// `MCP_REQUEST_INVALID`: the key holds something other than a string.
pub(super) fn named_server(
    common: Option<&mcp::RequestFields>,
) -> Result<Option<String>, CallError> {
    let Some(value) = common
        .and_then(|c| c.metadata.as_ref())
        .and_then(|m| m.fields.get(SERVER_KEY))
    else {
        return Ok(None);
    };
    match &value.kind {
        Some(prost_types::value::Kind::StringValue(server)) => Ok(Some(server.clone())),
        _ => Err(CallError::McpRequestInvalid(format!(
            "`common.metadata[\"{SERVER_KEY}\"]` is not a string: it names the server of a resource"
        ))),
    }
}

/// What a resource URI (or a template) is looked up as.
pub(super) enum Lookup<'a> {
    /// A resource: listed as such, or matching a listed template.
    Resource(&'a str),
    /// A resource template, listed as such.
    Template(&'a str),
}

/// Why no one server could be found: the words of the refusal the call
/// is recorded with (`MCP_REQUEST_INVALID`).
pub(super) struct Unrouted(pub(super) String);

/// The one server whose listing (as `caller` sees it) offers what
/// `lookup` names.
///
/// # Errors
/// No server or several offer it (naming them), so the caller names one
/// in `common.metadata["toolgate/server"]`; or the listings could not be
/// read.
pub(super) async fn route(
    tenant: &Arc<Tenant>,
    caller: &Caller,
    subject: &Subject,
    lookup: Lookup<'_>,
) -> Result<String, Unrouted> {
    let listing = crate::grpc::resources::everything(tenant, caller, subject)
        .await
        .map_err(|e| Unrouted(format!("the resource listings could not be read: {e}")))?;
    let normal = |uri: &str| {
        ResourceUri::parse(uri).map_or_else(|_| uri.to_owned(), ResourceUri::into_string)
    };
    let mut servers: Vec<&str> = Vec::new();
    let (asked, what) = match lookup {
        Lookup::Resource(uri) => {
            let asked = normal(uri);
            servers.extend(
                listing
                    .resources
                    .iter()
                    .filter(|r| normal(&r.uri) == asked)
                    .map(|r| r.server.as_str()),
            );
            if servers.is_empty() {
                servers.extend(
                    listing
                        .resource_templates
                        .iter()
                        .filter(|t| template_matches(&t.uri_template, &asked))
                        .map(|t| t.server.as_str()),
                );
            }
            (asked, "resource")
        }
        Lookup::Template(template) => {
            servers.extend(
                listing
                    .resource_templates
                    .iter()
                    .filter(|t| t.uri_template == template)
                    .map(|t| t.server.as_str()),
            );
            (template.to_owned(), "resource template")
        }
    };
    servers.dedup();
    let asked = crate::callers::quoted(&asked);
    match servers.as_slice() {
        [server] => Ok((*server).to_owned()),
        [] => Err(Unrouted(format!(
            "no server of this tenant lists the {what} `{asked}` (or a template it matches): \
             name its server in `common.metadata[\"{SERVER_KEY}\"]`"
        ))),
        several => Err(Unrouted(format!(
            "the {what} `{asked}` is offered by servers {}: name one in \
             `common.metadata[\"{SERVER_KEY}\"]`",
            several
                .iter()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Whether `uri` may be an expansion of the RFC 6570 `template`: its
/// literal parts in order, each expression standing for any text.
fn template_matches(template: &str, uri: &str) -> bool {
    let mut glob = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        glob.push_str(&globset::escape(&rest[..open]));
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        glob.push('*');
        rest = &rest[open + close + 1..];
    }
    glob.push_str(&globset::escape(rest));
    globset::GlobBuilder::new(&glob)
        .literal_separator(false)
        .build()
        .is_ok_and(|g| g.compile_matcher().is_match(uri))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_match_the_templates_they_may_expand() {
        assert!(template_matches(
            "test://static/resource/{id}",
            "test://static/resource/7"
        ));
        assert!(template_matches("file:///{+path}", "file:///a/b[1].txt"));
        assert!(!template_matches(
            "test://static/resource/{id}",
            "test://other/7"
        ));
        assert!(!template_matches("a://{x", "a://y"));
    }
}
