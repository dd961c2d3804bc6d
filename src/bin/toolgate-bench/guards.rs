//! What one guard costs a call (`--only-guards`): one gateway in front of
//! the fast stdio server with two tenants on it, `bench` without a guard
//! and `bench-guard` with one (`guards: [allow]`), and that guard served in
//! this process on 127.0.0.1 (tonic, `toolgate::pb::guard::server`),
//! answering `allow` to every check and counting them. Interleaved rounds
//! of InvokeTool: p50 and p99 of sequential calls, calls/s and the
//! gateway's CPU per call at 16 in flight; then the ratios guard / none.
//!
//! The guard's own work (decoding a check, answering) is in this process,
//! not the gateway's: the gateway's CPU per call is what asking a guard
//! adds to toolgate (the channel, the request's JSON, the answer's
//! handling). The guard's count of checks shows whether the gateway asked
//! it (two per guarded call: the request and the response phase).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use toolgate::pb;
use toolgate::pb::guard::server::guard_service_server::{GuardService, GuardServiceServer};

use super::measure::{self, CallFn, median};
use super::policy::{Client, invoke};
use super::report::fmt;

/// Calls in flight of the throughput run.
const IN_FLIGHT: usize = 16;

/// A guard that allows everything and counts what it was asked.
#[derive(Debug, Default)]
struct AllowAll {
    checks: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl GuardService for AllowAll {
    async fn check(
        &self,
        request: tonic::Request<pb::guard::CheckRequest>,
    ) -> Result<tonic::Response<pb::guard::CheckResponse>, tonic::Status> {
        std::hint::black_box(request.into_inner());
        self.checks.fetch_add(1, Ordering::Relaxed);
        Ok(tonic::Response::new(pb::guard::CheckResponse {
            verdict: Some(pb::guard::check_response::Verdict::Allow(
                pb::guard::Allow {},
            )),
        }))
    }
}

/// [`AllowAll`] served on 127.0.0.1; stopped on drop.
struct InProcessGuard {
    port: u16,
    checks: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcessGuard {
    async fn start() -> anyhow::Result<InProcessGuard> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let guard = AllowAll::default();
        let checks = guard.checks.clone();
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(GuardServiceServer::new(guard))
                .serve_with_incoming(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                )
                .await;
            if let Err(e) = served {
                eprintln!("guards: the in-process guard stopped: {e}");
            }
        });
        Ok(InProcessGuard { port, checks, task })
    }

    /// Asks the guard once itself, so that a count of zero later means
    /// the gateway did not ask, not that the guard does not answer.
    async fn self_check(&self) -> anyhow::Result<()> {
        use pb::guard::guard_service_client::GuardServiceClient;
        let mut client =
            GuardServiceClient::connect(format!("http://127.0.0.1:{}", self.port)).await?;
        let answer = client
            .check(pb::guard::CheckRequest {
                phase: pb::guard::Phase::Request as i32,
                arguments_json: "{}".to_owned(),
                ..Default::default()
            })
            .await?
            .into_inner();
        anyhow::ensure!(
            matches!(
                answer.verdict,
                Some(pb::guard::check_response::Verdict::Allow(_))
            ),
            "the in-process guard answered {answer:?}"
        );
        Ok(())
    }

    fn checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }
}

impl Drop for InProcessGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One measured tenant of the gateway and its figures over rounds.
struct Tenant {
    name: &'static str,
    call: CallFn,
    p50: Vec<f64>,
    p99: Vec<f64>,
    rps: Vec<f64>,
    cpu_ms: Vec<f64>,
}

impl Tenant {
    fn new(name: &'static str, call: CallFn) -> Tenant {
        Tenant {
            name,
            call,
            p50: Vec::new(),
            p99: Vec::new(),
            rps: Vec::new(),
            cpu_ms: Vec::new(),
        }
    }

    /// One round: `sequential` calls one after another, then `duration`
    /// at [`IN_FLIGHT`] with the gateway's CPU; the number of calls made.
    async fn measure(
        &mut self,
        gateway: u32,
        sequential: usize,
        duration: Duration,
    ) -> anyhow::Result<u64> {
        let latency = measure::sequential(&self.call, sequential).await?;
        self.p50.push(latency.p50);
        self.p99.push(latency.p99);
        let before = measure::cpu_seconds(gateway);
        let (rate, calls) = measure::throughput(&self.call, IN_FLIGHT, duration).await?;
        let after = measure::cpu_seconds(gateway);
        self.rps.push(rate);
        self.cpu_ms
            .push((after - before) * 1000.0 / calls.max(1) as f64);
        Ok(sequential as u64 + calls)
    }

