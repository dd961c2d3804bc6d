//! Tenants at scale (`--only-store`): tenants in a real PostgreSQL behind
//! the admin API, followed by two replicas, and a `tenants_dir` of many
//! files. In one run:
//!
//! - start to `SERVING` and RSS before traffic, 100,000 tenants stored;
//! - the first call of a tenant not yet loaded against the next call of
//!   the same tenant (loaded, its upstream session up), per tenant, median
//!   and p90 over many tenants;
//! - two replicas serving calls while tenants are written through the
//!   admin API at 1,000 writes a minute: failed calls, writes not applied
//!   on both, and write-to-applied on the other replica (p50, p99), seen
//!   from a caller (the tool's description carries the write's number);
//! - start to `SERVING` with 10,000 files in `tenants_dir`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use toolgate::pb;
use toolgate::pb::admin as admin_pb;

use crate::harness::{
    Proc, fast_http_server, free_port, grpc, serving_ms, spawn_gateway, wait_port,
};
use crate::measure;

/// Tenants stored for the start-up figures.
const STORED: usize = 100_000;
/// Tenants whose first call is measured.
const FIRST_CALLS: usize = 200;
/// Tenants written and called during the two-replica run.
const WORKING_SET: usize = 200;
/// Writes per minute in the two-replica run, and the run's length.
const WRITES_PER_MINUTE: u64 = 1_000;
const WRITE_RUN: Duration = Duration::from_secs(60);
/// Callers calling tools on each replica meanwhile.
const CALLERS: usize = 8;
/// Files in `tenants_dir` for its start-up figure.
const DIR_FILES: usize = 10_000;
/// A 32-byte state key in base64.
const STATE_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const ADMIN_TOKEN: &str = "bench-admin-token";

