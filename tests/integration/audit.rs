//! The audit trail: one JSON line per call and per refusal, read back and
//! checked field by field; arguments kept as a keyed digest (HMAC, never a
//! plain hash; or redacted in `full` mode); a required trail that cannot be written fails calls
//! before they are sent; a moved file is followed, and SIGHUP reopens it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tonic::Code;
use toolgate::pb;

use crate::common::*;

/// The tenant's second token: records name it as token index 1.
const TOKEN: &str = "acme-token-2";
/// The upstream credential, from the environment.
const SECRET: &str = "sk-audit-7f3e2d1c0b9a8877";
/// A string that must not be kept in digest mode.
const MARKER: &str = "marker-5b1f0c-plaintext";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// The arguments' digest key (`audit.digest_key: { env: DIGEST_KEY }`).
const DIGEST_KEY: &str = "audit-digest-key-0123456789abcdef0123";
/// Another key, as after a rotation.
const OTHER_DIGEST_KEY: &str = "audit-digest-key-rotated-fedcba9876543210";

fn config(audit: &str, tenant_extra: &str, url: &str) -> String {
    format!(
        "audit:\n{audit}tenants:\n  - name: acme\n    tokens: [acme-token-1, {TOKEN}]\n{tenant_extra}    servers:\n      - name: t\n        url: \"{url}\"\n        headers:\n          X-Api-Key: {{ env: API_KEY }}\n"
    )
}

fn audit_at(path: &Path, extra: &str) -> String {
    format!("  path: \"{}\"\n{extra}", path.display())
}

