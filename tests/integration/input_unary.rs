//! Questions of 2026-07-28 servers on `InvokeTool` and `InvokeToolStream`:
//! the Python `mcp` SDK's `input_server.py` (`lifecycle: discover`) over
//! stdio and Streamable HTTP answers `input_required`; the worker gets the
//! questions with toolgate's sealed `request_state` and retries with its
//! answers. A call that did not opt in is refused, never answered for;
//! forged, tampered, expired and foreign states and bad answers are each
//! refused with their reason before anything reaches the server (its log
//! shows no call); a retry reaches another gateway sharing `state.keys`
//! (and one that does not share them says so).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "acme-token";
const OTHER_TOKEN: &str = "other-token";
/// A 32-byte key in base64, shared by the gateways of one test.
const STATE_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// How the server is reached.
#[derive(Clone, Copy, Debug)]
enum Transport {
    Stdio,
    Http,
}

/// The input server, its log, and (for HTTP) its process.
struct InputServer {
    log: PathBuf,
    /// The `servers[]` entry's transport lines.
    reach: String,
    _child: Option<ChildGuard>,
}

impl InputServer {
    async fn start(transport: Transport, dir: &Path) -> Self {
        let log = dir.join(format!("input-{transport:?}.log"));
        match transport {
            Transport::Stdio => Self {
                reach: format!(
                    "        command: [\"{}\", \"{}\", \"stdio\"]\n        env:\n          \
                     INPUT_SERVER_LOG: \"{}\"\n",
                    python().display(),
                    fixture("python/input_server.py").display(),
                    log.display()
                ),
                log,
                _child: None,
            },
            Transport::Http => {
                let port = free_port();
                let child = std::process::Command::new(python())
                    .arg(fixture("python/input_server.py"))
                    .args(["http", &port.to_string()])
                    .env("INPUT_SERVER_LOG", &log)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                let child = ChildGuard(child);
                wait_for_port(port).await;
                Self {
                    reach: format!("        url: \"http://127.0.0.1:{port}/mcp\"\n"),
                    log,
                    _child: Some(child),
                }
            }
        }
    }

    /// The `tools/call` requests of `tool` the server received.
    fn calls(&self, tool: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|e| e["event"] == "call" && e["tool"] == tool)
            .count()
    }
}

/// Two tenants with the same server (`py`), a `py_short` whose states
/// expire at once and a `py_one` of one round, `extra` at the top.
fn config(server: &InputServer, extra: &str) -> String {
    let entry = |name: &str, input: &str| {
        format!(
            "      - name: {name}\n        lifecycle: discover\n{}{input}",
            server.reach
        )
    };
    let servers = format!(
        "{}{}{}",
        entry("py", ""),
        entry("py_short", "        input: { state_ttl: 1ms }\n"),
        entry("py_one", "        input: { max_rounds: 1 }\n")
    );
    format!(
        "{extra}tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{servers}  - name: \
         other\n    tokens: [{OTHER_TOKEN}]\n    servers:\n{}",
        entry("py", "")
    )
}

fn form_only() -> Option<pb::InputCapabilities> {
    Some(pb::InputCapabilities {
        form: true,
        ..Default::default()
    })
}

fn call(name: &str, arguments: &str) -> pb::InvokeToolRequest {
    pb::InvokeToolRequest {
        name: name.to_owned(),
        arguments_json: arguments.to_owned(),
        accepts_input: form_only(),
        ..Default::default()
    }
}

fn answer(id: &str, action: pb::InputAction, content: &str) -> pb::InputResponse {
    pb::InputResponse {
        id: id.to_owned(),
        action: action as i32,
        content_json: content.to_owned(),
    }
}

/// `request` answering `asked` with `responses`.
fn retry(
    mut request: pb::InvokeToolRequest,
    asked: &pb::InputRequired,
    responses: Vec<pb::InputResponse>,
) -> pb::InvokeToolRequest {
    request.request_state = asked.request_state.clone();
    request.input_responses = responses;
    request
}

