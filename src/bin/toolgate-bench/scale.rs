//! The large-scale run: 10,000 configured tenants (`connect: lazy`), 2,000
//! of them called over HTTP with `sessions.max_live: 1500`, so sessions are
//! evicted and reopened while calls run. 64 calls in flight for the run's
//! duration, each to a tenant drawn uniformly at random from the 2,000
//! (every fifth configured tenant), on two fast HTTP upstreams. Reports
//! calls/s, p50/p99, the gateway's RSS (peak and at the end), session
//! opens, reopens and evictions from its /metrics, and failed calls by
//! status. A call failing with anything but `UNAVAILABLE` or
//! `DEADLINE_EXCEEDED` (what overload may answer) fails the run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tonic_types::StatusExt;
use toolgate::pb;

use super::measure;

/// Configured tenants.
const TENANTS: usize = 10_000;
/// Tenants called (every `TENANTS / ACTIVE`-th).
const ACTIVE: usize = 2_000;
/// `sessions.max_live`.
const MAX_LIVE: usize = 1_500;
/// Calls in flight.
const IN_FLIGHT: usize = 64;
/// Fast HTTP upstreams the tenants are spread over.
const UPSTREAMS: usize = 2;
/// Each call's deadline (a lazy connect waits at most 10 s).
const CALL_DEADLINE: Duration = Duration::from_secs(20);

/// What one run measured.
#[derive(Debug, Default)]
struct Figures {
    calls: u64,
    seconds: f64,
    latencies_ms: Vec<f64>,
    /// Failed calls by `CODE (reason)`.
    errors: BTreeMap<String, u64>,
    /// Failures that are not an expected status: `CODE (reason): message`.
    unexpected: Vec<String>,
    peak_rss_mib: f64,
    end_rss_mib: f64,
    /// CPU seconds of the gateway during the run.
    gateway_cpu: f64,
    /// CPU seconds of the upstream servers during the run.
    upstream_cpu: f64,
    metrics: Metrics,
    /// `toolgate_upstream_session_up` summed after [`SETTLE`] without calls.
    settled_live: f64,
    /// Established TCP connections from the gateway to the upstreams then.
    settled_connections: usize,
}

/// How long the gateway is left without calls before the settled figures
/// (its reaper enforces `max_live` every second).
const SETTLE: Duration = Duration::from_secs(3);

/// Session figures from the gateway's /metrics at the end of the run.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// `toolgate_upstream_connects_total{result="ok"}`: sessions opened.
    opened: f64,
    /// `toolgate_upstream_connects_total{result="failed"}`.
    failed: f64,
    /// `toolgate_upstream_reconnects_total`: retries after a failure or loss.
    reconnects: f64,
    /// `toolgate_upstream_session_lost_total`.
    lost: f64,
    /// Sum of `toolgate_upstream_session_up`: live at the end.
    pub(crate) live: f64,
    /// Series of `toolgate_upstream_session_up`: tenant × server pairs
    /// that ever connected.
    ever_connected: f64,
}

impl Metrics {
    /// Parses the Prometheus or OpenMetrics text of `GET /metrics`.
    fn parse(text: &str) -> Metrics {
        let mut m = Metrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let name = series.split('{').next().unwrap_or("");
            match name {
                "toolgate_upstream_connects_total" | "toolgate_upstream_connects" => {
                    if series.contains("result=\"ok\"") {
                        m.opened += value;
                    } else {
                        m.failed += value;
                    }
                }
                "toolgate_upstream_reconnects_total" | "toolgate_upstream_reconnects" => {
                    m.reconnects += value;
                }
                "toolgate_upstream_session_lost_total" | "toolgate_upstream_session_lost" => {
                    m.lost += value;
                }
                "toolgate_upstream_session_up" => {
                    m.live += value;
                    m.ever_connected += 1.0;
                }
                _ => {}
            }
        }
        m
    }

    /// Sessions closed by the gateway (evicted for `max_live`; the idle
    /// timeout, 15 minutes, does not pass during a run).
    fn evicted(&self) -> f64 {
        self.opened - self.live - self.lost
    }

    /// Sessions opened again for a tenant × server that had one before.
    fn reopened(&self) -> f64 {
        self.opened - self.ever_connected
    }
}

/// Writes the configuration; returns (path, gRPC port, metrics port).
fn config(
    dir: &std::path::Path,
    upstreams: &[u16],
) -> anyhow::Result<(std::path::PathBuf, u16, u16)> {
    let port = super::harness::free_port();
    let metrics_port = super::harness::free_port();
    let mut yaml = format!(
        "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nmetrics:\n  listen: \"127.0.0.1:{metrics_port}\"\n\
         sessions:\n  max_live: {MAX_LIVE}\ndefaults:\n  connect: lazy\ntenants:\n"
    );
    for t in 0..TENANTS {
        let upstream = upstreams[t % upstreams.len()];
        yaml.push_str(&format!(
            "  - name: t{t}\n    tokens: [{}]\n    servers:\n      - name: s0\n        url: \"http://127.0.0.1:{upstream}/mcp\"\n",
            token(t)
        ));
    }
    let path = dir.join("scale.yaml");
    std::fs::write(&path, yaml)?;
    Ok((path, port, metrics_port))
}

