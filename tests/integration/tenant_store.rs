//! Tenants of the state store, followed by every replica: two `toolgate
//! serve` processes on one real PostgreSQL (notices, polling after the
//! notice connection is lost, resync when the store is back), one gateway
//! on SQLite (polling). Tenants are written with the state API directly,
//! as the admin API does.

use std::path::Path;
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::callers::TokenDigest;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;
use toolgate::state::tenants::Expect;
use toolgate::state::{KeyRing, StateStore};

use crate::common::{
    ChildGuard, PgCluster, TestGateway, client_at, fixture, free_port, invoke, python, reason,
    scrape, serve_binary, wait_for_port,
};

const STATE_KEY: &str = "dGVuYW50LXN0b3JlLXRlc3Qta2V5LTMyLWJ5dGVzISE=";
const TOKEN: &str = "store-tenant-token";

/// How long a change may take to reach a replica here (the goal is about a
/// second; the bound leaves room for a loaded machine and, for a changed
/// stdio server, its new child's start). The resync (every 60 s here) never
/// comes into it: notices and polling do.
const FOLLOW_BOUND: Duration = Duration::from_secs(5);

/// How long a new tenant's token may stay refused after its write (it was
/// refused, and so remembered as unknown, just before).
const NEW_TOKEN_BOUND: Duration = Duration::from_secs(2);

async fn store(url: &str) -> StateStore {
    let keys = KeyRing::from_base64(&[STATE_KEY]).unwrap();
    StateStore::connect(url, keys).await.unwrap()
}

/// A tenant spec with two stdio servers (`a`, `b`) of the process fixture;
/// `generation` goes into `b`'s environment, so changing it changes `b`
/// only.
fn spec(generation: u32) -> String {
    let command = format!(
        "[\"{}\", \"{}\"]",
        python().display(),
        fixture("python/process_server.py").display()
    );
    format!(
        "tokens: [\"{TOKEN}\"]\nservers:\n  - name: a\n    command: {command}\n  - name: b\n    \
         command: {command}\n    env:\n      GENERATION: \"{generation}\"\n"
    )
}

fn digests() -> Vec<TokenDigest> {
    vec![TokenDigest::of(TOKEN)]
}

/// The configuration of one replica.
fn config(port: u16, metrics: u16, url: &str, poll: &str) -> String {
    format!(
        "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nmetrics:\n  listen: \
         \"127.0.0.1:{metrics}\"\nstate:\n  url: \"{url}\"\n  keys: [\"{STATE_KEY}\"]\nadmin:\n  \
         listen: \"127.0.0.1:{}\"\n  allow_stdio_servers: true\ntenant_store:\n  poll_interval: \
         \"{poll}\"\n  resync_interval: \"60s\"\ntenants: []\n",
        free_port()
    )
}

/// One `toolgate serve` process.
struct Replica {
    _process: ChildGuard,
    port: u16,
    metrics: u16,
}

impl Replica {
    fn start(dir: &Path, index: usize, url: &str) -> Replica {
        let port = free_port();
        let metrics = free_port();
        let path = dir.join(format!("gateway{index}.yaml"));
        std::fs::write(&path, config(port, metrics, url, "1s")).unwrap();
        let log = dir.join(format!("gateway{index}.log"));
        Replica {
            _process: serve_binary(&path, &log, &[]),
            port,
            metrics,
        }
    }

    async fn client(&self) -> ToolGatewayClient<Channel> {
        wait_for_port(self.port).await;
        client_at(self.port).await
    }
}

/// The pid of server `server`'s child, as the tenant of [`TOKEN`] sees it.
async fn pid(
    client: &mut ToolGatewayClient<Channel>,
    server: &str,
) -> Result<String, tonic::Status> {
    invoke(client, TOKEN, &format!("{server}__pid"), "{}")
        .await
        .map(|r| r.text)
}

