//! Upstream OAuth end to end: the gateway against an MCP server written with
//! the Python `mcp` SDK's resource-server auth (tests/fixtures/python/
//! oauth_mcp_server.py: it answers 401 with a `resource_metadata` challenge
//! and reports the token's subject from its `whoami` tool) and a test
//! authorization server (oauth_as.py: discovery, registration, PKCE,
//! refresh rotation, client credentials, revocation). The test plays the
//! end user's browser: it opens the authorization URL the gateway hands
//! out, logs in as a named user, and follows the redirect to the gateway's
//! consent listener.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::transport::auth::StoredCredentials;
use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

/// A state-store key (32 bytes, base64).
pub(crate) const STATE_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const SVC_SECRET: &str = "svc-secret-0123456789";

/// Starts a Python fixture and reads the `LISTENING <port>` line it prints.
fn start_fixture(script: &str, args: &[&str]) -> (ChildGuard, u16) {
    let mut child = Command::new(python())
        .arg(fixture(&format!("python/{script}")))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {script}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("LISTENING ")
        .unwrap_or_else(|| panic!("{script} printed {line:?}"))
        .parse()
        .unwrap();
    (guard, port)
}

/// A test's own directory, with the SQLite state store and the audit file
/// in it (destructure it: the directory lives as long as `dir`).
pub(crate) struct Scratch {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) state_url: String,
    pub(crate) audit: std::path::PathBuf,
}

impl Scratch {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            state_url: format!("sqlite://{}/state.db", dir.path().display()),
            audit: dir.path().join("audit.jsonl"),
            dir,
        }
    }
}

/// `yaml` with the audit trail written to `audit`.
pub(crate) fn audited(audit: &std::path::Path, yaml: &str) -> String {
    format!("audit:\n  path: \"{}\"\n{yaml}", audit.display())
}

/// The authorization server and the protected MCP server.
pub(crate) struct Upstream {
    _as: ChildGuard,
    _rs: ChildGuard,
    pub(crate) as_url: String,
    pub(crate) mcp_url: String,
}

impl Upstream {
    /// The MCP server's process id (to freeze it, say).
    pub(crate) fn mcp_pid(&self) -> u32 {
        self._rs.0.id()
    }
}

pub(crate) fn upstream(token_ttl: u32) -> Upstream {
    upstream_with(token_ttl, &[], &[])
}

/// [`upstream`] with more options for the authorization server
/// (oauth_as.py's `as_args`, e.g. `--no-iss`) and the MCP server
/// (oauth_mcp_server.py's `rs_args`, e.g. `--leak-token`).
pub(crate) fn upstream_with(token_ttl: u32, as_args: &[&str], rs_args: &[&str]) -> Upstream {
    let ttl = token_ttl.to_string();
    let mut args = vec![
        "--port",
        "0",
        "--token-ttl",
        &ttl,
        "--client-id",
        "svc",
        "--client-secret",
        SVC_SECRET,
    ];
    args.extend_from_slice(as_args);
    let (as_guard, as_port) = start_fixture("oauth_as.py", &args);
    let as_url = format!("http://127.0.0.1:{as_port}");
    let mut args = vec!["--port", "0", "--as-url", &as_url];
    args.extend_from_slice(rs_args);
    let (rs_guard, rs_port) = start_fixture("oauth_mcp_server.py", &args);
    Upstream {
        _as: as_guard,
        _rs: rs_guard,
        as_url,
        mcp_url: format!("http://127.0.0.1:{rs_port}/mcp"),
    }
}

/// A gateway configuration: `docs` per user (authorization code), `svc`
/// for the tenant itself (client credentials), both on the same server.
pub(crate) fn config(upstream: &Upstream, state_url: &str, consent_port: u16) -> String {
    format!(
        r#"
state:
  url: "{state_url}"
  keys: [{{ env: STATE_KEY }}]
oauth:
  listen: 127.0.0.1:{consent_port}
  public_url: http://127.0.0.1:{consent_port}
  allow_private_addresses: true
tenants:
  - name: acme
    tokens: [acme-token]
    {CONFIRMED}
    servers:
      - name: docs
        url: "{mcp}"
        oauth: {{ grant: authorization_code }}
      - name: svc
        url: "{mcp}"
        oauth: {{ grant: client_credentials, client_id: svc, client_secret: {{ env: SVC_SECRET }} }}
"#,
        mcp = upstream.mcp_url
    )
}

