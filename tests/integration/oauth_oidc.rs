//! Upstream OAuth end to end against an authorization server nobody here
//! wrote: `oidc-provider` (an OpenID Certified implementation, from npm;
//! tests/fixtures/node/oidc_as.mjs configures it: dynamic registration,
//! PKCE S256, RFC 8707 resource indicators, refresh-token rotation, client
//! credentials, introspection, RFC 9207 `iss`, its built-in login and
//! consent pages) guarding an MCP server written with the official
//! `@modelcontextprotocol/sdk` (oauth_mcp_server.mjs: the SDK's
//! `requireBearerAuth` over introspection, `mcpAuthMetadataRouter`, tools
//! `whoami` and `echo`). consent_browser.mjs plays the end user's browser
//! through oidc-provider's login and consent pages and delivers the final
//! redirect to a gateway's consent listener.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;
use crate::oauth::{call, call_settled, confirm, listing, server};

/// A state-store key (32 bytes, base64).
const STATE_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
/// The pre-registered client-credentials client at the authorization server.
const SVC_ID: &str = "svc";
const SVC_SECRET: &str = "svc-secret-0123456789";
/// The resource server's own client, for introspection.
const RS_ID: &str = "mcp-rs";
const RS_SECRET: &str = "rs-secret-0123456789";

