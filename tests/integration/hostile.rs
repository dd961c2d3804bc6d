//! Hostile upstreams: for each misbehaviour, the gateway's answer, and
//! proof that the tenant's other servers and other tenants keep working.

use std::path::Path;
use std::time::{Duration, Instant};

use toolgate::pb;

use crate::common::*;

const TOKEN: &str = "acme-token";
const OTHER: &str = "other-token";

/// A gateway where tenant `acme` has `bad` (hostile_server.py MODE over
/// stdio) and `good` (an in-process server), and tenant `other` has its own
/// `good`. `extra` is appended to the `bad` server's config.
struct Setup {
    gateway: TestGateway,
    _good: McpServer,
    _other: McpServer,
    log: tempfile::TempDir,
}

impl Setup {
    /// `mode` may end in `+idempotent`: then `bad__echo` is annotated
    /// `idempotentHint: true`.
    async fn start(mode: &str, extra: &str) -> Setup {
        Self::start_with_backoff(mode, extra, "200ms").await
    }

    /// Like [`Setup::start`], with `bad` reconnecting after `backoff` (the
    /// first delay, and the largest).
    async fn start_with_backoff(mode: &str, extra: &str, backoff: &str) -> Setup {
        let (mode, idempotent) = match mode.strip_suffix("+idempotent") {
            Some(mode) => (mode, "1"),
            None => (mode, "0"),
        };
        let good = serve_mcp(TestServer::new(&["echo"])).await;
        let other = serve_mcp(TestServer::new(&["echo"])).await;
        let log = tempfile::tempdir().unwrap();
        let yaml = format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: bad\n        command: [\"{python}\", \"{script}\", \"{mode}\"]\n        env:\n          HOSTILE_LOG: \"{log}\"\n          HOSTILE_SLOW_SECS: \"30\"\n          HOSTILE_IDEMPOTENT: \"{idempotent}\"\n        connect_timeout: \"5s\"\n        max_list_pages: 10\n        reconnect:\n          initial_backoff: \"{backoff}\"\n          max_backoff: \"{max_backoff}\"\n{extra}      - name: good\n        url: \"{good}\"\n  - name: other\n    tokens: [{OTHER}]\n    servers:\n      - name: good\n        url: \"{other}\"\n",
            python = python().display(),
            script = fixture("python/hostile_server.py").display(),
            log = log.path().join("messages.jsonl").display(),
            good = good.url,
            other = other.url,
            max_backoff = if backoff == "200ms" { "1s" } else { backoff },
        );
        let gateway = TestGateway::start(&yaml, &[]).await;
        Setup {
            gateway,
            _good: good,
            _other: other,
            log,
        }
    }

