//! Circuit breakers (issue 36) with real servers: an HTTP server answering
//! 503 behind a gate that counts what reaches it, a stdio server that is
//! frozen (SIGSTOP) and then killed, and a per-user OAuth server (the
//! Python fixtures of oauth.rs) frozen while two subjects call it. A run of breaking failures opens the
//! server's breaker (the next call is SERVER_CIRCUIT_OPEN with RetryInfo and
//! never reaches the server), ListTools and the metrics say so, a probe
//! after the cool-down closes it (or, failing, opens it again for longer;
//! only one at a time), a reconnect closes it, the tenant's other servers
//! and a tool's `isError` answers never count, a per-user server's subjects
//! have breakers of their own, shared by every kind of call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::Code;
use tonic_types::StatusExt;
use toolgate::pb;

use crate::common::*;

const TOKEN: &str = "breaker-token";

/// The status of server `name` in a listing.
fn server<'a>(listing: &'a pb::ListToolsResponse, name: &str) -> &'a pb::ServerStatus {
    listing
        .servers
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no server {name}: {listing:?}"))
}

fn circuit(listing: &pb::ListToolsResponse, name: &str) -> pb::CircuitState {
    server(listing, name).circuit()
}

/// A call refused by an open breaker: UNAVAILABLE, the reason, the server
/// in the metadata, and RetryInfo within `at_most`.
fn assert_circuit_open(status: &tonic::Status, name: &str, at_most: Duration) -> Duration {
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(reason(status), "SERVER_CIRCUIT_OPEN", "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.metadata.get("server").map(String::as_str), Some(name));
    assert!(
        status.message().contains("circuit breaker is open"),
        "{}",
        status.message()
    );
    let delay = status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("RetryInfo with a delay");
    assert!(
        !delay.is_zero() && delay <= at_most,
        "retry in {delay:?}, at most {at_most:?}"
    );
    delay
}

/// A metric's value, `None` when the series is not on the page.
async fn metric(port: u16, series: &str) -> Option<String> {
    sample(&scrape(port).await, series)
}

/// Calls `name` until the breaker lets one through (each refusal must be
/// SERVER_CIRCUIT_OPEN), at most 10 s; returns what that call answered.
async fn call_when_probing(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    name: &str,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    let started = Instant::now();
    loop {
        match invoke(client, TOKEN, name, r#"{"text":"hi"}"#).await {
            Err(status) if reason(&status) == "SERVER_CIRCUIT_OPEN" => {
                assert!(started.elapsed() < Duration::from_secs(10), "never probed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test]
async fn a_server_answering_5xx_is_failed_fast_and_probed_back() {
    let gate = Arc::new(Gate::default());
    let flaky_server = TestServer::new(&["echo", "slow"]);
    let flaky = serve_mcp_gated(flaky_server.clone(), gate.clone()).await;
    let steady = serve_mcp(TestServer::new(&["echo"])).await;
    let metrics_port = free_port();
    let yaml = format!(
        "metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: flaky\n        url: \"{}\"\n        circuit_breaker: {{ failures: 3, cool_down: \"600ms\", max_cool_down: \"1200ms\" }}\n      - name: steady\n        url: \"{}\"\n",
        flaky.url, steady.url
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "flaky__echo").await;
    wait_listed(&mut client, TOKEN, "steady__echo").await;
    assert_eq!(
        circuit(&list(&mut client, TOKEN).await, "flaky"),
        pb::CircuitState::Closed
    );

    // Three 503s in a row: each reaches the server and fails as itself.
    gate.set_broken(true);
    for n in 1..=3 {
        let status = invoke(&mut client, TOKEN, "flaky__echo", r#"{"text":"hi"}"#)
            .await
            .unwrap_err();
        assert_eq!(
            reason(&status),
            "UPSTREAM_HTTP_ERROR",
            "call {n}: {status:?}"
        );
        assert_eq!(gate.calls(), n);
    }
    // The fourth fails at once, and nothing reaches the server.
    let started = Instant::now();
    let status = invoke(&mut client, TOKEN, "flaky__echo", r#"{"text":"hi"}"#)
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_circuit_open(&status, "flaky", Duration::from_millis(600));
    assert_eq!(gate.calls(), 3, "an open breaker sends nothing");

    // The tenant's other server is not concerned.
    let answer = invoke(
        &mut client,
        TOKEN,
        "steady__echo",
        r#"{"text":"still here"}"#,
    )
    .await
    .unwrap();
    assert_eq!(answer.text, "still here");
    let listing = list(&mut client, TOKEN).await;
    assert_eq!(circuit(&listing, "flaky"), pb::CircuitState::Open);
    assert!(server(&listing, "flaky").circuit_retry_after_ms <= 600);
    assert!(server(&listing, "flaky").connected, "the session is kept");
    assert_eq!(circuit(&listing, "steady"), pb::CircuitState::Closed);
    let open = r#"toolgate_circuit_open{tenant="acme",server="flaky"}"#;
    let opened = r#"toolgate_circuit_opened_total{tenant="acme",server="flaky"}"#;
    assert_eq!(metric(metrics_port, open).await.as_deref(), Some("1"));
    assert_eq!(metric(metrics_port, opened).await.as_deref(), Some("1"));
    assert_eq!(
        metric(
            metrics_port,
            r#"toolgate_circuit_open{tenant="acme",server="steady"}"#
        )
        .await,
        None
    );

    // After the cool-down one probe goes through; still broken, it opens
    // the breaker again with the cool-down doubled.
    let probe = call_when_probing(&mut client, "flaky__echo")
        .await
        .unwrap_err();
    assert_eq!(reason(&probe), "UPSTREAM_HTTP_ERROR", "{probe:?}");
    assert_eq!(gate.calls(), 4, "exactly one probe");
    let status = invoke(&mut client, TOKEN, "flaky__echo", "{}")
        .await
        .unwrap_err();
    let delay = assert_circuit_open(&status, "flaky", Duration::from_millis(1200));
    assert!(delay > Duration::from_millis(700), "doubled: {delay:?}");
    assert_eq!(metric(metrics_port, opened).await.as_deref(), Some("2"));
    assert_eq!(metric(metrics_port, open).await.as_deref(), Some("1"));

    // The server recovers. The next probe hangs: while it runs the breaker
    // is half-open and every other call still fails fast.
    gate.set_broken(false);
    let started = Instant::now();
    while server(&list(&mut client, TOKEN).await, "flaky").circuit_retry_after_ms > 0 {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut prober = gateway.client().await;
    let probe = tokio::spawn(async move {
        let mut request = authed(
            TOKEN,
            pb::InvokeToolRequest {
                name: "flaky__slow".to_owned(),
                arguments_json: "{}".to_owned(),
                ..Default::default()
            },
        );
        request.set_timeout(Duration::from_millis(1500));
        prober.invoke_tool(request).await
    });
    tokio::time::timeout(
        Duration::from_secs(10),
        flaky_server.log.slow_started.notified(),
    )
    .await
    .expect("the probe reaches the server");
    let calls = gate.calls();
    let status = invoke(&mut client, TOKEN, "flaky__echo", "{}")
        .await
        .unwrap_err();
    assert_circuit_open(&status, "flaky", Duration::from_secs(1));
    assert_eq!(gate.calls(), calls, "one probe at a time");
    assert_eq!(
        circuit(&list(&mut client, TOKEN).await, "flaky"),
        pb::CircuitState::HalfOpen
    );
    // The probe ends with the caller's own deadline: nothing learned, and
    // the next call is the probe, which closes the breaker.
    let ended = probe.await.unwrap().unwrap_err();
    assert_eq!(ended.code(), Code::DeadlineExceeded, "{ended:?}");
    let answer = invoke(&mut client, TOKEN, "flaky__echo", r#"{"text":"back"}"#)
        .await
        .unwrap();
    assert_eq!(answer.text, "back");
    assert_eq!(
        circuit(&list(&mut client, TOKEN).await, "flaky"),
        pb::CircuitState::Closed
    );
    assert_eq!(metric(metrics_port, open).await.as_deref(), Some("0"));
    for (result, count) in [("reopened", "1"), ("released", "1"), ("closed", "1")] {
        let series = format!(
            r#"toolgate_circuit_probes_total{{tenant="acme",server="flaky",result="{result}"}}"#
        );
        assert_eq!(
            metric(metrics_port, &series).await.as_deref(),
            Some(count),
            "{series}"
        );
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn tool_errors_and_json_rpc_errors_never_open_a_breaker() {
    let gate = Arc::new(Gate::default());
    let flaky = serve_mcp_gated(TestServer::new(&["echo", "fail", "internal"]), gate.clone()).await;
    let yaml = format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: flaky\n        url: \"{}\"\n        circuit_breaker: {{ failures: 2, cool_down: \"1h\" }}\n",
        flaky.url
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "flaky__echo").await;

    // One breaking failure, then answers of every failing kind: a tool's
    // `isError` result and a JSON-RPC error are the server answering.
    gate.set_broken(true);
    let status = invoke(&mut client, TOKEN, "flaky__echo", "{}")
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "UPSTREAM_HTTP_ERROR");
    gate.set_broken(false);
    for _ in 0..5 {
        let answer = invoke(&mut client, TOKEN, "flaky__fail", "{}")
            .await
            .unwrap();
        assert!(answer.is_error, "{answer:?}");
    }
    let status = invoke(&mut client, TOKEN, "flaky__internal", "{}")
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "UPSTREAM_INTERNAL_ERROR");
    assert_eq!(
        circuit(&list(&mut client, TOKEN).await, "flaky"),
        pb::CircuitState::Closed
    );

    // The answers ended the run: it takes two breaking failures again.
    gate.set_broken(true);
    for _ in 0..2 {
        let status = invoke(&mut client, TOKEN, "flaky__echo", "{}")
            .await
            .unwrap_err();
        assert_eq!(reason(&status), "UPSTREAM_HTTP_ERROR", "{status:?}");
    }
    assert_eq!(gate.calls(), 9);
    let status = invoke(&mut client, TOKEN, "flaky__echo", "{}")
        .await
        .unwrap_err();
    assert_circuit_open(&status, "flaky", Duration::from_secs(3600));
    assert_eq!(gate.calls(), 9);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_frozen_stdio_server_opens_its_breaker_and_its_reconnect_closes_it() {
    let steady = serve_mcp(TestServer::new(&["echo"])).await;
    let yaml = format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: proc\n        command: [\"{}\", \"{}\"]\n        call_timeout: \"500ms\"\n        reconnect: {{ initial_backoff: \"100ms\", max_backoff: \"200ms\" }}\n        circuit_breaker: {{ failures: 2, cool_down: \"1h\" }}\n      - name: steady\n        url: \"{}\"\n",
        python().display(),
        fixture("python/process_server.py").display(),
        steady.url
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "proc__pid").await;
    wait_listed(&mut client, TOKEN, "steady__echo").await;
    let pid: u32 = invoke(&mut client, TOKEN, "proc__pid", "{}")
        .await
        .unwrap()
        .text
        .parse()
        .unwrap();

    // Frozen, the server lets its calls run into its own timeout: two in a
    // row open the breaker. (No caller deadline: the timeout is the
    // server's `call_timeout`.)
    signal(pid, "STOP");
    for _ in 0..2 {
        let status = invoke(&mut client, TOKEN, "proc__echo", r#"{"text":"x"}"#)
            .await
            .unwrap_err();
        assert_eq!(reason(&status), "UPSTREAM_TIMEOUT", "{status:?}");
    }
    let status = invoke(&mut client, TOKEN, "proc__echo", r#"{"text":"x"}"#)
        .await
        .unwrap_err();
    assert_circuit_open(&status, "proc", Duration::from_secs(3600));
    assert_eq!(
        invoke(&mut client, TOKEN, "steady__echo", r#"{"text":"ok"}"#)
            .await
            .unwrap()
            .text,
        "ok"
    );
    assert_eq!(
        circuit(&list(&mut client, TOKEN).await, "proc"),
        pb::CircuitState::Open
    );

    // Killed, the server is restarted by its supervisor: the new session
    // closes the breaker long before its hour of cool-down.
    signal(pid, "KILL");
    let started = Instant::now();
    let answer = loop {
        match invoke(&mut client, TOKEN, "proc__pid", "{}").await {
            Ok(answer) => break answer,
            Err(status) => {
                let why = reason(&status);
                assert!(
                    why == "SERVER_CIRCUIT_OPEN" || why == "UPSTREAM_UNAVAILABLE",
                    "{status:?}"
                );
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "never closed: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_ne!(answer.text, pid.to_string(), "a new process answers");
    assert_eq!(
        circuit(&list(&mut client, TOKEN).await, "proc"),
        pb::CircuitState::Closed
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_breaker_switched_off_never_opens() {
    let gate = Arc::new(Gate::default());
    let flaky = serve_mcp_gated(TestServer::new(&["echo"]), gate.clone()).await;
    let yaml = format!(
        "defaults:\n  circuit_breaker: {{ failures: 1 }}\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: flaky\n        url: \"{}\"\n        circuit_breaker: {{ enabled: false }}\n",
        flaky.url
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "flaky__echo").await;
    gate.set_broken(true);
    for n in 1..=4 {
        let status = invoke(&mut client, TOKEN, "flaky__echo", "{}")
            .await
            .unwrap_err();
        assert_eq!(reason(&status), "UPSTREAM_HTTP_ERROR", "{status:?}");
        assert_eq!(gate.calls(), n);
    }
    assert_eq!(
        circuit(&list(&mut client, TOKEN).await, "flaky"),
        pb::CircuitState::Disabled
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_per_user_servers_subjects_have_breakers_of_their_own() {
    use crate::oauth::{
        Scratch, authorization_url, call, call_settled, config, consent_confirmed, env, listing,
        upstream_with,
    };
    let upstream = upstream_with(3600, &[], &["--prompts"]);
    let Scratch {
        dir: _dir,
        state_url,
        ..
    } = Scratch::new();
    let consent_port = free_port();
    let metrics_port = free_port();
    let per_user = "        oauth: { grant: authorization_code }\n";
    let base = config(&upstream, &state_url, consent_port);
    assert!(base.contains(per_user), "{base}");
    let yaml = format!(
        "metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\n{}",
        base.replacen(
            per_user,
            &format!(
                "{per_user}        call_timeout: \"2s\"\n        circuit_breaker: {{ failures: 2, cool_down: \"1h\" }}\n"
            ),
            1
        )
    );
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;
    for user in ["alice", "bob"] {
        let status = call_settled(&mut client, Some(user), "docs__whoami")
            .await
            .unwrap_err();
        let url = authorization_url(&status);
        consent_confirmed(&mut client, &url, user, consent_port).await;
        let answer = call_settled(&mut client, Some(user), "docs__whoami")
            .await
            .unwrap();
        assert!(answer.contains(user), "{answer}");
    }

    // Frozen, the server lets Alice's calls run into its timeout: her
    // breaker opens, for every kind of call she makes to it.
    let pid = upstream.mcp_pid();
    signal(pid, "STOP");
    for _ in 0..2 {
        let status = call(&mut client, Some("alice"), "docs__whoami")
            .await
            .unwrap_err();
        assert_eq!(reason(&status), "UPSTREAM_TIMEOUT", "{status:?}");
    }
    let status = call(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    assert_circuit_open(&status, "docs", Duration::from_secs(3600));
    assert!(
        status.message().contains("for this subject"),
        "{}",
        status.message()
    );
    let mut prompt = authed(
        "acme-token",
        pb::GetPromptRequest {
            name: "docs__whoami".to_owned(),
            ..Default::default()
        },
    );
    prompt
        .metadata_mut()
        .insert("x-toolgate-subject", "alice".parse().unwrap());
    let status = client.get_prompt(prompt).await.unwrap_err();
    assert_circuit_open(&status, "docs", Duration::from_secs(3600));

    // Bob's calls still go to the server (and time out there).
    let status = call(&mut client, Some("bob"), "docs__whoami")
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "UPSTREAM_TIMEOUT", "{status:?}");
    assert_eq!(
        circuit(&listing(&mut client, "alice").await, "docs"),
        pb::CircuitState::Open
    );
    let bobs = listing(&mut client, "bob").await;
    assert_eq!(circuit(&bobs, "docs"), pb::CircuitState::Closed);
    assert_eq!(circuit(&bobs, "svc"), pb::CircuitState::Closed);
    assert_eq!(
        metric(
            metrics_port,
            r#"toolgate_circuit_open{tenant="acme",server="docs"}"#
        )
        .await
        .as_deref(),
        Some("1"),
        "one subject's breaker is open"
    );

    // Thawed, the server answers Bob; Alice's breaker stays open until its
    // cool-down ends (no session of hers was lost or made).
    signal(pid, "CONT");
    // The thawed server first works through the calls that timed out while
    // it was stopped; on a loaded machine that takes a moment, and Bob's
    // breaker (two failures) must not open on its backlog.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answer = call(&mut client, Some("bob"), "docs__whoami")
        .await
        .unwrap();
    assert!(answer.contains("bob"), "{answer}");
    let status = call(&mut client, Some("alice"), "docs__whoami")
        .await
        .unwrap_err();
    assert_circuit_open(&status, "docs", Duration::from_secs(3600));
    gateway.shutdown().await;
}
