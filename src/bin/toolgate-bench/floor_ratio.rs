//! The floor of a gateway call completed (issue 38): a call through
//! toolgate is a gRPC hop in and an MCP hop out, so its floor is what a
//! bare tonic server of the same messages spends per call (the echo) plus
//! what a bare MCP client spends per call against the same upstream (an
//! rmcp client in a process of its own, `toolgate-bench direct-client`,
//! so that `/proc` counts it alone). Figures, interleaved over rounds, all
//! at 16 in flight: the echo server's CPU per call, the direct client's
//! over the fast stdio and fast HTTP servers, and the gateway's own CPU
//! per call in front of the same servers (tonic client); then gateway /
//! (echo + direct client). The same with the Python client of
//! `--only-python` (bench/python/grpc_load.py, `grpc.aio`): the echo's and
//! the gateways' CPU per call under that client, in the same rounds, over
//! the same direct client's figure.

use std::process::Command;
use std::time::Duration;

use super::harness::{Proc, exe, fast_http_server, free_port, gateway, grpc, spawn, wait_port};
use super::measure::{self, CallFn, median};
use super::paths::{invoke_fn, rmcp_fn};
use super::python::{self, Client};

const IN_FLIGHT: usize = 16;

/// `direct-client`: the client side of the floor, in this process.
///
/// # Errors
/// The server cannot be started or reached, or a call fails.
pub async fn direct_client(
    url: Option<&str>,
    client: super::lean_client::Client,
    in_flight: usize,
    duration: Duration,
) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let (call, _client): (CallFn, Box<dyn std::any::Any>) = match url {
        Some(url) => {
            let transport =
                rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_owned());
            let client = ().serve(transport).await?;
            (rmcp_fn(client.peer().clone()), Box::new(client))
        }
        None => {
            let mut command = tokio::process::Command::new(exe());
            command
                .arg("mcp-server")
                .stderr(std::process::Stdio::null());
            super::lean_client::start(command, client).await?
        }
    };
    measure::sequential(&call, 200).await?;
    let me = std::process::id();
    let before = measure::cpu_seconds(me);
    let (rate, calls) = measure::throughput(&call, in_flight, duration).await?;
    let after = measure::cpu_seconds(me);
    println!(
        "{}",
        serde_json::json!({
            "calls": calls,
            "rate": rate,
            "cpu_ms_per_call": (after - before) * 1000.0 / calls.max(1) as f64,
        })
    );
    Ok(())
}

/// One run of the direct client in its own process: its CPU ms per call.
fn client_cpu_ms(url: Option<&str>, duration: Duration) -> anyhow::Result<f64> {
    let mut command = Command::new(exe());
    command.args([
        "direct-client",
        "--in-flight",
        &IN_FLIGHT.to_string(),
        "--duration",
        &format!("{}ms", duration.as_millis()),
    ]);
    if let Some(url) = url {
        command.args(["--url", url]);
    }
    let output = command.stderr(std::process::Stdio::inherit()).output()?;
    anyhow::ensure!(output.status.success(), "direct-client failed: {output:?}");
    let figures: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    figures["cpu_ms_per_call"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("direct-client answered {figures}"))
}

/// CPU ms per call of `pid` while `call` runs at [`IN_FLIGHT`].
async fn cpu_ms(call: &CallFn, pid: u32, duration: Duration) -> anyhow::Result<f64> {
    let before = measure::cpu_seconds(pid);
    let (_, calls) = measure::throughput(call, IN_FLIGHT, duration).await?;
    let after = measure::cpu_seconds(pid);
    Ok((after - before) * 1000.0 / calls.max(1) as f64)
}

