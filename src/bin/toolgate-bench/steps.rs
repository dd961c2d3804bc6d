//! The steps the call pipeline gained in issues 35 and 36 (call approvals,
//! idempotency keys, the result cache, the circuit breaker), each against
//! the plain call (`--only-steps`): configured but not triggered, all four
//! configured together, and triggered (an approved call spending a use, a
//! held call answered `APPROVAL_PENDING`, a fresh idempotency key claimed
//! and finished on SQLite and on PostgreSQL, with 100,000 live keys too, a
//! replay, a cache hit, an open breaker's refusal).
//!
//! One gateway per configuration, each with one tenant in front of the fast
//! stdio server (`mcp-server --tools 1`: `echo` and `tool_00000`), kept
//! running for the whole run, each with its own state store; a tonic
//! client. Every round measures every row in turn (each round starting
//! at another row): the gateway's CPU per call at 16 in flight (from
//! `/proc`) and the p50 of sequential calls; each row's figures are medians over rounds, and its
//! ratio to the plain call is the median of the per-round ratios.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use toolgate::pb;

use super::harness::{Proc, authed, exe, gateway_with, grpc};
use super::measure::{self, CallFn, median};
use super::python::wait_connected;
use super::report::fmt;
use super::store::Postgres;

/// Calls in flight of a throughput run.
const IN_FLIGHT: usize = 16;
/// The most calls of one throughput run, whatever its duration.
const MAX_CALLS: u64 = 1_000_000;
/// Calls one approval allows (the most a rule may set).
const USES: usize = 100;
/// Live keys in the store of the "100,000 live keys" rows.
const PREFILLED: u64 = 100_000;
/// A 32-byte state key in base64.
const STATE_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
/// The approver token of the approvals gateways.
const APPROVER: &str = "bench-approver-token";

/// A gRPC client of a gateway.
type Client = pb::tool_gateway_client::ToolGatewayClient<Channel>;
/// A client of a gateway's `CallApprovalsService`.
type Approvals = pb::call_approvals_service_client::CallApprovalsServiceClient<Channel>;

/// The fast server with the plain call's options: breaker off, cache off.
const PLAIN: &str =
    "        circuit_breaker:\n          enabled: false\n        cache_results: false\n";
/// The fast server with its breaker configured (never counting a failure).
const BREAKER: &str = "        circuit_breaker:\n          failures: 5\n          cool_down: 30s\n        cache_results: false\n";
/// The fast server with the result cache on (tool calls never ask it).
const CACHE: &str =
    "        circuit_breaker:\n          enabled: false\n        cache_results: true\n";
/// The fast server with both.
const BOTH: &str = "        circuit_breaker:\n          failures: 5\n          cool_down: 30s\n        cache_results: true\n";
/// An approval rule for `fast__tool_00000` (never `fast__echo`).
const APPROVAL_RULE: &str = "    call_approvals:\n      approver_tokens:\n        - name: alice\n          token: bench-approver-token\n    policy:\n      - require_approval: [\"fast__tool_00000\"]\n        approval:\n          wait: 7d\n          valid_for: 7d\n          uses: 100\n";

/// The tenant's idempotency settings: keys live `ttl`.
fn idempotency(ttl: &str) -> String {
    format!("    idempotency:\n      ttl: {ttl}\n      max_keys: 100000000\n")
}

/// The fast server's entry with `options`.
fn fast(options: &str) -> String {
    format!(
        "      - name: fast\n        command: [\"{}\", \"mcp-server\", \"--tools\", \"1\"]\n{options}",
        exe().display()
    )
}

/// A running gateway of one configuration.
struct Gateway {
    proc: Proc,
    port: u16,
    client: Client,
    /// Its SQLite state store's path (none on PostgreSQL).
    sqlite: Option<std::path::PathBuf>,
}

