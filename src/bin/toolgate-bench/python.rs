//! The Python-client figure: a grpcio client (`grpc.aio`, 16 calls in
//! flight, bench/python/grpc_load.py) drives the bare tonic echo floor and
//! `toolgate → fast stdio`, interleaved in the same rounds. Reports calls
//! per second and CPU per call from /proc (the serving processes; for the
//! gateway path also the gateway alone), and the target ratio: gateway
//! CPU per call / echo server CPU per call.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::measure::{self, median};

/// Calls in flight of the Python client.
pub(crate) const IN_FLIGHT: usize = 16;
/// The shortest timed run: the Python client makes a few thousand calls
/// per second at most, and /proc counts CPU in 10 ms ticks.
pub(crate) const MIN_RUN: Duration = Duration::from_secs(5);
/// The gateway path's name in the results.
const GATEWAY_PATH: &str = "toolgate → fast stdio";
/// The floor's name in the results.
const FLOOR_PATH: &str = "floor: bare tonic echo";

/// A running bench/python/grpc_load.py, ready for runs.
pub(crate) struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    target: &'static str,
}

/// One timed run of the Python client.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct Run {
    /// Calls made.
    pub(crate) calls: u64,
    /// Seconds the run took.
    pub(crate) seconds: f64,
    #[serde(default)]
    errors: std::collections::BTreeMap<String, u64>,
    first_error: Option<String>,
}

