//! `Complete`: argument completion through the gateway against
//! server-everything (a resource template over stdio and Streamable HTTP,
//! and its `completable-prompt`, whose second argument's values depend on
//! the first), with its refusals (unknown server, a server that does not
//! complete, a request naming nothing, a value over
//! `limits.max_argument_bytes`) and its audit record.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use toolgate::pb;

use crate::common::*;

const TOKEN: &str = "acme-token";
const TEXT_TEMPLATE: &str = "demo://resource/dynamic/text/{resourceId}";

type Client = pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>;

/// Tenant `acme` with server-everything over stdio as `everything`, a
/// server that offers no completion as `plain`, `extra` at the top level.
fn yaml(plain: &McpServer, extra: &str) -> String {
    format!(
        "{extra}tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n      - name: plain\n        url: \"{}\"\n",
        node().display(),
        everything_js().display(),
        plain.url
    )
}

fn template(server: &str, uri_template: &str, argument: &str, value: &str) -> pb::CompleteRequest {
    pb::CompleteRequest {
        r#ref: Some(pb::complete_request::Ref::ResourceTemplate(
            pb::ResourceTemplateRef {
                server: server.to_owned(),
                uri_template: uri_template.to_owned(),
            },
        )),
        argument_name: argument.to_owned(),
        value: value.to_owned(),
        ..Default::default()
    }
}

fn prompt(
    name: &str,
    argument: &str,
    value: &str,
    context: &[(&str, &str)],
) -> pb::CompleteRequest {
    pb::CompleteRequest {
        r#ref: Some(pb::complete_request::Ref::Prompt(name.to_owned())),
        argument_name: argument.to_owned(),
        value: value.to_owned(),
        context_arguments: context
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

async fn complete(
    client: &mut Client,
    request: pb::CompleteRequest,
) -> Result<pb::CompleteResponse, tonic::Status> {
    client
        .complete(authed(TOKEN, request))
        .await
        .map(tonic::Response::into_inner)
}

/// Asserts `status` has `code` and `reason`.
fn assert_refused(
    result: Result<pb::CompleteResponse, tonic::Status>,
    code: tonic::Code,
    why: &str,
) {
    let status = result.expect_err(why);
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(reason(&status), why, "{status:?}");
}

/// Every record in the audit file, parsed.
fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Waits (bounded) for `count` Complete records.
async fn complete_records(path: &Path, count: usize) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let found: Vec<Value> = records(path)
            .into_iter()
            .filter(|r| r["rpc"] == "Complete")
            .collect();
        if found.len() >= count {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} Complete records of {count}",
            found.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_resource_template_argument_completes_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let plain = serve_mcp(TestServer::new(&["noop"])).await;
    let extra = format!(
        "audit:\n  path: \"{}\"\nlimits:\n  max_argument_bytes: 64\n",
        audit.display()
    );
    let gateway = TestGateway::start(&yaml(&plain, &extra), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "everything__echo").await;

    let answer = complete(
        &mut client,
        template("everything", TEXT_TEMPLATE, "resourceId", "42"),
    )
    .await
    .expect("Complete");
    assert_eq!(answer.values, ["42"]);
    assert!(!answer.has_more);
    let none = complete(
        &mut client,
        template("everything", TEXT_TEMPLATE, "resourceId", "x"),
    )
    .await
    .expect("Complete");
    assert!(none.values.is_empty(), "{none:?}");

    // Refusals, nothing sent.
    assert_refused(
        complete(
            &mut client,
            template("nowhere", TEXT_TEMPLATE, "resourceId", "1"),
        )
        .await,
        tonic::Code::NotFound,
        "SERVER_NOT_FOUND",
    );
    assert_refused(
        complete(&mut client, template("plain", "x://{id}", "id", "1")).await,
        tonic::Code::FailedPrecondition,
        "COMPLETION_UNSUPPORTED",
    );
    assert_refused(
        complete(
            &mut client,
            pb::CompleteRequest {
                argument_name: "a".to_owned(),
                ..Default::default()
            },
        )
        .await,
        tonic::Code::InvalidArgument,
        "INVALID_COMPLETION",
    );
    assert_refused(
        complete(&mut client, template("everything", TEXT_TEMPLATE, "", "1")).await,
        tonic::Code::InvalidArgument,
        "INVALID_COMPLETION",
    );
    let mut big = template("everything", TEXT_TEMPLATE, "resourceId", "1");
    big.context_arguments
        .insert("other".to_owned(), "v".repeat(64));
    assert_refused(
        complete(&mut client, big).await,
        tonic::Code::ResourceExhausted,
        "ARGUMENTS_TOO_LARGE",
    );
    let unknown = complete(&mut client, prompt("everything__nothing", "a", "", &[])).await;
    assert_refused(unknown, tonic::Code::NotFound, "PROMPT_NOT_FOUND");

    // One record per Complete, field by field.
    let all = complete_records(&audit, 8).await;
    let ok = &all[0];
    assert_eq!(ok["v"], 8);
    assert_eq!(ok["kind"], "call");
    assert_eq!(ok["tenant"], "acme");
    assert_eq!(ok["outcome"], "ok");
    assert_eq!(ok["code"], "OK");
    assert_eq!(ok["sent"], true);
    assert_eq!(ok["server"], "everything");
    assert_eq!(ok["uri_template"], TEXT_TEMPLATE);
    assert!(ok.get("prompt").is_none(), "{ok}");
    let arguments = r#"{"argument":"resourceId","context":{},"value":"42"}"#;
    assert_eq!(ok["arguments"]["bytes"], arguments.len(), "{ok}");
    let reasons: Vec<&str> = all[2..]
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        reasons,
        [
            "SERVER_NOT_FOUND",
            "COMPLETION_UNSUPPORTED",
            "INVALID_COMPLETION",
            "INVALID_COMPLETION",
            "ARGUMENTS_TOO_LARGE",
            "PROMPT_NOT_FOUND"
        ]
    );
    assert!(all[2..].iter().all(|r| r["sent"] == false), "{all:#?}");
    assert_eq!(all[3]["server"], "plain");
    assert_eq!(all[7]["prompt"], "everything__nothing");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_resource_template_completes_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, port) = start_everything_http(&dir.path().join("headers.jsonl")).await;
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: remote\n        url: \"http://127.0.0.1:{port}/mcp\"\n"
        ),
        &[],
    )
    .await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "remote__echo").await;
    let answer = complete(
        &mut client,
        template("remote", TEXT_TEMPLATE, "resourceId", "7"),
    )
    .await
    .expect("Complete");
    assert_eq!(answer.values, ["7"]);
    gateway.shutdown().await;
}

