//! Questions of servers over `InvokeToolInteractive`, against the Python
//! `mcp` SDK (`input_server.py`: 2025-11-25 sends `elicitation/create` and
//! `sampling/createMessage` mid-call; 2026-07-28 answers `input_required`)
//! over stdio and HTTP, and server-everything: one worker loop for both
//! eras; unary calls refused with INPUT_REQUIRES_INTERACTIVE; calls that
//! did not opt in never answered; questions tied to the right call or
//! refused; a worker that goes away, or answers too late, cancels the call.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "acme-token";

/// An input_server.py over HTTP on a free port, logging to `log`.
async fn input_server_http(log: &Path) -> (ChildGuard, u16) {
    let port = free_port();
    let child = std::process::Command::new(python())
        .arg(fixture("python/input_server.py"))
        .arg("http")
        .arg(port.to_string())
        .env_clear()
        .env("INPUT_SERVER_LOG", log)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start input_server.py http");
    let guard = ChildGuard(child);
    wait_for_port(port).await;
    (guard, port)
}

/// `servers[].input` of a 2025-11-25 server: the Python SDK asks only a
/// session that declared elicitation and sampling at `initialize`.
const DECLARED: &str = "        input:\n          declare_on_session: true\n";

/// A stdio server entry of input_server.py named `name`.
fn stdio_server(name: &str, lifecycle: &str, log: &Path, input: &str) -> String {
    format!(
        "      - name: {name}\n        command: [\"{}\", \"{}\", \"stdio\"]\n        lifecycle: {lifecycle}\n        env:\n          INPUT_SERVER_LOG: \"{}\"\n{input}",
        python().display(),
        fixture("python/input_server.py").display(),
        log.display(),
    )
}

/// An HTTP server entry named `name` at `port`.
fn http_server(name: &str, lifecycle: &str, port: u16, input: &str) -> String {
    format!(
        "      - name: {name}\n        url: \"http://127.0.0.1:{port}/mcp\"\n        lifecycle: {lifecycle}\n{input}"
    )
}

fn config(servers: &[String]) -> String {
    format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{}",
        servers.concat()
    )
}

fn every_kind() -> pb::InputCapabilities {
    pb::InputCapabilities {
        form: true,
        url: true,
        sampling: true,
    }
}

fn call(name: &str, args: Value, accepts: Option<pb::InputCapabilities>) -> pb::InvokeToolRequest {
    pb::InvokeToolRequest {
        name: name.to_owned(),
        arguments_json: args.to_string(),
        accepts_input: accepts,
        ..Default::default()
    }
}

fn response(id: &str, action: pb::InputAction, content: Value) -> pb::InputResponse {
    pb::InputResponse {
        id: id.to_owned(),
        action: action as i32,
        content_json: if content.is_null() {
            String::new()
        } else {
            content.to_string()
        },
    }
}

/// What a worker loop saw: every question, and how the call ended.
struct Worked {
    asked: Vec<pb::InputRequest>,
    result: Result<pb::InvokeToolResponse, tonic::Status>,
}

impl Worked {
    fn text(&self) -> String {
        match &self.result {
            Ok(r) => r.text.clone(),
            Err(status) => panic!("the call failed: {status:?}"),
        }
    }
}

/// Runs `request` over InvokeToolInteractive, answering each question
/// with `answer` (`None`: close the stream at once).
async fn interactive(
    client: &mut ToolGatewayClient<Channel>,
    request: pb::InvokeToolRequest,
    answer: impl FnMut(&pb::InputRequest) -> Option<pb::InputResponse>,
) -> Worked {
    interactive_paced(client, request, Pace::default(), answer).await
}

/// How a worker loop takes its time.
#[derive(Default, Clone, Copy)]
struct Pace {
    /// Thinking time before each answer.
    think: Duration,
    /// The call's gRPC deadline.
    deadline: Option<Duration>,
}