/// Every record in the file, parsed.
fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// Waits (bounded) until a record matching `matches` is in the file.
async fn record_where(path: &Path, matches: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        if let Some(record) = records(path).into_iter().find(&matches) {
            return record;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no such record in {}",
            std::fs::read_to_string(path).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

/// HMAC-SHA-256 of `text` under `key`, in lowercase hex.
fn hmac_hex(key: &str, text: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(text.as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// The id records give `key`: the first 16 hex characters of
/// SHA-256("toolgate-audit-digest-key-id\0" ‖ key).
fn key_id(key: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"toolgate-audit-digest-key-id\0");
    hasher.update(key.as_bytes());
    hex(&hasher.finalize())[..16].to_owned()
}

/// `audit.digest_key` from the environment variable `DIGEST_KEY`.
const KEYED: &str = "  digest_key: { env: DIGEST_KEY }\n";

/// The record of the only call of `tool` (with `outcome`).
fn call_of<'a>(all: &'a [Value], tool: &str, outcome: &str) -> &'a Value {
    let found: Vec<&Value> = all
        .iter()
        .filter(|r| r["kind"] == "call" && r["tool"] == tool && r["outcome"] == outcome)
        .collect();
    assert_eq!(found.len(), 1, "{tool} {outcome}: {all:#?}");
    found[0]
}

/// The fields every call record has.
fn assert_common(record: &Value, rpc: &str) {
    assert_eq!(record["v"], 8);
    assert_eq!(record["kind"], "call");
    assert_eq!(record["rpc"], rpc);
    assert_eq!(record["tenant"], "acme");
    assert_eq!(
        record["caller"],
        serde_json::json!({"kind": "token", "token_index": 1}),
        "the token's index, never the token"
    );
    assert!(
        record["peer"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{record}"
    );
    assert_eq!(record["replica"], "gw-audit-0");
    let time = record["time"].as_str().unwrap();
    assert_eq!(time.len(), "2025-06-01T12:00:00.123Z".len(), "{time}");
    assert!(time.ends_with('Z'), "{time}");
    assert!(record["duration_ms"].as_f64().unwrap() >= 0.0);
}

#[tokio::test]
async fn each_call_and_refusal_gets_one_record_field_by_field() {
    let server = serve_mcp(TestServer::new(&["echo", "fail", "slow", "wipe"])).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let gateway = TestGateway::start(
        &config(
            &audit_at(&path, KEYED),
            "    limits:\n      max_concurrent_calls: 1\n      queue_timeout: \"50ms\"\n    policy:\n      - deny: \"t__wipe\"\n",
            &server.url,
        ),
        &[
            ("API_KEY", SECRET),
            ("POD_NAME", "gw-audit-0"),
            ("DIGEST_KEY", DIGEST_KEY),
        ],
    )
    .await;
    let mut client = gateway.client().await;
    let listing = list(&mut client, TOKEN).await;
    let echo_hash = listing
        .tools
        .iter()
        .find(|t| t.name == "t__echo")
        .unwrap()
        .definition_hash
        .clone();

    // A successful call, for an end user, in a caller's trace; its
    // arguments hold a configured secret and a marker.
    let arguments = format!("{{\"text\": \"{MARKER} {SECRET}\"}}");
    let mut request = authed(
        TOKEN,
        pb::InvokeToolRequest {
            name: "t__echo".into(),
            arguments_json: arguments.clone(),
            ..Default::default()
        },
    );
    request
        .metadata_mut()
        .insert("traceparent", TRACEPARENT.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-toolgate-subject", "user-7".parse().unwrap());
    let response = client.invoke_tool(request).await.unwrap().into_inner();
    assert!(!response.is_error);
    // The record is written before the response leaves.
    let all = records(&path);
    let ok = call_of(&all, "t__echo", "ok");
    assert_common(ok, "InvokeTool");
    assert_eq!(ok["subject"], "token:user-7");
    assert_eq!(ok["server"], "t");
    assert_eq!(ok["definition_hash"], echo_hash.as_str());
    assert_eq!(ok["sent"], true);
    assert_eq!(ok["code"], "OK");
    assert!(ok.get("reason").is_none(), "{ok}");
    assert_eq!(ok["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        ok["arguments"],
        serde_json::json!({
            "hmac_sha256": hmac_hex(DIGEST_KEY, &arguments),
            "key_id": key_id(DIGEST_KEY),
            "bytes": arguments.len(),
        }),
        "the keyed digest of arguments_json as received"
    );

    // A tool error, over InvokeToolStream.
    let mut stream = client
        .invoke_tool_stream(authed(
            TOKEN,
            pb::InvokeToolRequest {
                name: "t__fail".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    while let Some(event) = stream.message().await.unwrap() {
        if let Some(pb::invoke_tool_event::Event::Result(result)) = event.event {
            assert!(result.is_error);
        }
    }
    let all = records(&path);
    let failed = call_of(&all, "t__fail", "tool_error");
    assert_common(failed, "InvokeToolStream");
    assert!(failed.get("subject").is_none(), "the tenant itself");
    assert_eq!(failed["code"], "OK");
    assert_eq!(failed["sent"], true);
    assert_eq!(failed["arguments"]["hmac_sha256"], hmac_hex(DIGEST_KEY, ""));
    assert_eq!(failed["arguments"]["bytes"], 0);

    // An unknown tool: refused, nothing sent.
    let err = invoke(&mut client, TOKEN, "t__nope", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let all = records(&path);
    let unknown = call_of(&all, "t__nope", "refused");
    assert_common(unknown, "InvokeTool");
    assert_eq!(unknown["code"], "NOT_FOUND");
    assert_eq!(unknown["reason"], "TOOL_NOT_FOUND");
    assert_eq!(unknown["sent"], false);
    assert!(unknown.get("server").is_none() && unknown.get("definition_hash").is_none());

    // A call the tenant's policy refuses.
    let err = invoke(&mut client, TOKEN, "t__wipe", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let all = records(&path);
    let denied = call_of(&all, "t__wipe", "refused");
    assert_common(denied, "InvokeTool");
    assert_eq!(denied["code"], "PERMISSION_DENIED");
    assert_eq!(denied["reason"], "TOOL_NOT_PERMITTED");
    assert_eq!(denied["server"], "t");
    assert_eq!(denied["sent"], false);
    assert!(
        denied["definition_hash"]
            .as_str()
            .is_some_and(|h| !h.is_empty())
    );

    // A call shed by the tenant's concurrency limit while `slow` runs.
    let mut slow_client = client.clone();
    let slow = tokio::spawn(async move { invoke(&mut slow_client, TOKEN, "t__slow", "{}").await });
    tokio::time::timeout(Duration::from_secs(10), server.log.slow_started.notified())
        .await
        .unwrap();
    let err = invoke(&mut client, TOKEN, "t__echo", "{\"text\": \"x\"}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    let all = records(&path);
    let shed = call_of(&all, "t__echo", "refused");
    assert_common(shed, "InvokeTool");
    assert_eq!(shed["code"], "RESOURCE_EXHAUSTED");
    assert_eq!(shed["reason"], "TENANT_CONCURRENCY_LIMIT");
    assert_eq!(shed["sent"], false);

    // The caller of `slow` goes away: the call is recorded as cancelled
    // (the tool may have acted).
    slow.abort();
    let cancelled = record_where(&path, |r| r["tool"] == "t__slow").await;
    assert_common(&cancelled, "InvokeTool");
    assert_eq!(cancelled["outcome"], "cancelled");
    assert_eq!(cancelled["code"], "CANCELLED");

    // Refused by authentication: an unknown token, and none at all.
    let err = invoke(&mut client, "not-a-token", "t__echo", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = client
        .list_tools(tonic::Request::new(pb::ListToolsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    // The peer's first refusal in the interval is a record of its own; the
    // second is counted for the interval's summary.
    let all = records(&path);
    let refusals: Vec<&Value> = all.iter().filter(|r| r["kind"] == "refusal").collect();
    assert_eq!(refusals.len(), 1, "{refusals:#?}");
    let refusal = refusals[0];
    assert_eq!(refusal["rpc"], "InvokeTool");
    assert_eq!(refusal["outcome"], "refused");
    assert_eq!(refusal["code"], "UNAUTHENTICATED");
    assert!(refusal["reason"].as_str().is_some_and(|r| !r.is_empty()));
    assert!(refusal.get("tenant").is_none() && refusal.get("caller").is_none());
    assert!(refusal["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(refusal["replica"], "gw-audit-0");

    // No secret, no raw argument and no plain hash of one anywhere in the
    // trail (a plain hash of a guessable argument gives it away), nor the
    // digest key.
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(SECRET), "{text}");
    assert!(!text.contains(MARKER), "{text}");
    for plain in [&arguments, "", "{}", "{\"text\": \"x\"}"] {
        assert!(!text.contains(&sha256_hex(plain)), "{plain}: {text}");
    }
    assert!(!text.contains(DIGEST_KEY), "{text}");
    assert!(!text.contains(TOKEN) && !text.contains("not-a-token"));
    // One record per call: echo ok, fail, nope, wipe, shed, slow; 1
    // refusal.
    assert_eq!(records(&path).len(), 7, "{text}");
    gateway.shutdown().await;
    // At shutdown, the summary of the interval's other refusals.
    let all = records(&path);
    assert_eq!(all.len(), 8, "{all:#?}");
    let summary = &all[7];
    assert_eq!(summary["kind"], "refusal");
    assert_eq!(summary["event"], "refusals_summarized");
    assert_eq!(summary["peer"], "127.0.0.1");
    assert_eq!(summary["count"], 1);
    assert_eq!(summary["outcome"], "refused");
    let reasons = summary["reasons"].as_object().unwrap();
    assert_eq!(
        reasons.values().map(|n| n.as_u64().unwrap()).sum::<u64>(),
        1
    );
    assert!(summary["first_time"].as_str().unwrap() <= summary["last_time"].as_str().unwrap());
}

/// A flood of refusals from one client: one record of its own, the rest
/// one summary (the interval's end or shutdown); nothing lost.
#[tokio::test]
async fn a_flood_of_refusals_is_summed_up_per_peer() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let gateway = TestGateway::start(
        &config(&audit_at(&path, KEYED), "", &server.url),
        &[("API_KEY", SECRET), ("DIGEST_KEY", DIGEST_KEY)],
    )
    .await;
    let mut client = gateway.client().await;
    const FLOOD: u64 = 500;
    for _ in 0..FLOOD {
        let err = invoke(&mut client, "not-a-token", "t__echo", "{}")
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
    }
    let refusals = |all: &[Value]| -> Vec<Value> {
        all.iter()
            .filter(|r| r["kind"] == "refusal")
            .cloned()
            .collect()
    };
    assert_eq!(refusals(&records(&path)).len(), 1, "one record of its own");
    gateway.shutdown().await;
    let all = refusals(&records(&path));
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(all[0].get("event").is_none(), "{}", all[0]);
    assert_eq!(all[1]["event"], "refusals_summarized");
    assert_eq!(all[1]["count"], FLOOD - 1, "{}", all[1]);
    assert_eq!(
        all[1]["reasons"][all[0]["reason"].as_str().unwrap()],
        FLOOD - 1
    );
    toolgate::audit::verify::verify_files(&[path]).unwrap();
}

#[tokio::test]
async fn full_mode_keeps_arguments_with_credentials_redacted() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let gateway = TestGateway::start(
        &config(&audit_at(&path, "  arguments: full\n"), "", &server.url),
        &[("API_KEY", SECRET)],
    )
    .await;
    let mut client = gateway.client().await;
    let arguments = format!("{{\"text\": \"{MARKER} {SECRET}\", \"nested\": [\"token {TOKEN}\"]}}");
    invoke(&mut client, TOKEN, "t__echo", &arguments)
        .await
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(SECRET), "{text}");
    assert!(
        !text.contains(TOKEN),
        "caller tokens are credentials too: {text}"
    );
    let all = records(&path);
    let record = call_of(&all, "t__echo", "ok");
    assert_eq!(
        record["arguments"]["value"],
        serde_json::json!({"text": format!("{MARKER} [redacted]"), "nested": ["token [redacted]"]})
    );
    // Without a configured key: a random one of this process, named.
    let digest = record["arguments"]["hmac_sha256"].as_str().unwrap();
    assert_eq!(digest.len(), 64);
    assert_ne!(digest, sha256_hex(&arguments));
    assert_ne!(digest, hmac_hex(DIGEST_KEY, &arguments));
    assert_eq!(record["arguments"]["key_id"].as_str().unwrap().len(), 16);
    assert!(!text.contains(&sha256_hex(&arguments)), "{text}");
    assert!(record.get("replica").is_none(), "no POD_NAME or HOSTNAME");

    // `none` keeps nothing of the arguments.
    gateway.shutdown().await;
    let none_path = dir.path().join("none.jsonl");
    let gateway = TestGateway::start(
        &config(
            &audit_at(&none_path, "  arguments: none\n"),
            "",
            &server.url,
        ),
        &[("API_KEY", SECRET)],
    )
    .await;
    let mut client = gateway.client().await;
    invoke(&mut client, TOKEN, "t__echo", &arguments)
        .await
        .unwrap();
    let all = records(&none_path);
    assert!(call_of(&all, "t__echo", "ok").get("arguments").is_none());
    gateway.shutdown().await;
}

/// The record of one `t__echo` call with `arguments` by a gateway whose
/// environment is `env` and whose `audit:` block adds `extra`.
async fn digest_of_echo(
    server: &McpServer,
    path: &Path,
    extra: &str,
    env: &[(&str, &str)],
    arguments: &str,
) -> Value {
    let mut env = env.to_vec();
    env.push(("API_KEY", SECRET));
    let gateway = TestGateway::start(&config(&audit_at(path, extra), "", &server.url), &env).await;
    let mut client = gateway.client().await;
    invoke(&mut client, TOKEN, "t__echo", arguments)
        .await
        .unwrap();
    gateway.shutdown().await;
    let all = records(path);
    let record = call_of(&all, "t__echo", "ok");
    assert_eq!(record["v"], 8);
    record["arguments"].clone()
}

#[tokio::test]
async fn argument_digests_are_hmacs_comparable_under_one_key_only() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    // A low-entropy argument: a plain hash of it would give it away.
    let pin = "{\"text\": \"1234\"}";
    let keyed = [("DIGEST_KEY", DIGEST_KEY)];
    let first = digest_of_echo(&server, &dir.path().join("1.jsonl"), KEYED, &keyed, pin).await;
    let second = digest_of_echo(&server, &dir.path().join("2.jsonl"), KEYED, &keyed, pin).await;
    assert_eq!(first["hmac_sha256"], hmac_hex(DIGEST_KEY, pin));
    assert_eq!(first["key_id"], key_id(DIGEST_KEY));
    assert_eq!(first, second, "one key: the same digest in every gateway");

    // Rotated: another key, another digest and key id.
    let rotated = digest_of_echo(
        &server,
        &dir.path().join("3.jsonl"),
        KEYED,
        &[("DIGEST_KEY", OTHER_DIGEST_KEY)],
        pin,
    )
    .await;
    assert_eq!(rotated["hmac_sha256"], hmac_hex(OTHER_DIGEST_KEY, pin));
    assert_eq!(rotated["key_id"], key_id(OTHER_DIGEST_KEY));
    assert_ne!(rotated["hmac_sha256"], first["hmac_sha256"]);

    // No key: a random one per gateway, so digests differ between them.
    let unkeyed_a = digest_of_echo(&server, &dir.path().join("4.jsonl"), "", &[], pin).await;
    let unkeyed_b = digest_of_echo(&server, &dir.path().join("5.jsonl"), "", &[], pin).await;
    assert_ne!(unkeyed_a["key_id"], unkeyed_b["key_id"]);
    assert_ne!(unkeyed_a["hmac_sha256"], unkeyed_b["hmac_sha256"]);

    // Never the plain SHA-256 of the arguments, under any key.
    for n in 1..=5 {
        let text = std::fs::read_to_string(dir.path().join(format!("{n}.jsonl"))).unwrap();
        assert!(!text.contains(&sha256_hex(pin)), "{text}");
        assert!(!text.contains("\"sha256\""), "{text}");
    }
}

/// `toolgate_audit_failures_total{reason="write"}` on the metrics listener.
async fn write_failures(port: u16) -> f64 {
    let page = scrape(port).await;
    sample(&page, "toolgate_audit_failures_total{reason=\"write\"} ")
        .unwrap_or_else(|| panic!("no audit failure count in {page}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_required_trail_that_cannot_be_written_fails_calls_before_they_are_sent() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    // A directory where the file should be: it can never be opened.
    let path = dir.path().join("audit.jsonl");
    std::fs::create_dir(&path).unwrap();
    let port = free_port();
    let yaml = format!(
        "metrics:\n  listen: \"127.0.0.1:{port}\"\n{}",
        config(&audit_at(&path, "  required: true\n"), "", &server.url)
    );
    let gateway = TestGateway::start(&yaml, &[("API_KEY", SECRET)]).await;
    let mut client = gateway.client().await;
    let err = invoke(&mut client, TOKEN, "t__echo", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(reason(&err), "AUDIT_UNAVAILABLE");
    use tonic_types::StatusExt;
    assert!(
        err.get_details_retry_info().is_some(),
        "nothing was sent: a retry is safe"
    );
    assert!(
        server.log.call_traceparents.lock().unwrap().is_empty(),
        "nothing reached the tool"
    );
    assert!(write_failures(port).await >= 1.0);
    gateway.shutdown().await;

    // Not required: the call is served, the failure counted.
    let yaml = format!(
        "metrics:\n  listen: \"127.0.0.1:{port}\"\n{}",
        config(&audit_at(&path, ""), "", &server.url)
    );
    let gateway = TestGateway::start(&yaml, &[("API_KEY", SECRET)]).await;
    let mut client = gateway.client().await;
    let before = write_failures(port).await;
    invoke(&mut client, TOKEN, "t__echo", "{}").await.unwrap();
    assert_eq!(write_failures(port).await, before + 1.0);
    gateway.shutdown().await;
}

/// Every line the child writes to `stdout`, sent to the returned
/// receiver as it is read (nothing is read before this is called).
fn read_lines(stdout: std::process::ChildStdout) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    use std::io::BufRead;
    let (lines, received) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    received
}

/// Under `required: true` a call is sent only once a place in the
/// writer's queue is reserved for its record: a call whose caller goes
/// away while the queue is full still gets its record (through its
/// place), and a call that finds no place is refused before the tool.
/// The writer is held up by standard output that nobody reads (a record
/// larger than the pipe), with a queue of 2.
#[tokio::test]
async fn a_required_trail_reserves_each_calls_record_before_sending() {
    let server = serve_mcp(TestServer::new(&["echo", "slow"])).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config_path,
        format!(
            "listen: \"127.0.0.1:{port}\"\n{}",
            config_text(
                "  path: \"-\"\n  arguments: full\n  required: true\n  queue: 2\n",
                &server.url
            )
        ),
    )
    .unwrap();
    let log = dir.path().join("toolgate.log");
    let mut child = std::process::Command::new(toolgate_bin())
        .args(["serve", "--config"])
        .arg(&config_path)
        .env("API_KEY", SECRET)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _child = ChildGuard(child);
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    let calls = || server.log.call_traceparents.lock().unwrap().len();

    // A slow call, sent: it holds one of the two places.
    let mut slow_client = client.clone();
    let slow = tokio::spawn(async move { invoke(&mut slow_client, TOKEN, "t__slow", "{}").await });
    tokio::time::timeout(Duration::from_secs(10), server.log.slow_started.notified())
        .await
        .unwrap();

    // A record larger than the pipe: the writer blocks writing it, and the
    // call's result is withheld once its record is not written in 5 s.
    let big = format!("{{\"text\": \"{}\"}}", "a".repeat(300_000));
    let err = invoke(&mut client, TOKEN, "t__echo", &big)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "AUDIT_UNAVAILABLE", "{err:?}");
    assert_eq!(calls(), 2);

    // Another call takes the last place; its record waits in the queue.
    let mut second = client.clone();
    let queued = tokio::spawn(async move {
        invoke(&mut second, TOKEN, "t__echo", "{\"text\": \"queued\"}").await
    });
    let started = Instant::now();
    while calls() < 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "not sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // No place left: refused before the tool.
    let err = invoke(&mut client, TOKEN, "t__echo", "{\"text\": \"no room\"}")
        .await
        .unwrap_err();
    let reached = calls();

    // The slow call's caller goes away while the queue is full.
    slow.abort();
    // Read standard output: the writer goes on.
    let mut lines = read_lines(stdout);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let cancelled = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, lines.recv()).await {
            Ok(Some(line)) => {
                let record: Value = serde_json::from_str(&line).unwrap();
                if record["tool"] == "t__slow" {
                    break Some(record);
                }
                seen.push(format!("{} {}", record["tool"], record["outcome"]));
            }
            Ok(None) | Err(_) => break None,
        }
    };
    let cancelled = cancelled.unwrap_or_else(|| {
        panic!(
            "no record of the cancelled call; records: {seen:?}; log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    assert_eq!(cancelled["outcome"], "cancelled");
    assert_eq!(cancelled["code"], "CANCELLED");
    assert_eq!(
        reached, 3,
        "the call that found no place reached the tool: {err:?}"
    );
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(reason(&err), "AUDIT_UNAVAILABLE");
    use tonic_types::StatusExt;
    assert!(
        err.get_details_retry_info().is_some(),
        "nothing was sent: a retry is safe"
    );
    let _ = queued.await;
}

#[tokio::test]
async fn a_moved_file_is_followed_by_a_new_one_at_the_path() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let gateway = TestGateway::start(
        &config(&audit_at(&path, ""), "", &server.url),
        &[("API_KEY", SECRET)],
    )
    .await;
    let mut client = gateway.client().await;
    invoke(&mut client, TOKEN, "t__echo", "{\"text\": \"one\"}")
        .await
        .unwrap();
    let rotated = dir.path().join("audit.jsonl.1");
    std::fs::rename(&path, &rotated).unwrap();
    invoke(&mut client, TOKEN, "t__echo", "{\"text\": \"two\"}")
        .await
        .unwrap();
    let old = records(&rotated);
    let new = records(&path);
    assert_eq!(old.len(), 1, "{old:#?}");
    assert_eq!(new.len(), 1, "{new:#?}");
    assert_eq!(new[0]["arguments"]["bytes"], "{\"text\": \"two\"}".len());
    gateway.shutdown().await;
}

/// A `toolgate serve` process writing its audit trail to `audit`.
fn serve_with_audit(dir: &Path, audit: &str, url: &str) -> (ChildGuard, u16, PathBuf) {
    let port = free_port();
    let config = dir.join("toolgate.yaml");
    std::fs::write(
        &config,
        format!("listen: \"127.0.0.1:{port}\"\n{}", config_text(audit, url)),
    )
    .unwrap();
    let log = dir.join("toolgate.log");
    let child = serve_binary(
        &config,
        &log,
        &[("API_KEY", SECRET), ("POD_NAME", "gw-bin")],
    );
    (child, port, log)
}

fn config_text(audit: &str, url: &str) -> String {
    config(audit, "", url)
}

#[tokio::test]
async fn sighup_reopens_the_file_at_once() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (child, port, log) = serve_with_audit(dir.path(), &audit_at(&path, ""), &server.url);
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    invoke(&mut client, TOKEN, "t__echo", "{}").await.unwrap();
    assert_eq!(records(&path)[0]["replica"], "gw-bin");
    let rotated = dir.path().join("audit.jsonl.1");
    std::fs::rename(&path, &rotated).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    // The new file appears without waiting for a record.
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not reopened: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    invoke(&mut client, TOKEN, "t__echo", "{}").await.unwrap();
    assert_eq!(records(&rotated).len(), 1);
    assert_eq!(records(&path).len(), 1);
}

#[tokio::test]
async fn a_dash_writes_records_to_standard_output() {
    use std::io::BufRead;
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config_path,
        format!(
            "listen: \"127.0.0.1:{port}\"\n{}",
            config_text("  path: \"-\"\n", &server.url)
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(toolgate_bin())
        .args(["serve", "--config"])
        .arg(&config_path)
        .env("API_KEY", SECRET)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _child = ChildGuard(child);
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    invoke(&mut client, TOKEN, "t__echo", "{}").await.unwrap();
    let line = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .unwrap();
            line
        }),
    )
    .await
    .unwrap()
    .unwrap();
    let record: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(record["tool"], "t__echo");
    assert_eq!(record["outcome"], "ok");
}

/// Starts a Python fixture and reads the `LISTENING <port>` line it prints.
fn start_fixture(script: &str, args: &[&str]) -> (ChildGuard, u16) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(python())
        .arg(fixture(&format!("python/{script}")))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {script}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .strip_prefix("LISTENING ")
        .unwrap_or_else(|| panic!("{script} printed {line:?}"))
        .parse()
        .unwrap();
    (guard, port)
}

/// Calls `docs__whoami` as `subject` until the answer is not UNAVAILABLE
/// (the server still connecting, or listing after a first consent).
async fn whoami(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    subject: &str,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut request = authed(
            TOKEN,
            pb::InvokeToolRequest {
                name: "docs__whoami".into(),
                ..Default::default()
            },
        );
        request
            .metadata_mut()
            .insert("x-toolgate-subject", subject.parse().unwrap());
        match client.invoke_tool(request).await {
            Err(status) if status.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other.map(tonic::Response::into_inner),
        }
    }
}

#[tokio::test]
async fn upstream_authorization_events_are_recorded() {
    use tonic_types::StatusExt;
    let (_as, as_port) = start_fixture("oauth_as.py", &["--port", "0"]);
    let as_url = format!("http://127.0.0.1:{as_port}");
    let (_rs, rs_port) =
        start_fixture("oauth_mcp_server.py", &["--port", "0", "--as-url", &as_url]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let consent_port = free_port();
    let yaml = format!(
        r#"audit:
  path: "{path}"
state:
  url: "sqlite://{dir}/state.db"
  keys: ["MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="]
oauth:
  listen: 127.0.0.1:{consent_port}
  public_url: http://127.0.0.1:{consent_port}
  allow_private_addresses: true
tenants:
  - name: acme
    tokens: [{TOKEN}]
    confirm_consent: false
    servers:
      - name: docs
        url: "http://127.0.0.1:{rs_port}/mcp"
        oauth: {{ grant: authorization_code }}
"#,
        path = path.display(),
        dir = dir.path().display(),
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;

    // Alice has not consented: her call is refused with a link.
    let status = whoami(&mut client, "alice").await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let url = status.get_details_error_info().unwrap().metadata["authorization_url"].clone();
    let refused = record_where(&path, |r| {
        r["kind"] == "call" && r["reason"] == "UPSTREAM_AUTHORIZATION_REQUIRED"
    })
    .await;
    assert_eq!(refused["outcome"], "refused");
    assert_eq!(refused["subject"], "token:alice");
    assert_eq!(refused["server"], "docs");
    assert_eq!(refused["sent"], false);
    let started = record_where(&path, |r| r["event"] == "consent_started").await;
    assert_eq!(started["kind"], "authorization");
    assert_eq!(started["tenant"], "acme");
    assert_eq!(started["subject"], "token:alice");
    assert_eq!(started["server"], "docs");
    assert_eq!(started["outcome"], "refused");

    // She consents: recorded before the page is answered.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let authorize = http.get(format!("{url}&user=alice")).send().await.unwrap();
    assert_eq!(authorize.status().as_u16(), 302);
    let mut callback = url::Url::parse(authorize.headers()["location"].to_str().unwrap()).unwrap();
    callback.set_port(Some(consent_port)).unwrap();
    let page = http.get(callback.as_str()).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let completed: Vec<Value> = records(&path)
        .into_iter()
        .filter(|r| r["event"] == "consent_completed")
        .collect();
    assert_eq!(completed.len(), 1, "{completed:#?}");
    assert_eq!(completed[0]["tenant"], "acme");
    assert_eq!(completed[0]["subject"], "token:alice");
    assert_eq!(completed[0]["server"], "docs");
    assert_eq!(completed[0]["outcome"], "ok");
    let response = whoami(&mut client, "alice").await.unwrap();
    assert_eq!(response.text, "alice");

    // A forged callback completes nothing, and says so.
    let forged = http
        .get(format!(
            "http://127.0.0.1:{consent_port}/oauth/acme/docs/callback?code=x&state=forged"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 400);
    let failed: Vec<Value> = records(&path)
        .into_iter()
        .filter(|r| r["event"] == "consent_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["outcome"], "failed");
    assert_eq!(failed[0]["reason"], "unknown_state");
    assert!(failed[0].get("tenant").is_none());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("code=") && !text.contains("access_token"),
        "{text}"
    );
    gateway.shutdown().await;
}

/// `toolgate check` says whether the arguments' digest has a configured
/// key (naming it by its id, never showing it), and warns when not.
#[test]
fn check_shows_whether_a_digest_key_is_configured() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgate.yaml");
    let check = |audit: &str| {
        std::fs::write(&config, config_text(audit, "http://127.0.0.1:9/mcp")).unwrap();
        let output = std::process::Command::new(toolgate_bin())
            .args(["check", "--offline", "--config"])
            .arg(&config)
            .env("API_KEY", SECRET)
            .env("DIGEST_KEY", DIGEST_KEY)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let path = dir.path().join("audit.jsonl");
    let keyed = check(&audit_at(&path, KEYED));
    assert!(
        keyed.contains(&format!(
            "arguments digest, digest key configured (key_id {})",
            key_id(DIGEST_KEY)
        )),
        "{keyed}"
    );
    assert!(!keyed.contains(DIGEST_KEY), "{keyed}");
    assert!(!keyed.contains("audit.digest_key is not set"), "{keyed}");
    let unkeyed = check(&audit_at(&path, ""));
    assert!(
        unkeyed.contains("arguments digest, no digest key: a random key per process"),
        "{unkeyed}"
    );
    assert!(
        unkeyed.contains("warning: audit.digest_key is not set"),
        "{unkeyed}"
    );
}