/// Calls `server__pid` until it answers (bounded), returning the pid and
/// how long it took.
async fn wait_pid(client: &mut ToolGatewayClient<Channel>, server: &str) -> (String, Duration) {
    let started = Instant::now();
    loop {
        match pid(client, server).await {
            Ok(pid) => return (pid, started.elapsed()),
            Err(status) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "{server}__pid never answered: {status:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded by [`FOLLOW_BOUND`]) until `check` holds for the answer
/// of `server__pid`.
async fn wait_until(
    client: &mut ToolGatewayClient<Channel>,
    server: &str,
    what: &str,
    check: impl Fn(&Result<String, tonic::Status>) -> bool,
) {
    let started = Instant::now();
    loop {
        let answer = pid(client, server).await;
        if check(&answer) {
            return;
        }
        assert!(
            started.elapsed() < FOLLOW_BOUND,
            "{what} not seen within {FOLLOW_BOUND:?}: last answer {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until server `b` no longer answers from session `old` (bounded
/// by [`FOLLOW_BOUND`]: the change was applied), then until its new session
/// answers (its child may take a while to start).
async fn b_replaced(client: &mut ToolGatewayClient<Channel>, old: &str, what: &str) {
    let old_pid = old.to_owned();
    wait_until(
        client,
        "b",
        what,
        move |answer| !matches!(answer, Ok(pid) if *pid == old_pid),
    )
    .await;
    let (new, _) = wait_pid(client, "b").await;
    assert_ne!(new, old, "{what}: b answers from a new session");
}

/// Waits until [`TOKEN`] is accepted, bounded by [`NEW_TOKEN_BOUND`].
async fn token_works(client: &mut ToolGatewayClient<Channel>) {
    let started = Instant::now();
    loop {
        // A listing waits for servers still connecting: a short deadline
        // tells an accepted token (OK, or DEADLINE_EXCEEDED) at once.
        let mut request = crate::common::authed(TOKEN, pb::ListToolsRequest::default());
        request.set_timeout(Duration::from_millis(200));
        match client.list_tools(request).await {
            Err(status) if status.code() == Code::Unauthenticated => assert!(
                started.elapsed() < NEW_TOKEN_BOUND,
                "the new tenant's token is still refused after {:?}: {status:?}",
                started.elapsed()
            ),
            _ => return,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn unauthenticated(answer: &Result<String, tonic::Status>) -> bool {
    matches!(answer, Err(status) if status.code() == Code::Unauthenticated)
}

/// A metric's value on a replica (0 when absent).
async fn metric(replica: &Replica, series: &str) -> f64 {
    crate::common::sample(&scrape(replica.metrics).await, series)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Two replicas on one PostgreSQL: a tenant written serves on both at
/// once (its token was refused just before: the unknown-token cache is
/// cleared by the change's notice); an update of one server keeps the
/// other's session (same child pid) on both; with PostgreSQL stopped the
/// loaded tenant keeps serving, an unknown token is UNAVAILABLE
/// TENANT_STORE_UNAVAILABLE with RetryInfo; once it is back a change is
/// applied on both; a delete ends the tenant's calls with UNAUTHENTICATED
/// on both, and its streams.
#[tokio::test]
async fn replicas_follow_the_tenants_of_postgresql() {
    let mut pg = PgCluster::start();
    let url = pg.url();
    let writer = store(&url).await;
    let dir = tempfile::tempdir().unwrap();
    let replicas = [
        Replica::start(dir.path(), 0, &url),
        Replica::start(dir.path(), 1, &url),
    ];
    let mut clients = Vec::new();
    for replica in &replicas {
        clients.push(replica.client().await);
    }

    // Unknown on both (and remembered as unknown).
    for client in &mut clients {
        assert!(unauthenticated(&pid(client, "a").await));
    }
    let version = writer
        .put_tenant("acme", &spec(1), Expect::Absent, &digests())
        .await
        .unwrap();
    let written = Instant::now();
    for client in &mut clients {
        token_works(client).await;
    }
    assert!(
        written.elapsed() < NEW_TOKEN_BOUND,
        "both replicas accept the new tenant's token within {NEW_TOKEN_BOUND:?} of its write: {:?}",
        written.elapsed()
    );
    let mut pids = Vec::new();
    for client in &mut clients {
        let (a, _) = wait_pid(client, "a").await;
        let (b, _) = wait_pid(client, "b").await;
        assert_ne!(a, b);
        pids.push((a, b));
    }
    for replica in &replicas {
        assert_eq!(metric(replica, "toolgate_store_tenants_loaded").await, 1.0);
        assert!(metric(replica, "toolgate_store_tenant_loads_total{outcome=\"ok\"}").await >= 1.0);
    }

    // An update of `b` only: `a` keeps its session (its child) on both.
    let version = writer
        .put_tenant("acme", &spec(2), Expect::Version(version), &digests())
        .await
        .unwrap();
    for (client, (a, b)) in clients.iter_mut().zip(&pids) {
        let old_b = b.clone();
        b_replaced(client, &old_b, "b's new session").await;
        assert_eq!(&pid(client, "a").await.unwrap(), a, "a's session was kept");
    }
    for replica in &replicas {
        let lag = metric(replica, "toolgate_tenant_change_lag_seconds_count").await;
        assert!(lag >= 1.0, "the change's lag is recorded: {lag}");
    }

    // The store goes away: the loaded tenant keeps serving; an unknown
    // token cannot be told.
    pg.stop();
    for (client, (a, _)) in clients.iter_mut().zip(&pids) {
        assert_eq!(&pid(client, "a").await.unwrap(), a);
        let status = invoke(client, "not-a-token", "a__pid", "{}")
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(reason(&status), "TENANT_STORE_UNAVAILABLE");
        assert!(status.get_details_retry_info().is_some(), "{status:?}");
    }

    // Back: a change made now reaches both.
    pg.restart();
    let writer = store(&url).await;
    let mut current_b = Vec::new();
    for client in &mut clients {
        current_b.push(pid(client, "b").await.unwrap());
    }
    let _ = writer
        .put_tenant("acme", &spec(3), Expect::Version(version), &digests())
        .await
        .unwrap();
    for (client, old_b) in clients.iter_mut().zip(current_b) {
        b_replaced(client, &old_b, "the change made after the store came back").await;
    }

    // A stream of the tenant, then a delete: calls and the stream end.
    let mut watch = clients[0]
        .watch_tools(crate::common::authed(
            TOKEN,
            pb::WatchToolsRequest::default(),
        ))
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().expect("the first snapshot");
    writer.delete_tenant("acme", Expect::Any).await.unwrap();
    for client in &mut clients {
        wait_until(client, "a", "the delete", unauthenticated).await;
    }
    let ended = tokio::time::timeout(FOLLOW_BOUND, async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the stream ends");
    let status = ended.expect("the stream ends with a status");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    for replica in &replicas {
        assert_eq!(metric(replica, "toolgate_store_tenants_loaded").await, 0.0);
    }
}

/// One gateway on SQLite (no notices: the change log is polled): a
/// tenant written serves, an update applies keeping the unchanged server's
/// session, a spec that does not validate here is counted and the loaded
/// version keeps serving, a delete refuses its token.
#[tokio::test]
async fn a_gateway_on_sqlite_polls_the_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    let writer = store(&url).await;
    let metrics = free_port();
    let yaml = config(0, metrics, &url, "200ms");
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    assert!(unauthenticated(&pid(&mut client, "a").await));
    let version = writer
        .put_tenant("acme", &spec(1), Expect::Absent, &digests())
        .await
        .unwrap();
    token_works(&mut client).await;
    let (a, _) = wait_pid(&mut client, "a").await;
    let (b, _) = wait_pid(&mut client, "b").await;
    let version = writer
        .put_tenant("acme", &spec(2), Expect::Version(version), &digests())
        .await
        .unwrap();
    b_replaced(&mut client, &b, "b's new session").await;
    assert_eq!(
        pid(&mut client, "a").await.unwrap(),
        a,
        "a's session was kept"
    );
    let b = pid(&mut client, "b").await.unwrap();

    // A spec this gateway refuses (a host variable `admin.host_secrets`
    // does not list): logged and counted, the loaded version kept.
    let invalid = spec(3).replace("GENERATION: \"3\"", "GENERATION: {env: HOME}");
    assert_ne!(invalid, spec(3));
    let version = writer
        .put_tenant("acme", &invalid, Expect::Version(version), &digests())
        .await
        .unwrap();
    let started = Instant::now();
    let series = "toolgate_store_tenant_loads_total{outcome=\"invalid\"}";
    while crate::common::sample(&scrape(metrics).await, series).is_none() {
        assert!(
            started.elapsed() < FOLLOW_BOUND,
            "the invalid spec was never counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        pid(&mut client, "a").await.unwrap(),
        a,
        "the loaded version serves"
    );
    assert_eq!(
        pid(&mut client, "b").await.unwrap(),
        b,
        "the loaded version serves"
    );

    // A valid one applies again.
    writer
        .put_tenant("acme", &spec(4), Expect::Version(version), &digests())
        .await
        .unwrap();
    b_replaced(&mut client, &b, "the valid spec after the invalid one").await;
    writer.delete_tenant("acme", Expect::Any).await.unwrap();
    wait_until(&mut client, "a", "the delete", unauthenticated).await;
    gateway.shutdown().await;
}

/// `server__pid` as the tenant of `token`, waited for (bounded).
async fn pid_of(client: &mut ToolGatewayClient<Channel>, token: &str, server: &str) -> u32 {
    let started = Instant::now();
    loop {
        match invoke(client, token, &format!("{server}__pid"), "{}").await {
            Ok(response) => return response.text.trim().parse().unwrap(),
            Err(status) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "{server}__pid never answered: {status:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With `tenant_store.max_loaded: 1`, loading a second tenant unloads the
/// first (its children stop); the first's next caller loads it again.
#[tokio::test]
async fn loading_beyond_max_loaded_unloads_the_least_recently_used_tenant() {
    const BETA: &str = "beta-store-token";
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    let writer = store(&url).await;
    writer
        .put_tenant("acme", &spec(1), Expect::Absent, &digests())
        .await
        .unwrap();
    writer
        .put_tenant(
            "beta",
            &spec(1).replace(TOKEN, BETA),
            Expect::Absent,
            &[TokenDigest::of(BETA)],
        )
        .await
        .unwrap();
    let metrics = free_port();
    let yaml = config(0, metrics, &url, "1s")
        .replace("tenant_store:\n", "tenant_store:\n  max_loaded: 1\n");
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let page = scrape(metrics).await;
    assert_eq!(
        crate::common::sample(&page, "toolgate_store_tenants_loaded"),
        Some("0".to_owned()),
        "nothing is read at start"
    );

    let acme = pid_of(&mut client, TOKEN, "a").await;
    assert!(crate::common::process_alive(acme));
    let beta = pid_of(&mut client, BETA, "a").await;
    assert_ne!(acme, beta);
    let page = scrape(metrics).await;
    assert_eq!(
        crate::common::sample(&page, "toolgate_store_tenants_loaded"),
        Some("1".to_owned())
    );
    assert_eq!(
        crate::common::sample(&page, "toolgate_store_tenants_evicted_total"),
        Some("1".to_owned())
    );
    let started = Instant::now();
    while crate::common::process_alive(acme) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the unloaded tenant's child {acme} still runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(crate::common::process_alive(beta));

    // acme's next caller loads it again (and beta makes room).
    let again = pid_of(&mut client, TOKEN, "a").await;
    assert_ne!(again, acme);
    let page = scrape(metrics).await;
    assert_eq!(
        crate::common::sample(&page, "toolgate_store_tenants_evicted_total"),
        Some("2".to_owned())
    );
    gateway.shutdown().await;
}