/// Starts a Node fixture with its stderr in `log`, and reads the
/// `LISTENING <port>` line it prints.
pub(crate) fn start_node(script: &str, args: &[&str], log: &Path) -> (ChildGuard, u16) {
    let mut child = Command::new(node())
        .arg(fixture(&format!("node/{script}")))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("start {script}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    reader.read_line(&mut line).unwrap();
    // Keep reading: a write to a closed pipe would kill the fixture.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    let port = line
        .trim()
        .strip_prefix("LISTENING ")
        .unwrap_or_else(|| {
            panic!(
                "{script} printed {line:?}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })
        .parse()
        .unwrap();
    (guard, port)
}

/// oidc-provider and the SDK's protected MCP server, with their logs.
struct Upstream {
    _as: ChildGuard,
    _rs: ChildGuard,
    as_url: String,
    mcp_url: String,
    logs: tempfile::TempDir,
}

impl Upstream {
    /// Both fixtures' logs (oidc-provider's events, the server's errors),
    /// for failure messages.
    fn logs(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.logs.path().join(name)).unwrap_or_default();
        format!(
            "--- oidc_as.log\n{}--- oauth_mcp_server.log\n{}",
            read("oidc_as.log"),
            read("oauth_mcp_server.log")
        )
    }

    /// The authorization server's event counters (`/admin/stats`).
    async fn stats(&self) -> serde_json::Value {
        let text = reqwest::get(format!("{}/admin/stats", self.as_url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// How many refresh_token grants the authorization server answered.
    async fn refreshes(&self) -> u64 {
        self.stats().await["token_requests"]["refresh_token"]
            .as_u64()
            .unwrap_or(0)
    }

    /// Drops every grant, token and session of `user` at the authorization
    /// server.
    async fn revoke(&self, user: &str) {
        let response = reqwest::Client::new()
            .post(format!("{}/admin/revoke?user={user}", self.as_url))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{response:?}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert!(
            body["revoked"].as_u64().unwrap() > 0,
            "nothing of {user} to revoke: {body}"
        );
    }
}

/// Starts both fixtures; access tokens (and client-credentials tokens) live
/// `token_ttl` seconds.
fn upstream(token_ttl: u32) -> Upstream {
    let logs = tempfile::tempdir().unwrap();
    // The authorization server names its one resource up front: the MCP
    // server's URL, on a port chosen here.
    let rs_port = free_port();
    let mcp_url = format!("http://127.0.0.1:{rs_port}/mcp");
    let ttl = token_ttl.to_string();
    let (as_guard, as_port) = start_node(
        "oidc_as.mjs",
        &[
            "--port",
            "0",
            "--resource",
            &mcp_url,
            "--token-ttl",
            &ttl,
            "--client-id",
            SVC_ID,
            "--client-secret",
            SVC_SECRET,
            "--rs-client-id",
            RS_ID,
            "--rs-client-secret",
            RS_SECRET,
        ],
        &logs.path().join("oidc_as.log"),
    );
    let as_url = format!("http://127.0.0.1:{as_port}");
    let (rs_guard, _) = start_node(
        "oauth_mcp_server.mjs",
        &[
            "--port",
            &rs_port.to_string(),
            "--as-url",
            &as_url,
            "--client-id",
            RS_ID,
            "--client-secret",
            RS_SECRET,
        ],
        &logs.path().join("oauth_mcp_server.log"),
    );
    Upstream {
        _as: as_guard,
        _rs: rs_guard,
        as_url,
        mcp_url,
        logs,
    }
}

/// A gateway configuration: `docs` per user (authorization code, dynamic
/// registration), `svc` for the tenant itself (client credentials), both on
/// the same MCP server. The consent listener binds `listen_port`; browsers
/// reach it (or a load balancer in front of every replica) at
/// `public_port`.
fn config(upstream: &Upstream, state_url: &str, listen_port: u16, public_port: u16) -> String {
    confirmed_config(
        upstream,
        state_url,
        (listen_port, public_port),
        "confirm_consent: false",
    )
}

/// [`config`] with `consent` (a tenant line: `consent_return_url: ...` or
/// `confirm_consent: false`).
fn confirmed_config(
    upstream: &Upstream,
    state_url: &str,
    (listen_port, public_port): (u16, u16),
    consent: &str,
) -> String {
    format!(
        r#"
state:
  url: "{state_url}"
  keys: [{{ env: STATE_KEY }}]
oauth:
  listen: 127.0.0.1:{listen_port}
  public_url: http://127.0.0.1:{public_port}
  allow_private_addresses: true
tenants:
  - name: acme
    tokens: [acme-token]
    {consent}
    servers:
      - name: docs
        url: "{mcp}"
        oauth: {{ grant: authorization_code }}
      - name: svc
        url: "{mcp}"
        oauth: {{ grant: client_credentials, client_id: {SVC_ID}, client_secret: {{ env: SVC_SECRET }}, token_endpoint_auth: client_secret_basic }}
"#,
        mcp = upstream.mcp_url
    )
}

fn env() -> [(&'static str, &'static str); 2] {
    [("STATE_KEY", STATE_KEY), ("SVC_SECRET", SVC_SECRET)]
}

/// `whoami` on the per-user server as `subject`, which must succeed.
async fn whoami(
    client: &mut ToolGatewayClient<Channel>,
    subject: &str,
    upstream: &Upstream,
) -> String {
    call_settled(client, Some(subject), "docs__whoami")
        .await
        .unwrap_or_else(|status| {
            panic!("{subject}'s whoami failed: {status:?}\n{}", upstream.logs())
        })
}

/// `whoami` on the per-user server as `subject`, which must be refused
/// with UPSTREAM_AUTHORIZATION_REQUIRED; returns the authorization URL.
async fn needs_consent(
    client: &mut ToolGatewayClient<Channel>,
    subject: Option<&str>,
    upstream: &Upstream,
) -> String {
    match call_settled(client, subject, "docs__whoami").await {
        Ok(text) => panic!("{subject:?} was served without consent: {text}"),
        Err(status) => authorization_url(&status, upstream),
    }
}

/// The authorization URL of an `UPSTREAM_AUTHORIZATION_REQUIRED` status.
fn authorization_url(status: &tonic::Status, upstream: &Upstream) -> String {
    assert_eq!(
        status.code(),
        tonic::Code::FailedPrecondition,
        "{status:?}\n{}",
        upstream.logs()
    );
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "UPSTREAM_AUTHORIZATION_REQUIRED", "{info:?}");
    let url = info
        .metadata
        .get("authorization_url")
        .cloned()
        .expect("authorization_url in the metadata");
    assert!(
        url.starts_with(&format!("{}/auth?", upstream.as_url)),
        "not oidc-provider's authorization endpoint: {url}"
    );
    url
}

/// Plays the browser (consent_browser.mjs): logs in at oidc-provider as
/// `user`, consents, and delivers the redirect to the consent listener on
/// `callback_port`. Returns the listener's status and page.
async fn consent(url: &str, user: &str, callback_port: u16, upstream: &Upstream) -> (u16, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(node())
            .arg(fixture("node/consent_browser.mjs"))
            .args([url, user, &callback_port.to_string()])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("consent_browser.mjs finishes within 60 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "consent_browser.mjs failed ({}): {}{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        stdout,
        upstream.logs()
    );
    let (first, page) = stdout.split_once('\n').unwrap_or((&stdout, ""));
    let code = first
        .strip_prefix("STATUS ")
        .unwrap_or_else(|| panic!("consent_browser.mjs printed {stdout:?}"))
        .parse()
        .unwrap();
    (code, page.to_owned())
}

/// A gateway in this process with its state in SQLite under `dir`.
async fn sqlite_gateway(upstream: &Upstream, dir: &Path) -> (TestGateway, u16) {
    let state_url = format!("sqlite://{}/state.db", dir.display());
    let consent_port = free_port();
    let yaml = config(upstream, &state_url, consent_port, consent_port);
    (TestGateway::start(&yaml, &env()).await, consent_port)
}

#[tokio::test]
async fn client_credentials_at_oidc_provider_serve_the_tenant() {
    let upstream = upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let (gateway, _) = sqlite_gateway(&upstream, dir.path()).await;
    let mut client = gateway.client().await;

    let who = call_settled(&mut client, None, "svc__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, format!("client:{SVC_ID}"));
    // An end user calling the tenant's own server acts as the tenant: no
    // consent, the client's identity upstream.
    let who = call(&mut client, Some("alice"), "svc__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, format!("client:{SVC_ID}"));

    let stats = upstream.stats().await;
    assert!(
        stats["token_requests"]["client_credentials"].as_u64() >= Some(1),
        "{stats}"
    );
    assert_eq!(stats["authorizations"], 0, "{stats}");
    assert_eq!(
        stats["token_errors"],
        serde_json::json!({}),
        "{stats}\n{}",
        upstream.logs()
    );
    gateway.shutdown().await;
}

/// What the real browser (consent_chromium.py) ended on.
#[derive(Debug)]
enum Browser {
    /// The tenant's application page, opened with this one-time code.
    Returned(String),
    /// A page of the gateway's (title and text).
    Page(String),
}

/// Plays `user`'s browser in headless Chromium (a fresh profile each time):
/// oidc-provider's login and consent pages, the gateway's callback, and the
/// tenant's application at 127.0.0.1:`app_port`. Screenshots and page
/// sources of every step are kept under `target/test-artifacts/` when the
/// test fails (removed when it passes).
async fn chromium_consent(url: &str, user: &str, app_port: u16, artifacts: &Path) -> Browser {
    let output = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(python())
            .arg(fixture("python/consent_chromium.py"))
            .args([url, user, &app_port.to_string()])
            .arg(artifacts.join(format!("{user}-{}", free_port())))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("consent_chromium.py finishes within 90 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "consent_chromium.py failed ({}): {}{stdout}
(screenshots in {})",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        artifacts.display()
    );
    if let Some(query) = stdout.trim().strip_prefix("RETURNED ") {
        let code = url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "code")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_else(|| panic!("the application was opened without a code: {query}"));
        return Browser::Returned(code);
    }
    match stdout.trim().strip_prefix("PAGE ") {
        Some(page) => Browser::Page(page.to_owned()),
        None => panic!("consent_chromium.py printed {stdout:?}"),
    }
}

/// The code a browser brought back to the application.
fn returned(browser: Browser) -> String {
    match browser {
        Browser::Returned(code) => code,
        Browser::Page(page) => panic!("the consent did not return to the application: {page}"),
    }
}

/// Screenshots of a test's browser runs, kept when it fails.
struct Artifacts(std::path::PathBuf);

impl Artifacts {
    fn new(test: &str) -> Self {
        Self(repo_root().join("target/test-artifacts").join(test))
    }
}

impl Drop for Artifacts {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The whole consent in a real browser (headless Chromium), against
/// oidc-provider's interactive login and consent pages: a link forwarded
/// to another user never makes that user's account usable by the link's
/// subject; each user's own link, confirmed by the application for that
/// user, serves that user only; a spent link completes nothing; a revoked
/// grant asks for consent again.
#[tokio::test]
async fn per_user_consent_in_chromium_binds_each_grant_to_its_user_and_survives_revocation() {
    let upstream = upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::new("consent-in-chromium");
    let state_url = format!("sqlite://{}/state.db", dir.path().display());
    let consent_port = free_port();
    let app_port = free_port();
    let yaml = confirmed_config(
        &upstream,
        &state_url,
        (consent_port, consent_port),
        &format!("consent_return_url: http://127.0.0.1:{app_port}/consent"),
    );
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;

    // Alice has not consented: a link to oidc-provider, with PKCE S256 and
    // the MCP server as the RFC 8707 resource; nothing runs.
    let url = needs_consent(&mut client, Some("alice"), &upstream).await;
    let query: std::collections::HashMap<String, String> = url::Url::parse(&url)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect();
    assert_eq!(
        query.get("code_challenge_method").map(String::as_str),
        Some("S256"),
        "{url}"
    );
    assert_eq!(query.get("resource"), Some(&upstream.mcp_url), "{url}");
    assert_eq!(
        query.get("redirect_uri"),
        Some(&format!(
            "http://127.0.0.1:{consent_port}/oauth/acme/docs/callback"
        )),
        "{url}"
    );
    let before = listing(&mut client, "alice").await;
    assert_eq!(
        server(&before, "docs").state,
        pb::ServerState::AuthorizationRequired as i32
    );
    assert_eq!(upstream.stats().await["registrations"], 1);

    // Mallory forwards her own link to Alice; Alice logs in and consents
    // in her browser. The application she is logged in to confirms for
    // her: refused, and nobody's account is usable through it.
    let mallorys = needs_consent(&mut client, Some("mallory"), &upstream).await;
    let code = returned(chromium_consent(&mallorys, "alice", app_port, &artifacts.0).await);
    let refused = confirm(&mut client, "alice", &code).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert_eq!(crate::common::reason(&refused), "CONSENT_SUBJECT_MISMATCH");
    needs_consent(&mut client, Some("mallory"), &upstream).await;

    // Alice's own link, in a fresh browser: confirmed for her, her next
    // call runs as her.
    let code = returned(chromium_consent(&url, "alice", app_port, &artifacts.0).await);
    assert_eq!(confirm(&mut client, "alice", &code).await.unwrap(), "docs");
    assert_eq!(whoami(&mut client, "alice", &upstream).await, "alice");
    let after = listing(&mut client, "alice").await;
    assert_eq!(
        server(&after, "docs").state,
        pb::ServerState::Connected as i32
    );
    assert!(names(&after).contains(&"docs__whoami".to_owned()));
    needs_consent(&mut client, Some("mallory"), &upstream).await;

    // Bob never borrows Alice's token: he consents himself.
    let bob_url = needs_consent(&mut client, Some("bob"), &upstream).await;
    let code = returned(chromium_consent(&bob_url, "bob", app_port, &artifacts.0).await);
    confirm(&mut client, "bob", &code).await.unwrap();
    assert_eq!(whoami(&mut client, "bob", &upstream).await, "bob");
    assert_eq!(whoami(&mut client, "alice", &upstream).await, "alice");
    // Without a subject the call is the tenant's own, which never consented.
    needs_consent(&mut client, None, &upstream).await;

    // Bob's link used again (a new login, a new code for the same `state`)
    // completes nothing: the gateway's page says so.
    match chromium_consent(&bob_url, "mallory", app_port, &artifacts.0).await {
        Browser::Page(page) => assert!(page.contains("expired or was already used"), "{page}"),
        other => panic!("a spent link went on to the application: {other:?}"),
    }
    assert_eq!(whoami(&mut client, "bob", &upstream).await, "bob");

    // Alice's grant is revoked at oidc-provider: her next call asks her to
    // consent again. Bob is untouched.
    upstream.revoke("alice").await;
    let again = needs_consent(&mut client, Some("alice"), &upstream).await;
    assert_eq!(whoami(&mut client, "bob", &upstream).await, "bob");
    let code = returned(chromium_consent(&again, "alice", app_port, &artifacts.0).await);
    confirm(&mut client, "alice", &code).await.unwrap();
    assert_eq!(whoami(&mut client, "alice", &upstream).await, "alice");

    // One registration served every consent; four codes were exchanged
    // (Mallory's link, Alice's twice, Bob's).
    let stats = upstream.stats().await;
    assert_eq!(stats["registrations"], 1, "{stats}");
    assert_eq!(stats["token_requests"]["authorization_code"], 4, "{stats}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_expired_token_from_oidc_provider_is_refreshed_with_rotation() {
    let upstream = upstream(3);
    let dir = tempfile::tempdir().unwrap();
    let (gateway, consent_port) = sqlite_gateway(&upstream, dir.path()).await;
    let mut client = gateway.client().await;

    let url = needs_consent(&mut client, Some("alice"), &upstream).await;
    let (code, page) = consent(&url, "alice", consent_port, &upstream).await;
    assert_eq!(code, 200, "{page}\n{}", upstream.logs());
    assert_eq!(whoami(&mut client, "alice", &upstream).await, "alice");

    // Twice: the token expires, the next call still works and oidc-provider
    // saw a refresh. The second round uses the refresh token the first one
    // rotated in (oidc-provider refuses a used one and revokes the grant).
    for round in 1..=2 {
        let before = upstream.refreshes().await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            whoami(&mut client, "alice", &upstream).await,
            "alice",
            "round {round}"
        );
        let after = upstream.refreshes().await;
        assert!(
            after > before,
            "round {round}: no refresh_token grant at oidc-provider\n{}",
            upstream.logs()
        );
    }
    let stats = upstream.stats().await;
    assert_eq!(
        stats["token_errors"],
        serde_json::json!({}),
        "{stats}\n{}",
        upstream.logs()
    );
    assert_eq!(stats["token_requests"]["authorization_code"], 1, "{stats}");
    // The client-credentials server renews its own short-lived token too.
    let who = call_settled(&mut client, None, "svc__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, format!("client:{SVC_ID}"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let who = call(&mut client, None, "svc__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, format!("client:{SVC_ID}"));
    gateway.shutdown().await;
}

/// Connects to a `toolgate serve` process, waiting (bounded) until it
/// listens.
async fn connect_binary(port: u16, log: &Path) -> ToolGatewayClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ToolGatewayClient::connect(format!("http://127.0.0.1:{port}")).await {
            Ok(client) => return client,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!(
                "the gateway process does not listen on {port}: {e}\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            ),
        }
    }
}

#[tokio::test]
async fn a_second_gateway_process_on_postgres_serves_a_consent_given_at_the_first() {
    let upstream = upstream(4);
    let pg = PgCluster::start();
    let state_url = pg.url();
    // Both gateways are one public URL behind a load balancer; each
    // listens on its own port.
    let public_port = free_port();
    let one_port = free_port();
    let two_consent_port = free_port();
    let one = TestGateway::start(
        &config(&upstream, &state_url, one_port, public_port),
        &env(),
    )
    .await;
    let mut client_one = one.client().await;

    let dir = tempfile::tempdir().unwrap();
    let grpc_port = free_port();
    let yaml = format!(
        "listen: \"127.0.0.1:{grpc_port}\"\nshutdown_delay: \"0s\"\n{}",
        config(&upstream, &state_url, two_consent_port, public_port)
    );
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(&config_path, yaml).unwrap();
    let log = dir.path().join("gateway.log");
    let _two = serve_binary(&config_path, &log, &env());
    let mut client_two = connect_binary(grpc_port, &log).await;
    let two_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // Alice consents through the first gateway (flow and callback there).
    let url = needs_consent(&mut client_one, Some("alice"), &upstream).await;
    let (code, page) = consent(&url, "alice", one_port, &upstream).await;
    assert_eq!(code, 200, "{page}\n{}", upstream.logs());
    assert_eq!(whoami(&mut client_one, "alice", &upstream).await, "alice");
    // The second process serves her from the shared store, no new consent.
    let who = call_settled(&mut client_two, Some("alice"), "docs__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}\n--- gateway.log\n{}", upstream.logs(), two_log()));
    assert_eq!(who, "alice");

    // Bob's flow starts at the second process and its callback lands at the
    // first; both then serve him.
    let status = call_settled(&mut client_two, Some("bob"), "docs__whoami")
        .await
        .unwrap_err();
    let bob_url = authorization_url(&status, &upstream);
    let (code, page) = consent(&bob_url, "bob", one_port, &upstream).await;
    assert_eq!(code, 200, "{page}\n{}", upstream.logs());
    assert_eq!(whoami(&mut client_two, "bob", &upstream).await, "bob");
    assert_eq!(whoami(&mut client_one, "bob", &upstream).await, "bob");

    // Alice's token expires; both gateways call at once. One refreshes, the
    // other reads its token: oidc-provider rotates refresh tokens and treats
    // a reused one as theft (it revokes the whole grant).
    let before = upstream.refreshes().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (a, b) = tokio::join!(
        call(&mut client_one, Some("alice"), "docs__whoami"),
        call(&mut client_two, Some("alice"), "docs__whoami"),
    );
    let failure =
        |s: tonic::Status| panic!("{s:?}\n{}\n--- gateway.log\n{}", upstream.logs(), two_log());
    assert_eq!(a.unwrap_or_else(failure), "alice");
    assert_eq!(b.unwrap_or_else(failure), "alice");
    let after = upstream.refreshes().await;
    assert_eq!(
        after - before,
        1,
        "one refresh for two gateways\n{}",
        upstream.logs()
    );
    let stats = upstream.stats().await;
    assert_eq!(
        stats["token_errors"],
        serde_json::json!({}),
        "{stats}\n{}",
        upstream.logs()
    );
    assert_eq!(
        stats["registrations"], 1,
        "one registration for both gateways: {stats}"
    );
    drop(one);
}
