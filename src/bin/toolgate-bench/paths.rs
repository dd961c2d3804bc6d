//! The measured call paths (the floor, direct rmcp, toolgate over stdio,
//! HTTP and with an audit file, server-everything; mcpo) and one round
//! of figures on a path.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::args::Args;
use crate::harness::{
    Proc, authed, everything_js, exe, fast_http_server, free_port, gateway_with, grpc, node, repo,
    spawn, wait_port,
};
use crate::measure::{self, CallFn, Latency};
use toolgate::pb;

pub(crate) fn invoke_fn(
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

pub(crate) fn rmcp_fn(peer: rmcp::service::Peer<rmcp::service::RoleClient>) -> CallFn {
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
pub(crate) struct Path_ {
    pub(crate) name: &'static str,
    pub(crate) call: CallFn,
    /// Serving processes whose CPU counts (gateway first for toolgate).
    pub(crate) serving: Vec<u32>,
    /// The gateway's pid, for gateway-only CPU.
    pub(crate) gateway: Option<u32>,
    pub(crate) _keep: Vec<Proc>,
    pub(crate) _clients: Vec<Box<dyn std::any::Any + Send>>,
}

/// A path's figures, one entry a round (by concurrency level where keyed).
#[derive(Default, Clone)]
pub(crate) struct Figures {
    pub(crate) latency: Vec<Latency>,
    pub(crate) rps: BTreeMap<usize, Vec<f64>>,
    pub(crate) cpu_ms: BTreeMap<usize, Vec<f64>>,
    pub(crate) gateway_cpu_ms: BTreeMap<usize, Vec<f64>>,
    pub(crate) peak_rss: Vec<f64>,
}

/// The concurrency levels of the throughput runs.
pub(crate) const LEVELS: [usize; 3] = [1, 16, 64];

/// One round on `path`: sequential latency, then throughput and CPU per
/// call at each level, then peak RSS.
pub(crate) async fn measure(
    path: &Path_,
    args: &Args,
    figures: &mut Figures,
) -> anyhow::Result<()> {
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

pub(crate) async fn direct_stdio(
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

pub(crate) async fn through_toolgate(
    name: &'static str,
    servers: &str,
    tool: &str,
    extra: Vec<Proc>,
) -> anyhow::Result<Path_> {
    through_toolgate_with(name, |_| String::new(), servers, tool, extra).await
}

pub(crate) async fn through_toolgate_with(
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

pub(crate) fn stdio_command(program: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    command
}

pub(crate) async fn build_paths() -> anyhow::Result<Vec<Path_>> {
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
    paths.push(crate::https::path().await?.0);

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
pub(crate) const AUDITED: &str = "toolgate → fast stdio, audit file";

/// mcpo in front of server-everything, via bench/mcpo/run.sh.
pub(crate) fn mcpo(args: &Args) -> anyhow::Result<serde_json::Value> {
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
