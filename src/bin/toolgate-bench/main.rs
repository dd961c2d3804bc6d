//! `toolgate-bench`: measures, side by side in one run, what a tool call
//! costs through toolgate against the floor of a gRPC hop (a bare tonic
//! server), a direct rmcp client, and mcpo; plus ListTools of a large
//! catalog and many-tenant figures. Prints a table and the target ratios.
//!
//! ```text
//! cargo run --release --bin toolgate-bench            # everything, 3 rounds
//! cargo run --release --bin toolgate-bench -- --help  # options
//! ```
//! See docs/performance.md.

mod floor;
mod https;
mod listing;
mod measure;
mod memory;
mod policy;
mod policy_audit;
mod python;
mod scale;
mod upstream;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use measure::{CallFn, Latency, median};
use toolgate::pb;

#[derive(Debug, Parser)]
#[command(about = "Benchmarks toolgate against its baselines; see docs/performance.md")]
struct Args {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Interleaved rounds; figures are medians over rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Duration of each throughput run.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Calls of each sequential latency run.
    #[arg(long, default_value_t = 1000)]
    sequential: usize,
    /// Skip mcpo (it needs bench/mcpo/setup.sh).
    #[arg(long)]
    skip_mcpo: bool,
    /// Skip the many-tenant figures.
    #[arg(long)]
    skip_tenants: bool,
    /// Only the per-tool policy figures (a 20-rule policy against none).
    #[arg(long)]
    only_policy: bool,
    /// Only the ListTools figures (10,000 tools against the floor).
    #[arg(long)]
    only_listing: bool,
    /// Only the fast stdio, http and https paths through the gateway.
    #[arg(long)]
    only_http: bool,
    /// Only the many-tenant figures (memory), `--rounds` times.
    #[arg(long)]
    only_tenants: bool,
    /// Skip the Python-client figure (grpc.aio, 16 in flight).
    #[arg(long)]
    skip_python: bool,
    /// Only the Python-client figure.
    #[arg(long)]
    only_python: bool,
    /// Skip the large-scale run (10,000 tenants, 2,000 active).
    #[arg(long)]
    skip_scale: bool,
    /// Only the large-scale run.
    #[arg(long)]
    only_scale: bool,
    /// Length of the large-scale run.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    scale_duration: Duration,
    /// Skip the figure of a 20-rule policy and the audit trail together.
    #[arg(long)]
    skip_policy_audit: bool,
    /// Only the figure of a 20-rule policy and the audit trail together.
    #[arg(long)]
    only_policy_audit: bool,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// (internal) the fast MCP server: stdio, or HTTP with --http PORT.
    McpServer {
        #[arg(long)]
        http: Option<u16>,
        #[arg(long, default_value_t = 0)]
        tools: usize,
        /// With --http: serve HTTPS with this directory's certificates.
        #[arg(long)]
        tls: Option<PathBuf>,
    },
    /// (internal) the bare tonic floor server.
    EchoServer {
        port: u16,
        /// An encoded ListToolsResponse to answer ListTools with.
        #[arg(long)]
        list_file: Option<PathBuf>,
    },
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn exe() -> PathBuf {
    std::env::current_exe().expect("own path")
}

fn toolgate_exe() -> PathBuf {
    exe().with_file_name("toolgate")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn node() -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("node"))
        .find(|p| p.is_file())
        .expect("node on PATH")
}

fn everything_js() -> PathBuf {
    repo().join(
        "tests/fixtures/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    )
}

async fn wait_port(port: u16) {
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

fn spawn(mut command: Command) -> Proc {
    Proc(
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    )
}

/// A gateway process with one tenant `bench` (token `bench-token`) and
/// the given servers YAML.
async fn gateway(servers: &str) -> (Proc, u16) {
    gateway_with(|_| String::new(), servers).await
}

/// [`gateway`] with top-level YAML made from the gateway's own temporary
/// directory (for an audit file).
async fn gateway_with(top: impl Fn(&Path) -> String, servers: &str) -> (Proc, u16) {
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
    let mut command = Command::new(toolgate_exe());
    command
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "error");
    let proc = spawn(command);
    wait_port(port).await;
    (proc, port)
}

async fn grpc(port: u16) -> pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("uri")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect");
    pb::tool_gateway_client::ToolGatewayClient::new(channel).max_decoding_message_size(usize::MAX)
}

fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        "Bearer bench-token".parse().expect("ascii"),
    );
    request
}

fn invoke_fn(
    client: pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    name: &str,
) -> CallFn {
    let name = name.to_owned();
    std::sync::Arc::new(move || {
        let mut client = client.clone();
        let name = name.clone();
        Box::pin(async move {
            client
                .invoke_tool(authed(pb::InvokeToolRequest {
                    name,
                    arguments_json: r#"{"message":"hello"}"#.into(),
                    ..Default::default()
                }))
                .await?;
            Ok(())
        })
    })
}

fn rmcp_fn(peer: rmcp::service::Peer<rmcp::service::RoleClient>) -> CallFn {
    std::sync::Arc::new(move || {
        let peer = peer.clone();
        Box::pin(async move {
            let args = serde_json::json!({"message": "hello"});
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("echo")
                    .with_arguments(args.as_object().cloned().unwrap_or_default()),
            )
            .await?;
            Ok(())
        })
    })
}

/// One measured path: how to call it and which processes serve it.
struct Path_ {
    name: &'static str,
    call: CallFn,
    /// Serving processes whose CPU counts (gateway first for toolgate).
    serving: Vec<u32>,
    /// The gateway's pid, for gateway-only CPU.
    gateway: Option<u32>,
    _keep: Vec<Proc>,
    _clients: Vec<Box<dyn std::any::Any + Send>>,
}

#[derive(Default, Clone)]
struct Figures {
    latency: Vec<Latency>,
    rps: BTreeMap<usize, Vec<f64>>,
    cpu_ms: BTreeMap<usize, Vec<f64>>,
    gateway_cpu_ms: BTreeMap<usize, Vec<f64>>,
    peak_rss: Vec<f64>,
}

const LEVELS: [usize; 3] = [1, 16, 64];

async fn measure(path: &Path_, args: &Args, figures: &mut Figures) -> anyhow::Result<()> {
    // Warm up.
    measure::sequential(&path.call, 50).await?;
    figures
        .latency
        .push(measure::sequential(&path.call, args.sequential).await?);
    for level in LEVELS {
        let cpu_before: f64 = path.serving.iter().map(|p| measure::cpu_seconds(*p)).sum();
        let gw_before = path.gateway.map(measure::cpu_seconds).unwrap_or(0.0);
        let (rate, calls) = measure::throughput(&path.call, level, args.duration).await?;
        let cpu_after: f64 = path.serving.iter().map(|p| measure::cpu_seconds(*p)).sum();
        let gw_after = path.gateway.map(measure::cpu_seconds).unwrap_or(0.0);
        figures.rps.entry(level).or_default().push(rate);
        figures
            .cpu_ms
            .entry(level)
            .or_default()
            .push((cpu_after - cpu_before) * 1000.0 / calls.max(1) as f64);
        if path.gateway.is_some() {
            figures
                .gateway_cpu_ms
                .entry(level)
                .or_default()
                .push((gw_after - gw_before) * 1000.0 / calls.max(1) as f64);
        }
    }
    figures
        .peak_rss
        .push(path.serving.iter().map(|p| measure::peak_rss_mib(*p)).sum());
    Ok(())
}

async fn direct_stdio(
    name: &'static str,
    mut command: tokio::process::Command,
) -> anyhow::Result<Path_> {
    use rmcp::ServiceExt;
    command.stderr(Stdio::null());
    let transport = rmcp::transport::TokioChildProcess::new(command)?;
    let pid = transport.id().unwrap_or(0);
    let client = ().serve(transport).await?;
    let call = rmcp_fn(client.peer().clone());
    Ok(Path_ {
        name,
        call,
        serving: vec![pid],
        gateway: None,
        _keep: Vec::new(),
        _clients: vec![Box::new(client)],
    })
}

