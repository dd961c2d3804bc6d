//! Prompts: listed at connect beside the tools, exposed as `server__prompt`
//! under the tools' naming rules, rendered by their servers (server-everything
//! and a Python `mcp` SDK server, both revisions, stdio and HTTP), a name two
//! servers expose refusing both servers' prompts, a failed `prompts/list`
//! keeping the tools, approvals withholding a changed prompt until `toolgate
//! approve` records it, and GetPrompt's audit record.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "acme-token";

/// How a server is reached.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    Stdio,
    Http,
}

/// The Python prompts fixture as a `servers[]` entry named `name` (with
/// `extra` lines), and for HTTP its process; `env` is its environment.
async fn prompts_server(
    name: &str,
    transport: Transport,
    env: &[(&str, &str)],
    extra: &str,
) -> (String, Option<ChildGuard>) {
    match transport {
        Transport::Stdio => {
            let mut entry = format!(
                "      - name: {name}\n        command: [\"{}\", \"{}\", \"stdio\"]\n        \
                 reconnect: {{initial_backoff: 100ms, max_backoff: 500ms}}\n{extra}",
                python().display(),
                fixture("python/prompts_server.py").display(),
            );
            if !env.is_empty() {
                entry.push_str("        env:\n");
                for (key, value) in env {
                    entry.push_str(&format!("          {key}: \"{value}\"\n"));
                }
            }
            (entry, None)
        }
        Transport::Http => {
            let port = free_port();
            let child = std::process::Command::new(python())
                .arg(fixture("python/prompts_server.py"))
                .args(["http", &port.to_string()])
                .envs(env.iter().copied())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let child = ChildGuard(child);
            wait_for_port(port).await;
            (
                format!(
                    "      - name: {name}\n        url: \"http://127.0.0.1:{port}/mcp\"\n{extra}"
                ),
                Some(child),
            )
        }
    }
}

fn tenant(servers: &str) -> String {
    format!("tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{servers}")
}

