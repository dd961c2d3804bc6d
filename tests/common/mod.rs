//! Shared test support: an in-process gateway on port 0, configurable
//! in-process MCP servers (rmcp over Streamable HTTP on 127.0.0.1), paths to
//! the real third-party fixtures installed by `tests/setup.sh`, and helpers
//! to run the `toolgate` binary.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, ErrorData, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use toolgate::config::Config;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

pub mod pki;
mod tls;
pub mod tls_server;
pub use tls::serve_mcp_tls;
pub use tls_server::make_certs;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn require(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: run tests/setup.sh first (it installs the Python and npm fixtures)",
        path.display()
    );
    path
}

/// The venv's Python, with the `mcp` SDK and grpcio installed.
pub fn python() -> PathBuf {
    require(repo_root().join(".venv/bin/python"))
}

/// A fixture file under `tests/fixtures`.
pub fn fixture(relative: &str) -> PathBuf {
    require(repo_root().join("tests/fixtures").join(relative))
}

/// server-everything's entry point.
pub fn everything_js() -> PathBuf {
    fixture("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

/// The absolute path of `node`.
pub fn node() -> PathBuf {
    let path = std::env::var_os("PATH").expect("PATH");
    std::env::split_paths(&path)
        .map(|dir| dir.join("node"))
        .find(|p| p.is_file())
        .expect("node on PATH")
}

/// The `toolgate` binary built for these tests.
pub fn toolgate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_toolgate"))
}

/// A free loopback port for a listener a test configures by number (a
/// metrics or admin listener, a child's port): never handed out twice in
/// this process, and taken below the kernel's ephemeral range (Linux:
/// 32768 and up), so no `bind` to port 0 of this process or a child (a
/// gateway's own port, an upstream) can take it between this check and its
/// use; the start is spread by process id for concurrent test runs.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() * 997;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + start.wrapping_add(n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN)
}

// ---------------------------------------------------------------------------
// The in-process gateway
// ---------------------------------------------------------------------------

/// A gateway running in this process on 127.0.0.1:0.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub stop: toolgate::app::Shutdown,
    task: Option<tokio::task::JoinHandle<Result<(), toolgate::app::AppError>>>,
}

