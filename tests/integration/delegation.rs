//! Delegation end to end: `grant: token_exchange` (RFC 8693) and
//! `grant: identity_assertion` (SEP-990, an ID-JAG) against oidc-provider
//! (tests/fixtures/node/oidc_as.mjs, extended with the token-exchange grant
//! and both sides of the ID-JAG flow), guarding the SDK's protected MCP
//! server (oauth_mcp_server.mjs, `whoami` answers the token's `sub`). The
//! callers are JWT callers of a `callers.jwt` issuer whose keys the
//! authorization server is given too, so it verifies the subject token's
//! signature, issuer, audience and expiry itself.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;
use crate::jwt::{jwks_doc_text, keys};
use crate::oauth_oidc::start_node;

/// A state-store key (32 bytes, base64).
const STATE_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
/// The gateway's client at the authorization server.
const GW_ID: &str = "gateway";
const GW_SECRET: &str = "gateway-secret-0123456789";
/// The resource server's client, for introspection.
const RS_ID: &str = "mcp-rs";
const RS_SECRET: &str = "rs-secret-0123456789";
/// The callers' JWT issuer (token exchange); its keys are the test keys.
const ISSUER: &str = "https://idp.delegation.test";
/// The audience of the callers' JWTs.
const AUDIENCE: &str = "toolgate";
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// The fixtures and their logs.
struct Upstream {
    _guards: Vec<ChildGuard>,
    /// The authorization server (the resource's).
    as_url: String,
    /// The identity provider (identity_assertion only).
    idp_url: Option<String>,
    mcp_url: String,
    logs: tempfile::TempDir,
    /// The callers' JWKS, as the gateway and the authorization server read it.
    jwks_file: PathBuf,
    /// The issuer of the callers' JWTs that the authorization server takes.
    issuer: String,
}

impl Upstream {
    fn logs(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.logs.path().join(name)).unwrap_or_default();
        format!(
            "--- oidc_as.log\n{}--- idp.log\n{}--- oauth_mcp_server.log\n{}",
            read("oidc_as.log"),
            read("idp.log"),
            read("oauth_mcp_server.log")
        )
    }

    async fn stats_of(url: &str) -> serde_json::Value {
        // reqwest is built without a crypto provider; the gateway's own
        // code installs one, which a test may run before.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let text = reqwest::get(format!("{url}/admin/stats"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// The authorization server's counters (`/admin/stats`).
    async fn stats(&self) -> serde_json::Value {
        Self::stats_of(&self.as_url).await
    }

    /// Token exchanges the authorization server granted.
    async fn exchanges(&self) -> u64 {
        self.stats().await["token_requests"][TOKEN_EXCHANGE]
            .as_u64()
            .unwrap_or(0)
    }
}

/// The oidc_as.mjs arguments every instance shares.
fn as_args<'a>(mcp_url: &'a str, ttl: &'a str) -> Vec<&'a str> {
    vec![
        "--port",
        "0",
        "--resource",
        mcp_url,
        "--token-ttl",
        ttl,
        "--client-id",
        GW_ID,
        "--client-secret",
        GW_SECRET,
        "--rs-client-id",
        RS_ID,
        "--rs-client-secret",
        RS_SECRET,
    ]
}

/// The callers' JWKS in a file of `logs`.
fn write_jwks(logs: &Path) -> PathBuf {
    let path = logs.join("callers-jwks.json");
    std::fs::write(&path, jwks_doc_text(&[&keys().rsa1])).unwrap();
    path
}

/// Starts the protected MCP server for `as_url` on `rs_port`.
fn mcp_server(rs_port: u16, as_url: &str, logs: &Path) -> ChildGuard {
    start_node(
        "oauth_mcp_server.mjs",
        &[
            "--port",
            &rs_port.to_string(),
            "--as-url",
            as_url,
            "--client-id",
            RS_ID,
            "--client-secret",
            RS_SECRET,
        ],
        &logs.join("oauth_mcp_server.log"),
    )
    .0
}

/// One authorization server that exchanges the callers' JWTs (RFC 8693),
/// and the MCP server; access tokens live `token_ttl` seconds. The
/// authorization server is the callers' JWT issuer (an identity provider
/// that exchanges its own tokens, as deployments have it).
fn exchange_upstream(token_ttl: u32) -> Upstream {
    let as_port = free_port();
    let issuer = format!("http://127.0.0.1:{as_port}");
    exchange_upstream_of(token_ttl, Some(as_port), &issuer)
}