/// Runs the figure and prints its rows of the targets table.
///
/// # Errors
/// When a process does not start or a call fails.
pub async fn report(rounds: usize, duration: Duration) -> anyhow::Result<()> {
    let exe_s = exe().display().to_string();
    // The echo: the floor of the gRPC hop.
    let port = free_port();
    let mut command = Command::new(exe());
    command.args(["echo-server", &port.to_string()]);
    let echo = spawn(command);
    wait_port(port).await;
    let echo_call = invoke_fn(grpc(port).await, "echo");
    // The direct client's HTTP server, and the gateways' upstreams.
    let (direct_server, direct_port) = fast_http_server(0);
    wait_port(direct_port).await;
    let direct_url = format!("http://127.0.0.1:{direct_port}/mcp");
    let (stdio, stdio_port) = gateway(&format!(
        "      - name: fast\n        command: [\"{exe_s}\", \"mcp-server\"]\n"
    ))
    .await;
    let (gw_server, gw_port) = fast_http_server(0);
    wait_port(gw_port).await;
    let (http, http_port) = gateway(&format!(
        "      - name: fast\n        url: \"http://127.0.0.1:{gw_port}/mcp\"\n"
    ))
    .await;
    python::wait_connected(stdio_port).await?;
    python::wait_connected(http_port).await?;
    let stdio_call = invoke_fn(grpc(stdio_port).await, "fast__echo");
    let http_call = invoke_fn(grpc(http_port).await, "fast__echo");
    // The Python clients (their runs last at least python::MIN_RUN).
    let py_duration = duration.max(python::MIN_RUN);
    let mut py_echo = Client::start("echo (Python)", port, "echo", None, py_duration).await?;
    let token = Some("bench-token");
    let mut py_stdio = Client::start(
        "stdio (Python)",
        stdio_port,
        "fast__echo",
        token,
        py_duration,
    )
    .await?;
    let mut py_http =
        Client::start("http (Python)", http_port, "fast__echo", token, py_duration).await?;
    for call in [&echo_call, &stdio_call, &http_call] {
        measure::sequential(call, 200).await?;
    }
    let mut figures: [Vec<f64>; 8] = Default::default();
    for round in 0..rounds.max(1) {
        eprintln!(
            "round {}: floor (echo, direct clients, gateways)",
            round + 1
        );
        figures[0].push(cpu_ms(&echo_call, echo.pid(), duration).await?);
        figures[1].push(client_cpu_ms(None, duration)?);
        figures[2].push(client_cpu_ms(Some(&direct_url), duration)?);
        figures[3].push(cpu_ms(&stdio_call, stdio.pid(), duration).await?);
        figures[4].push(cpu_ms(&http_call, http.pid(), duration).await?);
        figures[5].push(py_cpu_ms(&mut py_echo, &echo, py_duration).await?);
        figures[6].push(py_cpu_ms(&mut py_stdio, &stdio, py_duration).await?);
        figures[7].push(py_cpu_ms(&mut py_http, &http, py_duration).await?);
    }
    drop((py_echo, py_stdio, py_http));
    drop((echo, direct_server, stdio, http, gw_server));
    let [
        echo_ms,
        stdio_client,
        http_client,
        stdio_gw,
        http_gw,
        py_echo_ms,
        py_stdio_gw,
        py_http_gw,
    ] = figures.map(median);
    let fmt = super::report::fmt;
    println!(
        "| CPU ms/call @16: bare tonic echo {} (under the Python client {}), direct rmcp client (own process) → fast stdio {}, → fast http {} | | | |",
        fmt(echo_ms, 4),
        fmt(py_echo_ms, 4),
        fmt(stdio_client, 4),
        fmt(http_client, 4)
    );
    for (name, client_kind, echo_ms, gateway, client, goal) in [
        ("fast stdio", "tonic", echo_ms, stdio_gw, stdio_client, 1.2),
        ("fast http", "tonic", echo_ms, http_gw, http_client, 1.3),
        (
            "fast stdio",
            "Python",
            py_echo_ms,
            py_stdio_gw,
            stdio_client,
            1.2,
        ),
        (
            "fast http",
            "Python",
            py_echo_ms,
            py_http_gw,
            http_client,
            1.3,
        ),
    ] {
        let ratio = gateway / (echo_ms + client);
        println!(
            "| gateway CPU ms/call @16, {name}, {client_kind} client: {} / (echo {} + direct client {}) | {} | ≤ {goal} | {} |",
            fmt(gateway, 4),
            fmt(echo_ms, 4),
            fmt(client, 4),
            fmt(ratio, 2),
            if ratio <= goal { "met" } else { "MISSED" }
        );
    }
    Ok(())
}

/// CPU ms per call of `serving` during one run of the Python `client`.
async fn py_cpu_ms(client: &mut Client, serving: &Proc, duration: Duration) -> anyhow::Result<f64> {
    let before = measure::cpu_seconds(serving.pid());
    let run = client.run(duration).await?;
    let after = measure::cpu_seconds(serving.pid());
    Ok((after - before) * 1000.0 / run.calls.max(1) as f64)
}
