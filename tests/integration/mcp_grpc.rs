//! MCP's own gRPC transport (`model_context_protocol.Mcp`, release 0.2.0)
//! served beside `toolgate.v1`: a Python client written only with the
//! published `mcp-grpc-transport-proto` stubs (`mcp_grpc_client.py`) lists
//! and calls the tenant's federated catalog (server-everything over stdio,
//! the Python `mcp` SDK's 2026-07-28 `input_server.py`, and a server of 300
//! tools for a long list) through toolgate: a call, a form question
//! answered through `input_responses`, a prompt, a listed and a templated
//! resource, completions; and what must be refused: a routing header that
//! names another tool, a forged `resume_data`, a tampered `request_state`,
//! a tool the policy denies, a call without a token. The calls are
//! audited like `toolgate.v1`'s; health and reflection list the service,
//! and `grpc.mcp_transport: false` turns it off.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

const TOKEN: &str = "acme-token";

/// Tenant `acme`: server-everything (stdio), the input server (stdio,
/// 2026-07-28) and `many` (300 tools); `everything__get-env` denied.
fn yaml(many: &McpServer, audit: &Path, extra: &str) -> String {
    format!(
        "{extra}audit:\n  path: \"{}\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      \
         - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n      \
         - name: input\n        lifecycle: discover\n        command: [\"{}\", \"{}\", \"stdio\"]\n      \
         - name: many\n        url: \"{}\"\n    policy:\n      - deny: \"everything__get-env\"\n",
        audit.display(),
        node().display(),
        everything_js().display(),
        python().display(),
        fixture("python/input_server.py").display(),
        many.url
    )
}

fn many_tools() -> Vec<String> {
    (0..300).map(|i| format!("tool_{i:03}")).collect()
}

/// Waits (bounded) until `records` holds one that `wanted` picks.
async fn audited(path: &Path, wanted: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let found = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|r| wanted(r));
        if let Some(found) = found {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no such audit record in {}",
            std::fs::read_to_string(path).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn refused<'a>(step: &'a Value, code: &str, reason: &str) -> &'a Value {
    let refusal = &step["refused"];
    assert_eq!(refusal["code"], code, "{step}");
    assert_eq!(refusal["reason"], reason, "{step}");
    refusal
}

