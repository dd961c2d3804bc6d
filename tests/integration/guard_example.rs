//! The example guard (`examples/guards/guard.py`) does what its README
//! says: started with the test venv's Python and stubs from its own
//! `generate.sh`, and asked with toolgate's own guard client
//! (`toolgate::pb::guard`), it denies arguments carrying its marker, replaces
//! e-mail addresses in tool results, resource contents and prompt messages,
//! allows the rest, requires its token when given one, and refuses a
//! malformed check while it keeps serving. The `through_gateway_` tests run
//! it behind a gateway (they need the guards runtime).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::guard::check_response::Verdict;
use toolgate::pb::guard::guard_service_client::GuardServiceClient;
use toolgate::pb::guard::{self as g};

use crate::common::*;

/// The guard's default marker.
const MARKER: &str = "DO-NOT-SEND";

/// `examples/guards/guard.py` running on a free port of 127.0.0.1, with its
/// stubs and its stderr in a temporary directory; killed on drop.
struct ExampleGuard {
    _child: ChildGuard,
    port: u16,
    dir: tempfile::TempDir,
}

impl ExampleGuard {
    /// Generates the stubs (`generate.sh DIR`) and starts the guard with
    /// `args` and the environment `env`, bounded.
    async fn start(args: &[&str], env: &[(&str, &str)]) -> ExampleGuard {
        let example = repo_root().join("examples/guards");
        let dir = tempfile::tempdir().unwrap();
        let stubs = dir.path().join("stubs");
        let generated = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(example.join("generate.sh"))
                .arg(&stubs)
                .env("PYTHON", python())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("generate.sh finishes in 60 s")
        .unwrap();
        assert!(
            generated.status.success(),
            "generate.sh failed: {}",
            String::from_utf8_lossy(&generated.stderr)
        );

        let log = std::fs::File::create(dir.path().join("guard.log")).unwrap();
        let mut child = Command::new(python())
            .arg(example.join("guard.py"))
            .args(["--port", "0"])
            .args(args)
            .env_clear()
            .env("PYTHONPATH", &stubs)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start guard.py");
        let stdout = child.stdout.take().unwrap();
        let child = ChildGuard(child);
        let line = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::task::spawn_blocking(move || {
                let mut line = String::new();
                BufReader::new(stdout).read_line(&mut line).map(|_| line)
            }),
        )
        .await
        .expect("guard.py prints its port in 30 s")
        .unwrap()
        .unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "guard.py printed {line:?}; its log:\n{}",
                    std::fs::read_to_string(dir.path().join("guard.log")).unwrap_or_default()
                )
            });
        ExampleGuard {
            _child: child,
            port,
            dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn client(&self) -> GuardServiceClient<Channel> {
        GuardServiceClient::connect(self.url())
            .await
            .expect("connect to the example guard")
    }

    /// What the guard logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("guard.log")
    }
}

/// A tool target, as toolgate describes one.
fn tool_target() -> g::Target {
    g::Target {
        kind: g::TargetKind::Tool as i32,
        name: "crm__send_mail".to_owned(),
        server: "crm".to_owned(),
        upstream_name: "send_mail".to_owned(),
        definition_hash: "9f".repeat(32),
    }
}

/// A check of the request phase of a tool call with `arguments`.
fn request_check(arguments: &str) -> g::CheckRequest {
    g::CheckRequest {
        phase: g::Phase::Request as i32,
        guard: "example".to_owned(),
        tenant: "acme".to_owned(),
        subject: Some(g::Subject {
            id: "alice".to_owned(),
            key: "token:alice".to_owned(),
            caller: g::CallerKind::Token as i32,
        }),
        target: Some(tool_target()),
        arguments_json: arguments.to_owned(),
        result_json: String::new(),
        call_id: "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
    }
}

/// A check of the response phase of a call to a target of `kind` that
/// answered `result`.
fn response_check(kind: g::TargetKind, result: &Value) -> g::CheckRequest {
    let mut target = tool_target();
    target.kind = kind as i32;
    if kind == g::TargetKind::Resource {
        target.name = "file:///notes.txt".to_owned();
        target.upstream_name = target.name.clone();
        target.definition_hash.clear();
    }
    g::CheckRequest {
        phase: g::Phase::Response as i32,
        target: Some(target),
        arguments_json: String::new(),
        result_json: result.to_string(),
        ..request_check("")
    }
}