fn token(tenant: usize) -> String {
    format!("token-{tenant:05}-scale")
}

/// A small xorshift generator: uniform enough to pick tenants.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// `CODE (reason)` of a failed call, from its `ErrorInfo` when present.
fn describe(status: &tonic::Status) -> String {
    let reason = status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
        .unwrap_or_else(|| "no ErrorInfo".to_owned());
    format!("{:?} ({reason})", status.code())
}

/// Worker results: latencies of successful calls, failures as (label,
/// expected, message).
type WorkerResult = (Vec<f64>, Vec<(String, bool, String)>);

async fn worker(
    client: pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    seed: u64,
    deadline: Instant,
) -> WorkerResult {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut latencies = Vec::new();
    let mut failures = Vec::new();
    while Instant::now() < deadline {
        let tenant = (next(&mut state) as usize % ACTIVE) * (TENANTS / ACTIVE);
        let mut request = tonic::Request::new(pb::InvokeToolRequest {
            name: "s0__echo".into(),
            arguments_json: r#"{"message":"hello"}"#.into(),
            ..Default::default()
        });
        request.set_timeout(CALL_DEADLINE);
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", token(tenant)).parse().expect("ascii"),
        );
        let started = Instant::now();
        let result = tokio::time::timeout(
            CALL_DEADLINE + Duration::from_secs(5),
            client.clone().invoke_tool(request),
        )
        .await;
        match result {
            Ok(Ok(_)) => latencies.push(started.elapsed().as_secs_f64() * 1000.0),
            Ok(Err(status)) => {
                let expected = matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                );
                failures.push((
                    describe(&status),
                    expected,
                    format!("tenant t{tenant}: {}", status.message()),
                ));
            }
            Err(_) => failures.push((
                "no answer within the deadline + 5 s".to_owned(),
                false,
                format!("tenant t{tenant}"),
            )),
        }
    }
    (latencies, failures)
}

pub(crate) async fn scrape(port: u16) -> anyhow::Result<Metrics> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(Metrics::parse(&text))
}

async fn run(duration: Duration) -> anyhow::Result<Figures> {
    let dir = std::env::temp_dir().join(format!("toolgate-bench-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut upstreams = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..UPSTREAMS {
        let (server, port) = super::harness::fast_http_server(0);
        super::harness::wait_port(port).await;
        upstreams.push(server);
        ports.push(port);
    }
    let (config, port, metrics_port) = config(&dir, &ports)?;
    let mut gateway = super::harness::spawn_gateway(&config);
    super::harness::wait_port(port).await;
    super::harness::wait_port(metrics_port).await;
    let client = super::harness::grpc(port).await;

    let upstream_cpu = || -> f64 {
        upstreams
            .iter()
            .map(|u| measure::cpu_seconds(u.pid()))
            .sum()
    };
    let (gateway_before, upstream_before) = (measure::cpu_seconds(gateway.pid()), upstream_cpu());
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|i| tokio::spawn(worker(client.clone(), i as u64 + 1, deadline)))
        .collect();
    let mut figures = Figures::default();
    for w in workers {
        let (latencies, failures) = w.await?;
        figures.latencies_ms.extend(latencies);
        for (label, expected, message) in failures {
            if !expected && figures.unexpected.len() < 10 {
                figures.unexpected.push(format!("{label}: {message}"));
            }
            *figures.errors.entry(label).or_default() += 1;
        }
    }
    figures.seconds = started.elapsed().as_secs_f64();
    figures.calls = figures.latencies_ms.len() as u64;
    figures.gateway_cpu = measure::cpu_seconds(gateway.pid()) - gateway_before;
    figures.upstream_cpu = upstream_cpu() - upstream_before;
    if let Some(status) = gateway.0.try_wait()? {
        anyhow::bail!("large-scale run: the gateway exited during the run ({status})");
    }
    figures.peak_rss_mib = measure::peak_rss_mib(gateway.pid());
    figures.end_rss_mib = measure::rss_mib(gateway.pid());
    figures.metrics = scrape(metrics_port).await?;
    tokio::time::sleep(SETTLE).await;
    figures.settled_live = scrape(metrics_port).await?.live;
    figures.settled_connections = connections_to(gateway.pid(), &ports);
    drop((gateway, upstreams));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(figures)
}