#[tokio::test]
async fn a_client_of_the_published_stubs_uses_the_tenants_catalog_through_toolgate() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let tools = many_tools();
    let tools: Vec<&str> = tools.iter().map(String::as_str).collect();
    let many = serve_mcp(TestServer::new(&tools)).await;
    let gateway = TestGateway::start(&yaml(&many, &audit, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "everything__echo").await;
    wait_listed(&mut client, TOKEN, "input__book_table").await;

    let output = tokio::process::Command::new(python())
        .arg(fixture("python/mcp_grpc_client.py"))
        .args([gateway.addr.to_string(), TOKEN.to_owned()])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();

    // The long list: every tool the caller may see, by exposed name, in
    // one response; the denied one is not there.
    let listed = &out["list_tools"];
    let listed_names: Vec<&str> = listed["names"]
        .as_array()
        .unwrap_or_else(|| panic!("{out}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let v1 = list(&mut client, TOKEN).await;
    assert_eq!(listed_names, names(&v1), "the same view as toolgate.v1");
    assert!(listed_names.len() > 300, "{}", listed_names.len());
    assert!(listed_names.contains(&"many__tool_299"));
    assert!(!listed_names.contains(&"everything__get-env"));
    assert_eq!(listed["echo_server"], "everything");
    assert_eq!(listed["echo_schema"]["type"], "object", "{listed}");
    assert!(listed["echo_schema"]["properties"]["message"].is_object());
    assert_eq!(listed["result_type"], "RESULT_TYPE_COMPLETE");

    assert_eq!(out["call"]["texts"][0], "Echo: hi over grpc", "{out}");
    assert_eq!(out["call"]["is_error"], false);

    let mismatch = refused(
        &out["header_mismatch"],
        "INVALID_ARGUMENT",
        "ROUTING_HEADER_MISMATCH",
    );
    assert!(
        mismatch["message"].as_str().unwrap().contains("mcp_tool"),
        "{mismatch}"
    );
    refused(&out["denied"], "PERMISSION_DENIED", "TOOL_NOT_PERMITTED");
    assert_eq!(
        out["no_token"]["refused"]["code"], "UNAUTHENTICATED",
        "{out}"
    );

    let question = &out["question"];
    assert_eq!(question["message"], "Book a table at Noma?", "{question}");
    assert_eq!(
        question["fields"],
        serde_json::json!(["confirm", "date", "party_size"])
    );
    assert_eq!(question["party_size_is_integer"], true);
    assert_eq!(question["state_prefix"], "tgs1.");
    assert_eq!(
        question["answered"][0], "booked Noma: party_size=4 date=2026-12-24 confirm=true",
        "{question}"
    );
    assert_eq!(question["answered_type"], "RESULT_TYPE_COMPLETE");
    refused(
        &question["forged_resume_data"],
        "INVALID_ARGUMENT",
        "MCP_REQUEST_INVALID",
    );
    let tampered = &question["tampered_state"]["refused"];
    assert_eq!(tampered["code"], "INVALID_ARGUMENT", "{question}");
    assert_eq!(tampered["reason"], "REQUEST_STATE_INVALID", "{question}");

    let other = &out["other_questions"];
    assert_eq!(other["url"], "https://example.com/consent", "{out}");
    assert_eq!(other["url_message"], "Open the link to continue");
    assert_eq!(other["opened"], serde_json::json!(["accept"]));
    assert_eq!(
        other["sampling_text"],
        serde_json::json!(["Summarise: a long report"])
    );
    assert_eq!(other["sampling_max_tokens"], 100);
    assert_eq!(other["summarised"], serde_json::json!(["short"]));

    let prompts = &out["prompts"];
    assert!(
        prompts["names"]
            .as_array()
            .unwrap_or_else(|| panic!("{out}"))
            .contains(&Value::from("everything__args-prompt")),
        "{prompts}"
    );
    assert_eq!(
        prompts["messages"],
        serde_json::json!([["ROLE_USER", "What's weather in Paris, TX?"]])
    );

    let resources = &out["resources"];
    assert!(
        resources["count"]
            .as_u64()
            .unwrap_or_else(|| panic!("{out}"))
            > 0
    );
    assert_eq!(resources["servers"], serde_json::json!(["everything"]));
    assert!(
        resources["templates"]
            .as_array()
            .unwrap()
            .contains(&Value::from("demo://resource/dynamic/text/{resourceId}")),
        "{resources}"
    );
    assert!(resources["static_text_length"].as_u64().unwrap() > 0);
    assert!(
        resources["dynamic_text"].as_str().unwrap().contains('7'),
        "{resources}"
    );
    assert_eq!(resources["named_text"], resources["dynamic_text"]);

    assert_eq!(
        out["complete"]["prompt"],
        serde_json::json!(["Marketing"]),
        "{out}"
    );
    assert!(
        !out["complete"]["template"].as_array().unwrap().is_empty(),
        "{out}"
    );

    // Audited as toolgate.v1's calls are, under the transport's RPC names;
    // a refusal before the pipeline by the refusal layer.
    let call = audited(&audit, |r| {
        r["rpc"] == "Mcp/CallTool" && r["tool"] == "everything__echo" && r["outcome"] == "ok"
    })
    .await;
    assert_eq!(call["tenant"], "acme");
    audited(&audit, |r| {
        r["rpc"] == "Mcp/CallTool" && r["reason"] == "ROUTING_HEADER_MISMATCH"
    })
    .await;
    audited(&audit, |r| {
        r["rpc"] == "Mcp/GetPrompt" && r["outcome"] == "ok"
    })
    .await;
    audited(&audit, |r| {
        r["rpc"] == "Mcp/ReadResource" && r["outcome"] == "ok"
    })
    .await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn health_lists_the_transport_and_one_switch_turns_it_off() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let many = serve_mcp(TestServer::new(&["one"])).await;
    for (extra, served) in [("", true), ("grpc:\n  mcp_transport: false\n", false)] {
        let gateway = TestGateway::start(&yaml(&many, &audit, extra), &[]).await;
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", gateway.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let health = HealthClient::new(channel.clone())
            .check(HealthCheckRequest {
                service: "model_context_protocol.Mcp".into(),
            })
            .await;
        let mut mcp = toolgate::pb::mcp::mcp_client::McpClient::new(channel);
        let listed = mcp
            .list_tools(authed(
                TOKEN,
                toolgate::pb::mcp::ListToolsRequest::default(),
            ))
            .await;
        if served {
            assert_eq!(
                health.unwrap().into_inner().status,
                ServingStatus::Serving as i32
            );
            let listed = listed.unwrap().into_inner();
            assert!(
                listed.tools.iter().any(|t| t.name == "many__one"),
                "{listed:?}"
            );
        } else {
            assert_eq!(health.unwrap_err().code(), tonic::Code::NotFound);
            assert_eq!(listed.unwrap_err().code(), tonic::Code::Unimplemented);
        }
        gateway.shutdown().await;
    }
}
