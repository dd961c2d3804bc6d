//! Limits per subject (`tenants[].limits.per_subject`): two subjects of
//! one tenant, named by the tenant's static token with
//! `x-toolgate-subject`. The one that loops is shed with its own reason
//! and RetryInfo while the other keeps its rate, and the looping one's
//! shed calls take nothing from the tenant's own limit; concurrency is
//! counted per subject too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "acme-token";

/// One tenant, `acme`, with `limits` (YAML flow mapping), and server `t`.
fn yaml(limits: &str, url: &str) -> String {
    format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    limits: {limits}\n    servers:\n      - name: t\n        url: \"{url}\"\n"
    )
}

/// `message` as `subject` of the tenant's static token.
fn as_subject<T>(subject: &str, message: T) -> tonic::Request<T> {
    authed_as(TOKEN, subject, message)
}

/// Invokes `tool` as `subject`.
async fn invoke_as(
    client: &mut ToolGatewayClient<Channel>,
    subject: &str,
    tool: &str,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    client
        .invoke_tool(as_subject(
            subject,
            pb::InvokeToolRequest {
                name: tool.to_owned(),
                arguments_json: "{}".to_owned(),
                ..Default::default()
            },
        ))
        .await
        .map(tonic::Response::into_inner)
}

/// The `ErrorInfo` metadata `key` of a status.
fn info(status: &tonic::Status, key: &str) -> Option<String> {
    status
        .get_details_error_info()
        .and_then(|info| info.metadata.get(key).cloned())
}

#[tokio::test]
async fn a_looping_subject_is_shed_while_another_of_its_tenant_keeps_its_rate() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    // Each subject 5 calls a second; the tenant 10. The looping subject's
    // shed calls must not take the tenant's tokens, or the other subject's
    // 4 a second would be shed by the tenant's limit.
    let gateway = TestGateway::start(
        &yaml(
            "{ rate_per_second: 10, burst: 10, per_subject: { rate_per_second: 5, burst: 5 } }",
            &server.url,
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    // The tenant itself (no subject) is one more subject: its call waits
    // for the server to connect.
    invoke(&mut client, TOKEN, "t__echo", "{}")
        .await
        .expect("the first call");

    let stop = Arc::new(AtomicBool::new(false));
    let looping = {
        let (mut client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut admitted, mut shed) = (0_u32, Vec::new());
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match invoke_as(&mut client, "looping-agent", "t__echo").await {
                    Ok(_) => admitted += 1,
                    Err(status) => shed.push(status),
                }
            }
            (admitted, shed)
        })
    };
    let started = Instant::now();
    let mut steady = tokio::time::interval(Duration::from_millis(250));
    for call in 0..8 {
        steady.tick().await;
        invoke_as(&mut client, "steady-agent", "t__echo")
            .await
            .unwrap_or_else(|status| panic!("steady call {call} was shed: {status:?}"));
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let (admitted, shed) = looping.await.unwrap();

    assert!(!shed.is_empty(), "the looping subject was never shed");
    for status in &shed {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert_eq!(reason(status), "SUBJECT_RATE_LIMITED", "{status:?}");
    }
    // Its burst and 5 a second, give or take the last call in flight.
    let most = 5 + 5 * u32::try_from(elapsed.as_millis() / 1000 + 1).unwrap() + 1;
    assert!(
        admitted <= most,
        "{admitted} calls admitted in {elapsed:?}, at most {most}"
    );
    let status = &shed[0];
    assert!(
        status
            .message()
            .contains("limits.per_subject.rate_per_second"),
        "{}",
        status.message()
    );
    assert_eq!(
        info(status, "limit").as_deref(),
        Some("limits.per_subject.rate_per_second")
    );
    let retry = status
        .get_details_retry_info()
        .expect("RetryInfo says when");
    assert!(
        retry.retry_delay.unwrap() <= Duration::from_secs(1),
        "{retry:?}"
    );

    // A catalog RPC takes a token of the subject's too.
    let mut drained = None;
    for _ in 0..20 {
        let listing = client
            .list_tools(as_subject("looping-agent", pb::ListToolsRequest::default()))
            .await;
        if let Err(status) = listing {
            drained = Some(status);
            break;
        }
    }
    let status = drained.expect("ListTools past the subject's burst was shed");
    assert_eq!(reason(&status), "SUBJECT_RATE_LIMITED", "{status:?}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn concurrency_is_limited_per_subject() {
    let server = serve_mcp(TestServer::new(&["slow", "echo"])).await;
    let gateway = TestGateway::start(
        &yaml(
            "{ max_concurrent_calls: 4, queue_timeout: 50ms, per_subject: { max_concurrent_calls: 1 } }",
            &server.url,
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let slow = {
        let mut client = client.clone();
        tokio::spawn(async move { invoke_as(&mut client, "busy-agent", "t__slow").await })
    };
    tokio::time::timeout(Duration::from_secs(10), server.log.slow_started.notified())
        .await
        .unwrap();

    let started = Instant::now();
    let status = invoke_as(&mut client, "busy-agent", "t__echo")
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "shed, not queued"
    );
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "SUBJECT_CONCURRENCY_LIMIT", "{status:?}");
    assert!(
        status
            .message()
            .contains("limits.per_subject.max_concurrent_calls"),
        "{}",
        status.message()
    );
    assert_eq!(
        info(&status, "limit").as_deref(),
        Some("limits.per_subject.max_concurrent_calls")
    );
    assert_eq!(info(&status, "limit_value").as_deref(), Some("1"));
    assert!(status.get_details_retry_info().is_some(), "may be retried");

    // Another subject of the tenant, and the tenant itself, still run.
    invoke_as(&mut client, "other-agent", "t__echo")
        .await
        .expect("another subject's call");
    invoke(&mut client, TOKEN, "t__echo", "{}")
        .await
        .expect("the tenant's own call");

    // The slot comes back with the call.
    slow.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match invoke_as(&mut client, "busy-agent", "t__echo").await {
            Ok(_) => break,
            Err(status) if reason(&status) == "SUBJECT_CONCURRENCY_LIMIT" => {
                assert!(Instant::now() < deadline, "the slot never came back");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    gateway.shutdown().await;
}
