//! MCP ↔ proto conversion: catalog tools to `Tool` messages, and a
//! `CallToolResult` to an `InvokeToolResponse` with typed content and a text
//! rendering for models that never silently drops a block.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};

use crate::catalog::{Catalog, CatalogTool, ServerState};
use crate::pb;
use crate::policy::ResourceUri;

/// The state of each configured server.
pub fn server_statuses(catalog: &Catalog) -> Vec<pb::ServerStatus> {
    catalog
        .servers()
        .iter()
        .map(|s| {
            let (state, error) = match &s.state {
                ServerState::Connecting => (pb::ServerState::Connecting, "connecting".to_owned()),
                ServerState::Idle => (pb::ServerState::Idle, String::new()),
                ServerState::Connected => (pb::ServerState::Connected, String::new()),
                ServerState::Failed(reason) => (pb::ServerState::Failed, reason.clone()),
                ServerState::Refused(reason) => (pb::ServerState::Refused, reason.clone()),
                ServerState::AuthorizationRequired(reason) => {
                    (pb::ServerState::AuthorizationRequired, reason.clone())
                }
            };
            pb::ServerStatus {
                name: s.name.clone(),
                connected: state == pb::ServerState::Connected,
                error,
                tool_count: s.tool_count,
                transport: s.transport.to_owned(),
                state: state.into(),
                authorization_url: String::new(),
                withheld_tools: s.withheld.iter().map(|w| w.tool.name.clone()).collect(),
                ..Default::default()
            }
        })
        .collect()
}

/// One catalog tool as a `Tool` message.
pub fn tool(tool: &CatalogTool) -> pb::Tool {
    let a = &tool.annotations;
    pb::Tool {
        name: tool.name.clone(),
        server: tool.server.clone(),
        description: tool.description.clone(),
        title: tool.title.clone(),
        input_schema_json: tool.input_schema_json.clone(),
        output_schema_json: tool.output_schema_json.clone(),
        annotations: Some(pb::ToolAnnotations {
            read_only_hint: a.read_only,
            destructive_hint: a.destructive,
            idempotent_hint: a.idempotent,
            open_world_hint: a.open_world,
        }),
        upstream_name: tool.upstream_name.clone(),
        definition_hash: tool.definition_hash.clone(),
        schema_bytes: u32::try_from(tool.input_schema_json.len() + tool.output_schema_json.len())
            .unwrap_or(u32::MAX),
        estimated_tokens: tool.estimated_tokens(),
    }
}

/// A content block the server sent that cannot be carried.
#[derive(Debug, thiserror::Error)]
#[error("the server sent {what} that is not valid base64")]
pub struct InvalidContent {
    what: &'static str,
}

/// Converts a tool result of `server`. Binary data arrives base64-encoded
/// and is carried as raw bytes; resource links and embedded resources
/// carry `server`, so that a worker reads them with `ReadResource`; a
/// link's URI is in its normal form ([`ResourceUri`]).
///
/// # Errors
/// An image, audio or blob whose data is not valid base64.
pub fn invoke_response(
    result: CallToolResult,
    server: &str,
) -> Result<pb::InvokeToolResponse, InvalidContent> {
    let mut texts: Vec<&str> = Vec::new();
    let mut omitted = 0usize;
    for block in &result.content {
        match block {
            ContentBlock::Text(t) => texts.push(&t.text),
            _ => omitted += 1,
        }
    }
    let structured_content_json = result
        .structured_content
        .as_ref()
        .map(|v| v.to_string())
        .unwrap_or_default();
    let mut text = texts.join("\n");
    if omitted > 0 {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("[{omitted} non-text content block(s) omitted]"));
    }
    if text.is_empty() {
        // An empty result reads to a model as a tool that did nothing.
        text = if structured_content_json.is_empty() {
            "[empty result]".to_owned()
        } else {
            structured_content_json.clone()
        };
    }
    let content = result
        .content
        .into_iter()
        .map(|block| content(block, server))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(pb::InvokeToolResponse {
        is_error: result.is_error.unwrap_or(false),
        text,
        content,
        structured_content_json,
        ..Default::default()
    })
}

/// Decodes base64 `data` (a blob, an image) of `what`.
///
/// # Errors
/// The data is not valid base64.
pub fn decode(data: &str, what: &'static str) -> Result<Vec<u8>, InvalidContent> {
    STANDARD
        .decode(data.trim())
        .map_err(|_| InvalidContent { what })
}

