//! Idempotency keys (docs/api.md, "Retrying safely"), with real
//! processes: `toolgate` in front of the Python `mcp` SDK's
//! `ledger_server.py`, whose log proves how often `transfer` ran. A retry
//! with the call's key never runs the tool again: it gets the recorded
//! response, waits for the first call's outcome, or is told why not; on
//! SQLite in one process and across replicas on PostgreSQL.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "acme-worker-token";
/// A 32-byte key in base64, shared by the replicas of one test.
const STATE_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// The ledger server's log: one line per run of `transfer`.
struct Ledger {
    log: PathBuf,
}

impl Ledger {
    fn new(dir: &Path) -> Self {
        Self {
            log: dir.join("ledger.jsonl"),
        }
    }

    /// The `servers[]` entry.
    fn server(&self) -> String {
        format!(
            "      - name: bank\n        command: [\"{}\", \"{}\", \"{}\"]\n",
            python().display(),
            fixture("python/ledger_server.py").display(),
            self.log.display(),
        )
    }

    /// The transfers made, as logged.
    fn made(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// Waits until `count` transfers are logged.
    async fn wait_made(&self, count: usize) -> Vec<serde_json::Value> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let made = self.made();
            if made.len() >= count || Instant::now() > until {
                return made;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A gateway's configuration: tenant `acme` in front of the ledger, with
/// `tenant_extra` in the tenant.
fn config(port: u16, state: &str, audit: &Path, ledger: &Ledger, tenant_extra: &str) -> String {
    format!(
        "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n{state}audit:\n  path: \"{}\"\n\
         tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n{tenant_extra}    servers:\n{}",
        audit.display(),
        ledger.server(),
    )
}

fn transfer(arguments: &str, key: &str) -> pb::InvokeToolRequest {
    pb::InvokeToolRequest {
        name: "bank__transfer".to_owned(),
        arguments_json: arguments.to_owned(),
        idempotency_key: key.to_owned(),
        ..Default::default()
    }
}

async fn call(
    client: &mut ToolGatewayClient<Channel>,
    subject: &str,
    request: pb::InvokeToolRequest,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    invoke_as(client, TOKEN, subject, request).await
}

/// The audit trail's call records, once `count` are written.
async fn calls_recorded(path: &Path, count: usize) -> Vec<serde_json::Value> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let records: Vec<serde_json::Value> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .filter(|r: &serde_json::Value| r["kind"] == "call")
            .collect();
        if records.len() >= count || Instant::now() > until {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One gateway on SQLite in front of the ledger.
struct Local {
    _dir: tempfile::TempDir,
    ledger: Ledger,
    audit: PathBuf,
    gateway: TestGateway,
    client: ToolGatewayClient<Channel>,
}

impl Local {
    async fn start(tenant_extra: &str) -> Local {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path());
        let audit = dir.path().join("audit.jsonl");
        let state = format!(
            "state:\n  url: \"sqlite://{}\"\n",
            dir.path().join("state.db").display()
        );
        let yaml = config(0, &state, &audit, &ledger, tenant_extra);
        let gateway = TestGateway::start(&yaml, &[]).await;
        let mut client = gateway.client().await;
        wait_listed(&mut client, TOKEN, "bank__transfer").await;
        Local {
            _dir: dir,
            ledger,
            audit,
            gateway,
            client,
        }
    }
}

/// The worker loses its connection mid-call; the call runs on at the
/// gateway, and the worker's retry with the same key (on a new
/// connection) waits for it and gets its response, marked as a replay.
/// The tool ran once; the audit trail has the call and the replay, under
/// one call id.
#[tokio::test]
async fn a_retry_after_the_worker_lost_its_connection_gets_the_first_response() {
    let mut local = Local::start("").await;
    let request = transfer(
        r#"{"amount": 30, "to": "carol", "delay_ms": 1500}"#,
        "order-1",
    );
    {
        // Its own connection, dropped while the tool runs.
        let mut doomed = ToolGatewayClient::connect(format!("http://{}", local.gateway.addr))
            .await
            .unwrap();
        let first = call(&mut doomed, "bob", request.clone());
        let dropped = tokio::time::timeout(Duration::from_millis(700), first).await;
        assert!(
            dropped.is_err(),
            "the call ended before the connection was dropped"
        );
    }
    assert_eq!(local.ledger.wait_made(1).await.len(), 1);
    let retried = call(&mut local.client, "bob", request.clone())
        .await
        .unwrap();
    assert_eq!(retried.text, "transfer 1: 30 to carol");
    assert!(retried.replayed);
    // Again, once it is done: the same response at once.
    let started = Instant::now();
    let again = call(&mut local.client, "bob", request).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(1000));
    assert_eq!(
        (again.text.as_str(), again.replayed),
        (retried.text.as_str(), true)
    );
    assert_eq!(local.ledger.made().len(), 1, "the tool ran more than once");

    let records = calls_recorded(&local.audit, 3).await;
    let keyed: Vec<_> = records
        .iter()
        .filter(|r| r.get("idempotency").is_some())
        .collect();
    assert_eq!(keyed.len(), 3, "{records:#?}");
    let claimed: Vec<_> = keyed
        .iter()
        .filter(|r| r["idempotency"] == "claimed")
        .collect();
    assert_eq!(claimed.len(), 1, "{keyed:#?}");
    assert_eq!(claimed[0]["outcome"], "ok", "{claimed:#?}");
    assert_eq!(claimed[0]["sent"], true);
    let call_id = claimed[0]["call_id"].as_str().unwrap();
    for replay in keyed.iter().filter(|r| r["idempotency"] == "replayed") {
        assert_eq!(replay["call_id"], call_id, "{replay:#?}");
        assert_ne!(replay["sent"], true, "{keyed:#?}");
    }
}

/// The key's scope and its refusals: other arguments are
/// `IDEMPOTENCY_KEY_REUSED`; another subject's key of the same text is
/// its own; the metadata entry works as the field, and the two must
/// agree; a malformed key is refused before anything else.
#[tokio::test]
async fn a_key_names_one_call_of_one_subject() {
    let mut local = Local::start("").await;
    let first = call(
        &mut local.client,
        "bob",
        transfer(r#"{"amount": 5, "to": "dave"}"#, "k-1"),
    )
    .await
    .unwrap();
    assert!(!first.replayed);
    // The same key with other arguments: refused, naming the first call.
    let status = call(
        &mut local.client,
        "bob",
        transfer(r#"{"amount": 6, "to": "dave"}"#, "k-1"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(&status), "IDEMPOTENCY_KEY_REUSED", "{status:?}");
    assert_eq!(info(&status, "call_id").len(), 32, "{status:?}");
    // The same arguments in another key order are the same call.
    let same = call(
        &mut local.client,
        "bob",
        transfer(r#"{"to": "dave", "amount": 5}"#, "k-1"),
    )
    .await
    .unwrap();
    assert!(same.replayed);
    // Another subject's "k-1" is its own.
    let alice = call(
        &mut local.client,
        "alice",
        transfer(r#"{"amount": 6, "to": "dave"}"#, "k-1"),
    )
    .await
    .unwrap();
    assert!(!alice.replayed);
    assert_eq!(local.ledger.made().len(), 2);

    // The key as metadata.
    let mut request = authed_as(TOKEN, "bob", transfer(r#"{"amount": 7, "to": "erin"}"#, ""));
    request
        .metadata_mut()
        .insert("idempotency-key", "meta-1".parse().unwrap());
    let by_metadata = local
        .client
        .invoke_tool(request)
        .await
        .unwrap()
        .into_inner();
    assert!(!by_metadata.replayed);
    let by_field = call(
        &mut local.client,
        "bob",
        transfer(r#"{"amount": 7, "to": "erin"}"#, "meta-1"),
    )
    .await
    .unwrap();
    assert!(by_field.replayed, "the field and the metadata name one key");
    // Both, differing.
    let mut request = authed_as(
        TOKEN,
        "bob",
        transfer(r#"{"amount": 7, "to": "erin"}"#, "a"),
    );
    request
        .metadata_mut()
        .insert("idempotency-key", "b".parse().unwrap());
    let status = local.client.invoke_tool(request).await.unwrap_err();
    assert_eq!(reason(&status), "IDEMPOTENCY_KEY_INVALID", "{status:?}");
    assert!(status.message().contains("differ"), "{status:?}");
    // Malformed.
    for bad in ["has space", &"k".repeat(256)] {
        let status = call(
            &mut local.client,
            "bob",
            transfer(r#"{"amount": 1, "to": "x"}"#, bad),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(reason(&status), "IDEMPOTENCY_KEY_INVALID", "{status:?}");
    }
    assert_eq!(local.ledger.made().len(), 3);
}

/// Keys live `idempotency.ttl` and a tenant has at most
/// `idempotency.max_keys` live ones; a response over
/// `max_response_bytes` keeps its status only.
#[tokio::test]
async fn keys_expire_are_bounded_and_large_responses_keep_their_status() {
    let mut local =
        Local::start("    idempotency: { ttl: 2s, max_keys: 2, max_response_bytes: 1024 }\n").await;
    let one = transfer(r#"{"amount": 1, "to": "a"}"#, "one");
    call(&mut local.client, "bob", one.clone()).await.unwrap();
    call(
        &mut local.client,
        "bob",
        transfer(r#"{"amount": 2, "to": "b"}"#, "two"),
    )
    .await
    .unwrap();
    let status = call(
        &mut local.client,
        "bob",
        transfer(r#"{"amount": 3, "to": "c"}"#, "three"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "IDEMPOTENCY_KEY_LIMIT", "{status:?}");
    assert_eq!(info(&status, "limit"), "idempotency.max_keys");
    // Without a key the call runs.
    call(
        &mut local.client,
        "bob",
        transfer(r#"{"amount": 3, "to": "c"}"#, ""),
    )
    .await
    .unwrap();
    assert_eq!(local.ledger.made().len(), 3);
    // After the ttl the keys are forgotten: "one" names a new call.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let again = call(
        &mut local.client,
        "bob",
        transfer(r#"{"amount": 9, "to": "z"}"#, "one"),
    )
    .await
    .unwrap();
    assert!(!again.replayed);
    assert_eq!(local.ledger.made().len(), 4);
    // A response over the bound: the retry is told the call is done.
    let long = "x".repeat(1500);
    let large = transfer(&format!(r#"{{"amount": 1, "to": "{long}"}}"#), "large");
    call(&mut local.client, "bob", large.clone()).await.unwrap();
    let status = call(&mut local.client, "bob", large).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "CALL_ALREADY_DONE", "{status:?}");
    assert!(
        status.message().contains("max_response_bytes"),
        "{status:?}"
    );
    assert_eq!(local.ledger.made().len(), 5);
}

/// The server dies while the tool runs: the call ends `UNKNOWN` (it may
/// have acted), and a retry with its key is `CALL_IN_DOUBT` with the
/// call's id, never sent again, even after the server is back.
#[tokio::test]
async fn a_call_whose_server_died_is_in_doubt_and_never_sent_again() {
    let mut local = Local::start("").await;
    let request = transfer(
        r#"{"amount": 70, "to": "frank", "delay_ms": 3000}"#,
        "doubt-1",
    );
    let mut other = local.client.clone();
    let first = tokio::spawn({
        let request = request.clone();
        async move { call(&mut other, "bob", request).await }
    });
    let made = local.ledger.wait_made(1).await;
    let pid = made[0]["pid"].as_u64().unwrap() as u32;
    signal(pid, "KILL");
    let status = first.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Unknown, "{status:?}");
    // At once, and after the server is back.
    for _ in 0..2 {
        let status = call(&mut local.client, "bob", request.clone())
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert_eq!(reason(&status), "CALL_IN_DOUBT", "{status:?}");
        assert_eq!(info(&status, "call_id").len(), 32, "{status:?}");
        wait_listed(&mut local.client, TOKEN, "bank__transfer").await;
    }
    // A new key is a new call.
    let fresh = call(
        &mut local.client,
        "bob",
        transfer(r#"{"amount": 70, "to": "frank"}"#, "doubt-2"),
    )
    .await
    .unwrap();
    assert!(fresh.text.starts_with("transfer 2:"), "{fresh:?}");
    assert_eq!(local.ledger.made().len(), 2);
}

/// Two replicas on one PostgreSQL: the same call with the same key at
/// both at once runs once; the other waits and gets the recorded
/// response, or, when its deadline ends first, `CALL_IN_PROGRESS`.
#[tokio::test]
async fn replicas_racing_one_key_run_the_call_once() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::new(dir.path());
    let state = format!(
        "state:\n  url: \"{}\"\n  keys: [{{ env: STATE_KEY }}]\n",
        pg.url()
    );
    let (one_port, two_port, metrics_port) = (free_port(), free_port(), free_port());
    let mut gateways = Vec::new();
    for port in [one_port, two_port] {
        let path = dir.path().join(format!("gateway-{port}.yaml"));
        let audit = dir.path().join(format!("audit-{port}.jsonl"));
        let top = if port == two_port {
            format!("metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\n{state}")
        } else {
            state.clone()
        };
        std::fs::write(&path, config(port, &top, &audit, &ledger, "")).unwrap();
        gateways.push(serve_binary(
            &path,
            &dir.path().join(format!("{port}.log")),
            &[("STATE_KEY", STATE_KEY)],
        ));
    }
    wait_for_port(one_port).await;
    wait_for_port(two_port).await;
    let mut one = client_at(one_port).await;
    let mut two = client_at(two_port).await;
    wait_listed(&mut one, TOKEN, "bank__transfer").await;
    wait_listed(&mut two, TOKEN, "bank__transfer").await;

    for round in 0..3 {
        let key = format!("race-{round}");
        let request = transfer(r#"{"amount": 10, "to": "gina", "delay_ms": 800}"#, &key);
        let (a, b) = tokio::join!(
            call(&mut one, "bob", request.clone()),
            call(&mut two, "bob", request.clone())
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.text, b.text, "round {round}");
        assert!(a.replayed != b.replayed, "round {round}: {a:?} {b:?}");
        assert_eq!(ledger.made().len(), round + 1, "round {round}");
    }
    // A waiting call whose deadline ends first is told the call is in
    // progress; nothing is sent for it.
    let request = transfer(r#"{"amount": 11, "to": "hal", "delay_ms": 2000}"#, "slow");
    let mut slow_one = one.clone();
    let running = tokio::spawn({
        let request = request.clone();
        async move { call(&mut slow_one, "bob", request).await }
    });
    ledger.wait_made(4).await;
    let mut hurried = authed_as(TOKEN, "bob", request.clone());
    hurried.set_timeout(Duration::from_millis(400));
    let status = two.invoke_tool(hurried).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(reason(&status), "CALL_IN_PROGRESS", "{status:?}");
    let first = running.await.unwrap().unwrap();
    assert!(!first.replayed);
    let after = call(&mut two, "bob", request).await.unwrap();
    assert_eq!(
        (after.text.as_str(), after.replayed),
        (first.text.as_str(), true)
    );
    assert_eq!(ledger.made().len(), 4);
    // The second replica counted what its keyed calls did.
    let page = scrape(metrics_port).await;
    let count = |outcome: &str| {
        sample(
            &page,
            &format!("toolgate_idempotency_keys_total{{tenant=\"acme\",outcome=\"{outcome}\"}}"),
        )
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
    };
    assert_eq!(count("in_progress"), 1, "{page}");
    assert!(count("replayed") >= 1, "{page}");
    assert_eq!(count("replayed") + count("claimed"), 4, "{page}");
    drop(gateways);
}

/// A call a `require_approval` rule holds: asking lets go of the key (no
/// one ran it), the approved call runs under it, and a retry of the
/// approved call replays without a new approval.
#[tokio::test]
async fn an_approved_call_replays_without_asking_again() {
    let approver = "acme-approver-token";
    let mut local = Local::start(&format!(
        "    call_approvals:\n      approver_tokens:\n        - {{ name: alice, token: {approver} }}\n    \
         policy:\n      - require_approval: \"bank__transfer\"\n        when: \"args.amount > 500\"\n      \
         - allow: \"*\"\n"
    ))
    .await;
    let request = transfer(r#"{"amount": 900, "to": "ivan"}"#, "big-1");
    let status = call(&mut local.client, "bob", request.clone())
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "APPROVAL_PENDING", "{status:?}");
    let id = info(&status, "approval_id");
    let mut approvals =
        toolgate::pb::call_approvals_service_client::CallApprovalsServiceClient::connect(format!(
            "http://{}",
            local.gateway.addr
        ))
        .await
        .unwrap();
    approvals
        .approve_call(authed(
            approver,
            pb::ApproveCallRequest {
                approval_id: id.clone(),
                ..Default::default()
            },
        ))
        .await
        .unwrap();
    let mut approved = request.clone();
    approved.approval_id = id.clone();
    let ran = call(&mut local.client, "bob", approved.clone())
        .await
        .unwrap();
    assert!(!ran.replayed);
    // Retried with the approval's id (spent) or without: replayed.
    for retry in [approved, request] {
        let again = call(&mut local.client, "bob", retry).await.unwrap();
        assert_eq!(
            (again.text.as_str(), again.replayed),
            (ran.text.as_str(), true)
        );
    }
    assert_eq!(local.ledger.made().len(), 1);
}

/// The example Python worker (grpcio, stubs generated from `proto/`)
/// with `--idempotency-key` and a deadline shorter than the tool: its
/// first attempt is told `CALL_IN_PROGRESS` at its deadline while the call
/// goes on at the gateway, its retries wait or are told the same, and one
/// gets the call's response, replayed.
/// The tool ran once.
#[tokio::test]
async fn the_example_worker_retries_a_keyed_call_until_it_has_the_outcome() {
    let local = Local::start("").await;
    let examples = repo_root().join("examples/clients/python");
    let python = python();
    let generated = tokio::process::Command::new(examples.join("generate.sh"))
        .env("PYTHON", &python)
        .output()
        .await
        .unwrap();
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let run = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&python)
            .arg(examples.join("worker.py"))
            .args([
                "--addr",
                &local.gateway.addr.to_string(),
                "--timeout",
                "0.6",
                "--retries",
                "20",
                "--idempotency-key",
                "worker-order-1",
                "bank__transfer",
                r#"{"amount": 12, "to": "jo", "delay_ms": 2000}"#,
            ])
            .env("TOOLGATE_TOKEN", TOKEN)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("replayed: true"), "{stdout}\n{stderr}");
    assert!(stdout.contains("text: transfer 1: 12 to jo"), "{stdout}");
    // The first attempt's deadline came first: the call went on.
    assert!(stderr.contains("ABORTED (CALL_IN_PROGRESS)"), "{stderr}");
    assert_eq!(local.ledger.made().len(), 1, "{stderr}");
}

/// `toolgate call --idempotency-key`: the same command run twice calls
/// the tool once; the second run prints the recorded response and says
/// on stderr that it is one (`"replayed": true` with `--json`).
#[tokio::test]
async fn the_cli_call_with_a_key_runs_once() {
    let local = Local::start("").await;
    let addr = local.gateway.addr.to_string();
    let run = |json: bool| {
        let mut command = tokio::process::Command::new(toolgate_bin());
        command
            .args(["call", "--addr", &addr])
            .args(json.then_some("--json"))
            .args([
                "bank__transfer",
                r#"{"amount": 3, "to": "kim"}"#,
                "--idempotency-key",
                "cli-1",
            ])
            .env("TOOLGATE_TOKEN", TOKEN)
            .env_remove("TOOLGATE_ADDR")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        async move {
            let output = tokio::time::timeout(Duration::from_secs(60), command.output())
                .await
                .unwrap()
                .unwrap();
            assert!(output.status.success(), "{output:?}");
            (
                String::from_utf8_lossy(&output.stdout).into_owned(),
                String::from_utf8_lossy(&output.stderr).into_owned(),
            )
        }
    };
    let (first, stderr) = run(false).await;
    assert_eq!(first.trim(), "transfer 1: 3 to kim");
    assert!(!stderr.contains("recorded response"), "{stderr}");
    let (second, stderr) = run(false).await;
    assert_eq!(second, first);
    assert!(stderr.contains("recorded response"), "{stderr}");
    let (json, _) = run(true).await;
    let json: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["replayed"], true, "{json}");
    assert_eq!(local.ledger.made().len(), 1);
}