/// [`interactive`], thinking before each answer, with a deadline.
async fn interactive_paced(
    client: &mut ToolGatewayClient<Channel>,
    request: pb::InvokeToolRequest,
    pace: Pace,
    mut answer: impl FnMut(&pb::InputRequest) -> Option<pb::InputResponse>,
) -> Worked {
    let (tx, rx) = mpsc::channel(8);
    tx.send(pb::InteractiveRequest {
        message: Some(pb::interactive_request::Message::Call(request)),
    })
    .await
    .unwrap();
    let mut asked = Vec::new();
    let mut stream = authed(TOKEN, ReceiverStream::new(rx));
    if let Some(deadline) = pace.deadline {
        stream.set_timeout(deadline);
    }
    let events = client.invoke_tool_interactive(stream).await;
    let mut events = match events {
        Ok(events) => events.into_inner(),
        Err(status) => {
            return Worked {
                asked,
                result: Err(status),
            };
        }
    };
    let mut tx = Some(tx);
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.message())
            .await
            .expect("an event within 30 s");
        let event = match event {
            Ok(Some(event)) => event,
            Ok(None) => panic!("the stream ended without a result"),
            Err(status) => {
                return Worked {
                    asked,
                    result: Err(status),
                };
            }
        };
        match event.event {
            Some(pb::invoke_tool_event::Event::Result(result)) => {
                return Worked {
                    asked,
                    result: Ok(result),
                };
            }
            Some(pb::invoke_tool_event::Event::InputRequired(input)) => {
                assert!(input.request_state.is_empty(), "{input:?}");
                for request in input.requests {
                    let reply = answer(&request);
                    asked.push(request);
                    tokio::time::sleep(pace.think).await;
                    match (reply, &tx) {
                        (Some(reply), Some(sender)) => {
                            // The call may have ended meanwhile (its status
                            // follows).
                            let _ = sender
                                .send(pb::InteractiveRequest {
                                    message: Some(pb::interactive_request::Message::InputResponse(
                                        reply,
                                    )),
                                })
                                .await;
                        }
                        _ => {
                            // The worker goes away mid-question.
                            drop(tx.take());
                            drop(events);
                            return Worked {
                                asked,
                                result: Err(tonic::Status::cancelled("closed by the worker")),
                            };
                        }
                    }
                }
            }
            Some(pb::invoke_tool_event::Event::Progress(_)) | None => {}
            Some(pb::invoke_tool_event::Event::ApprovalPending(pending)) => {
                panic!("no policy here holds a call for approval: {pending:?}")
            }
        }
    }
}

/// The worker loop of the tests: accepts every question with values that
/// fit it (a form's fields by name; a URL opened; a sampling answered by a
/// model called `test-model`).
fn accept_all(request: &pb::InputRequest) -> Option<pb::InputResponse> {
    use pb::input_request::Kind;
    let content = match request.kind.as_ref().expect("a kind") {
        Kind::Form(form) => {
            let schema: Value = serde_json::from_str(&form.requested_schema_json).unwrap();
            let mut values = serde_json::Map::new();
            for name in schema["properties"].as_object().unwrap().keys() {
                let value = match name.as_str() {
                    "party_size" => json!(4),
                    "confirm" => json!(true),
                    "date" => json!("2026-12-31"),
                    other => json!(format!("my {other}")),
                };
                values.insert(name.clone(), value);
            }
            Value::Object(values)
        }
        Kind::Url(_) => Value::Null,
        Kind::Sampling(sampling) => {
            let params: Value = serde_json::from_str(&sampling.params_json).unwrap();
            let asked = params["messages"][0]["content"]["text"].as_str().unwrap();
            json!({"model": "test-model", "role": "assistant",
                   "content": {"type": "text", "text": format!("short: {asked}")}})
        }
    };
    Some(response(&request.id, pb::InputAction::Accept, content))
}

fn act(action: pb::InputAction) -> impl FnMut(&pb::InputRequest) -> Option<pb::InputResponse> {
    move |request| Some(response(&request.id, action, Value::Null))
}