/// Converts one content block of `server` (a tool result's, a prompt
/// message's).
///
/// # Errors
/// An image, audio or blob whose data is not valid base64.
pub fn content(block: ContentBlock, server: &str) -> Result<pb::Content, InvalidContent> {
    use pb::content::Kind;
    let kind = match block {
        ContentBlock::Text(t) => Kind::Text(pb::TextContent { text: t.text }),
        ContentBlock::Image(i) => Kind::Image(pb::ImageContent {
            data: decode(&i.data, "an image")?,
            mime_type: i.mime_type,
        }),
        ContentBlock::Audio(a) => Kind::Audio(pb::AudioContent {
            data: decode(&a.data, "audio")?,
            mime_type: a.mime_type,
        }),
        ContentBlock::ResourceLink(r) => Kind::ResourceLink(pb::ResourceLink {
            // In normal form, as a read of it is matched and sent (as the
            // server gave it, when it has none: a read of it is refused).
            uri: ResourceUri::parse(&r.uri).map_or(r.uri, ResourceUri::into_string),
            name: r.name,
            title: r.title.unwrap_or_default(),
            description: r.description.unwrap_or_default(),
            mime_type: r.mime_type.unwrap_or_default(),
            size: r.size,
            server: server.to_owned(),
        }),
        ContentBlock::Resource(r) => Kind::Resource(match r.resource {
            ResourceContents::TextResourceContents {
                uri,
                mime_type,
                text,
                ..
            } => pb::EmbeddedResource {
                uri,
                mime_type: mime_type.unwrap_or_default(),
                contents: Some(pb::embedded_resource::Contents::Text(text)),
                server: server.to_owned(),
            },
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => pb::EmbeddedResource {
                uri,
                mime_type: mime_type.unwrap_or_default(),
                contents: Some(pb::embedded_resource::Contents::Blob(decode(
                    &blob,
                    "a resource blob",
                )?)),
                server: server.to_owned(),
            },
            other => pb::EmbeddedResource {
                uri: String::new(),
                mime_type: "application/json".to_owned(),
                contents: Some(pb::embedded_resource::Contents::Text(
                    serde_json::to_string(&other).unwrap_or_default(),
                )),
                server: server.to_owned(),
            },
        }),
        // Content kinds added to MCP after this gateway was built are
        // carried as their JSON text rather than dropped.
        #[allow(unreachable_patterns)]
        other => Kind::Text(pb::TextContent {
            text: serde_json::to_string(&other).unwrap_or_default(),
        }),
    };
    Ok(pb::Content { kind: Some(kind) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ContentBlock as Content;

    #[test]
    fn renders_text_and_counts_other_blocks() {
        let result = CallToolResult::success(vec![
            Content::text("first"),
            Content::image(STANDARD.encode([1u8, 2, 3]), "image/png"),
            Content::text("second"),
        ]);
        let response = invoke_response(result, "s").unwrap();
        assert_eq!(
            response.text,
            "first\nsecond\n[1 non-text content block(s) omitted]"
        );
        assert_eq!(response.content.len(), 3);
        let Some(pb::content::Kind::Image(image)) = &response.content[1].kind else {
            panic!("expected image");
        };
        assert_eq!(image.data, [1, 2, 3]);
        assert!(!response.is_error);
    }

    #[test]
    fn an_image_only_result_is_not_empty_text() {
        let result =
            CallToolResult::success(vec![Content::image(STANDARD.encode([0u8]), "image/png")]);
        assert_eq!(
            invoke_response(result, "s").unwrap().text,
            "[1 non-text content block(s) omitted]"
        );
    }

    #[test]
    fn invalid_base64_is_refused() {
        let result = CallToolResult::success(vec![Content::image("%%%", "image/png")]);
        assert!(invoke_response(result, "s").is_err());
    }

    #[test]
    fn errors_keep_their_text() {
        let result = CallToolResult::error(vec![Content::text("boom")]);
        let response = invoke_response(result, "s").unwrap();
        assert!(response.is_error);
        assert_eq!(response.text, "boom");
    }

    #[test]
    fn links_and_embedded_resources_name_their_server() {
        let link = rmcp::model::Resource::new("file:///a.txt", "a");
        let result = CallToolResult::success(vec![
            Content::resource_link(link),
            Content::embedded_text("file:///b.txt", "b"),
        ]);
        let response = invoke_response(result, "files").unwrap();
        let Some(pb::content::Kind::ResourceLink(link)) = &response.content[0].kind else {
            panic!("expected a link");
        };
        assert_eq!(link.server, "files");
        let Some(pb::content::Kind::Resource(embedded)) = &response.content[1].kind else {
            panic!("expected an embedded resource");
        };
        assert_eq!(embedded.server, "files");
    }
}