/// Needs the prompt catalog (issue 20, part A): until prompts are listed,
/// `everything__completable-prompt` is PROMPT_NOT_FOUND.
#[tokio::test]
async fn a_prompt_argument_completes_with_the_others_as_context() {
    let plain = serve_mcp(TestServer::new(&["noop"])).await;
    let gateway = TestGateway::start(&yaml(&plain, ""), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "everything__echo").await;
    let name = "everything__completable-prompt";
    let departments = complete(&mut client, prompt(name, "department", "", &[]))
        .await
        .expect("Complete");
    assert_eq!(
        departments.values,
        ["Engineering", "Sales", "Marketing", "Support"]
    );
    let one = complete(&mut client, prompt(name, "department", "Ma", &[]))
        .await
        .expect("Complete");
    assert_eq!(one.values, ["Marketing"]);
    let leads = complete(
        &mut client,
        prompt(name, "name", "", &[("department", "Engineering")]),
    )
    .await
    .expect("Complete");
    assert_eq!(leads.values, ["Alice", "Bob", "Charlie"]);
    let sales = complete(
        &mut client,
        prompt(name, "name", "E", &[("department", "Sales")]),
    )
    .await
    .expect("Complete");
    assert_eq!(sales.values, ["Eve"]);
    // `plain` offers no completion (nor prompts): its name is unknown.
    assert_refused(
        complete(&mut client, prompt("plain__x", "a", "", &[])).await,
        tonic::Code::NotFound,
        "PROMPT_NOT_FOUND",
    );
    gateway.shutdown().await;
}

/// The Python SDK's completion server over stdio, as `initialize` (2025-11-25)
/// and `discover` (2026-07-28), its `API_KEY` a configured credential.
fn python_yaml() -> String {
    let entry = |name: &str, lifecycle: &str| {
        format!(
            "      - name: {name}\n        lifecycle: {lifecycle}\n        command: [\"{}\", \"{}\"]\n        env:\n          API_KEY: {{ env: NOTES_KEY }}\n",
            python().display(),
            fixture("python/completion_server.py").display()
        )
    };
    format!(
        "tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{}{}",
        entry("old", "initialize"),
        entry("new", "discover")
    )
}

