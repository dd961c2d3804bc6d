//! Operating toolgate: health, reflection, metrics, traces, logs and the
//! staged shutdown, each checked with the real tool.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "acme-token";

fn yaml(extra: &str, url: &str) -> String {
    format!(
        "{extra}tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: t\n        url: \"{url}\"\n"
    )
}

#[tokio::test]
async fn health_and_reflection_answer_standard_clients() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = TestGateway::start(&yaml("", &server.url), &[]).await;
    let addr = gateway.addr.to_string();
    for service in ["", "toolgate.v1.ToolGateway", "model_context_protocol.Mcp"] {
        let (code, health) = ops_probe(&["health", "--addr", &addr, "--service", service]).await;
        assert_eq!(code, 0, "{health}");
        assert_eq!(health["status"], "SERVING", "service {service:?}");
    }
    // grpcio-reflection speaks v1alpha.
    let (code, listed) = ops_probe(&["reflect", "--addr", &addr]).await;
    assert_eq!(code, 0, "{listed}");
    let services: Vec<&str> = listed["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for expected in [
        "toolgate.v1.ToolGateway",
        "model_context_protocol.Mcp",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(&expected), "{services:?}");
    }
    // And v1, from tonic's reflection client.
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_request::MessageRequest,
        server_reflection_response::MessageResponse,
    };
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    for symbol in ["toolgate.v1.ToolGateway", "model_context_protocol.Mcp"] {
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(symbol.into())),
        };
        let mut replies = client
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        let reply = replies.message().await.unwrap().unwrap();
        assert!(
            matches!(reply.message_response, Some(MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()),
            "{symbol}: {reply:?}"
        );
    }
    gateway.shutdown().await;

    let gateway = TestGateway::start(&yaml("reflection: false\n", &server.url), &[]).await;
    let (code, off) = ops_probe(&["reflect", "--addr", &gateway.addr.to_string()]).await;
    assert_eq!(code, 3);
    assert_eq!(off["error"]["code"], "UNIMPLEMENTED");
    gateway.shutdown().await;
}

fn sample(
    families: &serde_json::Value,
    family: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    families[family]["samples"]
        .as_array()?
        .iter()
        .find_map(|s| {
            (s["name"] == name && labels.iter().all(|(k, v)| s["labels"][k] == *v))
                .then(|| s["value"].as_f64().unwrap())
        })
}