    /// Shows that everything but `bad` still works.
    async fn others_still_work(&self) {
        let mut client = self.gateway.client().await;
        let answer = invoke(&mut client, TOKEN, "good__echo", r#"{"text":"fine"}"#)
            .await
            .unwrap();
        assert_eq!(answer.text, "fine");
        let answer = invoke(&mut client, OTHER, "good__echo", r#"{"text":"fine too"}"#)
            .await
            .unwrap();
        assert_eq!(answer.text, "fine too");
    }

    async fn bad_status(&self) -> pb::ServerStatus {
        let mut client = self.gateway.client().await;
        list(&mut client, TOKEN).await.servers[0].clone()
    }

    fn messages(&self) -> Vec<serde_json::Value> {
        read_log(&self.log.path().join("messages.jsonl"))
    }
}

fn read_log(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

async fn call_with_deadline(
    gateway: &TestGateway,
    name: &str,
    deadline: Duration,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    call_saying(gateway, name, "x", deadline).await
}

/// Calls `name` with `{"text": text}` under `deadline`.
async fn call_saying(
    gateway: &TestGateway,
    name: &str,
    text: &str,
    deadline: Duration,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    let mut client = gateway.client().await;
    let mut request = authed(
        TOKEN,
        pb::InvokeToolRequest {
            name: name.into(),
            arguments_json: serde_json::json!({ "text": text }).to_string(),
            ..Default::default()
        },
    );
    request.set_timeout(deadline);
    client
        .invoke_tool(request)
        .await
        .map(tonic::Response::into_inner)
}

/// Polls (bounded) until `bad` is connected again.
async fn wait_connected(setup: &Setup) -> pb::ServerStatus {
    let started = Instant::now();
    loop {
        let status = setup.bad_status().await;
        if status.connected {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never reconnected: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_cancelled(setup: &Setup) {
    let started = Instant::now();
    while !setup
        .messages()
        .iter()
        .any(|m| m["method"] == "notifications/cancelled")
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no notifications/cancelled: {:?}",
            setup.messages()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn pages_forever() {
    let setup = Setup::start("page_forever", "").await;
    let status = setup.bad_status().await;
    assert!(!status.connected);
    assert!(
        status.error.contains("more than 10 pages"),
        "{}",
        status.error
    );
    setup.others_still_work().await;
}

#[tokio::test]
async fn repeats_a_cursor() {
    let setup = Setup::start("repeat_cursor", "").await;
    assert!(
        setup
            .bad_status()
            .await
            .error
            .contains("repeated the cursor")
    );
    setup.others_still_work().await;
}

#[tokio::test]
async fn lists_an_invalid_tool_name() {
    let setup = Setup::start("invalid_name", "").await;
    let status = setup.bad_status().await;
    assert_eq!(status.state, pb::ServerState::Refused as i32);
    assert!(
        status.error.contains("`bad name!`") && status.error.contains("`bad`"),
        "{}",
        status.error
    );
    setup.others_still_work().await;
}

#[tokio::test]
async fn returns_100_mib() {
    let setup = Setup::start("huge_result", "").await;
    let started = Instant::now();
    let err = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(4))
        .await
        .unwrap_err();
    // The oversized line is skipped without being buffered, and the call
    // it answers fails at once (not at its deadline).
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_eq!(reason(&err), "RESULT_TOO_LARGE");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "answered before the deadline"
    );
    setup.others_still_work().await;
}

#[tokio::test]
async fn never_answers() {
    let setup = Setup::start("never_answer", "").await;
    // The gateway answers its margin (5 %, at most 250 ms) before the
    // caller's deadline. The test's client runs on the gateway's own
    // thread: a stall of the process longer than the margin lets the
    // client's timer win (CANCELLED "Timeout expired"; 800 ms left 40 ms,
    // too little on a loaded machine). 5 s leaves the largest margin.
    let err = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert_eq!(reason(&err), "DEADLINE_EXCEEDED");
    wait_cancelled(&setup).await;
    setup.others_still_work().await;
}

#[tokio::test]
async fn answers_after_the_deadline() {
    let setup = Setup::start("late_answer", "").await;
    let err = call_saying(&setup.gateway, "bad__echo", "first", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
    wait_cancelled(&setup).await;
    // The late answer ("first", about 2 s from now) arrives while the next
    // call waits for its own, and is dropped: the next call gets its own
    // text, and the session stays usable.
    let answer = call_saying(
        &setup.gateway,
        "bad__echo",
        "second",
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert!(!answer.is_error);
    assert_eq!(
        answer.text, "second",
        "the late answer landed on the next call"
    );
    setup.others_still_work().await;
}

#[tokio::test]
async fn crashes_mid_call_then_reconnects() {
    // Reconnecting waits 1.5 to 3 s (equal jitter), so the server is
    // surely down right after the crash.
    let setup = Setup::start_with_backoff("crash_mid_call", "", "3s").await;
    let before = setup.bad_status().await;
    assert!(before.connected);
    let started = Instant::now();
    let err = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(30))
        .await
        .unwrap_err();
    // The request reached the server, which may have acted: UNKNOWN, so
    // that no retry policy replays it on the code alone; no RetryInfo.
    assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
    assert_eq!(reason(&err), "UPSTREAM_CONNECTION_LOST");
    {
        use tonic_types::StatusExt;
        assert!(err.get_details_retry_info().is_none(), "{err:?}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered promptly"
    );
    // Until it is back, its tools answer UNAVAILABLE with RetryInfo, not
    // NOT_FOUND; then the supervisor has reconnected it.
    let status = setup.bad_status().await;
    assert!(!status.connected, "down after the crash: {status:?}");
    let err = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (tonic::Code::Unavailable, "UPSTREAM_UNAVAILABLE"),
        "{err:?}"
    );
    {
        use tonic_types::StatusExt;
        assert!(err.get_details_retry_info().is_some(), "{err:?}");
    }
    wait_connected(&setup).await;
    setup.others_still_work().await;
}

/// The same crash, but the tool says it is idempotent: running it again is
/// harmless, so the outcome is UNAVAILABLE with RetryInfo.
#[tokio::test]
async fn crashes_mid_call_on_an_idempotent_tool() {
    let setup = Setup::start("crash_mid_call+idempotent", "").await;
    let err = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_eq!(reason(&err), "UPSTREAM_CONNECTION_LOST");
    use tonic_types::StatusExt;
    assert!(err.get_details_retry_info().is_some(), "{err:?}");
    wait_connected(&setup).await;
}

#[tokio::test]
async fn exits_at_start() {
    let setup = Setup::start("exit_at_start", "").await;
    let status = setup.bad_status().await;
    assert_eq!(status.state, pb::ServerState::Failed as i32);
    assert!(
        status.error.contains("reconnect attempt"),
        "{}",
        status.error
    );
    let err = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::Unavailable,
        "a configured namespace is unavailable, not unknown"
    );
    setup.others_still_work().await;
}

#[tokio::test]
async fn writes_garbage_to_stdout() {
    let setup = Setup::start("garbage_stdout", "").await;
    // Garbage lines are skipped by the transport; the session answers.
    for _ in 0..3 {
        let answer = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(10)).await;
        assert_eq!(answer.unwrap().text, "x");
    }
    setup.others_still_work().await;
}

#[tokio::test]
async fn closes_stdout_mid_call() {
    let setup = Setup::start("close_stdout", "").await;
    let started = Instant::now();
    let err = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
    assert_eq!(reason(&err), "UPSTREAM_CONNECTION_LOST");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered promptly"
    );
    setup.others_still_work().await;
}

#[tokio::test]
async fn floods_stderr() {
    let setup = Setup::start("flood_stderr", "").await;
    for _ in 0..5 {
        let answer = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(answer.text, "x");
    }
    setup.others_still_work().await;
}

#[tokio::test]
async fn sends_progress_forever() {
    let setup = Setup::start("progress_forever", "").await;
    // 5 s, for the margin (see `never_answers`).
    let err = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    wait_cancelled(&setup).await;
    setup.others_still_work().await;
}

#[tokio::test]
async fn answers_discover_with_an_empty_result() {
    // `auto` falls back to `initialize` on a fresh connection.
    let setup = Setup::start("empty_discover", "        lifecycle: auto\n").await;
    assert!(wait_connected(&setup).await.connected);
    let answer = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(answer.text, "x");
    assert!(
        setup
            .messages()
            .iter()
            .any(|m| m["method"] == "server/discover")
    );
    assert!(setup.messages().iter().any(|m| m["method"] == "initialize"));
    setup.others_still_work().await;
}

#[tokio::test]
async fn speaks_only_the_modern_lifecycle() {
    for lifecycle in ["discover", "auto"] {
        let setup = Setup::start("modern_only", &format!("        lifecycle: {lifecycle}\n")).await;
        assert!(wait_connected(&setup).await.connected, "{lifecycle}");
        let answer = call_with_deadline(&setup.gateway, "bad__echo", Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(answer.text, "x", "{lifecycle}");
        assert!(
            !setup.messages().iter().any(|m| m["method"] == "initialize"),
            "{lifecycle}"
        );
    }
    // With `initialize` (the default) it is reported, not hidden.
    let setup = Setup::start("modern_only", "").await;
    assert_eq!(
        setup.bad_status().await.state,
        pb::ServerState::Failed as i32
    );
    setup.others_still_work().await;
}