#[tokio::test]
async fn python_sdk_completions_on_both_revisions_are_bounded_and_redacted() {
    let gateway = TestGateway::start(&python_yaml(), &[("NOTES_KEY", "notes-secret-4711")]).await;
    let mut client = gateway.client().await;
    let notes = "notes://{owner}/{id}";
    for server in ["old", "new"] {
        let owners = complete(&mut client, template(server, notes, "owner", "")).await;
        let owners = owners.unwrap_or_else(|e| panic!("{server}: {e:?}"));
        assert_eq!(owners.values, ["alice", "bob", "carol"], "{server}");
        let b = complete(&mut client, template(server, notes, "owner", "b"))
            .await
            .unwrap();
        assert_eq!(b.values, ["bob"], "{server}");
        // The context reaches the server; its total and has_more are kept.
        let mut ids = template(server, notes, "id", "");
        ids.context_arguments
            .insert("owner".to_owned(), "carol".to_owned());
        let ids = complete(&mut client, ids).await.unwrap();
        assert_eq!(ids.values.len(), 100, "{server}");
        assert_eq!(ids.values[0], "carol-0");
        assert_eq!(ids.values[99], "carol-99");
        assert_eq!((ids.total, ids.has_more), (Some(150), true), "{server}");
        if server == "old" {
            // More than 100 values (which the SDK sends only at 2025-11-25):
            // the first 100, has_more, and their number as the total.
            let over = complete(&mut client, template(server, notes, "over", ""))
                .await
                .unwrap();
            assert_eq!(over.values.len(), 100);
            assert_eq!(over.values[99], "v99");
            assert_eq!((over.total, over.has_more), (Some(150), true));
        }
        // A configured credential never leaves; a long value is cut to 1 KiB.
        let secret = complete(&mut client, template(server, notes, "secret", ""))
            .await
            .unwrap();
        assert_eq!(secret.values.len(), 1);
        assert!(secret.values[0].starts_with("key="), "{:?}", secret.values);
        assert!(
            !secret.values[0].contains("notes-secret-4711"),
            "{:?}",
            secret.values
        );
        let long = complete(&mut client, template(server, notes, "long", ""))
            .await
            .unwrap();
        assert_eq!(long.values, ["x".repeat(1024)], "{server}");
    }
    gateway.shutdown().await;
}

/// Completes `subject://{name}` of the per-user server `docs` for
/// `subject`.
async fn complete_for(
    client: &mut Client,
    subject: &str,
) -> Result<pb::CompleteResponse, tonic::Status> {
    let mut request = authed(
        "acme-token",
        template("docs", "subject://{name}", "name", ""),
    );
    request
        .metadata_mut()
        .insert("x-toolgate-subject", subject.parse().unwrap());
    client
        .complete(request)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_per_user_server_completes_with_the_subjects_own_credential() {
    use crate::oauth::{Scratch, authorization_url, config, consent_confirmed, env, upstream};
    let upstream = upstream(3600);
    let Scratch {
        dir: _dir,
        state_url,
        ..
    } = Scratch::new();
    let consent_port = free_port();
    let gateway = TestGateway::start(&config(&upstream, &state_url, consent_port), &env()).await;
    let mut client = gateway.client().await;
    // Alice has not consented: her link, and nothing sent.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        match complete_for(&mut client, "alice").await {
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => break other.expect_err("alice must consent first"),
        }
    };
    let url = authorization_url(&status);
    consent_confirmed(&mut client, &url, "alice", consent_port).await;
    // Her completion carries her token; Bob's never borrows it.
    let answer = complete_for(&mut client, "alice").await.expect("Complete");
    assert_eq!(answer.values, ["alice"]);
    let bob = complete_for(&mut client, "bob").await.unwrap_err();
    authorization_url(&bob);
    gateway.shutdown().await;
}

/// Under `audit.required`, a completion is a call like any other: with a
/// trail that cannot be written, it is refused before anything is sent
/// (not sent and its values withheld afterwards).
#[tokio::test]
async fn a_required_trail_that_cannot_be_written_refuses_a_completion_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the file should be: it can never be opened.
    let audit = dir.path().join("audit.jsonl");
    std::fs::create_dir(&audit).unwrap();
    let plain = serve_mcp(TestServer::new(&["noop"])).await;
    let extra = format!(
        "audit:\n  path: \"{}\"\n  required: true\n",
        audit.display()
    );
    let gateway = TestGateway::start(&yaml(&plain, &extra), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "everything__echo").await;
    let status = complete(
        &mut client,
        template("everything", TEXT_TEMPLATE, "resourceId", "42"),
    )
    .await
    .expect_err("the trail cannot be written");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(reason(&status), "AUDIT_UNAVAILABLE");
    assert!(
        status.message().contains("nothing was sent upstream"),
        "{status:?}"
    );
    gateway.shutdown().await;
}
