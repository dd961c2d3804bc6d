//! Guards (`guards:`, docs/guards.md) end to end: a Python guard
//! (`tests/fixtures/python/guard_server.py`, grpcio) in front of an
//! in-process MCP server, through an in-process gateway. Allow, deny and
//! replace in both phases; the replacement seen by the caller and the
//! audit record; a denial's reason bounded and redacted; a slow guard and
//! a guard that is down, with `failure: closed` and `open`; the order of a
//! tenant's and a server's guards; what the guard is told.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tonic::Code;
use tonic_types::StatusExt;
use toolgate::pb;

use crate::common::*;

/// The tenant whose guards are `first` (tenant) then `second` (server).
const ACME: &str = "acme-token";
/// A tenant whose guard is slow: `slow-closed`, 300 ms, `failure: closed`.
const SLOW_CLOSED: &str = "slow-closed-token";
/// `slow-open`: 300 ms, `failure: open`.
const SLOW_OPEN: &str = "slow-open-token";
/// `down-closed`: nothing listens, `failure: closed`.
const DOWN_CLOSED: &str = "down-closed-token";
/// `down-open`: nothing listens, `failure: open`.
const DOWN_OPEN: &str = "down-open-token";
/// A configured credential (the server's header), which no reason may show.
const SECRET: &str = "sk-guard-7c1e2d3f4a5b6c7d8e9f";
/// The bearer token toolgate sends to guard `first`.
const GUARD_TOKEN: &str = "guard-bearer-1f2e3d";

/// A running guard fixture.
pub(crate) struct GuardFixture {
    _child: ChildGuard,
    pub(crate) port: u16,
    record: PathBuf,
}

/// Starts `guard_server.py` with `args`, recording into `dir`.
pub(crate) fn start_guard(dir: &Path, args: &[&str]) -> GuardFixture {
    let record = dir.join(format!("guard-{}.jsonl", fastrand::u32(..)));
    let mut child = Command::new(python())
        .arg(fixture("python/guard_server.py"))
        .args(["--port", "0", "--record"])
        .arg(&record)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start guard_server.py");
    let stdout = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("PORT ")
        .unwrap_or_else(|| panic!("guard_server.py printed {line:?}"))
        .parse()
        .unwrap();
    GuardFixture {
        _child: guard,
        port,
        record,
    }
}

/// The checks a guard fixture recorded.
pub(crate) fn checks(guard: &GuardFixture) -> Vec<serde_json::Value> {
    std::fs::read_to_string(&guard.record)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The call records of an audit file.
fn call_records(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "call")
        .collect()
}

struct Setup {
    gateway: TestGateway,
    guard: GuardFixture,
    _server: McpServer,
    audit: PathBuf,
    metrics_port: u16,
    _dir: tempfile::TempDir,
}