async fn through_toolgate(
    name: &'static str,
    servers: &str,
    tool: &str,
    extra: Vec<Proc>,
) -> anyhow::Result<Path_> {
    through_toolgate_with(name, |_| String::new(), servers, tool, extra).await
}

async fn through_toolgate_with(
    name: &'static str,
    top: impl Fn(&Path) -> String,
    servers: &str,
    tool: &str,
    extra: Vec<Proc>,
) -> anyhow::Result<Path_> {
    let (gw, port) = gateway_with(top, servers).await;
    let client = grpc(port).await;
    // Wait for the upstream to be connected.
    for _ in 0..300 {
        if let Ok(r) = client
            .clone()
            .list_tools(authed(pb::ListToolsRequest::default()))
            .await
            && r.get_ref().servers.iter().all(|s| s.connected)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gateway_pid = gw.pid();
    let mut serving = vec![gateway_pid];
    serving.extend(measure::children(gateway_pid));
    serving.extend(extra.iter().map(Proc::pid));
    let mut keep = vec![gw];
    keep.extend(extra);
    Ok(Path_ {
        name,
        call: invoke_fn(client, tool),
        serving,
        gateway: Some(gateway_pid),
        _keep: keep,
        _clients: Vec::new(),
    })
}

fn fast_http_server(tools: usize) -> (Proc, u16) {
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

fn stdio_command(program: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    command
}

async fn build_paths() -> anyhow::Result<Vec<Path_>> {
    let exe = exe();
    let exe_s = exe.display().to_string();
    let node = node();
    let everything = everything_js();
    let mut paths = Vec::new();

    // The floor.
    let port = free_port();
    let mut command = Command::new(&exe);
    command.args(["echo-server", &port.to_string()]);
    let echo = spawn(command);
    wait_port(port).await;
    let client = grpc(port).await;
    paths.push(Path_ {
        name: "floor: bare tonic echo",
        call: invoke_fn(client, "echo"),
        serving: vec![echo.pid()],
        gateway: None,
        _keep: vec![echo],
        _clients: Vec::new(),
    });

    // Fast Rust upstream over stdio.
    paths.push(
        direct_stdio(
            "direct rmcp → fast stdio",
            stdio_command(&exe, &["mcp-server"]),
        )
        .await?,
    );
    paths.push(
        through_toolgate(
            "toolgate → fast stdio",
            &format!("      - name: fast\n        command: [\"{exe_s}\", \"mcp-server\"]\n"),
            "fast__echo",
            Vec::new(),
        )
        .await?,
    );
    // The same, with every call's audit record written to a file first.
    paths.push(
        through_toolgate_with(
            AUDITED,
            |dir| {
                format!(
                    "audit:\n  path: \"{}\"\n",
                    dir.join("audit.jsonl").display()
                )
            },
            &format!("      - name: fast\n        command: [\"{exe_s}\", \"mcp-server\"]\n"),
            "fast__echo",
            Vec::new(),
        )
        .await?,
    );

    // Fast Rust upstream over Streamable HTTP.
    let (direct_server, direct_port) = fast_http_server(0);
    wait_port(direct_port).await;
    {
        use rmcp::ServiceExt;
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(format!(
            "http://127.0.0.1:{direct_port}/mcp"
        ));
        let client = ().serve(transport).await?;
        paths.push(Path_ {
            name: "direct rmcp → fast http",
            call: rmcp_fn(client.peer().clone()),
            serving: vec![direct_server.pid()],
            gateway: None,
            _keep: vec![direct_server],
            _clients: vec![Box::new(client)],
        });
    }
    let (gw_server, gw_port) = fast_http_server(0);
    wait_port(gw_port).await;
    paths.push(
        through_toolgate(
            "toolgate → fast http",
            &format!("      - name: fast\n        url: \"http://127.0.0.1:{gw_port}/mcp\"\n"),
            "fast__echo",
            vec![gw_server],
        )
        .await?,
    );
    paths.push(https::path().await?.0);

    // server-everything over stdio.
    paths.push(
        direct_stdio(
            "direct rmcp → everything stdio",
            stdio_command(&node, &[&everything.display().to_string(), "stdio"]),
        )
        .await?,
    );
    paths.push(
        through_toolgate(
            "toolgate → everything stdio",
            &format!(
                "      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n",
                node.display(),
                everything.display()
            ),
            "everything__echo",
            Vec::new(),
        )
        .await?,
    );
    Ok(paths)
}

/// The path through a gateway with an audit file (`audit.path`).
const AUDITED: &str = "toolgate → fast stdio, audit file";

/// mcpo in front of server-everything, via bench/mcpo/run.sh.
fn mcpo(args: &Args) -> anyhow::Result<serde_json::Value> {
    let output = Command::new(repo().join("bench/mcpo/run.sh"))
        .env("BENCH_SECONDS", args.duration.as_secs().max(1).to_string())
        .env("BENCH_SEQ", args.sequential.to_string())
        .stderr(Stdio::null())
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "bench/mcpo/run.sh failed (run bench/mcpo/setup.sh first)"
    );
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Many tenants: (ms to SERVING with 10,000 tenants, idle RSS MiB,
/// RSS MiB with 1,000 tenants × 2 live HTTP sessions).
async fn many_tenants() -> anyhow::Result<(f64, f64, f64)> {
    let (server, port) = fast_http_server(0);
    wait_port(port).await;
    let dir = std::env::temp_dir().join(format!("toolgate-bench-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let write = |name: &str,
                 tenants: usize,
                 connect: &str,
                 servers: usize|
     -> anyhow::Result<(PathBuf, u16)> {
        let gw_port = free_port();
        let mut yaml = format!(
            "listen: \"127.0.0.1:{gw_port}\"\nshutdown_delay: \"0s\"\ndefaults:\n  connect: {connect}\ntenants:\n"
        );
        for t in 0..tenants {
            yaml.push_str(&format!(
                "  - name: t{t}\n    tokens: [token-{t:05}-bench]\n    servers:\n"
            ));
            for s in 0..servers {
                yaml.push_str(&format!(
                    "      - name: s{s}\n        url: \"http://127.0.0.1:{port}/mcp\"\n"
                ));
            }
        }
        let path = dir.join(name);
        std::fs::write(&path, yaml)?;
        Ok((path, gw_port))
    };

    // 10,000 idle (lazy) tenants: time to SERVING and RSS.
    let (config, gw_port) = write("idle.yaml", 10_000, "lazy", 1)?;
    let started = Instant::now();
    let mut command = Command::new(toolgate_exe());
    command
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "error");
    let gw = spawn(command);
    let serving_ms = loop {
        if let Ok(channel) =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{gw_port}"))?
                .connect()
                .await
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
                break started.elapsed().as_secs_f64() * 1000.0;
            }
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "never SERVING");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = measure::rss_mib(gw.pid());
    drop(gw);

    // 1,000 tenants × 2 live HTTP sessions.
    let (config, gw_port) = write("live.yaml", 1_000, "eager", 2)?;
    let mut command = Command::new(toolgate_exe());
    command
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "error");
    let gw = spawn(command);
    wait_port(gw_port).await;
    let client = grpc(gw_port).await;
    let started = Instant::now();
    for t in [0usize, 499, 999] {
        loop {
            let mut request = tonic::Request::new(pb::ListToolsRequest::default());
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer token-{t:05}-bench").parse()?,
            );
            if let Ok(r) = client.clone().list_tools(request).await
                && r.get_ref().servers.iter().all(|s| s.connected)
            {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(120),
                "sessions never all connected"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let live_rss = measure::rss_mib(gw.pid());
    drop((gw, server));
    let _ = std::fs::remove_dir_all(&dir);
    Ok((serving_ms, idle_rss, live_rss))
}

fn fmt(v: f64, digits: usize) -> String {
    if v.is_nan() {
        "-".to_owned()
    } else {
        format!("{v:.digits$}")
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    match &args.command {
        Some(Cmd::McpServer {
            http: None, tools, ..
        }) => return upstream::serve_stdio(*tools).await,
        Some(Cmd::McpServer {
            http: Some(port),
            tools,
            tls: Some(dir),
        }) => return https::serve(*port, *tools, dir).await,
        Some(Cmd::McpServer {
            http: Some(port),
            tools,
            tls: None,
        }) => return upstream::serve_http(*port, *tools).await,
        Some(Cmd::EchoServer { port, list_file }) => {
            return floor::serve(*port, list_file.as_deref()).await;
        }
        None => {}
    }
    anyhow::ensure!(
        toolgate_exe().exists(),
        "build the gateway first: cargo build --release"
    );
    if args.only_tenants {
        return memory::report(args.rounds).await;
    }
    if args.only_policy {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return policy::report(args.rounds).await;
    }
    if args.only_listing {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return listing::report().await;
    }
    if args.only_http {
        return https::report(&args).await;
    }
    if args.only_python || args.only_scale || args.only_policy_audit {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return extras(&args, true).await;
    }
    eprintln!(
        "toolgate-bench: {} round(s), {:?} per throughput run, {} sequential calls",
        args.rounds, args.duration, args.sequential
    );
    let paths = build_paths().await?;
    let mut figures: Vec<Figures> = vec![Figures::default(); paths.len()];
    let mut mcpo_runs = Vec::new();
    for round in 0..args.rounds {
        for (path, figures) in paths.iter().zip(figures.iter_mut()) {
            eprintln!("round {}: {}", round + 1, path.name);
            measure(path, &args, figures).await?;
        }
        if !args.skip_mcpo {
            eprintln!("round {}: mcpo", round + 1);
            match mcpo(&args) {
                Ok(v) => mcpo_runs.push(v),
                Err(e) => eprintln!("  mcpo skipped: {e}"),
            }
        }
    }

    println!(
        "| path | p50 ms | p90 ms | p99 ms | calls/s @1 | @16 | @64 | CPU ms/call @16 (serving) | gateway-only CPU ms/call @16 | peak RSS MiB |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut summary: BTreeMap<&str, (f64, f64, f64, f64)> = BTreeMap::new();
    for (path, f) in paths.iter().zip(&figures) {
        let p50 = median(f.latency.iter().map(|l| l.p50).collect());
        let p90 = median(f.latency.iter().map(|l| l.p90).collect());
        let p99 = median(f.latency.iter().map(|l| l.p99).collect());
        let rps = |l: usize| median(f.rps.get(&l).cloned().unwrap_or_default());
        let cpu = median(f.cpu_ms.get(&16).cloned().unwrap_or_default());
        let gw_cpu = median(f.gateway_cpu_ms.get(&16).cloned().unwrap_or_default());
        let rss = median(f.peak_rss.clone());
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            path.name,
            fmt(p50, 3),
            fmt(p90, 3),
            fmt(p99, 3),
            fmt(rps(1), 0),
            fmt(rps(16), 0),
            fmt(rps(64), 0),
            fmt(cpu, 3),
            fmt(gw_cpu, 3),
            fmt(rss, 1)
        );
        summary.insert(path.name, (p50, rps(16), cpu, gw_cpu));
    }
    let mcpo_rps16 = median(
        mcpo_runs
            .iter()
            .filter_map(|v| v["rps"]["16"].as_f64())
            .collect(),
    );
    if !mcpo_runs.is_empty() {
        let m = |k: &str| median(mcpo_runs.iter().filter_map(|v| v[k].as_f64()).collect());
        let rps = |l: &str| {
            median(
                mcpo_runs
                    .iter()
                    .filter_map(|v| v["rps"][l].as_f64())
                    .collect(),
            )
        };
        let cpu = median(
            mcpo_runs
                .iter()
                .filter_map(|v| v["cpu_ms_per_call"]["16"].as_f64())
                .collect(),
        );
        let rss: f64 = mcpo_runs
            .last()
            .map(|v| {
                v["peak_rss_mib"]["mcpo"].as_f64().unwrap_or(0.0)
                    + v["peak_rss_mib"]["node"].as_f64().unwrap_or(0.0)
            })
            .unwrap_or(f64::NAN);
        println!(
            "| mcpo → everything stdio (wrk) | {} | {} | {} | {} | {} | {} | {} | - | {} |",
            fmt(m("p50_ms"), 3),
            fmt(m("p90_ms"), 3),
            fmt(m("p99_ms"), 3),
            fmt(rps("1"), 0),
            fmt(rps("16"), 0),
            fmt(rps("64"), 0),
            fmt(cpu, 3),
            fmt(rss, 1)
        );
    }

    let floor = summary["floor: bare tonic echo"];
    let via_fast = summary["toolgate → fast stdio"];
    let direct_fast = summary["direct rmcp → fast stdio"];
    let via_every = summary["toolgate → everything stdio"];
    let direct_every = summary["direct rmcp → everything stdio"];
    println!("\n| target | figure | goal | |");
    println!("| --- | --- | --- | --- |");
    let cpu_ratio = via_fast.3 / floor.2;
    println!(
        "| gateway CPU per call / bare tonic echo CPU per call | {} | ≤ 2 | {} |",
        fmt(cpu_ratio, 2),
        verdict(cpu_ratio <= 2.0)
    );
    let added = (via_fast.0 - direct_fast.0) / floor.0;
    println!(
        "| added p50 (toolgate − direct, fast stdio) / bare echo p50 | {} | ≤ 1.5 | {} |",
        fmt(added, 2),
        verdict(added <= 1.5)
    );
    let audited = summary[AUDITED];
    println!(
        "| audit cost per call (fast stdio, audited − not): p50 | {} ms | | |",
        fmt(audited.0 - via_fast.0, 3)
    );
    println!(
        "| audit cost per call (fast stdio, audited − not): gateway CPU @16 | {} ms | | |",
        fmt(audited.3 - via_fast.3, 3)
    );
    println!(
        "| audit cost: calls/s @16, audited / not | {} | | |",
        fmt(audited.1 / via_fast.1, 2)
    );
    https::targets(&summary);
    let vs_direct = via_every.1 / direct_every.1;
    println!(
        "| everything stdio @16: toolgate / direct rmcp throughput | {} | ≥ 0.7 | {} |",
        fmt(vs_direct, 2),
        verdict(vs_direct >= 0.7)
    );
    if !mcpo_rps16.is_nan() {
        let vs_mcpo = via_every.1 / mcpo_rps16;
        println!(
            "| everything stdio @16: toolgate / mcpo throughput | {} | ≥ 3 | {} |",
            fmt(vs_mcpo, 2),
            verdict(vs_mcpo >= 3.0)
        );
    }
    listing::report().await?;
    if !args.skip_tenants {
        let (serving_ms, idle_rss, live_rss) = many_tenants().await?;
        println!(
            "| start to SERVING, 10,000 tenants | {} ms | ≤ 200 ms | {} |",
            fmt(serving_ms, 0),
            verdict(serving_ms <= 200.0)
        );
        println!(
            "| RSS, 10,000 idle tenants | {} MiB | ≤ 40 MiB | {} |",
            fmt(idle_rss, 1),
            verdict(idle_rss <= 40.0)
        );
        println!(
            "| RSS, 1,000 tenants × 2 live HTTP sessions | {} MiB | ≤ 100 MiB | {} |",
            fmt(live_rss, 1),
            verdict(live_rss <= 100.0)
        );
    }
    extras(&args, false).await?;
    policy::report(args.rounds).await?;
    Ok(())
}

/// The Python-client, policy + audit and large-scale figures: those asked
/// for with `--only-*` when `only`, else those not skipped.
async fn extras(args: &Args, only: bool) -> anyhow::Result<()> {
    if (only && args.only_python) || (!only && !args.skip_python) {
        python::report(args.rounds, args.duration).await?;
    }
    if (only && args.only_policy_audit) || (!only && !args.skip_policy_audit) {
        policy_audit::report(args.rounds, args.sequential, args.duration).await?;
    }
    if (only && args.only_scale) || (!only && !args.skip_scale) {
        scale::report(args.scale_duration).await?;
    }
    Ok(())
}