/// Starts a gateway with `servers` (its tenant's servers, then tenant
/// keys) on the state store `pg_url` (else SQLite in its directory).
async fn start(servers: String, pg_url: Option<&str>) -> anyhow::Result<Gateway> {
    let sqlite = std::sync::Mutex::new(None);
    let (proc, port) = gateway_with(
        |dir| {
            let url = match pg_url {
                Some(url) => url.to_owned(),
                None => {
                    let path = dir.join("state.db");
                    let url = format!("sqlite://{}", path.display());
                    *sqlite.lock().expect("not poisoned") = Some(path);
                    url
                }
            };
            format!("state:\n  url: \"{url}\"\n  keys: [\"{STATE_KEY}\"]\n")
        },
        &servers,
    )
    .await;
    wait_connected(port).await?;
    let sqlite = sqlite.into_inner().expect("not poisoned");
    Ok(Gateway {
        proc,
        port,
        client: grpc(port).await,
        sqlite,
    })
}

/// A request for `tool` with `message`.
fn request(tool: &str, message: &str) -> pb::InvokeToolRequest {
    pb::InvokeToolRequest {
        name: tool.to_owned(),
        arguments_json: serde_json::json!({ "message": message }).to_string(),
        ..Default::default()
    }
}

/// `ErrorInfo.reason` of a refusal.
fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// Calls answered with `request()`.
fn invoke(
    client: &Client,
    request: impl Fn() -> pb::InvokeToolRequest + Send + Sync + 'static,
) -> CallFn {
    let client = client.clone();
    let request = Arc::new(request);
    Arc::new(move || {
        let mut client = client.clone();
        let request = request.clone();
        Box::pin(async move {
            client.invoke_tool(authed(request())).await?;
            Ok(())
        })
    })
}

/// Calls that must be refused with `expected` (their reason).
fn refused(client: &Client, tool: &'static str, expected: &'static str) -> CallFn {
    let client = client.clone();
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            match client.invoke_tool(authed(request(tool, "pending"))).await {
                Err(status) if reason(&status) == expected => Ok(()),
                other => anyhow::bail!("expected {expected}, got {other:?}"),
            }
        })
    })
}

/// `ReadResource` of `uri` on server `c`, answered `text`.
fn read(client: &Client, uri: &'static str) -> CallFn {
    let client = client.clone();
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            let request = pb::ReadResourceRequest {
                server: "c".to_owned(),
                uri: uri.to_owned(),
                ..Default::default()
            };
            let read = client.read_resource(authed(request)).await?.into_inner();
            anyhow::ensure!(
                matches!(read.contents.first().and_then(|c| c.data.as_ref()),
                    Some(pb::resource_contents::Data::Text(t)) if t == super::offerings_server::SMALL),
                "{uri}: {read:?}"
            );
            Ok(())
        })
    })
}

/// Approved calls of `fast__tool_00000`, each spending one use of an
/// approval of the pool; refused once the pool's uses are spent.
struct Pool {
    client: Client,
    approvals: Approvals,
    /// (approval id, the message it approved).
    approved: std::sync::Mutex<Arc<Vec<(String, String)>>>,
    next: AtomicUsize,
    made: AtomicUsize,
}

impl Pool {
    /// Replaces the pool with `n` new approvals (each asked for by a call
    /// and approved by the approver token).
    async fn refill(&self, n: usize) -> anyhow::Result<()> {
        let mut approved = Vec::with_capacity(n);
        for _ in 0..n {
            let message = format!("approved-{}", self.made.fetch_add(1, Ordering::Relaxed));
            let status = self
                .client
                .clone()
                .invoke_tool(authed(request("fast__tool_00000", &message)))
                .await
                .err()
                .ok_or_else(|| anyhow::anyhow!("a held call ran"))?;
            anyhow::ensure!(reason(&status) == "APPROVAL_PENDING", "{status:?}");
            use tonic_types::StatusExt as _;
            let id = status
                .get_error_details()
                .error_info()
                .and_then(|i| i.metadata.get("approval_id").cloned())
                .ok_or_else(|| anyhow::anyhow!("no approval_id in {status:?}"))?;
            let mut approve = tonic::Request::new(pb::ApproveCallRequest {
                approval_id: id.clone(),
                reason: "bench".to_owned(),
            });
            approve.metadata_mut().insert(
                "authorization",
                format!("Bearer {APPROVER}").parse().expect("ascii"),
            );
            self.approvals.clone().approve_call(approve).await?;
            approved.push((id, message));
        }
        *self.approved.lock().expect("not poisoned") = Arc::new(approved);
        self.next.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Uses left in the pool.
    fn uses(&self) -> u64 {
        let approved = self.approved.lock().expect("not poisoned").len() * USES;
        approved.saturating_sub(self.next.load(Ordering::Relaxed)) as u64
    }

    /// The row's call: the next use of the pool.
    fn call(self: &Arc<Self>) -> CallFn {
        let pool = self.clone();
        Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let use_ = pool.next.fetch_add(1, Ordering::Relaxed);
                let approved = pool.approved.lock().expect("not poisoned").clone();
                let (id, message) = approved
                    .get(use_ / USES)
                    .ok_or_else(|| anyhow::anyhow!("the approval pool is spent"))?;
                let mut request = request("fast__tool_00000", message);
                request.approval_id = id.clone();
                pool.client.clone().invoke_tool(authed(request)).await?;
                Ok(())
            })
        })
    }
}

