//! Configured credentials never travel back: an HTTP upstream that echoes
//! the gateway's `Authorization` header (in an HTTP error body, a JSON-RPC
//! error, a tool result, a failed `tools/list`) reaches neither the caller
//! nor the gateway's log, and upstream text is bounded. One request refused
//! with an HTTP error status fails that call only; the session stays.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tonic::Code;
use toolgate::pb;

use crate::common::*;

const TOKEN: &str = "acme-token";
/// The credential the upstream echoes (the part after `Bearer `, which
/// servers echo most).
const SECRET: &str = "sk-live-4f1b2c3d4e5f60718293a4b5";

/// The most bytes a status message may have.
const MAX_MESSAGE: usize = 2048;

/// `tests/fixtures/python/echo_auth_server.py` running; killed on drop.
pub(crate) struct Upstream {
    _child: ChildGuard,
    pub(crate) port: u16,
}

pub(crate) fn start_upstream(args: &[&str]) -> Upstream {
    let mut child = Command::new(python())
        .arg(fixture("python/echo_auth_server.py"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start echo_auth_server.py");
    let stdout = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("echo_auth_server.py printed {line:?}"));
    Upstream {
        _child: guard,
        port,
    }
}

/// A `toolgate serve` process with tenant `acme`: `echo` and `raw` (the
/// same upstream, `raw` with `redact_results: false`), and `broken`, whose
/// `tools/list` fails with an echo.
struct Setup {
    gateway: ChildGuard,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
    _upstreams: (Upstream, Upstream),
}

impl Setup {
    async fn start() -> Setup {
        let good = start_upstream(&[]);
        let broken = start_upstream(&["--fail-list"]);
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let server = |name: &str, upstream: &Upstream, extra: &str| {
            format!(
                "      - name: {name}\n        url: \"http://127.0.0.1:{}/mcp\"\n        headers:\n          Authorization: {{ env: UPSTREAM_AUTH }}\n        reconnect:\n          initial_backoff: \"200ms\"\n          max_backoff: \"1s\"\n{extra}",
                upstream.port
            )
        };
        let yaml = format!(
            "listen: \"127.0.0.1:{port}\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{}{}{}",
            server("echo", &good, ""),
            server("raw", &good, "        redact_results: false\n"),
            server("broken", &broken, ""),
        );
        let config = dir.path().join("toolgate.yaml");
        std::fs::write(&config, yaml).unwrap();
        let log = dir.path().join("gateway.log");
        let gateway = ChildGuard(
            Command::new(toolgate_bin())
                .args(["serve", "--config"])
                .arg(&config)
                .env("UPSTREAM_AUTH", format!("Bearer {SECRET}"))
                .env("RUST_LOG", "info,toolgate=debug")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        wait_for_port(port).await;
        let setup = Setup {
            gateway,
            port,
            log,
            _dir: dir,
            _upstreams: (good, broken),
        };
        setup.wait_settled().await;
        setup
    }

    /// Waits (bounded) until `echo` and `raw` are connected and `broken`
    /// has failed.
    async fn wait_settled(&self) -> pb::ListToolsResponse {
        let started = Instant::now();
        loop {
            let mut client = client_at(self.port).await;
            let listing = list(&mut client, TOKEN).await;
            let state = |name: &str| {
                listing
                    .servers
                    .iter()
                    .find(|s| s.name == name)
                    .map(|s| pb::ServerState::try_from(s.state).unwrap())
            };
            if state("echo") == Some(pb::ServerState::Connected)
                && state("raw") == Some(pb::ServerState::Connected)
                && state("broken") == Some(pb::ServerState::Failed)
            {
                return listing;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "servers never settled: {:?}",
                listing.servers
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn call(&self, name: &str) -> Result<pb::InvokeToolResponse, tonic::Status> {
        let mut client = client_at(self.port).await;
        invoke(&mut client, TOKEN, name, "{}").await
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // ChildGuard kills; nothing else to do. (Keeps `gateway` used.)
        let _ = self.gateway.0.id();
    }
}

/// Upstream text as a caller sees it: redacted, bounded.
fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET),
        "{what} carries the credential: {text}"
    );
    assert!(
        text.contains("[redacted]"),
        "{what} shows no redaction: {text}"
    );
}

fn assert_clean_status(what: &str, status: &tonic::Status) {
    assert_clean(what, status.message());
    assert!(
        status.message().len() < MAX_MESSAGE,
        "{what}: a {}-byte status message",
        status.message().len()
    );
}

impl Setup {
    /// The gateway's log saw the upstream's echo and kept none of it.
    fn assert_log_clean(&self, redaction_logged: bool) {
        let log = self.log();
        assert!(
            !log.contains(SECRET),
            "the gateway log carries the credential:\n{log}"
        );
        if redaction_logged {
            assert!(log.contains("[redacted]"), "{log}");
        }
    }
}

#[tokio::test]
async fn an_http_error_body_is_redacted_and_bounded() {
    let setup = Setup::start().await;

    // HTTP 400 with a 60 KB body echoing the header: the call fails, with
    // the body redacted and cut.
    let status = setup.call("echo__http400").await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(reason(&status), "UPSTREAM_HTTP_ERROR");
    assert_clean_status("an HTTP 400 body", &status);
    assert!(
        status.message().contains("HTTP 400"),
        "{}",
        status.message()
    );
    let info = format!("{:?}", tonic_types::StatusExt::get_error_details(&status));
    assert!(!info.contains(SECRET), "{info}");

    // The same through a real grpcio client: the status fits its metadata
    // limit, and neither message nor ErrorInfo carries the credential.
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(python())
            .arg(fixture("python/grpc_client.py"))
            .args(["--addr", &format!("127.0.0.1:{}", setup.port)])
            .args(["invoke", "echo__http400", "{}"])
            .env("TOOLGATE_TOKEN", TOKEN)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("grpc_client.py finishes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "{stdout}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let error = &answer["error"];
    let message = error["message"].as_str().unwrap();
    assert!(
        !message.contains("metadata size exceeds"),
        "grpcio refused the status: {message}"
    );
    assert_eq!(error["code"], "INTERNAL", "{answer}");
    assert_clean("the grpcio status message", message);
    assert_eq!(
        error["details"][0]["reason"], "UPSTREAM_HTTP_ERROR",
        "{answer}"
    );
    assert!(!stdout.contains(SECRET), "{stdout}");

    setup.assert_log_clean(true);
}

#[tokio::test]
async fn a_jsonrpc_error_message_is_redacted() {
    let setup = Setup::start().await;
    let status = setup.call("echo__rpc_error").await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(&status), "UPSTREAM_INVALID_PARAMS");
    assert_clean_status("a JSON-RPC error message", &status);
    setup.assert_log_clean(true);
}

#[tokio::test]
async fn tool_results_are_redacted_unless_configured_off() {
    let setup = Setup::start().await;
    // The echo in every place a result carries text: a text block and its
    // `_meta`, an embedded resource, structured content (keys and values),
    // the result's `_meta`.
    let result = setup.call("echo__echo_auth").await.unwrap();
    assert_clean("the result text", &result.text);
    assert_clean("structured content", &result.structured_content_json);
    let everything = format!("{result:?}");
    assert!(!everything.contains(SECRET), "{everything}");
    assert!(
        everything.contains("header: [redacted]"),
        "the embedded resource: {everything}"
    );

    // `redact_results: false` passes results through.
    let raw = setup.call("raw__echo_auth").await.unwrap();
    assert!(raw.text.contains(SECRET), "redact_results: false: {raw:?}");
}

/// MCP's gRPC transport carries what `toolgate.v1` drops (every `_meta`,
/// annotations): none of it holds the credential either, nor does an
/// upstream error's status.
#[tokio::test]
async fn the_mcp_transport_carries_no_credential_either() {
    use toolgate::pb::mcp;
    let setup = Setup::start().await;
    let channel =
        tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{}", setup.port))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut client = mcp::mcp_client::McpClient::new(channel);
    let call = |name: &str| mcp::CallToolRequest {
        common: None,
        request: Some(mcp::call_tool_request::Request {
            name: name.to_owned(),
            arguments: None,
        }),
    };
    let reply = client
        .call_tool(authed(TOKEN, call("echo__echo_auth")))
        .await
        .unwrap()
        .into_inner();
    let everything = format!("{reply:?}");
    assert!(!everything.contains(SECRET), "{everything}");
    assert!(everything.contains("[redacted]"), "{everything}");
    let status = client
        .call_tool(authed(TOKEN, call("echo__rpc_error")))
        .await
        .unwrap_err();
    assert_clean_status("a JSON-RPC error over the transport", &status);
    // `redact_results: false` passes results through, as on toolgate.v1.
    let raw = client
        .call_tool(authed(TOKEN, call("raw__echo_auth")))
        .await
        .unwrap()
        .into_inner();
    assert!(format!("{raw:?}").contains(SECRET));
    setup.assert_log_clean(true);
}

#[tokio::test]
async fn a_failed_tool_listing_is_redacted_and_bounded() {
    let setup = Setup::start().await;
    let listing = setup.wait_settled().await;
    let broken = listing.servers.iter().find(|s| s.name == "broken").unwrap();
    assert_clean("ServerStatus.error", &broken.error);
    assert!(
        broken.error.len() < MAX_MESSAGE,
        "a {}-byte ServerStatus.error",
        broken.error.len()
    );
    assert!(broken.error.contains("HTTP 400"), "{}", broken.error);
    setup.assert_log_clean(true);
}

#[tokio::test]
async fn a_refused_request_fails_alone_and_keeps_the_session() {
    let setup = Setup::start().await;
    let before = setup.call("echo__session").await.unwrap().text;

    // Two concurrent calls on one session; one is answered HTTP 400.
    let slow = setup.call("echo__slow_ok");
    let refused = async {
        // Let the slow call reach the server first.
        tokio::time::sleep(Duration::from_millis(100)).await;
        setup.call("echo__rejected").await
    };
    let (slow, refused) = tokio::join!(slow, refused);
    assert_eq!(slow.expect("the other call succeeds").text, "slow ok");
    let refused = refused.unwrap_err();
    assert_eq!(reason(&refused), "UPSTREAM_HTTP_ERROR", "{refused:?}");
    assert!(refused.message().contains("rejected"), "{refused:?}");

    // A later call works on the same session: no reconnect.
    let after = setup.call("echo__session").await.unwrap().text;
    assert_eq!(before, after, "the session was replaced");
    assert_eq!(setup.call("echo__ok").await.unwrap().text, "ok");
}

#[tokio::test]
async fn sequential_calls_reuse_pooled_connections() {
    let setup = Setup::start().await;
    let first = setup.call("echo__peer").await.unwrap().text;
    let mut ports = std::collections::HashSet::new();
    for _ in 0..20 {
        ports.insert(setup.call("echo__peer").await.unwrap().text);
    }
    // Pooled: new connections do not grow with the calls (at most 5 of
    // 20, as in tls.rs: a connection still on its way back to the pool
    // when the next call starts is replaced now and then on a loaded
    // machine).
    ports.remove(&first);
    assert!(
        ports.len() <= 5,
        "20 sequential calls opened {} new connections: client ports {ports:?} (first {first})",
        ports.len()
    );
}

/// Issue 37: a server that echoes the bare credential of an
/// `Authorization: Bearer <token>` header (without `Bearer `), short or
/// long, in a result or a JSON-RPC error: redacted on the path the gateway
/// really takes (the header from a secret source, the `toolgate serve`
/// process), and absent from its log.
#[tokio::test]
async fn a_bare_bearer_token_echoed_alone_is_redacted_short_or_long() {
    // The shortest value redacted (`MIN_REDACTED_LEN`, 8), and one longer
    // than the 32-byte anchor.
    const SHORT: &str = "k9Zq2xW7";
    const LONG: &str = "tok-9f8e7d6c5b4a39281706f5e4d3c2b1a0ffeeddccbbaa99887766";
    let upstream = start_upstream(&[]);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = |name: &str, env: &str| {
        format!(
            "      - name: {name}\n        url: \"http://127.0.0.1:{}/mcp\"\n        headers:\n          Authorization: {{ env: {env} }}\n",
            upstream.port
        )
    };
    let yaml = format!(
        "listen: \"127.0.0.1:{port}\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{}{}",
        server("short", "SHORT_AUTH"),
        server("long", "LONG_AUTH"),
    );
    let config = dir.path().join("toolgate.yaml");
    std::fs::write(&config, yaml).unwrap();
    let log = dir.path().join("gateway.log");
    let (short, long) = (format!("Bearer {SHORT}"), format!("Bearer {LONG}"));
    let _gateway = serve_binary(
        &config,
        &log,
        &[("SHORT_AUTH", &short), ("LONG_AUTH", &long)],
    );
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    for (server, token) in [("short", SHORT), ("long", LONG)] {
        let name = format!("{server}__echo_bare");
        let started = Instant::now();
        let result = loop {
            match invoke(&mut client, TOKEN, &name, "{}").await {
                Err(status)
                    if status.code() == Code::Unavailable
                        && started.elapsed() < Duration::from_secs(20) =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other.unwrap(),
            }
        };
        let everything = format!("{result:?}");
        assert!(!everything.contains(token), "{server}: {everything}");
        assert!(
            result.text.contains("[redacted]") && result.text.contains("key=[redacted];"),
            "{server}: {result:?}"
        );
        let status = invoke(&mut client, TOKEN, &name, r#"{"error": true}"#)
            .await
            .expect_err("a JSON-RPC error");
        assert!(!status.message().contains(token), "{server}: {status:?}");
        assert!(
            status.message().contains("bad key [redacted]"),
            "{status:?}"
        );
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains(SHORT) && !log.contains(LONG), "{log}");
}