    /// The medians: p50, p99, calls/s, CPU ms per call.
    fn figures(&self) -> [f64; 4] {
        [
            median(self.p50.clone()),
            median(self.p99.clone()),
            median(self.rps.clone()),
            median(self.cpu_ms.clone()),
        ]
    }
}

/// Until `call` succeeds (the tenant's server is listed), at most 30 s.
async fn until_ready(name: &str, call: &CallFn) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    loop {
        match call().await {
            Ok(()) => return Ok(()),
            Err(e) => anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "{name}: fast__echo never answered: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the figures and prints their rows of the targets table.
///
/// # Errors
/// When the guard or the gateway does not start, or a call fails (with
/// the guard's `failure: closed`, a guard that cannot be asked fails the
/// call, so a broken guard path does not pass for a fast one).
pub async fn report(rounds: usize, sequential: usize, duration: Duration) -> anyhow::Result<()> {
    let guard = InProcessGuard::start().await?;
    guard.self_check().await?;
    let exe = super::harness::exe().display().to_string();
    let servers = format!("      - name: fast\n        command: [\"{exe}\", \"mcp-server\"]\n");
    let port = super::harness::free_port();
    let dir = std::env::temp_dir().join(format!(
        "toolgate-bench-guards-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n\
             guards:\n  - name: allow\n    url: \"http://127.0.0.1:{}\"\n    failure: closed\n\
             tenants:\n\
             \x20 - name: bench\n    tokens: [bench-token]\n    servers:\n{servers}\
             \x20 - name: bench-guard\n    tokens: [guard-token]\n    guards: [allow]\n    servers:\n{servers}",
            guard.port
        ),
    )?;
    let gateway = super::harness::spawn_gateway(&config);
    super::harness::wait_port(port).await;
    let client: Client = super::harness::grpc(port).await;
    let mut tenants = [
        Tenant::new("no guard", invoke(client.clone(), "bench-token")),
        Tenant::new("one guard", invoke(client.clone(), "guard-token")),
    ];
    for tenant in &tenants {
        until_ready(tenant.name, &tenant.call).await?;
        measure::sequential(&tenant.call, sequential.div_ceil(5)).await?;
    }
    let mut guarded_calls = 0;
    let checks_before = guard.checks();
    for round in 0..rounds.max(1) {
        for (index, tenant) in tenants.iter_mut().enumerate() {
            eprintln!("round {}: guards: {}", round + 1, tenant.name);
            let calls = tenant.measure(gateway.pid(), sequential, duration).await?;
            if index == 1 {
                guarded_calls += calls;
            }
        }
    }
    let checks = guard.checks() - checks_before;
    drop(gateway);
    let _ = std::fs::remove_dir_all(&dir);

    let [none, one] = [tenants[0].figures(), tenants[1].figures()];
    let rows: [(&str, usize, usize); 4] = [
        ("InvokeTool p50 ms, fast stdio", 0, 3),
        ("InvokeTool p99 ms, fast stdio", 1, 3),
        ("calls/s @16", 2, 0),
        ("gateway CPU ms/call @16", 3, 3),
    ];
    for (what, index, digits) in rows {
        let (a, b) = (one[index], none[index]);
        let added = if index == 2 {
            String::new()
        } else {
            format!(", {} added", fmt(a - b, 3))
        };
        println!(
            "| {what}: one guard {} / no guard {} | {}{added} | | |",
            fmt(a, digits),
            fmt(b, digits),
            fmt(a / b, 2)
        );
    }
    let per_call = checks as f64 / guarded_calls.max(1) as f64;
    let asked = if checks == 0 {
        "the gateway never asked the guard: these figures are of no guard"
    } else {
        "two per call when both phases are asked"
    };
    println!(
        "| guard checks during the guarded runs: {checks} for {guarded_calls} calls | {} per call | | {asked} |",
        fmt(per_call, 2)
    );
    Ok(())
}
