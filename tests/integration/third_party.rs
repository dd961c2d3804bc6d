//! Real servers and clients written by others: server-everything (npm) over
//! stdio and Streamable HTTP, a server on the Python `mcp` SDK, and a Python
//! grpcio client.

use std::time::Duration;

use serde_json::Value;
use toolgate::pb;

use crate::common::*;

const TOKEN: &str = "acme-token";

fn everything_stdio_yaml() -> String {
    format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n        env:\n          GREETING: hello\n",
        node().display(),
        everything_js().display()
    )
}

#[tokio::test]
async fn server_everything_over_stdio() {
    let gateway = TestGateway::start(&everything_stdio_yaml(), &[]).await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    let tools = names(&listing);
    assert!(listing.servers[0].connected, "{:?}", listing.servers);
    for expected in [
        "everything__echo",
        "everything__get-tiny-image",
        "everything__get-env",
    ] {
        assert!(
            tools.iter().any(|t| t == expected),
            "{expected} in {tools:?}"
        );
    }
    let echo = listing
        .tools
        .iter()
        .find(|t| t.name == "everything__echo")
        .unwrap();
    let schema: Value = serde_json::from_str(&echo.input_schema_json).unwrap();
    assert_eq!(schema["type"], "object");

    let answer = invoke(
        &mut client,
        TOKEN,
        "everything__echo",
        r#"{"message":"hi"}"#,
    )
    .await
    .unwrap();
    assert_eq!(answer.text, "Echo: hi");

    let image = invoke(&mut client, TOKEN, "everything__get-tiny-image", "{}")
        .await
        .unwrap();
    let png = image
        .content
        .iter()
        .find_map(|c| match &c.kind {
            Some(pb::content::Kind::Image(i)) => Some(i),
            _ => None,
        })
        .expect("an image block");
    assert_eq!(&png.data[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        image.text.contains("[1 non-text content block(s) omitted]"),
        "{}",
        image.text
    );

    // The child's environment is exactly the configured one: nothing from
    // the gateway's (this test process has PATH, HOME, CARGO_* ...).
    let env = invoke(&mut client, TOKEN, "everything__get-env", "{}")
        .await
        .unwrap();
    let vars: serde_json::Map<String, Value> = serde_json::from_str(&env.text).unwrap();
    assert_eq!(vars.get("GREETING").and_then(Value::as_str), Some("hello"));
    assert!(!vars.contains_key("PATH"), "{vars:?}");
    assert!(vars.keys().all(|k| !k.starts_with("CARGO")), "{vars:?}");

    // Embedded resources and resource links are carried typed.
    let reference = invoke(
        &mut client,
        TOKEN,
        "everything__get-resource-reference",
        r#"{"resourceType":"Text","resourceId":1}"#,
    )
    .await
    .unwrap();
    assert!(
        reference
            .content
            .iter()
            .any(|c| matches!(&c.kind, Some(pb::content::Kind::Resource(r)) if !r.uri.is_empty()))
    );
    let links = invoke(
        &mut client,
        TOKEN,
        "everything__get-resource-links",
        r#"{"count":2}"#,
    )
    .await
    .unwrap();
    let link_count = links
        .content
        .iter()
        .filter(|c| matches!(&c.kind, Some(pb::content::Kind::ResourceLink(_))))
        .count();
    assert_eq!(link_count, 2);
    let structured = invoke(
        &mut client,
        TOKEN,
        "everything__get-structured-content",
        r#"{"location":"Chicago"}"#,
    )
    .await
    .unwrap();
    let value: Value = serde_json::from_str(&structured.structured_content_json).unwrap();
    assert!(value.get("temperature").is_some(), "{value}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn server_everything_over_streamable_http_with_injected_header() {
    let dir = tempfile::tempdir().unwrap();
    let header_log = dir.path().join("headers.jsonl");
    let (_child, port) = start_everything_http(&header_log).await;
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: remote\n        url: \"http://127.0.0.1:{port}/mcp\"\n        headers:\n          Authorization: {{ env: REMOTE_AUTH }}\n"
        ),
        &[("REMOTE_AUTH", "Bearer injected-upstream-credential")],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    assert!(listing.servers[0].connected, "{:?}", listing.servers);
    assert_eq!(listing.servers[0].transport, "http");
    let answer = invoke(
        &mut client,
        TOKEN,
        "remote__echo",
        r#"{"message":"over http"}"#,
    )
    .await
    .unwrap();
    assert_eq!(answer.text, "Echo: over http");
    let log = std::fs::read_to_string(&header_log).unwrap();
    let requests: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(requests.len() >= 3, "{log}");
    for request in &requests {
        assert_eq!(
            request["headers"]["authorization"], "Bearer injected-upstream-credential",
            "{request}"
        );
        assert!(
            !request.to_string().contains(TOKEN),
            "caller token forwarded: {request}"
        );
    }
    gateway.shutdown().await;
}

fn python_yaml() -> String {
    format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: py\n        command: [\"{}\", \"{}\"]\n        env:\n          CONFIGURED: \"yes\"\n          API_KEY: {{ env: PY_SECRET }}\n        redact_results: false\n",
        python().display(),
        fixture("python/env_server.py").display()
    )
}

#[tokio::test]
async fn python_sdk_server_over_stdio_with_a_cleared_environment() {
    let gateway = TestGateway::start(&python_yaml(), &[("PY_SECRET", "s3cret-from-env")]).await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    assert!(listing.servers[0].connected, "{:?}", listing.servers);
    let get = |name: &str| format!(r#"{{"name":"{name}"}}"#);
    for (var, expected) in [
        ("CONFIGURED", "yes"),
        ("API_KEY", "s3cret-from-env"),
        ("PATH", "<unset>"),
        ("HOME", "<unset>"),
        ("CARGO_PKG_NAME", "<unset>"),
    ] {
        let answer = invoke(&mut client, TOKEN, "py__get_env", &get(var))
            .await
            .unwrap();
        assert_eq!(answer.text, expected, "{var}");
    }
    let add = invoke(&mut client, TOKEN, "py__add", r#"{"a":40,"b":2}"#)
        .await
        .unwrap();
    let structured: Value = serde_json::from_str(&add.structured_content_json).unwrap();
    assert_eq!(structured["result"], 42);
    let failed = invoke(&mut client, TOKEN, "py__fail", r#"{"message":"nope"}"#)
        .await
        .unwrap();
    assert!(failed.is_error);
    assert_eq!(failed.text, "nope");
    // Arguments the server's schema refuses come back as INVALID_ARGUMENT or
    // an isError result, never as an unexplained failure.
    let wrong = invoke(&mut client, TOKEN, "py__add", r#"{"a":"x"}"#).await;
    match wrong {
        Ok(result) => assert!(result.is_error, "{result:?}"),
        Err(status) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}"),
    }
    gateway.shutdown().await;
}

async fn python_client(
    addr: std::net::SocketAddr,
    token: Option<&str>,
    args: &[&str],
) -> (i32, Value) {
    let mut command = tokio::process::Command::new(python());
    command
        .arg(fixture("python/grpc_client.py"))
        .arg("--addr")
        .arg(addr.to_string())
        .args(args)
        .env_remove("TOOLGATE_TOKEN")
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("TOOLGATE_TOKEN", token);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("python client finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "python client printed no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), value)
}

#[tokio::test]
async fn python_grpc_client_lists_and_invokes() {
    let gateway = TestGateway::start(&python_yaml(), &[("PY_SECRET", "x")]).await;

    let (code, listing) = python_client(gateway.addr, Some(TOKEN), &["list"]).await;
    assert_eq!(code, 0, "{listing}");
    let tools: Vec<&str> = listing["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"py__tiny_image") && tools.contains(&"py__echo"),
        "{tools:?}"
    );
    assert!(!listing["catalog_version"].as_str().unwrap().is_empty());
    assert_eq!(listing["servers"][0]["connected"], true);

    let (code, echo) = python_client(
        gateway.addr,
        Some(TOKEN),
        &["invoke", "py__echo", r#"{"text":"from python"}"#],
    )
    .await;
    assert_eq!(code, 0, "{echo}");
    assert_eq!(echo["text"], "from python");

    let (code, image) =
        python_client(gateway.addr, Some(TOKEN), &["invoke", "py__tiny_image"]).await;
    assert_eq!(code, 0, "{image}");
    let blocks = image["content"].as_array().unwrap();
    let png = blocks
        .iter()
        .find(|b| b["type"] == "image")
        .expect("image block");
    assert_eq!(png["mime_type"], "image/png");
    assert_eq!(png["png_magic_ok"], true, "{png}");
    assert!(
        image["text"]
            .as_str()
            .unwrap()
            .ends_with("[1 non-text content block(s) omitted]")
    );

    let (code, missing) =
        python_client(gateway.addr, Some(TOKEN), &["invoke", "py__nope", "{}"]).await;
    assert_eq!(code, 3);
    assert_eq!(missing["error"]["code"], "NOT_FOUND");
    assert_eq!(
        missing["error"]["details"][0]["reason"], "TOOL_NOT_FOUND",
        "{missing}"
    );
    assert_eq!(missing["error"]["details"][0]["domain"], "toolgate");

    let (code, unauth) = python_client(gateway.addr, None, &["list"]).await;
    assert_eq!(code, 3);
    assert_eq!(unauth["error"]["code"], "UNAUTHENTICATED");
    gateway.shutdown().await;
}

#[tokio::test]
async fn python_client_uses_the_worker_api() {
    let server = serve_mcp(TestServer::new(&[]).with_tools(vec![
        annotated(
            "read_file",
            true,
            "Read a file from the workspace and return its text.",
        ),
        annotated(
            "progress",
            false,
            "Do slow work and report progress while doing it.",
        ),
        annotated("echo", true, "Echo the given text back unchanged."),
    ]))
    .await;
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: t\n        url: \"{}\"\n",
            server.url
        ),
        &[],
    )
    .await;
    let addr = gateway.addr;

    let (code, all) = python_client(addr, Some(TOKEN), &["list"]).await;
    assert_eq!(code, 0, "{all}");
    let tools = all["tools"].as_array().unwrap();
    let total: u64 = tools
        .iter()
        .map(|t| t["estimated_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(all["total_estimated_tokens"].as_u64().unwrap(), total);
    let (_, filtered) = python_client(
        addr,
        Some(TOKEN),
        &["list", "--read-only", "--glob", "t__r*"],
    )
    .await;
    let names: Vec<&str> = filtered["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["t__read_file"]);

    // Pins: the current ones pass, a stale hash is refused with its reason.
    let echo = tools.iter().find(|t| t["name"] == "t__echo").unwrap();
    let hash = echo["definition_hash"].as_str().unwrap();
    let version = all["catalog_version"].as_str().unwrap();
    let (code, ok) = python_client(
        addr,
        Some(TOKEN),
        &[
            "invoke",
            "t__echo",
            r#"{"text":"pinned"}"#,
            "--catalog-version",
            version,
            "--definition-hash",
            hash,
        ],
    )
    .await;
    assert_eq!((code, ok["text"].as_str()), (0, Some("pinned")), "{ok}");
    let (code, stale) = python_client(
        addr,
        Some(TOKEN),
        &["invoke", "t__echo", "{}", "--definition-hash", "0000"],
    )
    .await;
    assert_eq!(code, 3);
    assert_eq!(stale["error"]["code"], "FAILED_PRECONDITION");
    assert_eq!(
        stale["error"]["details"][0]["reason"],
        "TOOL_DEFINITION_CHANGED"
    );

    // Streaming: progress in order, then the result.
    let (code, streamed) = python_client(addr, Some(TOKEN), &["stream", "t__progress", "{}"]).await;
    assert_eq!(code, 0, "{streamed}");
    let events = streamed["events"].as_array().unwrap();
    let progress: Vec<f64> = events
        .iter()
        .filter(|e| e["type"] == "progress")
        .map(|e| e["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(progress, [1.0, 2.0, 3.0]);
    assert_eq!(events.last().unwrap()["type"], "result");
    assert_eq!(events.last().unwrap()["text"], "progress done");

    // Watching: the current catalog arrives first.
    let (code, watched) = python_client(
        addr,
        Some(TOKEN),
        &["watch", "--count", "1", "--timeout", "10"],
    )
    .await;
    assert_eq!(code, 0, "{watched}");
    assert_eq!(
        watched["snapshots"][0]["catalog_version"],
        all["catalog_version"]
    );

    // Search: the file reader for a file question.
    let (code, found) = python_client(
        addr,
        Some(TOKEN),
        &["search", "show me what is in this file", "--limit", "2"],
    )
    .await;
    assert_eq!(code, 0, "{found}");
    assert_eq!(found["results"][0]["name"], "t__read_file", "{found}");
    assert!(found["results"].as_array().unwrap().len() <= 2);
    gateway.shutdown().await;
}