#[tokio::test]
async fn metrics_parse_with_prometheus_and_move_with_calls() {
    let server = serve_mcp(TestServer::new(&["echo", "fail"])).await;
    let port = free_port();
    let gateway = TestGateway::start(
        &yaml(
            &format!("metrics:\n  listen: \"127.0.0.1:{port}\"\n"),
            &server.url,
        ),
        &[],
    )
    .await;
    let url = format!("http://127.0.0.1:{port}/metrics");
    let mut client = gateway.client().await;
    invoke(&mut client, TOKEN, "t__echo", "{}").await.unwrap();
    let (code, before) = ops_probe(&["metrics", "--url", &url]).await;
    assert_eq!(code, 0, "{before}");
    let families = &before["families"];
    let ok = [
        ("tenant", "acme"),
        ("server", "t"),
        ("tool", "t__echo"),
        ("outcome", "ok"),
    ];
    assert_eq!(
        sample(families, "toolgate_calls", "toolgate_calls_total", &ok),
        Some(1.0),
        "{families}"
    );
    assert_eq!(
        sample(
            families,
            "toolgate_upstream_session_up",
            "toolgate_upstream_session_up",
            &[("tenant", "acme"), ("server", "t")]
        ),
        Some(1.0)
    );
    assert_eq!(
        families["toolgate_call_duration_seconds"]["type"],
        "histogram"
    );

    invoke(&mut client, TOKEN, "t__echo", "{}").await.unwrap();
    invoke(&mut client, TOKEN, "t__fail", "{}").await.unwrap();
    invoke(&mut client, TOKEN, "t__missing", "{}")
        .await
        .unwrap_err();
    let (_, after) = ops_probe(&["metrics", "--url", &url]).await;
    let families = &after["families"];
    assert_eq!(
        sample(families, "toolgate_calls", "toolgate_calls_total", &ok),
        Some(2.0)
    );
    assert_eq!(
        sample(
            families,
            "toolgate_calls",
            "toolgate_calls_total",
            &[("tool", "t__fail"), ("outcome", "tool_error")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            families,
            "toolgate_calls",
            "toolgate_calls_total",
            &[("tool", ""), ("outcome", "TOOL_NOT_FOUND")]
        ),
        Some(1.0),
        "unknown names are not label values"
    );
    assert_eq!(
        sample(
            families,
            "toolgate_call_duration_seconds",
            "toolgate_call_duration_seconds_count",
            &[("tenant", "acme"), ("server", "t")]
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            families,
            "toolgate_calls_in_flight",
            "toolgate_calls_in_flight",
            &[("tenant", "acme")]
        ),
        Some(0.0)
    );
    gateway.shutdown().await;
}

/// An OTLP trace receiver: a tonic server of the collector's TraceService.
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    pub(crate) spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    /// A receiver serving on a free loopback port, and that port.
    pub(crate) async fn serve() -> (Self, u16) {
        let receiver = Receiver::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(receiver.clone()))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        (receiver, port)
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn traces_continue_the_callers_trace_and_go_upstream() {
    let (receiver, otlp_port) = Receiver::serve().await;

    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config,
        yaml(
            &format!("listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"1ms\"\n"),
            &server.url,
        ),
    )
    .unwrap();
    let mut gateway = ChildGuard(
        Command::new(toolgate_bin())
            .args(["serve", "--config"])
            .arg(&config)
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{otlp_port}"),
            )
            .env("OTEL_SERVICE_NAME", "toolgate-test")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let mut request = authed(
        TOKEN,
        pb::InvokeToolRequest {
            name: "t__echo".into(),
            arguments_json: "{}".into(),
            ..Default::default()
        },
    );
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{caller_span}-01").parse().unwrap(),
    );
    client.invoke_tool(request).await.unwrap();

    // The upstream request carries the trace: `_meta` and the HTTP header.
    let meta = server.log.call_traceparents.lock().unwrap().clone();
    let upstream_parent = meta[0].clone().expect("_meta.traceparent is set");
    assert!(upstream_parent.contains(trace_id), "{upstream_parent}");
    let headers = server.log.headers.lock().unwrap().clone();
    assert!(
        headers
            .iter()
            .any(|h| h.get("traceparent") == Some(&upstream_parent)),
        "traceparent header sent to the HTTP server"
    );

    // The receiver gets the RPC span as a child of the caller's span, and
    // the upstream span as its child.
    let started = Instant::now();
    let (rpc, upstream) = loop {
        {
            let spans = receiver.spans.lock().unwrap();
            let rpc = spans
                .iter()
                .find(|s| s.name == "toolgate.v1.ToolGateway/InvokeTool")
                .cloned();
            let upstream = spans.iter().find(|s| s.name == "tools/call").cloned();
            if let (Some(rpc), Some(upstream)) = (rpc, upstream) {
                break (rpc, upstream);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "spans did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(hex(&rpc.trace_id), trace_id);
    assert_eq!(hex(&rpc.parent_span_id), caller_span);
    assert_eq!(hex(&upstream.trace_id), trace_id);
    assert_eq!(upstream.parent_span_id, rpc.span_id);
    assert!(
        upstream_parent.contains(&hex(&upstream.span_id)),
        "the server's parent is the upstream span"
    );
    let attribute = |span: &Span, key: &str| {
        span.attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.clone())
            .map(|v| format!("{v:?}"))
    };
    assert!(attribute(&rpc, "tenant").unwrap().contains("acme"));
    assert!(
        attribute(&upstream, "mcp.method.name")
            .unwrap()
            .contains("tools/call")
    );
    assert!(
        attribute(&upstream, "gen_ai.tool.name")
            .unwrap()
            .contains("echo")
    );
    signal(gateway.0.id(), "TERM");
    assert!(
        wait_exit(&mut gateway.0, Duration::from_secs(30))
            .await
            .success()
    );
}

/// A gateway serving the real binary with two servers: server-everything
/// over stdio (its children must not outlive the gateway) and an
/// in-process server over HTTP whose `slow` tool is not idempotent and
/// runs until cancelled.
async fn gateway_to_drain(
    dir: &std::path::Path,
    settings: &str,
    log_format: &str,
) -> (ChildGuard, u16, McpServer, std::path::PathBuf) {
    let slow = serve_mcp(TestServer::new(&["slow", "echo"])).await;
    let port = free_port();
    let config = dir.join("toolgate.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\n{settings}tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n      - name: http\n        url: \"{}\"\n",
            node().display(),
            everything_js().display(),
            slow.url
        ),
    )
    .unwrap();
    let log_path = dir.join("gateway.log");
    let gateway = ChildGuard(
        Command::new(toolgate_bin())
            .args(["serve", "--log-format", log_format, "--config"])
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port).await;
    (gateway, port, slow, log_path)
}

