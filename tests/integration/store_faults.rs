//! Faults of the state store as operators see them (issue 37): two
//! `toolgate serve` replicas on one real PostgreSQL 15 serve, under load,
//! calls of a server that needs no store, tasks (PrefectHQ's
//! `fastmcp-tasks` over Streamable HTTP), per-user OAuth calls and consent
//! completions (the Python SDK's resource server and the test
//! authorization server), callers whose tenant must be looked up, and
//! admin writes of stored tenants. PostgreSQL is stopped for 10 s and
//! started again, then killed (`immediate`) and started again while writes
//! are in flight.
//!
//! Checked: the calls that need no store all succeed; every store-dependent
//! failure is `UNAVAILABLE` with `RetryInfo`; an `UNAVAILABLE` task call
//! never reached the server; both replicas serve every store-dependent
//! kind of request again within [`RECOVERY_BOUND`] of PostgreSQL's return
//! and follow tenant changes made afterwards; every task handed out is
//! findable on both replicas; every admin write a client was told
//! succeeded is in the store once (its change logged once), none told
//! failed is; a consent held across the outage is completed exactly once.
//! The figures are printed (`--nocapture`) for docs/reliability.md.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb;
use toolgate::pb::admin::admin_client::AdminClient;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;
use crate::oauth::{authorization_url, call_settled, confirm, consent, upstream};

const STATE_KEY: &str = "c3RvcmUtZmF1bHRzLXRlc3Qta2V5LTMyLWJ5dGVzISE=";
const ADMIN: &str = "store-faults-admin-token";
const TOKEN: &str = "acme-token";

/// How long the store is down (the issue's figure).
const OUTAGE: Duration = Duration::from_secs(10);

/// How long after PostgreSQL's return every replica must serve every
/// kind of store-dependent request again (the goal is seconds; the bound
/// leaves room for a loaded 2-core machine).
const RECOVERY_BOUND: Duration = Duration::from_secs(20);

/// The deadline of every request of the load (long enough for a request
/// held mid-transaction across the kill and restart).
const DEADLINE: Duration = Duration::from_secs(10);

/// The tenants the admin writers own, one per replica.
const WRITERS: [&str; 2] = ["w0", "w1"];

/// One kind of request of the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Op {
    /// `plain__echo` of a file tenant's server with no OAuth: no store.
    Plain,
    /// `tasks__optional_task` with `accepts_task`: the task is stored.
    TaskCreate,
    /// `GetTask` of the last task made at the other replica.
    TaskGet,
    /// `docs__whoami` as a user who consented (OAuth token in the store).
    UserCall,
    /// A call with a token no replica knows: looked up in the store.
    UnknownToken,
    /// `PutTenant` of the replica's writer tenant through its admin API.
    AdminWrite,
}

impl Op {
    const ALL: [Op; 6] = [
        Op::Plain,
        Op::TaskCreate,
        Op::TaskGet,
        Op::UserCall,
        Op::UnknownToken,
        Op::AdminWrite,
    ];

    fn label(self) -> &'static str {
        match self {
            Op::Plain => "call, server needing no store (plain__echo)",
            Op::TaskCreate => "task creation (accepts_task)",
            Op::TaskGet => "GetTask (the last task made at the other replica)",
            Op::UserCall => "per-user OAuth call (docs__whoami)",
            Op::UnknownToken => "caller whose tenant must be looked up",
            Op::AdminWrite => "admin PutTenant",
        }
    }

    /// An answer that shows the store was reached (the unknown token is
    /// refused as unknown: the store said so).
    fn served(self, code: Code) -> bool {
        match self {
            Op::UnknownToken => code == Code::Unauthenticated,
            _ => code == Code::Ok,
        }
    }
}

/// One answer of the load.
#[derive(Clone, Debug)]
struct Outcome {
    op: Op,
    replica: usize,
    code: Code,
    reason: String,
    retry_info: bool,
    /// When the request was sent.
    sent: Instant,
    /// When it was answered.
    at: Instant,
}

#[derive(Clone, Default)]
struct Record(Arc<Mutex<Vec<Outcome>>>);

impl Record {
    fn push<T>(&self, op: Op, replica: usize, sent: Instant, answer: &Result<T, tonic::Status>) {
        let (code, reason, retry_info) = match answer {
            Ok(_) => (Code::Ok, String::new(), false),
            Err(status) => (
                status.code(),
                reason(status),
                status.get_details_retry_info().is_some(),
            ),
        };
        self.0.lock().unwrap().push(Outcome {
            op,
            replica,
            code,
            reason,
            retry_info,
            sent,
            at: Instant::now(),
        });
    }