impl Client {
    /// Starts the client against `port`, calling `name`; returns once its
    /// warm-up calls succeeded.
    pub(crate) async fn start(
        target: &'static str,
        port: u16,
        name: &str,
        token: Option<&str>,
        duration: Duration,
    ) -> anyhow::Result<Client> {
        let python = super::harness::repo().join(".venv/bin/python");
        anyhow::ensure!(
            python.is_file(),
            "Python client: {} is missing (tests/setup.sh creates the venv with grpcio)",
            python.display()
        );
        let script = super::harness::repo().join("bench/python/grpc_load.py");
        let mut command = tokio::process::Command::new(&python);
        command
            .arg(&script)
            .args(["--addr", &format!("127.0.0.1:{port}"), "--name", name])
            .args(["--in-flight", &IN_FLIGHT.to_string()])
            .args(["--duration", &duration.as_secs_f64().to_string()]);
        if let Some(token) = token {
            command.args(["--token", token]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!("Python client: cannot start {}: {e}", python.display())
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let mut client = Client {
            child,
            stdin,
            stdout,
            target,
        };
        let line = client.line(Duration::from_secs(120)).await?;
        anyhow::ensure!(
            line == "ready",
            "Python client for {target}: expected `ready`, got {line:?}"
        );
        Ok(client)
    }

    /// The next line on the client's stdout, within `limit`.
    async fn line(&mut self, limit: Duration) -> anyhow::Result<String> {
        let target = self.target;
        match tokio::time::timeout(limit, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => {
                let status = self.child.wait().await?;
                anyhow::bail!(
                    "Python client for {target} ended ({status}); its error is on stderr above"
                )
            }
            Ok(Err(e)) => anyhow::bail!("Python client for {target}: reading its output: {e}"),
            Err(_) => anyhow::bail!("Python client for {target}: no answer within {limit:?}"),
        }
    }

    /// One timed run; fails if any call failed.
    pub(crate) async fn run(&mut self, duration: Duration) -> anyhow::Result<Run> {
        self.stdin.write_all(b"go\n").await?;
        self.stdin.flush().await?;
        let line = self.line(duration + Duration::from_secs(60)).await?;
        let run: Run = serde_json::from_str(&line).map_err(|e| {
            anyhow::anyhow!(
                "Python client for {}: bad result {line:?}: {e}",
                self.target
            )
        })?;
        anyhow::ensure!(
            run.errors.is_empty(),
            "Python client for {}: calls failed {:?} (first: {})",
            self.target,
            run.errors,
            run.first_error.as_deref().unwrap_or("?")
        );
        anyhow::ensure!(
            run.calls > 0,
            "Python client for {}: no call made",
            self.target
        );
        Ok(run)
    }
}

/// The medians over rounds for one target.
#[derive(Debug, Default)]
struct Figures {
    rps: Vec<f64>,
    cpu_ms: Vec<f64>,
    gateway_cpu_ms: Vec<f64>,
}

/// One target: its client and the processes whose CPU counts.
struct Target {
    client: Client,
    serving: Vec<u32>,
    gateway: Option<u32>,
    figures: Figures,
}

impl Target {
    async fn measure(&mut self, duration: Duration) -> anyhow::Result<()> {
        let serving_before: f64 = self.serving.iter().map(|p| measure::cpu_seconds(*p)).sum();
        let gateway_before = self.gateway.map(measure::cpu_seconds);
        let run = self.client.run(duration).await?;
        let serving_after: f64 = self.serving.iter().map(|p| measure::cpu_seconds(*p)).sum();
        let per_call = |seconds: f64| seconds * 1000.0 / run.calls as f64;
        self.figures.rps.push(run.calls as f64 / run.seconds);
        self.figures
            .cpu_ms
            .push(per_call(serving_after - serving_before));
        if let (Some(pid), Some(before)) = (self.gateway, gateway_before) {
            self.figures
                .gateway_cpu_ms
                .push(per_call(measure::cpu_seconds(pid) - before));
        }
        Ok(())
    }
}

/// Runs the Python-client figure (runs of `duration`, at least 5 s) and prints its rows of the targets table
/// (`| target | figure | goal | |`).
pub async fn report(rounds: usize, duration: Duration) -> anyhow::Result<()> {
    let duration = duration.max(MIN_RUN);
    // The floor.
    let port = super::harness::free_port();
    let mut command = std::process::Command::new(super::harness::exe());
    command.args(["echo-server", &port.to_string()]);
    let echo = super::harness::spawn(command);
    super::harness::wait_port(port).await;
    let exe = super::harness::exe().display().to_string();
    let (gateway, gateway_port) = super::harness::gateway(&format!(
        "      - name: fast\n        command: [\"{exe}\", \"mcp-server\"]\n"
    ))
    .await;
    wait_connected(gateway_port).await?;
    let mut serving = vec![gateway.pid()];
    serving.extend(measure::children(gateway.pid()));

    let mut targets = [
        Target {
            client: Client::start(FLOOR_PATH, port, "echo", None, duration).await?,
            serving: vec![echo.pid()],
            gateway: None,
            figures: Figures::default(),
        },
        Target {
            client: Client::start(
                GATEWAY_PATH,
                gateway_port,
                "fast__echo",
                Some("bench-token"),
                duration,
            )
            .await?,
            serving,
            gateway: Some(gateway.pid()),
            figures: Figures::default(),
        },
    ];
    for round in 0..rounds.max(1) {
        for target in &mut targets {
            eprintln!(
                "round {}: Python client → {}",
                round + 1,
                target.client.target
            );
            target.measure(duration).await?;
        }
    }
    // What the gateway holds once the load is over, and its peak.
    let gateway_rss = (
        measure::rss_mib(gateway.pid()),
        measure::peak_rss_mib(gateway.pid()),
    );
    let [floor, via] = targets.map(|t| t.figures);
    let floor_cpu = median(floor.cpu_ms);
    let gateway_cpu = median(via.gateway_cpu_ms);
    println!(
        "| Python client (grpc.aio, {IN_FLIGHT} in flight): calls/s, {FLOOR_PATH} | {} | | |",
        super::report::fmt(median(floor.rps), 0)
    );
    println!(
        "| Python client: calls/s, {GATEWAY_PATH} | {} | | |",
        super::report::fmt(median(via.rps), 0)
    );
    println!(
        "| Python client: CPU ms/call, echo server / gateway only / gateway + upstream | {} / {} / {} ms | | |",
        super::report::fmt(floor_cpu, 3),
        super::report::fmt(gateway_cpu, 3),
        super::report::fmt(median(via.cpu_ms), 3)
    );
    println!(
        "| Python client: gateway RSS after load / peak (VmRSS / VmHWM) | {} / {} MiB | | |",
        super::report::fmt(gateway_rss.0, 1),
        super::report::fmt(gateway_rss.1, 1)
    );
    let ratio = gateway_cpu / floor_cpu;
    println!(
        "| Python client: gateway CPU per call / bare tonic echo CPU per call | {} | ≤ 1.6 | {} |",
        super::report::fmt(ratio, 2),
        super::report::verdict(ratio <= 1.6)
    );
    drop((echo, gateway));
    Ok(())
}

/// Waits until the bench tenant's servers are connected (at most 30 s).
pub(crate) async fn wait_connected(port: u16) -> anyhow::Result<()> {
    let mut client = super::harness::grpc(port).await;
    let started = std::time::Instant::now();
    loop {
        if let Ok(r) = client
            .list_tools(super::harness::authed(
                toolgate::pb::ListToolsRequest::default(),
            ))
            .await
            && !r.get_ref().servers.is_empty()
            && r.get_ref().servers.iter().all(|s| s.connected)
        {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "{GATEWAY_PATH}: the upstream never connected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
