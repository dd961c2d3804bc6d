//! `toolgate call` answering a tool's questions from `--input FILE` and
//! following a task with `--task`, driven as a process against the question
//! and task fixtures (tests/fixtures/python/input_server.py, tasks_server.py)
//! in both protocol eras.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::binary::cli;
use crate::common::*;

const TOKEN: &str = "cli-token";

/// A gateway with one server `NAME` running `script` over stdio with
/// `lifecycle` and the server lines `extra`; its state store (tasks) in
/// `dir`, not the working directory.
async fn gateway(
    dir: &std::path::Path,
    name: &str,
    script: &str,
    lifecycle: &str,
    extra: &str,
) -> TestGateway {
    TestGateway::start(
        &format!(
            "state:\n  url: \"sqlite://{}/state.db\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: {name}\n        command: [\"{}\", \"{}\"]\n        lifecycle: {lifecycle}\n{extra}",
            dir.display(),
            python().display(),
            fixture(&format!("python/{script}")).display()
        ),
        &[],
    )
    .await
}

/// `toolgate call --input <answers> NAME ARGS` (stdin is not a terminal).
async fn call_with(
    dir: &std::path::Path,
    addr: &str,
    answers: &str,
    extra: &[&str],
) -> (i32, String, String) {
    let file = dir.join(format!("answers-{}.json", rand_suffix()));
    std::fs::write(&file, answers).unwrap();
    let mut args = vec!["call", "--addr", addr, "--input", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    cli(&args, Some(TOKEN)).await
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test]
async fn call_answers_questions_from_an_input_file_on_a_2025_11_25_server() {
    answers_from_a_file("initialize").await;
}

#[tokio::test]
async fn call_answers_questions_from_an_input_file_on_a_2026_07_28_server() {
    answers_from_a_file("discover").await;
}

/// Forms (one, two, declined), a URL, sampling, a question the file does
/// not answer, and no answerer at all, against input_server.py.
async fn answers_from_a_file(lifecycle: &str) {
    let dir = tempfile::tempdir().unwrap();
    {
        // 2025-11-25 declares elicitation and sampling once, at initialize.
        let gateway = gateway(
            dir.path(),
            "ask",
            "input_server.py",
            lifecycle,
            "        input: {declare_on_session: true}\n",
        )
        .await;
        let addr = gateway.addr.to_string();
        let era = |what: &str| format!("{lifecycle}: {what}");

        let (code, out, err) = call_with(
            dir.path(),
            &addr,
            r#"[{"action":"accept","content":{"party_size":2,"date":"2026-12-31","confirm":true}}]"#,
            &["ask__book_table", r#"{"restaurant":"Chez Rust"}"#],
        )
        .await;
        assert_eq!(
            (code, out.trim()),
            (
                0,
                "booked Chez Rust: party_size=2 date=2026-12-31 confirm=true"
            ),
            "{}: {err}",
            era("a form accepted")
        );

        let (code, out, err) = call_with(
            dir.path(),
            &addr,
            r#"[{"action":"decline"}]"#,
            &["ask__book_table", r#"{"restaurant":"Chez Rust"}"#],
        )
        .await;
        assert_eq!(
            (code, out.trim()),
            (0, "declined"),
            "{}: {err}",
            era("declined")
        );

        // Two forms: answered by id on 2026-07-28 (one round, the server's
        // keys), in order on 2025-11-25 (name first, toolgate's ids).
        let (code, out, err) = call_with(
            dir.path(),
            &addr,
            r#"[{"id":"__main__:ask_colour","action":"accept","content":{"colour":"red"}},
                {"id":"__main__:ask_name","action":"accept","content":{"name":"Ada"}},
                {"action":"accept","content":{"name":"Ada"}},
                {"action":"accept","content":{"colour":"red"}}]"#,
            &["ask__two_questions"],
        )
        .await;
        assert_eq!(
            (code, out.trim()),
            (0, "name=Ada colour=red"),
            "{}: {err}",
            era("two forms")
        );

        let (code, out, err) = call_with(
            dir.path(),
            &addr,
            r#"[{"kind":"url","action":"accept"}]"#,
            &["ask__open_link", r#"{"url":"https://example.test/pay"}"#],
        )
        .await;
        assert_eq!((code, out.trim()), (0, "accept"), "{}: {err}", era("a URL"));

        let (code, out, err) = call_with(
            dir.path(),
            &addr,
            r#"[{"kind":"sampling","action":"accept","content":{"role":"assistant","content":{"type":"text","text":"in short"},"model":"answers-file"}}]"#,
            &["ask__summarise", r#"{"text":"a long text"}"#],
        )
        .await;
        assert_eq!(
            (code, out.trim()),
            (0, "in short"),
            "{}: {err}",
            era("sampling")
        );

        // A question the file does not answer: exit 64 naming it; nothing
        // answered on the user's behalf.
        let (code, out, err) = call_with(
            dir.path(),
            &addr,
            r#"[{"kind":"url","action":"accept"}]"#,
            &["ask__book_table", r#"{"restaurant":"Chez Rust"}"#],
        )
        .await;
        assert_eq!(code, 64, "{}: {out} {err}", era("unanswered"));
        assert!(
            err.contains("has no answer for question")
                && err.contains("Book a table at Chez Rust?"),
            "{}: {err}",
            era("unanswered")
        );

        // Without --input and without a terminal the call opts in to
        // nothing: the question never reaches anyone, and nothing is booked.
        let (code, out, err) = cli(
            &[
                "call",
                "--addr",
                &addr,
                "ask__book_table",
                r#"{"restaurant":"Chez Rust"}"#,
            ],
            Some(TOKEN),
        )
        .await;
        assert!(
            code != 0 && !out.contains("booked"),
            "{}: {code} {out} {err}",
            era("no answerer")
        );
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn call_follows_a_task_answers_it_and_cancels_it_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("tasks.log");
    let gateway = gateway(
        dir.path(),
        "tasks",
        "tasks_server.py",
        "discover",
        &format!("        env: {{TASKS_SERVER_LOG: \"{}\"}}\n", log.display()),
    )
    .await;
    let addr = gateway.addr.to_string();

    let (code, out, err) = cli(
        &[
            "call",
            "--addr",
            &addr,
            "--task",
            "tasks__slow_report",
            r#"{"seconds":0.5}"#,
        ],
        Some(TOKEN),
    )
    .await;
    assert_eq!((code, out.trim()), (0, "report ready after 0.5 s"), "{err}");
    // Not a terminal: one plain progress line per change.
    assert!(
        err.lines()
            .any(|l| l.starts_with("task ") && l.contains(": working")),
        "{err}"
    );

    let (code, out, err) = call_with(
        dir.path(),
        &addr,
        r#"[{"action":"accept","content":{"answer":"green"}}]"#,
        &["--task", "tasks__ask_then_finish", r#"{"topic":"tea"}"#],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "tea: green"), "{err}");

    let (code, _, err) = cli(
        &[
            "call",
            "--addr",
            &addr,
            "--task",
            "tasks__fails",
            r#"{"message":"boom"}"#,
        ],
        Some(TOKEN),
    )
    .await;
    assert_eq!(code, 18, "{err}");
    // The server's JSON-RPC error text is withheld, as a direct call's is
    // (issue 37: GetTask said it whole).
    assert!(
        err.contains("failed: server `tasks` answered tool `tasks__fails` with JSON-RPC error"),
        "{err}"
    );
    assert!(!err.contains("boom"), "{err}");

    // Ctrl-C while following: CancelTask reaches the server, exit 130.
    let mut child = tokio::process::Command::new(toolgate_bin())
        .args([
            "call",
            "--addr",
            &addr,
            "--task",
            "tasks__slow_report",
            r#"{"seconds":30}"#,
        ])
        .env("TOOLGATE_TOKEN", TOKEN)
        .env_remove("TOOLGATE_ADDR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let working = line.contains(": working");
            seen.push(line);
            if working {
                break;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no progress line: {seen:?}"));
    signal(child.id().unwrap(), "INT");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    while let Ok(Some(line)) = lines.next_line().await {
        seen.push(line);
    }
    assert_eq!(status.code(), Some(130), "{seen:?}");
    assert!(
        seen.iter().any(|l| l.contains("cancelling task")),
        "{seen:?}"
    );
    let cancels = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains(r#""method": "tasks/cancel""#) || l.contains(r#""method":"tasks/cancel""#)
        })
        .count();
    assert_eq!(cancels, 1, "tasks/cancel reached the server once");
    gateway.shutdown().await;
}

/// A scripted gateway that speaks the question and task RPCs the way the
/// API describes them, so `toolgate call`'s side of the protocol is checked
/// on the wire whatever the gateway's upstream does.
mod scripted {
    use std::sync::{Arc, Mutex};

    use tonic::{Request, Response, Status};
    use toolgate::grpc::reply::ListToolsReply;
    use toolgate::grpc::server::tool_gateway_server::{ToolGateway, ToolGatewayServer};
    use toolgate::pb;

    type Stream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

    /// What the CLI sent.
    #[derive(Debug, Default)]
    pub struct Seen {
        pub accepts: Option<pb::InputCapabilities>,
        pub accepts_task: bool,
        pub answers: Vec<pb::InputResponse>,
        pub request_state: String,
        pub gets: usize,
        pub cancelled: bool,
    }

    #[derive(Clone, Default)]
    pub struct Scripted {
        pub seen: Arc<Mutex<Seen>>,
        /// Answer InvokeToolInteractive as a gateway that does not know it.
        pub no_interactive: bool,
    }

    pub fn question(id: &str) -> pb::InputRequired {
        pb::InputRequired {
            requests: vec![pb::InputRequest {
                id: id.to_owned(),
                kind: Some(pb::input_request::Kind::Form(pb::FormInput {
                    message: "Name?".to_owned(),
                    requested_schema_json:
                        r#"{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}"#
                            .to_owned(),
                })),
            }],
            request_state: String::new(),
        }
    }

    fn text(t: String) -> pb::InvokeToolResponse {
        pb::InvokeToolResponse {
            text: t,
            ..Default::default()
        }
    }

    fn task(status: pb::TaskStatus, message: &str) -> pb::Task {
        pb::Task {
            task_id: "tgt_1".to_owned(),
            status: status.into(),
            status_message: message.to_owned(),
            poll_interval_ms: 10,
            ..Default::default()
        }
    }

    #[tonic::async_trait]
    impl ToolGateway for Scripted {
        async fn list_tools(
            &self,
            _: Request<pb::ListToolsRequest>,
        ) -> Result<Response<ListToolsReply>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn invoke_tool(
            &self,
            request: Request<pb::InvokeToolRequest>,
        ) -> Result<Response<pb::InvokeToolResponse>, Status> {
            let call = request.into_inner();
            let mut seen = self.seen.lock().unwrap();
            seen.accepts = call.accepts_input;
            seen.accepts_task = call.accepts_task;
            if call.name == "slow" {
                return Ok(Response::new(pb::InvokeToolResponse {
                    task: Some(Box::new(task(pb::TaskStatus::Working, "step 1 of 3"))),
                    ..Default::default()
                }));
            }
            // A unary 2026-07-28 round: asked, then retried with the state.
            if call.request_state.is_empty() {
                let mut asked = question("k1");
                asked.request_state = "sealed-1".to_owned();
                return Ok(Response::new(pb::InvokeToolResponse {
                    input_required: Some(asked),
                    ..Default::default()
                }));
            }
            seen.request_state = call.request_state.clone();
            seen.answers.extend(call.input_responses.iter().cloned());
            Ok(Response::new(text(format!(
                "retried {} {}",
                call.request_state, call.input_responses[0].content_json
            ))))
        }

        type InvokeToolStreamStream = Stream<pb::InvokeToolEvent>;

        async fn invoke_tool_stream(
            &self,
            _: Request<pb::InvokeToolRequest>,
        ) -> Result<Response<Self::InvokeToolStreamStream>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        type WatchToolsStream = Stream<ListToolsReply>;

        async fn watch_tools(
            &self,
            _: Request<pb::WatchToolsRequest>,
        ) -> Result<Response<Self::WatchToolsStream>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn search_tools(
            &self,
            _: Request<pb::SearchToolsRequest>,
        ) -> Result<Response<pb::SearchToolsResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn complete_authorization(
            &self,
            _: Request<pb::CompleteAuthorizationRequest>,
        ) -> Result<Response<pb::CompleteAuthorizationResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        type InvokeToolInteractiveStream = Stream<pb::InvokeToolEvent>;

        /// One question on the stream, then the result naming the answer.
        async fn invoke_tool_interactive(
            &self,
            request: Request<tonic::Streaming<pb::InteractiveRequest>>,
        ) -> Result<Response<Self::InvokeToolInteractiveStream>, Status> {
            use pb::interactive_request::Message;
            use pb::invoke_tool_event::Event;
            if self.no_interactive {
                return Err(Status::unimplemented("unknown method"));
            }
            let mut incoming = request.into_inner();
            let Some(Message::Call(call)) = incoming.message().await?.and_then(|m| m.message)
            else {
                return Err(Status::invalid_argument("the call first"));
            };
            {
                let mut seen = self.seen.lock().unwrap();
                seen.accepts = call.accepts_input;
                seen.accepts_task = call.accepts_task;
            }
            let seen = self.seen.clone();
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tokio::spawn(async move {
                if call.name == "slow" {
                    let became = pb::InvokeToolResponse {
                        task: Some(Box::new(task(pb::TaskStatus::Working, "step 1 of 3"))),
                        ..Default::default()
                    };
                    let _ = tx
                        .send(Ok(pb::InvokeToolEvent {
                            event: Some(Event::Result(became)),
                        }))
                        .await;
                    return;
                }
                let ask = pb::InvokeToolEvent {
                    event: Some(Event::InputRequired(question("q1"))),
                };
                if tx.send(Ok(ask)).await.is_err() {
                    return;
                }
                let answer = match incoming.message().await {
                    Ok(Some(pb::InteractiveRequest {
                        message: Some(Message::InputResponse(answer)),
                    })) => answer,
                    other => {
                        let _ = tx
                            .send(Err(Status::invalid_argument(format!("{other:?}"))))
                            .await;
                        return;
                    }
                };
                seen.lock().unwrap().answers.push(answer.clone());
                let result = pb::InvokeToolEvent {
                    event: Some(Event::Result(text(format!(
                        "answered {:?} {}",
                        answer.action(),
                        answer.content_json
                    )))),
                };
                let _ = tx.send(Ok(result)).await;
            });
            Ok(Response::new(Box::pin(
                tokio_stream::wrappers::ReceiverStream::new(rx),
            )))
        }

        /// Working, then a question, then (after UpdateTask) completed.
        async fn get_task(
            &self,
            _: Request<pb::GetTaskRequest>,
        ) -> Result<Response<pb::Task>, Status> {
            let mut seen = self.seen.lock().unwrap();
            seen.gets += 1;
            if seen.cancelled {
                return Ok(Response::new(task(pb::TaskStatus::Cancelled, "")));
            }
            if let Some(answer) = seen.answers.first() {
                let mut done = task(pb::TaskStatus::Completed, "");
                done.result = Some(Box::new(text(format!("task done {}", answer.content_json))));
                return Ok(Response::new(done));
            }
            if seen.gets < 2 {
                return Ok(Response::new(task(pb::TaskStatus::Working, "step 2 of 3")));
            }
            let mut asking = task(pb::TaskStatus::InputRequired, "");
            asking.input_required = Some(question("tq"));
            Ok(Response::new(asking))
        }

        async fn update_task(
            &self,
            request: Request<pb::UpdateTaskRequest>,
        ) -> Result<Response<pb::Task>, Status> {
            let update = request.into_inner();
            self.seen
                .lock()
                .unwrap()
                .answers
                .extend(update.input_responses);
            Ok(Response::new(task(pb::TaskStatus::Working, "step 3 of 3")))
        }

        async fn cancel_task(
            &self,
            _: Request<pb::CancelTaskRequest>,
        ) -> Result<Response<pb::Task>, Status> {
            self.seen.lock().unwrap().cancelled = true;
            Ok(Response::new(task(pb::TaskStatus::Cancelled, "")))
        }

        async fn list_resources(
            &self,
            _: Request<pb::ListResourcesRequest>,
        ) -> Result<Response<pb::ListResourcesResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn read_resource(
            &self,
            _: Request<pb::ReadResourceRequest>,
        ) -> Result<Response<pb::ReadResourceResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        type WatchResourceStream = Stream<pb::ResourceUpdate>;

        async fn watch_resource(
            &self,
            _: Request<pb::WatchResourceRequest>,
        ) -> Result<Response<Self::WatchResourceStream>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn list_prompts(
            &self,
            _: Request<pb::ListPromptsRequest>,
        ) -> Result<Response<pb::ListPromptsResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn get_prompt(
            &self,
            _: Request<pb::GetPromptRequest>,
        ) -> Result<Response<pb::GetPromptResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn complete(
            &self,
            _: Request<pb::CompleteRequest>,
        ) -> Result<Response<pb::CompleteResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn list_skills(
            &self,
            _: Request<pb::ListSkillsRequest>,
        ) -> Result<Response<pb::ListSkillsResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }

        async fn get_skill(
            &self,
            _: Request<pb::GetSkillRequest>,
        ) -> Result<Response<pb::GetSkillResponse>, Status> {
            Err(Status::unimplemented("scripted"))
        }
    }

    /// Serves `scripted` on 127.0.0.1:0; the address.
    pub async fn serve(scripted: Scripted) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ToolGatewayServer::new(scripted))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        addr
    }
}

#[tokio::test]
async fn call_speaks_the_question_and_task_rpcs_as_the_api_describes() {
    let dir = tempfile::tempdir().unwrap();
    let answers = r#"[{"action":"accept","content":{"name":"Ada"}},
                      {"action":"accept","content":{"name":"Bob"}}]"#;

    // Interactive: every kind accepted with --input; the answer goes back on
    // the stream.
    let gateway = scripted::Scripted::default();
    let addr = scripted::serve(gateway.clone()).await;
    let (code, out, err) = call_with(dir.path(), &addr, answers, &["ask"]).await;
    assert_eq!(
        (code, out.trim()),
        (0, r#"answered Accept {"name":"Ada"}"#),
        "{err}"
    );
    let accepts = gateway.seen.lock().unwrap().accepts;
    assert_eq!(
        accepts,
        Some(toolgate::pb::InputCapabilities {
            form: true,
            url: true,
            sampling: true
        })
    );

    // Without --input (stdin not a terminal): InvokeTool opting in to
    // nothing; an input_required it gets anyway is not answered.
    let gateway = scripted::Scripted::default();
    let addr = scripted::serve(gateway.clone()).await;
    let (code, _, err) = cli(&["call", "--addr", &addr, "plain"], Some(TOKEN)).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("the tool asks questions"), "{err}");
    assert_eq!(gateway.seen.lock().unwrap().accepts, None);

    // A gateway without InvokeToolInteractive: InvokeTool, then the unary
    // retry with the answer and the request_state unchanged.
    let gateway = scripted::Scripted {
        no_interactive: true,
        ..Default::default()
    };
    let addr = scripted::serve(gateway.clone()).await;
    let (code, out, err) = call_with(dir.path(), &addr, answers, &["ask"]).await;
    assert_eq!(
        (code, out.trim()),
        (0, r#"retried sealed-1 {"name":"Ada"}"#),
        "{err}"
    );
    assert_eq!(gateway.seen.lock().unwrap().answers[0].id, "k1");

    // --task: GetTask until a question, answered with UpdateTask, then the
    // result; plain progress lines on a pipe.
    let gateway = scripted::Scripted::default();
    let addr = scripted::serve(gateway.clone()).await;
    let (code, out, err) = call_with(dir.path(), &addr, answers, &["--task", "slow"]).await;
    assert_eq!(
        (code, out.trim()),
        (0, r#"task done {"name":"Ada"}"#),
        "{err}"
    );
    assert!(gateway.seen.lock().unwrap().accepts_task);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        [
            "task tgt_1: working: step 1 of 3",
            "task tgt_1: working: step 2 of 3",
            "task tgt_1: input required",
            "task tgt_1: working: step 3 of 3",
            "task tgt_1: completed",
        ],
        "{err}"
    );

    // A task question nobody answers: exit 64, the task left alone.
    let gateway = scripted::Scripted::default();
    let addr = scripted::serve(gateway.clone()).await;
    let (code, _, err) = cli(&["call", "--addr", &addr, "--task", "slow"], Some(TOKEN)).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("task tgt_1 needs answers"), "{err}");
    assert!(!gateway.seen.lock().unwrap().cancelled);

    // Ctrl-C while following: CancelTask, exit 130.
    let gateway = scripted::Scripted::default();
    let addr = scripted::serve(gateway.clone()).await;
    let mut child = tokio::process::Command::new(toolgate_bin())
        .args(["call", "--addr", &addr, "--task", "slow"])
        .env("TOOLGATE_TOKEN", TOKEN)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("task tgt_1: working: step 1 of 3"));
    signal(child.id().unwrap(), "INT");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(gateway.seen.lock().unwrap().cancelled);
}
