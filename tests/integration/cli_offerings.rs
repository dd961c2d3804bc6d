//! `toolgate resources`, `read`, `prompts` and `prompt` as processes
//! against a gateway in front of server-everything (npm, stdio).

use std::process::Output;

use crate::common::*;

const TOKEN: &str = "tok-cli-offerings";

fn yaml(metrics_port: u16) -> String {
    format!(
        "metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n",
        node().display(),
        everything_js().display()
    )
}

/// Runs the toolgate binary with `args` against `gateway`.
async fn toolgate(gateway: &TestGateway, args: &[&str]) -> Output {
    let addr = format!("http://{}", gateway.addr);
    let mut all = vec![args[0], "--addr", &addr];
    all.extend_from_slice(&args[1..]);
    tokio::process::Command::new(toolgate_bin())
        .args(&all)
        .env("TOOLGATE_TOKEN", TOKEN)
        .env_remove("TOOLGATE_ADDR")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_read_prompts_and_prompt_from_the_command_line() {
    let metrics_port = free_port();
    let gateway = TestGateway::start(&yaml(metrics_port), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "everything__echo").await;

    let listed = stdout(&toolgate(&gateway, &["resources", "--json"]).await);
    let listed: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    let uris: Vec<&str> = listed["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    let doc = "demo://resource/static/document/architecture.md";
    assert!(uris.contains(&doc), "{uris:?}");
    assert!(
        listed["resource_templates"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["uri_template"] == "demo://resource/dynamic/blob/{resourceId}"),
        "{listed}"
    );

    // Text to standard output: the file server-everything serves.
    let text = stdout(&toolgate(&gateway, &["read", "everything", doc]).await);
    let expected = std::fs::read_to_string(
        everything_js()
            .parent()
            .unwrap()
            .join("docs/architecture.md"),
    )
    .unwrap();
    assert_eq!(text.trim_end(), expected.trim_end());

    // A blob needs --out; the file holds the decoded bytes.
    let blob = "demo://resource/dynamic/blob/7";
    let refused = toolgate(&gateway, &["read", "everything", blob]).await;
    assert_eq!(
        refused.status.code(),
        Some(64),
        "binary contents need --out"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("blob.bin");
    stdout(
        &toolgate(
            &gateway,
            &["read", "everything", blob, "--out", out.to_str().unwrap()],
        )
        .await,
    );
    let bytes = std::fs::read(&out).unwrap();
    assert!(
        String::from_utf8_lossy(&bytes).starts_with("Resource 7: This is a base64 blob"),
        "{bytes:?}"
    );

    // An unknown server: NOT_FOUND (exit 5) and the reason.
    let unknown = toolgate(&gateway, &["read", "nowhere", doc]).await;
    assert_eq!(unknown.status.code(), Some(5));
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("SERVER_NOT_FOUND"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );

    let prompts = stdout(&toolgate(&gateway, &["prompts"]).await);
    let args_prompt = prompts
        .lines()
        .find(|l| l.starts_with("everything__args-prompt "))
        .unwrap_or_else(|| panic!("{prompts}"));
    assert!(args_prompt.contains(" city [state] "), "{prompts}");
    let rendered = stdout(
        &toolgate(
            &gateway,
            &[
                "prompt",
                "everything__args-prompt",
                "city=Paris",
                "state=Texas",
            ],
        )
        .await,
    );
    assert!(
        rendered.contains("[user] What's weather in Paris, Texas?"),
        "{rendered}"
    );
    let malformed = toolgate(&gateway, &["prompt", "everything__args-prompt", "Paris"]).await;
    assert_eq!(malformed.status.code(), Some(64));

    // Each request counted by its outcome; a server the tenant does not
    // have is no label value.
    let page = scrape(metrics_port).await;
    let series = |server: &str, rpc: &str, outcome: &str| {
        sample(
            &page,
            &format!(
                "toolgate_requests_total{{tenant=\"acme\",server=\"{server}\",rpc=\"{rpc}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    // The text, the blob refused by the CLI after it arrived, the blob saved.
    assert_eq!(
        series("everything", "ReadResource", "ok").as_deref(),
        Some("3"),
        "{page}"
    );
    assert_eq!(
        series("", "ReadResource", "SERVER_NOT_FOUND").as_deref(),
        Some("1"),
        "{page}"
    );
    assert_eq!(
        series("everything", "GetPrompt", "ok").as_deref(),
        Some("1"),
        "{page}"
    );
    assert!(!page.contains("nowhere"), "{page}");
    gateway.shutdown().await;
}