/// One gateway with a tenant per guard setup, each on the same MCP
/// server (`t__echo` answers `arguments.text`).
async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let guard = start_guard(dir.path(), &[]);
    let server = serve_mcp(TestServer::new(&["echo", "other"])).await;
    let audit = dir.path().join("audit.jsonl");
    let metrics_port = free_port();
    let dead = free_port();
    let g = guard.port;
    let url = &server.url;
    let tenant = |name: &str, token: &str, tenant_guards: &str, server_guards: &str| {
        format!(
            "  - name: {name}\n    tokens: [{token}]\n    guards: [{tenant_guards}]\n    servers:\n      - name: t\n        url: \"{url}\"\n        guards: [{server_guards}]\n        headers:\n          X-Api-Key: {{ env: API_KEY }}\n"
        )
    };
    let yaml = format!(
        "metrics:\n  listen: 127.0.0.1:{metrics_port}\naudit:\n  path: \"{audit}\"\nguards:\n  - name: first\n    url: http://127.0.0.1:{g}\n    token: {GUARD_TOKEN}\n  - name: second\n    url: http://127.0.0.1:{g}\n  - name: slow-closed\n    url: http://127.0.0.1:{g}\n    timeout: 300ms\n  - name: slow-open\n    url: http://127.0.0.1:{g}\n    timeout: 300ms\n    failure: open\n  - name: down-closed\n    url: http://127.0.0.1:{dead}\n    timeout: 500ms\n    failure: closed\n  - name: down-open\n    url: http://127.0.0.1:{dead}\n    timeout: 500ms\n    failure: open\ntenants:\n{}{}{}{}{}",
        tenant("acme", ACME, "first", "second, first"),
        tenant("slowc", SLOW_CLOSED, "", "slow-closed"),
        tenant("slowo", SLOW_OPEN, "slow-open", ""),
        tenant("downc", DOWN_CLOSED, "down-closed", ""),
        tenant("downo", DOWN_OPEN, "", "down-open"),
        audit = audit.display(),
    );
    let gateway = TestGateway::start(&yaml, &[("API_KEY", SECRET)]).await;
    let mut client = gateway.client().await;
    for token in [ACME, SLOW_CLOSED, SLOW_OPEN, DOWN_CLOSED, DOWN_OPEN] {
        wait_listed(&mut client, token, "t__echo").await;
    }
    Setup {
        gateway,
        guard,
        _server: server,
        audit,
        metrics_port,
        _dir: dir,
    }
}

/// The text of a call's result.
fn text(response: &pb::InvokeToolResponse) -> &str {
    &response.text
}

/// `{"text": text}` as arguments.
fn args(text: &str) -> String {
    serde_json::json!({ "text": text }).to_string()
}

