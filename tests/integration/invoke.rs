//! InvokeTool: routing, arguments, results, error mapping, deadlines and
//! cancellation, header injection.

use std::time::Duration;

use toolgate::pb;

use crate::common::*;

const TOKEN: &str = "acme-token";

async fn gateway_for(server: &McpServer, extra: &str) -> TestGateway {
    TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: t\n        url: \"{}\"\n{extra}",
            server.url
        ),
        &[],
    )
    .await
}

#[tokio::test]
async fn results_errors_and_content_are_carried() {
    let server = serve_mcp(TestServer::new(&["echo", "fail", "image"])).await;
    let gateway = gateway_for(&server, "").await;
    let mut client = gateway.client().await;

    let ok = invoke(
        &mut client,
        TOKEN,
        "t__echo",
        r#"{"text":"big 12345678901234567890"}"#,
    )
    .await
    .unwrap();
    assert!(!ok.is_error);
    assert_eq!(ok.text, "big 12345678901234567890");

    // isError is a successful RPC whose result says so.
    let failed = invoke(&mut client, TOKEN, "t__fail", "").await.unwrap();
    assert!(failed.is_error);
    assert_eq!(failed.text, "it failed on purpose");

    let image = invoke(&mut client, TOKEN, "t__image", "{}").await.unwrap();
    assert_eq!(image.text, "a pixel\n[1 non-text content block(s) omitted]");
    let Some(pb::content::Kind::Image(png)) = &image.content[1].kind else {
        panic!("expected an image block: {:?}", image.content);
    };
    assert_eq!(png.mime_type, "image/png");
    assert_eq!(
        &png.data[..8],
        b"\x89PNG\r\n\x1a\n",
        "raw bytes, not base64"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_precise_statuses() {
    let server = serve_mcp(TestServer::new(&["echo", "bad_params", "internal"])).await;
    let gateway = gateway_for(&server, "").await;
    let mut client = gateway.client().await;

    let err = invoke(&mut client, TOKEN, "t__nope", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("t__nope"));

    for (args, what) in [
        ("[1,2]", "an array"),
        ("\"s\"", "a string"),
        ("{oops", "not valid JSON"),
        ("null", "null"),
    ] {
        let err = invoke(&mut client, TOKEN, "t__echo", args)
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{args}");
        assert!(err.message().contains(what), "{args}: {}", err.message());
        assert_eq!(reason(&err), "INVALID_ARGUMENTS");
    }

    // Upstream JSON-RPC errors are mapped by meaning.
    let err = invoke(&mut client, TOKEN, "t__bad_params", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(reason(&err), "UPSTREAM_INVALID_PARAMS");
    assert!(err.message().contains("missing field"), "{}", err.message());

    let err = invoke(&mut client, TOKEN, "t__internal", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal);
    assert_eq!(reason(&err), "UPSTREAM_INTERNAL_ERROR");
    assert!(
        !err.message().contains("hunter2"),
        "upstream text is not passed through: {}",
        err.message()
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_caller_deadline_bounds_the_call_and_cancels_upstream() {
    let server = serve_mcp(TestServer::new(&["slow"])).await;
    let gateway = gateway_for(&server, "").await;
    let mut client = gateway.client().await;
    let mut request = authed(
        TOKEN,
        pb::InvokeToolRequest {
            name: "t__slow".into(),
            arguments_json: "{}".into(),
            ..Default::default()
        },
    );
    // 5 s: the gateway answers 250 ms before it (its largest margin), head
    // room enough on a loaded machine for its DEADLINE_EXCEEDED to beat
    // the transport's own cut-off (the slow tool runs 60 s).
    request.set_timeout(Duration::from_secs(5));
    let started = std::time::Instant::now();
    let err = client.invoke_tool(request).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(6), "{err:?}");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert_eq!(reason(&err), "DEADLINE_EXCEEDED");
    // The server is told on the wire.
    tokio::time::timeout(
        Duration::from_secs(10),
        server.log.cancel_arrived.notified(),
    )
    .await
    .expect("notifications/cancelled reaches the server");
    assert_eq!(server.log.cancelled.lock().unwrap().len(), 1);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_caller_that_goes_away_cancels_upstream() {
    let server = serve_mcp(TestServer::new(&["slow"])).await;
    let gateway = gateway_for(&server, "").await;
    let mut client = gateway.client().await;
    let call = tokio::spawn(async move { invoke(&mut client, TOKEN, "t__slow", "{}").await });
    tokio::time::timeout(Duration::from_secs(10), server.log.slow_started.notified())
        .await
        .expect("the slow call starts");
    call.abort(); // drops the client's request: the HTTP/2 stream is reset
    tokio::time::timeout(
        Duration::from_secs(10),
        server.log.cancel_arrived.notified(),
    )
    .await
    .expect("notifications/cancelled reaches the server");
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_configured_call_timeout_applies_without_a_caller_deadline() {
    let server = serve_mcp(TestServer::new(&["slow"])).await;
    let gateway = gateway_for(&server, "        call_timeout: \"300ms\"\n").await;
    let mut client = gateway.client().await;
    let err = invoke(&mut client, TOKEN, "t__slow", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(reason(&err), "UPSTREAM_TIMEOUT");
    tokio::time::timeout(
        Duration::from_secs(10),
        server.log.cancel_arrived.notified(),
    )
    .await
    .expect("notifications/cancelled reaches the server");
    gateway.shutdown().await;
}

#[tokio::test]
async fn headers_are_injected_and_the_caller_token_is_not_forwarded() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: t\n        url: \"{}\"\n        headers:\n          Authorization: {{ env: UPSTREAM_AUTH }}\n          X-Team: platform\n",
            server.url
        ),
        &[("UPSTREAM_AUTH", "Bearer upstream-secret")],
    )
    .await;
    let mut client = gateway.client().await;
    invoke(&mut client, TOKEN, "t__echo", r#"{"text":"x"}"#)
        .await
        .unwrap();
    let headers = server.log.headers.lock().unwrap().clone();
    assert!(
        headers.len() >= 3,
        "initialize, list, call: {}",
        headers.len()
    );
    for request in &headers {
        assert_eq!(
            request.get("authorization").map(String::as_str),
            Some("Bearer upstream-secret")
        );
        assert_eq!(request.get("x-team").map(String::as_str), Some("platform"));
        assert!(
            request.values().all(|v| !v.contains(TOKEN)),
            "the caller's token never goes upstream"
        );
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_server_that_dies_answers_unavailable_with_retry_info() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = gateway_for(&server, "").await;
    let mut client = gateway.client().await;
    invoke(&mut client, TOKEN, "t__echo", "{}").await.unwrap();
    drop(server); // the HTTP server goes away
    // The call that finds out: refused at connect, nothing was sent
    // (UNAVAILABLE, with RetryInfo); or lost on a connection that was
    // open, in doubt (UNKNOWN, without).
    let err = invoke(&mut client, TOKEN, "t__echo", "{}")
        .await
        .unwrap_err();
    use tonic_types::StatusExt;
    match err.code() {
        tonic::Code::Unavailable => assert!(err.get_details_retry_info().is_some(), "{err:?}"),
        tonic::Code::Unknown => {
            assert_eq!(reason(&err), "UPSTREAM_CONNECTION_LOST");
            assert!(err.get_details_retry_info().is_none(), "{err:?}");
        }
        other => panic!("unexpected {other:?}: {err:?}"),
    }
    // From then on the server is down: its tools answer UNAVAILABLE with
    // RetryInfo (nothing is sent), not NOT_FOUND.
    let started = std::time::Instant::now();
    loop {
        let err = invoke(&mut client, TOKEN, "t__echo", "{}")
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        if reason(&err) == "UPSTREAM_UNAVAILABLE" {
            assert!(
                err.get_details_retry_info().is_some(),
                "UNAVAILABLE carries RetryInfo"
            );
            assert!(
                err.message().contains("server `t` is not connected"),
                "{}",
                err.message()
            );
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{err:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn without_trace_export_the_callers_traceparent_goes_upstream_unchanged() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = gateway_for(&server, "").await;
    let mut client = gateway.client().await;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut request = authed(
        TOKEN,
        pb::InvokeToolRequest {
            name: "t__echo".into(),
            arguments_json: "{}".into(),
            ..Default::default()
        },
    );
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    client.invoke_tool(request).await.unwrap();
    let seen = server.log.call_traceparents.lock().unwrap().clone();
    assert_eq!(seen, [Some(traceparent.to_string())]);
    gateway.shutdown().await;
}
