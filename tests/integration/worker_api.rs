//! The workers' API beyond the basics: progress streaming, catalog
//! versions and pins, watching, filters and token budgets, search,
//! operator overrides, and `check` warnings.

use std::time::{Duration, Instant};

use futures::StreamExt;
use toolgate::pb;
use toolgate::pb::invoke_tool_event::Event;

use crate::common::*;

const TOKEN: &str = "acme-token";

fn yaml_for(url: &str, server_extra: &str) -> String {
    format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: t\n        url: \"{url}\"\n        reconnect:\n          initial_backoff: \"50ms\"\n          max_backoff: \"200ms\"\n{server_extra}"
    )
}

fn request(name: &str, args: &str) -> pb::InvokeToolRequest {
    pb::InvokeToolRequest {
        name: name.into(),
        arguments_json: args.into(),
        ..Default::default()
    }
}

async fn collect_stream(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    req: pb::InvokeToolRequest,
) -> Vec<Event> {
    let mut stream = client
        .invoke_tool_stream(authed(TOKEN, req))
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        events.push(event.event.unwrap());
    }
    events
}

#[tokio::test]
async fn progress_is_relayed_in_order_then_the_result() {
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n",
            node().display(),
            everything_js().display()
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let events = collect_stream(
        &mut client,
        request(
            "everything__trigger-long-running-operation",
            r#"{"duration":1,"steps":4}"#,
        ),
    )
    .await;
    let progress: Vec<f64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress(p) => Some(p.progress),
            Event::Result(_) | Event::InputRequired(_) | Event::ApprovalPending(_) => None,
        })
        .collect();
    assert!(progress.len() >= 2, "{events:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    let Some(Event::Result(result)) = events.last() else {
        panic!("the result comes last: {events:?}");
    };
    assert!(!result.is_error);
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::Result(_)))
            .count(),
        1
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn non_increasing_progress_is_dropped() {
    let server = serve_mcp(TestServer::new(&["progress"])).await;
    let gateway = TestGateway::start(&yaml_for(&server.url, ""), &[]).await;
    let mut client = gateway.client().await;
    let events = collect_stream(&mut client, request("t__progress", "{}")).await;
    let progress: Vec<(f64, Option<f64>)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress(p) => Some((p.progress, p.total)),
            Event::Result(_) | Event::InputRequired(_) | Event::ApprovalPending(_) => None,
        })
        .collect();
    assert_eq!(
        progress,
        [(1.0, Some(3.0)), (2.0, Some(3.0)), (3.0, Some(3.0))]
    );
    assert!(matches!(events.last(), Some(Event::Result(r)) if r.text == "progress done"));
    gateway.shutdown().await;
}