/// Established TCP connections (IPv4) in `pid`'s network namespace whose
/// remote port is one of `ports`: the client side of connections to the
/// upstreams, all the gateway's.
pub(crate) fn connections_to(pid: u32, ports: &[u16]) -> usize {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = fields
                .get(2)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            fields.get(3) == Some(&"01") && remote_port.is_some_and(|p| ports.contains(&p))
        })
        .count()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// Runs the large-scale figure for `duration` and prints its rows of the
/// targets table (`| target | figure | goal | |`).
///
/// # Errors
/// When the setup fails, the gateway exits, or any call failed with a
/// status other than `UNAVAILABLE` or `DEADLINE_EXCEEDED` (after printing
/// the figures).
pub async fn report(duration: Duration) -> anyhow::Result<()> {
    eprintln!(
        "large scale: {TENANTS} tenants, {ACTIVE} active over HTTP, max_live {MAX_LIVE}, {IN_FLIGHT} in flight for {duration:?}"
    );
    let mut f = run(duration).await?;
    f.latencies_ms.sort_by(f64::total_cmp);
    let fmt = super::report::fmt;
    let scope = format!("large scale ({TENANTS} tenants, {ACTIVE} active, max_live {MAX_LIVE})");
    println!(
        "| {scope}: calls/s, {IN_FLIGHT} in flight, {}s | {} ({} calls) | | |",
        fmt(duration.as_secs_f64(), 0),
        fmt(f.calls as f64 / f.seconds, 0),
        f.calls
    );
    println!(
        "| {scope}: p50 / p99 | {} / {} ms | | |",
        fmt(percentile(&f.latencies_ms, 0.5), 3),
        fmt(percentile(&f.latencies_ms, 0.99), 3)
    );
    println!(
        "| {scope}: gateway RSS peak / end | {} / {} MiB | | |",
        fmt(f.peak_rss_mib, 1),
        fmt(f.end_rss_mib, 1)
    );
    let per_call =
        |cpu: f64| cpu * 1000.0 / (f.calls + f.errors.values().sum::<u64>()).max(1) as f64;
    println!(
        "| {scope}: CPU ms/call, gateway / the {UPSTREAMS} upstreams (cores used: {} / {}) | {} / {} ms | | |",
        fmt(f.gateway_cpu / f.seconds, 2),
        fmt(f.upstream_cpu / f.seconds, 2),
        fmt(per_call(f.gateway_cpu), 3),
        fmt(per_call(f.upstream_cpu), 3)
    );
    let m = &f.metrics;
    println!(
        "| {scope}: sessions opened / reopened / evicted / live at end | {} / {} / {} / {} | | |",
        m.opened,
        m.reopened(),
        m.evicted(),
        m.live
    );
    println!(
        "| {scope}: {}s after the last call: live sessions (metric) / TCP connections to the upstreams | {} / {} | | |",
        SETTLE.as_secs(),
        f.settled_live,
        f.settled_connections
    );
    println!(
        "| {scope}: connects failed / reconnects / sessions lost | {} / {} / {} | | |",
        m.failed, m.reconnects, m.lost
    );
    let failed: u64 = f.errors.values().sum();
    let detail = if f.errors.is_empty() {
        String::new()
    } else {
        format!(
            " ({})",
            f.errors
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    println!(
        "| {scope}: failed calls | {failed}{detail} | 0 | {} |",
        super::report::verdict(failed == 0)
    );
    anyhow::ensure!(
        f.unexpected.is_empty(),
        "large-scale run: calls failed with an unexpected status: {}",
        f.unexpected.join("; ")
    );
    anyhow::ensure!(f.calls > 0, "large-scale run: no call succeeded");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_metric_formats() {
        let text = "# TYPE toolgate_upstream_connects counter\n\
            toolgate_upstream_connects_total{tenant=\"t0\",server=\"s0\",result=\"ok\"} 3\n\
            toolgate_upstream_connects_total{tenant=\"t5\",server=\"s0\",result=\"failed\"} 1\n\
            toolgate_upstream_reconnects_total{tenant=\"t5\",server=\"s0\"} 1\n\
            toolgate_upstream_session_up{tenant=\"t0\",server=\"s0\"} 1\n\
            toolgate_upstream_session_up{tenant=\"t5\",server=\"s0\"} 0\n\
            toolgate_upstream_session_lost{tenant=\"t5\",server=\"s0\"} 1\n";
        let m = Metrics::parse(text);
        assert_eq!(
            (m.opened, m.failed, m.reconnects, m.lost),
            (3.0, 1.0, 1.0, 1.0)
        );
        assert_eq!((m.live, m.ever_connected), (1.0, 2.0));
        assert_eq!(m.evicted(), 1.0);
        assert_eq!(m.reopened(), 1.0);
    }
}