async fn unary(
    client: &mut ToolGatewayClient<Channel>,
    token: &str,
    request: pb::InvokeToolRequest,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    client
        .invoke_tool(authed(token, request))
        .await
        .map(tonic::Response::into_inner)
}

/// The result event of an `InvokeToolStream` call (the last event).
async fn streamed(
    client: &mut ToolGatewayClient<Channel>,
    request: pb::InvokeToolRequest,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    let mut stream = client
        .invoke_tool_stream(authed(TOKEN, request))
        .await?
        .into_inner();
    let mut last = None;
    while let Some(event) = stream.message().await? {
        last = event.event;
    }
    match last {
        Some(pb::invoke_tool_event::Event::Result(response)) => Ok(response),
        other => panic!("the stream ended with {other:?}"),
    }
}

/// The questions of a response that must carry them.
fn questions(response: pb::InvokeToolResponse) -> pb::InputRequired {
    assert!(
        response.text.is_empty() && response.content.is_empty(),
        "{response:?}"
    );
    let asked = response.input_required.expect("input_required");
    assert!(asked.request_state.starts_with("tgs1."), "{asked:?}");
    asked
}

/// The one form question of `asked`: its id.
fn form_id(asked: &pb::InputRequired, message: &str) -> String {
    assert_eq!(asked.requests.len(), 1, "{asked:?}");
    let request = &asked.requests[0];
    match &request.kind {
        Some(pb::input_request::Kind::Form(form)) => {
            assert_eq!(form.message, message);
            let schema: Value = serde_json::from_str(&form.requested_schema_json).unwrap();
            assert_eq!(
                schema["properties"]["party_size"]["type"], "integer",
                "{schema}"
            );
        }
        other => panic!("not a form: {other:?}"),
    }
    request.id.clone()
}

const ACCEPTED: &str = r#"{"party_size": 4, "confirm": true}"#;

