//! What a live session holds between calls. A 2026-07-28 server
//! (`lifecycle: discover`) needs no session: calls to it open no standing
//! GET stream, and the session's rmcp service is closed once unused for
//! a few seconds, opened again by the next call. The 2025-11-25 session
//! of the same server (`lifecycle: initialize`) keeps its GET stream: the
//! control that shows the fixture counts what it should. The server is the
//! Python `mcp` SDK's, counting HTTP requests by method
//! (`streams_server.py`).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

const TOKEN: &str = "acme-token";

/// `streams_server.py` on a free port.
async fn streams_server() -> (ChildGuard, u16) {
    let port = free_port();
    let child = std::process::Command::new(python())
        .arg(fixture("python/streams_server.py"))
        .arg(port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = ChildGuard(child);
    wait_for_port(port).await;
    (child, port)
}

/// The server's request counts: `started` and `open` by HTTP method,
/// `open_rpc` (open POSTs) by JSON-RPC method.
async fn counts(port: u16) -> Value {
    reqwest::get(format!("http://127.0.0.1:{port}/counts"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `counts[kind][key]`, 0 when absent.
fn count(counts: &Value, kind: &str, key: &str) -> u64 {
    counts[kind][key].as_u64().unwrap_or(0)
}

/// The open POSTs other than `subscriptions/listen`, by JSON-RPC method.
fn open_besides_listen(counts: &Value) -> Vec<(String, u64)> {
    counts["open_rpc"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(rpc, n)| *rpc != "subscriptions/listen" && n.as_u64() != Some(0))
        .map(|(rpc, n)| (rpc.clone(), n.as_u64().unwrap_or(0)))
        .collect()
}

/// Waits until `check` holds (at most 30 s); panics with `what` else.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < Duration::from_secs(30), "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Calls to a 2026-07-28 server open no GET stream, and once they are
/// answered none of their requests stays open: the one request left open
/// is the `subscriptions/listen` stream the gateway keeps for the list
/// changes the server declares (`listChanged`), what following its
/// catalog costs. The 2025-11-25 session of the same fixture keeps its
/// standing GET stream (the control).
#[tokio::test]
async fn a_stateless_session_opens_no_stream_between_calls() {
    let (_stateless, stateless_port) = streams_server().await;
    let (_legacy, legacy_port) = streams_server().await;
    let yaml = format!(
        "listen: \"127.0.0.1:0\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n\
         \x20     - name: st\n        url: \"http://127.0.0.1:{stateless_port}/mcp\"\n        lifecycle: discover\n\
         \x20     - name: legacy\n        url: \"http://127.0.0.1:{legacy_port}/mcp\"\n        lifecycle: initialize\n"
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "st__echo").await;
    wait_listed(&mut client, TOKEN, "legacy__echo").await;
    for i in 0..3 {
        for tool in ["st__echo", "legacy__echo"] {
            let text = format!("hello {i}");
            let answer = invoke(&mut client, TOKEN, tool, &format!(r#"{{"text":"{text}"}}"#))
                .await
                .unwrap_or_else(|e| panic!("{tool}: {e}"));
            assert!(format!("{answer:?}").contains(&text), "{tool}: {answer:?}");
        }
    }
    // The control: a 2025-11-25 session holds its GET stream open.
    eventually("the 2025-11-25 session's GET stream is open", || async {
        count(&counts(legacy_port).await, "open", "GET") >= 1
    })
    .await;
    // The 2026-07-28 session: every call's POST answered and closed, at
    // most the one listen stream open, no GET ever.
    eventually(
        "a 2026-07-28 request stayed open after its answer",
        || async { open_besides_listen(&counts(stateless_port).await).is_empty() },
    )
    .await;
    let stateless = counts(stateless_port).await;
    assert!(
        count(&stateless, "open_rpc", "subscriptions/listen") <= 1,
        "one listen stream for list changes at most: {stateless}"
    );
    assert_eq!(
        count(&stateless, "started", "GET"),
        0,
        "a 2026-07-28 session opened a GET stream: {stateless}"
    );
    assert!(
        count(&stateless, "started", "POST") >= 5,
        "discover, tools/list, prompts/list and 3 calls: {stateless}"
    );
    gateway.shutdown().await;
}

/// A 2026-07-28 session's rmcp service (its loop, HTTP worker and their
/// channels) is closed a few seconds after its last request, opened again
/// by the next call, and closed again after it; a 2025-11-25 session
/// keeps its own.
#[tokio::test]
async fn a_stateless_session_holds_no_service_between_calls() {
    use toolgate::upstream::{CallOutcome, CallRequest};
    let (_server, port) = streams_server().await;
    let env: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let yaml = |lifecycle: &str| {
        format!(
            "listen: \"127.0.0.1:0\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n\
             \x20     - name: st\n        url: \"http://127.0.0.1:{port}/mcp\"\n        lifecycle: {lifecycle}\n"
        )
    };
    let redactor: toolgate::credentials::SharedRedactor =
        std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(Default::default()));
    let label = toolgate::upstream::Label {
        tenant: "acme".to_owned(),
        server: "st".to_owned(),
    };
    let connect = |lifecycle: &str| {
        let config = toolgate::config::Config::from_yaml(
            &yaml(lifecycle),
            "test.yaml",
            std::path::Path::new("."),
            &env,
        )
        .unwrap();
        let (env, redactor, label) = (env.clone(), redactor.clone(), label.clone());
        async move {
            let server = &config.tenants[0].servers[0];
            toolgate::upstream::connect(server, &label, &env, 1 << 20, &redactor)
                .await
                .unwrap()
                .session
        }
    };
    let call = || {
        let mut arguments = serde_json::Map::new();
        arguments.insert("text".to_owned(), "hi".into());
        CallRequest::new("echo", arguments, Duration::from_secs(20))
    };

    let session = connect("discover").await;
    assert!(session.is_stateless());
    eventually("the connect's service was never closed", || async {
        !session.holds_service()
    })
    .await;
    let outcome = session.call(&call()).await.unwrap();
    assert!(matches!(outcome, CallOutcome::Complete(_)), "{outcome:?}");
    assert!(
        session.holds_service(),
        "the call's service lingers a moment"
    );
    eventually("the call's service was never closed", || async {
        !session.holds_service()
    })
    .await;
    assert!(
        !session.is_ended(),
        "closing its service does not end the session"
    );
    session.close().await;
    assert!(session.is_ended());

    // 2025-11-25: one service for the session's life.
    let legacy = connect("initialize").await;
    assert!(!legacy.is_stateless());
    assert!(!legacy.holds_service(), "a standing session leases nothing");
    let outcome = legacy.call(&call()).await.unwrap();
    assert!(matches!(outcome, CallOutcome::Complete(_)), "{outcome:?}");
    legacy.close().await;
}
