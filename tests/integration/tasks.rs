//! Tasks (SEP-2663) through the gateway, against a real third-party
//! implementation: PrefectHQ's `fastmcp-tasks` (`tests/fixtures/python/
//! tasks_server.py`, at protocol 2026-07-28: `lifecycle: discover`), over
//! stdio and Streamable HTTP. A worker that sets nothing gets a task tool's
//! result as from any tool (toolgate declares the extension after the
//! server's `-32021` and follows the task); a worker with `accepts_task`
//! gets toolgate's task id and follows it with GetTask, UpdateTask and
//! CancelTask, from any replica sharing the state store.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

const TOKEN: &str = "tasks-acme-token";
const OTHER_TENANT: &str = "tasks-globex-token";
/// A shared `state.keys` entry (32 bytes, base64) for the two-gateway test.
const STATE_KEY: &str = "dGFza3MtdGVzdC1rZXktMzItYnl0ZXMtZXhhY3RseSE=";

/// How the gateway reaches the tasks server.
#[derive(Clone, Copy, Debug)]
enum Reach {
    Stdio,
    Http,
}

/// A tasks server (for HTTP: running; for stdio: spawned by the gateway),
/// its log, and a scratch directory (state store, audit file).
struct Fixture {
    dir: tempfile::TempDir,
    log: PathBuf,
    server: String,
    _http: Option<ChildGuard>,
}

impl Fixture {
    async fn start(reach: Reach) -> Fixture {
        Self::with_input(reach, "").await
    }

    /// `input` is extra YAML under the server's `input:` key.
    async fn with_input(reach: Reach, input: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("tasks_server.log");
        let script = fixture("python/tasks_server.py");
        let input = if input.is_empty() {
            String::new()
        } else {
            format!("        input:\n{input}")
        };
        let (server, http) = match reach {
            Reach::Stdio => (
                format!(
                    "      - name: tasks\n        command: [\"{}\", \"{}\", \"stdio\"]\n        \
                     lifecycle: discover\n{input}        env:\n          TASKS_SERVER_LOG: \"{}\"\n",
                    python().display(),
                    script.display(),
                    log.display()
                ),
                None,
            ),
            Reach::Http => {
                let (guard, url) = start_tasks_http(&log).await;
                (
                    format!(
                        "      - name: tasks\n        url: \"{url}\"\n        \
                         lifecycle: discover\n{input}"
                    ),
                    Some(guard),
                )
            }
        };
        Fixture {
            dir,
            log,
            server,
            _http: http,
        }
    }

    /// Tenants `acme` and `globex`, each with the tasks server; the state
    /// store in the scratch directory unless `state` says otherwise.
    fn yaml(&self, state: Option<&str>, acme_policy: &str) -> String {
        let default_state = format!(
            "state:\n  url: \"sqlite://{}/state.db\"\n",
            self.dir.path().display()
        );
        let state = state.map_or(default_state, str::to_owned);
        format!(
            "{state}tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{server}{acme_policy}\
             \n  - name: globex\n    tokens: [{OTHER_TENANT}]\n    servers:\n{server}",
            server = self.server
        )
    }

