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
/// `lifecycle`.
async fn gateway(name: &str, script: &str, lifecycle: &str, env: &str) -> TestGateway {
    TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: {name}\n        command: [\"{}\", \"{}\"]\n        lifecycle: {lifecycle}\n{env}",
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
async fn call_answers_questions_from_an_input_file_in_both_eras() {
    let dir = tempfile::tempdir().unwrap();
    for lifecycle in ["initialize", "discover"] {
        let gateway = gateway("ask", "input_server.py", lifecycle, "").await;
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
    assert!(err.contains("failed: boom"), "{err}");

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