/// The `ErrorInfo` metadata of a status.
fn info(status: &tonic::Status) -> std::collections::HashMap<String, String> {
    status
        .get_details_error_info()
        .map(|i| i.metadata)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_and_replace_in_both_phases_in_the_chains_order() {
    let setup = setup().await;
    let mut client = setup.gateway.client().await;

    // Allowed: both guards asked in both phases, the answer unchanged.
    let allowed = invoke(&mut client, ACME, "t__echo", &args("hello"))
        .await
        .expect("allowed");
    assert_eq!(text(&allowed), "hello");
    let asked = checks(&setup.guard);
    let order: Vec<(String, String)> = asked
        .iter()
        .map(|c| {
            (
                c["phase"].as_str().unwrap().to_owned(),
                c["guard"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    // The tenant's `first`, then the server's `second` (its `first` is
    // already listed), in both phases.
    assert_eq!(
        order,
        pairs(&[
            ("PHASE_REQUEST", "first"),
            ("PHASE_REQUEST", "second"),
            ("PHASE_RESPONSE", "first"),
            ("PHASE_RESPONSE", "second"),
        ])
    );
    // What a guard is told.
    let first = &asked[0];
    assert_eq!(first["tenant"], "acme");
    assert_eq!(first["target"]["kind"], "TARGET_KIND_TOOL");
    assert_eq!(first["target"]["name"], "t__echo");
    assert_eq!(first["target"]["server"], "t");
    assert_eq!(first["target"]["upstream_name"], "echo");
    let listed = list(&mut client, ACME).await;
    let hash = &listed
        .tools
        .iter()
        .find(|t| t.name == "t__echo")
        .unwrap()
        .definition_hash;
    assert_eq!(first["target"]["definition_hash"], hash.as_str());
    assert_eq!(first["subject"]["caller"], "CALLER_KIND_TOKEN");
    assert_eq!(first["arguments_json"], args("hello"));
    assert_eq!(first["result_json"], "");
    assert_eq!(first["authorization"], format!("Bearer {GUARD_TOKEN}"));
    assert_eq!(asked[1]["authorization"], "", "second has no token");
    let call_id = first["call_id"].as_str().unwrap();
    assert_eq!(call_id.len(), 32);
    assert!(asked.iter().all(|c| c["call_id"] == call_id));
    let result: serde_json::Value =
        serde_json::from_str(asked[2]["result_json"].as_str().unwrap()).unwrap();
    assert_eq!(result["content"][0]["text"], "hello");

    // Replaced in the request phase by both, in order: the server got
    // (and echoed) the replacement.
    let replaced = invoke(&mut client, ACME, "t__echo", &args("REPLACE-ME"))
        .await
        .expect("replaced arguments");
    assert_eq!(text(&replaced), "REPLACE-ME>first>second");

    // Replaced in the response phase by both: the caller sees it.
    let replaced = invoke(&mut client, ACME, "t__echo", &args("REPLACE-RESULT"))
        .await
        .expect("replaced result");
    assert_eq!(text(&replaced), "REPLACE-RESULT>first>second");

    // The audit records say which guards acted, and describe what was
    // handed out.
    let records = call_records(&setup.audit);
    let last = records.last().unwrap();
    assert_eq!(last["v"], 8);
    let guards = last["guards"].as_array().unwrap();
    let acted: Vec<(String, String, String)> = guards
        .iter()
        .map(|g| {
            (
                g["guard"].as_str().unwrap().to_owned(),
                g["phase"].as_str().unwrap().to_owned(),
                g["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        acted,
        vec![
            ("first".into(), "request".into(), "allow".into()),
            ("second".into(), "request".into(), "allow".into()),
            ("first".into(), "response".into(), "replace".into()),
            ("second".into(), "response".into(), "replace".into()),
        ]
    );
    let handed_out = prost::Message::encoded_len(&replaced) as u64;
    assert_eq!(last["bytes"], handed_out);
    // The request-phase replacement's arguments are on the record too.
    let earlier = &records[records.len() - 2];
    let request_replace = earlier["guards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["phase"] == "request" && g["verdict"] == "replace")
        .collect::<Vec<_>>();
    assert_eq!(request_replace.len(), 2);
    assert!(request_replace[0].get("arguments").is_none());
    assert_eq!(
        request_replace[1]["arguments"]["bytes"],
        args("REPLACE-ME>first>second").len()
    );
    assert_ne!(
        request_replace[1]["arguments"]["hmac_sha256"],
        earlier["arguments"]["hmac_sha256"]
    );

    // Metrics: each check by guard, phase and verdict.
    let page = scrape(setup.metrics_port).await;
    assert_eq!(
        sample(
            &page,
            "toolgate_guard_checks_total{guard=\"first\",phase=\"response\",verdict=\"replace\"}"
        )
        .as_deref(),
        Some("1"),
        "{page}"
    );
    assert!(page.contains("toolgate_guard_check_seconds_count{guard=\"second\"}"));
    setup.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_refuses_the_call_with_the_guards_reason_bounded_and_redacted() {
    let setup = setup().await;
    let mut client = setup.gateway.client().await;

    // Request phase: nothing sent; the reason echoes the arguments, with a
    // configured secret, control characters and more than 256 bytes.
    let long = format!("DENY-ME \u{1b}[31m{SECRET} {}", "x".repeat(600));
    let denied = invoke(&mut client, ACME, "t__echo", &args(&long))
        .await
        .expect_err("denied");
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert_eq!(reason(&denied), "GUARD_DENIED");
    let meta = info(&denied);
    assert_eq!(meta["guard"], "first");
    assert_eq!(meta["phase"], "request");
    assert_eq!(meta["tool"], "t__echo");
    assert_eq!(meta["server"], "t");
    let guard_reason = &meta["guard_reason"];
    assert!(
        guard_reason.starts_with("first refused: "),
        "{guard_reason}"
    );
    assert!(guard_reason.len() <= 256, "{}", guard_reason.len());
    assert!(!guard_reason.contains(SECRET), "{guard_reason}");
    assert!(guard_reason.contains("[redacted]"), "{guard_reason}");
    assert!(
        !guard_reason.chars().any(char::is_control),
        "{guard_reason:?}"
    );
    assert!(
        denied
            .message()
            .contains("guard `first` denied the request")
    );
    assert!(!denied.message().contains(SECRET));
    // Only `first` was asked: a denial stops the chain.
    let asked = checks(&setup.guard);
    assert_eq!(asked.len(), 1, "{asked:?}");

    // Response phase: the result is withheld.
    let denied = invoke(&mut client, ACME, "t__echo", &args("DENY-RESULT"))
        .await
        .expect_err("result denied");
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert_eq!(reason(&denied), "GUARD_DENIED");
    assert_eq!(info(&denied)["phase"], "response");

    let records = call_records(&setup.audit);
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["outcome"], "refused");
    assert_eq!(records[0]["sent"], false);
    assert_eq!(records[0]["reason"], "GUARD_DENIED");
    assert_eq!(records[0]["guards"][0]["verdict"], "deny");
    assert_eq!(records[1]["outcome"], "failed");
    assert_eq!(records[1]["sent"], true);
    assert_eq!(records[1]["guards"][2]["verdict"], "deny");
    assert_eq!(records[1]["guards"].as_array().unwrap().len(), 3);

    // A guard whose error echoes a configured secret and its own token:
    // the worker's status carries neither.
    let failed = invoke(
        &mut client,
        ACME,
        "t__echo",
        &args(&format!("FAIL-ECHO {SECRET}")),
    )
    .await
    .expect_err("the guard failed");
    assert_eq!(failed.code(), Code::Unavailable, "{failed:?}");
    assert_eq!(reason(&failed), "GUARD_UNAVAILABLE");
    assert!(failed.message().contains("cannot judge"), "{failed:?}");
    assert!(!failed.message().contains(SECRET), "{failed:?}");
    assert!(!failed.message().contains(GUARD_TOKEN), "{failed:?}");
    assert!(failed.message().contains("[redacted]"), "{failed:?}");
    setup.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_down_guard_fails_closed_or_open_as_configured() {
    let setup = setup().await;
    let mut client = setup.gateway.client().await;

    // Slow, closed: UNAVAILABLE with RetryInfo, nothing sent.
    let started = std::time::Instant::now();
    let late = invoke(&mut client, SLOW_CLOSED, "t__echo", &args("SLOW-ME"))
        .await
        .expect_err("late guard");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the deadline holds"
    );
    assert_eq!(late.code(), Code::Unavailable);
    assert_eq!(reason(&late), "GUARD_UNAVAILABLE");
    assert!(late.get_details_retry_info().is_some());
    assert_eq!(info(&late)["guard"], "slow-closed");
    assert!(
        late.message().contains("no verdict within"),
        "{}",
        late.message()
    );

    // Slow, open: the call goes on as if allowed.
    let through = invoke(&mut client, SLOW_OPEN, "t__echo", &args("SLOW-ME"))
        .await
        .expect("failed open");
    assert_eq!(text(&through), "SLOW-ME");

    // Down, closed and open.
    let down = invoke(&mut client, DOWN_CLOSED, "t__echo", &args("hi"))
        .await
        .expect_err("down guard");
    assert_eq!(down.code(), Code::Unavailable);
    assert_eq!(reason(&down), "GUARD_UNAVAILABLE");
    assert_eq!(info(&down)["phase"], "request");
    let through = invoke(&mut client, DOWN_OPEN, "t__echo", &args("hi"))
        .await
        .expect("failed open");
    assert_eq!(text(&through), "hi");

    // A guard that answers nonsense fails too: no verdict, the wrong
    // field, not JSON.
    for marker in ["NO-VERDICT", "WRONG-FIELD", "NOT-JSON"] {
        let failed = invoke(&mut client, ACME, "t__echo", &args(marker))
            .await
            .expect_err(marker);
        assert_eq!(reason(&failed), "GUARD_UNAVAILABLE", "{marker}");
    }

    let page = scrape(setup.metrics_port).await;
    for (guard, verdict) in [
        ("slow-closed", "failed_closed"),
        ("slow-open", "failed_open"),
        ("down-closed", "failed_closed"),
        ("down-open", "failed_open"),
    ] {
        let series = format!(
            "toolgate_guard_checks_total{{guard=\"{guard}\",phase=\"request\",verdict=\"{verdict}\"}}"
        );
        assert!(
            sample(&page, &series).is_some(),
            "{series} missing:\n{page}"
        );
    }
    let open_both: u64 = ["request", "response"]
        .iter()
        .filter_map(|phase| {
            sample(
                &page,
                &format!(
                    "toolgate_guard_checks_total{{guard=\"down-open\",phase=\"{phase}\",verdict=\"failed_open\"}}"
                ),
            )
        })
        .map(|v| v.parse::<u64>().unwrap())
        .sum();
    assert_eq!(open_both, 2, "down-open failed open in both phases");
    let records = call_records(&setup.audit);
    let down_open = records
        .iter()
        .find(|r| r["tenant"] == "downo")
        .expect("down-open's record");
    assert_eq!(down_open["outcome"], "ok");
    assert_eq!(down_open["guards"][0]["verdict"], "failed_open");
    setup.gateway.shutdown().await;
}

/// The text of every text block of a prompt's messages, joined.
fn prompt_text(response: &pb::GetPromptResponse) -> String {
    response
        .messages
        .iter()
        .filter_map(|m| match m.content.as_ref()?.kind.as_ref()? {
            pb::content::Kind::Text(t) => Some(t.text.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The result event of an InvokeToolStream or InvokeToolInteractive.
async fn result_event(
    mut events: tonic::Streaming<pb::InvokeToolEvent>,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    for _ in 0..100 {
        let event = tokio::time::timeout(Duration::from_secs(30), events.message())
            .await
            .expect("an event within 30 s")?;
        match event.and_then(|e| e.event) {
            Some(pb::invoke_tool_event::Event::Result(result)) => return Ok(result),
            Some(_) => continue,
            None => panic!("the stream ended without a result"),
        }
    }
    panic!("no result within 100 events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_interactive_calls_reads_and_prompts_are_guarded() {
    let dir = tempfile::tempdir().unwrap();
    let guard = start_guard(dir.path(), &[]);
    let echo = serve_mcp(TestServer::new(&["echo"])).await;
    let python = python();
    let yaml = format!(
        "guards:\n  - name: first\n    url: http://127.0.0.1:{port}\ntenants:\n  - name: acme\n    tokens: [{ACME}]\n    guards: [first]\n    servers:\n      - name: t\n        url: \"{url}\"\n      - name: p\n        command: [\"{py}\", \"{prompts}\", \"stdio\"]\n      - name: r\n        command: [\"{py}\", \"{resources}\", \"stdio\"]\n        env:\n          RESOURCES_TAG: REPLACE-RESULT\n",
        port = guard.port,
        url = echo.url,
        py = python.display(),
        prompts = fixture("python/prompts_server.py").display(),
        resources = fixture("python/resources_server.py").display(),
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, ACME, "t__echo").await;
    let call = |text: &str| pb::InvokeToolRequest {
        name: "t__echo".into(),
        arguments_json: args(text),
        ..Default::default()
    };

    // InvokeToolStream: the final result is guarded in both phases.
    let events = client
        .invoke_tool_stream(authed(ACME, call("REPLACE-ME REPLACE-RESULT")))
        .await
        .expect("stream opens")
        .into_inner();
    let result = result_event(events).await.expect("streamed result");
    assert_eq!(result.text, "REPLACE-ME>first REPLACE-RESULT>first");
    let events = client
        .invoke_tool_stream(authed(ACME, call("DENY-ME")))
        .await;
    let denied = match events {
        Ok(events) => result_event(events.into_inner()).await.expect_err("denied"),
        Err(status) => status,
    };
    assert_eq!(reason(&denied), "GUARD_DENIED");

    // InvokeToolInteractive: the same.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::InteractiveRequest {
        message: Some(pb::interactive_request::Message::Call(call(
            "REPLACE-RESULT",
        ))),
    })
    .await
    .unwrap();
    let events = client
        .invoke_tool_interactive(authed(
            ACME,
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .await
        .expect("interactive opens")
        .into_inner();
    let result = result_event(events).await.expect("interactive result");
    assert_eq!(result.text, "REPLACE-RESULT>first");
    drop(tx);

    // ReadResource: the response phase sees the ReadResourceResult.
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match client
                .read_resource(authed(
                    ACME,
                    pb::ReadResourceRequest {
                        server: "r".into(),
                        uri: "fixture://text".into(),
                        ..Default::default()
                    },
                ))
                .await
            {
                Ok(read) => break read.into_inner(),
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(status) => panic!("ReadResource: {status:?}"),
            }
        }
    })
    .await
    .expect("the resources server connects");
    let Some(pb::resource_contents::Data::Text(text)) = &read.contents[0].data else {
        panic!("text contents: {read:?}");
    };
    assert_eq!(text, "hello from REPLACE-RESULT>first");

    // GetPrompt: arguments replaced in the request phase, messages in the
    // response phase; a denial refuses it.
    let prompt = |code: &str| {
        authed(
            ACME,
            pb::GetPromptRequest {
                name: "p__review".into(),
                arguments: [("code".to_owned(), code.to_owned())].into(),
                ..Default::default()
            },
        )
    };
    let rendered = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match client.get_prompt(prompt("REPLACE-ME REPLACE-RESULT")).await {
                Ok(rendered) => break rendered.into_inner(),
                Err(status) if matches!(status.code(), Code::Unavailable | Code::NotFound) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(status) => panic!("GetPrompt: {status:?}"),
            }
        }
    })
    .await
    .expect("the prompts server connects");
    assert!(
        prompt_text(&rendered).contains("REPLACE-ME>first REPLACE-RESULT>first"),
        "{rendered:?}"
    );
    let denied = client
        .get_prompt(prompt("DENY-ME"))
        .await
        .expect_err("prompt denied");
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert_eq!(reason(&denied), "GUARD_DENIED");
    assert_eq!(info(&denied)["prompt"], "p__review");

    // What the guard was told about the read and the prompt.
    let asked = checks(&guard);
    let read_check = asked
        .iter()
        .find(|c| c["target"]["kind"] == "TARGET_KIND_RESOURCE" && c["phase"] == "PHASE_REQUEST")
        .expect("the read was checked");
    assert_eq!(read_check["arguments_json"], "{}");
    assert_eq!(read_check["target"]["name"], "fixture://text");
    assert_eq!(read_check["target"]["server"], "r");
    assert_eq!(read_check["target"]["definition_hash"], "");
    let prompt_check = asked
        .iter()
        .find(|c| c["target"]["kind"] == "TARGET_KIND_PROMPT" && c["phase"] == "PHASE_REQUEST")
        .expect("the prompt was checked");
    assert_eq!(prompt_check["target"]["upstream_name"], "review");
    let prompt_args: serde_json::Value =
        serde_json::from_str(prompt_check["arguments_json"].as_str().unwrap()).unwrap();
    assert_eq!(prompt_args["code"], "REPLACE-ME REPLACE-RESULT");
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_and_removes_guards_for_new_calls_only() {
    let dir = tempfile::tempdir().unwrap();
    let guard = start_guard(dir.path(), &[]);
    let echo = serve_mcp(TestServer::new(&["echo"])).await;
    let port = free_port();
    let path = dir.path().join("toolgate.yaml");
    let config = |tenant_guards: &str| {
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nguards:\n  - name: first\n    url: http://127.0.0.1:{g}\n    timeout: 15s\ntenants:\n  - name: acme\n    tokens: [{ACME}]\n    guards: [{tenant_guards}]\n    servers:\n      - name: t\n        url: \"{url}\"\n",
            g = guard.port,
            url = echo.url,
        )
    };
    std::fs::write(&path, config("")).unwrap();
    let gateway = serve_binary(&path, &dir.path().join("gateway.log"), &[]);
    let pid = gateway.0.id();
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    wait_listed(&mut client, ACME, "t__echo").await;
    let unguarded = invoke(&mut client, ACME, "t__echo", &args("REPLACE-RESULT"))
        .await
        .unwrap();
    assert_eq!(unguarded.text, "REPLACE-RESULT");

    // A reload adds the tenant's guard: new calls are guarded.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, config("first")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    signal(pid, "HUP");
    let mut guarded = false;
    for _ in 0..100 {
        let answer = invoke(&mut client, ACME, "t__echo", &args("REPLACE-RESULT"))
            .await
            .unwrap();
        if answer.text == "REPLACE-RESULT>first" {
            guarded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(guarded, "the reload's guard never acted");

    // A call in flight (its guard slow in the request phase) while a
    // reload removes the guard: it finishes with the chain it started
    // with; a new call is no longer guarded.
    let asked_before = checks(&guard).len();
    let mut slow_client = client.clone();
    let in_flight = tokio::spawn(async move {
        invoke(
            &mut slow_client,
            ACME,
            "t__echo",
            &args("SLOW-ME REPLACE-RESULT"),
        )
        .await
    });
    for _ in 0..100 {
        if checks(&guard).len() > asked_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        checks(&guard).len() > asked_before,
        "the slow call reached its guard"
    );
    std::fs::write(&tmp, config("")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    signal(pid, "HUP");
    let mut unguarded = false;
    for _ in 0..100 {
        let answer = invoke(&mut client, ACME, "t__echo", &args("REPLACE-RESULT"))
            .await
            .unwrap();
        if answer.text == "REPLACE-RESULT" {
            unguarded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(unguarded, "the reload never removed the guard");
    let finished = tokio::time::timeout(Duration::from_secs(30), in_flight)
        .await
        .expect("the call in flight finishes")
        .unwrap()
        .expect("the call in flight succeeds");
    assert_eq!(finished.text, "SLOW-ME REPLACE-RESULT>first");
    signal(pid, "TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_result_is_guarded_when_get_task_delivers_it() {
    let dir = tempfile::tempdir().unwrap();
    let guard = start_guard(dir.path(), &[]);
    let yaml = format!(
        "state:\n  url: \"sqlite://{state}/state.db\"\nguards:\n  - name: first\n    url: http://127.0.0.1:{port}\ntenants:\n  - name: acme\n    tokens: [{ACME}]\n    servers:\n      - name: tasks\n        command: [\"{py}\", \"{script}\", \"stdio\"]\n        lifecycle: discover\n        guards: [first]\n",
        state = dir.path().display(),
        port = guard.port,
        py = python().display(),
        script = fixture("python/tasks_server.py").display(),
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, ACME, "tasks__optional_task").await;
    let started = client
        .invoke_tool(authed(
            ACME,
            pb::InvokeToolRequest {
                name: "tasks__optional_task".into(),
                arguments_json: args("REPLACE-ME REPLACE-RESULT"),
                accepts_task: true,
                ..Default::default()
            },
        ))
        .await
        .expect("a task")
        .into_inner();
    let task = *started.task.expect("the call answers a task");
    let mut done = None;
    for _ in 0..200 {
        let got = client
            .get_task(authed(
                ACME,
                pb::GetTaskRequest {
                    task_id: task.task_id.clone(),
                },
            ))
            .await
            .expect("GetTask")
            .into_inner();
        if got.status == pb::TaskStatus::Completed as i32 {
            done = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = done.expect("the task completes within 20 s");
    // The request phase replaced the arguments when the call started; the
    // response phase the result GetTask delivers.
    assert_eq!(
        done.result.expect("its result").text,
        "done: REPLACE-ME>first REPLACE-RESULT>first"
    );
    let asked = checks(&guard);
    let response = asked
        .iter()
        .find(|c| c["phase"] == "PHASE_RESPONSE")
        .expect("the result was checked");
    assert_eq!(response["target"]["name"], "tasks__optional_task");
    assert_eq!(response["call_id"].as_str().unwrap().len(), 16);
    gateway.shutdown().await;
}