#[tokio::test]
async fn cancelling_the_stream_cancels_the_upstream_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("messages.jsonl");
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: bad\n        command: [\"{}\", \"{}\", \"progress_forever\"]\n        env:\n          HOSTILE_LOG: \"{}\"\n",
            python().display(),
            fixture("python/hostile_server.py").display(),
            log.display()
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let mut stream = client
        .invoke_tool_stream(authed(TOKEN, request("bad__echo", r#"{"text":"x"}"#)))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap();
    assert!(
        matches!(
            first,
            Some(Ok(pb::InvokeToolEvent {
                event: Some(Event::Progress(_))
            }))
        ),
        "{first:?}"
    );
    drop(stream);
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("notifications/cancelled") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no cancellation reached the server: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gateway.shutdown().await;
}

/// Restarts the server on the same port with other tools and waits until
/// the gateway has re-read the catalog.
async fn swap_tools(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    old: McpServer,
    port: u16,
    tools: Vec<rmcp::model::Tool>,
    previous_version: &str,
) -> (McpServer, pb::ListToolsResponse) {
    drop(old);
    let server = serve_mcp_at(TestServer::new(&[]).with_tools(tools), port).await;
    let started = Instant::now();
    loop {
        // A call finds the old session broken; the supervisor reconnects.
        let _ = invoke(client, TOKEN, "t__stable", "{}").await;
        let listing = list(client, TOKEN).await;
        if listing.catalog_version != previous_version && listing.servers[0].connected {
            return (server, listing);
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "catalog never changed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn pinned_plans_are_refused_when_the_ground_moved() {
    let port = free_port();
    let echo_v1 = annotated("echo", true, "Echo the text back, unchanged.");
    let stable = annotated("stable", true, "A tool whose definition never changes.");
    let server = serve_mcp_at(
        TestServer::new(&[]).with_tools(vec![echo_v1, stable.clone()]),
        port,
    )
    .await;
    let gateway =
        TestGateway::start(&yaml_for(&format!("http://127.0.0.1:{port}/mcp"), ""), &[]).await;
    let mut client = gateway.client().await;
    let v1 = list(&mut client, TOKEN).await;
    let hash_v1 = v1
        .tools
        .iter()
        .find(|t| t.name == "t__echo")
        .unwrap()
        .definition_hash
        .clone();

    let mut watch = client
        .watch_tools(authed(TOKEN, pb::WatchToolsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.catalog_version, v1.catalog_version);

    // The server comes back with a changed `echo`.
    let echo_v2 = annotated("echo", true, "Echo the text back, shouting.");
    let (server, v2) = swap_tools(
        &mut client,
        server,
        port,
        vec![echo_v2, stable.clone()],
        &v1.catalog_version,
    )
    .await;
    assert_ne!(v2.catalog_version, v1.catalog_version);
    let hash_v2 = v2
        .tools
        .iter()
        .find(|t| t.name == "t__echo")
        .unwrap()
        .definition_hash
        .clone();
    assert_ne!(hash_v1, hash_v2);
    // Watchers saw the change.
    let started = Instant::now();
    loop {
        let snapshot = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if snapshot.catalog_version == v2.catalog_version {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    let pinned = |version: &str, hash: &str, name: &str| pb::InvokeToolRequest {
        name: name.into(),
        arguments_json: r#"{"text":"x"}"#.into(),
        catalog_version: version.into(),
        definition_hash: hash.into(),
        ..Default::default()
    };
    for req in [
        pinned(&v1.catalog_version, "", "t__echo"),
        pinned("", &hash_v1, "t__echo"),
    ] {
        let err = client.invoke_tool(authed(TOKEN, req)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        assert_eq!(reason(&err), "TOOL_DEFINITION_CHANGED");
        use tonic_types::StatusExt;
        let info = err.get_details_error_info().unwrap();
        assert_eq!(
            info.metadata.get("current_catalog_version"),
            Some(&v2.catalog_version)
        );
    }
    // The unchanged tool still runs under the old pin; the new pin works.
    client
        .invoke_tool(authed(TOKEN, pinned(&v1.catalog_version, "", "t__stable")))
        .await
        .unwrap();
    client
        .invoke_tool(authed(
            TOKEN,
            pinned(&v2.catalog_version, &hash_v2, "t__echo"),
        ))
        .await
        .unwrap();
    let err = client
        .invoke_tool(authed(
            TOKEN,
            pinned("000000000000000000000000", "", "t__echo"),
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "CATALOG_VERSION_UNKNOWN");

    // Then `echo` goes away.
    let (_server, v3) =
        swap_tools(&mut client, server, port, vec![stable], &v2.catalog_version).await;
    assert!(v3.tools.iter().all(|t| t.name != "t__echo"));
    let err = client
        .invoke_tool(authed(TOKEN, pinned(&v2.catalog_version, "", "t__echo")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&err), "TOOL_GONE");
    // Without a pin it is simply unknown.
    let err = client
        .invoke_tool(authed(TOKEN, request("t__echo", "{}")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    gateway.shutdown().await;
}

#[tokio::test]
async fn list_filters_and_token_budgets() {
    let a = serve_mcp(TestServer::new(&[]).with_tools(vec![
        annotated("read_file", true, "Read a file."),
        annotated("write_file", false, "Write a file."),
    ]))
    .await;
    let b = serve_mcp(TestServer::new(&["search"])).await;
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: fs\n        url: \"{}\"\n      - name: web\n        url: \"{}\"\n",
            a.url, b.url
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let list_with = |filter: pb::ListToolsRequest| authed(TOKEN, filter);
    let all = client
        .list_tools(list_with(Default::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        names(&all),
        ["fs__read_file", "fs__write_file", "web__search"]
    );
    for tool in &all.tools {
        assert!(
            tool.estimated_tokens > 0 && tool.schema_bytes > 0,
            "{tool:?}"
        );
    }
    assert_eq!(
        all.total_estimated_tokens,
        all.tools.iter().map(|t| t.estimated_tokens).sum::<u32>()
    );

    let by_server = client
        .list_tools(list_with(pb::ListToolsRequest {
            servers: vec!["web".into()],
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&by_server), ["web__search"]);
    let by_glob = client
        .list_tools(list_with(pb::ListToolsRequest {
            name_globs: vec!["*_file".into()],
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&by_glob), ["fs__read_file", "fs__write_file"]);
    let read_only = client
        .list_tools(list_with(pb::ListToolsRequest {
            annotations: Some(pb::AnnotationFilter {
                read_only: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&read_only), ["fs__read_file"]);
    assert!(read_only.total_estimated_tokens < all.total_estimated_tokens);
    let err = client
        .list_tools(list_with(pb::ListToolsRequest {
            name_globs: vec!["[".into()],
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("name_globs[0]"), "{}", err.message());
    gateway.shutdown().await;
}

#[tokio::test]
async fn overrides_change_what_callers_see_and_the_hash() {
    let mut with_default = tool("fetch");
    let schema = serde_json::json!({
        "type": "object",
        "properties": { "url": { "type": "string", "description": "What to fetch.", "default": "http://internal.example" } }
    });
    with_default.input_schema = std::sync::Arc::new(schema.as_object().unwrap().clone());
    let server = serve_mcp(TestServer::new(&[]).with_tools(vec![with_default])).await;
    let plain = TestGateway::start(&yaml_for(&server.url, ""), &[]).await;
    let mut client = plain.client().await;
    let before = list(&mut client, TOKEN).await.tools[0].clone();
    plain.shutdown().await;

    let overridden = TestGateway::start(
        &yaml_for(
            &server.url,
            "        overrides:\n          fetch:\n            description: \"Fetch a public web page by URL and return its text.\"\n            title: \"Fetch page\"\n            hide_defaults: true\n",
        ),
        &[],
    )
    .await;
    let mut client = overridden.client().await;
    let after = list(&mut client, TOKEN).await.tools[0].clone();
    assert_eq!(
        after.description,
        "Fetch a public web page by URL and return its text."
    );
    assert_eq!(after.title, "Fetch page");
    assert!(before.input_schema_json.contains("internal.example"));
    assert!(
        !after.input_schema_json.contains("default"),
        "{}",
        after.input_schema_json
    );
    assert_ne!(before.definition_hash, after.definition_hash);
    overridden.shutdown().await;
}

#[test]
fn check_warns_about_misleading_definitions() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (a, b) = runtime.block_on(async {
        let mut undocumented = tool("mystery");
        undocumented.description = None;
        let schema = serde_json::json!({"type":"object","properties":{"x":{"type":"string"}}});
        undocumented.input_schema = std::sync::Arc::new(schema.as_object().unwrap().clone());
        let a = serve_mcp(TestServer::new(&[]).with_tools(vec![
            undocumented,
            annotated(
                "send",
                false,
                "Send a message to a channel in the team chat workspace.",
            ),
        ]))
        .await;
        let b = serve_mcp(TestServer::new(&[]).with_tools(vec![annotated(
            "post",
            false,
            "Send a message to a channel in the team chat workspace now.",
        )]))
        .await;
        (a, b)
    });
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!(
            "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: chat\n        url: \"{}\"\n        overrides:\n          nope:\n            title: Typo\n      - name: other\n        url: \"{}\"\n",
            a.url, b.url
        ),
    )
    .unwrap();
    let output = std::process::Command::new(toolgate_bin())
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "warnings do not fail the check: {stdout}"
    );
    for expected in [
        "warning: server `chat` tool `mystery`: has no description",
        "warning: server `chat` tool `mystery`: parameters without descriptions: x",
        "warning: server `chat` tool `send`: description nearly duplicates that of `other__post`",
        "warning: server `chat` tool `nope`: has an override but the server exposes no such tool",
    ] {
        assert!(
            stdout.contains(expected),
            "missing `{expected}` in:\n{stdout}"
        );
    }
    drop((a, b));
}
