//! The benchmark's MCP server for resources and prompts (rmcp, stdio):
//! `bench://text` (1 MiB of text), `bench://blob` (1 MiB of bytes, base64
//! on the wire), `bench://cached-text` (the same text, marked reusable for
//! an hour: 2026-07-28 `ttlMs`, `cacheScope: public`), `bench://small` and
//! `bench://small-cached` (a few bytes of text, the second marked reusable
//! as above: the result cache's own cost, `--only-steps`), 1,000 prompts of
//! two arguments, and 1,000 tools (the ListTools baseline of the
//! ListPrompts figure).

use std::sync::Arc;

use base64::Engine as _;
use rmcp::model::{
    CacheScope, ErrorData, GetPromptRequestParams, GetPromptResponse, GetPromptResult,
    ListPromptsResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams, Prompt,
    PromptArgument, PromptMessage, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, Role, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};

/// Bytes of each resource.
pub(crate) const SIZE: usize = 1 << 20;
/// The text of `bench://small` and `bench://small-cached`.
pub(crate) const SMALL: &str = "hello";
/// Prompts (and tools) listed.
pub(crate) const PROMPTS: usize = 1000;

/// The server: its two resources are made once.
#[derive(Clone)]
pub struct OfferingsServer {
    text: Arc<String>,
    blob: Arc<String>,
}

impl OfferingsServer {
    fn new() -> Self {
        // Lines of printable text; bytes of every value for the blob.
        let line = "the quick brown fox jumps over the lazy dog 0123456789\n";
        let text: String = line.repeat(SIZE / line.len() + 1)[..SIZE].to_owned();
        let bytes: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
        Self {
            text: Arc::new(text),
            blob: Arc::new(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }
}

fn prompt(i: usize) -> Prompt {
    Prompt::new(
        format!("prompt_{i:04}"),
        Some(format!(
            "Prompt number {i}: summarise a document in a given tone."
        )),
        Some(vec![
            PromptArgument::new("document")
                .with_description("What to summarise")
                .with_required(true),
            PromptArgument::new("tone")
                .with_description("How it should read")
                .with_required(false),
        ]),
    )
}

impl rmcp::ServerHandler for OfferingsServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = serde_json::json!({"type": "object", "properties": {"document": {"type": "string"}, "tone": {"type": "string"}}, "required": ["document"]});
        let schema = Arc::new(schema.as_object().cloned().unwrap_or_default());
        Ok(ListToolsResult::with_all_items(
            (0..PROMPTS)
                .map(|i| {
                    Tool::new(
                        format!("tool_{i:04}"),
                        format!("Tool number {i}: summarise a document in a given tone."),
                        schema.clone(),
                    )
                })
                .collect(),
        ))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(
            (0..PROMPTS).map(prompt).collect(),
        ))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let document = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("document"))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        Ok(GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            format!("Summarise: {document}"),
        )])
        .into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new("bench://text", "text"),
            Resource::new("bench://blob", "blob"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let contents = match request.uri.as_str() {
            "bench://text" => ResourceContents::text(self.text.as_str(), "bench://text")
                .with_mime_type("text/plain"),
            "bench://cached-text" => {
                let text = ResourceContents::text(self.text.as_str(), "bench://cached-text")
                    .with_mime_type("text/plain");
                return Ok(ReadResourceResult::new(vec![text])
                    .with_ttl_ms(3_600_000)
                    .with_cache_scope(CacheScope::Public)
                    .into());
            }
            "bench://small" => ResourceContents::text(SMALL, "bench://small"),
            "bench://small-cached" => {
                let text = ResourceContents::text(SMALL, "bench://small-cached");
                return Ok(ReadResourceResult::new(vec![text])
                    .with_ttl_ms(3_600_000)
                    .with_cache_scope(CacheScope::Public)
                    .into());
            }
            "bench://blob" => ResourceContents::blob(self.blob.as_str(), "bench://blob")
                .with_mime_type("application/octet-stream"),
            other => {
                return Err(ErrorData::resource_not_found(
                    format!("no resource {other}"),
                    None,
                ));
            }
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

/// Serves over stdio until stdin closes.
pub async fn serve_stdio() -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let service = OfferingsServer::new()
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await?;
    service.waiting().await?;
    Ok(())
}