/// Where acme's application confirms consents (nothing listens there: the
/// test plays the application, reading the code from the redirect).
pub(crate) const RETURN_URL: &str = "http://127.0.0.1:9/app/consent";

/// The line of [`config`] that makes acme confirm consents.
const CONFIRMED: &str = "consent_return_url: http://127.0.0.1:9/app/consent";

/// [`config`] with `confirm_consent: false`: a consent is usable as soon as
/// the callback completes.
pub(crate) fn unconfirmed(config: &str) -> String {
    config.replace(CONFIRMED, "confirm_consent: false")
}

pub(crate) fn env() -> [(&'static str, &'static str); 2] {
    [("STATE_KEY", STATE_KEY), ("SVC_SECRET", SVC_SECRET)]
}

/// Invokes `name` with `{}` as the tenant, for `subject` when given; a tool
/// error fails the test. Returns the text.
pub(crate) async fn call(
    client: &mut ToolGatewayClient<Channel>,
    subject: Option<&str>,
    name: &str,
) -> Result<String, tonic::Status> {
    let mut request = authed(
        "acme-token",
        pb::InvokeToolRequest {
            name: name.to_owned(),
            arguments_json: "{}".to_owned(),
            ..Default::default()
        },
    );
    if let Some(subject) = subject {
        request
            .metadata_mut()
            .insert("x-toolgate-subject", subject.parse().unwrap());
    }
    let response = client.invoke_tool(request).await?.into_inner();
    assert!(!response.is_error, "tool error: {}", response.text);
    Ok(response.text)
}

/// Calls until the answer is not UNAVAILABLE (a server still connecting,
/// or listing after a first consent), bounded.
pub(crate) async fn call_settled(
    client: &mut ToolGatewayClient<Channel>,
    subject: Option<&str>,
    name: &str,
) -> Result<String, tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match call(client, subject, name).await {
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// The authorization URL of an `UPSTREAM_AUTHORIZATION_REQUIRED` status.
pub(crate) fn authorization_url(status: &tonic::Status) -> String {
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "UPSTREAM_AUTHORIZATION_REQUIRED");
    info.metadata
        .get("authorization_url")
        .cloned()
        .expect("authorization_url in the metadata")
}

/// Plays the browser: opens `url` as `user` at the authorization server and
/// delivers its redirect to the gateway's consent listener on
/// `callback_port` (any replica's). Returns the listener's status and page;
/// for a held consent (303 to the tenant's `consent_return_url`), 303 and
/// the one-time code.
pub(crate) async fn consent(url: &str, user: &str, callback_port: u16) -> (u16, String) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // Authorization servers may send the browser on to another one (the
    // mix-up test's relay): followed until a redirect leaves them.
    let mut next = format!("{url}&user={user}");
    let mut callback = None;
    for _ in 0..3 {
        let authorize = http.get(&next).send().await.unwrap();
        assert_eq!(authorize.status().as_u16(), 302, "authorize: {authorize:?}");
        next = authorize.headers()["location"].to_str().unwrap().to_owned();
        let target = url::Url::parse(&next).unwrap();
        if target.path().starts_with("/oauth/") {
            callback = Some(target);
            break;
        }
    }
    let mut callback = callback.expect("the authorization servers redirect to the gateway");
    assert!(
        callback.path().starts_with("/oauth/acme/") && callback.path().ends_with("/callback"),
        "a redirect URI of its own per tenant and server: {callback}"
    );
    callback.set_port(Some(callback_port)).unwrap();
    let page = http.get(callback.as_str()).send().await.unwrap();
    let status = page.status().as_u16();
    if status == 303 {
        let location = page.headers()["location"].to_str().unwrap();
        return (status, return_code(location));
    }
    (status, page.text().await.unwrap())
}

/// The one-time `code` of a redirect to [`RETURN_URL`].
pub(crate) fn return_code(location: &str) -> String {
    let url = url::Url::parse(location).unwrap();
    assert!(location.starts_with(RETURN_URL), "{location}");
    url.query_pairs()
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no code in {location}"))
}