impl TestGateway {
    /// Starts a gateway from YAML; `listen` is overridden to 127.0.0.1:0.
    /// `env` is the environment secret sources read from.
    pub async fn start(yaml: &str, env: &[(&str, &str)]) -> TestGateway {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain(std::iter::once((
                "PATH".to_string(),
                std::env::var("PATH").unwrap_or_default(),
            )))
            .collect();
        let config = Config::from_yaml(yaml, "test.yaml", Path::new("."), &env)
            .unwrap_or_else(|e| panic!("test config invalid: {e}"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = toolgate::app::Shutdown::new();
        let task = tokio::spawn(toolgate::app::run(
            config,
            listener,
            Arc::new(env),
            stop.clone(),
        ));
        TestGateway {
            addr,
            stop,
            task: Some(task),
        }
    }

    /// A client connected to the gateway.
    pub async fn client(&self) -> ToolGatewayClient<Channel> {
        ToolGatewayClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to gateway")
    }

    /// Stops the gateway and waits until it has closed every session.
    pub async fn shutdown(mut self) {
        self.stop.now();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("gateway stops in time")
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.stop.now();
    }
}

/// A client of a gateway (a `toolgate serve` process) on 127.0.0.1:`port`.
pub async fn client_at(port: u16) -> ToolGatewayClient<Channel> {
    ToolGatewayClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the gateway")
}

/// `message` with `authorization: Bearer <token>`.
pub fn authed<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// `message` with a static `token`, acting for `subject`
/// (`x-toolgate-subject`).
pub fn authed_as<T>(token: &str, subject: &str, message: T) -> tonic::Request<T> {
    let mut request = authed(token, message);
    request
        .metadata_mut()
        .insert("x-toolgate-subject", subject.parse().unwrap());
    request
}

/// Lists the tools of the tenant that `token` selects.
pub async fn list(client: &mut ToolGatewayClient<Channel>, token: &str) -> pb::ListToolsResponse {
    client
        .list_tools(authed(token, pb::ListToolsRequest::default()))
        .await
        .expect("ListTools")
        .into_inner()
}

/// Lists as `token` until its catalog holds `tool` (its server connects
/// in the background, slowly on a loaded machine), at most 30 s.
pub async fn wait_listed(client: &mut ToolGatewayClient<Channel>, token: &str, tool: &str) {
    let started = std::time::Instant::now();
    loop {
        let listing = list(client, token).await;
        if names(&listing).iter().any(|n| n == tool) {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{tool} never listed: {listing:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Invokes `name` with `args` as the tenant that `token` selects.
pub async fn invoke(
    client: &mut ToolGatewayClient<Channel>,
    token: &str,
    name: &str,
    args: &str,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    client
        .invoke_tool(authed(
            token,
            pb::InvokeToolRequest {
                name: name.to_string(),
                arguments_json: args.to_string(),
                ..Default::default()
            },
        ))
        .await
        .map(tonic::Response::into_inner)
}

/// `request` as `token`'s caller acting for `subject`.
pub async fn invoke_as(
    client: &mut ToolGatewayClient<Channel>,
    token: &str,
    subject: &str,
    request: pb::InvokeToolRequest,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    client
        .invoke_tool(authed_as(token, subject, request))
        .await
        .map(tonic::Response::into_inner)
}

/// The exposed names in a listing.
pub fn names(listing: &pb::ListToolsResponse) -> Vec<String> {
    listing.tools.iter().map(|t| t.name.clone()).collect()
}

/// An `ErrorInfo` metadata value of `status` ("" when absent).
pub fn info(status: &tonic::Status, key: &str) -> String {
    use tonic_types::StatusExt as _;
    status
        .get_error_details()
        .error_info()
        .and_then(|i| i.metadata.get(key).cloned())
        .unwrap_or_default()
}

/// The `ErrorInfo.reason` of a status.
pub fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// In-process MCP servers
// ---------------------------------------------------------------------------

/// How a test server pages its tool list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Paging {
    /// `page_size` tools per page, then no cursor.
    Pages { page_size: usize },
    /// Always returns a fresh cursor: never ends.
    Forever,
    /// Returns the same cursor every time.
    RepeatCursor,
}

/// What a test server saw.
#[derive(Default)]
pub struct ServerLog {
    /// Request headers of every HTTP request, lowercase names.
    pub headers: Mutex<Vec<HashMap<String, String>>>,
    /// Every `notifications/cancelled` received.
    pub cancelled: Mutex<Vec<CancelledNotificationParam>>,
    /// Signalled when a `slow` call starts.
    pub slow_started: Notify,
    /// Signalled when a cancellation arrives.
    pub cancel_arrived: Notify,
    /// Number of `tools/list` requests.
    pub list_calls: Mutex<usize>,
    /// The `_meta.traceparent` of every `tools/call` (None when absent).
    pub call_traceparents: Mutex<Vec<Option<String>>>,
}

/// A configurable MCP server. Tools are named by the test; calls select
/// behaviour by the tool's name:
/// - `echo` → text of `arguments.text`
/// - `fail` → `isError` with text "it failed on purpose"
/// - `bad_params` → JSON-RPC invalid params
/// - `internal` → JSON-RPC internal error with a message that must not leak
/// - `slow` → waits until cancelled (records the cancellation)
/// - `image` → a text block and a PNG image
/// - anything else → text "called <name>"
#[derive(Clone)]
pub struct TestServer {
    pub tools: Arc<Vec<Tool>>,
    pub paging: Paging,
    pub log: Arc<ServerLog>,
}

/// A tool with an object schema taking an optional string `text`.
pub fn tool(name: &str) -> Tool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": { "text": { "type": "string", "description": "Text to echo." } }
    });
    let serde_json::Value::Object(schema) = schema else {
        unreachable!()
    };
    Tool::new(
        name.to_string(),
        format!("The {name} tool."),
        Arc::new(schema),
    )
}

/// A 1×1 PNG, base64.
pub const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

impl TestServer {
    pub fn new(tool_names: &[&str]) -> Self {
        Self {
            tools: Arc::new(tool_names.iter().map(|n| tool(n)).collect()),
            paging: Paging::Pages { page_size: 1000 },
            log: Arc::new(ServerLog::default()),
        }
    }

    pub fn with_paging(mut self, paging: Paging) -> Self {
        self.paging = paging;
        self
    }

    pub fn with_tools(mut self, tools: Vec<Tool>) -> Self {
        self.tools = Arc::new(tools);
        self
    }
}

impl rmcp::ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        *self.log.list_calls.lock().unwrap() += 1;
        let cursor = request.and_then(|r| r.cursor);
        let mut result = ListToolsResult::default();
        match self.paging {
            Paging::Pages { page_size } => {
                let start: usize = cursor.map(|c| c.parse().unwrap()).unwrap_or(0);
                let end = (start + page_size).min(self.tools.len());
                result.tools = self.tools[start..end].to_vec();
                if end < self.tools.len() {
                    result.next_cursor = Some(end.to_string());
                }
            }
            Paging::Forever => {
                let n: usize = cursor.map(|c| c.parse().unwrap()).unwrap_or(0);
                result.tools = vec![tool(&format!("t{n}"))];
                result.next_cursor = Some((n + 1).to_string());
            }
            Paging::RepeatCursor => {
                result.tools = self.tools.to_vec();
                result.next_cursor = Some("same".to_string());
            }
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.log.call_traceparents.lock().unwrap().push(
            context
                .meta
                .get_traceparent()
                .or_else(|| request.meta.as_ref().and_then(|m| m.get_traceparent()))
                .map(str::to_string),
        );
        let args = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "echo" => CallToolResult::success(vec![ContentBlock::text(
                args.get("text")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default(),
            )]),
            "fail" => CallToolResult::error(vec![ContentBlock::text("it failed on purpose")]),
            "bad_params" => {
                return Err(ErrorData::invalid_params("missing field `text`", None));
            }
            "internal" => {
                return Err(ErrorData::internal_error(
                    "database password is hunter2",
                    None,
                ));
            }
            "slow" => {
                self.log.slow_started.notify_one();
                tokio::select! {
                    () = context.ct.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
                CallToolResult::success(vec![ContentBlock::text("slow done")])
            }
            "progress" => {
                // Out-of-order and repeated values, spaced past the relay's
                // rate limit: the gateway must pass on 1, 2, 3 only.
                if let Some(token) = context.meta.get_progress_token() {
                    for value in [1.0, 2.0, 2.0, 1.5, 3.0] {
                        let _ = context
                            .peer
                            .notify_progress(
                                rmcp::model::ProgressNotificationParam::new(token.clone(), value)
                                    .with_total(3.0),
                            )
                            .await;
                        tokio::time::sleep(Duration::from_millis(80)).await;
                    }
                }
                CallToolResult::success(vec![ContentBlock::text("progress done")])
            }
            "image" => CallToolResult::success(vec![
                ContentBlock::text("a pixel"),
                ContentBlock::image(PNG_B64, "image/png"),
            ]),
            other => CallToolResult::success(vec![ContentBlock::text(format!("called {other}"))]),
        };
        Ok(result.into())
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        self.log.cancelled.lock().unwrap().push(notification);
        self.log.cancel_arrived.notify_one();
    }
}

/// A running in-process MCP server.
pub struct McpServer {
    pub url: String,
    pub log: Arc<ServerLog>,
    stop: CancellationToken,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serves `server` over Streamable HTTP on 127.0.0.1, recording headers.
pub async fn serve_mcp(server: TestServer) -> McpServer {
    serve_mcp_with(server, false).await
}

/// Like [`serve_mcp`], answering plain JSON bodies (stateless, no SSE).
pub async fn serve_mcp_json(server: TestServer) -> McpServer {
    serve_mcp_with(server, true).await
}

/// Like [`serve_mcp`], on a given port (to restart a server in place).
pub async fn serve_mcp_at(server: TestServer, port: u16) -> McpServer {
    serve_mcp_on(server, false, port).await
}

async fn serve_mcp_with(server: TestServer, json: bool) -> McpServer {
    serve_mcp_on(server, json, 0).await
}

/// A switch in front of an MCP server's endpoint ([`serve_mcp_gated`]):
/// while `broken`, every request of a call (`tools/call`, `prompts/get`,
/// `resources/read`, `completion/complete`) is answered HTTP 503 without
/// reaching the server; `calls` counts those requests that arrive, refused
/// or not. Listing and the session's own requests always go through.
#[derive(Default)]
pub struct Gate {
    pub broken: std::sync::atomic::AtomicBool,
    pub calls: std::sync::atomic::AtomicUsize,
}

impl Gate {
    /// Requests of calls that reached the endpoint so far.
    pub fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Breaks the server (true) or mends it (false).
    pub fn set_broken(&self, broken: bool) {
        self.broken
            .store(broken, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Like [`serve_mcp`], behind `gate`.
pub async fn serve_mcp_gated(server: TestServer, gate: Arc<Gate>) -> McpServer {
    let log = server.log.clone();
    let stop = CancellationToken::new();
    let router = mcp_router(server, false, &stop).layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let gate = gate.clone();
            async move {
                use std::sync::atomic::Ordering;
                let (parts, body) = request.into_parts();
                let bytes = axum::body::to_bytes(body, 1 << 20)
                    .await
                    .unwrap_or_default();
                let text = String::from_utf8_lossy(&bytes);
                let is_call = [
                    "\"tools/call\"",
                    "\"prompts/get\"",
                    "\"resources/read\"",
                    "\"completion/complete\"",
                ]
                .iter()
                .any(|method| text.contains(method));
                if is_call {
                    gate.calls.fetch_add(1, Ordering::SeqCst);
                    if gate.broken.load(Ordering::SeqCst) {
                        return axum::response::IntoResponse::into_response((
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            "down for maintenance",
                        ));
                    }
                }
                let request =
                    axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
                next.run(request).await
            }
        },
    ));
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    serve_router(listener, router, log, stop)
}

/// Serves `router` on `listener` until `stop`.
fn serve_router(
    listener: TcpListener,
    router: axum::Router,
    log: Arc<ServerLog>,
    stop: CancellationToken,
) -> McpServer {
    let addr = listener.local_addr().unwrap();
    let shutdown = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
    });
    McpServer {
        url: format!("http://{addr}/mcp"),
        log,
        stop,
    }
}

