//! The benchmark's processes and clients: child processes killed on drop,
//! the executables it runs, free ports, the fast HTTP upstream, a gateway
//! with one tenant, and an authenticated gRPC client.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use toolgate::pb;

/// A child process killed on drop.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }
}

pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn exe() -> PathBuf {
    std::env::current_exe().expect("own path")
}

pub(crate) fn toolgate_exe() -> PathBuf {
    exe().with_file_name("toolgate")
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub(crate) fn node() -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("node"))
        .find(|p| p.is_file())
        .expect("node on PATH")
}

pub(crate) fn everything_js() -> PathBuf {
    repo().join(
        "tests/fixtures/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    )
}

pub(crate) async fn wait_port(port: u16) {
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing listens on 127.0.0.1:{port}");
}

pub(crate) fn spawn(mut command: Command) -> Proc {
    Proc(
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    )
}

/// A `toolgate serve` process on `config`, logging errors only.
pub(crate) fn spawn_gateway(config: &Path) -> Proc {
    let mut command = Command::new(toolgate_exe());
    command
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "error");
    spawn(command)
}

/// A gateway process with one tenant `bench` (token `bench-token`) and
/// the given servers YAML.
pub(crate) async fn gateway(servers: &str) -> (Proc, u16) {
    gateway_with(|_| String::new(), servers).await
}

/// [`gateway`] with top-level YAML made from the gateway's own temporary
/// directory (for an audit file).
pub(crate) async fn gateway_with(top: impl Fn(&Path) -> String, servers: &str) -> (Proc, u16) {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("toolgate-bench-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("config.yaml");
    let top = top(&dir);
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n{top}limits:\n  max_message_bytes: 268435456\n  max_result_bytes: 268435456\ntenants:\n  - name: bench\n    tokens: [bench-token]\n    servers:\n{servers}"
        ),
    )
    .expect("config");
    let proc = spawn_gateway(&config);
    wait_port(port).await;
    (proc, port)
}

pub(crate) async fn grpc(
    port: u16,
) -> pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("uri")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect");
    pb::tool_gateway_client::ToolGatewayClient::new(channel).max_decoding_message_size(usize::MAX)
}

pub(crate) fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        "Bearer bench-token".parse().expect("ascii"),
    );
    request
}

/// The benchmark's own fast MCP server over Streamable HTTP, with `tools`
/// extra tools, and its port.
pub(crate) fn fast_http_server(tools: usize) -> (Proc, u16) {
    let port = free_port();
    let mut command = Command::new(exe());
    command.args([
        "mcp-server",
        "--http",
        &port.to_string(),
        "--tools",
        &tools.to_string(),
    ]);
    (spawn(command), port)
}

/// Milliseconds from `started` until the gateway on `port` answers health
/// `SERVING` (polled every 2 ms, for at most a minute).
pub(crate) async fn serving_ms(port: u16, started: std::time::Instant) -> anyhow::Result<f64> {
    loop {
        if let Ok(endpoint) =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            && let Ok(channel) = endpoint.connect().await
        {
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            if let Ok(r) = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                && r.get_ref().status
                    == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
            {
                return Ok(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the gateway on port {port} never answered SERVING"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