/// One row of the table: a call on one gateway.
struct Row {
    /// The step (or "plain call").
    step: &'static str,
    /// How it is configured or triggered.
    case: &'static str,
    /// Its gateway's index.
    gateway: usize,
    call: CallFn,
    /// The approvals its calls spend, refilled before each round.
    pool: Option<Arc<Pool>>,
    /// The gateway's CPU ms per call, one a round.
    cpu: Vec<f64>,
    /// PostgreSQL's CPU ms per call (rows on a PostgreSQL store).
    pg_cpu: Vec<f64>,
    /// p50 ms of sequential calls, one a round.
    p50: Vec<f64>,
    /// Calls per second at 16 in flight, one a round.
    rate: Vec<f64>,
}

/// A row without a pool and without figures yet.
fn row(step: &'static str, case: &'static str, gateway: usize, call: CallFn) -> Row {
    Row {
        step,
        case,
        gateway,
        call,
        pool: None,
        cpu: Vec::new(),
        pg_cpu: Vec::new(),
        p50: Vec::new(),
        rate: Vec::new(),
    }
}

/// The p50 (ms) of at most `n` sequential calls within `limit`.
async fn p50(call: &CallFn, n: usize, limit: Duration) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut samples = Vec::with_capacity(n);
    while samples.len() < n && started.elapsed() < limit {
        let one = Instant::now();
        call().await?;
        samples.push(one.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(median(samples))
}

/// CPU seconds of the PostgreSQL cluster whose postmaster is `pid`.
fn pg_cpu_seconds(pid: u32) -> f64 {
    measure::cpu_seconds(pid)
        + measure::children(pid)
            .into_iter()
            .map(measure::cpu_seconds)
            .sum::<f64>()
}

/// One round of `row` on `gateway` (and the cluster of `postmaster` when
/// its store is PostgreSQL); `plain_calls` sizes an approval pool.
async fn measure_row(
    row: &mut Row,
    gateway: &Gateway,
    postmaster: Option<u32>,
    sequential: usize,
    duration: Duration,
    plain_calls: u64,
) -> anyhow::Result<()> {
    let mut max_calls = MAX_CALLS;
    if let Some(pool) = &row.pool {
        let wanted = sequential as u64 + plain_calls + plain_calls / 4 + 1;
        pool.refill(wanted.div_ceil(USES as u64) as usize).await?;
    }
    row.p50
        .push(p50(&row.call, sequential, duration * 2).await?);
    if let Some(pool) = &row.pool {
        max_calls = pool.uses();
    }
    let pid = gateway.proc.pid();
    let postmaster = postmaster.filter(|_| gateway.sqlite.is_none());
    let pg_before = postmaster.map(pg_cpu_seconds);
    let before = measure::cpu_seconds(pid);
    let (rate, calls) =
        measure::throughput_bounded(&row.call, IN_FLIGHT, duration, max_calls).await?;
    let after = measure::cpu_seconds(pid);
    let per_call = |seconds: f64| seconds * 1000.0 / calls.max(1) as f64;
    if let (Some(pid), Some(before)) = (postmaster, pg_before) {
        row.pg_cpu.push(per_call(pg_cpu_seconds(pid) - before));
    }
    row.rate.push(rate);
    row.cpu.push(per_call(after - before));
    Ok(())
}

/// Creates the databases `names` in the cluster; their URLs.
async fn databases(pg: &Postgres, names: &[&str]) -> anyhow::Result<Vec<String>> {
    use sqlx::Executor as _;
    let pool = sqlx::PgPool::connect(&pg.url()).await?;
    let base = pg.url();
    let at = base.rfind('/').expect("a database in the URL");
    let mut urls = Vec::new();
    for name in names {
        pool.execute(format!("CREATE DATABASE {name}").as_str())
            .await?;
        urls.push(format!("{}/{name}", &base[..at]));
    }
    pool.close().await;
    Ok(urls)
}

/// Fills the store of `gateway` (SQLite, or `pg_url`) with [`PREFILLED`]
/// live keys of the tenant, after one keyed call made its table.
async fn prefill(gateway: &Gateway, pg_url: Option<&str>) -> anyhow::Result<()> {
    let mut first = request("fast__echo", "hello");
    first.idempotency_key = "prefill-first".to_owned();
    gateway.client.clone().invoke_tool(authed(first)).await?;
    let now = now_ms();
    let expires = now + 30 * 24 * 3600 * 1000;
    let columns = "(key_hash, tenant, arguments_sha256, state, call_id, in_flight_until_ms, created_at_ms, expires_at_ms, sealed)";
    let count = "SELECT COUNT(*) FROM toolgate_idempotency_keys WHERE tenant = 'bench'";
    let rows: i64 = match (pg_url, &gateway.sqlite) {
        (Some(url), _) => {
            use sqlx::Executor as _;
            let pool = sqlx::PgPool::connect(url).await?;
            pool.execute(
                format!(
                    "INSERT INTO toolgate_idempotency_keys {columns} \
                     SELECT 'prefill-' || i, 'bench', 'x', 'done', 'prefill', 0, {now}, {expires}, NULL \
                     FROM generate_series(1, {PREFILLED}) AS i"
                )
                .as_str(),
            )
            .await?;
            pool.execute("VACUUM ANALYZE toolgate_idempotency_keys")
                .await?;
            let rows = sqlx::query_scalar(count).fetch_one(&pool).await?;
            pool.close().await;
            rows
        }
        (None, Some(path)) => {
            use sqlx::Executor as _;
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await?;
            pool.execute(
                format!(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {PREFILLED}) \
                     INSERT INTO toolgate_idempotency_keys {columns} \
                     SELECT 'prefill-' || i, 'bench', 'x', 'done', 'prefill', 0, {now}, {expires}, NULL FROM n"
                )
                .as_str(),
            )
            .await?;
            pool.execute("ANALYZE").await?;
            let rows = sqlx::query_scalar(count).fetch_one(&pool).await?;
            pool.close().await;
            rows
        }
        (None, None) => anyhow::bail!("no state store to fill"),
    };
    anyhow::ensure!(
        rows as u64 > PREFILLED,
        "the tenant has {rows} keys after the fill: the table's tenant is not `bench`"
    );
    Ok(())
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Opens the breaker of `gateway`'s server: its stdio child stopped
/// (SIGSTOP) until 5 calls ran out of the server's 200 ms timeout, then
/// continued; returns once a call is refused `SERVER_CIRCUIT_OPEN`.
async fn open_breaker(gateway: &Gateway) -> anyhow::Result<()> {
    let children = measure::children(gateway.proc.pid());
    anyhow::ensure!(!children.is_empty(), "the breaker gateway has no child");
    let signal = |sig: &str| {
        for pid in &children {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        }
    };
    signal("-STOP");
    let mut client = gateway.client.clone();
    let mut open = false;
    for _ in 0..20 {
        match client
            .invoke_tool(authed(request("fast__echo", "hello")))
            .await
        {
            Err(status) if reason(&status) == "SERVER_CIRCUIT_OPEN" => {
                open = true;
                break;
            }
            Err(_) => {}
            Ok(_) => anyhow::bail!("a call to the stopped server was answered"),
        }
    }
    signal("-CONT");
    anyhow::ensure!(open, "the breaker did not open after 20 timed-out calls");
    Ok(())
}

/// Runs the figures and prints their table.
///
/// # Errors
/// A gateway or PostgreSQL does not start, or a call fails.
pub async fn report(rounds: usize, sequential: usize, duration: Duration) -> anyhow::Result<()> {
    let pg = Postgres::start()?;
    let pg_urls = databases(&pg, &["fresh", "k100"]).await?;
    let all = format!("{}{APPROVAL_RULE}{}", fast(BOTH), idempotency("1s"));
    let cached = format!(
        "      - name: c\n        command: [\"{}\", \"offerings-server\"]\n        lifecycle: discover\n",
        exe().display()
    );
    let breaker_open = format!(
        "{}        call_timeout: 200ms\n        circuit_breaker:\n          failures: 5\n          cool_down: 1h\n          max_cool_down: 1h\n        cache_results: false\n",
        fast("")
    );
    eprintln!("steps: starting the gateways");
    let gateways = [
        start(fast(PLAIN), None).await?, // 0 plain
        start(format!("{}{APPROVAL_RULE}", fast(PLAIN)), None).await?, // 1 approvals
        start(format!("{}{}", fast(PLAIN), idempotency("1s")), None).await?, // 2 keys, SQLite
        start(fast(CACHE), None).await?, // 3 cache
        start(fast(BREAKER), None).await?, // 4 breaker
        start(all, None).await?,         // 5 all four
        start(
            format!("{}{}", fast(PLAIN), idempotency("1s")),
            Some(pg_urls[0].as_str()),
        )
        .await?, // 6 keys, PostgreSQL
        start(format!("{}{}", fast(PLAIN), idempotency("24h")), None).await?, // 7 replay
        start(format!("{}{}", fast(PLAIN), idempotency("1s")), None).await?, // 8 100k keys, SQLite
        start(
            format!("{}{}", fast(PLAIN), idempotency("1s")),
            Some(pg_urls[1].as_str()),
        )
        .await?, // 9 100k keys, PostgreSQL
        start(cached, None).await?,      // 10 cache hit
        start(breaker_open, None).await?, // 11 open breaker
    ];
    eprintln!("steps: filling 2 stores with {PREFILLED} keys, opening a breaker");
    prefill(&gateways[8], None).await?;
    prefill(&gateways[9], Some(pg_urls[1].as_str())).await?;
    open_breaker(&gateways[11]).await?;
    let mut replay = request("fast__echo", "hello");
    replay.idempotency_key = "replayed".to_owned();
    gateways[7]
        .client
        .clone()
        .invoke_tool(authed(replay.clone()))
        .await?;

    let echo = |g: usize| invoke(&gateways[g].client, || request("fast__echo", "hello"));
    let fresh = |g: usize| {
        let n = Arc::new(AtomicU64::new(0));
        invoke(&gateways[g].client, move || {
            let mut r = request("fast__echo", "hello");
            r.idempotency_key = format!("k-{}", n.fetch_add(1, Ordering::Relaxed));
            r
        })
    };
    let approvals = Approvals::new(gateways[1].client_channel().await?);
    let pool = Arc::new(Pool {
        client: gateways[1].client.clone(),
        approvals,
        approved: std::sync::Mutex::new(Arc::new(Vec::new())),
        next: AtomicUsize::new(0),
        made: AtomicUsize::new(0),
    });
    let nt = "configured, not triggered";
    let mut rows = vec![
        row(
            "plain call",
            "breaker and cache off, no policy, no keys",
            0,
            echo(0),
        ),
        row("call approvals", nt, 1, echo(1)),
        row("idempotency keys", nt, 2, echo(2)),
        row("result cache", nt, 3, echo(3)),
        row("circuit breaker", nt, 4, echo(4)),
        row("all four", nt, 5, echo(5)),
        Row {
            pool: Some(pool.clone()),
            ..row(
                "call approvals",
                "an approved call, spending a use",
                1,
                pool.call(),
            )
        },
        row(
            "call approvals",
            "a held call, answered APPROVAL_PENDING (nothing sent)",
            1,
            refused(&gateways[1].client, "fast__tool_00000", "APPROVAL_PENDING"),
        ),
        row(
            "idempotency keys",
            "a fresh key claimed and finished, SQLite",
            2,
            fresh(2),
        ),
        row(
            "idempotency keys",
            "a fresh key claimed and finished, PostgreSQL",
            6,
            fresh(6),
        ),
        row(
            "idempotency keys",
            "a replay (the same key again, SQLite)",
            7,
            invoke(&gateways[7].client, move || replay.clone()),
        ),
        row(
            "idempotency keys",
            "a fresh key, 100,000 live keys, SQLite",
            8,
            fresh(8),
        ),
        row(
            "idempotency keys",
            "a fresh key, 100,000 live keys, PostgreSQL",
            9,
            fresh(9),
        ),
        row(
            "result cache",
            "ReadResource of 5 bytes, a hit",
            10,
            read(&gateways[10].client, "bench://small-cached"),
        ),
        row(
            "result cache",
            "ReadResource of 5 bytes, no hint (reaches the server)",
            10,
            read(&gateways[10].client, "bench://small"),
        ),
        row(
            "circuit breaker",
            "an open breaker's refusal (nothing sent)",
            11,
            refused(&gateways[11].client, "fast__echo", "SERVER_CIRCUIT_OPEN"),
        ),
    ];
    // Warm up every row (and fill the cache).
    for row in &rows {
        if row.pool.is_none() {
            measure::sequential(&row.call, 100).await?;
        }
    }
    let postmaster = pg.pid();
    // Calls of the plain row's last run (sizes the approval pool; a
    // generous guess before the first).
    let mut plain_calls = (10_000.0 * duration.as_secs_f64()) as u64;
    for round in 0..rounds.max(1) {
        eprintln!("round {}: steps ({} rows)", round + 1, rows.len());
        // Each round starts at another row, so that no row always follows
        // the same one.
        let n = rows.len();
        for i in 0..n {
            let row = &mut rows[(i + round * 5) % n];
            let gateway = &gateways[row.gateway];
            measure_row(row, gateway, postmaster, sequential, duration, plain_calls)
                .await
                .map_err(|e| anyhow::anyhow!("{}, {}: {e}", row.step, row.case))?;
            if row.gateway == 0 {
                plain_calls =
                    (row.rate.last().copied().unwrap_or(0.0) * duration.as_secs_f64()) as u64;
            }
        }
    }
    print_table(&rows);
    drop(gateways);
    drop(pg);
    Ok(())
}

impl Gateway {
    /// A new channel to the gateway.
    async fn client_channel(&self) -> anyhow::Result<Channel> {
        Ok(
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", self.port))?
                .tcp_nodelay(true)
                .connect()
                .await?,
        )
    }
}

/// Prints the rows against the plain call (row 0), and the goal.
fn print_table(rows: &[Row]) {
    let plain = &rows[0];
    let per_round = |a: &[f64], b: &[f64], f: fn(f64, f64) -> f64| -> Vec<f64> {
        a.iter().zip(b).map(|(x, y)| f(*x, *y)).collect()
    };
    println!(
        "| step | case | gateway CPU ms/call @{IN_FLIGHT} | / plain, per round: median (min–max) | PostgreSQL CPU ms/call | p50 ms | p50 − plain, per round | calls/s @{IN_FLIGHT} |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut together = f64::NAN;
    for (i, row) in rows.iter().enumerate() {
        let ratios = per_round(&row.cpu, &plain.cpu, |x, y| x / y);
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let ratio = median(ratios);
        let added = median(per_round(&row.p50, &plain.p50, |x, y| x - y));
        if row.step == "all four" {
            together = ratio;
        }
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.step,
            row.case,
            fmt(median(row.cpu.clone()), 4),
            if i == 0 {
                "1".to_owned()
            } else {
                format!("{} ({}–{})", fmt(ratio, 3), fmt(lo, 2), fmt(hi, 2))
            },
            fmt(median(row.pg_cpu.clone()), 4),
            fmt(median(row.p50.clone()), 3),
            if i == 0 {
                "0".to_owned()
            } else {
                format!("{:+.3}", added)
            },
            fmt(median(row.rate.clone()), 0),
        );
    }
    println!();
    println!("| target | figure | goal | |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| the four steps configured, not triggered: gateway CPU per call / plain | {} | ≤ 1.05 | {} |",
        fmt(together, 3),
        super::report::verdict(together <= 1.05)
    );
}