async fn serve_mcp_on(server: TestServer, json: bool, port: u16) -> McpServer {
    let log = server.log.clone();
    let stop = CancellationToken::new();
    let router = mcp_router(server, json, &stop);
    let listener = loop {
        // A port just released may take a moment to be free again.
        match TcpListener::bind(("127.0.0.1", port)).await {
            Ok(listener) => break listener,
            Err(_) if port != 0 => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("bind: {e}"),
        }
    };
    serve_router(listener, router, log, stop)
}

/// `server`'s Streamable HTTP endpoint (`/mcp`), recording request
/// headers; plain JSON bodies (stateless, no SSE) when `json`.
fn mcp_router(server: TestServer, json: bool, stop: &CancellationToken) -> axum::Router {
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token());
    if json {
        config.legacy_session_mode = false;
        config.json_response = true;
    }
    let header_log = server.log.clone();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        config,
    );
    axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let header_log = header_log.clone();
                async move {
                    let headers = request
                        .headers()
                        .iter()
                        .map(|(k, v)| {
                            (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())
                        })
                        .collect();
                    header_log.headers.lock().unwrap().push(headers);
                    next.run(request).await
                }
            },
        ))
}

/// A child process that is killed when dropped.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `port` on 127.0.0.1 accepts connections (bounded).
pub async fn wait_for_port(port: u16) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing listens on 127.0.0.1:{port} after 10 s");
}

