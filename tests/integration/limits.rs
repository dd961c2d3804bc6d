//! Limits and overload: load shedding, size limits, shape limits,
//! per-tool timeouts, and HTTP sessions lost to a server restart.

use std::time::{Duration, Instant};

use crate::common::*;

const TOKEN: &str = "acme-token";

fn yaml(tenant_extra: &str, server_extra: &str, top: &str, url: &str) -> String {
    format!(
        "{top}tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n{tenant_extra}    servers:\n      - name: t\n        url: \"{url}\"\n{server_extra}"
    )
}

#[tokio::test]
async fn concurrency_limits_shed_at_once_with_resource_exhausted() {
    let server = serve_mcp(TestServer::new(&["slow", "echo"])).await;
    for (tenant_extra, server_extra, expected) in [
        (
            "    limits:\n      max_concurrent_calls: 1\n      queue_timeout: \"50ms\"\n",
            "",
            "TENANT_CONCURRENCY_LIMIT",
        ),
        (
            "    limits:\n      queue_timeout: \"50ms\"\n",
            "        max_concurrent_calls: 1\n",
            "SERVER_CONCURRENCY_LIMIT",
        ),
    ] {
        let gateway =
            TestGateway::start(&yaml(tenant_extra, server_extra, "", &server.url), &[]).await;
        let mut client = gateway.client().await;
        let mut slow_client = client.clone();
        let slow =
            tokio::spawn(async move { invoke(&mut slow_client, TOKEN, "t__slow", "{}").await });
        tokio::time::timeout(Duration::from_secs(10), server.log.slow_started.notified())
            .await
            .unwrap();
        let started = Instant::now();
        let err = invoke(&mut client, TOKEN, "t__echo", "{}")
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
        assert_eq!(reason(&err), expected);
        assert!(
            err.message().contains("max_concurrent_calls"),
            "{}",
            err.message()
        );
        use tonic_types::StatusExt;
        assert!(
            err.get_details_retry_info().is_some(),
            "a shed call may be retried"
        );
        assert_eq!(
            err.get_details_error_info()
                .unwrap()
                .metadata
                .get("limit_value")
                .map(String::as_str),
            Some("1")
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "shed, not queued"
        );
        slow.abort();
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn the_rate_limit_sheds_beyond_the_burst() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = TestGateway::start(
        &yaml(
            "    limits:\n      rate_per_second: 1\n      burst: 3\n",
            "",
            "",
            &server.url,
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        outcomes.push(
            invoke(&mut client, TOKEN, "t__echo", "{}")
                .await
                .map_err(|e| reason(&e)),
        );
    }
    let limited = outcomes
        .iter()
        .filter(|o| matches!(o, Err(r) if r == "RATE_LIMITED"))
        .count();
    assert!(limited >= 2, "{outcomes:?}");
    assert!(outcomes[0].is_ok());
    let err = invoke(&mut client, TOKEN, "t__echo", "{}")
        .await
        .unwrap_err();
    use tonic_types::StatusExt;
    let retry = err.get_details_retry_info().expect("RetryInfo says when");
    assert!(
        retry.retry_delay.unwrap() <= Duration::from_secs(1),
        "{retry:?}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn size_limits_name_the_limit_and_the_gateway_stays_up() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = TestGateway::start(
        &yaml(
            "",
            "",
            "limits:\n  max_argument_bytes: 1000\n  max_message_bytes: 100000\n",
            &server.url,
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(2000));
    let err = invoke(&mut client, TOKEN, "t__echo", &big)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&err), "ARGUMENTS_TOO_LARGE");
    assert!(
        err.message().contains("limits.max_argument_bytes"),
        "{}",
        err.message()
    );
    // A gRPC message over the limit is refused by the transport.
    let huge = format!(r#"{{"text":"{}"}}"#, "x".repeat(200_000));
    let err = invoke(&mut client, TOKEN, "t__echo", &huge)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("limits.max_message_bytes"),
        "{}",
        err.message()
    );
    // Still serving.
    assert_eq!(
        invoke(&mut client, TOKEN, "t__echo", r#"{"text":"ok"}"#)
            .await
            .unwrap()
            .text,
        "ok"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn results_over_the_limit_are_refused_for_http_servers() {
    // A server answering with a JSON body: over the cap, RESOURCE_EXHAUSTED.
    // (Over an SSE stream the cap ends the stream, and with it the session:
    // UNAVAILABLE, then a reconnect.)
    let server = serve_mcp_json(TestServer::new(&["echo"])).await;
    let gateway = TestGateway::start(
        &yaml("", "", "limits:\n  max_result_bytes: 2000\n", &server.url),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let big = format!(r#"{{"text":"{}"}}"#, "y".repeat(5000));
    let err = invoke(&mut client, TOKEN, "t__echo", &big)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_eq!(reason(&err), "RESULT_TOO_LARGE");
    gateway.shutdown().await;
}

#[tokio::test]
async fn shape_limits_refuse_a_server_naming_tool_and_limit() {
    let mut long = tool("verbose");
    long.description = Some("d".repeat(500).into());
    let mut deep_schema = serde_json::json!({"type": "object"});
    for _ in 0..10 {
        deep_schema = serde_json::json!({"type": "object", "properties": {"x": deep_schema}});
    }
    let deep = rmcp::model::Tool::new(
        "deep",
        "A deep tool.",
        std::sync::Arc::new(deep_schema.as_object().unwrap().clone()),
    );
    let verbose = serve_mcp(TestServer::new(&[]).with_tools(vec![long])).await;
    let nested = serve_mcp(TestServer::new(&[]).with_tools(vec![deep])).await;
    let many = serve_mcp(TestServer::new(&["a", "b", "c", "d"])).await;
    let gateway = TestGateway::start(
        &format!(
            "limits:\n  max_description_chars: 100\n  max_schema_depth: 8\n  max_tools_per_server: 3\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: verbose\n        url: \"{}\"\n      - name: nested\n        url: \"{}\"\n      - name: many\n        url: \"{}\"\n",
            verbose.url, nested.url, many.url
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    assert!(listing.tools.is_empty());
    let errors: Vec<&str> = listing.servers.iter().map(|s| s.error.as_str()).collect();
    assert!(
        errors[0].contains("`verbose`") && errors[0].contains("limits.max_description_chars"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("`deep`") && errors[1].contains("limits.max_schema_depth"),
        "{}",
        errors[1]
    );
    assert!(
        errors[2].contains("limits.max_tools_per_server"),
        "{}",
        errors[2]
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_per_tool_timeout_overrides_the_server_default() {
    let server = serve_mcp(TestServer::new(&["slow"])).await;
    let gateway = TestGateway::start(
        &yaml(
            "",
            "        call_timeout: \"60s\"\n        tool_timeouts:\n          slow: \"300ms\"\n",
            "",
            &server.url,
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let started = Instant::now();
    let err = invoke(&mut client, TOKEN, "t__slow", "{}")
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "UPSTREAM_TIMEOUT");
    assert!(started.elapsed() < Duration::from_secs(10));
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_http_server_restart_is_recovered() {
    // The Python SDK's Streamable HTTP server: after a restart it no longer
    // knows the session.
    let port = free_port();
    let spawn = || {
        ChildGuard(
            std::process::Command::new(python())
                .arg(fixture("python/env_server.py"))
                .args(["--http", &port.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let first = spawn();
    wait_for_port(port).await;
    let gateway = TestGateway::start(
        &yaml(
            "",
            "        reconnect:\n          initial_backoff: \"100ms\"\n          max_backoff: \"500ms\"\n",
            "",
            &format!("http://127.0.0.1:{port}/mcp"),
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    // The first connect may be slow under load: wait for the tool.
    wait_listed(&mut client, TOKEN, "t__echo").await;
    assert_eq!(
        invoke(&mut client, TOKEN, "t__echo", r#"{"text":"before"}"#)
            .await
            .unwrap()
            .text,
        "before"
    );
    drop(first);
    let _second = spawn();
    wait_for_port(port).await;
    // Bounded: within a few attempts the gateway has a session again. A
    // failed attempt is an error, never a hang or a wrong answer.
    let started = Instant::now();
    loop {
        match invoke(&mut client, TOKEN, "t__echo", r#"{"text":"after"}"#).await {
            Ok(answer) => {
                assert_eq!(answer.text, "after");
                break;
            }
            // Refused or forgotten (nothing ran): UNAVAILABLE; lost on a
            // connection the old process held open: UNKNOWN.
            Err(status) => assert!(
                status.code() == tonic::Code::Unavailable
                    || (status.code() == tonic::Code::Unknown
                        && reason(&status) == "UPSTREAM_CONNECTION_LOST"),
                "{status:?}"
            ),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never recovered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listing = list(&mut client, TOKEN).await;
    assert!(listing.servers[0].connected);
    gateway.shutdown().await;
}