/// The lines of an INPUT_SERVER_LOG.
fn log_lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits (bounded) until the log has a line that `found` accepts.
async fn wait_for_line(log: &Path, what: &str, found: impl Fn(&Value) -> bool) {
    for _ in 0..100 {
        if log_lines(log).iter().any(&found) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no {what} line in {}: {:?}", log.display(), log_lines(log));
}

fn cancelled_or_interrupted(line: &Value) -> bool {
    matches!(line["event"].as_str(), Some("cancelled" | "interrupted"))
}

fn temp_log(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(format!("{name}.jsonl"))
}

/// One worker loop, every tool, against both eras over stdio and HTTP.
#[tokio::test]
async fn one_worker_loop_answers_both_eras_over_stdio_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let (_http, port) = input_server_http(&temp_log(&dir, "http")).await;
    let (_http26, port26) = input_server_http(&temp_log(&dir, "http26")).await;
    let yaml = config(&[
        stdio_server("py", "initialize", &temp_log(&dir, "py"), DECLARED),
        http_server("web", "initialize", port, DECLARED),
        // Declared for the session, so that this module does not depend on
        // the per-call capabilities in `_meta` (input_unary.rs tests those).
        stdio_server("py26", "discover", &temp_log(&dir, "py26"), DECLARED),
        http_server("web26", "discover", port26, DECLARED),
    ]);
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    for server in ["py", "web", "py26", "web26"] {
        let tool = |name: &str| format!("{server}__{name}");
        let accepts = Some(every_kind());
        let booking = call(
            &tool("book_table"),
            json!({"restaurant": "Chez Rust"}),
            accepts,
        );
        let booked = interactive(&mut client, booking.clone(), accept_all).await;
        assert_eq!(
            booked.text(),
            "booked Chez Rust: party_size=4 date=2026-12-31 confirm=true",
            "{server}"
        );
        let Some(pb::input_request::Kind::Form(form)) = &booked.asked[0].kind else {
            panic!("{server}: a form: {:?}", booked.asked);
        };
        assert_eq!(form.message, "Book a table at Chez Rust?", "{server}");
        if !server.ends_with("26") {
            assert_eq!(booked.asked[0].id, "q1", "{server}");
        }
        let declined =
            interactive(&mut client, booking.clone(), act(pb::InputAction::Decline)).await;
        assert_eq!(declined.text(), "declined", "{server}");
        let cancelled = interactive(&mut client, booking, act(pb::InputAction::Cancel)).await;
        assert_eq!(cancelled.text(), "cancelled", "{server}");

        let link = call(
            &tool("open_link"),
            json!({"url": "https://example.com/pay"}),
            accepts,
        );
        let opened = interactive(&mut client, link, accept_all).await;
        assert_eq!(opened.text(), "accept", "{server}");
        let Some(pb::input_request::Kind::Url(url)) = &opened.asked[0].kind else {
            panic!("{server}: a URL: {:?}", opened.asked);
        };
        assert_eq!(url.url, "https://example.com/pay", "{server}");
        assert_eq!(url.message, "Open the link to continue", "{server}");

        let summary = call(&tool("summarise"), json!({"text": "a long story"}), accepts);
        let summarised = interactive(&mut client, summary, accept_all).await;
        assert_eq!(
            summarised.text(),
            "short: Summarise: a long story",
            "{server}"
        );

        let two = call(&tool("two_questions"), json!({}), accepts);
        let answered = interactive(&mut client, two, accept_all).await;
        assert_eq!(answered.text(), "name=my name colour=my colour", "{server}");
        assert_eq!(answered.asked.len(), 2, "{server}");
        if !server.ends_with("26") {
            let ids: Vec<&str> = answered.asked.iter().map(|a| a.id.as_str()).collect();
            assert_eq!(
                ids,
                ["q1", "q2"],
                "{server}: sequential questions of one call"
            );
        }
    }
    gateway.shutdown().await;
}

/// Unary InvokeTool on a 2025-11-25 server, opted in: FAILED_PRECONDITION
/// naming InvokeToolInteractive, the call cancelled upstream. Not opted
/// in: the question is refused upstream (never declined for the worker).
#[tokio::test]
async fn unary_calls_are_refused_or_never_answered() {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_log(&dir, "py");
    let gateway = TestGateway::start(
        &config(&[stdio_server("py", "initialize", &log, DECLARED)]),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let booking = call("py__slow_then_ask", json!({"ms": 0}), Some(every_kind()));
    let status = client
        .invoke_tool(authed(TOKEN, booking))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "INPUT_REQUIRES_INTERACTIVE");
    use tonic_types::StatusExt;
    let info = status.get_details_error_info().unwrap();
    assert_eq!(
        info.metadata["rpc"],
        "toolgate.v1.ToolGateway/InvokeToolInteractive"
    );
    assert_eq!(info.metadata["kind"], "form");
    assert_eq!(info.metadata["server"], "py");
    assert_eq!(info.metadata["tool"], "py__slow_then_ask");
    wait_for_line(&log, "cancelled", |l| l["event"] == "cancelled").await;

    // Not opted in (unary, or interactive without the kind): the server's
    // question gets an error, so the tool never sees a decline.
    let plain = call("py__book_table", json!({"restaurant": "X"}), None);
    match client
        .invoke_tool(authed(TOKEN, plain.clone()))
        .await
        .map(tonic::Response::into_inner)
    {
        Ok(result) => {
            assert_ne!(result.text, "declined", "{result:?}");
            assert!(result.is_error, "{result:?}");
        }
        Err(status) => assert_ne!(reason(&status), "INPUT_REQUIRES_INTERACTIVE"),
    }
    let url_only = pb::InputCapabilities {
        url: true,
        ..Default::default()
    };
    let mut other_kind = plain;
    other_kind.accepts_input = Some(url_only);
    let worked = interactive(&mut client, other_kind, accept_all).await;
    assert!(worked.asked.is_empty(), "{:?}", worked.asked);
    match worked.result {
        Ok(result) => {
            assert_ne!(result.text, "declined", "{result:?}");
            assert!(result.is_error, "{result:?}");
        }
        Err(status) => assert_ne!(reason(&status), "INPUT_REQUIRES_INTERACTIVE"),
    }
    gateway.shutdown().await;
}

