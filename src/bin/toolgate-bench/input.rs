//! A call that asks one question, and a call that becomes a task, against
//! the plain call, through one gateway in front of the benchmark's asking
//! server ([`super::ask_server`], Streamable HTTP) configured twice: as a
//! 2025-11-25 server (`old`, `initialize`: the question is an
//! `elicitation/create` on the call's POST stream while the call is
//! pending) and as a 2026-07-28 server (`new`, `discover`: an
//! `input_required` result, the call sent again with the answer). Each path
//! is measured sequentially, interleaved over rounds: p50, and the gateway's
//! CPU per call; both are printed as ratios to the plain call of the same
//! run.
//!
//! Paths: the plain call (`old__echo`, InvokeTool); one question over
//! InvokeToolInteractive on each era; one question over unary InvokeTool on
//! 2026-07-28 (input_required, then the retry with the sealed
//! request_state: two RPCs); a task with `accepts_task` followed with
//! GetTask to completion (two RPCs); the same task followed by toolgate
//! itself (a call without `accepts_task`: the `-32021` retry, then
//! `tasks/get`).

use std::time::Instant;

use anyhow::Context as _;
use toolgate::pb;

use super::harness::{Proc, authed, exe, free_port, gateway_with, grpc, spawn, wait_port};
use super::measure::{cpu_seconds, median};

type Client = pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>;

/// Sequential calls of each path per round.
const CALLS: usize = 200;

/// The measured paths, in the order printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Plain,
    InteractiveOld,
    InteractiveNew,
    UnaryNew,
    TaskFollowedByWorker,
    TaskFollowedByGateway,
}

impl Path {
    const ALL: [Path; 6] = [
        Path::Plain,
        Path::InteractiveOld,
        Path::InteractiveNew,
        Path::UnaryNew,
        Path::TaskFollowedByWorker,
        Path::TaskFollowedByGateway,
    ];

    fn name(self) -> &'static str {
        match self {
            Path::Plain => "plain call",
            Path::InteractiveOld => "one question, InvokeToolInteractive, 2025-11-25",
            Path::InteractiveNew => "one question, InvokeToolInteractive, 2026-07-28",
            Path::UnaryNew => "one question, unary InvokeTool + retry, 2026-07-28",
            Path::TaskFollowedByWorker => "task, accepts_task + GetTask",
            Path::TaskFollowedByGateway => "task, followed by toolgate",
        }
    }
}

fn form() -> pb::InputCapabilities {
    pb::InputCapabilities {
        form: true,
        ..Default::default()
    }
}

fn answer(id: &str) -> pb::InputResponse {
    pb::InputResponse {
        id: id.to_owned(),
        action: pb::InputAction::Accept.into(),
        content_json: r#"{"answer":"yes"}"#.to_owned(),
    }
}

fn expect_text(result: &pb::InvokeToolResponse, prefix: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !result.is_error && result.text.starts_with(prefix),
        "unexpected result: {result:?}"
    );
    Ok(())
}

/// One call over InvokeToolInteractive, answering every question.
async fn interactive(client: &mut Client, tool: &str) -> anyhow::Result<()> {
    use pb::interactive_request::Message;
    use pb::invoke_tool_event::Event;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::InteractiveRequest {
        message: Some(Message::Call(pb::InvokeToolRequest {
            name: tool.to_owned(),
            arguments_json: "{}".to_owned(),
            accepts_input: Some(form()),
            ..Default::default()
        })),
    })
    .await?;
    let mut events = client
        .invoke_tool_interactive(authed(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await?
        .into_inner();
    let mut asked = 0;
    while let Some(event) = events.message().await? {
        match event.event {
            Some(Event::InputRequired(questions)) => {
                for q in &questions.requests {
                    asked += 1;
                    tx.send(pb::InteractiveRequest {
                        message: Some(Message::InputResponse(answer(&q.id))),
                    })
                    .await?;
                }
            }
            Some(Event::Result(result)) => {
                anyhow::ensure!(asked == 1, "{tool}: {asked} questions, expected 1");
                return expect_text(&result, "answered");
            }
            _ => {}
        }
    }
    anyhow::bail!("{tool}: the stream ended without a result")
}

/// One question over unary InvokeTool: input_required, then the retry.
async fn unary(client: &mut Client, tool: &str) -> anyhow::Result<()> {
    let call = pb::InvokeToolRequest {
        name: tool.to_owned(),
        arguments_json: "{}".to_owned(),
        accepts_input: Some(form()),
        ..Default::default()
    };
    let first = client.invoke_tool(authed(call.clone())).await?.into_inner();
    let asked = first
        .input_required
        .with_context(|| format!("{tool}: no input_required: {:?}", first.text))?;
    let retry = pb::InvokeToolRequest {
        input_responses: asked.requests.iter().map(|q| answer(&q.id)).collect(),
        request_state: asked.request_state,
        ..call
    };
    let result = client.invoke_tool(authed(retry)).await?.into_inner();
    expect_text(&result, "answered")
}

/// A task: with `accepts_task`, followed with GetTask; without, by toolgate.
async fn task(client: &mut Client, tool: &str, accepts_task: bool) -> anyhow::Result<()> {
    let call = pb::InvokeToolRequest {
        name: tool.to_owned(),
        arguments_json: "{}".to_owned(),
        accepts_task,
        ..Default::default()
    };
    let mut result = client.invoke_tool(authed(call)).await?.into_inner();
    let Some(mut task) = result.task.take().map(|t| *t) else {
        anyhow::ensure!(!accepts_task, "{tool}: accepts_task, but no task");
        return expect_text(&result, "report ready");
    };
    for _ in 0..1000 {
        if task.status() == pb::TaskStatus::Completed {
            let result = task.result.map(|r| *r).unwrap_or_default();
            return expect_text(&result, "report ready");
        }
        anyhow::ensure!(
            task.status() == pb::TaskStatus::Working,
            "{tool}: task {:?}",
            task.status()
        );
        let get = pb::GetTaskRequest {
            task_id: task.task_id.clone(),
        };
        task = client.get_task(authed(get)).await?.into_inner();
    }
    anyhow::bail!("{tool}: the task did not complete within 1000 GetTask")
}

async fn call(client: &mut Client, path: Path) -> anyhow::Result<()> {
    match path {
        Path::Plain => {
            let call = pb::InvokeToolRequest {
                name: "old__echo".to_owned(),
                arguments_json: r#"{"message":"hi"}"#.to_owned(),
                ..Default::default()
            };
            let result = client.invoke_tool(authed(call)).await?.into_inner();
            expect_text(&result, "hi")
        }
        Path::InteractiveOld => interactive(client, "old__ask").await,
        Path::InteractiveNew => interactive(client, "new__ask").await,
        Path::UnaryNew => unary(client, "new__ask").await,
        Path::TaskFollowedByWorker => task(client, "new__report", true).await,
        Path::TaskFollowedByGateway => task(client, "new__report", false).await,
    }
}

/// Whether `e` is an RPC the gateway does not serve.
fn unserved(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<tonic::Status>()
            .is_some_and(|s| s.code() == tonic::Code::Unimplemented)
    })
}

