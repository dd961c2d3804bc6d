//! `--only-idle-pairs`: what a live tenant × server pair holds while idle,
//! a 2026-07-28 server (`lifecycle: discover`, no session) against a
//! 2025-11-25 one (`lifecycle: initialize`: a session id and a standing
//! GET stream), both on the benchmark's own fast HTTP server.
//!
//! Two views, in one run:
//! - **the gateway process**: `--pairs-tenants` tenants (1,000 by default)
//!   × 2 servers, one gateway per revision and per way of connecting
//!   (`connect: eager`, all at start; `connect: lazy`, each tenant
//!   activated by one call, 16 in flight), against the
//!   same configuration with `connect: lazy` and no call (no live session:
//!   the idle baseline). RSS over the baseline, threads, and established
//!   TCP connections to the upstream, once every session is up and again
//!   after one call per pair, each after a quiet [`SETTLE`].
//!   `RUST_LOG=error` gateways; the fast server declares no `listChanged`
//!   (no `subscriptions/listen` stream is kept for it).
//! - **one session in this process** ([`toolgate::upstream::connect`],
//!   what the registry's slots hold): live tokio tasks, heap bytes (a
//!   counting allocator, [`crate::alloc`]) and TCP connections per idle
//!   session, of [`IN_PROCESS`] sessions of each revision.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use toolgate::pb;

use super::harness::{fast_http_server, free_port, grpc, spawn_gateway, wait_port};
use super::measure::{self, median};
use super::report::fmt;
use super::scale::{connections_to, scrape};

/// Quiet time before a figure of an idle pair is read: longer than a
/// stateless session keeps its rmcp service after its last request (5 s,
/// `upstream/lease.rs`), so connections settle and leases close.
const SETTLE: Duration = Duration::from_secs(7);

/// Sessions of each revision opened in this process for the per-session
/// figures.
const IN_PROCESS: usize = 200;

/// The goals for 1,000 tenants × 2 live pairs, MiB over the idle
/// baseline, by revision (as [`REVISIONS`]; issue 38).
const GOAL_MIB: [f64; 2] = [64.0, 100.0];

/// The two revisions measured: (name, `lifecycle`).
const REVISIONS: [(&str, &str); 2] = [("2026-07-28", "discover"), ("2025-11-25", "initialize")];

/// The gateway process at one moment.
#[derive(Debug, Default, Clone, Copy)]
struct Process {
    rss_mib: f64,
    threads: f64,
    connections: f64,
}

impl Process {
    fn read(pid: u32, upstream: u16) -> Self {
        Self {
            rss_mib: measure::rss_mib(pid),
            threads: threads(pid),
            connections: connections_to(pid, &[upstream]) as f64,
        }
    }
}