/// Issue 37: out of the box (no `input:` block), a 2025-11-25 server
/// written with the Python `mcp` SDK (which asks only a session that
/// declared elicitation) asks the worker whose call opted in; a call that
/// did not opt in is still never answered for.
#[tokio::test]
async fn out_of_the_box_a_python_sdk_server_asks_the_worker_that_opted_in() {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_log(&dir, "py");
    let gateway =
        TestGateway::start(&config(&[stdio_server("py", "initialize", &log, "")]), &[]).await;
    let mut client = gateway.client().await;
    let booking = call(
        "py__book_table",
        json!({"restaurant": "Chez X"}),
        Some(every_kind()),
    );
    let worked = interactive(&mut client, booking, accept_all).await;
    assert_eq!(worked.asked.len(), 1, "{:?}", worked.asked);
    assert_eq!(
        worked.text(),
        "booked Chez X: party_size=4 date=2026-12-31 confirm=true"
    );
    // Not opted in: the server's question gets an error (the SDK makes
    // it the call's error), never a decline.
    let plain = call("py__book_table", json!({"restaurant": "X"}), None);
    match client
        .invoke_tool(authed(TOKEN, plain))
        .await
        .map(tonic::Response::into_inner)
    {
        Ok(result) => {
            assert_ne!(result.text, "declined", "{result:?}");
            assert!(result.is_error, "{result:?}");
        }
        Err(status) => assert_eq!(reason(&status), "UPSTREAM_METHOD_NOT_FOUND", "{status:?}"),
    }
    gateway.shutdown().await;
}

/// Two calls in flight on one stdio session, both asking: a question
/// reaches its own worker or is refused, never the other worker.
#[tokio::test]
async fn two_calls_on_one_stdio_session_never_swap_questions() {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_log(&dir, "py");
    let gateway = TestGateway::start(
        &config(&[stdio_server("py", "initialize", &log, DECLARED)]),
        &[],
    )
    .await;
    let worker = |name: &'static str| {
        move |request: &pb::InputRequest| {
            Some(response(
                &request.id,
                pb::InputAction::Accept,
                json!({"answer": name}),
            ))
        }
    };
    let mut first_client = gateway.client().await;
    let mut second_client = gateway.client().await;
    let first = interactive(
        &mut first_client,
        call("py__slow_then_ask", json!({"ms": 300}), Some(every_kind())),
        worker("first"),
    );
    let second = interactive(
        &mut second_client,
        call("py__slow_then_ask", json!({"ms": 1200}), Some(every_kind())),
        worker("second"),
    );
    let (first, second) = tokio::join!(first, second);
    // Each call ends with its own worker's answer or an error: never
    // with the other worker's answer.
    for (name, other, worked) in [("first", "second", &first), ("second", "first", &second)] {
        if let Ok(result) = &worked.result {
            assert_ne!(
                result.text,
                format!("answer={other}"),
                "{name} got {other}'s answer"
            );
            assert!(
                result.text == format!("answer={name}") || result.is_error,
                "{name}: {result:?}"
            );
        }
    }
    // The first question came while both were in flight: refused upstream
    // (the server fails that call), never put to a worker.
    assert!(first.asked.is_empty(), "{:?}", first.asked);
    assert!(
        first.result.as_ref().map_or(true, |r| r.is_error),
        "{:?}",
        first.result
    );
    // The second came once it was alone: answered by its own worker.
    assert_eq!(second.asked.len(), 1);
    assert_eq!(second.text(), "answer=second");
    gateway.shutdown().await;
}