/// Starts server-everything over Streamable HTTP pinned to 127.0.0.1,
/// logging request headers to `header_log`.
pub async fn start_everything_http(header_log: &Path) -> (ChildGuard, u16) {
    let port = free_port();
    let preload = fixture("node/pin-localhost.cjs");
    let child = std::process::Command::new(node())
        .arg("--require")
        .arg(&preload)
        .arg(everything_js())
        .arg("streamableHttp")
        .env_clear()
        .env("PORT", port.to_string())
        .env("TOOLGATE_TEST_HEADER_LOG", header_log)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start server-everything");
    let guard = ChildGuard(child);
    wait_for_port(port).await;
    (guard, port)
}

/// Whether a process with this pid still exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state is the field after the parenthesised command name.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Pids of every process whose parent is `parent`.
pub fn children_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after = stat.rsplit(')').next().unwrap_or("");
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// Runs `tests/fixtures/python/ops_probe.py` with `args`; returns its exit
/// code and JSON output.
pub async fn ops_probe(args: &[&str]) -> (i32, serde_json::Value) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(python())
            .arg(fixture("python/ops_probe.py"))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("ops probe finishes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "ops probe printed no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), value)
}

/// Sends `signal` (e.g. "TERM") to `pid`.
pub fn signal(pid: u32, signal: &str) {
    assert!(
        std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .unwrap()
            .success()
    );
}