/// Threads of `pid` (`/proc/PID/status`).
fn threads(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// One round's gateway figures of one revision: connected, then after
/// one call per pair.
#[derive(Debug, Default, Clone, Copy)]
struct Live {
    connected: Process,
    called: Process,
}

/// Writes a configuration of `tenants` × 2 servers on `upstream`; returns
/// (path, gRPC port, metrics port).
fn config(
    dir: &std::path::Path,
    name: &str,
    tenants: usize,
    upstream: u16,
    connect: &str,
    lifecycle: &str,
) -> anyhow::Result<(std::path::PathBuf, u16, u16)> {
    let port = free_port();
    let metrics_port = free_port();
    let mut yaml = format!(
        "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nmetrics:\n  listen: \"127.0.0.1:{metrics_port}\"\n\
         defaults:\n  connect: {connect}\n  lifecycle: {lifecycle}\ntenants:\n"
    );
    for t in 0..tenants {
        yaml.push_str(&format!(
            "  - name: t{t}\n    tokens: [{}]\n    servers:\n",
            token(t)
        ));
        for s in 0..2 {
            yaml.push_str(&format!(
                "      - name: s{s}\n        url: \"http://127.0.0.1:{upstream}/mcp\"\n"
            ));
        }
    }
    let path = dir.join(name);
    std::fs::write(&path, yaml)?;
    Ok((path, port, metrics_port))
}

fn token(tenant: usize) -> String {
    format!("token-{tenant:05}-pairs")
}

/// Waits until the gateway reports `want` live sessions (at most 3 min).
async fn wait_live(metrics_port: u16, want: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let live = scrape(metrics_port).await.map(|m| m.live).unwrap_or(0.0);
        if live as usize >= want {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(180),
            "only {live} of {want} sessions connected within 3 min"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One call to each of the `tenants` × 2 pairs, 16 in flight.
async fn call_every_pair(port: u16, tenants: usize) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    let client = grpc(port).await;
    let calls = (0..tenants).flat_map(|t| (0..2).map(move |s| (t, s)));
    let mut results = futures::stream::iter(calls)
        .map(|(t, s)| {
            let mut client = client.clone();
            async move {
                let mut request = tonic::Request::new(pb::InvokeToolRequest {
                    name: format!("s{s}__echo"),
                    arguments_json: r#"{"message":"hello"}"#.into(),
                    ..Default::default()
                });
                request.metadata_mut().insert(
                    "authorization",
                    format!("Bearer {}", token(t)).parse().expect("ascii"),
                );
                client
                    .invoke_tool(request)
                    .await
                    .with_context(|| format!("t{t} s{s}__echo"))
                    .map(drop)
            }
        })
        .buffer_unordered(16);
    while let Some(result) = results.next().await {
        result?;
    }
    Ok(())
}

/// The idle baseline: the configuration with `connect: lazy`, no call.
async fn baseline(dir: &std::path::Path, tenants: usize, upstream: u16) -> anyhow::Result<Process> {
    let (config, port, _) = config(dir, "idle.yaml", tenants, upstream, "lazy", "discover")?;
    let gateway = spawn_gateway(&config);
    wait_port(port).await;
    tokio::time::sleep(SETTLE).await;
    Ok(Process::read(gateway.pid(), upstream))
}

/// How the pairs come to life: `eager` (every session at start, all at
/// once) or `lazy` (each tenant activated by its first call, 16 calls in
/// flight: how state store tenants come).
const CONNECTS: [&str; 2] = ["eager", "lazy"];

/// One revision's gateway: every pair connected, then called once.
async fn live(
    dir: &std::path::Path,
    tenants: usize,
    upstream: u16,
    lifecycle: &str,
    connect: &str,
) -> anyhow::Result<Live> {
    let name = format!("{lifecycle}-{connect}.yaml");
    let (config, port, metrics_port) = config(dir, &name, tenants, upstream, connect, lifecycle)?;
    let gateway = spawn_gateway(&config);
    wait_port(port).await;
    wait_port(metrics_port).await;
    if connect == "lazy" {
        call_every_pair(port, tenants).await?;
    }
    wait_live(metrics_port, tenants * 2).await?;
    tokio::time::sleep(SETTLE).await;
    let connected = Process::read(gateway.pid(), upstream);
    call_every_pair(port, tenants).await?;
    tokio::time::sleep(SETTLE).await;
    let called = Process::read(gateway.pid(), upstream);
    Ok(Live { connected, called })
}

/// What one session holds in this process: (tasks, heap KiB, TCP
/// connections) idle after connect, in use (right after a call), and idle
/// again after it.
#[derive(Debug, Default, Clone, Copy)]
struct PerSession {
    idle: (f64, f64, f64),
    in_use: (f64, f64, f64),
    idle_after: (f64, f64, f64),
}

/// Opens [`IN_PROCESS`] sessions of `lifecycle` to `upstream` in this
/// process and reads what each holds, idle and after one call.
async fn in_process(upstream: u16, lifecycle: &str) -> anyhow::Result<PerSession> {
    use toolgate::upstream::{CallRequest, Label, connect};
    let env: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let yaml = format!(
        "listen: \"127.0.0.1:0\"\ntenants:\n  - name: bench\n    tokens: [bench-token]\n    servers:\n      - name: s\n        url: \"http://127.0.0.1:{upstream}/mcp\"\n        lifecycle: {lifecycle}\n"
    );
    let config =
        toolgate::config::Config::from_yaml(&yaml, "pairs.yaml", std::path::Path::new("."), &env)?;
    let server = &config.tenants[0].servers[0];
    let redactor: toolgate::credentials::SharedRedactor =
        std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(Default::default()));
    let metrics = tokio::runtime::Handle::current().metrics();
    let pid = std::process::id();
    // One session first: the shared HTTP client and its pool, rmcp's
    // statics and the allocator's arenas are not any one session's cost.
    let warm = connect(
        server,
        &Label {
            tenant: "warm".into(),
            server: "s".into(),
        },
        &env,
        1 << 20,
        &redactor,
    )
    .await?;
    tokio::time::sleep(SETTLE).await;
    let read = || {
        (
            metrics.num_alive_tasks() as f64,
            crate::alloc::live_bytes() as f64 / 1024.0,
            connections_to(pid, &[upstream]) as f64,
        )
    };
    let before = read();
    let mut sessions = Vec::with_capacity(IN_PROCESS);
    for i in 0..IN_PROCESS {
        let label = Label {
            tenant: format!("t{i}"),
            server: "s".into(),
        };
        sessions.push(connect(server, &label, &env, 1 << 20, &redactor).await?);
    }
    tokio::time::sleep(SETTLE).await;
    let connected = read();
    for connected in &sessions {
        let mut arguments = serde_json::Map::new();
        arguments.insert("message".into(), "hello".into());
        let call = CallRequest::new("echo", arguments, Duration::from_secs(10));
        connected.session.call(&call).await?;
    }
    let in_use = read();
    tokio::time::sleep(SETTLE).await;
    let called = read();
    for connected in &sessions {
        connected.session.close().await;
    }
    warm.session.close().await;
    drop((sessions, warm));
    let n = IN_PROCESS as f64;
    let per = |at: (f64, f64, f64)| {
        (
            (at.0 - before.0) / n,
            (at.1 - before.1) / n,
            (at.2 - before.2) / n,
        )
    };
    Ok(PerSession {
        idle: per(connected),
        in_use: per(in_use),
        idle_after: per(called),
    })
}

/// Runs the figures `rounds` times with `tenants` tenants × 2 pairs and
/// prints their rows of the targets table (`| target | figure | goal | |`).
///
/// # Errors
/// When a process does not start, sessions never all connect, or a call
/// fails.
pub async fn report(rounds: usize, tenants: usize) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("toolgate-bench-pairs-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (server, upstream) = fast_http_server(0);
    wait_port(upstream).await;
    let mut idle = Vec::new();
    // By revision, then by `CONNECTS`.
    let mut lives: [[Vec<Live>; 2]; 2] = Default::default();
    let mut sessions: [Vec<PerSession>; 2] = Default::default();
    for round in 0..rounds.max(1) {
        eprintln!(
            "round {}: idle pairs, {tenants} tenants × 2, baseline",
            round + 1
        );
        idle.push(baseline(&dir, tenants, upstream).await?);
        for (i, (revision, lifecycle)) in REVISIONS.into_iter().enumerate() {
            eprintln!("round {}: idle pairs, {revision} ({lifecycle})", round + 1);
            for (j, connect) in CONNECTS.into_iter().enumerate() {
                lives[i][j].push(live(&dir, tenants, upstream, lifecycle, connect).await?);
            }
            sessions[i].push(in_process(upstream, lifecycle).await?);
        }
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);

    let pairs = (tenants * 2) as f64;
    let base = median(idle.iter().map(|p| p.rss_mib).collect());
    let base_threads = median(idle.iter().map(|p| p.threads).collect());
    let scope = format!("{tenants} tenants × 2 live pairs");
    println!(
        "| {scope}: idle baseline (same configuration, `connect: lazy`, no call): RSS / threads | {} MiB / {} | | |",
        fmt(base, 1),
        fmt(base_threads, 0)
    );
    // RSS over idle of the connected pairs, by revision and `CONNECTS`.
    let mut over = [[0.0; 2]; 2];
    for (i, (revision, lifecycle)) in REVISIONS.into_iter().enumerate() {
        for (j, connect) in CONNECTS.into_iter().enumerate() {
            let at = |f: fn(&Live) -> Process, g: fn(&Process) -> f64| {
                median(lives[i][j].iter().map(|l| g(&f(l))).collect())
            };
            for (when, moment) in [
                (
                    "connected",
                    (|l: &Live| l.connected) as fn(&Live) -> Process,
                ),
                ("idle after one call per pair", |l: &Live| l.called),
            ] {
                let rss = at(moment, |p| p.rss_mib) - base;
                if when == "connected" {
                    over[i][j] = rss;
                }
                println!(
                    "| {scope}, {revision} (`lifecycle: {lifecycle}`, `connect: {connect}`), {when}: RSS over idle (per pair) / threads / TCP connections to the upstream | {} MiB ({} KiB) / {} / {} | | |",
                    fmt(rss, 1),
                    fmt(rss * 1024.0 / pairs, 1),
                    fmt(at(moment, |p| p.threads), 0),
                    fmt(at(moment, |p| p.connections), 0)
                );
            }
        }
        for (when, at) in [
            (
                "idle after connect",
                (|s: &PerSession| s.idle) as fn(&PerSession) -> (f64, f64, f64),
            ),
            ("right after a call", |s: &PerSession| s.in_use),
            ("idle after a call", |s: &PerSession| s.idle_after),
        ] {
            let per = |f: fn((f64, f64, f64)) -> f64| {
                median(sessions[i].iter().map(|s| f(at(s))).collect())
            };
            println!(
                "| one {revision} session in process, {when}: tasks / heap KiB / TCP connections | {} / {} / {} | | |",
                fmt(per(|t| t.0), 2),
                fmt(per(|t| t.1), 1),
                fmt(per(|t| t.2), 2)
            );
        }
    }
    for (j, connect) in CONNECTS.into_iter().enumerate() {
        println!(
            "| {scope}, `connect: {connect}`: RSS over idle, 2026-07-28 / 2025-11-25 | {} | | |",
            fmt(over[0][j] / over[1][j], 2)
        );
        for (i, (revision, _)) in REVISIONS.into_iter().enumerate() {
            let scaled = over[i][j] * 2000.0 / pairs;
            println!(
                "| 1,000 tenants × 2 live {revision} pairs, `connect: {connect}`: RSS over idle{} | {} MiB | ≤ {} MiB | {} |",
                if tenants == 1000 {
                    ""
                } else {
                    " (scaled from this run)"
                },
                fmt(scaled, 1),
                GOAL_MIB[i],
                super::report::verdict(scaled <= GOAL_MIB[i])
            );
        }
    }
    Ok(())
}
