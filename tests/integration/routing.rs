//! A call runs on the server its name names, even when a reload replaces
//! the tenant while the call waits; retired sessions are freed; caller
//! strings are bounded and admission comes before any other work.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use toolgate::pb;

use crate::common::*;

/// A stdio `env_server.py` whose `WHO` variable names it.
fn who_server(name: &str) -> String {
    format!(
        "      - name: {name}\n        command: [\"{}\", \"{}\"]\n        env: {{ WHO: \"{name}\" }}\n",
        python().display(),
        fixture("python/env_server.py").display()
    )
}

/// A server that starts once the file `gate` exists (or after 60 s), so
/// it stays "connecting" until the test opens the gate.
fn gated_server(gate: &Path) -> String {
    format!(
        "      - name: slow\n        command: [\"/bin/sh\", \"-c\", \"/usr/bin/timeout 60 /bin/sh -c 'until [ -e {} ]; do /bin/sleep 0.05; done'; exec {} {}\"]\n        connect_timeout: \"90s\"\n",
        gate.display(),
        python().display(),
        fixture("python/env_server.py").display()
    )
}

fn config_with(port: u16, extra: &str, servers: &str) -> String {
    format!(
        "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n{extra}tenants:\n  - name: acme\n    tokens: [acme-token]\n    servers:\n{servers}"
    )
}

fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// ListTools with a short deadline (it does not wait for connecting
/// servers beyond it).
async fn quick_list(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
) -> Option<pb::ListToolsResponse> {
    let mut request = authed("acme-token", pb::ListToolsRequest::default());
    request.set_timeout(Duration::from_millis(300));
    client
        .list_tools(request)
        .await
        .ok()
        .map(|r| r.into_inner())
}

async fn get_env(
    mut client: pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    tool: &str,
) -> Result<String, tonic::Status> {
    let mut request = authed(
        "acme-token",
        pb::InvokeToolRequest {
            name: tool.to_owned(),
            arguments_json: r#"{"name":"WHO"}"#.to_owned(),
            ..Default::default()
        },
    );
    request.set_timeout(Duration::from_secs(40));
    client
        .invoke_tool(request)
        .await
        .map(|r| r.into_inner().text)
}