/// A server's question carries the server's own `progressToken` (a
/// request's token belongs to the side that sent it; rmcp servers number
/// every request they send): with one call in flight the question is its
/// call's whatever the token, and a token equal to another call's never
/// takes the question to that call's worker.
#[tokio::test]
async fn a_progress_token_on_a_question_names_no_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_log(&dir, "py");
    let rmcp_server = format!(
        "      - name: rs\n        command: [\"{}\", \"ask-server\"]\n        lifecycle: initialize\n{DECLARED}",
        env!("CARGO_BIN_EXE_toolgate-bench"),
    );
    let gateway = TestGateway::start(
        &config(&[
            stdio_server("py", "initialize", &log, DECLARED),
            rmcp_server,
        ]),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let answer = |worker: &'static str| {
        move |request: &pb::InputRequest| {
            Some(response(
                &request.id,
                pb::InputAction::Accept,
                json!({"answer": worker}),
            ))
        }
    };
    // An rmcp server over stdio, one call in flight: its question (with
    // rmcp's counter token) is answered.
    let rmcp = interactive(
        &mut client,
        call("rs__ask", json!({}), Some(every_kind())),
        answer("rmcp"),
    )
    .await;
    assert_eq!(rmcp.asked.len(), 1, "{:?}", rmcp.result);
    assert_eq!(rmcp.text(), "answered Accept");
    // The Python SDK with a token that is no call's: answered.
    let alone = interactive(
        &mut client,
        call(
            "py__token_question",
            json!({"hold_ms": 0, "borrow": false}),
            Some(every_kind()),
        ),
        answer("alone"),
    )
    .await;
    assert_eq!(alone.asked.len(), 1, "{:?}", alone.result);
    assert_eq!(alone.text(), "answer=alone");
    // Two calls in flight, the question carrying the held call's token:
    // refused upstream, never put to the held call's worker.
    let mut held_client = gateway.client().await;
    let held = interactive(
        &mut held_client,
        call(
            "py__token_question",
            json!({"hold_ms": 1500, "borrow": false}),
            Some(every_kind()),
        ),
        answer("held"),
    );
    let asking = interactive(
        &mut client,
        call(
            "py__token_question",
            json!({"hold_ms": 0, "borrow": true}),
            Some(every_kind()),
        ),
        answer("asking"),
    );
    let (held, asking) = tokio::join!(held, asking);
    assert!(held.asked.is_empty(), "{:?}", held.asked);
    assert_eq!(held.text(), "held");
    assert!(asking.asked.is_empty(), "{:?}", asking.asked);
    assert!(
        asking.result.as_ref().map_or(true, |r| r.is_error),
        "{:?}",
        asking.result
    );
    gateway.shutdown().await;
}