/// Plays acme's application: confirms the consent of `code` for `subject`
/// (its logged-in user).
pub(crate) async fn confirm(
    client: &mut ToolGatewayClient<Channel>,
    subject: &str,
    code: &str,
) -> Result<String, tonic::Status> {
    let mut request = authed(
        "acme-token",
        pb::CompleteAuthorizationRequest {
            code: code.to_owned(),
        },
    );
    request
        .metadata_mut()
        .insert("x-toolgate-subject", subject.parse().unwrap());
    Ok(client
        .complete_authorization(request)
        .await?
        .into_inner()
        .server)
}

/// `user` consents at `url` and acme's application, where `user` is logged
/// in, confirms it: the consent is usable afterwards.
pub(crate) async fn consent_confirmed(
    client: &mut ToolGatewayClient<Channel>,
    url: &str,
    user: &str,
    callback_port: u16,
) {
    let (status, code) = consent(url, user, callback_port).await;
    assert_eq!(
        status, 303,
        "the callback sends the browser to the application: {code}"
    );
    confirm(client, user, &code)
        .await
        .unwrap_or_else(|e| panic!("{user} confirms their own consent: {e:?}"));
}

/// ListTools as `subject`.
pub(crate) async fn listing(
    client: &mut ToolGatewayClient<Channel>,
    subject: &str,
) -> pb::ListToolsResponse {
    let mut request = authed("acme-token", pb::ListToolsRequest::default());
    request
        .metadata_mut()
        .insert("x-toolgate-subject", subject.parse().unwrap());
    client.list_tools(request).await.unwrap().into_inner()
}

/// The status of server `name` in a listing.
pub(crate) fn server<'a>(listing: &'a pb::ListToolsResponse, name: &str) -> &'a pb::ServerStatus {
    listing.servers.iter().find(|s| s.name == name).unwrap()
}