#[tokio::test]
async fn a_form_round_trip_over_stdio_and_http_unary_and_streamed() {
    let dir = tempfile::tempdir().unwrap();
    for transport in [Transport::Stdio, Transport::Http] {
        let server = InputServer::start(transport, dir.path()).await;
        let gateway = TestGateway::start(&config(&server, ""), &[]).await;
        let mut client = gateway.client().await;
        wait_listed(&mut client, TOKEN, "py__book_table").await;
        let book = call("py__book_table", r#"{"restaurant": "Chez Rust"}"#);

        // Unary: accepted.
        let asked = questions(unary(&mut client, TOKEN, book.clone()).await.unwrap());
        let id = form_id(&asked, "Book a table at Chez Rust?");
        let done = unary(
            &mut client,
            TOKEN,
            retry(
                book.clone(),
                &asked,
                vec![answer(&id, pb::InputAction::Accept, ACCEPTED)],
            ),
        )
        .await
        .unwrap();
        assert!(done.input_required.is_none(), "{done:?}");
        assert_eq!(
            done.text, "booked Chez Rust: party_size=4 date=2026-12-24 confirm=true",
            "{transport:?}"
        );

        // Unary: declined.
        let asked = questions(unary(&mut client, TOKEN, book.clone()).await.unwrap());
        let id = form_id(&asked, "Book a table at Chez Rust?");
        let done = unary(
            &mut client,
            TOKEN,
            retry(
                book.clone(),
                &asked,
                vec![answer(&id, pb::InputAction::Decline, "")],
            ),
        )
        .await
        .unwrap();
        assert_eq!(done.text, "declined", "{transport:?}");

        // InvokeToolStream: the questions are the result event; the retry
        // streams too.
        let asked = questions(streamed(&mut client, book.clone()).await.unwrap());
        let id = form_id(&asked, "Book a table at Chez Rust?");
        let done = streamed(
            &mut client,
            retry(
                book.clone(),
                &asked,
                vec![answer(&id, pb::InputAction::Accept, ACCEPTED)],
            ),
        )
        .await
        .unwrap();
        assert_eq!(
            done.text, "booked Chez Rust: party_size=4 date=2026-12-24 confirm=true",
            "{transport:?}"
        );
        // Each round reached the server once: 3 questions, 3 answers.
        assert_eq!(server.calls("book_table"), 6, "{transport:?}");

        // Two questions in one round.
        let two = call("py__two_questions", "");
        let asked = questions(unary(&mut client, TOKEN, two.clone()).await.unwrap());
        assert_eq!(asked.requests.len(), 2, "{asked:?}");
        let mut responses = Vec::new();
        for request in &asked.requests {
            let Some(pb::input_request::Kind::Form(form)) = &request.kind else {
                panic!("{request:?}")
            };
            let schema: Value = serde_json::from_str(&form.requested_schema_json).unwrap();
            let field = if schema["properties"]["name"].is_object() {
                r#"{"name": "Ada"}"#
            } else {
                r#"{"colour": "teal"}"#
            };
            responses.push(answer(&request.id, pb::InputAction::Accept, field));
        }
        let done = unary(&mut client, TOKEN, retry(two, &asked, responses))
            .await
            .unwrap();
        assert_eq!(done.text, "name=Ada colour=teal", "{transport:?}");
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn a_call_that_did_not_opt_in_is_refused_not_answered() {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Stdio, dir.path()).await;
    let gateway = TestGateway::start(&config(&server, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__book_table").await;
    for accepts in [
        None,
        Some(pb::InputCapabilities {
            url: true,
            sampling: true,
            form: false,
        }),
    ] {
        let request = pb::InvokeToolRequest {
            accepts_input: accepts,
            ..call("py__book_table", r#"{"restaurant": "Chez Rust"}"#)
        };
        let status = unary(&mut client, TOKEN, request).await.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert_eq!(reason(&status), "INPUT_NOT_ACCEPTED");
        let info = status.get_details_error_info().unwrap();
        assert_eq!(info.metadata["kinds"], "form");
        assert_eq!(info.metadata["field"], "accepts_input");
        assert_eq!(info.metadata["server"], "py");
    }
    // The server saw each call once, and was never answered for the worker.
    assert_eq!(server.calls("book_table"), 2);
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains(r#""inputResponses": true"#), "{log}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn refused_states_and_answers_send_nothing_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Stdio, dir.path()).await;
    let gateway = TestGateway::start(&config(&server, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__book_table").await;
    wait_listed(&mut client, OTHER_TOKEN, "py__book_table").await;
    let book = call("py__book_table", r#"{"restaurant": "Chez Rust"}"#);
    let asked = questions(unary(&mut client, TOKEN, book.clone()).await.unwrap());
    let id = form_id(&asked, "Book a table at Chez Rust?");
    let accept = || vec![answer(&id, pb::InputAction::Accept, ACCEPTED)];
    let state = asked.request_state.clone();
    // The expired one: py_short's states live 1 ms.
    let short = call("py_short__book_table", r#"{"restaurant": "Chez Rust"}"#);
    let short_asked = questions(unary(&mut client, TOKEN, short.clone()).await.unwrap());
    let short_id = short_asked.requests[0].id.clone();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let sent_before = server.calls("book_table");
    assert_eq!(sent_before, 2);

    let tampered = {
        // One character of the sealed bytes changed (not the key id).
        let mut chars: Vec<char> = state.chars().collect();
        let at = chars.len() - 10;
        chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
        chars.into_iter().collect::<String>()
    };
    let with_state =
        |request: pb::InvokeToolRequest, state: &str, responses| pb::InvokeToolRequest {
            request_state: state.to_owned(),
            input_responses: responses,
            ..request
        };
    let mut subject_request = authed(TOKEN, with_state(book.clone(), &state, accept()));
    subject_request
        .metadata_mut()
        .insert("x-toolgate-subject", "alice".parse().unwrap());
    let foreign_subject = client.invoke_tool(subject_request).await.unwrap_err();
    let cases: Vec<(&str, &str, Result<pb::InvokeToolResponse, tonic::Status>)> = vec![
        (
            "forged",
            "REQUEST_STATE_INVALID",
            unary(
                &mut client,
                TOKEN,
                with_state(
                    book.clone(),
                    "tgs1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                    accept(),
                ),
            )
            .await,
        ),
        (
            "not toolgate's",
            "REQUEST_STATE_INVALID",
            unary(
                &mut client,
                TOKEN,
                with_state(book.clone(), "v1.server-state", accept()),
            )
            .await,
        ),
        (
            "tampered",
            "REQUEST_STATE_INVALID",
            unary(
                &mut client,
                TOKEN,
                with_state(book.clone(), &tampered, accept()),
            )
            .await,
        ),
        (
            "foreign tenant",
            "REQUEST_STATE_FOREIGN",
            unary(
                &mut client,
                OTHER_TOKEN,
                with_state(book.clone(), &state, accept()),
            )
            .await,
        ),
        (
            "foreign subject",
            "REQUEST_STATE_FOREIGN",
            Err(foreign_subject),
        ),
        (
            "other tool",
            "REQUEST_STATE_OTHER_CALL",
            unary(
                &mut client,
                TOKEN,
                with_state(call("py__two_questions", ""), &state, accept()),
            )
            .await,
        ),
        (
            "other arguments",
            "REQUEST_STATE_OTHER_CALL",
            unary(
                &mut client,
                TOKEN,
                with_state(
                    call("py__book_table", r#"{"restaurant": "Chez C"}"#),
                    &state,
                    accept(),
                ),
            )
            .await,
        ),
        (
            "expired",
            "REQUEST_STATE_EXPIRED",
            unary(
                &mut client,
                TOKEN,
                retry(
                    short,
                    &short_asked,
                    vec![answer(&short_id, pb::InputAction::Accept, ACCEPTED)],
                ),
            )
            .await,
        ),
        (
            "unspecified action",
            "INPUT_RESPONSE_INVALID",
            unary(
                &mut client,
                TOKEN,
                with_state(
                    book.clone(),
                    &state,
                    vec![answer(&id, pb::InputAction::Unspecified, "")],
                ),
            )
            .await,
        ),
        (
            "unknown id",
            "INPUT_RESPONSE_INVALID",
            unary(
                &mut client,
                TOKEN,
                with_state(
                    book.clone(),
                    &state,
                    vec![answer("nope", pb::InputAction::Decline, "")],
                ),
            )
            .await,
        ),
        (
            "accepted form without values",
            "INPUT_RESPONSE_INVALID",
            unary(
                &mut client,
                TOKEN,
                with_state(
                    book.clone(),
                    &state,
                    vec![answer(&id, pb::InputAction::Accept, "")],
                ),
            )
            .await,
        ),
        (
            "answers without state",
            "INPUT_RESPONSE_INVALID",
            unary(&mut client, TOKEN, with_state(book.clone(), "", accept())).await,
        ),
        (
            "state without answers",
            "INPUT_RESPONSE_INVALID",
            unary(
                &mut client,
                TOKEN,
                with_state(book.clone(), &state, Vec::new()),
            )
            .await,
        ),
    ];
    for (case, expected, result) in cases {
        let status = result.expect_err(case);
        assert_eq!(reason(&status), expected, "{case}: {status:?}");
        let code = match expected {
            "REQUEST_STATE_EXPIRED" => Code::FailedPrecondition,
            _ => Code::InvalidArgument,
        };
        assert_eq!(status.code(), code, "{case}: {status:?}");
        assert!(
            !status.message().contains("v1."),
            "{case}: the server's state shows: {status:?}"
        );
    }
    // Nothing reached the server.
    assert_eq!(server.calls("book_table"), sent_before);
    assert_eq!(server.calls("two_questions"), 0);
    // The state is still good for its own call (nothing is used up).
    let done = unary(&mut client, TOKEN, retry(book, &asked, accept()))
        .await
        .unwrap();
    assert_eq!(
        done.text,
        "booked Chez Rust: party_size=4 date=2026-12-24 confirm=true"
    );
    gateway.shutdown().await;
}

/// What [`retry_at_the_other_gateway`] saw.
struct Retried {
    /// The answer at the second gateway.
    result: Result<pb::InvokeToolResponse, tonic::Status>,
    /// The server's call count after it.
    calls: usize,
    /// The same answer again, at the first gateway.
    again: Result<pb::InvokeToolResponse, tonic::Status>,
}

/// Two gateways in front of one HTTP input server, each started with
/// `state` (and `env`): round 1 of `book_table` at the first, the answer at
/// the second, then the same answer at the first.
async fn retry_at_the_other_gateway(state: &str, env: &[(&str, &str)]) -> Retried {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Http, dir.path()).await;
    let first = TestGateway::start(&config(&server, state), env).await;
    let second = TestGateway::start(&config(&server, state), env).await;
    let mut one = first.client().await;
    let mut two = second.client().await;
    wait_listed(&mut one, TOKEN, "py__book_table").await;
    wait_listed(&mut two, TOKEN, "py__book_table").await;
    let book = call("py__book_table", r#"{"restaurant": "Chez Rust"}"#);
    let asked = questions(unary(&mut one, TOKEN, book.clone()).await.unwrap());
    let id = form_id(&asked, "Book a table at Chez Rust?");
    let answers = vec![answer(&id, pb::InputAction::Accept, ACCEPTED)];
    let result = unary(
        &mut two,
        TOKEN,
        retry(book.clone(), &asked, answers.clone()),
    )
    .await;
    let calls = server.calls("book_table");
    let again = unary(&mut one, TOKEN, retry(book, &asked, answers)).await;
    first.shutdown().await;
    second.shutdown().await;
    Retried {
        result,
        calls,
        again,
    }
}

#[tokio::test]
async fn a_retry_reaches_another_gateway_sharing_the_store_and_keys() {
    let pg = PgCluster::start();
    let shared = format!(
        "state:\n  url: \"{}\"\n  keys: [{{ env: STATE_KEY }}]\n",
        pg.url()
    );
    let retried = retry_at_the_other_gateway(&shared, &[("STATE_KEY", STATE_KEY)]).await;
    assert_eq!(
        retried.result.unwrap().text,
        "booked Chez Rust: party_size=4 date=2026-12-24 confirm=true"
    );
    assert_eq!(retried.calls, 2);
    // Issue 37: the round was answered at the other replica; answering it
    // again here is refused, and nothing more reaches the server.
    let status = retried.again.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "REQUEST_STATE_USED");
}

#[tokio::test]
async fn without_shared_keys_another_gateway_says_the_key_is_retired() {
    let retried = retry_at_the_other_gateway("", &[]).await;
    let status = retried.result.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "REQUEST_STATE_KEY_RETIRED");
    // Refused before anything was sent: the server saw round 1 only.
    assert_eq!(retried.calls, 1);
    // A refused answer does not spend the round: the gateway that asked
    // takes it.
    assert!(retried.again.is_ok(), "{:?}", retried.again);
}

/// Issue 37: a round's answer is used once. The same answer sent six
/// times at once runs the tool once; a later one is refused with its own
/// reason; nothing more reaches the server.
#[tokio::test]
async fn a_rounds_answer_is_used_once_even_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Stdio, dir.path()).await;
    let gateway = TestGateway::start(&config(&server, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__book_table").await;
    let book = call("py__book_table", r#"{"restaurant": "Chez Rust"}"#);
    let asked = questions(unary(&mut client, TOKEN, book.clone()).await.unwrap());
    let id = form_id(&asked, "Book a table at Chez Rust?");
    let answered = retry(
        book,
        &asked,
        vec![answer(&id, pb::InputAction::Accept, ACCEPTED)],
    );
    let racing = (0..6).map(|_| {
        let mut client = client.clone();
        let request = answered.clone();
        tokio::spawn(async move { unary(&mut client, TOKEN, request).await })
    });
    let results: Vec<_> = futures::future::join_all(racing)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let done: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(done.len(), 1, "{results:?}");
    assert_eq!(
        done[0].text,
        "booked Chez Rust: party_size=4 date=2026-12-24 confirm=true"
    );
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert_eq!(reason(refused), "REQUEST_STATE_USED", "{refused:?}");
    }
    let status = unary(&mut client, TOKEN, answered).await.unwrap_err();
    assert_eq!(reason(&status), "REQUEST_STATE_USED", "{status:?}");
    // Round 1 and the one answer.
    assert_eq!(server.calls("book_table"), 2);
    gateway.shutdown().await;
}

/// A worker whose answer's response was lost learns the outcome by
/// sending the same answer again under the same idempotency key: the key
/// is looked up before the round is claimed, so the recorded outcome is
/// replayed (nothing more reaches the server), where the same answer
/// without a key is `REQUEST_STATE_USED`.
#[tokio::test]
async fn an_answer_sent_again_under_its_idempotency_key_replays_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Stdio, dir.path()).await;
    let gateway = TestGateway::start(&config(&server, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__book_table").await;
    let mut book = call("py__book_table", r#"{"restaurant": "Chez Rust"}"#);
    book.idempotency_key = "booking-7".to_owned();
    let asked = questions(unary(&mut client, TOKEN, book.clone()).await.unwrap());
    let id = form_id(&asked, "Book a table at Chez Rust?");
    let answered = retry(
        book,
        &asked,
        vec![answer(&id, pb::InputAction::Accept, ACCEPTED)],
    );
    let first = unary(&mut client, TOKEN, answered.clone()).await.unwrap();
    assert_eq!(
        first.text,
        "booked Chez Rust: party_size=4 date=2026-12-24 confirm=true"
    );
    assert!(!first.replayed);
    let again = unary(&mut client, TOKEN, answered.clone()).await.unwrap();
    assert_eq!(again.text, first.text);
    assert!(again.replayed, "{again:?}");
    let mut unkeyed = answered;
    unkeyed.idempotency_key.clear();
    let status = unary(&mut client, TOKEN, unkeyed).await.unwrap_err();
    assert_eq!(reason(&status), "REQUEST_STATE_USED", "{status:?}");
    // Round 1 and the one answer.
    assert_eq!(server.calls("book_table"), 2);
    gateway.shutdown().await;
}

#[tokio::test]
async fn rounds_are_audited_without_their_answers_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Stdio, dir.path()).await;
    let audit = dir.path().join("audit.jsonl");
    let metrics_port = free_port();
    let extra = format!(
        "metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\naudit:\n  path: \"{}\"\n",
        audit.display()
    );
    let gateway = TestGateway::start(&config(&server, &extra), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__book_table").await;
    let book = call("py__book_table", r#"{"restaurant": "Chez Rust"}"#);
    let asked = questions(unary(&mut client, TOKEN, book.clone()).await.unwrap());
    let id = form_id(&asked, "Book a table at Chez Rust?");
    let marker = r#"{"party_size": 4, "confirm": true, "note": "marker-8c1d"}"#;
    unary(
        &mut client,
        TOKEN,
        retry(
            book,
            &asked,
            vec![answer(&id, pb::InputAction::Accept, marker)],
        ),
    )
    .await
    .unwrap();
    let page = scrape(metrics_port).await;
    let series = |kind: &str, outcome: &str| {
        sample(
            &page,
            &format!(
                "toolgate_input_rounds_total{{tenant=\"acme\",server=\"py\",tool=\"py__book_table\",kind=\"{kind}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(series("form", "asked").as_deref(), Some("1"), "{page}");
    assert_eq!(series("form", "accept").as_deref(), Some("1"), "{page}");
    gateway.shutdown().await;

    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(
        !text.contains("marker-8c1d"),
        "an answer's content in digest mode: {text}"
    );
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let input: Vec<&Value> = records.iter().filter(|r| r["kind"] == "input").collect();
    assert_eq!(input.len(), 2, "{text}");
    let asked_record = input.iter().find(|r| r["event"] == "input_asked").unwrap();
    assert_eq!(asked_record["v"], 8);
    assert_eq!(asked_record["round"], 1);
    assert_eq!(asked_record["tenant"], "acme");
    assert_eq!(asked_record["tool"], "py__book_table");
    assert_eq!(asked_record["server"], "py");
    assert!(
        asked_record["definition_hash"].is_string(),
        "{asked_record}"
    );
    assert!(asked_record.get("arguments").is_none(), "{asked_record}");
    assert_eq!(asked_record["input"][0]["id"], id.as_str());
    assert_eq!(asked_record["input"][0]["kind"], "form");
    let answered = input
        .iter()
        .find(|r| r["event"] == "input_answered")
        .unwrap();
    assert_eq!(answered["round"], 1);
    assert_eq!(answered["input"][0]["action"], "accept");
    let content = &answered["input"][0]["content"];
    assert!(content["bytes"].as_u64() > Some(0), "{content}");
    assert!(
        content["hmac_sha256"].is_string() && content.get("value").is_none(),
        "{content}"
    );
    // Both calls have their own record: the first ended with questions.
    let calls = records.iter().filter(|r| r["kind"] == "call").count();
    assert_eq!(calls, 2, "{text}");
}

#[tokio::test]
async fn a_python_worker_without_an_mcp_library_answers_a_form() {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Stdio, dir.path()).await;
    let gateway = TestGateway::start(&config(&server, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__book_table").await;
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(python())
            .arg(fixture("python/input_worker.py"))
            .arg("--addr")
            .arg(gateway.addr.to_string())
            .args([
                "py__book_table",
                r#"{"restaurant": "Chez Rust"}"#,
                r#"{"party_size": 2, "confirm": false}"#,
            ])
            .env("TOOLGATE_TOKEN", TOKEN)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the worker finishes in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(result["rounds"], 1, "{result}");
    assert_eq!(
        result["text"],
        "booked Chez Rust: party_size=2 date=2026-12-24 confirm=false"
    );
    assert_eq!(result["mcp_imported"], false);
    gateway.shutdown().await;
}

/// Answers the first question of `asked` only (`name` or `colour`).
fn first_only(asked: &pb::InputRequired) -> Vec<pb::InputResponse> {
    let request = &asked.requests[0];
    let Some(pb::input_request::Kind::Form(form)) = &request.kind else {
        panic!("{request:?}")
    };
    let schema: Value = serde_json::from_str(&form.requested_schema_json).unwrap();
    let field = schema["properties"]
        .as_object()
        .and_then(|p| p.keys().next().cloned())
        .unwrap();
    let content = serde_json::json!({ field: "x" }).to_string();
    vec![answer(&request.id, pb::InputAction::Accept, &content)]
}

#[tokio::test]
async fn a_question_left_unanswered_is_asked_again_within_max_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Stdio, dir.path()).await;
    let gateway = TestGateway::start(&config(&server, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py_one__two_questions").await;

    // Round 2 of `py`: the question not answered in round 1.
    let two = call("py__two_questions", "");
    let first = questions(unary(&mut client, TOKEN, two.clone()).await.unwrap());
    assert_eq!(first.requests.len(), 2, "{first:?}");
    let second = questions(
        unary(
            &mut client,
            TOKEN,
            retry(two.clone(), &first, first_only(&first)),
        )
        .await
        .unwrap(),
    );
    assert_eq!(second.requests.len(), 1, "{second:?}");
    assert_ne!(second.request_state, first.request_state);
    let done = unary(&mut client, TOKEN, retry(two, &second, first_only(&second)))
        .await
        .unwrap();
    assert!(
        done.text.starts_with("name=") && done.text.contains("colour="),
        "{done:?}"
    );

    // `py_one` allows one round: the second is not handed out.
    let one = call("py_one__two_questions", "");
    let first = questions(unary(&mut client, TOKEN, one.clone()).await.unwrap());
    let status = unary(&mut client, TOKEN, retry(one, &first, first_only(&first)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "INPUT_ROUNDS_EXCEEDED");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.metadata["limit"], "servers[].input.max_rounds");
    assert_eq!(info.metadata["limit_value"], "1");
    gateway.shutdown().await;
}

#[tokio::test]
async fn url_and_sampling_questions_and_a_kind_the_call_did_not_accept() {
    let dir = tempfile::tempdir().unwrap();
    let server = InputServer::start(Transport::Stdio, dir.path()).await;
    let gateway = TestGateway::start(&config(&server, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__open_link").await;
    let with =
        |name: &str, arguments: &str, accepts: pb::InputCapabilities| pb::InvokeToolRequest {
            accepts_input: Some(accepts),
            ..call(name, arguments)
        };

    // A URL to open: accepted without content.
    let link = with(
        "py__open_link",
        r#"{"url": "https://example.com/consent"}"#,
        pb::InputCapabilities {
            url: true,
            ..Default::default()
        },
    );
    let asked = questions(unary(&mut client, TOKEN, link.clone()).await.unwrap());
    let Some(pb::input_request::Kind::Url(url)) = &asked.requests[0].kind else {
        panic!("{asked:?}")
    };
    assert_eq!(url.url, "https://example.com/consent");
    assert_eq!(url.message, "Open the link to continue");
    let id = asked.requests[0].id.clone();
    let done = unary(
        &mut client,
        TOKEN,
        retry(link, &asked, vec![answer(&id, pb::InputAction::Accept, "")]),
    )
    .await
    .unwrap();
    assert_eq!(done.text, "accept");

    // A completion for the worker's model.
    let summary = with(
        "py__summarise",
        r#"{"text": "a long text"}"#,
        pb::InputCapabilities {
            sampling: true,
            ..Default::default()
        },
    );
    let asked = questions(unary(&mut client, TOKEN, summary.clone()).await.unwrap());
    let Some(pb::input_request::Kind::Sampling(sampling)) = &asked.requests[0].kind else {
        panic!("{asked:?}")
    };
    let params: Value = serde_json::from_str(&sampling.params_json).unwrap();
    assert_eq!(
        params["messages"][0]["content"]["text"],
        "Summarise: a long text"
    );
    assert_eq!(params["maxTokens"], 100);
    let id = asked.requests[0].id.clone();
    let reply = r#"{"model": "worker-model", "role": "assistant", "content": {"type": "text", "text": "short"}}"#;
    let done = unary(
        &mut client,
        TOKEN,
        retry(
            summary,
            &asked,
            vec![answer(&id, pb::InputAction::Accept, reply)],
        ),
    )
    .await
    .unwrap();
    assert_eq!(done.text, "short");

    // The server asks a URL of a call that accepts forms only: refused,
    // the question never reaches the worker.
    let link = with(
        "py__open_link",
        r#"{"url": "https://example.com/consent"}"#,
        pb::InputCapabilities {
            form: true,
            ..Default::default()
        },
    );
    let status = unary(&mut client, TOKEN, link).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "INPUT_NOT_ACCEPTED");
    assert_eq!(
        status.get_details_error_info().unwrap().metadata["kinds"],
        "url"
    );
    assert_eq!(server.calls("open_link"), 3);
    gateway.shutdown().await;
}