/// [`exchange_upstream`], but the authorization server the MCP server
/// names takes JWTs of `issuer`, and is not their issuer itself (its own
/// port is chosen by the system when `as_port` is `None`).
fn exchange_upstream_of(token_ttl: u32, as_port: Option<u16>, issuer: &str) -> Upstream {
    let logs = tempfile::tempdir().unwrap();
    let jwks_file = write_jwks(logs.path());
    let rs_port = free_port();
    let mcp_url = format!("http://127.0.0.1:{rs_port}/mcp");
    let ttl = token_ttl.to_string();
    let mut args = as_args(&mcp_url, &ttl);
    let port = as_port.map(|p| p.to_string());
    if let Some(port) = &port {
        args[1] = port;
    }
    let jwks = jwks_file.display().to_string();
    args.extend([
        "--subject-jwks",
        &jwks,
        "--subject-issuer",
        issuer,
        "--subject-audience",
        AUDIENCE,
    ]);
    let (as_guard, as_port) = start_node("oidc_as.mjs", &args, &logs.path().join("oidc_as.log"));
    let as_url = format!("http://127.0.0.1:{as_port}");
    let rs_guard = mcp_server(rs_port, &as_url, logs.path());
    Upstream {
        _guards: vec![rs_guard, as_guard],
        as_url,
        idp_url: None,
        mcp_url,
        logs,
        jwks_file,
        issuer: issuer.to_owned(),
    }
}

/// The enterprise-managed flow's two authorization servers, both
/// oidc_as.mjs: the identity provider (the callers' JWT issuer: it exchanges
/// their JWTs for ID-JAGs) and the resource's authorization server (it
/// takes an ID-JAG of the identity provider for an access token), and the
/// MCP server.
fn identity_assertion_upstream() -> Upstream {
    let logs = tempfile::tempdir().unwrap();
    let jwks_file = write_jwks(logs.path());
    let rs_port = free_port();
    let mcp_url = format!("http://127.0.0.1:{rs_port}/mcp");
    // The identity provider's issuer is the callers' `iss`: its port is
    // chosen here.
    let idp_port = free_port().to_string();
    let idp_url = format!("http://127.0.0.1:{idp_port}");
    let jwks = jwks_file.display().to_string();
    let mut args = as_args(&mcp_url, "3600");
    args[1] = &idp_port;
    args.extend([
        "--subject-jwks",
        &jwks,
        "--subject-issuer",
        &idp_url,
        "--subject-audience",
        AUDIENCE,
        "--idp-client-id",
        GW_ID,
    ]);
    let (idp_guard, _) = start_node("oidc_as.mjs", &args, &logs.path().join("idp.log"));
    let idp_jwks = format!("{idp_url}/jwks");
    let mut args = as_args(&mcp_url, "3600");
    args.extend(["--idp-jwks-url", &idp_jwks, "--idp-issuer", &idp_url]);
    let (as_guard, as_port) = start_node("oidc_as.mjs", &args, &logs.path().join("oidc_as.log"));
    let as_url = format!("http://127.0.0.1:{as_port}");
    let rs_guard = mcp_server(rs_port, &as_url, logs.path());
    Upstream {
        _guards: vec![rs_guard, as_guard, idp_guard],
        as_url,
        idp_url: Some(idp_url.clone()),
        mcp_url,
        logs,
        jwks_file,
        issuer: idp_url,
    }
}

/// A caller JWT of [`ISSUER`] (or `issuer`) for `sub` of tenant acme,
/// expiring `exp_in` seconds from now.
fn caller_jwt(issuer: &str, sub: &str, exp_in: i64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    keys().rsa1.sign(&serde_json::json!({
        "iss": issuer,
        "aud": AUDIENCE,
        "sub": sub,
        "team": "acme",
        "iat": now,
        "exp": now.saturating_add_signed(exp_in),
    }))
}