/// Runs the figures and prints their rows of the targets table.
///
/// # Errors
/// PostgreSQL cannot be started, a gateway does not serve, or a figure's
/// run fails.
pub async fn report() -> anyhow::Result<()> {
    let (upstream, upstream_port) = fast_http_server(0);
    wait_port(upstream_port).await;
    let url = format!("http://127.0.0.1:{upstream_port}/mcp");
    let pg = Postgres::start()?;
    let dir = std::env::temp_dir().join(format!("toolgate-bench-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let started = Instant::now();
    populate(&pg.url(), &url, STORED).await?;
    eprintln!(
        "toolgate-bench: {STORED} tenants stored in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // 1. Start with 100,000 stored tenants: SERVING, RSS before traffic.
    let spawned = Instant::now();
    let a = Replica::start(&dir, "a", &pg.url())?;
    let start_ms = serving_ms(a.port, spawned).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = measure::rss_mib(a.proc.pid());
    row(
        "start to SERVING, 100,000 tenants in PostgreSQL",
        format!("{start_ms:.0} ms"),
        "≤ 1 s",
        start_ms <= 1000.0,
    );
    row(
        "RSS before traffic, 100,000 tenants in PostgreSQL",
        format!("{rss_before:.1} MiB"),
        "≤ 64 MiB",
        rss_before <= 64.0,
    );

    // 2. First call of a tenant not yet loaded, against its next call.
    let client = grpc(a.port).await;
    warm(&client, 0).await?;
    let mut extra = Vec::with_capacity(FIRST_CALLS);
    for t in 1..=FIRST_CALLS {
        let first = timed_call(&client, t).await?;
        let loaded = timed_call(&client, t).await?;
        extra.push(first - loaded);
    }
    extra.sort_by(f64::total_cmp);
    let p50 = extra[extra.len() / 2];
    let p90 = extra[extra.len() * 9 / 10];
    row(
        "first call of a tenant not yet loaded minus a loaded tenant's call (p50 / p90)",
        format!("{p50:.2} / {p90:.2} ms"),
        "≤ 5 ms",
        p50 <= 5.0,
    );

    // 3. Two replicas, tenants written at 1,000 a minute while both serve.
    let b = Replica::start(&dir, "b", &pg.url())?;
    serving_ms(b.port, Instant::now()).await?;
    let (failed, calls, not_applied, lags) = two_replicas(&a, &b, &url).await?;
    row(
        "1,000 tenant writes a minute, two replicas: failed calls / writes not applied on both",
        format!("{failed} of {calls} / {not_applied}"),
        "0 / 0",
        failed == 0 && not_applied == 0,
    );
    let lag_p50 = measure::median(lags.clone());
    let mut sorted = lags;
    sorted.sort_by(f64::total_cmp);
    let lag_p99 = sorted
        .get(sorted.len().saturating_sub(1).min(sorted.len() * 99 / 100))
        .copied()
        .unwrap_or(f64::NAN);
    row(
        "write to applied on the other replica (p50 / p99)",
        format!("{lag_p50:.0} / {lag_p99:.0} ms"),
        "p99 ≤ 1 s",
        lag_p99 <= 1000.0,
    );
    drop((a, b));

    // 4. tenants_dir with 10,000 files.
    let dir_ms = tenants_dir(&dir, &url).await?;
    row(
        "tenants_dir with 10,000 files: start to SERVING",
        format!("{dir_ms:.0} ms"),
        "≤ 1 s",
        dir_ms <= 1000.0,
    );
    drop((pg, upstream));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn row(what: &str, figure: String, goal: &str, met: bool) {
    println!(
        "| {what} | {figure} | {goal} | {} |",
        if met { "met" } else { "**missed**" }
    );
}

/// The spec of bench tenant `t`: one token, one 2026-07-28 server;
/// `mark` goes into the `echo` tool's description.
fn spec(t: usize, url: &str, mark: u64) -> String {
    format!(
        "tokens: [{}]\nconnect: lazy\nservers:\n  - name: s\n    url: \"{url}\"\n    lifecycle: discover\n    overrides:\n      echo: {{description: \"write {mark}\"}}\n",
        token(t)
    )
}

fn token(t: usize) -> String {
    format!("bench-tenant-token-{t:06}")
}

/// Writes `n` tenants straight into the state store, 64 at a time.
async fn populate(pg_url: &str, url: &str, n: usize) -> anyhow::Result<()> {
    let keys = toolgate::state::KeyRing::from_base64(&[STATE_KEY])?;
    let store = toolgate::state::StateStore::connect(pg_url, keys).await?;
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..64 {
        let store = store.clone();
        let next = next.clone();
        let url = url.to_owned();
        workers.push(tokio::spawn(async move {
            loop {
                let t = next.fetch_add(1, Ordering::Relaxed) as usize;
                if t >= n {
                    return anyhow::Ok(());
                }
                let digest = toolgate::callers::TokenDigest::of(&token(t));
                store
                    .put_tenant(
                        &format!("t{t:06}"),
                        &spec(t, &url, 0),
                        toolgate::state::tenants::Expect::Absent,
                        &[digest],
                    )
                    .await?;
            }
        }));
    }
    for worker in workers {
        worker.await??;
    }
    store.close().await;
    Ok(())
}

/// A gateway replica on the PostgreSQL store, with the admin API.
struct Replica {
    proc: Proc,
    port: u16,
    admin_port: u16,
}

impl Replica {
    fn start(dir: &Path, name: &str, pg_url: &str) -> anyhow::Result<Replica> {
        let port = free_port();
        let admin_port = free_port();
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &config,
            format!(
                "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nstate:\n  url: \"{pg_url}\"\n  keys: [\"{STATE_KEY}\"]\nadmin:\n  listen: \"127.0.0.1:{admin_port}\"\n  tokens: [{ADMIN_TOKEN}]\ntenant_store:\n  max_loaded: 100000\n"
            ),
        )?;
        Ok(Replica {
            proc: spawn_gateway(&config),
            port,
            admin_port,
        })
    }
}

type Client = pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>;

fn call_request(t: usize) -> tonic::Request<pb::InvokeToolRequest> {
    let mut request = tonic::Request::new(pb::InvokeToolRequest {
        name: "s__echo".into(),
        arguments_json: r#"{"message":"hi"}"#.into(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(20));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token(t)).parse().expect("ascii"),
    );
    request
}

/// One call of tenant `t`, in milliseconds.
async fn timed_call(client: &Client, t: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let answer = client.clone().invoke_tool(call_request(t)).await?;
    anyhow::ensure!(!answer.get_ref().is_error, "tenant {t}: the tool failed");
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

/// Calls tenant `t` until a call succeeds (the gateway's first tenant
/// loads, its first session connects).
async fn warm(client: &Client, t: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        match client.clone().invoke_tool(call_request(t)).await {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() > Duration::from_secs(30) => {
                anyhow::bail!("tenant {t} never served: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn admin(
    port: u16,
) -> anyhow::Result<admin_pb::admin_client::AdminClient<tonic::transport::Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect()
        .await?;
    Ok(admin_pb::admin_client::AdminClient::new(channel))
}

fn admin_request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(20));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().expect("ascii"),
    );
    request
}

/// The description of tenant `t`'s `echo` tool on a replica.
async fn description(client: &Client, t: usize) -> Option<String> {
    let mut request = tonic::Request::new(pb::ListToolsRequest::default());
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token(t)).parse().ok()?,
    );
    let listing = client.clone().list_tools(request).await.ok()?.into_inner();
    listing
        .tools
        .into_iter()
        .find(|tool| tool.name == "s__echo")
        .map(|tool| tool.description)
}

/// Two replicas serve calls of the working set while its tenants are
/// written (alternately through each replica's admin API) at
/// [`WRITES_PER_MINUTE`]. Returns failed calls, calls, writes whose
/// version was not seen on both replicas at the end, and each write's
/// milliseconds until the other replica served it.
async fn two_replicas(
    a: &Replica,
    b: &Replica,
    url: &str,
) -> anyhow::Result<(u64, u64, usize, Vec<f64>)> {
    let clients = [grpc(a.port).await, grpc(b.port).await];
    let admins = [admin(a.admin_port).await?, admin(b.admin_port).await?];
    let working: Vec<usize> = (0..WORKING_SET).map(|i| STORED - 1 - i).collect();
    for client in &clients {
        for &t in &working {
            warm(client, t).await?;
        }
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let failed = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new(BTreeMap::<String, u64>::new()));
    let mut callers = Vec::new();
    for c in 0..CALLERS * 2 {
        let client = clients[c % 2].clone();
        let working = working.clone();
        let (stop, failed, calls, errors) =
            (stop.clone(), failed.clone(), calls.clone(), errors.clone());
        callers.push(tokio::spawn(async move {
            let mut i = c;
            while !stop.is_cancelled() {
                let t = working[i % working.len()];
                i += 7;
                calls.fetch_add(1, Ordering::Relaxed);
                match client.clone().invoke_tool(call_request(t)).await {
                    Ok(r) if !r.get_ref().is_error => {}
                    Ok(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        *errors
                            .lock()
                            .unwrap()
                            .entry("tool error".into())
                            .or_default() += 1;
                    }
                    Err(status) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        *errors
                            .lock()
                            .unwrap()
                            .entry(format!("{:?}: {}", status.code(), status.message()))
                            .or_default() += 1;
                    }
                }
            }
        }));
    }
    let interval = Duration::from_secs(60) / WRITES_PER_MINUTE as u32;
    let started = Instant::now();
    let mut lags = Vec::new();
    let mut last: BTreeMap<usize, u64> = BTreeMap::new();
    let mut waits = Vec::new();
    let mut n: u64 = 0;
    while started.elapsed() < WRITE_RUN {
        n += 1;
        let t = working[(n as usize * 13) % working.len()];
        let via = (n % 2) as usize;
        let mut admin = admins[via].clone();
        let current = admin
            .get_tenant(admin_request(admin_pb::GetTenantRequest {
                name: format!("t{t:06}"),
            }))
            .await?
            .into_inner();
        admin
            .put_tenant(admin_request(admin_pb::PutTenantRequest {
                name: format!("t{t:06}"),
                spec_yaml: spec(t, url, n),
                expected_version: current.version,
            }))
            .await?;
        let written = Instant::now();
        last.insert(t, n);
        // Watch the other replica serve it.
        let other = clients[1 - via].clone();
        waits.push(tokio::spawn(async move {
            let want = format!("write {n}");
            for _ in 0..1000 {
                match description(&other, t).await {
                    Some(d) if d == want => return Some(written.elapsed().as_secs_f64() * 1000.0),
                    // A later write of the same tenant got there first.
                    Some(d)
                        if d.strip_prefix("write ").and_then(|m| m.parse::<u64>().ok())
                            > Some(n) =>
                    {
                        return None;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            None
        }));
        let next = started + interval * n as u32;
        tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
    }
    for wait in waits {
        if let Some(lag) = wait.await? {
            lags.push(lag);
        }
    }
    stop.cancel();
    for caller in callers {
        caller.await?;
    }
    // Every tenant's last write, on both replicas.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut not_applied = 0;
    for (&t, &mark) in &last {
        for client in &clients {
            if description(client, t).await != Some(format!("write {mark}")) {
                not_applied += 1;
            }
        }
    }
    let errors = errors.lock().unwrap().clone();
    if !errors.is_empty() {
        eprintln!("toolgate-bench: failed calls during writes: {errors:?}");
    }
    eprintln!(
        "toolgate-bench: {n} writes in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok((
        failed.load(Ordering::Relaxed),
        calls.load(Ordering::Relaxed),
        not_applied,
        lags,
    ))
}

/// Milliseconds to `SERVING` with [`DIR_FILES`] tenant files.
async fn tenants_dir(dir: &Path, url: &str) -> anyhow::Result<f64> {
    let tenants = dir.join("tenants.d");
    std::fs::create_dir_all(&tenants)?;
    for t in 0..DIR_FILES {
        std::fs::write(
            tenants.join(format!("d{t:05}.yaml")),
            spec(t + STORED, url, 0),
        )?;
    }
    let port = free_port();
    let config = dir.join("dir.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\ntenants_dir:\n  path: \"{}\"\n",
            tenants.display()
        ),
    )?;
    let started = Instant::now();
    let gw = spawn_gateway(&config);
    let ms = serving_ms(port, started).await?;
    let _ = &gw;
    // SERVING must mean the files are in: the last file's tenant serves.
    let client = grpc(port).await;
    warm(&client, DIR_FILES - 1 + STORED).await?;
    Ok(ms)
}

/// A throwaway PostgreSQL cluster for the run (Debian's postgresql-15, as
/// tests/setup.sh installs it), on 127.0.0.1, removed at the end.
pub(crate) struct Postgres {
    dir: PathBuf,
    port: u16,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

fn as_postgres(program: &str) -> Command {
    let path = Path::new(PG_BIN).join(program);
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(path);
        command
    } else {
        Command::new(path)
    }
}

impl Postgres {
    /// Creates and starts the cluster (as the `postgres` user when root).
    pub(crate) fn start() -> anyhow::Result<Postgres> {
        anyhow::ensure!(
            Path::new(PG_BIN).join("initdb").exists(),
            "PostgreSQL 15 is missing: run tests/setup.sh"
        );
        let dir = std::env::temp_dir().join(format!("toolgate-bench-pg-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let _ = Command::new("chown").arg("postgres:").arg(&dir).status();
        let data = dir.join("data");
        let out = as_postgres("initdb")
            .args([
                "--auth=trust",
                "--username=postgres",
                "--no-sync",
                "--pgdata",
            ])
            .arg(&data)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={} -c fsync=off -c max_connections=200",
            dir.display()
        );
        let out = as_postgres("pg_ctl")
            .arg("--pgdata")
            .arg(&data)
            .arg("--log")
            .arg(dir.join("server.log"))
            .args(["--wait", "--timeout=60", "-o", &options, "start"])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Postgres { dir, port })
    }

    /// The postmaster's process id (its backends are its children).
    pub(crate) fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The URL of its `postgres` database.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_postgres("pg_ctl")
            .arg("--pgdata")
            .arg(self.dir.join("data"))
            .args(["--wait", "--mode", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