/// Every round an interactive call puts to its worker is on record, both
/// eras: `input_asked` and `input_answered` records with their round,
/// kinds and actions (the answer's content as a digest only), counted in
/// `toolgate_input_rounds_total`.
#[tokio::test]
async fn interactive_rounds_are_audited_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let metrics_port = free_port();
    let yaml = format!(
        "metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\naudit:\n  path: \"{}\"\n{}",
        audit.display(),
        config(&[
            stdio_server("py", "initialize", &temp_log(&dir, "py"), DECLARED),
            stdio_server("py26", "discover", &temp_log(&dir, "py26"), DECLARED),
        ])
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let answer = |request: &pb::InputRequest| {
        let Some(pb::input_request::Kind::Form(form)) = &request.kind else {
            panic!("a form: {request:?}");
        };
        let content = if form.requested_schema_json.contains("colour") {
            json!({"colour": "blue"})
        } else {
            json!({"name": "marker-5e1f"})
        };
        Some(response(&request.id, pb::InputAction::Accept, content))
    };
    for server in ["py", "py26"] {
        let two = call(
            &format!("{server}__two_questions"),
            json!({}),
            Some(every_kind()),
        );
        let worked = interactive(&mut client, two, answer).await;
        assert_eq!(worked.text(), "name=marker-5e1f colour=blue", "{server}");
    }
    let page = scrape(metrics_port).await;
    for server in ["py", "py26"] {
        for outcome in ["asked", "accept"] {
            let series = format!(
                "toolgate_input_rounds_total{{tenant=\"acme\",server=\"{server}\",tool=\"{server}__two_questions\",kind=\"form\",outcome=\"{outcome}\"}}"
            );
            assert_eq!(
                sample(&page, &series).as_deref(),
                Some("2"),
                "{series}: {page}"
            );
        }
    }
    gateway.shutdown().await;

    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(
        !text.contains("marker-5e1f"),
        "an answer's content in digest mode: {text}"
    );
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rounds = |server: &str, event: &str| -> Vec<(u64, Vec<(String, String)>)> {
        let mut rounds: Vec<_> = records
            .iter()
            .filter(|r| r["kind"] == "input" && r["server"] == server && r["event"] == event)
            .map(|r| {
                assert_eq!(r["rpc"], "InvokeToolInteractive", "{r}");
                assert_eq!(r["tool"], format!("{server}__two_questions"), "{r}");
                assert!(r.get("arguments").is_none(), "{r}");
                let items = r["input"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| {
                        if event == "input_answered" {
                            let content = &i["content"];
                            assert!(
                                content["hmac_sha256"].is_string()
                                    && content.get("value").is_none(),
                                "{content}"
                            );
                        }
                        (
                            i["kind"].as_str().unwrap().to_owned(),
                            i["action"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                    .collect();
                (r["round"].as_u64().unwrap(), items)
            })
            .collect();
        rounds.sort();
        rounds
    };
    let form = |action: &str| ("form".to_owned(), action.to_owned());
    // 2025-11-25: one elicitation/create per round.
    assert_eq!(
        rounds("py", "input_asked"),
        [(1, vec![form("")]), (2, vec![form("")])],
        "{text}"
    );
    assert_eq!(
        rounds("py", "input_answered"),
        [(1, vec![form("accept")]), (2, vec![form("accept")])],
        "{text}"
    );
    // 2026-07-28: both questions in one input_required round.
    assert_eq!(
        rounds("py26", "input_asked"),
        [(1, vec![form(""), form("")])],
        "{text}"
    );
    assert_eq!(
        rounds("py26", "input_answered"),
        [(1, vec![form("accept"), form("accept")])],
        "{text}"
    );
}

/// Every round put to a worker has a `toolgate.input_round` span, both
/// eras, interactive and unary, exported over OTLP.
#[tokio::test]
async fn each_round_has_a_span() {
    let (receiver, otlp_port) = crate::ops::Receiver::serve().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config_path,
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"1ms\"\n{}",
            config(&[
                stdio_server("py", "initialize", &temp_log(&dir, "py"), DECLARED),
                stdio_server("py26", "discover", &temp_log(&dir, "py26"), DECLARED),
            ])
        ),
    )
    .unwrap();
    let _gateway = ChildGuard(
        std::process::Command::new(toolgate_bin())
            .args(["serve", "--config"])
            .arg(&config_path)
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{otlp_port}"),
            )
            .env("OTEL_SERVICE_NAME", "toolgate-test")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    for server in ["py", "py26"] {
        let two = call(
            &format!("{server}__two_questions"),
            json!({}),
            Some(every_kind()),
        );
        let worked = interactive(&mut client, two, accept_all).await;
        assert_eq!(worked.text(), "name=my name colour=my colour", "{server}");
    }
    let unary = client
        .invoke_tool(authed(
            TOKEN,
            call("py26__two_questions", json!({}), Some(every_kind())),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(unary.input_required.is_some(), "{unary:?}");

    let attribute = |span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str| {
        use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
        match span
            .attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.clone())
            .and_then(|v| v.value)
        {
            Some(V::StringValue(s)) => s,
            Some(V::IntValue(i)) => i.to_string(),
            other => format!("{other:?}"),
        }
    };
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = receiver
            .spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == "toolgate.input_round")
            .map(|s| ["era", "round", "kinds", "outcome"].map(|key| attribute(s, key)))
            .collect::<Vec<_>>();
        if seen.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen.sort();
    let row = |era: &str, round: &str, kinds: &str, outcome: &str| {
        [era, round, kinds, outcome].map(str::to_owned)
    };
    assert_eq!(
        seen,
        [
            row("2025-11-25", "1", "form", "answered"),
            row("2025-11-25", "2", "form", "answered"),
            row("2026-07-28", "1", "form,form", "answered"),
            row("2026-07-28", "1", "form,form", "asked"),
        ]
    );
}

/// A worker that closes its stream mid-question cancels the call upstream
/// and leaves nothing behind (the next call is alone on the session again,
/// so its question is tied).
#[tokio::test]
async fn a_worker_that_goes_away_cancels_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_log(&dir, "py");
    let (_http, port) = input_server_http(&temp_log(&dir, "http")).await;
    let gateway = TestGateway::start(
        &config(&[
            stdio_server("py", "initialize", &log, DECLARED),
            http_server("web", "initialize", port, DECLARED),
        ]),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    for (server, log) in [("py", log.clone()), ("web", temp_log(&dir, "http"))] {
        let booking = call(
            &format!("{server}__book_table"),
            json!({"restaurant": "Gone"}),
            Some(every_kind()),
        );
        let gone = interactive(&mut client, booking.clone(), |_| None).await;
        assert_eq!(gone.asked.len(), 1, "{server}");
        wait_for_line(&log, "cancelled or interrupted", cancelled_or_interrupted).await;
        // Nothing left in flight: the next question is tied to the next call.
        let booked = interactive(&mut client, booking, accept_all).await;
        assert!(booked.text().starts_with("booked Gone"), "{server}");
    }
    gateway.shutdown().await;
}

/// A question not answered within `input.answer_timeout`: DEADLINE_EXCEEDED
/// INPUT_ANSWER_TIMEOUT, the call cancelled upstream.
#[tokio::test]
async fn an_unanswered_question_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_log(&dir, "py");
    let input =
        "        input:\n          declare_on_session: true\n          answer_timeout: 500ms\n";
    let gateway = TestGateway::start(
        &config(&[stdio_server("py", "initialize", &log, input)]),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::InteractiveRequest {
        message: Some(pb::interactive_request::Message::Call(call(
            "py__book_table",
            json!({"restaurant": "Late"}),
            Some(every_kind()),
        ))),
    })
    .await
    .unwrap();
    let mut events = client
        .invoke_tool_interactive(authed(TOKEN, ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    let mut asked = 0;
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(20), events.message())
            .await
            .expect("an event")
        {
            Ok(Some(pb::InvokeToolEvent {
                event: Some(pb::invoke_tool_event::Event::InputRequired(_)),
            })) => asked += 1,
            Ok(other) => panic!("{other:?}"),
            Err(status) => break status,
        }
    };
    assert_eq!(asked, 1);
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert_eq!(reason(&status), "INPUT_ANSWER_TIMEOUT");
    wait_for_line(&log, "cancelled", |l| l["event"] == "cancelled").await;
    drop(tx);
    gateway.shutdown().await;
}

/// The first message must be the call.
#[tokio::test]
async fn the_first_message_must_be_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_log(&dir, "py");
    let gateway = TestGateway::start(
        &config(&[stdio_server("py", "initialize", &log, DECLARED)]),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::InteractiveRequest {
        message: Some(pb::interactive_request::Message::InputResponse(response(
            "q1",
            pb::InputAction::Decline,
            Value::Null,
        ))),
    })
    .await
    .unwrap();
    let status = client
        .invoke_tool_interactive(authed(TOKEN, ReceiverStream::new(rx)))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(reason(&status), "INTERACTIVE_FIRST_MESSAGE");
    gateway.shutdown().await;
}