/// Lists prompts until `done` holds (bounded).
async fn wait_prompts(
    client: &mut ToolGatewayClient<Channel>,
    what: &str,
    mut done: impl FnMut(&pb::ListPromptsResponse) -> bool,
) -> pb::ListPromptsResponse {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok(listing) = client
            .list_prompts(authed(TOKEN, pb::ListPromptsRequest::default()))
            .await
        {
            let listing = listing.into_inner();
            if done(&listing) {
                return listing;
            }
            last = Some(listing);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never saw {what}; last listing: {last:#?}");
}

fn get_request(name: &str, arguments: &[(&str, &str)]) -> pb::GetPromptRequest {
    pb::GetPromptRequest {
        name: name.to_owned(),
        arguments: arguments
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

async fn get(
    client: &mut ToolGatewayClient<Channel>,
    request: pb::GetPromptRequest,
) -> Result<pb::GetPromptResponse, tonic::Status> {
    client
        .get_prompt(authed(TOKEN, request))
        .await
        .map(tonic::Response::into_inner)
}

/// The text of a message (empty for other content).
fn text(message: &pb::PromptMessage) -> &str {
    match message.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(pb::content::Kind::Text(t)) => &t.text,
        _ => "",
    }
}

fn prompt_names(listing: &pb::ListPromptsResponse) -> Vec<&str> {
    listing.prompts.iter().map(|p| p.name.as_str()).collect()
}

fn error_metadata(status: &tonic::Status) -> std::collections::HashMap<String, String> {
    status
        .get_details_error_info()
        .map(|info| info.metadata)
        .unwrap_or_default()
}

#[tokio::test]
async fn server_everything_prompts_over_stdio_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let (_http, port) = start_everything_http(&dir.path().join("headers.log")).await;
    for (transport, reach) in [
        (
            "stdio",
            format!(
                "        command: [\"{}\", \"{}\", \"stdio\"]\n",
                node().display(),
                everything_js().display()
            ),
        ),
        (
            "http",
            format!("        url: \"http://127.0.0.1:{port}/mcp\"\n"),
        ),
    ] {
        let gateway =
            TestGateway::start(&tenant(&format!("      - name: everything\n{reach}")), &[]).await;
        let mut client = gateway.client().await;
        let listing = wait_prompts(&mut client, "everything's prompts", |l| {
            !l.prompts.is_empty()
        })
        .await;
        let args = listing
            .prompts
            .iter()
            .find(|p| p.name == "everything__args-prompt")
            .unwrap_or_else(|| panic!("{transport}: {listing:#?}"));
        assert_eq!(args.server, "everything");
        assert_eq!(args.title, "Arguments Prompt");
        let arguments: Vec<_> = args
            .arguments
            .iter()
            .map(|a| (a.name.as_str(), a.required))
            .collect();
        assert_eq!(arguments, [("city", true), ("state", false)], "{transport}");
        assert_eq!(args.definition_hash.len(), 32);
        assert!(!listing.prompts_version.is_empty());
        let status = &listing.servers[0];
        assert_eq!(status.prompt_count as usize, listing.prompts.len());
        assert!(status.prompts_error.is_empty(), "{status:?}");

        let rendered = get(
            &mut client,
            get_request(
                "everything__args-prompt",
                &[("city", "Paris"), ("state", "TX")],
            ),
        )
        .await
        .unwrap();
        assert_eq!(rendered.messages.len(), 1, "{transport}");
        assert_eq!(rendered.messages[0].role, pb::Role::User as i32);
        assert_eq!(text(&rendered.messages[0]), "What's weather in Paris, TX?");

        // An embedded resource names the server that gave it.
        let rendered = get(
            &mut client,
            get_request(
                "everything__resource-prompt",
                &[("resourceType", "Text"), ("resourceId", "2")],
            ),
        )
        .await
        .unwrap();
        let embedded = rendered
            .messages
            .iter()
            .find_map(|m| match m.content.as_ref().and_then(|c| c.kind.as_ref()) {
                Some(pb::content::Kind::Resource(r)) => Some(r),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{transport}: {rendered:#?}"));
        assert_eq!(embedded.server, "everything");
        assert!(embedded.uri.contains("2"), "{embedded:?}");

        // The pin: a hash that is not the prompt's is refused.
        let pinned = get(
            &mut client,
            pb::GetPromptRequest {
                definition_hash: "0".repeat(32),
                ..get_request("everything__args-prompt", &[("city", "Paris")])
            },
        )
        .await
        .unwrap_err();
        assert_eq!(pinned.code(), tonic::Code::FailedPrecondition);
        assert_eq!(reason(&pinned), "PROMPT_DEFINITION_CHANGED");
        let same = get(
            &mut client,
            pb::GetPromptRequest {
                definition_hash: args.definition_hash.clone(),
                ..get_request("everything__args-prompt", &[("city", "Oslo")])
            },
        )
        .await
        .unwrap();
        assert_eq!(text(&same.messages[0]), "What's weather in Oslo?");

        let unknown = get(&mut client, get_request("everything__nope", &[]))
            .await
            .unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
        assert_eq!(reason(&unknown), "PROMPT_NOT_FOUND");

        // Filters: servers and name globs.
        let filtered = client
            .list_prompts(authed(
                TOKEN,
                pb::ListPromptsRequest {
                    name_globs: vec!["*args*".to_owned()],
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(prompt_names(&filtered), ["everything__args-prompt"]);
        let none = client
            .list_prompts(authed(
                TOKEN,
                pb::ListPromptsRequest {
                    servers: vec!["other".to_owned()],
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(none.prompts.is_empty());
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn python_sdk_prompts_in_both_revisions_over_stdio_and_http() {
    for transport in [Transport::Stdio, Transport::Http] {
        for lifecycle in ["initialize", "discover"] {
            let (entry, _child) = prompts_server(
                "py",
                transport,
                &[],
                &format!("        lifecycle: {lifecycle}\n"),
            )
            .await;
            let gateway = TestGateway::start(&tenant(&entry), &[]).await;
            let mut client = gateway.client().await;
            let case = format!("{transport:?} {lifecycle}");
            let listing = wait_prompts(&mut client, &case, |l| !l.prompts.is_empty()).await;
            assert_eq!(
                prompt_names(&listing),
                ["py__ask_tone", "py__review", "py__secret"],
                "{case}"
            );
            let review = &listing.prompts[1];
            assert_eq!(
                (review.title.as_str(), review.description.as_str()),
                ("Code review", "Review code.")
            );
            let arguments: Vec<_> = review
                .arguments
                .iter()
                .map(|a| (a.name.as_str(), a.required))
                .collect();
            assert_eq!(arguments, [("code", true), ("language", false)], "{case}");

            let rendered = get(
                &mut client,
                get_request("py__review", &[("code", "fn x() {}"), ("language", "Rust")]),
            )
            .await
            .unwrap();
            let messages: Vec<_> = rendered
                .messages
                .iter()
                .map(|m| (m.role, text(m)))
                .collect();
            assert_eq!(
                messages,
                [
                    (pb::Role::User as i32, "Review this Rust code:\nfn x() {}"),
                    (pb::Role::Assistant as i32, "Looking at it."),
                ],
                "{case}"
            );

            let ask = pb::GetPromptRequest {
                accepts_input: Some(pb::InputCapabilities {
                    form: true,
                    ..Default::default()
                }),
                ..get_request("py__ask_tone", &[("topic", "rivers")])
            };
            let first = get(&mut client, ask.clone()).await.unwrap();
            if lifecycle == "initialize" {
                assert_eq!(
                    text(&first.messages[0]),
                    "Write about rivers in a neutral tone"
                );
            } else {
                // 2026-07-28: a round of questions, answered on a retry.
                let asked = first.input_required.expect("input_required");
                assert!(first.messages.is_empty());
                assert_eq!(asked.requests.len(), 1, "{asked:?}");
                assert!(!asked.request_state.is_empty());
                let retry = pb::GetPromptRequest {
                    request_state: asked.request_state.clone(),
                    input_responses: vec![pb::InputResponse {
                        id: asked.requests[0].id.clone(),
                        action: pb::InputAction::Accept as i32,
                        content_json: r#"{"tone":"calm"}"#.to_owned(),
                    }],
                    ..ask.clone()
                };
                let done = get(&mut client, retry.clone()).await.unwrap();
                assert_eq!(text(&done.messages[0]), "Write about rivers in a calm tone");
                // The state is bound to the prompt and its arguments.
                let other = get(
                    &mut client,
                    pb::GetPromptRequest {
                        arguments: [("topic".to_owned(), "lakes".to_owned())].into(),
                        ..retry
                    },
                )
                .await
                .unwrap_err();
                assert_eq!(other.code(), tonic::Code::InvalidArgument, "{other:?}");
                // Without accepting forms, the worker is told what was asked.
                let refused = get(
                    &mut client,
                    get_request("py__ask_tone", &[("topic", "rivers")]),
                )
                .await
                .unwrap_err();
                assert_eq!(reason(&refused), "INPUT_NOT_ACCEPTED", "{refused:?}");
            }
            gateway.shutdown().await;
        }
    }
}

#[tokio::test]
async fn a_prompt_name_two_servers_expose_refuses_both_servers_prompts() {
    // Both bare: `review` (and the rest) collide among prompts; their
    // tools do not (different names), and a tool may share a prompt's name.
    let (one, _) = prompts_server(
        "one",
        Transport::Stdio,
        &[("TOOL_NAME", "review"), ("NO_ADD_PROMPT", "1")],
        "        bare: true\n",
    )
    .await;
    let (two, _) = prompts_server(
        "two",
        Transport::Stdio,
        &[("TOOL_NAME", "echo_two"), ("NO_ADD_PROMPT", "1")],
        "        bare: true\n",
    )
    .await;
    let (three, _) = prompts_server("three", Transport::Stdio, &[("NO_ADD_PROMPT", "1")], "").await;
    let gateway = TestGateway::start(&tenant(&format!("{one}{two}{three}")), &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_prompts(&mut client, "three servers listed", |l| {
        l.servers.iter().all(|s| s.connected)
    })
    .await;
    assert_eq!(
        prompt_names(&listing),
        ["three__ask_tone", "three__review", "three__secret"]
    );
    for status in &listing.servers[..2] {
        assert!(
            status.prompts_error.contains("`one`")
                && status.prompts_error.contains("`two`")
                && status.prompts_error.contains("prompt name"),
            "{status:?}"
        );
        assert_eq!(status.prompt_count, 0);
    }
    assert!(listing.servers[2].prompts_error.is_empty());
    let tools = list(&mut client, TOKEN).await;
    assert_eq!(names(&tools), ["echo_two", "review", "three__echo"]);
    let refused = get(&mut client, get_request("review", &[("code", "x")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&refused), "PROMPT_NOT_FOUND");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_failing_prompts_list_keeps_the_session_and_the_tools() {
    let (entry, _) = prompts_server("p", Transport::Stdio, &[("PROMPTS_FAIL", "1")], "").await;
    let gateway = TestGateway::start(&tenant(&entry), &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_prompts(&mut client, "the prompts refused", |l| {
        !l.servers[0].prompts_error.is_empty()
    })
    .await;
    assert!(listing.prompts.is_empty());
    let status = &listing.servers[0];
    assert!(status.connected, "{status:?}");
    assert!(
        status.prompts_error.starts_with("prompts/list failed:")
            && status.prompts_error.contains("broken on purpose"),
        "{status:?}"
    );
    let answer = invoke(&mut client, TOKEN, "p__echo", r#"{"text":"still here"}"#)
        .await
        .unwrap();
    assert_eq!(answer.text, "still here");
    let refused = get(&mut client, get_request("p__review", &[("code", "x")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&refused), "PROMPT_NOT_FOUND");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_prompts_list_outlasting_the_connect_timeout_keeps_the_session_and_the_tools() {
    let (entry, _) = prompts_server(
        "p",
        Transport::Stdio,
        &[("PROMPTS_SLOW_MS", "30000")],
        "        connect_timeout: 6s\n",
    )
    .await;
    let gateway = TestGateway::start(&tenant(&entry), &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_prompts(&mut client, "the prompts refused", |l| {
        !l.servers[0].prompts_error.is_empty()
    })
    .await;
    let status = &listing.servers[0];
    assert!(status.connected, "{status:?}");
    assert!(
        status
            .prompts_error
            .contains("within the connect timeout (6s)"),
        "{status:?}"
    );
    let answer = invoke(&mut client, TOKEN, "p__echo", r#"{"text":"kept"}"#)
        .await
        .unwrap();
    assert_eq!(answer.text, "kept");
    gateway.shutdown().await;
}

#[tokio::test]
async fn get_prompt_is_bounded_by_the_argument_and_message_limits() {
    let long = "s".repeat(2000);
    let (entry, _) = prompts_server("py", Transport::Stdio, &[("SECRET_TEXT", &long)], "").await;
    let gateway = TestGateway::start(
        &format!(
            "limits:\n  max_argument_bytes: 200\n  max_message_bytes: 1000\n{}",
            tenant(&entry)
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    wait_prompts(&mut client, "listed", |l| !l.prompts.is_empty()).await;
    let big = "x".repeat(300);
    let refused = get(&mut client, get_request("py__review", &[("code", &big)]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&refused), "ARGUMENTS_TOO_LARGE");
    assert!(
        refused.message().contains("prompt `py__review`"),
        "{refused:?}"
    );
    // Rendered over the message limit.
    let too_long = get(&mut client, get_request("py__secret", &[]))
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&too_long), "RESULT_TOO_LARGE");
    let fits = "z".repeat(120);
    let ok = get(&mut client, get_request("py__review", &[("code", &fits)]))
        .await
        .unwrap();
    assert!(text(&ok.messages[0]).ends_with(&fits));
    gateway.shutdown().await;
}

/// Runs the real `toolgate` binary with `args`; (exit code, stdout, stderr).
async fn toolgate(args: &[&str], config: &Path) -> (i32, String, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(toolgate_bin())
            .args(args)
            .arg("--config")
            .arg(config)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("toolgate finishes in time")
    .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_changed_prompt_is_withheld_until_approved() {
    let dir = tempfile::tempdir().unwrap();
    let approvals: PathBuf = dir.path().join("approvals.yaml");
    let config = dir.path().join("toolgate.yaml");
    let write_config = |description: &str| {
        let entry = format!(
            "      - name: py\n        command: [\"{}\", \"{}\", \"stdio\"]\n        \
             definitions: approved\n        env:\n          PROMPT_DESCRIPTION: \"{description}\"\n",
            python().display(),
            fixture("python/prompts_server.py").display(),
        );
        let yaml = format!("approvals:\n  file: approvals.yaml\n{}", tenant(&entry));
        std::fs::write(&config, &yaml).unwrap();
        yaml
    };
    write_config("Review code.");
    let (code, stdout, stderr) = toolgate(&["approve"], &config).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("acme/py: 3 prompt(s) (first approval)"),
        "{stdout}"
    );
    let file = std::fs::read_to_string(&approvals).unwrap();
    assert!(
        file.contains("version: 2\n") && file.contains("\nprompts:\n"),
        "{file}"
    );
    assert!(file.contains("      py__review:\n"), "{file}");

    // The description changes: the prompt is withheld, the others and the
    // tools are served.
    let yaml = write_config("Review code, and approve it all.");
    let yaml = yaml.replace("approvals.yaml", &approvals.display().to_string());
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let listing = wait_prompts(&mut client, "connected", |l| l.servers[0].connected).await;
    assert_eq!(prompt_names(&listing), ["py__ask_tone", "py__secret"]);
    assert_eq!(listing.servers[0].withheld_prompts, ["py__review"]);
    assert_eq!(
        names(&list(&mut client, TOKEN).await),
        ["py__add_prompt", "py__echo"]
    );
    let refused = get(&mut client, get_request("py__review", &[("code", "x")]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&refused), "DEFINITION_NOT_APPROVED");
    let metadata = error_metadata(&refused);
    assert_eq!(metadata["prompt"], "py__review");
    assert_eq!(metadata["server"], "py");
    assert_eq!(metadata["definition_hash"].len(), 32);
    assert_eq!(metadata["approved_hash"].len(), 32);
    assert_ne!(metadata["definition_hash"], metadata["approved_hash"]);

    // `toolgate approve` records the change; the gateway follows the file.
    let (code, stdout, stderr) = toolgate(&["approve"], &config).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("1 changed"), "{stdout}");
    assert!(stdout.contains("~ py__review "), "{stdout}");
    let listing = wait_prompts(&mut client, "py__review approved", |l| {
        l.prompts.iter().any(|p| p.name == "py__review")
    })
    .await;
    assert!(listing.servers[0].withheld_prompts.is_empty());
    let rendered = get(&mut client, get_request("py__review", &[("code", "x")]))
        .await
        .unwrap();
    assert_eq!(text(&rendered.messages[0]), "Review this any code:\nx");
    let (code, stdout, _) = toolgate(&["check"], &config).await;
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("    prompt py__review\n"), "{stdout}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn get_prompt_is_audited_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let trail = dir.path().join("audit.jsonl");
    let (entry, _) = prompts_server("py", Transport::Stdio, &[("SECRET_TEXT", "plain")], "").await;
    let yaml = format!(
        "audit:\n  path: \"{}\"\n  digest_key: {{ env: DIGEST_KEY }}\n{}",
        trail.display(),
        tenant(&entry)
    );
    let gateway = TestGateway::start(
        &yaml,
        &[("DIGEST_KEY", "k-0123456789abcdef0123456789abcdef")],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = wait_prompts(&mut client, "listed", |l| !l.prompts.is_empty()).await;
    let hash = listing
        .prompts
        .iter()
        .find(|p| p.name == "py__review")
        .unwrap()
        .definition_hash
        .clone();
    let rendered = get(
        &mut client,
        get_request("py__review", &[("language", "Go"), ("code", "x := 1")]),
    )
    .await
    .unwrap();
    let size = prost::Message::encoded_len(&rendered) as u64;
    let _ = get(&mut client, get_request("py__missing", &[]))
        .await
        .unwrap_err();

    let records = || -> Vec<Value> {
        std::fs::read_to_string(&trail)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let started = Instant::now();
    while records().iter().filter(|r| r["rpc"] == "GetPrompt").count() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:#?}",
            records()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = records();
    let ok = all
        .iter()
        .find(|r| r["rpc"] == "GetPrompt" && r["outcome"] == "ok")
        .unwrap();
    assert_eq!(ok["v"], 8);
    assert_eq!(ok["kind"], "call");
    assert_eq!(ok["tenant"], "acme");
    assert_eq!(ok["prompt"], "py__review");
    assert_eq!(ok["server"], "py");
    assert_eq!(ok["definition_hash"], hash.as_str());
    assert_eq!(ok["sent"], true);
    assert_eq!(ok["code"], "OK");
    assert_eq!(ok["bytes"], size);
    assert!(ok.get("tool").is_none_or(Value::is_null), "{ok}");
    // The digest of the arguments as a JSON object (keys sorted), never
    // the arguments.
    let arguments = &ok["arguments"];
    let json = r#"{"code":"x := 1","language":"Go"}"#;
    let mut mac = Hmac::<Sha256>::new_from_slice(b"k-0123456789abcdef0123456789abcdef").unwrap();
    mac.update(json.as_bytes());
    let digest: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(arguments["hmac_sha256"], digest.as_str(), "{ok}");
    assert_eq!(arguments["bytes"], json.len(), "{ok}");
    assert!(!ok.to_string().contains("x := 1"), "{ok}");
    let missing = all
        .iter()
        .find(|r| r["rpc"] == "GetPrompt" && r["prompt"] == "py__missing")
        .unwrap();
    assert_eq!(missing["reason"], "PROMPT_NOT_FOUND");
    assert_eq!(missing["code"], "NOT_FOUND");
    assert_eq!(missing["sent"], false);
    gateway.shutdown().await;
}

#[tokio::test]
async fn prompts_added_at_runtime_are_listed_again_and_withheld_until_approved() {
    for lifecycle in ["initialize", "discover"] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("toolgate.yaml");
        let (open, _) = prompts_server(
            "open",
            Transport::Stdio,
            &[],
            &format!("        lifecycle: {lifecycle}\n"),
        )
        .await;
        let (guarded, _) = prompts_server(
            "guarded",
            Transport::Stdio,
            &[],
            &format!("        lifecycle: {lifecycle}\n        definitions: approved\n"),
        )
        .await;
        let yaml = format!(
            "approvals:\n  file: \"{}\"\n{}",
            dir.path().join("approvals.yaml").display(),
            tenant(&format!("{open}{guarded}"))
        );
        std::fs::write(&config, &yaml).unwrap();
        // What the guarded server offers at first is approved.
        let (code, stdout, stderr) = toolgate(&["approve"], &config).await;
        assert_eq!(code, 0, "{stdout}{stderr}");
        let gateway = TestGateway::start(&yaml, &[]).await;
        let mut client = gateway.client().await;
        let before = wait_prompts(&mut client, lifecycle, |l| {
            l.servers.iter().all(|s| s.connected)
        })
        .await;
        assert_eq!(before.prompts.len(), 6, "{before:#?}");
        for server in ["open", "guarded"] {
            let added = invoke(
                &mut client,
                TOKEN,
                &format!("{server}__add_prompt"),
                r#"{"name":"fresh"}"#,
            )
            .await
            .unwrap();
            assert_eq!(added.text, "added", "{lifecycle}");
        }
        let after = wait_prompts(&mut client, "both servers listed again", |l| {
            l.prompts.iter().any(|p| p.name == "open__fresh")
                && !l.servers[1].withheld_prompts.is_empty()
        })
        .await;
        assert_ne!(after.prompts_version, before.prompts_version);
        // The new prompt of the guarded server waits for an approval.
        assert_eq!(after.servers[1].withheld_prompts, ["guarded__fresh"]);
        assert!(!after.prompts.iter().any(|p| p.name == "guarded__fresh"));
        let refused = get(&mut client, get_request("guarded__fresh", &[]))
            .await
            .unwrap_err();
        assert_eq!(reason(&refused), "DEFINITION_NOT_APPROVED");
        let rendered = get(&mut client, get_request("open__fresh", &[]))
            .await
            .unwrap();
        assert_eq!(text(&rendered.messages[0]), "added fresh", "{lifecycle}");
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn configured_credentials_are_redacted_from_rendered_prompts() {
    const SECRET: &str = "sk-prompt-0123456789abcdef";
    let entry = |name: &str, extra: &str| {
        format!(
            "      - name: {name}\n        command: [\"{}\", \"{}\", \"stdio\"]\n        env:\n          \
             SECRET_TEXT: {{ env: PROMPT_SECRET }}\n{extra}",
            python().display(),
            fixture("python/prompts_server.py").display(),
        )
    };
    let yaml = tenant(&format!(
        "{}{}",
        entry("py", ""),
        entry("raw", "        redact_results: false\n")
    ));
    let gateway = TestGateway::start(&yaml, &[("PROMPT_SECRET", SECRET)]).await;
    let mut client = gateway.client().await;
    wait_prompts(&mut client, "listed", |l| l.prompts.len() == 6).await;
    let rendered = get(&mut client, get_request("py__secret", &[]))
        .await
        .unwrap();
    let shown = text(&rendered.messages[0]);
    assert!(!shown.contains(SECRET), "{shown}");
    assert!(
        shown.starts_with("the key is ") && shown.contains("redacted"),
        "{shown}"
    );
    // `redact_results: false` passes the prompt through as rendered.
    let raw = get(&mut client, get_request("raw__secret", &[]))
        .await
        .unwrap();
    assert_eq!(text(&raw.messages[0]), format!("the key is {SECRET}"));
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_per_user_servers_prompt_renders_with_the_subjects_own_credential() {
    use crate::oauth::{Scratch, authorization_url, config, consent_confirmed, env, upstream_with};
    let upstream = upstream_with(3600, &[], &["--prompts"]);
    let Scratch {
        dir: _dir,
        state_url,
        ..
    } = Scratch::new();
    let consent_port = free_port();
    let gateway = TestGateway::start(&config(&upstream, &state_url, consent_port), &env()).await;
    let mut client = gateway.client().await;
    let as_subject = |subject: &str, request: pb::GetPromptRequest| {
        let mut request = authed(TOKEN, request);
        request
            .metadata_mut()
            .insert("x-toolgate-subject", subject.parse().unwrap());
        request
    };
    // Nobody has consented to `docs` yet: Alice is given her link.
    let started = Instant::now();
    let url = loop {
        match client
            .get_prompt(as_subject("alice", get_request("docs__whoami", &[])))
            .await
        {
            Err(status) if reason(&status) == "UPSTREAM_AUTHORIZATION_REQUIRED" => {
                break authorization_url(&status);
            }
            other => {
                assert!(started.elapsed() < Duration::from_secs(20), "{other:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    consent_confirmed(&mut client, &url, "alice", consent_port).await;
    // Once listed (with Alice's consent), her prompt renders as her.
    let started = Instant::now();
    let rendered = loop {
        match client
            .get_prompt(as_subject("alice", get_request("docs__whoami", &[])))
            .await
        {
            Ok(rendered) => break rendered.into_inner(),
            Err(status) => {
                assert!(started.elapsed() < Duration::from_secs(20), "{status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(text(&rendered.messages[0]), "you are alice");
    // The tenant's own (client credentials) server renders as the tenant.
    let listing = wait_prompts(&mut client, "svc's prompt", |l| {
        l.prompts.iter().any(|p| p.name == "svc__whoami")
    })
    .await;
    assert!(listing.prompts.iter().any(|p| p.name == "docs__whoami"));
    let tenant = get(&mut client, get_request("svc__whoami", &[]))
        .await
        .unwrap();
    assert_eq!(text(&tenant.messages[0]), "you are client:svc");
    // Bob never borrows Alice's token: he is asked to consent.
    let bob = client
        .get_prompt(as_subject("bob", get_request("docs__whoami", &[])))
        .await
        .unwrap_err();
    authorization_url(&bob);
    gateway.shutdown().await;
}