pub(crate) async fn as_stats(upstream: &Upstream) -> serde_json::Value {
    let text = reqwest::get(format!("{}/admin/stats", upstream.as_url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn per_user_consent_isolates_subjects_and_client_credentials_serve_the_tenant() {
    let upstream = upstream(3600);
    let Scratch { dir, state_url, .. } = Scratch::new();
    let consent_port = free_port();
    let gateway = TestGateway::start(&config(&upstream, &state_url, consent_port), &env()).await;
    let mut client = gateway.client().await;

    // The tenant's own server works without any end user.
    assert_eq!(
        call_settled(&mut client, None, "svc__whoami")
            .await
            .unwrap(),
        "client:svc"
    );

    // A subject that has not consented gets a link, and nothing runs.
    let status = call_settled(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    let url = authorization_url(&status);
    assert!(url.starts_with(&upstream.as_url), "{url}");
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    assert!(url.contains("resource="), "{url}");
    let before = listing(&mut client, "alice").await;
    let docs = server(&before, "docs");
    assert_eq!(docs.state, pb::ServerState::AuthorizationRequired as i32);
    assert!(docs.authorization_url.starts_with(&upstream.as_url));

    // Alice consents in her browser and acme's application confirms it for
    // her; her next call runs as her.
    consent_confirmed(&mut client, &url, "alice", consent_port).await;
    assert_eq!(
        call_settled(&mut client, Some("alice"), "docs__whoami")
            .await
            .unwrap(),
        "alice"
    );
    let after = listing(&mut client, "alice").await;
    assert_eq!(
        server(&after, "docs").state,
        pb::ServerState::Connected as i32
    );
    assert!(names(&after).contains(&"docs__whoami".to_owned()));

    // Bob's call never borrows Alice's token.
    let status = call_settled(&mut client, Some("bob"), "docs__whoami")
        .await
        .unwrap_err();
    let bob_url = authorization_url(&status);
    let carol = listing(&mut client, "carol").await;
    assert_eq!(
        server(&carol, "docs").state,
        pb::ServerState::AuthorizationRequired as i32
    );
    consent_confirmed(&mut client, &bob_url, "bob", consent_port).await;
    assert_eq!(
        call(&mut client, Some("bob"), "docs__whoami")
            .await
            .unwrap(),
        "bob"
    );
    assert_eq!(
        call(&mut client, Some("alice"), "docs__whoami")
            .await
            .unwrap(),
        "alice"
    );
    // Without a subject the call is the tenant's own, which has not consented.
    let status = call(&mut client, None, "docs__whoami").await.unwrap_err();
    authorization_url(&status);

    // A callback replayed (or forged) completes nothing.
    let (code, _) = consent(&bob_url, "mallory", consent_port).await;
    assert_eq!(code, 400);
    assert_eq!(
        call(&mut client, Some("bob"), "docs__whoami")
            .await
            .unwrap(),
        "bob"
    );

    // Alice's grant is revoked at the authorization server: her next call
    // asks her to consent again; Bob is untouched.
    let revoked = reqwest::Client::new()
        .post(format!("{}/admin/revoke?user=alice", upstream.as_url))
        .send()
        .await
        .unwrap();
    assert!(revoked.status().is_success());
    let status = call(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    let again = authorization_url(&status);
    // Her session is still open; her next call gets the same link (no new
    // pending flow per call).
    let status = call(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    assert_eq!(authorization_url(&status), again);
    assert_eq!(
        call(&mut client, Some("bob"), "docs__whoami")
            .await
            .unwrap(),
        "bob"
    );

    // Tokens are sealed at rest: no file of the database (the main file,
    // its write-ahead log and shared memory, read while the gateway still
    // has them open) holds any token the authorization server issued, in
    // clear (the subject ids are row keys, the tokens are not).
    let stats = as_stats(&upstream).await;
    let issued: Vec<&str> = stats["issued_token_values"]
        .as_array()
        .expect("the server lists what it issued")
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(issued.len() >= 4, "alice's and bob's tokens: {stats}");
    let check_files = || {
        let mut files = 0;
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.starts_with("state.db") {
                continue;
            }
            files += 1;
            let bytes = std::fs::read(&path).unwrap();
            for token in &issued {
                assert!(
                    !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
                    "{name} holds an issued token in clear"
                );
            }
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains("access_token"),
                "{name}: a token response in clear"
            );
        }
        files
    };
    assert!(check_files() >= 2, "the database and its write-ahead log");
    gateway.shutdown().await;
    assert!(check_files() >= 1);
}

#[tokio::test]
async fn a_consent_at_one_replica_serves_calls_at_another_and_one_refresh_wins() {
    let upstream = upstream(2);
    let mut pg = PgCluster::start();
    let url = pg.url();
    // Both replicas are one public URL behind a load balancer; each listens
    // on its own port, and the test delivers the callback to the second.
    let public_port = free_port();
    let second_port = free_port();
    let plain_server = serve_mcp(TestServer::new(&["echo"])).await;
    let one_config = format!(
        "{}      - name: plain\n        url: \"{}\"\n        headers: {{ authorization: \"Bearer static-0123456789\" }}\n",
        config(&upstream, &url, public_port),
        plain_server.url
    );
    let one = TestGateway::start(&one_config, &env()).await;
    let two_config = config(&upstream, &url, public_port).replace(
        &format!("listen: 127.0.0.1:{public_port}"),
        &format!("listen: 127.0.0.1:{second_port}"),
    );
    let two = TestGateway::start(&two_config, &env()).await;

    let mut client_one = one.client().await;
    let mut client_two = two.client().await;

    let status = call_settled(&mut client_one, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    let url = authorization_url(&status);
    // The flow started at replica one completes at replica two, and is
    // confirmed at replica one.
    consent_confirmed(&mut client_one, &url, "alice", second_port).await;
    assert_eq!(
        call_settled(&mut client_one, Some("alice"), "docs__whoami")
            .await
            .unwrap(),
        "alice"
    );
    assert_eq!(
        call_settled(&mut client_two, Some("alice"), "docs__whoami")
            .await
            .unwrap(),
        "alice"
    );

    // The token expires; both replicas call at once. One refreshes, the
    // other reads its token: with rotation a second refresh of the same
    // refresh token would be refused and Alice asked to consent again.
    let refreshes = |stats: &serde_json::Value| {
        stats["token_requests"]["refresh_token"]
            .as_u64()
            .unwrap_or(0)
    };
    let before = refreshes(&as_stats(&upstream).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (a, b) = tokio::join!(
        call(&mut client_one, Some("alice"), "docs__whoami"),
        call(&mut client_two, Some("alice"), "docs__whoami"),
    );
    assert_eq!(a.unwrap(), "alice");
    assert_eq!(b.unwrap(), "alice");
    let after = refreshes(&as_stats(&upstream).await);
    assert_eq!(after - before, 1, "one refresh for two replicas");

    // The store goes down: per-user calls are UNAVAILABLE with RetryInfo
    // (nothing was sent upstream).
    pg.stop();
    let status = call(&mut client_one, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(reason(&status), "STATE_UNAVAILABLE");
    assert!(status.get_details_retry_info().is_some());
    // A server with static headers needs no store and keeps working.
    let echoed = invoke(
        &mut client_one,
        "acme-token",
        "plain__echo",
        r#"{"text":"still here"}"#,
    )
    .await
    .expect("a static-header server works while the store is down");
    assert!(echoed.text.contains("still here"), "{}", echoed.text);
    drop(one);
    drop(two);
}

/// The state key of [`STATE_KEY`], for a store handle of the test's own
/// (another replica, or an operator at the database).
fn state_ring() -> toolgate::state::KeyRing {
    toolgate::state::KeyRing::new(vec![*b"0123456789abcdef0123456789abcdef"]).unwrap()
}

/// The audit records of `path` whose `event` is `event`.
pub(crate) fn audit_events(path: &std::path::Path, event: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|r| r["event"] == event)
        .collect()
}

/// A consent is a new grant: stored whatever the token row became since the
/// replica that completes it last read it. Replica one reads Alice's token
/// (its version remembered for the compare-and-swap of a refresh), then the
/// row is deleted ("forget a token", operations.md) or rewritten by another
/// replica; Alice consents again through replica two's link, and the
/// callback reaches replica one. With `confirm_consent: false` the page
/// says `Authorized` and the audit `consent_completed` only because the
/// grant is stored: her next calls run as her on both replicas. (A
/// confirmed consent is stored by the same unconditional write.)
#[tokio::test]
async fn a_consent_after_the_token_row_was_deleted_or_rewritten_is_stored() {
    let upstream = upstream(3600);
    let pg = PgCluster::start();
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let public_port = free_port();
    let second_port = free_port();
    let one_config = audited(&audit, &unconfirmed(&config(&upstream, &url, public_port)));
    let one = TestGateway::start(&one_config, &env()).await;
    let two_config = unconfirmed(&config(&upstream, &url, public_port)).replace(
        &format!("listen: 127.0.0.1:{public_port}"),
        &format!("listen: 127.0.0.1:{second_port}"),
    );
    let two = TestGateway::start(&two_config, &env()).await;
    let mut client_one = one.client().await;
    let mut client_two = two.client().await;
    let state = toolgate::state::StateStore::connect(&url, state_ring())
        .await
        .unwrap();
    let alice = toolgate::state::TokenKey::new("acme", "token:alice", "docs");

    let status = call_settled(&mut client_one, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    let (code, page) = consent(&authorization_url(&status), "alice", public_port).await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(audit_events(&audit, "consent_completed").len(), 1);

    // Deleted, or rewritten by another replica (a value without a token),
    // after replica one read the row.
    let forgotten: [Option<&[u8]>; 2] = [
        None,
        Some(b"{\"client_id\":\"other\",\"token_response\":null}"),
    ];
    for (round, rewrite) in forgotten.into_iter().enumerate() {
        assert_eq!(
            call_settled(&mut client_one, Some("alice"), "docs__whoami")
                .await
                .unwrap(),
            "alice",
            "round {round}: replica one reads her token"
        );
        match rewrite {
            None => assert!(state.delete_token(&alice).await.unwrap()),
            Some(value) => {
                state.put_token(&alice, value).await.unwrap();
            }
        }
        let status = call(&mut client_two, Some("alice"), "docs__whoami")
            .await
            .unwrap_err();
        let (code, page) = consent(&authorization_url(&status), "alice", public_port).await;
        assert_eq!(code, 200, "round {round}: {page}");
        assert!(page.contains("Authorized"), "round {round}: {page}");
        assert_eq!(audit_events(&audit, "consent_completed").len(), round + 2);
        let stored = state.get_token(&alice).await.unwrap().expect("stored");
        let stored: StoredCredentials = serde_json::from_slice(&stored.value).unwrap();
        assert!(stored.token_response.is_some(), "round {round}: not stored");
        for client in [&mut client_one, &mut client_two] {
            assert_eq!(
                call_settled(client, Some("alice"), "docs__whoami")
                    .await
                    .unwrap(),
                "alice",
                "round {round}: the new grant is used"
            );
        }
    }
    assert!(audit_events(&audit, "consent_failed").is_empty());

    // Someone with write access to the database puts back the sealed value
    // of an older version of Alice's row (a rotated refresh token): it is
    // sealed for that version, so it does not open. Her calls fail as the
    // store's (UNAVAILABLE, nothing sent), the gateway serves on, and a
    // write of the row repairs it.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let sealed_of = |pool: &sqlx::AnyPool| {
        let pool = pool.clone();
        async move {
            use sqlx::Row as _;
            let row = sqlx::query(
                "SELECT version, sealed_with_version FROM toolgate_tokens \
                 WHERE tenant = 'acme' AND subject = 'token:alice' AND server = 'docs'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (row.get::<i64, _>(0), row.get::<Vec<u8>, _>(1))
        }
    };
    let (older, older_sealed) = sealed_of(&pool).await;
    let current = state.get_token(&alice).await.unwrap().unwrap();
    let newer = state.put_token(&alice, &current.value).await.unwrap();
    assert_eq!(newer, older + 1);
    sqlx::query(
        "UPDATE toolgate_tokens SET sealed_with_version = $1 \
         WHERE tenant = 'acme' AND subject = 'token:alice' AND server = 'docs'",
    )
    .bind(&older_sealed)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(sealed_of(&pool).await, (newer, older_sealed));
    for client in [&mut client_one, &mut client_two] {
        let status = call(client, Some("alice"), "docs__whoami")
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert_eq!(reason(&status), "STATE_UNAVAILABLE");
        assert!(
            status.message().contains("cannot be decrypted"),
            "{status:?}"
        );
    }
    // Bob's consent state is still answered.
    let status = call(&mut client_one, Some("bob"), "docs__whoami")
        .await
        .unwrap_err();
    authorization_url(&status);
    state.put_token(&alice, &current.value).await.unwrap();
    assert_eq!(
        call_settled(&mut client_one, Some("alice"), "docs__whoami")
            .await
            .unwrap(),
        "alice"
    );
    pool.close().await;
    state.close().await;
    drop(one);
    drop(two);
}

/// Two callbacks for one `state` at once, `ROUNDS` times (a subject each):
/// exactly one completes the consent (the browser sent on to the
/// application, which confirms it: `consent_held`, `consent_completed`),
/// the other is an unknown state (400, `consent_failed` / `unknown_state`)
/// and exchanges nothing, so the grant it would have spoiled (a reused code
/// revokes what it issued) serves the subject's calls.
async fn two_callbacks_for_one_state_complete_it_once(state_url: &str) {
    const ROUNDS: usize = 8;
    let upstream = upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let consent_port = free_port();
    let yaml = audited(&audit, &config(&upstream, state_url, consent_port));
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for round in 0..ROUNDS {
        let subject = format!("user-{round}");
        let status = call_settled(&mut client, Some(&subject), "docs__whoami")
            .await
            .unwrap_err();
        let url = authorization_url(&status);
        let authorize = http
            .get(format!("{url}&user={subject}"))
            .send()
            .await
            .unwrap();
        assert_eq!(authorize.status().as_u16(), 302, "{authorize:?}");
        let mut callback =
            url::Url::parse(authorize.headers()["location"].to_str().unwrap()).unwrap();
        callback.set_port(Some(consent_port)).unwrap();
        let deliver = || async {
            let page = http.get(callback.as_str()).send().await.unwrap();
            let status = page.status().as_u16();
            match page.headers().get("location") {
                Some(location) => (status, location.to_str().unwrap().to_owned()),
                None => (status, page.text().await.unwrap()),
            }
        };
        let (a, b) = tokio::join!(deliver(), deliver());
        let mut pages = [a, b];
        pages.sort();
        assert_eq!(pages[0].0, 303, "round {round}: {pages:?}");
        let code = return_code(&pages[0].1);
        confirm(&mut client, &subject, &code).await.unwrap();
        assert_eq!(pages[1].0, 400, "round {round}: {pages:?}");
        assert!(
            pages[1].1.contains("expired or was already used"),
            "round {round}: {}",
            pages[1].1
        );
        assert_eq!(
            call_settled(&mut client, Some(&subject), "docs__whoami")
                .await
                .unwrap(),
            subject,
            "round {round}"
        );
    }
    assert_eq!(audit_events(&audit, "consent_held").len(), ROUNDS);
    assert_eq!(audit_events(&audit, "consent_completed").len(), ROUNDS);
    let failed = audit_events(&audit, "consent_failed");
    assert_eq!(failed.len(), ROUNDS, "{failed:#?}");
    assert!(
        failed.iter().all(|r| r["reason"] == "unknown_state"),
        "{failed:#?}"
    );
    let stats = as_stats(&upstream).await;
    assert_eq!(
        stats["token_requests"]["authorization_code"].as_u64(),
        Some(ROUNDS as u64),
        "one code exchange per consent: {stats}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn two_callbacks_for_one_state_complete_it_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/state.db", dir.path().display());
    two_callbacks_for_one_state_complete_it_once(&url).await;
}

#[tokio::test]
async fn two_callbacks_for_one_state_complete_it_once_on_postgres() {
    let pg = PgCluster::start();
    two_callbacks_for_one_state_complete_it_once(&pg.url()).await;
}

#[tokio::test]
async fn forged_callbacks_are_counted_recorded_under_a_rate_and_a_real_consent_still_completes() {
    let upstream = upstream(3600);
    let Scratch {
        dir: _dir,
        state_url,
        audit,
    } = Scratch::new();
    let consent_port = free_port();
    let metrics_port = free_port();
    let yaml = format!(
        "metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\n{}",
        audited(&audit, &config(&upstream, &state_url, consent_port))
            .replace("audit:\n", "audit:\n  required: true\n")
    );
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;
    let status = call_settled(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    let url = authorization_url(&status);

    // 300 forged callbacks from one peer: the first few recorded (400),
    // the rest answered 429 with nothing written.
    let http = reqwest::Client::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..300 {
        let forged = format!(
            "http://127.0.0.1:{consent_port}/oauth/acme/docs/callback?code=c{i}&state=forged-{i}"
        );
        let answer = http.get(&forged).send().await.unwrap();
        *statuses.entry(answer.status().as_u16()).or_default() += 1;
    }
    let refused = statuses.get(&400).copied().unwrap_or(0);
    let limited = statuses.get(&429).copied().unwrap_or(0);
    assert_eq!(refused + limited, 300, "{statuses:?}");
    assert!((10..=20).contains(&refused), "{statuses:?}");

    // Alice's real consent, from the same peer, completes.
    consent_confirmed(&mut client, &url, "alice", consent_port).await;
    assert_eq!(
        call_settled(&mut client, Some("alice"), "docs__whoami")
            .await
            .unwrap(),
        "alice"
    );

    let page = scrape(metrics_port).await;
    let count = |outcome: &str| -> usize {
        sample(
            &page,
            &format!("toolgate_oauth_callbacks_unmatched_total{{outcome=\"{outcome}\"}}"),
        )
        .map_or(0, |v| v.parse::<f64>().unwrap() as usize)
    };
    assert_eq!(count("recorded"), refused, "{page}");
    assert_eq!(count("limited"), limited, "{page}");
    gateway.shutdown().await;

    let records: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let failed: Vec<_> = records
        .iter()
        .filter(|r| r["event"] == "consent_failed")
        .collect();
    assert_eq!(failed.len(), refused, "one record per recorded callback");
    for record in &failed {
        assert_eq!(record["reason"], "unknown_state", "{record}");
        let peer = record["peer"].as_str().unwrap_or_default();
        assert!(peer.starts_with("127.0.0.1:"), "{record}");
    }
    assert!(
        records.iter().any(|r| r["event"] == "consent_completed"),
        "the real consent is recorded"
    );
}

/// Policy before consent: a subject the tenant's policy denies every tool
/// of a per-user server is never handed an authorization URL, so no
/// consent flow starts for her: her ListTools shows the server without a
/// link, her call is PERMISSION_DENIED (`TOOL_NOT_PERMITTED`), before the
/// server was ever listed and after. A permitted subject gets its link as
/// before.
#[tokio::test]
async fn a_subject_the_policy_denies_every_tool_of_a_per_user_server_gets_no_link() {
    let upstream = upstream(3600);
    let Scratch {
        dir: _dir,
        state_url,
        audit,
    } = Scratch::new();
    let consent_port = free_port();
    let yaml = audited(
        &audit,
        &format!(
            "{}    policy:\n      - deny: \"docs__*\"\n        when: \"subject == 'mallory'\"\n",
            config(&upstream, &state_url, consent_port)
        ),
    );
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;
    let started_for = |subject: &str| {
        audit_events(&audit, "consent_started")
            .into_iter()
            .filter(|r| r["subject"] == format!("token:{subject}").as_str())
            .count()
    };
    let refused = |status: tonic::Status| {
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        assert_eq!(
            status.get_details_error_info().unwrap().reason,
            "TOOL_NOT_PERMITTED"
        );
    };

    // Nobody has authorized the server yet: its tools were never listed.
    let status = call_settled(&mut client, Some("mallory"), "docs__whoami")
        .await
        .unwrap_err();
    refused(status);
    let mallory = listing(&mut client, "mallory").await;
    let docs = server(&mallory, "docs");
    assert_eq!(docs.authorization_url, "", "{docs:?}");
    assert!(docs.error.contains("policy"), "{docs:?}");

    // Alice may: she gets her link (from ListTools and from a call).
    let alice = listing(&mut client, "alice").await;
    assert!(
        server(&alice, "docs")
            .authorization_url
            .starts_with(&upstream.as_url)
    );
    let status = call_settled(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    let url = authorization_url(&status);

    // Alice consents: the server's tools are listed. Mallory still gets
    // no link, and her call is still refused by the policy.
    consent_confirmed(&mut client, &url, "alice", consent_port).await;
    assert_eq!(
        call_settled(&mut client, Some("alice"), "docs__whoami")
            .await
            .unwrap(),
        "alice"
    );
    let mallory = listing(&mut client, "mallory").await;
    assert_eq!(server(&mallory, "docs").authorization_url, "");
    assert!(!names(&mallory).iter().any(|n| n.starts_with("docs__")));
    refused(
        call(&mut client, Some("mallory"), "docs__whoami")
            .await
            .unwrap_err(),
    );
    // Bob, permitted, is offered a link for the listed server.
    let bob = listing(&mut client, "bob").await;
    assert!(
        server(&bob, "docs")
            .authorization_url
            .starts_with(&upstream.as_url)
    );

    // Records of authorization events are queued without waiting, and
    // written in order: once Bob's is there, any of Mallory's (all
    // earlier) would be too. No consent flow was ever started for her.
    let deadline = Instant::now() + Duration::from_secs(10);
    while started_for("bob") == 0 {
        assert!(Instant::now() < deadline, "no consent_started for bob");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(started_for("mallory"), 0);
    assert_eq!(started_for("alice"), 1, "one pending flow, one link");
    gateway.shutdown().await;
}

/// Issue 37: a stored token is bound to the server's URL. A gateway whose
/// configuration moves the server (a reload, a restart, a tenant
/// re-created under the same name) to another address never sends the
/// token obtained for the old one there.
#[tokio::test]
async fn a_token_is_never_sent_to_a_new_address_of_its_server() {
    let upstream = upstream(3600);
    let Scratch { dir, state_url, .. } = Scratch::new();
    let consent_port = free_port();
    let gateway = TestGateway::start(&config(&upstream, &state_url, consent_port), &env()).await;
    let mut client = gateway.client().await;
    assert_eq!(
        call_settled(&mut client, None, "svc__whoami")
            .await
            .unwrap(),
        "client:svc"
    );
    gateway.shutdown().await;

    // The same tenant and server names, the server now elsewhere: a server
    // that records every request's headers.
    let elsewhere = serve_mcp(TestServer::new(&["whoami"])).await;
    let log = elsewhere.log.clone();
    let moved = config(&upstream, &state_url, consent_port).replace(
        &format!(
            "        url: \"{}\"\n        oauth: {{ grant: client_credentials",
            upstream.mcp_url
        ),
        &format!(
            "        url: \"{}\"\n        oauth: {{ grant: client_credentials",
            elsewhere.url
        ),
    );
    assert!(moved.contains(&elsewhere.url), "{moved}");
    let gateway = TestGateway::start(&moved, &env()).await;
    let mut client = gateway.client().await;
    // The server at the new address has no OAuth metadata: no token can be
    // had for it, and the old one is not used.
    let outcome = call_settled(&mut client, None, "svc__whoami").await;
    assert!(outcome.is_err(), "{outcome:?}");
    let headers = log.headers.lock().unwrap().clone();
    assert!(!headers.is_empty(), "the moved server was never contacted");
    for request in &headers {
        assert!(
            !request.contains_key("authorization"),
            "the old address's token went to the new one: {request:?}"
        );
    }
    gateway.shutdown().await;
    drop(dir);
}