/// The guard's verdict on `check` (a status is a test failure).
async fn verdict(client: &mut GuardServiceClient<Channel>, check: g::CheckRequest) -> Verdict {
    client
        .check(check)
        .await
        .expect("Check answers")
        .into_inner()
        .verdict
        .expect("a verdict")
}

/// The replacement result of a response check, parsed; panics on another
/// verdict.
async fn replaced(client: &mut GuardServiceClient<Channel>, check: g::CheckRequest) -> Value {
    match verdict(client, check).await {
        Verdict::Replace(replace) => {
            assert!(replace.arguments_json.is_empty(), "{replace:?}");
            serde_json::from_str(&replace.result_json).expect("the replacement is JSON")
        }
        other => panic!("expected a replacement, got {other:?}"),
    }
}

/// The reason of a denial; panics on another verdict.
async fn denied(client: &mut GuardServiceClient<Channel>, check: g::CheckRequest) -> String {
    match verdict(client, check).await {
        Verdict::Deny(deny) => deny.reason,
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[tokio::test]
async fn arguments_carrying_the_marker_are_denied_with_a_reason_naming_it() {
    let guard = ExampleGuard::start(&[], &[]).await;
    let mut client = guard.client().await;

    // Deep in a string, wherever it is in the text.
    let reason = denied(
        &mut client,
        request_check(&format!(
            r#"{{"to":"bob","cc":["carol","note: {MARKER} please"],"n":3}}"#
        )),
    )
    .await;
    assert!(reason.contains(MARKER), "{reason}");
    assert!(
        reason.contains("$.cc[1]"),
        "the reason says where: {reason}"
    );
    // Written with a JSON escape (`\u0044` is `D`), and as a key.
    let escaped = denied(
        &mut client,
        request_check(r#"{"body":{"text":"\u0044O-NOT-SEND"}}"#),
    )
    .await;
    assert!(escaped.contains("$.body.text"), "{escaped}");
    let key = denied(&mut client, request_check(&format!(r#"{{"{MARKER}":1}}"#))).await;
    assert!(key.contains("a key"), "{key}");

    // Without it (a part of it, other case, an e-mail address: the request
    // phase only looks for the marker), allowed.
    for arguments in [
        "{}",
        r#"{"body":"DO-NOT"}"#,
        r#"{"body":"do-not-send"}"#,
        r#"{"to":"alice@example.com","n":[1,2,null,true]}"#,
    ] {
        assert!(
            matches!(
                verdict(&mut client, request_check(arguments)).await,
                Verdict::Allow(_)
            ),
            "{arguments} is allowed"
        );
    }
}

#[tokio::test]
async fn another_marker_replaces_the_default() {
    let guard = ExampleGuard::start(&["--marker", "SECRET-PLAN"], &[]).await;
    let mut client = guard.client().await;
    let reason = denied(
        &mut client,
        request_check(r#"{"body":"the SECRET-PLAN is attached"}"#),
    )
    .await;
    assert!(reason.contains("SECRET-PLAN"), "{reason}");
    assert!(matches!(
        verdict(
            &mut client,
            request_check(&format!(r#"{{"body":"{MARKER}"}}"#))
        )
        .await,
        Verdict::Allow(_)
    ));
}

#[tokio::test]
async fn e_mail_addresses_in_a_tool_result_are_replaced() {
    let guard = ExampleGuard::start(&[], &[]).await;
    let mut client = guard.client().await;
    let result = json!({
        "content": [
            {"type": "text", "text": "Write to alice@example.com or bob.smith+crm@mail.example.co.uk."},
            {"type": "image", "data": PNG_B64, "mimeType": "image/png"},
            {"type": "resource", "resource": {
                "uri": "mailto:carol@example.org",
                "mimeType": "text/plain",
                "text": "From: carol@example.org"
            }},
            {"type": "resource_link", "uri": "file:///dave@example.com.txt", "name": "dave@example.com"},
            {"type": "text", "text": "no address here, only @mentions and a@b"}
        ],
        "structuredContent": {
            "owner": "erin@example.net",
            "team": [{"email": "frank@example.com", "age": 41}, "grace@example.io"],
            "count": 2
        },
        "isError": true
    });
    let expected = json!({
        "content": [
            {"type": "text", "text": "Write to [email] or [email]."},
            {"type": "image", "data": PNG_B64, "mimeType": "image/png"},
            {"type": "resource", "resource": {
                // Only the text is scanned: a URI names, it does not say.
                "uri": "mailto:carol@example.org",
                "mimeType": "text/plain",
                "text": "From: [email]"
            }},
            {"type": "resource_link", "uri": "file:///dave@example.com.txt", "name": "dave@example.com"},
            {"type": "text", "text": "no address here, only @mentions and a@b"}
        ],
        "structuredContent": {
            "owner": "[email]",
            "team": [{"email": "[email]", "age": 41}, "[email]"],
            "count": 2
        },
        "isError": true
    });
    assert_eq!(
        replaced(&mut client, response_check(g::TargetKind::Tool, &result)).await,
        expected
    );

    // A result without an address is allowed, not replaced by a copy.
    let clean = json!({"content": [{"type": "text", "text": "42 rows, see @ops"}]});
    assert!(matches!(
        verdict(&mut client, response_check(g::TargetKind::Tool, &clean)).await,
        Verdict::Allow(_)
    ));
}

#[tokio::test]
async fn e_mail_addresses_in_resource_contents_are_replaced() {
    let guard = ExampleGuard::start(&[], &[]).await;
    let mut client = guard.client().await;
    let result = json!({
        "contents": [
            {"uri": "file:///notes.txt", "mimeType": "text/plain",
             "text": "Owner: ops@example.com\nBackup: ops-2@example.com"},
            {"uri": "file:///logo.png", "mimeType": "image/png", "blob": PNG_B64}
        ]
    });
    let expected = json!({
        "contents": [
            {"uri": "file:///notes.txt", "mimeType": "text/plain",
             "text": "Owner: [email]\nBackup: [email]"},
            {"uri": "file:///logo.png", "mimeType": "image/png", "blob": PNG_B64}
        ]
    });
    assert_eq!(
        replaced(
            &mut client,
            response_check(g::TargetKind::Resource, &result)
        )
        .await,
        expected
    );
}

#[tokio::test]
async fn e_mail_addresses_in_prompt_messages_are_replaced() {
    let guard = ExampleGuard::start(&[], &[]).await;
    let mut client = guard.client().await;
    let result = json!({
        "description": "Reply to a customer",
        "messages": [
            {"role": "user", "content": {"type": "text", "text": "Reply to zoe@example.com politely."}},
            {"role": "assistant", "content": {"type": "resource", "resource": {
                "uri": "crm://tickets/7", "mimeType": "text/plain",
                "text": "Ticket 7 by zoe@example.com"
            }}},
            {"role": "user", "content": {"type": "image", "data": PNG_B64, "mimeType": "image/png"}}
        ]
    });
    let expected = json!({
        "description": "Reply to a customer",
        "messages": [
            {"role": "user", "content": {"type": "text", "text": "Reply to [email] politely."}},
            {"role": "assistant", "content": {"type": "resource", "resource": {
                "uri": "crm://tickets/7", "mimeType": "text/plain",
                "text": "Ticket 7 by [email]"
            }}},
            {"role": "user", "content": {"type": "image", "data": PNG_B64, "mimeType": "image/png"}}
        ]
    });
    assert_eq!(
        replaced(&mut client, response_check(g::TargetKind::Prompt, &result)).await,
        expected
    );
    // A fetched skill (GetSkill): each text file; a blob is left alone.
    let result = json!({
        "name": "docs__refunds", "definition_hash": "h", "verified": true,
        "entry": {"uri": "skill://refunds/SKILL.md"},
        "files": [
            {"uri": "skill://refunds/SKILL.md", "content": {"text": "Ask zoe@example.com."}},
            {"uri": "skill://refunds/a.bin", "content": {"blob": "em9lQGV4YW1wbGUuY29t"}}
        ]
    });
    let mut expected = result.clone();
    expected["files"][0]["content"]["text"] = json!("Ask [email].");
    assert_eq!(
        replaced(&mut client, response_check(g::TargetKind::Skill, &result)).await,
        expected
    );
}

#[tokio::test]
async fn a_malformed_check_is_refused_and_the_guard_keeps_serving() {
    let guard = ExampleGuard::start(&[], &[]).await;
    let mut client = guard.client().await;
    let tool = g::TargetKind::Tool;
    let mut no_phase = request_check("{}");
    no_phase.phase = g::Phase::Unspecified as i32;
    let mut no_kind = response_check(tool, &json!({"content": []}));
    no_kind.target.as_mut().unwrap().kind = g::TargetKind::Unspecified as i32;
    let mut not_json = response_check(tool, &json!({}));
    not_json.result_json = "{\"content\": [".to_owned();
    let cases = [
        (not_json, "result_json is not valid JSON"),
        (
            response_check(tool, &json!([1])),
            "result_json is not a JSON object",
        ),
        (
            request_check(r#"["DO-NOT-SEND"]"#),
            "arguments_json is not a JSON object",
        ),
        (no_phase, "phase 0"),
        (no_kind, "target.kind 0"),
    ];
    for (check, said) in cases {
        let status = client.check(check).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(said), "{said}: {status:?}");
    }

    // Still serving; its log names each check and its verdict, never the
    // arguments or the result.
    let result = json!({"content": [{"type": "text", "text": "alice@example.com"}]});
    replaced(&mut client, response_check(tool, &result)).await;
    denied(
        &mut client,
        request_check(r#"{"body":"private words DO-NOT-SEND"}"#),
    )
    .await;
    let log = guard.log();
    assert!(
        log.contains("PHASE_RESPONSE acme/crm__send_mail: replace (1 e-mail address)"),
        "{log}"
    );
    assert!(
        log.contains("PHASE_REQUEST acme/crm__send_mail: deny"),
        "{log}"
    );
    assert!(log.contains("4bf92f3577b34da6a3ce929d0e0e4736"), "{log}");
    for payload in ["alice@example.com", "private words", "$.body"] {
        assert!(!log.contains(payload), "{payload} logged: {log}");
    }
}

#[tokio::test]
async fn with_a_token_every_check_must_carry_it() {
    const GUARD_TOKEN: &str = "guard-token-3f9a1c";
    let guard = ExampleGuard::start(
        &["--token-env", "GUARD_TOKEN"],
        &[("GUARD_TOKEN", GUARD_TOKEN)],
    )
    .await;
    let mut client = guard.client().await;
    let with = |token: Option<&str>| {
        let mut request = tonic::Request::new(request_check("{}"));
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    for token in [None, Some("guard-token-3f9a1"), Some("guard-token-3f9a1cX")] {
        let status = client.check(with(token)).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{token:?}");
    }
    let answer = client.check(with(Some(GUARD_TOKEN))).await.unwrap();
    assert!(matches!(
        answer.into_inner().verdict,
        Some(Verdict::Allow(_))
    ));
    let log = std::fs::read_to_string(guard.log_path()).unwrap();
    assert!(!log.contains(GUARD_TOKEN), "{log}");

    // Without the variable it does not start.
    let output = Command::new(python())
        .arg(repo_root().join("examples/guards/guard.py"))
        .args(["--port", "0", "--token-env", "GUARD_TOKEN"])
        .env_clear()
        .env("PYTHONPATH", guard.dir.path().join("stubs"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("GUARD_TOKEN is not set"),
        "{output:?}"
    );
}

// ---------------------------------------------------------------------------
// Behind a gateway: these need the guards runtime (issue 23, helper B).
// ---------------------------------------------------------------------------

const TOKEN: &str = "acme-token";
const GUARD_TOKEN: &str = "guard-token-b81e07";

/// A gateway whose tenant `acme` has the echo server `t` and the example
/// guard (with its token) on every call.
async fn guarded_gateway(server: &McpServer, guard: &ExampleGuard) -> TestGateway {
    TestGateway::start(
        &format!(
            "guards:\n  - name: example\n    url: \"{}\"\n    timeout: 5s\n    token: {{ env: GUARD_TOKEN }}\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    guards: [example]\n    servers:\n      - name: t\n        url: \"{}\"\n",
            guard.url(),
            server.url
        ),
        &[("GUARD_TOKEN", GUARD_TOKEN)],
    )
    .await
}

#[tokio::test]
async fn through_gateway_an_e_mail_comes_back_redacted_and_the_marker_is_refused() {
    let guard = ExampleGuard::start(
        &["--token-env", "GUARD_TOKEN"],
        &[("GUARD_TOKEN", GUARD_TOKEN)],
    )
    .await;
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = guarded_gateway(&server, &guard).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "t__echo").await;

    let answer = invoke(
        &mut client,
        TOKEN,
        "t__echo",
        r#"{"text":"ask alice@example.com"}"#,
    )
    .await
    .expect("the call succeeds");
    assert_eq!(answer.text, "ask [email]");
    let calls = server.log.call_traceparents.lock().unwrap().len();
    assert_eq!(calls, 1);

    let status = invoke(
        &mut client,
        TOKEN,
        "t__echo",
        &format!(r#"{{"text":"{MARKER}: the numbers"}}"#),
    )
    .await
    .expect_err("denied");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert_eq!(reason(&status), "GUARD_DENIED");
    assert!(status.message().contains(MARKER), "{status:?}");
    assert_eq!(
        server.log.call_traceparents.lock().unwrap().len(),
        calls,
        "nothing was sent upstream"
    );

    let log = guard.log();
    assert!(
        log.contains("PHASE_RESPONSE acme/t__echo: replace"),
        "{log}"
    );
    assert!(log.contains("PHASE_REQUEST acme/t__echo: deny"), "{log}");
    gateway.shutdown().await;
}

/// Retries `attempt` until it succeeds (a server connects in the
/// background), at most 30 s; the last error otherwise.
async fn until_ok<T, F, Fut>(mut attempt: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let started = std::time::Instant::now();
    loop {
        match attempt().await {
            Err(status)
                if started.elapsed() < Duration::from_secs(30)
                    && matches!(
                        status.code(),
                        tonic::Code::NotFound | tonic::Code::Unavailable
                    ) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test]
async fn through_gateway_resource_text_and_prompt_messages_come_back_redacted() {
    let guard = ExampleGuard::start(&[], &[]).await;
    let stdio = |name: &str, script: &str, env: &str| {
        format!(
            "      - name: {name}\n        command: [\"{}\", \"{}\"]\n{env}",
            python().display(),
            fixture(script).display()
        )
    };
    let gateway = TestGateway::start(
        &format!(
            "guards:\n  - name: example\n    url: \"{}\"\n    timeout: 5s\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    guards: [example]\n    servers:\n{}{}",
            guard.url(),
            stdio(
                "res",
                "python/resources_server.py",
                "        env:\n          RESOURCES_TAG: \"ops@example.com\"\n"
            ),
            stdio("pr", "python/prompts_server.py", ""),
        ),
        &[],
    )
    .await;
    let client = gateway.client().await;

    // ReadResource: the response phase sees a ReadResourceResult.
    let read = until_ok(|| {
        let mut client = client.clone();
        async move {
            client
                .read_resource(authed(
                    TOKEN,
                    pb::ReadResourceRequest {
                        server: "res".to_owned(),
                        uri: "fixture://text".to_owned(),
                        ..Default::default()
                    },
                ))
                .await
        }
    })
    .await
    .expect("ReadResource")
    .into_inner();
    let Some(pb::resource_contents::Data::Text(text)) = &read.contents[0].data else {
        panic!("not text: {read:?}");
    };
    assert_eq!(text, "hello from [email]");

    // GetPrompt: the response phase sees a GetPromptResult; the request
    // phase the prompt's arguments as a JSON object.
    let get = |code: &str| {
        let mut client = client.clone();
        let request = pb::GetPromptRequest {
            name: "pr__review".to_owned(),
            arguments: [("code".to_owned(), code.to_owned())].into(),
            ..Default::default()
        };
        async move { client.get_prompt(authed(TOKEN, request)).await }
    };
    let prompt = until_ok(|| get("send(to=\"bob@example.com\")"))
        .await
        .expect("GetPrompt")
        .into_inner();
    let texts: Vec<&str> = prompt
        .messages
        .iter()
        .map(|m| match m.content.as_ref().and_then(|c| c.kind.as_ref()) {
            Some(pb::content::Kind::Text(t)) => t.text.as_str(),
            other => panic!("not text: {other:?}"),
        })
        .collect();
    assert_eq!(
        texts,
        [
            "Review this any code:\nsend(to=\"[email]\")",
            "Looking at it."
        ]
    );
    let status = get(&format!("# {MARKER}")).await.expect_err("denied");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert_eq!(reason(&status), "GUARD_DENIED");
    gateway.shutdown().await;
}