/// The gateway: `callers.jwt` for each of `issuers` (tenant from `team`,
/// subject `sub`, the test keys), tenant acme (also a static token) with
/// `servers`, the audit trail in `dir`.
fn config(upstream: &Upstream, issuers: &[&str], dir: &Path, servers: &str) -> String {
    let port = free_port();
    let callers: String = issuers
        .iter()
        .map(|issuer| {
            format!(
                "    - issuer: \"{issuer}\"\n      audiences: [{AUDIENCE}]\n      jwks: {{ file: \"{}\" }}\n      tenant: claims.team\n",
                upstream.jwks_file.display()
            )
        })
        .collect();
    format!(
        r#"
state:
  url: "sqlite://{dir}/state.db"
  keys: [{{ env: STATE_KEY }}]
oauth:
  listen: 127.0.0.1:{port}
  public_url: http://127.0.0.1:{port}
  allow_private_addresses: true
audit:
  path: "{dir}/audit.jsonl"
callers:
  jwt:
{callers}tenants:
  - name: acme
    tokens: [acme-token]
    servers:
{servers}"#,
        dir = dir.display(),
    )
}

/// A gateway of [`config`] and a client of it.
async fn start(
    upstream: &Upstream,
    issuers: &[&str],
    dir: &Path,
    servers: &str,
) -> (TestGateway, ToolGatewayClient<Channel>) {
    let gateway = TestGateway::start(&config(upstream, issuers, dir, servers), &env()).await;
    let client = gateway.client().await;
    (gateway, client)
}

fn env() -> [(&'static str, &'static str); 2] {
    [("STATE_KEY", STATE_KEY), ("GW_SECRET", GW_SECRET)]
}

/// A `token_exchange` server named `name` on the MCP server, with `extra`
/// keys in its `oauth:`.
fn exchange_server(name: &str, mcp_url: &str, extra: &str) -> String {
    format!(
        "      - name: {name}\n        url: \"{mcp_url}\"\n        oauth: {{ grant: token_exchange, client_id: {GW_ID}, client_secret: {{ env: GW_SECRET }}, token_endpoint_auth: client_secret_basic{extra} }}\n"
    )
}

/// `toolgate check` (`--offline` when `offline`) of the configuration at
/// `path`, with the secrets [`config`] reads.
fn check_config(path: &Path, offline: bool) -> std::process::Output {
    let mut command = std::process::Command::new(toolgate_bin());
    command.arg("check");
    if offline {
        command.arg("--offline");
    }
    command
        .arg("--config")
        .arg(path)
        .env("STATE_KEY", STATE_KEY)
        .env("GW_SECRET", GW_SECRET)
        .output()
        .unwrap()
}

/// `name` called with bearer `token`.
async fn call(
    client: &mut ToolGatewayClient<Channel>,
    token: &str,
    name: &str,
) -> Result<String, tonic::Status> {
    let request = authed(
        token,
        pb::InvokeToolRequest {
            name: name.to_owned(),
            arguments_json: "{}".to_owned(),
            ..Default::default()
        },
    );
    let response = client.invoke_tool(request).await?.into_inner();
    assert!(!response.is_error, "tool error: {}", response.text);
    Ok(response.text)
}

/// [`call`] until the answer is not UNAVAILABLE (the server's tools being
/// listed after the first exchange), bounded.
async fn call_settled(
    client: &mut ToolGatewayClient<Channel>,
    token: &str,
    name: &str,
) -> Result<String, tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match call(client, token, name).await {
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// Asserts `status` is `code` with `reason`, its message naming `server`
/// and never carrying `secrets`.
fn refused(
    status: &tonic::Status,
    code: tonic::Code,
    reason: &str,
    server: &str,
    secrets: &[&str],
) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(crate::common::reason(status), reason, "{status:?}");
    assert!(status.message().contains(server), "{status:?}");
    for secret in secrets {
        assert!(!status.message().contains(secret), "{status:?}");
    }
}