    fn all(&self) -> Vec<Outcome> {
        self.0.lock().unwrap().clone()
    }

    /// The first answer after `since` that shows `op` served at `replica`.
    fn first_served(&self, op: Op, replica: usize, since: Instant) -> Option<Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.op == op && o.replica == replica && o.at >= since && op.served(o.code))
            .map(|o| o.at)
            .min()
    }
}

/// What the loads were told succeeded.
#[derive(Default)]
struct Told {
    /// Task ids handed out, with the replica that handed each out.
    tasks: Vec<(String, usize)>,
    /// Per writer tenant: the writes told OK, in order (version,
    /// generation).
    writes: BTreeMap<&'static str, Vec<(i64, u32)>>,
    /// Writes told UNAVAILABLE and found applied afterwards.
    applied_though_refused: Vec<String>,
}

/// A stored tenant's spec at `generation`: its one server is named after
/// the generation, so a replica's catalog tells which one it serves.
fn writer_spec(tenant: &str, generation: u32, url: &str) -> String {
    format!("tokens: [\"{tenant}-token\"]\nservers:\n  - name: g{generation}\n    url: \"{url}\"\n")
}

/// One `toolgate serve` process and its ports.
struct Replica {
    _process: ChildGuard,
    port: u16,
    admin: u16,
    consent: u16,
    log: PathBuf,
}

/// The configuration of replica `index`; `public` is the one public URL of
/// the consent listeners (a load balancer's).
fn replica_config(
    ports: (u16, u16, u16),
    public: u16,
    state_url: &str,
    plain: &str,
    tasks: &str,
    docs: &str,
) -> String {
    let (port, admin, consent) = ports;
    format!(
        r#"listen: "127.0.0.1:{port}"
shutdown_delay: "0s"
upstream_allow: ["{plain_host}"]
state:
  url: "{state_url}"
  keys: ["{STATE_KEY}"]
admin:
  listen: "127.0.0.1:{admin}"
  tokens: ["{ADMIN}"]
  write_rate_per_second: 1000
  write_burst: 1000
tenant_store:
  poll_interval: "1s"
  resync_interval: "60s"
oauth:
  listen: 127.0.0.1:{consent}
  public_url: http://127.0.0.1:{public}
  allow_private_addresses: true
tenants:
  - name: acme
    tokens: ["{TOKEN}"]
    consent_return_url: {return_url}
    servers:
      - name: plain
        url: "{plain}"
      - name: tasks
        url: "{tasks}"
        lifecycle: discover
      - name: docs
        url: "{docs}"
        oauth: {{ grant: authorization_code }}
"#,
        return_url = crate::oauth::RETURN_URL,
        plain_host = plain.trim_start_matches("http://").trim_end_matches("/mcp"),
    )
}

impl Replica {
    fn start(dir: &Path, index: usize, public: Option<u16>, urls: [&str; 4]) -> Replica {
        let [state_url, plain, tasks, docs] = urls;
        let (port, admin) = (free_port(), free_port());
        let consent = free_port();
        let config = replica_config(
            (port, admin, consent),
            public.unwrap_or(consent),
            state_url,
            plain,
            tasks,
            docs,
        );
        let path = dir.join(format!("gateway{index}.yaml"));
        std::fs::write(&path, config).unwrap();
        let log = dir.join(format!("gateway{index}.log"));
        Replica {
            _process: serve_binary(&path, &log, &[]),
            port,
            admin,
            consent,
            log,
        }
    }
}

impl Replica {
    /// Waits (bounded) until the replica listens on `port`; its log
    /// otherwise.
    async fn wait_for(&self, port: u16) {
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the replica does not listen on {port}: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// How many `method` requests the tasks server received.
fn upstream_requests(log: &Path, method: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|l| l["event"] == "request" && l["method"] == method)
        .count()
}

/// How many `tools/call` of `tool` the tasks server received.
fn upstream_calls(log: &Path, tool: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|l| l["event"] == "request" && l["method"] == "tools/call" && l["tool"] == tool)
        .count()
}

fn with_deadline<T>(mut request: tonic::Request<T>) -> tonic::Request<T> {
    request.set_timeout(DEADLINE);
    request
}

/// The load of one replica: loops until `stop`, each bounded in count.
struct Load {
    replica: usize,
    gateway: ToolGatewayClient<Channel>,
    /// The other replica's gateway (GetTask of tasks made here).
    other: ToolGatewayClient<Channel>,
    admin: AdminClient<Channel>,
    record: Record,
    told: Arc<Mutex<Told>>,
    stop: Arc<AtomicBool>,
    plain_url: String,
}