/// Servers `[a, slow]`; calls to `b__get_env` and `x__get_env` wait for
/// `slow`; a reload to `[b, a, slow, x]` lands meanwhile. Each call must
/// run on the server its name names (routing by the old generation's
/// index ran `a` for `b`, and panicked for `x`).
///
/// `slow` connects only when the test opens its gate, which it does once
/// the reload has landed and `b` and `x` are connected (a fixed start-up
/// delay of `slow` raced the start of `a`, and the reload, on a loaded
/// machine): the waiting calls then find `b` and `x` whether they wake on
/// the settled catalog or at the end of their wait.
#[tokio::test]
async fn a_reload_that_reorders_and_appends_servers_never_misroutes_a_waiting_call() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let metrics_port = free_port();
    let metrics = format!("metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\n");
    let path = dir.path().join("toolgate.yaml");
    let gate = dir.path().join("gate");
    let slow = gated_server(&gate);
    std::fs::write(
        &path,
        config_with(port, &metrics, &(who_server("a") + &slow)),
    )
    .unwrap();
    let log_path = dir.path().join("gateway.log");
    let mut gateway = serve_binary(&path, &log_path, &[]);
    let pid = gateway.0.id();
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    let started = Instant::now();
    loop {
        let listing = quick_list(&mut client).await;
        let a_up = listing.as_ref().is_some_and(|l| {
            l.servers.iter().any(|s| s.name == "a" && s.connected)
                && l.servers.iter().any(|s| s.name == "slow" && !s.connected)
        });
        if a_up {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "`a` never connected while `slow` was still connecting"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let b_call = tokio::spawn(get_env(client.clone(), "b__get_env"));
    let x_call = tokio::spawn(get_env(client.clone(), "x__get_env"));
    let a = get_env(client.clone(), "a__get_env").await;
    assert_eq!(a.expect("a__get_env is answered"), "a");
    // `b` and `x` are in no catalog yet: both calls wait in the gateway
    // for `slow` (the in-flight gauge counts them) when the reload lands.
    let started = Instant::now();
    loop {
        let page = scrape(metrics_port).await;
        let in_flight = sample(&page, "toolgate_calls_in_flight{tenant=\"acme\"} ")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if in_flight >= 2.0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the calls never waited in the gateway: {in_flight} in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!b_call.is_finished() && !x_call.is_finished());
    replace(
        &path,
        &config_with(
            port,
            &metrics,
            &(who_server("b") + &who_server("a") + &slow + &who_server("x")),
        ),
    );
    signal(pid, "HUP");
    // The reload has landed and `b` and `x` are up (their calls still
    // wait for `slow`): now `slow` may connect.
    let started = Instant::now();
    loop {
        let listing = quick_list(&mut client).await;
        let landed = listing.as_ref().is_some_and(|l| {
            let names: Vec<&str> = l.servers.iter().map(|s| s.name.as_str()).collect();
            let up = |name: &str| l.servers.iter().any(|s| s.name == name && s.connected);
            names == ["b", "a", "slow", "x"] && up("b") && up("x")
        });
        if landed {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the reload never landed with `b` and `x` up: {listing:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&gate, "").unwrap();

    let b = b_call.await.unwrap().expect("b__get_env is answered");
    let x = x_call.await.unwrap().expect("x__get_env is answered");
    assert_eq!(b, "b", "b__get_env ran on the wrong server");
    assert_eq!(x, "x", "x__get_env ran on the wrong server");
    // The gateway is still there and serves the new catalog.
    assert!(gateway.0.try_wait().unwrap().is_none(), "the gateway died");
    let listing = list(&mut client, "acme-token").await;
    let servers: Vec<&str> = listing.servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(servers, ["b", "a", "slow", "x"]);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains("panicked"), "{log}");
}

/// Each reload that changes a server retires its slot; once the session
/// has closed, the slot is freed. Many reloads leave nothing behind.
#[tokio::test]
async fn retired_slots_are_freed_once_their_sessions_close() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let env: Arc<std::collections::HashMap<String, String>> = Arc::default();
    let yaml = |n: usize| {
        format!(
            "tenants:\n  - name: t\n    tokens: [tok]\n    servers:\n      - name: s\n        url: \"{}\"\n        headers: {{ X-Generation: \"{n}\" }}\n",
            server.url
        )
    };
    let load = |n: usize| {
        toolgate::config::Config::from_yaml(&yaml(n), "test.yaml", Path::new("."), env.as_ref())
            .unwrap()
    };
    let metrics = Arc::new(toolgate::telemetry::Metrics::new());
    let registry = toolgate::registry::Registry::start(&load(0), env.clone(), metrics);
    for n in 1..=30 {
        let summary = registry.apply(&load(n));
        assert_eq!(summary.servers_retired, ["t/s"]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    while registry.retiring() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} retired slots were never freed",
            registry.retiring()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The newest generation still serves.
    let tenant = registry.authenticate("tok").expect("tenant").0;
    let catalog = tenant.settled_catalog(Duration::from_secs(10)).await;
    assert!(catalog.get("s__echo").is_some());
    registry.shutdown().await;
}

/// Over the rate limit, a call is shed before anything else is looked at
/// (the name is not even resolved); a name longer than any tool name is
/// refused at once, and the status quotes only a bounded prefix of it.
#[tokio::test]
async fn admission_comes_first_and_caller_strings_are_bounded() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let yaml = format!(
        "tenants:\n  - name: t\n    tokens: [tok]\n    limits: {{ rate_per_second: 1, burst: 2 }}\n    servers:\n      - name: s\n        url: \"{}\"\n",
        server.url
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;

    let huge = "n".repeat(2 << 20);
    let err = invoke(&mut client, "tok", &huge, "{}").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{}", err.code());
    assert_eq!(reason(&err), "INVALID_TOOL_NAME");
    assert!(
        err.message().len() < 300,
        "the status quotes {} bytes of the name",
        err.message().len()
    );
    assert!(err.message().contains("bytes in all"), "{}", err.message());

    // One listing and one call use the burst of 2 ...
    client
        .list_tools(authed("tok", pb::ListToolsRequest::default()))
        .await
        .expect("first listing");
    invoke(&mut client, "tok", "s__echo", "{}").await.unwrap();
    // ... so the next call is shed before its (unknown) name is looked up.
    let err = invoke(&mut client, "tok", "s__no_such_tool", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_eq!(reason(&err), "RATE_LIMITED");
    // Listings count against the same bucket.
    let err = client
        .search_tools(authed(
            "tok",
            pb::SearchToolsRequest {
                query: "echo".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RATE_LIMITED", "{err:?}");
    gateway.shutdown().await;
}

/// A call whose deadline leaves no time once the gateway's margin is
/// taken is not sent upstream at all: the gateway answers
/// DEADLINE_EXCEEDED itself, records it as not sent, and the server never
/// sees it.
#[tokio::test]
async fn a_call_without_time_left_is_not_sent() {
    let test_server = TestServer::new(&["echo"]);
    let log = test_server.log.clone();
    let server = serve_mcp(test_server).await;
    let dir = tempfile::tempdir().unwrap();
    let trail = dir.path().join("audit.jsonl");
    let yaml = format!(
        "audit:\n  path: \"{}\"\ntenants:\n  - name: t\n    tokens: [tok]\n    servers:\n      - name: s\n        url: \"{}\"\n",
        trail.display(),
        server.url
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    invoke(&mut client, "tok", "s__echo", "{}").await.unwrap();
    let calls_before = log.call_traceparents.lock().unwrap().len();
    const TRIES: usize = 5;
    for _ in 0..TRIES {
        let mut request = authed(
            "tok",
            pb::InvokeToolRequest {
                name: "s__echo".into(),
                arguments_json: "{}".into(),
                ..Default::default()
            },
        );
        // The margin is at least 20 ms: 15 ms leaves nothing.
        request.set_timeout(Duration::from_millis(15));
        let err = client.invoke_tool(request).await.unwrap_err();
        // On a loaded machine the client's own 15 ms timer may fire before
        // the gateway's answer arrives (the audit trail below has the
        // gateway's answer either way); an answer that does arrive is the
        // gateway's own.
        let client_timer =
            err.code() == tonic::Code::Cancelled && err.message().contains("Timeout expired");
        if !client_timer {
            assert_eq!(
                (err.code(), reason(&err).as_str()),
                (tonic::Code::DeadlineExceeded, "DEADLINE_EXCEEDED"),
                "{err:?}"
            );
        }
    }
    // The gateway's answer to each try, as its audit trail records it
    // (written before the answer leaves).
    let started = std::time::Instant::now();
    let refused = loop {
        let refused: Vec<serde_json::Value> = std::fs::read_to_string(&trail)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter(|r| r["kind"] == "call" && r["code"] == "DEADLINE_EXCEEDED")
            .collect();
        if refused.len() >= TRIES {
            break refused;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} of {TRIES} tries are in the audit trail",
            refused.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(refused.len(), TRIES, "{refused:#?}");
    for record in &refused {
        assert_eq!(record["reason"], "DEADLINE_EXCEEDED", "{record}");
        assert_eq!(record["sent"], false, "{record}");
    }
    // A call with time left, after them: the server has seen it and
    // nothing else since the first call.
    let barrier = invoke(&mut client, "tok", "s__echo", r#"{"text":"after"}"#)
        .await
        .unwrap();
    assert_eq!(barrier.text, "after");
    assert_eq!(
        log.call_traceparents.lock().unwrap().len(),
        calls_before + 1,
        "a call with no time left reached the server"
    );
    gateway.shutdown().await;
}

/// A reload that leaves a tenant's limits alone keeps its rate buckets,
/// the tenant's and each subject's (`limits.per_subject`): an unrelated
/// edit (another tenant added) is no way around the limits.
#[tokio::test]
async fn a_reload_keeps_the_rate_bucket_of_a_tenant_whose_limits_did_not_change() {
    use toolgate::callers::{Namespace, Subject};
    use toolgate::registry::limits::Shed;
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let env: Arc<std::collections::HashMap<String, String>> = Arc::default();
    let yaml = |extra: &str, rate: u32| {
        format!(
            "tenants:\n  - name: t\n    tokens: [tok]\n    limits: {{ rate_per_second: {rate}, burst: 1, per_subject: {{ rate_per_second: 1, burst: 1 }} }}\n    servers:\n      - name: s\n        url: \"{}\"\n{extra}",
            server.url
        )
    };
    let load = |text: String| {
        toolgate::config::Config::from_yaml(&text, "test.yaml", Path::new("."), env.as_ref())
            .unwrap()
    };
    let alice = Subject::named(Namespace::Token, "alice").unwrap();
    let bob = Subject::named(Namespace::Token, "bob").unwrap();
    let metrics = Arc::new(toolgate::telemetry::Metrics::new());
    let registry = toolgate::registry::Registry::start(&load(yaml("", 1)), env.clone(), metrics);
    let tenant = registry.authenticate("tok").unwrap().0;
    tenant
        .limiter
        .check_rate(&alice)
        .expect("the burst admits one");
    assert!(
        matches!(tenant.limiter.check_rate(&alice), Err(Shed::SubjectRate(_))),
        "alice's bucket is empty"
    );
    assert!(
        matches!(tenant.limiter.check_rate(&bob), Err(Shed::Rate(_))),
        "the tenant's bucket is empty"
    );

    let other = "  - name: u\n    tokens: [tok2]\n    servers: []\n";
    registry.apply(&load(yaml(other, 1)));
    let reloaded = registry.authenticate("tok").unwrap().0;
    assert!(!Arc::ptr_eq(&tenant, &reloaded), "a new tenant object");
    assert!(
        matches!(
            reloaded.limiter.check_rate(&alice),
            Err(Shed::SubjectRate(_))
        ),
        "an unrelated reload refilled alice's bucket"
    );
    assert!(
        reloaded.limiter.check_rate(&bob).is_err(),
        "an unrelated reload refilled the bucket"
    );
    // Changed limits start new buckets.
    registry.apply(&load(yaml(other, 2)));
    let changed = registry.authenticate("tok").unwrap().0;
    changed
        .limiter
        .check_rate(&alice)
        .expect("new limits, new bucket");
    registry.shutdown().await;
}
