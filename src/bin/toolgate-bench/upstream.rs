//! The fast MCP server built for the benchmark (rmcp): an `echo` tool and,
//! optionally, many filler tools for catalog-size measurements. Served over
//! stdio or Streamable HTTP on 127.0.0.1.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};

/// The benchmark's MCP server.
#[derive(Clone)]
pub struct FastServer {
    tools: Arc<Vec<Tool>>,
}

impl FastServer {
    pub fn new(extra_tools: usize) -> Self {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"message": {"type": "string", "description": "Text to echo back."}},
            "required": ["message"]
        });
        let schema = Arc::new(schema.as_object().cloned().unwrap_or_default());
        let mut tools = vec![Tool::new("echo", "Echo the message back.", schema.clone())];
        for i in 0..extra_tools {
            tools.push(Tool::new(
                format!("tool_{i:05}"),
                format!("Filler tool number {i}, present to make the catalog large; it echoes like `echo`."),
                schema.clone(),
            ));
        }
        Self {
            tools: Arc::new(tools),
        }
    }
}

impl rmcp::ServerHandler for FastServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    // ListToolsResult is non-exhaustive: it cannot be built literally.
    #[allow(clippy::field_reassign_with_default)]
    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // Pages of 1000, as large servers do.
        let start: usize = request
            .and_then(|r| r.cursor)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let end = (start + 1000).min(self.tools.len());
        let mut result = ListToolsResult::default();
        result.tools = self.tools[start..end].to_vec();
        if end < self.tools.len() {
            result.next_cursor = Some(end.to_string());
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let message = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("message"))
            .and_then(|m| m.as_str())
            .unwrap_or_default()
            .to_owned();
        Ok(CallToolResult::success(vec![ContentBlock::text(message)]).into())
    }
}

/// Serves over stdio until stdin closes.
pub async fn serve_stdio(extra_tools: usize) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let service = FastServer::new(extra_tools)
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await?;
    service.waiting().await?;
    Ok(())
}

/// The Streamable HTTP endpoint (`/mcp`) of the fast server.
pub fn router(extra_tools: usize) -> axum::Router {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let server = FastServer::new(extra_tools);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    axum::Router::new().nest_service("/mcp", service)
}

/// Serves Streamable HTTP on 127.0.0.1:`port` until killed.
pub async fn serve_http(port: u16, extra_tools: usize) -> anyhow::Result<()> {
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await?
        // Without TCP_NODELAY (axum does not set it), an SSE answer written
        // in two segments waits for the client's delayed ACK (40 ms).
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    axum::serve(listener, router(extra_tools)).await?;
    Ok(())
}