/// The most iterations of one loop (the time bound is `stop`).
const MAX_ITERATIONS: usize = 20_000;

impl Load {
    fn spawn(self) -> Vec<tokio::task::JoinHandle<()>> {
        let load = Arc::new(self);
        vec![
            tokio::spawn(load.clone().plain()),
            tokio::spawn(load.clone().tasks()),
            tokio::spawn(load.clone().user_calls()),
            tokio::spawn(load.clone().unknown_tokens()),
            tokio::spawn(load.clone().admin_writes()),
        ]
    }

    fn running(&self, iteration: usize) -> bool {
        iteration < MAX_ITERATIONS && !self.stop.load(Ordering::Relaxed)
    }

    async fn plain(self: Arc<Self>) {
        let mut client = self.gateway.clone();
        let mut n = 0;
        while self.running(n) {
            let text = format!("r{} n{n}", self.replica);
            let request = authed(
                TOKEN,
                pb::InvokeToolRequest {
                    name: "plain__echo".into(),
                    arguments_json: serde_json::json!({ "text": text }).to_string(),
                    ..Default::default()
                },
            );
            let sent = Instant::now();
            let answer = client.invoke_tool(with_deadline(request)).await;
            if let Ok(response) = &answer {
                assert_eq!(response.get_ref().text, text, "a wrong answer");
            }
            self.record.push(Op::Plain, self.replica, sent, &answer);
            n += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn tasks(self: Arc<Self>) {
        let mut client = self.gateway.clone();
        let mut other = self.other.clone();
        let mut last = None;
        let mut n = 0;
        while self.running(n) {
            let request = authed(
                TOKEN,
                pb::InvokeToolRequest {
                    name: "tasks__optional_task".into(),
                    arguments_json: format!(r#"{{"text": "r{} n{n}"}}"#, self.replica),
                    accepts_task: true,
                    ..Default::default()
                },
            );
            let sent = Instant::now();
            let answer = client.invoke_tool(with_deadline(request)).await;
            self.record
                .push(Op::TaskCreate, self.replica, sent, &answer);
            if let Ok(response) = answer {
                let task = response
                    .into_inner()
                    .task
                    .expect("accepts_task on a task tool answers a task");
                self.told
                    .lock()
                    .unwrap()
                    .tasks
                    .push((task.task_id.clone(), self.replica));
                last = Some(task.task_id);
            }
            // The last task made here, at the other replica (also while
            // no new one can be made).
            if let Some(task_id) = last.clone() {
                let sent = Instant::now();
                let get = other
                    .get_task(with_deadline(authed(TOKEN, pb::GetTaskRequest { task_id })))
                    .await;
                // Recorded for the replica that answered.
                self.record.push(Op::TaskGet, 1 - self.replica, sent, &get);
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn user_calls(self: Arc<Self>) {
        let mut client = self.gateway.clone();
        let mut n = 0;
        while self.running(n) {
            let request = authed_as(
                TOKEN,
                "alice",
                pb::InvokeToolRequest {
                    name: "docs__whoami".into(),
                    arguments_json: "{}".into(),
                    ..Default::default()
                },
            );
            let sent = Instant::now();
            let answer = client.invoke_tool(with_deadline(request)).await;
            if let Ok(response) = &answer {
                assert_eq!(response.get_ref().text, "alice", "a wrong answer");
            }
            self.record.push(Op::UserCall, self.replica, sent, &answer);
            n += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn unknown_tokens(self: Arc<Self>) {
        let mut client = self.gateway.clone();
        let mut n = 0;
        while self.running(n) {
            // A new token each time: never in the negative cache.
            let token = format!("unknown-{}-{n}", self.replica);
            let request = authed(
                &token,
                pb::InvokeToolRequest {
                    name: "plain__echo".into(),
                    arguments_json: "{}".into(),
                    ..Default::default()
                },
            );
            let sent = Instant::now();
            let answer = client.invoke_tool(with_deadline(request)).await;
            self.record
                .push(Op::UnknownToken, self.replica, sent, &answer);
            n += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Replaces the replica's writer tenant, one generation after another,
    /// each write expecting the version the last one was told; a write
    /// told UNAVAILABLE is sent again unchanged.
    async fn admin_writes(self: Arc<Self>) {
        let tenant = WRITERS[self.replica];
        let mut admin = self.admin.clone();
        let (mut version, mut generation) = {
            let told = self.told.lock().unwrap();
            *told.writes[tenant].last().unwrap()
        };
        generation += 1;
        let mut n = 0;
        while self.running(n) {
            let spec = writer_spec(tenant, generation, &self.plain_url);
            let request = authed(
                ADMIN,
                toolgate::pb::admin::PutTenantRequest {
                    name: tenant.into(),
                    spec_yaml: spec.clone(),
                    expected_version: version.to_string(),
                },
            );
            let sent = Instant::now();
            let answer = admin.put_tenant(with_deadline(request)).await;
            self.record
                .push(Op::AdminWrite, self.replica, sent, &answer);
            match answer {
                Ok(written) => {
                    version = written.into_inner().version.parse().unwrap();
                    self.told
                        .lock()
                        .unwrap()
                        .writes
                        .get_mut(tenant)
                        .unwrap()
                        .push((version, generation));
                    generation += 1;
                }
                Err(status) if status.code() == Code::Aborted => {
                    // Only this loop writes this tenant: a write told
                    // UNAVAILABLE before was applied after all.
                    let stored = admin
                        .get_tenant(with_deadline(authed(
                            ADMIN,
                            toolgate::pb::admin::GetTenantRequest {
                                name: tenant.into(),
                            },
                        )))
                        .await;
                    if let Ok(stored) = stored {
                        let stored = stored.into_inner();
                        let mut told = self.told.lock().unwrap();
                        told.applied_though_refused.push(format!(
                            "{tenant} generation {generation}: stored version {} spec {:?}",
                            stored.version, stored.spec_yaml
                        ));
                        version = stored.version.parse().unwrap();
                        told.writes
                            .get_mut(tenant)
                            .unwrap()
                            .push((version, generation));
                        generation += 1;
                    }
                }
                Err(_) => {}
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Waits until every store-dependent kind of request has been served at
/// every replica since `back`; returns each replica's time to recover
/// (the last of its kinds), per kind too.
async fn recovered(record: &Record, back: Instant, what: &str) -> BTreeMap<(usize, Op), Duration> {
    let mut times = BTreeMap::new();
    loop {
        for replica in 0..2 {
            for op in Op::ALL {
                if let Some(at) = record.first_served(op, replica, back) {
                    times.entry((replica, op)).or_insert(at - back);
                }
            }
        }
        if times.len() == 2 * Op::ALL.len() {
            return times;
        }
        assert!(
            back.elapsed() < RECOVERY_BOUND,
            "{what}: not every kind of request was served again at both replicas within \
             {RECOVERY_BOUND:?} of PostgreSQL's return; served: {times:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The count of answers per kind and code within `[from, to)`.
fn tally(
    outcomes: &[Outcome],
    from: Instant,
    to: Instant,
) -> BTreeMap<Op, BTreeMap<String, usize>> {
    let mut table: BTreeMap<Op, BTreeMap<String, usize>> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.sent >= from && o.sent < to) {
        let key = if o.reason.is_empty() {
            format!("{:?}", o.code)
        } else {
            format!("{:?} {}", o.code, o.reason)
        };
        *table.entry(o.op).or_default().entry(key).or_default() += 1;
    }
    table
}

fn print_tally(title: &str, table: &BTreeMap<Op, BTreeMap<String, usize>>) {
    eprintln!("\n{title}\n| request | answers | by code |\n| --- | --- | --- |");
    for op in Op::ALL {
        let codes = table.get(&op).cloned().unwrap_or_default();
        let total: usize = codes.values().sum();
        let by_code: Vec<String> = codes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        eprintln!("| {} | {total} | {} |", op.label(), by_code.join(", "));
    }
}

fn print_recovery(title: &str, times: &BTreeMap<(usize, Op), Duration>) {
    eprintln!("\n{title}\n| request | replica 0 | replica 1 |\n| --- | --- | --- |");
    for op in Op::ALL {
        eprintln!(
            "| {} | {:.2} s | {:.2} s |",
            op.label(),
            times[&(0, op)].as_secs_f64(),
            times[&(1, op)].as_secs_f64()
        );
    }
    for replica in 0..2 {
        let worst = Op::ALL
            .iter()
            .map(|op| times[&(replica, *op)])
            .max()
            .unwrap();
        eprintln!(
            "replica {replica} serves everything again {:.2} s after PostgreSQL's return",
            worst.as_secs_f64()
        );
    }
}

/// Blocks the test's thread while PostgreSQL stops or starts.
fn blocking(f: impl FnOnce()) {
    tokio::task::block_in_place(f);
}

/// Lists as `token` at `client` until `tool` is listed (bounded), for a
/// tenant of the store (its first listing loads it; UNAVAILABLE while the
/// store is coming back).
async fn wait_serves(
    client: &mut ToolGatewayClient<Channel>,
    token: &str,
    tool: &str,
    bound: Duration,
) {
    let started = Instant::now();
    loop {
        let listing = client
            .list_tools(with_deadline(authed(
                token,
                pb::ListToolsRequest::default(),
            )))
            .await;
        let last = match listing {
            Ok(listing) => {
                let listing = listing.into_inner();
                if names(&listing).iter().any(|n| n == tool) {
                    return;
                }
                format!("{:?} {:?}", names(&listing), listing.servers)
            }
            Err(status) => format!("{status:?}"),
        };
        assert!(
            started.elapsed() < bound,
            "{tool} not served for {token} within {bound:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Completes the consent of `code` as `user` at `client`, retrying while
/// UNAVAILABLE (with RetryInfo), bounded; returns the answers seen.
async fn complete_consent(
    client: &mut ToolGatewayClient<Channel>,
    user: &str,
    code: &str,
) -> Vec<Code> {
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        match confirm(client, user, code).await {
            Ok(server) => {
                assert_eq!(server, "docs");
                seen.push(Code::Ok);
                return seen;
            }
            Err(status) if status.code() == Code::Unavailable => {
                assert!(status.get_details_retry_info().is_some(), "{status:?}");
                seen.push(Code::Unavailable);
            }
            Err(status) => panic!("{user}'s consent: {status:?} after {seen:?}"),
        }
        assert!(
            started.elapsed() < RECOVERY_BOUND,
            "{user}'s consent never completed: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A consent link for `user`, followed in the browser: the code its
/// application confirms.
async fn held_consent(client: &mut ToolGatewayClient<Channel>, user: &str, port: u16) -> String {
    let status = call_settled(client, Some(user), "docs__whoami")
        .await
        .unwrap_err();
    let (status, code) = consent(&authorization_url(&status), user, port).await;
    assert_eq!(status, 303, "{code}");
    code
}

/// A connection of the test's own to PostgreSQL that makes the gateway's
/// writes wait mid-transaction: it holds the advisory locks every tenant
/// write and acme's task puts take first, and, in an open transaction, a
/// row for Carol's token that her consent's write conflicts with.
struct Blocker {
    locks: sqlx::AnyConnection,
    _row: sqlx::AnyConnection,
}

impl Blocker {
    async fn hold(url: &str) -> Blocker {
        use sqlx::Connection as _;
        let mut locks = sqlx::AnyConnection::connect(url).await.unwrap();
        for key in [
            toolgate::state::tenants::TENANT_LOCK_KEY,
            toolgate::state::tasks_lock_key("acme"),
        ] {
            sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_lock($1)) AS locked")
                .bind(key)
                .execute(&mut locks)
                .await
                .unwrap();
        }
        // Carol's subject key is Alice's with her name.
        let alice: String = sqlx::query_scalar(
            "SELECT subject FROM toolgate_tokens WHERE tenant = 'acme' AND server = 'docs'",
        )
        .fetch_one(&mut locks)
        .await
        .unwrap();
        assert!(alice.contains("alice"), "{alice}");
        let mut row = sqlx::AnyConnection::connect(url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut row).await.unwrap();
        sqlx::query(
            "INSERT INTO toolgate_tokens \
             (tenant, subject, server, version, sealed_with_version, updated_at_ms) \
             VALUES ('acme', $1, 'docs', 1, $2, 0)",
        )
        .bind(alice.replace("alice", "carol"))
        .bind(vec![0u8])
        .execute(&mut row)
        .await
        .unwrap();
        Blocker { locks, _row: row }
    }

    /// Waits (bounded) until `count` requests wait on the blocker's locks
    /// and row; returns how many do.
    async fn wait_for_waiters(&mut self, count: i64) -> i64 {
        let started = Instant::now();
        loop {
            let waiting: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted")
                    .fetch_one(&mut self.locks)
                    .await
                    .unwrap();
            if waiting >= count {
                return waiting;
            }
            assert!(
                started.elapsed() < Duration::from_secs(4),
                "only {waiting} requests wait mid-transaction"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The test of issue 37's last item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_ride_out_a_postgresql_outage_and_a_restart_mid_transaction() {
    let started = Instant::now();
    // The test's own HTTP client (the browser) and database connection.
    let _ = rustls::crypto::ring::default_provider().install_default();
    sqlx::any::install_default_drivers();
    let mut pg = PgCluster::start();
    let state_url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let tasks_log = dir.path().join("tasks_server.log");
    let (_tasks_server, tasks_url) = crate::tasks::start_tasks_http(&tasks_log).await;
    let oauth = upstream(3600);
    let plain = serve_mcp(TestServer::new(&["echo"])).await;
    let urls = [
        state_url.as_str(),
        plain.url.as_str(),
        tasks_url.as_str(),
        oauth.mcp_url.as_str(),
    ];
    let first = Replica::start(dir.path(), 0, None, urls);
    let second = Replica::start(dir.path(), 1, Some(first.consent), urls);
    // Both replicas are one public consent URL; the second listens on its
    // own port too (the test delivers callbacks to either).
    let replicas = [&first, &second];
    let mut gateways = Vec::new();
    let mut admins = Vec::new();
    for replica in replicas {
        replica.wait_for(replica.port).await;
        replica.wait_for(replica.admin).await;
        let mut gateway = client_at(replica.port).await;
        wait_listed(&mut gateway, TOKEN, "plain__echo").await;
        wait_listed(&mut gateway, TOKEN, "tasks__optional_task").await;
        gateways.push(gateway);
        admins.push(
            AdminClient::connect(format!("http://127.0.0.1:{}", replica.admin))
                .await
                .unwrap(),
        );
    }

    // Alice consents and her application confirms it; Bob and Carol get as
    // far as the held consent, confirmed later (during the outage, and at
    // the restart).
    let alice = held_consent(&mut gateways[0], "alice", first.consent).await;
    assert_eq!(
        complete_consent(&mut gateways[0], "alice", &alice).await,
        [Code::Ok]
    );
    let bob = held_consent(&mut gateways[1], "bob", first.consent).await;
    let carol = held_consent(&mut gateways[0], "carol", first.consent).await;
    for gateway in &mut gateways {
        assert_eq!(
            call_settled(gateway, Some("alice"), "docs__whoami")
                .await
                .unwrap(),
            "alice"
        );
    }

    // The writers' tenants, loaded at both replicas.
    let told = Arc::new(Mutex::new(Told::default()));
    for (admin, tenant) in admins.iter_mut().zip(WRITERS) {
        let created = admin
            .put_tenant(authed(
                ADMIN,
                toolgate::pb::admin::PutTenantRequest {
                    name: tenant.into(),
                    spec_yaml: writer_spec(tenant, 1, &plain.url),
                    expected_version: String::new(),
                },
            ))
            .await
            .unwrap()
            .into_inner();
        told.lock()
            .unwrap()
            .writes
            .insert(tenant, vec![(created.version.parse().unwrap(), 1)]);
        for gateway in &mut gateways {
            wait_serves(
                gateway,
                &format!("{tenant}-token"),
                "g1__echo",
                RECOVERY_BOUND,
            )
            .await;
        }
    }
    let setup = started.elapsed();

    // The load.
    let record = Record::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for replica in 0..2 {
        loops.extend(
            Load {
                replica,
                gateway: gateways[replica].clone(),
                other: gateways[1 - replica].clone(),
                admin: admins[replica].clone(),
                record: record.clone(),
                told: told.clone(),
                stop: stop.clone(),
                plain_url: plain.url.clone(),
            }
            .spawn(),
        );
    }
    let load_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // 1. PostgreSQL stopped (fast: its clients are disconnected) for 10 s.
    blocking(|| pg.stop());
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Bob's application confirms his consent while the store is down.
    let mut consent_answers = Vec::new();
    match confirm(&mut gateways[1], "bob", &bob).await {
        Ok(_) => panic!("a consent completed with the store down"),
        Err(status) => {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            assert_eq!(reason(&status), "STATE_UNAVAILABLE", "{status:?}");
            assert!(status.get_details_retry_info().is_some(), "{status:?}");
            consent_answers.push(format!(
                "during the outage: {:?} {}",
                status.code(),
                reason(&status)
            ));
        }
    }
    tokio::time::sleep(OUTAGE.saturating_sub(down.elapsed())).await;
    blocking(|| pg.restart());
    let back = Instant::now();
    let outage_recovery = recovered(&record, back, "after the outage").await;
    // Bob's application tries again: it completes once, and only once.
    let bob_answers = complete_consent(&mut gateways[1], "bob", &bob).await;
    consent_answers.push(format!("after the outage: {bob_answers:?}"));
    let again = confirm(&mut gateways[0], "bob", &bob).await.unwrap_err();
    assert_eq!(reason(&again), "CONSENT_CODE_INVALID", "{again:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 2. PostgreSQL killed (immediate) and started again with writes in
    // flight: a connection of the test's own holds the locks that tenant
    // writes and acme's task puts take inside their transactions, and an
    // uncommitted row of its own for Carol's token, so the admin writes,
    // the task calls (the server has them) and Carol's consent completion
    // (its code taken) all wait mid-transaction when PostgreSQL dies.
    let before_crash = Instant::now();
    let mut blocker = Blocker::hold(&state_url).await;
    let carol_client = gateways[0].clone();
    let carol_code = carol.clone();
    let carol_task = tokio::spawn(async move {
        let mut client = carol_client;
        complete_consent(&mut client, "carol", &carol_code).await
    });
    let waiting = blocker.wait_for_waiters(5).await;
    blocking(|| {
        pg.crash();
        pg.restart();
    });
    drop(blocker);
    let back_again = Instant::now();
    let crash_recovery = recovered(&record, back_again, "after the restart").await;
    let carol_answers = carol_task.await.unwrap();
    consent_answers.push(format!("at the restart: {carol_answers:?}"));
    let again = confirm(&mut gateways[1], "carol", &carol)
        .await
        .unwrap_err();
    assert_eq!(reason(&again), "CONSENT_CODE_INVALID", "{again:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for handle in loops {
        handle.await.unwrap();
    }
    let ended = Instant::now();
    let outcomes = record.all();

    // The figures.
    let before = tally(&outcomes, load_started, down);
    let outage = tally(&outcomes, down, back);
    let after = tally(&outcomes, back, before_crash);
    let crash = tally(&outcomes, before_crash, ended);
    let total = tally(&outcomes, load_started, ended);
    eprintln!(
        "\nstore faults: setup {:.1} s, load {:.1} s, outage {:.1} s",
        setup.as_secs_f64(),
        (ended - load_started).as_secs_f64(),
        (back - down).as_secs_f64()
    );
    print_tally("sent before the outage (3 s)", &before);
    print_tally("sent while PostgreSQL was stopped (10 s)", &outage);
    let waits: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.sent >= down && o.sent < back && o.code == Code::Unavailable)
        .map(|o| (o.at - o.sent).as_secs_f64())
        .collect();
    eprintln!(
        "UNAVAILABLE answers during the outage took {:.2} to {:.2} s",
        waits.iter().copied().fold(f64::INFINITY, f64::min),
        waits.iter().copied().fold(0.0, f64::max)
    );
    print_recovery(
        "time from PostgreSQL's return to the first answer served",
        &outage_recovery,
    );
    print_tally("sent after its return", &after);
    print_tally(
        "sent from 2 s after its return: killed and started again mid-transaction, and after",
        &crash,
    );
    print_recovery(
        "time from its start after the kill to the first answer served",
        &crash_recovery,
    );
    print_tally("all", &total);
    eprintln!(
        "\nat the kill: {waiting} requests waited on locks mid-transaction; consents: \
         {consent_answers:?}"
    );

    // Calls that need no store go on: all of them succeed.
    let plain_failures: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.op == Op::Plain && o.code != Code::Ok)
        .collect();
    assert!(
        plain_failures.is_empty(),
        "calls needing no store failed: {plain_failures:?}"
    );
    // Every store-dependent failure is UNAVAILABLE with RetryInfo (or, for
    // an unknown token the store answered for, UNAUTHENTICATED).
    // A task call whose task the store failed to keep after the server had
    // it is UNKNOWN without RetryInfo (the tool may have acted): the one
    // other answer allowed, counted against the server's calls below.
    let in_doubt = |o: &Outcome| {
        o.op == Op::TaskCreate
            && o.code == Code::Unknown
            && o.reason == "STATE_UNAVAILABLE"
            && !o.retry_info
    };
    let refused: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| {
            let retryable = o.code == Code::Unavailable && o.retry_info;
            !(o.op.served(o.code) || retryable || in_doubt(o))
        })
        .collect();
    assert!(
        refused.is_empty(),
        "failures other than UNAVAILABLE with RetryInfo: {refused:?}"
    );
    // Both phases really were outages (the kill: for the writes held).
    for (phase, table, ops) in [
        (
            "the outage",
            &outage,
            &[
                Op::TaskCreate,
                Op::TaskGet,
                Op::UnknownToken,
                Op::AdminWrite,
                Op::UserCall,
            ][..],
        ),
        ("the kill", &crash, &[Op::AdminWrite][..]),
    ] {
        for &op in ops {
            let unavailable = table
                .get(&op)
                .map(|codes| {
                    codes
                        .iter()
                        .filter(|(k, _)| k.starts_with("Unavailable"))
                        .map(|(_, v)| v)
                        .sum()
                })
                .unwrap_or(0usize);
            assert!(
                unavailable > 0,
                "{:?}: no UNAVAILABLE during {phase}: {table:?}",
                op
            );
        }
    }

    // Nothing sent upstream unrecorded: the tasks server saw one
    // tools/call per task handed out, none for a refused call.
    let told = std::mem::take(&mut *told.lock().unwrap());
    let task_calls = upstream_calls(&tasks_log, "optional_task");
    let tasks_in_doubt = outcomes.iter().filter(|o| in_doubt(o)).count();
    assert_eq!(
        task_calls,
        told.tasks.len() + tasks_in_doubt,
        "the tasks server received {task_calls} calls for {} tasks handed out and \
         {tasks_in_doubt} answered UNKNOWN (an UNAVAILABLE call reached the server)",
        told.tasks.len()
    );
    // The task calls held mid-transaction at the kill were in doubt, and
    // the server's tasks that could not be kept were cancelled.
    assert!(
        tasks_in_doubt >= 2,
        "the task calls held at the kill are UNKNOWN: {crash:?}"
    );
    let waited = Instant::now();
    while upstream_requests(&tasks_log, "tasks/cancel") < tasks_in_doubt {
        assert!(
            waited.elapsed() < RECOVERY_BOUND,
            "{tasks_in_doubt} tasks not kept, {} tasks/cancel at the server",
            upstream_requests(&tasks_log, "tasks/cancel")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cancels = upstream_requests(&tasks_log, "tasks/cancel");
    // Every task handed out is findable at both replicas.
    for (task_id, made_at) in &told.tasks {
        for gateway in &mut gateways {
            let task = gateway
                .get_task(with_deadline(authed(
                    TOKEN,
                    pb::GetTaskRequest {
                        task_id: task_id.clone(),
                    },
                )))
                .await
                .unwrap_or_else(|s| panic!("task made at replica {made_at} not found: {s:?}"))
                .into_inner();
            assert_eq!(task.status, pb::TaskStatus::Completed as i32, "{task:?}");
        }
    }
    let raw = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&state_url)
        .await
        .unwrap();
    let stored_tasks: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM toolgate_tasks WHERE tenant = 'acme'")
            .fetch_one(&raw)
            .await
            .unwrap();
    assert_eq!(
        stored_tasks as usize,
        told.tasks.len(),
        "tasks stored == tasks handed out"
    );

    // No admin change lost or applied twice: each writer tenant is stored
    // at the last version its client was told, with that spec, and the
    // change log has one `put` per write told OK.
    assert!(
        told.applied_though_refused.is_empty(),
        "writes told UNAVAILABLE were applied: {:?}",
        told.applied_though_refused
    );
    let mut write_figures = Vec::new();
    for tenant in WRITERS {
        let writes = &told.writes[tenant];
        let (version, generation) = *writes.last().unwrap();
        let row: (i64,) = sqlx::query_as("SELECT version FROM toolgate_tenants WHERE name = $1")
            .bind(tenant)
            .fetch_one(&raw)
            .await
            .unwrap();
        assert_eq!(
            row.0, version,
            "{tenant}: the stored version is the last one told"
        );
        let changes: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM toolgate_tenant_changes WHERE tenant = $1 AND kind = 'put'",
        )
        .bind(tenant)
        .fetch_one(&raw)
        .await
        .unwrap();
        assert_eq!(
            changes as usize,
            writes.len(),
            "{tenant}: one change logged per write told OK"
        );
        let stored = admins[0]
            .get_tenant(authed(
                ADMIN,
                toolgate::pb::admin::GetTenantRequest {
                    name: tenant.into(),
                },
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            stored.spec_yaml,
            writer_spec(tenant, generation, &plain.url)
        );
        // Both replicas follow it: they serve the last generation.
        for gateway in &mut gateways {
            wait_serves(
                gateway,
                &format!("{tenant}-token"),
                &format!("g{generation}__echo"),
                RECOVERY_BOUND,
            )
            .await;
        }
        write_figures.push(format!(
            "{tenant}: {} writes told OK, {changes} logged, the last served at both replicas \
             {:.2} s after the load ended",
            writes.len(),
            ended.elapsed().as_secs_f64()
        ));
    }
    // The consents confirmed across the faults serve their users at both
    // replicas.
    for gateway in &mut gateways {
        for user in ["bob", "carol"] {
            assert_eq!(
                call_settled(gateway, Some(user), "docs__whoami")
                    .await
                    .unwrap(),
                user
            );
        }
    }
    eprintln!(
        "\ninvariants: {} tasks handed out, {tasks_in_doubt} UNKNOWN (task not kept), \
         {task_calls} tools/call at the server, {cancels} tasks/cancel, {stored_tasks} stored, \
         all found at both \
         replicas; {}; replicas' logs: {}, {}",
        told.tasks.len(),
        write_figures.join("; "),
        first.log.display(),
        second.log.display()
    );
}
