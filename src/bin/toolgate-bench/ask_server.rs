//! The benchmark's MCP server for questions and tasks (rmcp, stdio): `echo`
//! (the plain call), `ask` (one form question, then done) and `report` (a
//! task that is complete the first time it is looked at). `ask` asks the way
//! the session's protocol does: `elicitation/create` while the call is
//! pending up to 2025-11-25, an `input_required` result from 2026-07-28.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientResult, ContentBlock, CreateTaskResult, DetailedTask, ElicitRequest, ElicitRequestParams,
    ErrorData, GetTaskParams, GetTaskResult, InputRequest, InputRequests, InputRequiredResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, ServerRequest, Task,
    TaskPayload, TaskStatus, Tool, UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::json;

/// The question `ask` puts.
fn question() -> serde_json::Value {
    json!({
        "mode": "form",
        "message": "Answer?",
        "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    })
}

const CREATED: &str = "2026-01-01T00:00:00Z";

/// The benchmark's asking server.
#[derive(Clone, Default)]
pub struct AskServer {
    tasks: Arc<AtomicU64>,
}

fn text(t: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(t.into())]).into()
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

impl rmcp::ServerHandler for AskServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
    }

    // ListToolsResult is non-exhaustive: it cannot be built literally.
    #[allow(clippy::field_reassign_with_default)]
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"message": {"type": "string"}}});
        let schema = Arc::new(schema.as_object().cloned().unwrap_or_default());
        let mut result = ListToolsResult::default();
        result.tools = vec![
            Tool::new("echo", "Echo the message back.", schema.clone()),
            Tool::new("ask", "Ask one form question, then answer.", schema.clone()),
            Tool::new("report", "A task, complete when first looked at.", schema),
        ];
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match request.name.as_ref() {
            "ask" => {
                let modern = context
                    .protocol_version()
                    .is_some_and(|v| !v.has_initialize());
                if modern {
                    if let Some(responses) = &request.input_responses {
                        return Ok(text(format!("answered {}", responses.len())));
                    }
                    let ask: InputRequest = serde_json::from_value(
                        json!({"method": "elicitation/create", "params": question()}),
                    )
                    .map_err(internal)?;
                    let mut requests = InputRequests::new();
                    requests.insert("answer".to_owned(), ask);
                    return Ok(InputRequiredResult::new(Some(requests), Some("s1".into())).into());
                }
                let params: ElicitRequestParams =
                    serde_json::from_value(question()).map_err(internal)?;
                let answer = context
                    .peer
                    .send_request(ServerRequest::ElicitRequest(ElicitRequest::new(params)))
                    .await
                    .map_err(internal)?;
                match answer {
                    ClientResult::ElicitResult(answer) => {
                        Ok(text(format!("answered {:?}", answer.action)))
                    }
                    other => Err(internal(format!("not an elicitation result: {other:?}"))),
                }
            }
            "report" => {
                let declared = context
                    .client_capabilities()
                    .is_some_and(|c| c.supports_tasks());
                if !declared {
                    return Err(ErrorData::missing_required_client_capability(
                        ClientCapabilities::builder().enable_tasks().build(),
                    ));
                }
                let id = self.tasks.fetch_add(1, Ordering::Relaxed);
                let task = Task::new(format!("t{id}"), TaskStatus::Working, CREATED, CREATED)
                    .with_poll_interval_ms(1);
                Ok(CreateTaskResult::new(task).into())
            }
            _ => {
                let message = request
                    .arguments
                    .as_ref()
                    .and_then(|a| a.get("message"))
                    .and_then(|m| m.as_str())
                    .unwrap_or_default()
                    .to_owned();
                Ok(text(message))
            }
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let result =
            json!({"content": [{"type": "text", "text": "report ready"}], "isError": false});
        let task = Task::new(request.task_id, TaskStatus::Completed, CREATED, CREATED);
        let payload = TaskPayload::Completed {
            result: result.as_object().cloned().unwrap_or_default(),
        };
        Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
    }

    async fn update_task(
        &self,
        _request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn cancel_task(
        &self,
        _request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }
}

/// Serves Streamable HTTP (`/mcp`) on 127.0.0.1:`port` until killed.
pub async fn serve_http(port: u16) -> anyhow::Result<()> {
    use axum::serve::ListenerExt;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let service = StreamableHttpService::new(
        || Ok(AskServer::default()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await?
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await?;
    Ok(())
}

/// Serves over stdio until stdin closes.
pub async fn serve_stdio() -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let service = AskServer::default()
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await?;
    service.waiting().await?;
    Ok(())
}
