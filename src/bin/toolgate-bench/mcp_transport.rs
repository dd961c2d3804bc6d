//! A tool call over MCP's own gRPC transport (`model_context_protocol.Mcp`
//! `CallTool`) against the same call over `toolgate.v1` `InvokeTool`: one
//! gateway in front of the fast stdio server, one connection per path,
//! interleaved rounds of a sequential p50, calls/s at 16 in flight and the
//! gateway's CPU per call at 16 in flight. Goal: `Mcp` CPU per call within
//! 1.1x of `InvokeTool`'s in the same run.

use std::sync::Arc;
use std::time::Duration;

use toolgate::pb::mcp;

use super::measure::{self, CallFn, median};
use super::policy::{Client, invoke, request};

/// `CallTool` of `fast__echo` over the transport.
fn call_tool(channel: tonic::transport::Channel) -> CallFn {
    let client = mcp::mcp_client::McpClient::new(channel);
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            let mut arguments = prost_types::Struct::default();
            arguments.fields.insert(
                "message".into(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue("hello".into())),
                },
            );
            let message = mcp::CallToolRequest {
                common: None,
                request: Some(mcp::call_tool_request::Request {
                    name: "fast__echo".into(),
                    arguments: Some(arguments),
                }),
            };
            let reply = client
                .call_tool(request("bench-token", message))
                .await?
                .into_inner();
            anyhow::ensure!(!reply.is_error && !reply.content.is_empty(), "{reply:?}");
            Ok(())
        })
    })
}

struct Path {
    name: &'static str,
    call: CallFn,
    p50: Vec<f64>,
    rps: Vec<f64>,
    cpu_ms: Vec<f64>,
}

/// Runs the figure and prints its rows of the targets table.
///
/// # Errors
/// When the gateway does not start or connect, or any call fails.
pub async fn report(rounds: usize, sequential: usize, duration: Duration) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("toolgate-bench-mcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = super::harness::free_port();
    let exe = super::harness::exe().display().to_string();
    let servers = format!("      - name: fast\n        command: [\"{exe}\", \"mcp-server\"]\n");
    let (gateway, client): (_, Client) =
        super::policy::two_tenant_gateway(&dir, port, "", &servers, |listing| {
            !listing.servers.is_empty() && listing.servers.iter().all(|s| s.connected)
        })
        .await?;
    // The transport's own connection, so neither path shares HTTP/2 streams.
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect()
        .await?;
    let path = |name, call| Path {
        name,
        call,
        p50: Vec::new(),
        rps: Vec::new(),
        cpu_ms: Vec::new(),
    };
    let mut paths = [
        path("InvokeTool", invoke(client, "bench-token")),
        path("Mcp CallTool", call_tool(channel)),
    ];
    for p in &paths {
        measure::sequential(&p.call, 50).await?;
    }
    for round in 0..rounds.max(1) {
        for p in &mut paths {
            eprintln!("round {}: MCP gRPC transport: {}", round + 1, p.name);
            p.p50
                .push(measure::sequential(&p.call, sequential).await?.p50);
            let before = measure::cpu_seconds(gateway.pid());
            let (rate, calls) = measure::throughput(&p.call, 16, duration).await?;
            let after = measure::cpu_seconds(gateway.pid());
            p.rps.push(rate);
            p.cpu_ms
                .push((after - before) * 1000.0 / calls.max(1) as f64);
        }
    }
    drop(gateway);
    let _ = std::fs::remove_dir_all(&dir);
    let fig = |p: &Path| {
        (
            median(p.p50.clone()),
            median(p.rps.clone()),
            median(p.cpu_ms.clone()),
        )
    };
    let (v1, over_mcp) = (fig(&paths[0]), fig(&paths[1]));
    let fmt = super::report::fmt;
    println!(
        "| {} p50, fast stdio: {} ms / InvokeTool {} ms | {} | | |",
        paths[1].name,
        fmt(over_mcp.0, 3),
        fmt(v1.0, 3),
        fmt(over_mcp.0 / v1.0, 2)
    );
    println!(
        "| {} calls/s @16, fast stdio: {} / InvokeTool {} | {} | | |",
        paths[1].name,
        fmt(over_mcp.1, 0),
        fmt(v1.1, 0),
        fmt(over_mcp.1 / v1.1, 2)
    );
    let ratio = over_mcp.2 / v1.2;
    println!(
        "| {} gateway CPU ms/call @16, fast stdio: {} / InvokeTool {} | {} | ≤ 1.1 | {} |",
        paths[1].name,
        fmt(over_mcp.2, 3),
        fmt(v1.2, 3),
        fmt(ratio, 2),
        if ratio <= 1.1 { "met" } else { "missed" }
    );
    Ok(())
}