/// server-everything lists its input tools only when the session declared
/// them (`declare_on_session`): its form question reaches the worker, and
/// `get-roots-list` sees the configured roots.
#[tokio::test]
async fn server_everything_asks_when_declared_and_sees_the_roots() {
    let yaml = format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n        input:\n          declare_on_session: true\n        roots:\n          - uri: file:///srv/project\n            name: project\n",
        node().display(),
        everything_js().display()
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let tools = names(&list(&mut client, TOKEN).await);
    assert!(
        tools.contains(&"everything__trigger-elicitation-request".to_owned()),
        "{tools:?}"
    );
    let elicit = call(
        "everything__trigger-elicitation-request",
        json!({}),
        Some(every_kind()),
    );
    let declined = interactive(&mut client, elicit, act(pb::InputAction::Decline)).await;
    assert_eq!(declined.asked.len(), 1);
    assert!(declined.text().contains("declined"), "{}", declined.text());
    let roots = invoke(&mut client, TOKEN, "everything__get-roots-list", "{}")
        .await
        .expect("get-roots-list");
    assert!(roots.text.contains("file:///srv/project"), "{}", roots.text);
    gateway.shutdown().await;
}

/// Time spent waiting for the worker's answers does not count against the
/// server's `call_timeout`; the caller's own deadline still holds. Both
/// eras.
#[tokio::test]
async fn waiting_for_answers_pauses_the_upstream_timeout_not_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let short = "        call_timeout: 1s\n";
    let yaml = config(&[
        stdio_server(
            "py",
            "initialize",
            &temp_log(&dir, "py"),
            &format!("{short}{DECLARED}"),
        ),
        stdio_server(
            "py26",
            "discover",
            &temp_log(&dir, "py26"),
            &format!("{short}{DECLARED}"),
        ),
    ]);
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    for server in ["py", "py26"] {
        let booking = call(
            &format!("{server}__book_table"),
            json!({"restaurant": "Slow"}),
            Some(every_kind()),
        );
        let thinking = Pace {
            think: Duration::from_millis(1500),
            deadline: None,
        };
        let booked = interactive_paced(&mut client, booking.clone(), thinking, accept_all).await;
        assert!(booked.text().starts_with("booked Slow"), "{server}");
        let hurried = Pace {
            think: Duration::from_millis(2500),
            deadline: Some(Duration::from_millis(1500)),
        };
        let late = interactive_paced(&mut client, booking, hurried, accept_all).await;
        let status = late.result.expect_err("the caller's deadline");
        assert_eq!(
            status.code(),
            tonic::Code::DeadlineExceeded,
            "{server}: {status:?}"
        );
    }
    gateway.shutdown().await;
}