/// Starts the `slow` call and returns once the server has it.
async fn slow_call_in_flight(
    port: u16,
    server: &McpServer,
) -> tokio::task::JoinHandle<Result<pb::InvokeToolResponse, tonic::Status>> {
    let mut client = client_at(port).await;
    let started = server.log.slow_started.notified();
    let call = tokio::spawn(async move { invoke(&mut client, TOKEN, "http__slow", "{}").await });
    tokio::time::timeout(Duration::from_secs(10), started)
        .await
        .expect("the slow call reaches the server");
    call
}

/// Asks `ops_probe.py health` (Python grpcio-health-checking) until it
/// answers `want`, at most `limit`.
async fn health_becomes(port: u16, want: &str, limit: Duration) {
    let addr = format!("127.0.0.1:{port}");
    let started = Instant::now();
    loop {
        let (_, answer) = ops_probe(&["health", "--addr", &addr]).await;
        if answer["status"] == want {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "health is {answer} after {limit:?}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Invokes `http__echo` until the gateway refuses it with `DRAINING`
/// (bounded): the drain stage has begun. Every answer before must be a
/// served call.
async fn calls_until_draining(client: &mut ToolGatewayClient<Channel>, limit: Duration) {
    let started = Instant::now();
    loop {
        match invoke(client, TOKEN, "http__echo", r#"{"text":"still here"}"#).await {
            Ok(answer) => assert_eq!(answer.text, "still here"),
            Err(status) => {
                assert_eq!(
                    (status.code(), reason(&status).as_str()),
                    (tonic::Code::Unavailable, "DRAINING"),
                    "a new call during the drain: {status:?}"
                );
                return;
            }
        }
        assert!(started.elapsed() < limit, "no DRAINING within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn shutdown_stages_not_serving_then_draining_then_the_grace_ends_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (mut gateway, port, slow, _log) = gateway_to_drain(
        dir.path(),
        "shutdown_delay: \"4s\"\nshutdown_grace: \"2s\"\n",
        "text",
    )
    .await;
    let pid = gateway.0.id();
    let mut client = client_at(port).await;
    let listing = list(&mut client, TOKEN).await;
    assert!(listing.servers.iter().all(|s| s.connected), "{listing:?}");
    assert_eq!(listing.servers.len(), 2);
    health_becomes(port, "SERVING", Duration::from_secs(10)).await;
    let mut watch = client
        .watch_tools(authed(TOKEN, pb::WatchToolsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .unwrap()
        .unwrap()
        .expect("the first catalog");
    assert!(names(&first).contains(&"http__slow".to_owned()));
    let in_flight = slow_call_in_flight(port, &slow).await;

    let signalled = Instant::now();
    signal(pid, "TERM");
    // Stage 1 and 2: NOT_SERVING at once, while calls are still served for
    // the shutdown delay.
    health_becomes(port, "NOT_SERVING", Duration::from_secs(3)).await;
    let served = invoke(
        &mut client,
        TOKEN,
        "http__echo",
        r#"{"text":"in the delay"}"#,
    )
    .await;
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "the checks of the delay took longer than the delay itself"
    );
    assert_eq!(
        served.expect("a call during the delay is served").text,
        "in the delay"
    );
    // Stage 3: new calls are refused with DRAINING, no sooner than the delay.
    calls_until_draining(&mut client, Duration::from_secs(15)).await;
    assert!(
        signalled.elapsed() >= Duration::from_secs(4),
        "DRAINING came before shutdown_delay ran out: {:?}",
        signalled.elapsed()
    );
    // Watches end with DRAINING, so watchers move to another replica.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the watch ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the watch ends in the drain");
    assert_eq!(
        (ended.code(), reason(&ended).as_str()),
        (tonic::Code::Unavailable, "DRAINING"),
        "{ended:?}"
    );
    // Health stays NOT_SERVING through the drain.
    health_becomes(port, "NOT_SERVING", Duration::from_secs(1)).await;
    // Stage 4: the grace runs out; the call still running was sent and is
    // not idempotent, so its outcome is unknown.
    let cut = tokio::time::timeout(Duration::from_secs(15), in_flight)
        .await
        .expect("the in-flight call is answered when the grace ends")
        .unwrap()
        .expect_err("the in-flight call is cut off");
    assert_eq!(
        (cut.code(), reason(&cut).as_str()),
        (tonic::Code::Unknown, "SHUTTING_DOWN"),
        "{cut:?}"
    );
    // (That the server is told, by notifications/cancelled, is not asserted
    // here: at exit it races the session's close on a loaded machine; the
    // cancellation itself is covered by invoke.rs.)
    let status = wait_exit(&mut gateway.0, Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn a_second_signal_ends_the_drain_and_logs_are_json() {
    let dir = tempfile::tempdir().unwrap();
    let (mut gateway, port, slow, log_path) = gateway_to_drain(
        dir.path(),
        "shutdown_delay: \"100ms\"\nshutdown_grace: \"60s\"\n",
        "json",
    )
    .await;
    let pid = gateway.0.id();
    let mut client = client_at(port).await;
    let listing = list(&mut client, TOKEN).await;
    assert!(listing.servers.iter().all(|s| s.connected), "{listing:?}");
    let children = children_of(pid);
    assert!(!children.is_empty(), "server-everything runs as a child");
    // Two calls in flight: one not idempotent (`slow`), one that is
    // (server-everything annotates its long-running operation
    // `idempotentHint: true`).
    let not_idempotent = slow_call_in_flight(port, &slow).await;
    let mut long_client = client_at(port).await;
    let idempotent = tokio::spawn(async move {
        invoke(
            &mut long_client,
            TOKEN,
            "everything__trigger-long-running-operation",
            r#"{"duration":60,"steps":60}"#,
        )
        .await
    });
    signal(pid, "TERM");
    // The drain has begun when a new call is refused with DRAINING.
    calls_until_draining(&mut client, Duration::from_secs(10)).await;
    assert!(
        !idempotent.is_finished() && !not_idempotent.is_finished(),
        "both calls are still running in the drain"
    );
    let second = Instant::now();
    signal(pid, "INT");
    let status = wait_exit(&mut gateway.0, Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0));
    assert!(
        second.elapsed() < Duration::from_secs(15),
        "the drain ended at once"
    );
    // Both are the gateway's own answers (the reason says so), not the
    // transport's error at exit: UNKNOWN for the call that may have acted,
    // UNAVAILABLE (retry) for the idempotent one.
    for (call, want) in [
        (not_idempotent, tonic::Code::Unknown),
        (idempotent, tonic::Code::Unavailable),
    ] {
        let err = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .unwrap()
            .unwrap()
            .expect_err("the cut-off call is answered with an error");
        assert_eq!(
            (err.code(), reason(&err).as_str()),
            (want, "SHUTTING_DOWN"),
            "{err:?}"
        );
    }
    for child in children {
        assert!(!process_alive(child), "child {child} outlived the gateway");
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.is_empty());
    for line in log.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            value.get("level").is_some() && value.get("timestamp").is_some(),
            "{line}"
        );
    }
    assert!(log.contains("second signal"), "{log}");
}