    /// The server's log lines so far.
    fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Waits (at most 15 s) until a log line satisfies `wanted`.
    async fn wait_for(&self, what: &str, wanted: impl Fn(&serde_json::Value) -> bool) {
        let started = Instant::now();
        while !self.lines().iter().any(&wanted) {
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "no {what} in the server's log: {:?}",
                self.lines()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The `method`s of the requests logged for `tool` (tools/call) and
    /// every tasks/* request, with whether each declared the extension.
    fn requests(&self) -> Vec<(String, bool)> {
        self.lines()
            .iter()
            .filter(|l| l["event"] == "request")
            .map(|l| {
                (
                    l["method"].as_str().unwrap_or_default().to_owned(),
                    l["tasksDeclared"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    }
}

/// `message` as `token`, for `subject` when given, with a deadline when
/// given.
fn request<T>(
    token: &str,
    subject: Option<&str>,
    deadline: Option<Duration>,
    message: T,
) -> tonic::Request<T> {
    let mut request = authed(token, message);
    if let Some(subject) = subject {
        request
            .metadata_mut()
            .insert("x-toolgate-subject", subject.parse().unwrap());
    }
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    request
}

fn call(name: &str, arguments: &str, accepts_task: bool) -> pb::InvokeToolRequest {
    pb::InvokeToolRequest {
        name: name.to_owned(),
        arguments_json: arguments.to_owned(),
        accepts_task,
        ..Default::default()
    }
}

/// Waits (at most 30 s) until `token`'s catalog lists `tasks__echo`.
async fn wait_tasks_listed(client: &mut ToolGatewayClient<Channel>, token: &str) {
    wait_listed(client, token, "tasks__echo").await;
}

/// Starts a task of `name` as acme (accepts_task) and returns it.
async fn start_task(
    client: &mut ToolGatewayClient<Channel>,
    subject: Option<&str>,
    name: &str,
    arguments: &str,
) -> pb::Task {
    let response = client
        .invoke_tool(request(TOKEN, subject, None, call(name, arguments, true)))
        .await
        .unwrap_or_else(|s| panic!("{name}: {s:?}"))
        .into_inner();
    assert!(
        response.text.is_empty() && response.content.is_empty(),
        "{response:?}"
    );
    let task = *response.task.expect("the call answers a task at once");
    assert!(task.task_id.starts_with("tgt_"), "{task:?}");
    assert_eq!(task.task_id.len(), 26, "{task:?}");
    task
}

async fn get_task(
    client: &mut ToolGatewayClient<Channel>,
    token: &str,
    subject: Option<&str>,
    task_id: &str,
) -> Result<pb::Task, tonic::Status> {
    client
        .get_task(request(
            token,
            subject,
            None,
            pb::GetTaskRequest {
                task_id: task_id.to_owned(),
            },
        ))
        .await
        .map(tonic::Response::into_inner)
}

/// GetTask (as acme) until the task reaches `status` (at most 20 s, at
/// the task's poll interval).
async fn until(
    client: &mut ToolGatewayClient<Channel>,
    task_id: &str,
    status: pb::TaskStatus,
) -> pb::Task {
    let started = Instant::now();
    loop {
        let task = get_task(client, TOKEN, None, task_id).await.unwrap();
        if task.status == status as i32 {
            return task;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the task never reached {status:?}: {task:?}"
        );
        tokio::time::sleep(Duration::from_millis(u64::from(task.poll_interval_ms))).await;
    }
}

fn assert_not_found(result: Result<pb::Task, tonic::Status>, what: &str) {
    let status = result.expect_err(what);
    assert_eq!(status.code(), tonic::Code::NotFound, "{what}: {status:?}");
    assert_eq!(reason(&status), "TASK_NOT_FOUND", "{what}: {status:?}");
}

#[tokio::test]
async fn a_task_tool_answers_a_worker_that_sets_nothing() {
    for reach in [Reach::Stdio, Reach::Http] {
        let fixture = Fixture::start(reach).await;
        let gateway = TestGateway::start(&fixture.yaml(None, ""), &[]).await;
        let mut client = gateway.client().await;
        wait_tasks_listed(&mut client, TOKEN).await;
        let response = invoke(
            &mut client,
            TOKEN,
            "tasks__slow_report",
            r#"{"seconds": 0.5}"#,
        )
        .await
        .unwrap_or_else(|s| panic!("{reach:?}: {s:?}"));
        assert_eq!(response.text, "report ready after 0.5 s", "{reach:?}");
        assert!(response.task.is_none(), "{reach:?}");
        let requests = fixture.requests();
        // Refused without the extension (-32021: the tool did not run),
        // sent again with it, then followed with tasks/get.
        assert_eq!(
            requests[..2],
            [
                ("tools/call".to_owned(), false),
                ("tools/call".to_owned(), true)
            ],
            "{reach:?}: {requests:?}"
        );
        assert!(
            requests[2..]
                .iter()
                .all(|r| *r == ("tasks/get".to_owned(), true)),
            "{reach:?}: {requests:?}"
        );
        assert!(requests.len() > 2, "{reach:?}: {requests:?}");
        // A tool that is not a task tool is sent once, as before.
        let echo = invoke(&mut client, TOKEN, "tasks__echo", r#"{"text": "hi"}"#)
            .await
            .unwrap();
        assert_eq!(echo.text, "hi");
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn a_caller_deadline_shorter_than_the_task_cancels_it_upstream() {
    for reach in [Reach::Stdio, Reach::Http] {
        let fixture = Fixture::start(reach).await;
        let gateway = TestGateway::start(&fixture.yaml(None, ""), &[]).await;
        let mut client = gateway.client().await;
        wait_tasks_listed(&mut client, TOKEN).await;
        let status = client
            .invoke_tool(request(
                TOKEN,
                None,
                Some(Duration::from_secs(2)),
                call("tasks__slow_report", r#"{"seconds": 30}"#, false),
            ))
            .await
            .expect_err("the task outlives the deadline");
        assert_eq!(
            status.code(),
            tonic::Code::DeadlineExceeded,
            "{reach:?}: {status:?}"
        );
        assert_eq!(
            reason(&status),
            "DEADLINE_EXCEEDED",
            "{reach:?}: {status:?}"
        );
        fixture
            .wait_for("tasks/cancel", |l| l["method"] == "tasks/cancel")
            .await;
        fixture
            .wait_for("task_cancelled", |l| l["event"] == "task_cancelled")
            .await;
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn a_worker_that_accepts_tasks_follows_one_to_its_result() {
    for reach in [Reach::Stdio, Reach::Http] {
        let fixture = Fixture::start(reach).await;
        let metrics_port = free_port();
        let audit = fixture.dir.path().join("audit.jsonl");
        let yaml = format!(
            "metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\naudit:\n  path: \"{}\"\n{}",
            audit.display(),
            fixture.yaml(None, "")
        );
        let gateway = TestGateway::start(&yaml, &[]).await;
        let mut client = gateway.client().await;
        wait_tasks_listed(&mut client, TOKEN).await;
        let task = start_task(
            &mut client,
            None,
            "tasks__slow_report",
            r#"{"seconds": 0.5}"#,
        )
        .await;
        assert_eq!(task.status, pb::TaskStatus::Working as i32, "{task:?}");
        assert_eq!(
            task.poll_interval_ms, 100,
            "the server's 100 ms, above toolgate's 50 ms floor"
        );
        assert!(task.expires_at_unix_ms > 0);
        // The call declared the extension at once: one tools/call.
        assert_eq!(
            fixture.requests()[0],
            ("tools/call".to_owned(), true),
            "{reach:?}"
        );
        let done = until(&mut client, &task.task_id, pb::TaskStatus::Completed).await;
        let result = done.result.expect("a completed task has its result");
        assert_eq!(result.text, "report ready after 0.5 s");
        assert!(!result.is_error);
        assert_eq!(done.expires_at_unix_ms, task.expires_at_unix_ms);

        // Counted and recorded without the id.
        let page = scrape(metrics_port).await;
        for event in ["created", "completed"] {
            let series = format!(
                "toolgate_tasks_total{{tenant=\"acme\",server=\"tasks\",tool=\"tasks__slow_report\",event=\"{event}\"}}"
            );
            assert_eq!(
                sample(&page, &series).as_deref(),
                Some("1"),
                "{series}: {page}"
            );
        }
        assert!(!page.contains(&task.task_id));
        gateway.shutdown().await;
        let text = std::fs::read_to_string(&audit).unwrap();
        assert!(!text.contains(&task.task_id), "{text}");
        let events: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r["kind"] == "task")
            .map(|r| {
                assert_eq!(r["tool"], "tasks__slow_report");
                assert_eq!(r["task"].as_str().map(str::len), Some(16));
                r["event"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(events, ["task_created", "task_completed"], "{reach:?}");
    }
}

#[tokio::test]
async fn a_task_that_asks_is_answered_with_update_task_and_one_that_fails_is_failed() {
    let fixture = Fixture::start(Reach::Http).await;
    let gateway = TestGateway::start(&fixture.yaml(None, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_tasks_listed(&mut client, TOKEN).await;

    let task = start_task(
        &mut client,
        None,
        "tasks__ask_then_finish",
        r#"{"topic": "tea"}"#,
    )
    .await;
    let asking = until(&mut client, &task.task_id, pb::TaskStatus::InputRequired).await;
    let asked = asking.input_required.expect("the question");
    assert_eq!(asked.requests.len(), 1, "{asked:?}");
    let question = &asked.requests[0];
    let Some(pb::input_request::Kind::Form(form)) = &question.kind else {
        panic!("a form question: {question:?}");
    };
    assert_eq!(form.message, "Your answer about tea?");
    // An answer to a question that was not asked is refused, nothing sent.
    let wrong = client
        .update_task(authed(
            TOKEN,
            pb::UpdateTaskRequest {
                task_id: task.task_id.clone(),
                input_responses: vec![pb::InputResponse {
                    id: "nope".to_owned(),
                    action: pb::InputAction::Accept as i32,
                    content_json: r#"{"answer": "x"}"#.to_owned(),
                }],
            },
        ))
        .await
        .expect_err("an unknown id");
    assert_eq!(reason(&wrong), "INPUT_RESPONSE_INVALID", "{wrong:?}");
    let answer = pb::UpdateTaskRequest {
        task_id: task.task_id.clone(),
        input_responses: vec![pb::InputResponse {
            id: question.id.clone(),
            action: pb::InputAction::Accept as i32,
            content_json: r#"{"answer": "green"}"#.to_owned(),
        }],
    };
    client
        .update_task(authed(TOKEN, answer.clone()))
        .await
        .unwrap();
    let done = until(&mut client, &task.task_id, pb::TaskStatus::Completed).await;
    assert_eq!(done.result.unwrap().text, "tea: green");
    let finished = client
        .update_task(authed(TOKEN, answer))
        .await
        .expect_err("a finished task takes no answers");
    assert_eq!(finished.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&finished), "TASK_FINISHED");

    // A task that fails with a JSON-RPC error: its text is withheld as a
    // direct call's is (and logged), the server's status message too.
    let failing = start_task(
        &mut client,
        None,
        "tasks__fails",
        r#"{"message": "boom at db-password-123"}"#,
    )
    .await;
    let failed = until(&mut client, &failing.task_id, pb::TaskStatus::Failed).await;
    assert!(
        !failed.status_message.contains("db-password-123"),
        "{failed:?}"
    );
    assert!(failed.result.is_none());
    let direct = invoke(
        &mut client,
        TOKEN,
        "tasks__fails",
        r#"{"message": "boom at db-password-123"}"#,
    )
    .await
    .expect_err("the task failed");
    assert_eq!(failed.status_message, direct.message(), "as a direct call");

    // A worker that sets nothing cannot answer: the followed task is
    // cancelled and the call refused, naming InvokeToolInteractive.
    let refused = invoke(
        &mut client,
        TOKEN,
        "tasks__ask_then_finish",
        r#"{"topic": "x"}"#,
    )
    .await
    .expect_err("nobody answers");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert_eq!(reason(&refused), "INPUT_REQUIRES_INTERACTIVE");
    // And one that fails is the server's error.
    let failed = invoke(&mut client, TOKEN, "tasks__fails", r#"{"message": "boom"}"#)
        .await
        .expect_err("the task failed");
    assert_eq!(reason(&failed), "UPSTREAM_INTERNAL_ERROR", "{failed:?}");
    gateway.shutdown().await;
    fixture
        .wait_for("tasks/cancel", |l| l["method"] == "tasks/cancel")
        .await;
}

#[tokio::test]
async fn cancel_task_cancels_it_at_the_server() {
    let fixture = Fixture::start(Reach::Stdio).await;
    let gateway = TestGateway::start(&fixture.yaml(None, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_tasks_listed(&mut client, TOKEN).await;
    let task = start_task(
        &mut client,
        None,
        "tasks__slow_report",
        r#"{"seconds": 30}"#,
    )
    .await;
    let cancelled = client
        .cancel_task(authed(
            TOKEN,
            pb::CancelTaskRequest {
                task_id: task.task_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.task_id, task.task_id);
    until(&mut client, &task.task_id, pb::TaskStatus::Cancelled).await;
    fixture
        .wait_for("task_cancelled", |l| l["event"] == "task_cancelled")
        .await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn task_ids_of_other_callers_forged_or_expired_are_not_found() {
    let fixture = Fixture::with_input(Reach::Http, "          task_ttl: 3s\n").await;
    let gateway = TestGateway::start(&fixture.yaml(None, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_tasks_listed(&mut client, TOKEN).await;
    wait_tasks_listed(&mut client, OTHER_TENANT).await;
    let task = start_task(
        &mut client,
        Some("alice"),
        "tasks__slow_report",
        r#"{"seconds": 30}"#,
    )
    .await;
    let id = task.task_id.as_str();
    // Alice sees her task.
    get_task(&mut client, TOKEN, Some("alice"), id)
        .await
        .expect("the caller's own task");
    assert_not_found(
        get_task(&mut client, OTHER_TENANT, Some("alice"), id).await,
        "another tenant",
    );
    assert_not_found(
        get_task(&mut client, TOKEN, Some("bob"), id).await,
        "another subject",
    );
    assert_not_found(
        get_task(&mut client, TOKEN, None, id).await,
        "the tenant itself",
    );
    let forged = format!("tgt_{}", "A".repeat(22));
    assert_not_found(
        get_task(&mut client, TOKEN, Some("alice"), &forged).await,
        "a forged id",
    );
    assert_not_found(
        get_task(&mut client, TOKEN, Some("alice"), "nope").await,
        "a malformed id",
    );
    let cancel_foreign = client
        .cancel_task(request(
            OTHER_TENANT,
            Some("alice"),
            None,
            pb::CancelTaskRequest {
                task_id: id.to_owned(),
            },
        ))
        .await
        .expect_err("another tenant cannot cancel it");
    assert_eq!(reason(&cancel_foreign), "TASK_NOT_FOUND");
    // Nothing reached the server for those: one tools/call, one tasks/get.
    let requests = fixture.requests();
    assert_eq!(
        requests
            .iter()
            .filter(|(m, _)| m.starts_with("tasks/"))
            .count(),
        1,
        "{requests:?}"
    );
    // Once expired (task_ttl 3 s, shorter than the server's 15 min), it
    // is gone.
    let started = Instant::now();
    loop {
        match get_task(&mut client, TOKEN, Some("alice"), id).await {
            Ok(_) => {
                assert!(started.elapsed() < Duration::from_secs(10), "never expired");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(status) => {
                assert_not_found(Err(status), "an expired id");
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                assert!(now >= task.expires_at_unix_ms, "gone before it expired");
                break;
            }
        }
    }
    gateway.shutdown().await;
}

/// Two `toolgate serve` processes on one PostgreSQL store with the same
/// `state.keys`, an HTTP tasks server and a stdio one (`local`): a task of
/// the HTTP server started at one is followed at the other, whose stricter
/// policy (denying `tasks__fails`) applies to the tasks of that tool; a
/// stdio server's task is reachable only where its child runs
/// (`TASK_ELSEWHERE` at the other).
#[tokio::test]
async fn a_task_is_followed_at_another_gateway_under_its_policy() {
    let pg = PgCluster::start();
    let mut fixture = Fixture::start(Reach::Http).await;
    let local = Fixture::start(Reach::Stdio).await;
    fixture
        .server
        .push_str(&local.server.replace("name: tasks", "name: local"));
    let state = format!(
        "state:\n  url: \"{}\"\n  keys: [\"{STATE_KEY}\"]\n",
        pg.url()
    );
    let mut processes = Vec::new();
    let mut ports = Vec::new();
    for (index, policy) in ["", "    policy:\n      - deny: \"tasks__fails\"\n"]
        .into_iter()
        .enumerate()
    {
        let port = free_port();
        let config = fixture.dir.path().join(format!("gateway{index}.yaml"));
        std::fs::write(
            &config,
            format!(
                "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n{}",
                fixture.yaml(Some(&state), policy)
            ),
        )
        .unwrap();
        let log = fixture.dir.path().join(format!("gateway{index}.log"));
        processes.push(serve_binary(&config, &log, &[]));
        ports.push(port);
    }
    for port in &ports {
        wait_for_port(*port).await;
    }
    let mut first = client_at(ports[0]).await;
    let mut second = client_at(ports[1]).await;
    wait_tasks_listed(&mut first, TOKEN).await;
    wait_tasks_listed(&mut second, TOKEN).await;

    let task = start_task(
        &mut first,
        None,
        "tasks__slow_report",
        r#"{"seconds": 0.5}"#,
    )
    .await;
    let done = until(&mut second, &task.task_id, pb::TaskStatus::Completed).await;
    assert_eq!(done.result.unwrap().text, "report ready after 0.5 s");

    let failing = start_task(&mut first, None, "tasks__fails", r#"{"message": "boom"}"#).await;
    get_task(&mut first, TOKEN, None, &failing.task_id)
        .await
        .expect("allowed where it started");
    let denied = get_task(&mut second, TOKEN, None, &failing.task_id)
        .await
        .expect_err("the second gateway's policy denies the tool");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert_eq!(reason(&denied), "TOOL_NOT_PERMITTED");

    wait_listed(&mut first, TOKEN, "local__echo").await;
    wait_listed(&mut second, TOKEN, "local__echo").await;
    let child = start_task(&mut first, None, "local__slow_report", r#"{"seconds": 30}"#).await;
    let elsewhere = get_task(&mut second, TOKEN, None, &child.task_id)
        .await
        .expect_err("the task lives in the first gateway's child");
    assert_eq!(elsewhere.code(), tonic::Code::Unavailable, "{elsewhere:?}");
    assert_eq!(reason(&elsewhere), "TASK_ELSEWHERE");
    let here = get_task(&mut first, TOKEN, None, &child.task_id)
        .await
        .expect("reachable where it runs");
    assert_eq!(here.status, pb::TaskStatus::Working as i32, "{here:?}");
    drop(processes);

    // Neither toolgate's ids nor the servers' reach the INFO logs.
    let mut ids: Vec<String> = [&task, &failing, &child]
        .iter()
        .map(|t| t.task_id.clone())
        .collect();
    for log in [&fixture, &local] {
        ids.extend(
            log.lines()
                .iter()
                .filter_map(|l| l["taskId"].as_str().map(str::to_owned)),
        );
    }
    assert!(ids.len() > 3, "{ids:?}");
    for index in 0..2 {
        let log = std::fs::read_to_string(fixture.dir.path().join(format!("gateway{index}.log")))
            .unwrap();
        for id in &ids {
            assert!(!log.contains(id.as_str()), "{id} in gateway{index}.log");
        }
    }
}

#[tokio::test]
async fn a_server_without_input_tasks_never_gets_the_extension() {
    let fixture = Fixture::with_input(Reach::Http, "          tasks: false\n").await;
    let gateway = TestGateway::start(&fixture.yaml(None, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_tasks_listed(&mut client, TOKEN).await;
    for accepts_task in [false, true] {
        let status = client
            .invoke_tool(authed(
                TOKEN,
                call("tasks__slow_report", r#"{"seconds": 0.5}"#, accepts_task),
            ))
            .await
            .expect_err("the tool runs only as a task");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert_eq!(reason(&status), "TASK_REQUIRED", "{status:?}");
    }
    // Sent once each, never with the extension.
    assert_eq!(
        fixture.requests(),
        [
            ("tools/call".to_owned(), false),
            ("tools/call".to_owned(), false)
        ]
    );
    gateway.shutdown().await;
}

/// A followed task's questions go to the call's asker (what
/// `InvokeToolInteractive` sets) and its answers back with `tasks/update`:
/// `Session::call` on a session of its own, over stdio.
#[tokio::test]
async fn a_followed_task_asks_the_calls_asker_and_is_answered_with_tasks_update() {
    use toolgate::upstream::{Action, Answer, CallOutcome, CallRequest, Question};
    let fixture = Fixture::start(Reach::Stdio).await;
    let env: std::collections::HashMap<String, String> =
        std::iter::once(("PATH".to_owned(), std::env::var("PATH").unwrap_or_default())).collect();
    let config = toolgate::config::Config::from_yaml(
        &fixture.yaml(None, ""),
        "test.yaml",
        std::path::Path::new("."),
        &env,
    )
    .unwrap();
    let server = &config.tenants[0].servers[0];
    let label = toolgate::upstream::Label {
        tenant: "acme".to_owned(),
        server: server.name.clone(),
    };
    let redactor: toolgate::credentials::SharedRedactor =
        std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(Default::default()));
    let connected = toolgate::upstream::connect(server, &label, &env, 1 << 20, &redactor)
        .await
        .unwrap();
    let session = connected.session;

    let (asker, mut rounds) = tokio::sync::mpsc::channel::<toolgate::upstream::Round>(1);
    let worker = tokio::spawn(async move {
        let round = rounds.recv().await.expect("one round of questions");
        assert_eq!(round.asked.len(), 1, "{:?}", round.asked);
        let asked = &round.asked[0];
        let Question::Form { message, .. } = &asked.question else {
            panic!("a form: {asked:?}");
        };
        assert_eq!(message, "Your answer about tea?");
        round
            .reply
            .send(vec![Answer {
                id: asked.id.clone(),
                action: Action::Accept,
                content: Some(serde_json::json!({"answer": "green"})),
            }])
            .unwrap();
    });
    let mut arguments = serde_json::Map::new();
    arguments.insert("topic".to_owned(), "tea".into());
    let mut call = CallRequest::new("ask_then_finish", arguments, Duration::from_secs(20));
    call.tasks_allowed = true;
    call.asker = Some(asker);
    let outcome = session.call(&call).await.unwrap();
    worker.await.unwrap();
    let CallOutcome::Complete(result) = outcome else {
        panic!("the followed task's result: {outcome:?}");
    };
    let text = result.content[0].as_text().map(|t| t.text.clone());
    assert_eq!(text.as_deref(), Some("tea: green"));
    assert!(
        fixture
            .requests()
            .contains(&("tasks/update".to_owned(), true)),
        "{:?}",
        fixture.requests()
    );
    session.close().await;
}

/// A tenant with 1000 open tasks gets no more: a call with `accepts_task`
/// is `TASK_LIMIT` before anything is sent (the server sees no call).
#[tokio::test]
async fn a_tenant_has_at_most_1000_open_tasks() {
    let fixture = Fixture::start(Reach::Http).await;
    let url = format!("sqlite://{}/state.db", fixture.dir.path().display());
    let store = toolgate::state::StateStore::connect(
        &url,
        toolgate::state::KeyRing::new(vec![[7; 32]]).unwrap(),
    )
    .await
    .unwrap();
    let far = 4_102_444_800_000; // 2100-01-01
    for index in 0..1000 {
        store
            .put_task(&format!("tgt_filler{index}"), "acme", b"{}", far, u64::MAX)
            .await
            .unwrap();
    }
    store.close().await;
    let gateway = TestGateway::start(&fixture.yaml(None, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_tasks_listed(&mut client, TOKEN).await;
    let status = client
        .invoke_tool(authed(
            TOKEN,
            call("tasks__slow_report", r#"{"seconds": 30}"#, true),
        ))
        .await
        .expect_err("over the limit");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "TASK_LIMIT");
    // Refused before anything was sent: the server saw no call.
    let requests = fixture.requests();
    assert!(
        requests.iter().all(|(method, _)| method != "tools/call"),
        "{requests:?}"
    );
    // Another tenant is not held back.
    wait_tasks_listed(&mut client, OTHER_TENANT).await;
    let other = client
        .invoke_tool(authed(
            OTHER_TENANT,
            call("tasks__slow_report", r#"{"seconds": 0.5}"#, true),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(other.task.is_some());
    gateway.shutdown().await;
}

/// tasks_server.py over Streamable HTTP on a free port, logging to `log`:
/// its guard and its URL, once it listens.
pub(crate) async fn start_tasks_http(log: &std::path::Path) -> (ChildGuard, String) {
    let port = free_port();
    let child = std::process::Command::new(python())
        .arg(fixture("python/tasks_server.py"))
        .args(["http", &port.to_string()])
        .env("TASKS_SERVER_LOG", log)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let guard = ChildGuard(child);
    // fastmcp takes seconds to import on a busy machine.
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the tasks server never listened on {port}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (guard, format!("http://127.0.0.1:{port}/mcp"))
}