#[tokio::test]
async fn jwt_callers_get_their_own_upstream_identity_by_token_exchange() {
    let upstream = exchange_upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let down_port = free_port();
    let servers = format!(
        "{}{}{}",
        exchange_server("crm", &upstream.mcp_url, ""),
        exchange_server(
            "bad",
            &upstream.mcp_url,
            ", audience: \"https://elsewhere.example\""
        ),
        exchange_server(
            "down",
            &upstream.mcp_url,
            &format!(", token_endpoint: \"http://127.0.0.1:{down_port}/token\"")
        ),
    );
    let (gateway, mut client) =
        start(&upstream, &[upstream.issuer.as_str()], dir.path(), &servers).await;
    let alice = caller_jwt(&upstream.issuer, "alice", 600);
    let bob = caller_jwt(&upstream.issuer, "bob", 600);

    // Two JWT callers of one tenant, each its own upstream identity, with
    // no consent screen.
    let who = call_settled(&mut client, &alice, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "alice");
    let who = call_settled(&mut client, &bob, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "bob");
    let stats = upstream.stats().await;
    assert_eq!(stats["token_requests"][TOKEN_EXCHANGE], 2, "{stats}");
    assert_eq!(stats["authorizations"], 0, "{stats}");
    // The token is reused while fresh.
    assert_eq!(
        call(&mut client, &alice, "crm__whoami").await.unwrap(),
        "alice"
    );
    assert_eq!(upstream.exchanges().await, 2);
    // The MCP server only ever saw access tokens: it introspects every
    // token it gets, and none had a JWT's shape.
    let stats = upstream.stats().await;
    assert!(stats["introspections"].as_u64() > Some(0), "{stats}");
    assert_eq!(stats["introspected_jwts"], 0, "{stats}");

    // The authorization server revokes alice's token: the MCP server
    // refuses it (401), the stored token is dropped and her JWT exchanged
    // once more.
    let response = reqwest::Client::new()
        .post(format!("{}/admin/revoke?user=alice", upstream.as_url))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{response:?}");
    assert_eq!(
        call(&mut client, &alice, "crm__whoami").await.unwrap(),
        "alice"
    );
    assert_eq!(upstream.exchanges().await, 3);
    assert_eq!(call(&mut client, &bob, "crm__whoami").await.unwrap(), "bob");
    assert_eq!(upstream.exchanges().await, 3);

    // A static-token caller is refused before anything is exchanged; its
    // listing shows the server with the reason.
    let status = call(&mut client, "acme-token", "crm__whoami")
        .await
        .expect_err("a static-token caller");
    refused(
        &status,
        tonic::Code::FailedPrecondition,
        "DELEGATION_REQUIRES_JWT",
        "crm",
        &[],
    );
    // The same on a stream and on a read.
    let stream = client
        .invoke_tool_stream(authed(
            "acme-token",
            pb::InvokeToolRequest {
                name: "crm__whoami".to_owned(),
                arguments_json: "{}".to_owned(),
                ..Default::default()
            },
        ))
        .await;
    let status = match stream {
        Err(status) => status,
        Ok(response) => response
            .into_inner()
            .message()
            .await
            .expect_err("a static-token caller's stream"),
    };
    refused(
        &status,
        tonic::Code::FailedPrecondition,
        "DELEGATION_REQUIRES_JWT",
        "crm",
        &[],
    );
    let status = client
        .read_resource(authed(
            "acme-token",
            pb::ReadResourceRequest {
                server: "crm".to_owned(),
                uri: "file:///anything".to_owned(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("a static-token caller's read");
    refused(
        &status,
        tonic::Code::FailedPrecondition,
        "DELEGATION_REQUIRES_JWT",
        "crm",
        &[],
    );
    assert_eq!(upstream.exchanges().await, 3);
    let listing = list(&mut client, "acme-token").await;
    let crm = listing.servers.iter().find(|s| s.name == "crm").unwrap();
    assert_eq!(crm.state, i32::from(pb::ServerState::AuthorizationRequired));
    assert!(crm.error.contains("JWT"), "{crm:?}");
    assert!(crm.authorization_url.is_empty(), "{crm:?}");
    let listing = list(&mut client, &alice).await;
    let crm = listing.servers.iter().find(|s| s.name == "crm").unwrap();
    assert_eq!(crm.state, i32::from(pb::ServerState::Connected), "{crm:?}");

    // An expired caller JWT is refused by authentication: no exchange.
    let expired = caller_jwt(&upstream.issuer, "carol", -120);
    let status = call(&mut client, &expired, "crm__whoami")
        .await
        .expect_err("an expired JWT");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert_eq!(upstream.exchanges().await, 3);

    // The authorization server refuses the exchange (an audience it does
    // not know): PERMISSION_DENIED with the OAuth error, never the JWT.
    let status = call(&mut client, &alice, "bad__whoami")
        .await
        .expect_err("a refused exchange");
    refused(
        &status,
        tonic::Code::PermissionDenied,
        "DELEGATION_REFUSED",
        "bad",
        &[&alice],
    );
    assert!(status.message().contains("invalid_target"), "{status:?}");
    // Refused twice: alice's ListTools above tried it first (a delegated
    // server nobody has listed), then this call; nothing retried it.
    assert_eq!(upstream.stats().await["token_errors"]["invalid_target"], 2);

    // The token endpoint down: UNAVAILABLE with RetryInfo.
    let status = call(&mut client, &alice, "down__whoami")
        .await
        .expect_err("the token endpoint is down");
    refused(
        &status,
        tonic::Code::Unavailable,
        "DELEGATION_UNAVAILABLE",
        "down",
        &[&alice],
    );
    assert!(status.get_details_retry_info().is_some(), "{status:?}");
    gateway.shutdown().await;

    // The audit trail has the authorization events, and no token.
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    for event in ["token_exchanged", "token_exchange_refused"] {
        assert!(audit.contains(event), "no {event} in:\n{audit}");
    }
    // A refusal's record names the authorization server's OAuth error
    // code; a failure, what kind it was.
    let records: Vec<serde_json::Value> = audit
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let refusal = records
        .iter()
        .find(|r| r["event"] == "token_exchange_refused" && r["server"] == "bad")
        .unwrap_or_else(|| panic!("no refusal of bad in:\n{audit}"));
    assert_eq!(refusal["reason"], "invalid_target", "{refusal}");
    let failure = records
        .iter()
        .find(|r| r["event"] == "token_exchange_failed" && r["server"] == "down")
        .unwrap_or_else(|| panic!("no failure of down in:\n{audit}"));
    assert_eq!(failure["reason"], "unavailable", "{failure}");
    for secret in [&alice, &bob] {
        assert!(
            !audit.contains(secret.as_str()),
            "a caller JWT in:\n{audit}"
        );
    }
    assert!(!audit.contains("eyJ"), "a JWT in:\n{audit}");
}

/// Nobody has listed the delegated server yet: a JWT caller's first call,
/// and another gateway's first `ListTools`, exchange the caller's JWT and
/// wait for the tools, with no UNAVAILABLE to retry.
#[tokio::test]
async fn the_first_call_and_the_first_listing_need_no_retry() {
    let upstream = exchange_upstream(3600);
    let servers = exchange_server("crm", &upstream.mcp_url, "");

    // The first RPC of all is a call: it is answered, not UNAVAILABLE.
    let dir = tempfile::tempdir().unwrap();
    let (gateway, mut client) =
        start(&upstream, &[upstream.issuer.as_str()], dir.path(), &servers).await;
    let alice = caller_jwt(&upstream.issuer, "alice", 600);
    let who = call(&mut client, &alice, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("the first call: {s:?}\n{}", upstream.logs()));
    assert_eq!(who, "alice");
    assert_eq!(upstream.exchanges().await, 1);
    gateway.shutdown().await;

    // Another gateway (its own store): the first RPC is ListTools, which
    // lists the server's tools for this JWT caller.
    let dir = tempfile::tempdir().unwrap();
    let (gateway, mut client) =
        start(&upstream, &[upstream.issuer.as_str()], dir.path(), &servers).await;
    // A static-token caller's listing exchanges nothing and lists nothing.
    let listing = list(&mut client, "acme-token").await;
    assert!(listing.tools.is_empty(), "{listing:?}");
    assert_eq!(upstream.exchanges().await, 1);
    let bob = caller_jwt(&upstream.issuer, "bob", 600);
    let listing = list(&mut client, &bob).await;
    let crm = listing.servers.iter().find(|s| s.name == "crm").unwrap();
    assert_eq!(crm.state, i32::from(pb::ServerState::Connected), "{crm:?}");
    assert!(
        listing.tools.iter().any(|t| t.name == "crm__whoami"),
        "{listing:?}"
    );
    assert_eq!(upstream.exchanges().await, 2);
    assert_eq!(call(&mut client, &bob, "crm__whoami").await.unwrap(), "bob");
    assert_eq!(upstream.exchanges().await, 2, "the token is reused");
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_expired_upstream_token_is_exchanged_again() {
    // Tokens live 4 s and are renewed with 2 s left.
    let upstream = exchange_upstream(4);
    let dir = tempfile::tempdir().unwrap();
    let servers = exchange_server("crm", &upstream.mcp_url, "");
    let (gateway, mut client) =
        start(&upstream, &[upstream.issuer.as_str()], dir.path(), &servers).await;
    let alice = caller_jwt(&upstream.issuer, "alice", 600);

    let who = call_settled(&mut client, &alice, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "alice");
    assert_eq!(upstream.exchanges().await, 1);
    // Past its life: the next call exchanges the caller's JWT again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let who = call(&mut client, &alice, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "alice");
    assert!(
        upstream.exchanges().await >= 2,
        "{}",
        upstream.stats().await
    );
    assert_eq!(
        upstream.stats().await["token_errors"],
        serde_json::json!({})
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn identity_assertion_turns_the_callers_id_token_into_an_upstream_token() {
    let upstream = identity_assertion_upstream();
    let idp_url = upstream.idp_url.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let servers = format!(
        "      - name: crm\n        url: \"{}\"\n        oauth:\n          grant: identity_assertion\n          client_id: {GW_ID}\n          client_secret: {{ env: GW_SECRET }}\n          identity_provider: {{ issuer: \"{idp_url}\", client_id: {GW_ID}, client_secret: {{ env: GW_SECRET }} }}\n",
        upstream.mcp_url
    );
    // Two issuers: the identity provider, and another one (whose callers
    // the server cannot take).
    let (gateway, mut client) = start(&upstream, &[&idp_url, ISSUER], dir.path(), &servers).await;

    let alice = caller_jwt(&idp_url, "alice", 600);
    let who = call_settled(&mut client, &alice, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "alice");
    let bob = caller_jwt(&idp_url, "bob", 600);
    let who = call_settled(&mut client, &bob, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "bob");
    // One ID-JAG per subject at the identity provider, one jwt-bearer
    // grant each at the authorization server, no consent.
    let idp = Upstream::stats_of(&idp_url).await;
    assert_eq!(idp["token_requests"][TOKEN_EXCHANGE], 2, "{idp}");
    let stats = upstream.stats().await;
    assert_eq!(stats["token_requests"][JWT_BEARER], 2, "{stats}");
    assert_eq!(stats["authorizations"], 0, "{stats}");
    assert_eq!(stats["introspected_jwts"], 0, "{stats}");

    // A JWT of another issuer than the identity provider: refused before
    // anything is exchanged.
    let other = caller_jwt(ISSUER, "carol", 600);
    let status = call(&mut client, &other, "crm__whoami")
        .await
        .expect_err("another issuer's JWT");
    refused(
        &status,
        tonic::Code::FailedPrecondition,
        "DELEGATION_ISSUER_MISMATCH",
        "crm",
        &[&other],
    );
    assert_eq!(
        Upstream::stats_of(&idp_url).await["token_requests"][TOKEN_EXCHANGE],
        2
    );
    gateway.shutdown().await;

    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(audit.contains("identity_assertion_obtained"), "{audit}");
    assert!(!audit.contains("eyJ"), "a JWT in:\n{audit}");
}

/// Issue 37: with no `token_endpoint`, the MCP server's protected-resource
/// metadata names the authorization server. One that is not the callers'
/// JWT issuer (here: one that would gladly take the JWT) never receives
/// it: the call is refused before anything is sent, and `toolgate check`
/// says why.
#[tokio::test]
async fn a_server_naming_a_foreign_authorization_server_never_receives_the_jwt() {
    let upstream = exchange_upstream_of(3600, None, ISSUER);
    let dir = tempfile::tempdir().unwrap();
    let servers = exchange_server("crm", &upstream.mcp_url, "");
    let yaml = config(&upstream, &[ISSUER], dir.path(), &servers);
    let (gateway, mut client) = start(&upstream, &[ISSUER], dir.path(), &servers).await;
    let alice = caller_jwt(ISSUER, "alice", 600);

    let status = call_settled(&mut client, &alice, "crm__whoami")
        .await
        .expect_err("the JWT has nowhere it may go");
    refused(
        &status,
        tonic::Code::FailedPrecondition,
        "DELEGATION_UNTRUSTED_ENDPOINT",
        "crm",
        &[&alice],
    );
    let listing = list(&mut client, &alice).await;
    assert!(listing.tools.is_empty(), "{listing:?}");
    let stats = upstream.stats().await;
    assert_eq!(upstream.exchanges().await, 0, "{stats}");
    assert_eq!(stats["token_errors"], serde_json::json!({}), "{stats}");
    assert!(
        !upstream.logs().contains(TOKEN_EXCHANGE),
        "{}",
        upstream.logs()
    );
    gateway.shutdown().await;

    let path = dir.path().join("check.yaml");
    std::fs::write(&path, yaml).unwrap();
    let output = tokio::task::spawn_blocking(move || check_config(&path, false))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_ne!(output.status.code(), Some(0), "{output:?}");
    assert!(
        stdout.contains(&format!(
            "names authorization server {}, which is not a callers.jwt issuer",
            upstream.as_url
        )),
        "{stdout}"
    );
    assert_eq!(upstream.exchanges().await, 0);
}

/// Issue 37: a JWT of issuer B is not exchanged at issuer A's token
/// endpoint: not at the one the server names (A), and not at a configured
/// one whose `subject_issuers` name A only; A's own JWTs are.
#[tokio::test]
async fn a_jwt_of_one_issuer_is_not_exchanged_at_anothers_endpoint() {
    let upstream = exchange_upstream(3600);
    let a = upstream.issuer.clone();
    let dir = tempfile::tempdir().unwrap();
    let servers = format!(
        "{}{}",
        exchange_server("crm", &upstream.mcp_url, ""),
        exchange_server(
            "fixed",
            &upstream.mcp_url,
            &format!(
                ", token_endpoint: \"{}/token\", subject_issuers: [\"{a}\"]",
                upstream.as_url
            )
        ),
    );
    let (gateway, mut client) = start(&upstream, &[&a, ISSUER], dir.path(), &servers).await;
    let of_b = caller_jwt(ISSUER, "bob", 600);
    let status = call_settled(&mut client, &of_b, "crm__whoami")
        .await
        .expect_err("B's JWT at A's endpoint");
    refused(
        &status,
        tonic::Code::FailedPrecondition,
        "DELEGATION_UNTRUSTED_ENDPOINT",
        "crm",
        &[&of_b],
    );
    let status = call_settled(&mut client, &of_b, "fixed__whoami")
        .await
        .expect_err("B is not among fixed's subject_issuers");
    refused(
        &status,
        tonic::Code::FailedPrecondition,
        "DELEGATION_ISSUER_MISMATCH",
        "fixed",
        &[&of_b],
    );
    let stats = upstream.stats().await;
    assert_eq!(upstream.exchanges().await, 0, "{stats}");
    assert_eq!(stats["token_errors"], serde_json::json!({}), "{stats}");

    let of_a = caller_jwt(&a, "alice", 600);
    let who = call_settled(&mut client, &of_a, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "alice");
    let who = call_settled(&mut client, &of_a, "fixed__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "alice");
    assert_eq!(upstream.exchanges().await, 2);
    gateway.shutdown().await;
}

/// `toolgate check` shows each delegated server's grant and where it
/// exchanges: as configured with `--offline`, the discovered token
/// endpoint without.
#[tokio::test]
async fn check_shows_where_each_delegated_server_exchanges() {
    let upstream = exchange_upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let servers = format!(
        "{}{}",
        exchange_server("crm", &upstream.mcp_url, ""),
        exchange_server(
            "fixed",
            &upstream.mcp_url,
            &format!(", token_endpoint: \"{}/token\"", upstream.as_url)
        ),
    );
    let path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &path,
        config(&upstream, &[upstream.issuer.as_str()], dir.path(), &servers),
    )
    .unwrap();
    let check = move |offline: bool| {
        let output = check_config(&path, offline);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        assert!(!stdout.contains(GW_SECRET), "{stdout}");
        stdout
    };
    let offline = check(true);
    assert!(
        offline.contains(&format!(
            "tenant acme server crm: grant token_exchange: the caller's JWT exchanged at its own issuer's token endpoint, only when {} names that issuer as its authorization server",
            upstream.mcp_url
        )),
        "{offline}"
    );
    assert!(
        offline.contains(&format!(
            "tenant acme server fixed: grant token_exchange: the caller's JWT exchanged at {}/token",
            upstream.as_url
        )),
        "{offline}"
    );
    let online = tokio::task::spawn_blocking(move || check(false))
        .await
        .unwrap();
    assert!(
        online.contains(&format!(
            "delegation: token_exchange at {}/token (the token endpoint of callers.jwt issuer {}, which {} names as its authorization server): JWTs of {}",
            upstream.as_url, upstream.issuer, upstream.mcp_url, upstream.issuer
        )),
        "{online}\n{}",
        upstream.logs()
    );
    assert!(
        online.contains(&format!(
            "delegation: token_exchange at {}/token (configured)",
            upstream.as_url
        )),
        "{online}"
    );
    // Checking exchanges nothing.
    assert_eq!(upstream.exchanges().await, 0);
}

/// The caller's JWT goes to the token endpoint only: the MCP server (an
/// in-process one that records every request's headers, with a configured
/// `token_endpoint`: it has no metadata of its own) gets the exchanged
/// token, and its echo of the JWT is redacted.
#[tokio::test]
async fn the_callers_jwt_goes_to_the_token_endpoint_only() {
    let server = TestServer::new(&["echo"]);
    let log = server.log.clone();
    let mcp = serve_mcp(server).await;
    let logs = tempfile::tempdir().unwrap();
    let jwks_file = write_jwks(logs.path());
    let jwks = jwks_file.display().to_string();
    let mut args = as_args(&mcp.url, "3600");
    args.extend([
        "--subject-jwks",
        &jwks,
        "--subject-issuer",
        ISSUER,
        "--subject-audience",
        AUDIENCE,
    ]);
    let (as_guard, as_port) = start_node("oidc_as.mjs", &args, &logs.path().join("oidc_as.log"));
    let as_url = format!("http://127.0.0.1:{as_port}");
    let upstream = Upstream {
        _guards: vec![as_guard],
        as_url: as_url.clone(),
        idp_url: None,
        mcp_url: mcp.url.clone(),
        logs,
        jwks_file,
        issuer: ISSUER.to_owned(),
    };
    let dir = tempfile::tempdir().unwrap();
    let servers = exchange_server(
        "direct",
        &mcp.url,
        &format!(", token_endpoint: \"{as_url}/token\""),
    );
    let (gateway, mut client) =
        start(&upstream, &[upstream.issuer.as_str()], dir.path(), &servers).await;
    let alice = caller_jwt(&upstream.issuer, "alice", 600);

    let deadline = Instant::now() + Duration::from_secs(20);
    let echoed = loop {
        let request = authed(
            &alice,
            pb::InvokeToolRequest {
                name: "direct__echo".to_owned(),
                arguments_json: serde_json::json!({ "text": format!("my token is {alice}") })
                    .to_string(),
                ..Default::default()
            },
        );
        match client.invoke_tool(request).await {
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => break other.unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs())),
        }
    }
    .into_inner();
    assert!(echoed.text.starts_with("my token is "), "{echoed:?}");
    assert!(
        !echoed.text.contains(&alice),
        "the JWT echoed back: {echoed:?}"
    );
    assert_eq!(upstream.exchanges().await, 1);

    let headers = log.headers.lock().unwrap().clone();
    let sent: Vec<&String> = headers
        .iter()
        .filter_map(|h| h.get("authorization"))
        .collect();
    assert!(!sent.is_empty(), "no request carried a token");
    for value in sent {
        assert!(value.starts_with("Bearer "), "{value}");
        assert!(
            !value.contains(&alice),
            "the MCP server was sent the caller's JWT"
        );
        assert_eq!(value.matches('.').count(), 0, "a JWT-shaped token: {value}");
    }
    gateway.shutdown().await;
}

/// A token without the scope the server needs (`403 insufficient_scope`):
/// one more exchange asking for the granted and the challenged scopes.
#[tokio::test]
async fn insufficient_scope_steps_up_with_one_more_exchange() {
    let upstream = exchange_upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let servers = exchange_server("crm", &upstream.mcp_url, ", scopes: [profile]");
    let (gateway, mut client) =
        start(&upstream, &[upstream.issuer.as_str()], dir.path(), &servers).await;
    let alice = caller_jwt(&upstream.issuer, "alice", 600);

    let who = call_settled(&mut client, &alice, "crm__whoami")
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", upstream.logs()));
    assert_eq!(who, "alice");
    // The first exchange asked for `profile` only; the step-up for
    // `profile tools`; the token is then reused.
    assert_eq!(upstream.exchanges().await, 2, "{}", upstream.logs());
    assert_eq!(
        call(&mut client, &alice, "crm__whoami").await.unwrap(),
        "alice"
    );
    assert_eq!(upstream.exchanges().await, 2);
    gateway.shutdown().await;
}