/// More questions for one call than `input.max_rounds`: the extra question
/// is refused upstream and the call ends RESOURCE_EXHAUSTED.
#[tokio::test]
async fn questions_beyond_max_rounds_end_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = temp_log(&dir, "py");
    let input = "        input:\n          declare_on_session: true\n          max_rounds: 1\n";
    let gateway = TestGateway::start(
        &config(&[stdio_server("py", "initialize", &log, input)]),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    let two = call("py__two_questions", json!({}), Some(every_kind()));
    let worked = interactive(&mut client, two, accept_all).await;
    assert_eq!(worked.asked.len(), 1, "{:?}", worked.asked);
    let status = worked.result.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "INPUT_ROUNDS_EXCEEDED");
    wait_for_line(&log, "cancelled", |l| l["event"] == "cancelled").await;
    gateway.shutdown().await;
}

/// A Python worker that imports no MCP library (grpcio and the toolgate
/// proto only) answers a form question over InvokeToolInteractive, against
/// servers of both revisions.
#[tokio::test]
async fn a_python_worker_without_mcp_answers_both_eras() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&[
        stdio_server("py", "initialize", &temp_log(&dir, "py"), DECLARED),
        stdio_server("py26", "discover", &temp_log(&dir, "py26"), DECLARED),
    ]);
    let gateway = TestGateway::start(&yaml, &[]).await;
    for server in ["py", "py26"] {
        let output = tokio::process::Command::new(python())
            .arg(fixture("python/grpc_client.py"))
            .arg("--addr")
            .arg(gateway.addr.to_string())
            .arg("interactive")
            .arg(format!("{server}__book_table"))
            .arg(r#"{"restaurant": "Chez Rust"}"#)
            .arg("--fill")
            .arg(r#"{"party_size": 2, "confirm": true}"#)
            .env("TOOLGATE_TOKEN", TOKEN)
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(60), output)
            .await
            .expect("the worker finishes")
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let printed: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "no JSON ({e}): {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        assert_eq!(output.status.code(), Some(0), "{server}: {printed}");
        assert_eq!(printed["asked"][0]["kind"], "form", "{server}: {printed}");
        assert_eq!(
            printed["result"]["text"],
            "booked Chez Rust: party_size=2 date=2026-12-24 confirm=true",
            "{server}: {printed}"
        );
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_question_never_carries_a_credential() {
    // The server echoes a credential of the gateway's (here the tenant's
    // token, as a tool argument) in its question's message and URL: the
    // worker gets `[redacted]`, in both eras, interactive and unary.
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&[
        stdio_server("py", "initialize", &temp_log(&dir, "py"), DECLARED),
        stdio_server("py26", "discover", &temp_log(&dir, "py26"), DECLARED),
    ]);
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    for server in ["py", "py26"] {
        wait_listed(&mut client, TOKEN, &format!("{server}__book_table")).await;
        let booking = call(
            &format!("{server}__book_table"),
            json!({"restaurant": TOKEN}),
            Some(every_kind()),
        );
        let booked = interactive(&mut client, booking, act(pb::InputAction::Decline)).await;
        let Some(pb::input_request::Kind::Form(form)) = &booked.asked[0].kind else {
            panic!("{server}: a form: {:?}", booked.asked);
        };
        assert_eq!(form.message, "Book a table at [redacted]?", "{server}");
        let link = call(
            &format!("{server}__open_link"),
            json!({"url": format!("https://example.com/pay?key={TOKEN}")}),
            Some(every_kind()),
        );
        let opened = interactive(&mut client, link, act(pb::InputAction::Decline)).await;
        let Some(pb::input_request::Kind::Url(url)) = &opened.asked[0].kind else {
            panic!("{server}: a URL: {:?}", opened.asked);
        };
        assert_eq!(
            url.url, "https://example.com/pay?key=[redacted]",
            "{server}"
        );
        for worked in [&booked, &opened] {
            assert!(!format!("{:?}", worked.asked).contains(TOKEN), "{server}");
        }
    }
    // Unary, 2026-07-28: the round handed out is redacted too.
    let asked = client
        .invoke_tool(authed(
            TOKEN,
            call(
                "py26__book_table",
                json!({"restaurant": TOKEN}),
                Some(every_kind()),
            ),
        ))
        .await
        .expect("a round of questions")
        .into_inner();
    let questions = asked.input_required.expect("input_required");
    let Some(pb::input_request::Kind::Form(form)) = &questions.requests[0].kind else {
        panic!("a form: {questions:?}");
    };
    assert_eq!(form.message, "Book a table at [redacted]?");
    assert!(!format!("{questions:?}").contains(TOKEN));
    gateway.shutdown().await;
}