/// `calls` sequential calls: p50 in ms and the gateway's CPU ms per call.
async fn run(client: &mut Client, gateway: &Proc, path: Path) -> anyhow::Result<(f64, f64)> {
    let mut samples = Vec::with_capacity(CALLS);
    let before = cpu_seconds(gateway.pid());
    for _ in 0..CALLS {
        let started = Instant::now();
        call(client, path)
            .await
            .with_context(|| path.name().to_owned())?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let cpu = (cpu_seconds(gateway.pid()) - before) * 1000.0 / CALLS as f64;
    Ok((median(samples), cpu))
}

/// Runs the figures and prints their rows of the targets table.
///
/// # Errors
/// When the gateway does not start, or any path fails (a wrong answer too).
pub async fn report(rounds: usize) -> anyhow::Result<()> {
    let upstream_port = free_port();
    let mut command = std::process::Command::new(exe());
    command.args(["ask-server", "--http", &upstream_port.to_string()]);
    let upstream = spawn(command);
    wait_port(upstream_port).await;
    let url = format!("http://127.0.0.1:{upstream_port}/mcp");
    let servers = format!(
        "      - name: old\n        url: \"{url}\"\n        lifecycle: initialize\n        input: {{declare_on_session: true}}\n      - name: new\n        url: \"{url}\"\n        lifecycle: discover\n"
    );
    // The task records in the gateway's own temporary directory.
    let state =
        |dir: &std::path::Path| format!("state:\n  url: \"sqlite://{}/state.db\"\n", dir.display());
    let (proc, port) = gateway_with(state, &servers).await;
    let mut client = grpc(port).await;
    // Every path once, which also waits for both servers. A path the
    // gateway does not serve (UNIMPLEMENTED: an RPC of a later release) is
    // left out and said so; any other failure aborts.
    let mut served = [true; Path::ALL.len()];
    for (i, path) in Path::ALL.into_iter().enumerate() {
        let mut last = None;
        for _ in 0..300 {
            match call(&mut client, path).await {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        match last {
            None => {}
            Some(e) if unserved(&e) && path != Path::Plain => {
                eprintln!("questions and tasks: {}: not served: {e:#}", path.name());
                served[i] = false;
            }
            Some(e) => return Err(e.context(format!("questions and tasks: {}", path.name()))),
        }
    }
    let mut p50 = vec![Vec::new(); Path::ALL.len()];
    let mut cpu = vec![Vec::new(); Path::ALL.len()];
    for round in 0..rounds.max(1) {
        for (i, path) in Path::ALL.into_iter().enumerate() {
            if !served[i] {
                continue;
            }
            eprintln!("round {}: questions and tasks: {}", round + 1, path.name());
            let (latency, cpu_ms) = run(&mut client, &proc, path).await?;
            p50[i].push(latency);
            cpu[i].push(cpu_ms);
        }
    }
    drop(proc);
    drop(upstream);
    let p50: Vec<f64> = p50.into_iter().map(median).collect();
    let cpu: Vec<f64> = cpu.into_iter().map(median).collect();
    let fmt = super::report::fmt;
    for (i, path) in Path::ALL.into_iter().enumerate().skip(1) {
        if !served[i] {
            println!("| {}: not served by this gateway | | | |", path.name());
            continue;
        }
        println!(
            "| p50, {}: {} ms / plain call {} ms | {}x | | |",
            path.name(),
            fmt(p50[i], 3),
            fmt(p50[0], 3),
            fmt(p50[i] / p50[0], 2)
        );
        println!(
            "| gateway CPU ms/call, {}: {} / plain call {} | {}x | | |",
            path.name(),
            fmt(cpu[i], 3),
            fmt(cpu[0], 3),
            fmt(cpu[i] / cpu[0], 2)
        );
    }
    Ok(())
}