/// Waits (bounded) for a child to exit.
pub async fn wait_exit(
    child: &mut std::process::Child,
    limit: Duration,
) -> std::process::ExitStatus {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            started.elapsed() < limit,
            "process did not exit within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A tool with annotation hints.
pub fn annotated(name: &str, read_only: bool, description: &str) -> Tool {
    let mut t = tool(name);
    t.description = Some(description.to_string().into());
    t.annotations = Some(rmcp::model::ToolAnnotations::new().read_only(read_only));
    t
}

/// Runs `toolgate serve --config <config>` with `RUST_LOG=info`, its log
/// (stderr) written to `log`, and `env` added to its environment.
pub fn serve_binary(config: &Path, log: &Path, env: &[(&str, &str)]) -> ChildGuard {
    let mut command = std::process::Command::new(toolgate_bin());
    command
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    for (key, value) in env {
        command.env(key, value);
    }
    ChildGuard(command.spawn().unwrap())
}

/// Where Debian's `postgresql-15` package puts its programs.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A throwaway PostgreSQL 15 cluster in a temporary directory, listening on
/// 127.0.0.1 on a free port (its Unix socket in the same directory), with
/// `trust` authentication for the `postgres` user. The server runs as the
/// `postgres` user when the tests run as root (initdb and pg_ctl refuse
/// root). Stopped (immediately) and removed on drop.
pub struct PgCluster {
    dir: tempfile::TempDir,
    port: u16,
    running: bool,
}

impl PgCluster {
    /// Creates and starts a cluster.
    pub fn start() -> PgCluster {
        let initdb = Path::new(PG_BIN).join("initdb");
        assert!(
            initdb.exists(),
            "{} is missing: run tests/setup.sh first (it installs postgresql-15)",
            initdb.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("toolgate-pg")
            .tempdir()
            .unwrap();
        if running_as_root() {
            let status = std::process::Command::new("chown")
                .arg("postgres:")
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown postgres: {status}");
        }
        let data = dir.path().join("data");
        let out = pg_command("initdb")
            .args([
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--no-sync",
            ])
            .arg("--pgdata")
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut cluster = PgCluster {
            dir,
            port: free_port(),
            running: false,
        };
        cluster.restart();
        cluster
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the (stopped) cluster again on the same port.
    pub fn restart(&mut self) {
        let dir = self.dir.path();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -c unix_socket_directories={} -c fsync=off",
            self.port,
            dir.display()
        );
        let out = pg_command("pg_ctl")
            .arg("--pgdata")
            .arg(dir.join("data"))
            .arg("--log")
            .arg(dir.join("server.log"))
            .args(["--wait", "--timeout=60", "-o", &options, "start"])
            .output()
            .unwrap();
        let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{log}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.running = true;
    }

    /// Stops the cluster (fast shutdown: clients are disconnected).
    pub fn stop(&mut self) {
        self.stop_with("fast");
    }

    /// Kills the cluster (immediate shutdown: no checkpoint, connections
    /// cut as by a crash; the next start recovers from the WAL).
    pub fn crash(&mut self) {
        self.stop_with("immediate");
    }

    fn stop_with(&mut self, mode: &str) {
        if !self.running {
            return;
        }
        let _ = pg_command("pg_ctl")
            .arg("--pgdata")
            .arg(self.dir.path().join("data"))
            .args(["--wait", "--mode", mode, "stop"])
            .output();
        self.running = false;
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop_with("immediate");
    }
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// A PostgreSQL program, run as `postgres` when we are root.
fn pg_command(program: &str) -> std::process::Command {
    let path = Path::new(PG_BIN).join(program);
    if running_as_root() {
        let mut command = std::process::Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(path);
        command
    } else {
        std::process::Command::new(path)
    }
}

/// The metrics page of a gateway (plain HTTP/1.0 GET on 127.0.0.1).
pub async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut body))
        .await
        .expect("metrics answer in time")
        .unwrap();
    body
}

/// The value of a sample line starting with `series` in a metrics page.
pub fn sample(page: &str, series: &str) -> Option<String> {
    page.lines()
        .find(|l| l.starts_with(series))
        .map(|l| l[series.len()..].trim().to_owned())
}
