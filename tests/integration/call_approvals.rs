//! Call approvals (docs/call-approvals.md) and policy on a call's
//! arguments, with real processes: `toolgate serve` replicas on one
//! PostgreSQL in front of the Python `mcp` SDK's `payments_server.py`,
//! whose log proves how often, and with what, `send_payment` ran. A call a
//! `require_approval` rule holds is asked for on one replica, approved
//! through the other, and spent on either, once; every other use of the
//! approval is refused with its reason, and all of it is on the audit
//! trail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::Code;
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::call_approvals_service_client::CallApprovalsServiceClient;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "acme-worker-token";
const APPROVER: &str = "acme-approver-token-alice";
const OTHER_TOKEN: &str = "globex-worker-token";
const OTHER_APPROVER: &str = "globex-approver-token-eve";
/// A 32-byte key in base64, shared by the replicas of one test.
const STATE_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// One payments server's files: its log of payments and its description.
struct Payments {
    log: PathBuf,
    description: PathBuf,
}

impl Payments {
    fn new(dir: &Path, name: &str) -> Self {
        let description = dir.join(format!("{name}-description.txt"));
        std::fs::write(&description, "Send a payment.").unwrap();
        Self {
            log: dir.join(format!("{name}-payments.jsonl")),
            description,
        }
    }

    /// The `servers[]` entry.
    fn server(&self) -> String {
        format!(
            "      - name: pay\n        command: [\"{}\", \"{}\", \"{}\", \"{}\"]\n",
            python().display(),
            fixture("python/payments_server.py").display(),
            self.log.display(),
            self.description.display()
        )
    }

    /// The payments made, as logged.
    fn made(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

/// The policy of the tests: payments over 500 need a person (approver
/// tokens by default); `db`-style denial on arguments; `extra` rules
/// first.
fn policy(rule_options: &str, extra: &str) -> String {
    format!(
        "    policy:\n{extra}      - deny: \"pay__send_payment\"\n        when: \"args.to == 'mallory'\"\n      \
         - require_approval: \"pay__send_payment\"\n        when: \"args.amount > 500\"\n{rule_options}"
    )
}

/// A gateway's configuration: tenant `acme` (worker token, approver token
/// `alice`) and `globex` (its own), both in front of `payments`.
fn config(
    port: u16,
    state: &str,
    audit: &Path,
    payments: &Payments,
    policy: &str,
    tenant_extra: &str,
) -> String {
    format!(
        "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n{state}audit:\n  path: \"{}\"\n\
         tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    call_approvals:\n      approver_tokens:\n        \
         - name: alice\n          token: {APPROVER}\n{tenant_extra}    servers:\n{}{policy}\
         \n  - name: globex\n    tokens: [{OTHER_TOKEN}]\n    call_approvals:\n      approver_tokens:\n        \
         - name: eve\n          token: {OTHER_APPROVER}\n    servers:\n{}{}",
        audit.display(),
        payments.server(),
        payments.server(),
        self::policy("", ""),
    )
}

/// The state store section on PostgreSQL.
fn postgres(pg: &PgCluster) -> String {
    format!(
        "state:\n  url: \"{}\"\n  keys: [{{ env: STATE_KEY }}]\n",
        pg.url()
    )
}

fn send(arguments: &str) -> pb::InvokeToolRequest {
    pb::InvokeToolRequest {
        name: "pay__send_payment".to_owned(),
        arguments_json: arguments.to_owned(),
        ..Default::default()
    }
}

fn with_id(mut request: pb::InvokeToolRequest, id: &str) -> pb::InvokeToolRequest {
    request.approval_id = id.to_owned();
    request
}

async fn call(
    client: &mut ToolGatewayClient<Channel>,
    subject: &str,
    request: pb::InvokeToolRequest,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    invoke_as(client, TOKEN, subject, request).await
}

/// The approval id of an `APPROVAL_PENDING` refusal.
fn pending_id(result: Result<pb::InvokeToolResponse, tonic::Status>) -> String {
    let status = result.expect_err("held for approval");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "APPROVAL_PENDING", "{status:?}");
    let id = info(&status, "approval_id");
    assert!(id.starts_with("apv_"), "{status:?}");
    assert_eq!(info(&status, "rule"), "tenants[0].policy[1]", "{status:?}");
    id
}

fn refused(result: Result<pb::InvokeToolResponse, tonic::Status>, code: Code, expected: &str) {
    let status = result.expect_err(expected);
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (code, expected),
        "{status:?}"
    );
}

async fn approvals_at(port: u16) -> CallApprovalsServiceClient<Channel> {
    CallApprovalsServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap()
}

async fn approve(
    approvals: &mut CallApprovalsServiceClient<Channel>,
    token: &str,
    id: &str,
) -> Result<pb::CallApproval, tonic::Status> {
    approvals
        .approve_call(authed(
            token,
            pb::ApproveCallRequest {
                approval_id: id.to_owned(),
                reason: "ok for the quarterly invoice".to_owned(),
            },
        ))
        .await
        .map(|r| r.into_inner().approval.unwrap())
}

async fn pending(
    approvals: &mut CallApprovalsServiceClient<Channel>,
    token: &str,
) -> Vec<pb::CallApproval> {
    approvals
        .list_call_approvals(authed(token, pb::ListCallApprovalsRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .approvals
}

/// The audit records of `path` with `kind`.
fn records(path: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|r| r["kind"] == kind)
        .collect()
}

/// Waits (at most 10 s) until `path` holds a `call_approval` record of
/// `event`.
async fn audited(paths: &[&Path], event: &str) -> serde_json::Value {
    for _ in 0..100 {
        for path in paths {
            if let Some(found) = records(path, "call_approval")
                .into_iter()
                .find(|r| r["event"] == event)
            {
                return found;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no {event} record in {paths:?}");
}

/// One in-process gateway on SQLite in front of its own payments server,
/// with a worker's and an approver's client.
struct Local {
    /// Kept until the test ends (the state, the log, the fixtures).
    dir: tempfile::TempDir,
    payments: Payments,
    audit: PathBuf,
    gateway: TestGateway,
    client: ToolGatewayClient<Channel>,
    approvals: CallApprovalsServiceClient<Channel>,
}

impl Local {
    /// Starts it in `dir`: `top` before the state section, `options` in the
    /// `require_approval` rule, `tenant_extra` in `acme`, and `edit` over
    /// the whole file; waits until the payments tool is listed.
    async fn start(
        dir: tempfile::TempDir,
        top: &str,
        options: &str,
        tenant_extra: &str,
        edit: impl FnOnce(String) -> String,
    ) -> Local {
        let payments = Payments::new(dir.path(), "local");
        let audit = dir.path().join("audit.jsonl");
        let top = format!(
            "{top}state:\n  url: \"sqlite://{}\"\n",
            dir.path().join("state.db").display()
        );
        let yaml = edit(config(
            0,
            &top,
            &audit,
            &payments,
            &policy(options, ""),
            tenant_extra,
        ));
        let gateway = TestGateway::start(&yaml, &[]).await;
        let mut client = gateway.client().await;
        wait_listed(&mut client, TOKEN, "pay__send_payment").await;
        let approvals = CallApprovalsServiceClient::connect(format!("http://{}", gateway.addr))
            .await
            .unwrap();
        Local {
            dir,
            payments,
            audit,
            gateway,
            client,
            approvals,
        }
    }
}

/// The webhook's HMAC key.
const WEBHOOK_SECRET: &str = "webhook-secret-0123456789";

/// What a webhook received: each delivery's body, its signature checked.
type Deliveries = std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>;

/// A webhook receiver on 127.0.0.1 that checks each delivery's
/// `toolgate-signature` (HMAC-SHA256 over `<t>.<body>`) and keeps the
/// bodies whose signature holds.
async fn webhook_receiver() -> (u16, Deliveries) {
    use hmac::Mac as _;
    let deliveries: Deliveries = Deliveries::default();
    let kept = deliveries.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let signature = headers
                        .get("toolgate-signature")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let (t, v1) = signature
                        .split_once(',')
                        .map(|(t, v)| (t.trim_start_matches("t="), v.trim_start_matches("v1=")))
                        .unwrap_or_default();
                    let mut mac =
                        hmac::Hmac::<sha2::Sha256>::new_from_slice(WEBHOOK_SECRET.as_bytes())
                            .unwrap();
                    mac.update(format!("{t}.").as_bytes());
                    mac.update(&body);
                    if hex::encode(mac.finalize().into_bytes()) != v1 {
                        return axum::http::StatusCode::UNAUTHORIZED;
                    }
                    kept.lock()
                        .unwrap()
                        .push(serde_json::from_slice(&body).unwrap());
                    axum::http::StatusCode::NO_CONTENT
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, deliveries)
}

/// The delivery about approval `id` (waiting at most 10 s).
async fn delivered(deliveries: &Deliveries, id: &str) -> serde_json::Value {
    for _ in 0..100 {
        if let Some(found) = deliveries
            .lock()
            .unwrap()
            .iter()
            .find(|d| d["approval_id"] == id)
        {
            return found.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no signed delivery about {id}: {:?}",
        deliveries.lock().unwrap()
    );
}

/// Requested on one replica, approved through the other, spent on either,
/// once. Every other use of the approval is refused with its reason; the
/// tool ran exactly once, with exactly the approved arguments.
#[tokio::test]
async fn held_at_one_replica_approved_at_the_other_spent_once() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let payments = Payments::new(dir.path(), "shared");
    let (one_port, two_port) = (free_port(), free_port());
    let (one_audit, two_audit) = (dir.path().join("one.jsonl"), dir.path().join("two.jsonl"));
    let env = [("STATE_KEY", STATE_KEY)];
    let mut gateways = Vec::new();
    for (port, audit) in [(one_port, &one_audit), (two_port, &two_audit)] {
        let path = dir.path().join(format!("gateway-{port}.yaml"));
        std::fs::write(
            &path,
            config(port, &postgres(&pg), audit, &payments, &policy("", ""), ""),
        )
        .unwrap();
        gateways.push(serve_binary(
            &path,
            &dir.path().join(format!("{port}.log")),
            &env,
        ));
    }
    wait_for_port(one_port).await;
    wait_for_port(two_port).await;
    let mut one = client_at(one_port).await;
    let mut two = client_at(two_port).await;
    wait_listed(&mut one, TOKEN, "pay__send_payment").await;
    wait_listed(&mut two, TOKEN, "pay__send_payment").await;

    // Under the limit: no approval.
    let small = call(&mut one, "bob", send(r#"{"amount": 20, "to": "carol"}"#))
        .await
        .unwrap();
    assert_eq!(small.text, "sent 20 to carol");
    // Over it: held, nothing sent.
    let payment = send(r#"{"amount": 900, "to": "dave", "memo": "invoice 7"}"#);
    let id = pending_id(call(&mut one, "bob", payment.clone()).await);
    assert_eq!(payments.made().len(), 1);
    // The same call again, at either replica: the same pending approval.
    assert_eq!(pending_id(call(&mut two, "bob", payment.clone()).await), id);
    assert_eq!(
        pending_id(call(&mut two, "bob", with_id(payment.clone(), &id)).await),
        id
    );

    // The approver (an approver token) sees it at the other replica, with
    // the arguments, and approves it there.
    let mut approvals = approvals_at(two_port).await;
    let listed = pending(&mut approvals, APPROVER).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let shown = &listed[0];
    assert_eq!(shown.approval_id, id);
    assert_eq!(shown.tool, "pay__send_payment");
    assert_eq!(shown.subject, "token:bob");
    assert!(shown.may_decide);
    let arguments: serde_json::Value = serde_json::from_str(&shown.arguments_json).unwrap();
    assert_eq!(arguments["amount"], 900);
    // Another tenant's approver sees nothing of it, and cannot decide it.
    let mut other = approvals_at(one_port).await;
    assert!(pending(&mut other, OTHER_APPROVER).await.is_empty());
    let status = approve(&mut other, OTHER_APPROVER, &id).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_NOT_FOUND", "{status:?}");
    // A worker token is no approver under the default rule.
    let status = approve(&mut approvals, TOKEN, &id).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_NOT_FOUND", "{status:?}");
    // An approver token calls no tool.
    let status = two
        .list_tools(authed(APPROVER, pb::ListToolsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let approved = approve(&mut approvals, APPROVER, &id).await.unwrap();
    assert_eq!(approved.state(), pb::CallApprovalState::Approved);
    assert_eq!(approved.decided_by, "approver_token alice");
    // Decided once.
    let status = approve(&mut approvals, APPROVER, &id).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_DECIDED", "{status:?}");

    // Not for other arguments, nor another subject.
    refused(
        call(
            &mut one,
            "bob",
            with_id(
                send(r#"{"amount": 9000, "to": "dave", "memo": "invoice 7"}"#),
                &id,
            ),
        )
        .await,
        Code::FailedPrecondition,
        "APPROVAL_MISMATCH",
    );
    refused(
        call(&mut one, "eve", with_id(payment.clone(), &id)).await,
        Code::FailedPrecondition,
        "APPROVAL_MISMATCH",
    );
    // Another tenant's worker does not find it.
    let status = one
        .invoke_tool(authed(OTHER_TOKEN, with_id(payment.clone(), &id)))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_NOT_FOUND", "{status:?}");
    // The approved call, its keys in another order (the canonical digest),
    // at the first replica: it runs.
    let reordered = send(r#"{"memo": "invoice 7", "to": "dave", "amount": 900}"#);
    let done = call(&mut one, "bob", with_id(reordered.clone(), &id))
        .await
        .unwrap();
    assert_eq!(done.text, "sent 900 to dave");
    // Once.
    refused(
        call(&mut two, "bob", with_id(reordered, &id)).await,
        Code::FailedPrecondition,
        "APPROVAL_SPENT",
    );
    let made = payments.made();
    assert_eq!(made.len(), 2, "{made:?}");
    assert_eq!(
        made[1],
        serde_json::json!({"amount": 900, "to": "dave", "memo": "invoice 7"})
    );

    // A rule on the arguments refuses, naming the rule, never the values.
    let status = call(&mut two, "bob", send(r#"{"amount": 5, "to": "mallory"}"#))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(reason(&status), "TOOL_NOT_PERMITTED");
    assert_eq!(info(&status, "rule"), "tenants[0].policy[0]");
    assert!(!status.message().contains("mallory"), "{status:?}");
    // ... and hides nothing from listings.
    assert!(names(&list(&mut two, TOKEN).await).contains(&"pay__send_payment".to_owned()));
    // A condition that cannot be evaluated on the arguments refuses too.
    let status = call(&mut two, "bob", send(r#"{"to": "dave"}"#))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "TOOL_NOT_PERMITTED", "{status:?}");
    assert_eq!(info(&status, "rule"), "tenants[0].policy[1]", "{status:?}");
    assert_eq!(payments.made().len(), 2);

    // A call waiting at one replica, approved at the other: PostgreSQL's
    // announcement wakes it (without one it would look every 5 s).
    let (mut events, _tx, waiting) =
        interactive(&mut one, r#"{"amount": 555, "to": "gina"}"#, None).await;
    let approved_at = std::time::Instant::now();
    approve(&mut approvals, APPROVER, &waiting.approval_id)
        .await
        .unwrap();
    let last = events.message().await.unwrap().unwrap();
    let woke = approved_at.elapsed();
    let Some(pb::invoke_tool_event::Event::Result(result)) = last.event else {
        panic!("{last:?}");
    };
    assert_eq!(result.text, "sent 555 to gina");
    eprintln!("the waiting call went on {woke:?} after the other replica's approval");
    assert!(
        woke < Duration::from_millis(4500),
        "woken by polling only: {woke:?}"
    );

    // One approval, six retries racing at both replicas: one runs.
    let racing_payment = send(r#"{"amount": 777, "to": "frank"}"#);
    let raced = pending_id(call(&mut one, "bob", racing_payment.clone()).await);
    approve(&mut approvals, APPROVER, &raced).await.unwrap();
    let racers = (0..6).map(|i| {
        let mut client = if i % 2 == 0 { one.clone() } else { two.clone() };
        let request = with_id(racing_payment.clone(), &raced);
        tokio::spawn(async move { call(&mut client, "bob", request).await })
    });
    let results: Vec<_> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let ran = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ran, 1, "{results:?}");
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(reason(refused), "APPROVAL_SPENT", "{refused:?}");
    }
    assert_eq!(
        payments
            .made()
            .iter()
            .filter(|p| p["amount"] == 777)
            .count(),
        1
    );

    // All of it on the audit trail, wherever it happened.
    let trails = [one_audit.as_path(), two_audit.as_path()];
    let requested = audited(&trails, "call_approval_requested").await;
    assert_eq!(requested["call_approval"], id.as_str());
    assert_eq!(requested["rule"], "tenants[0].policy[1]");
    let approved = audited(&trails, "call_approval_approved").await;
    assert_eq!(approved["note"], "ok for the quarterly invoice");
    assert_eq!(approved["caller"]["kind"], "approver_token", "{approved}");
    audited(&trails, "call_approval_spent").await;
    let refusal = audited(&trails, "call_approval_refused").await;
    assert!(
        refusal["reason"].as_str().unwrap().starts_with("APPROVAL_"),
        "{refusal}"
    );
    drop(gateways);
}

/// On `InvokeToolInteractive` the worker is told the call waits, and the
/// call goes on by itself once approved (or ends once denied); a waiting
/// call holds no slot of the tenant's.
#[tokio::test]
async fn an_interactive_call_waits_for_the_decision() {
    let limits = "    limits:\n      max_concurrent_calls: 1\n      queue_timeout: 100ms\n";
    // A chat system's webhook, on loopback (allowed by `upstream_allow`).
    let (hook_port, deliveries) = webhook_receiver().await;
    let webhook = |yaml: String| {
        yaml.replacen(
            "      approver_tokens:\n        - name: alice",
            &format!(
                "      webhook:\n        url: \"http://127.0.0.1:{hook_port}/hook\"\n        \
                 secret: \"{WEBHOOK_SECRET}\"\n      approver_tokens:\n        - name: alice"
            ),
            1,
        )
    };
    let Local {
        dir: _dir,
        payments,
        gateway,
        mut client,
        mut approvals,
        ..
    } = Local::start(
        tempfile::tempdir().unwrap(),
        "upstream_allow: [\"127.0.0.1\"]\n",
        "",
        limits,
        webhook,
    )
    .await;

    for (approve_it, amount) in [(true, 700), (false, 800)] {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(pb::InteractiveRequest {
            message: Some(pb::interactive_request::Message::Call(send(&format!(
                r#"{{"amount": {amount}, "to": "dave"}}"#
            )))),
        })
        .await
        .unwrap();
        let mut events = client
            .invoke_tool_interactive(authed_as(
                TOKEN,
                "bob",
                tokio_stream::wrappers::ReceiverStream::new(rx),
            ))
            .await
            .unwrap()
            .into_inner();
        let first = events.message().await.unwrap().unwrap();
        let Some(pb::invoke_tool_event::Event::ApprovalPending(waiting)) = first.event else {
            panic!("{first:?}");
        };
        assert_eq!(waiting.rule, "tenants[0].policy[1]");
        // The webhook was told, signed.
        let delivery = delivered(&deliveries, &waiting.approval_id).await;
        assert_eq!(delivery["event"], "call_approval.requested");
        assert_eq!(delivery["tool"], "pay__send_payment");
        assert_eq!(delivery["subject"], "token:bob");
        let shown: serde_json::Value =
            serde_json::from_str(delivery["arguments_json"].as_str().unwrap()).unwrap();
        assert_eq!(shown["amount"], amount);
        // While it waits, another call gets the tenant's one slot.
        let balance = pb::InvokeToolRequest {
            name: "pay__balance".to_owned(),
            ..Default::default()
        };
        assert_eq!(
            call(&mut client, "bob", balance).await.unwrap().text,
            "1000"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        if approve_it {
            approve(&mut approvals, APPROVER, &waiting.approval_id)
                .await
                .unwrap();
            let last = events.message().await.unwrap().unwrap();
            let Some(pb::invoke_tool_event::Event::Result(result)) = last.event else {
                panic!("{last:?}");
            };
            assert_eq!(result.text, "sent 700 to dave");
        } else {
            approvals
                .deny_call(authed(
                    APPROVER,
                    pb::DenyCallRequest {
                        approval_id: waiting.approval_id.clone(),
                        reason: "not this month".to_owned(),
                    },
                ))
                .await
                .unwrap();
            let status = events.message().await.unwrap_err();
            assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
            assert_eq!(reason(&status), "APPROVAL_DENIED");
            assert!(status.message().contains("not this month"), "{status:?}");
        }
        drop(tx);
    }
    let made = payments.made();
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["amount"], 700);
    gateway.shutdown().await;
}

/// What an approval was not given for is refused: the approver's own call
/// (unless the rule allows it), after expiry, a flood of requests, a
/// changed definition and a changed rule.
#[tokio::test]
async fn approvals_refuse_what_they_were_not_given_for() {
    let dir = tempfile::tempdir().unwrap();
    let payments = Payments::new(dir.path(), "refusals");
    let audit = dir.path().join("audit.jsonl");
    let port = free_port();
    let state = format!(
        "state:\n  url: \"sqlite://{}\"\n",
        dir.path().join("state.db").display()
    );
    // Workers' own tokens may approve, but never their own calls; an
    // approval is asked for within 2 s and holds 2 s.
    let options = "        approval:\n          approvers: \"caller.kind == 'token'\"\n          \
                   wait: 2s\n          valid_for: 2s\n";
    let path = dir.path().join("gateway.yaml");
    let write = |options: &str, pending_limit: u32| {
        let text = config(port, &state, &audit, &payments, &policy(options, ""), "")
            .replace(
                "      approver_tokens:\n        - name: alice",
                &format!(
                    "      max_pending_per_subject: {pending_limit}\n      approver_tokens:\n        - name: alice"
                ),
            );
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    write(options, 3);
    let log = dir.path().join("gateway.log");
    let gateway = serve_binary(&path, &log, &[]);
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    wait_listed(&mut client, TOKEN, "pay__send_payment").await;
    let approvals = approvals_at(port).await;
    let approve_as = |subject: &'static str, id: String| {
        let mut approvals = approvals.clone();
        async move {
            approvals
                .approve_call(authed_as(
                    TOKEN,
                    subject,
                    pb::ApproveCallRequest {
                        approval_id: id,
                        reason: String::new(),
                    },
                ))
                .await
        }
    };

    // Self-approval is refused; another subject approves.
    let payment = send(r#"{"amount": 600, "to": "dave"}"#);
    let id = pending_id(call(&mut client, "bob", payment.clone()).await);
    let status = approve_as("bob", id.clone()).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_NOT_APPROVER", "{status:?}");
    assert!(status.message().contains("self-approval"), "{status:?}");
    approve_as("carol", id.clone()).await.unwrap();
    // Not used within valid_for: expired.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    refused(
        call(&mut client, "bob", with_id(payment.clone(), &id)).await,
        Code::FailedPrecondition,
        "APPROVAL_EXPIRED",
    );
    // Not decided within wait: expired, and no longer decidable.
    let id = pending_id(call(&mut client, "bob", payment.clone()).await);
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let status = approve_as("carol", id.clone()).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_DECIDED", "{status:?}");
    refused(
        call(&mut client, "bob", with_id(payment.clone(), &id)).await,
        Code::FailedPrecondition,
        "APPROVAL_EXPIRED",
    );

    // A flood of requests is bounded per subject.
    for amount in 701..704 {
        pending_id(
            call(
                &mut client,
                "bob",
                send(&format!(r#"{{"amount": {amount}, "to": "x"}}"#)),
            )
            .await,
        );
    }
    refused(
        call(&mut client, "bob", send(r#"{"amount": 999, "to": "x"}"#)).await,
        Code::ResourceExhausted,
        "APPROVAL_LIMIT",
    );
    // Another subject has its own room.
    pending_id(call(&mut client, "carol", send(r#"{"amount": 999, "to": "x"}"#)).await);

    // Approved, then the rule changes (a reload): the approval no longer
    // fits, and a pending one can no longer be decided.
    let approved = pending_id(call(&mut client, "dan", payment.clone()).await);
    approve_as("carol", approved.clone()).await.unwrap();
    let undecided = pending_id(call(&mut client, "erin", payment.clone()).await);
    write(&options.replace("wait: 2s", "wait: 3s"), 3);
    // The reload also denies `pay__balance`: once that is refused, the
    // new rule applies.
    let text = std::fs::read_to_string(&path).unwrap().replacen(
        "\n  - name: globex",
        "      - deny: \"pay__balance\"\n  - name: globex",
        1,
    );
    std::fs::write(&path, text).unwrap();
    signal(gateway.0.id(), "HUP");
    let balance = pb::InvokeToolRequest {
        name: "pay__balance".to_owned(),
        ..Default::default()
    };
    for _ in 0..100 {
        if call(&mut client, "dan", balance.clone()).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut changed = false;
    for _ in 0..100 {
        let status = call(&mut client, "dan", with_id(payment.clone(), &approved))
            .await
            .unwrap_err();
        if reason(&status) == "APPROVAL_MISMATCH" {
            assert!(status.message().contains("rules"), "{status:?}");
            changed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(changed, "the reload never changed the rule");
    let status = approve_as("carol", undecided).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_NOT_FOUND", "{status:?}");

    // Approved, then the tool's definition changes (the server restarts
    // with another description): the approval no longer fits.
    let approved = pending_id(call(&mut client, "fay", payment.clone()).await);
    approve_as("carol", approved.clone()).await.unwrap();
    std::fs::write(&payments.description, "Send a payment, now with fees.").unwrap();
    for child in children_of(gateway.0.id()) {
        signal(child, "KILL");
    }
    let mut changed = false;
    for _ in 0..150 {
        match call(&mut client, "fay", with_id(payment.clone(), &approved)).await {
            Err(status) if reason(&status) == "APPROVAL_MISMATCH" => {
                assert!(status.message().contains("definition"), "{status:?}");
                changed = true;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(done) => panic!("ran under the old approval: {done:?}"),
        }
    }
    assert!(changed, "the definition never changed");
    assert!(payments.made().is_empty(), "{:?}", payments.made());
    drop(gateway);
}

/// Runs `program` with `args` and `env` to its end (at most 60 s): exit
/// code, stdout, stderr.
async fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_remove("TOOLGATE_ADDR")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("done within 60 s")
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Clients nobody wrote for the tests: the Python example worker waits on
/// `InvokeToolInteractive` while the Python example approver approves;
/// `toolgate call` is held, `toolgate call-approvals approve` decides,
/// `toolgate call --approval-id` runs it. Each call ran once.
#[tokio::test]
async fn the_examples_and_the_cli_decide_held_calls() {
    let Local {
        dir: _dir,
        payments,
        gateway,
        mut approvals,
        ..
    } = Local::start(tempfile::tempdir().unwrap(), "", "", "", |y| y).await;
    let addr = gateway.addr.to_string();
    let examples = repo_root().join("examples/call_approvals");
    let python = python();
    let (code, _, stderr) = run(
        &examples.join("generate.sh"),
        &[],
        &[("PYTHON", python.to_str().unwrap())],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");

    // The Python worker waits on its stream...
    let worker = tokio::process::Command::new(&python)
        .arg(examples.join("worker.py"))
        .args([
            "pay__send_payment",
            r#"{"amount": 900, "to": "dave"}"#,
            "--addr",
            &addr,
        ])
        .env("TOOLGATE_TOKEN", TOKEN)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..100 {
        held = pending(&mut approvals, APPROVER).await;
        if !held.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(held.len(), 1, "{held:?}");
    let id = held[0].approval_id.clone();
    // ... the Python approver lists it and approves it...
    let approver_env = [("TOOLGATE_APPROVER_TOKEN", APPROVER)];
    let approver = examples.join("approver.py");
    let (code, listed, stderr) = run(
        &python,
        &[approver.to_str().unwrap(), "list", "--addr", &addr],
        &approver_env,
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        listed.contains(&id) && listed.contains("pay__send_payment"),
        "{listed}"
    );
    let (code, _, stderr) = run(
        &python,
        &[
            approver.to_str().unwrap(),
            "approve",
            &id,
            "--reason",
            "invoice 7",
            "--addr",
            &addr,
        ],
        &approver_env,
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    // ... and the worker's call goes on by itself.
    let output = tokio::time::timeout(Duration::from_secs(30), worker.wait_with_output())
        .await
        .expect("the worker ends once approved")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("approval pending: {id}")),
        "{stdout}"
    );
    assert!(stdout.contains("sent 900 to dave"), "{stdout}");

    // The command line: held, approved, run with the approval.
    let cli = toolgate_bin();
    let worker_env = [("TOOLGATE_TOKEN", TOKEN)];
    let payment = r#"{"amount": 950, "to": "erin"}"#;
    let (code, _, stderr) = run(
        &cli,
        &["call", "--addr", &addr, "pay__send_payment", payment],
        &worker_env,
    )
    .await;
    assert_eq!(code, 9, "{stderr}");
    assert!(stderr.contains("APPROVAL_PENDING"), "{stderr}");
    let id = stderr
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .find(|word| word.starts_with("apv_"))
        .unwrap_or_else(|| panic!("no approval id in {stderr}"))
        .to_owned();
    let (code, stdout, stderr) = run(
        &cli,
        &[
            "call-approvals",
            "approve",
            &id,
            "--reason",
            "checked",
            "--addr",
            &addr,
        ],
        &[("TOOLGATE_TOKEN", APPROVER)],
    )
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (code, stdout, stderr) = run(
        &cli,
        &[
            "call",
            "--addr",
            &addr,
            "pay__send_payment",
            payment,
            "--approval-id",
            &id,
        ],
        &worker_env,
    )
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("sent 950 to erin"), "{stdout}");
    let made = payments.made();
    assert_eq!(made.len(), 2, "{made:?}");
    gateway.shutdown().await;
}

/// With `accepts_task`, a held call becomes a task at once; the task
/// starts when approved (at the next `GetTask`, the call's result then
/// kept), ends when denied, and a cancelled one never starts.
#[tokio::test]
async fn a_task_starts_once_its_call_is_approved() {
    let Local {
        dir: _dir,
        payments,
        gateway,
        mut client,
        mut approvals,
        ..
    } = Local::start(tempfile::tempdir().unwrap(), "", "", "", |y| y).await;
    let get = |client: &mut ToolGatewayClient<Channel>, id: &str| {
        let mut client = client.clone();
        let request = authed_as(
            TOKEN,
            "bob",
            pb::GetTaskRequest {
                task_id: id.to_owned(),
            },
        );
        async move { client.get_task(request).await.unwrap().into_inner() }
    };
    let park = |client: &mut ToolGatewayClient<Channel>, amount: u32| {
        let mut client = client.clone();
        let mut request = send(&format!(r#"{{"amount": {amount}, "to": "dave"}}"#));
        request.accepts_task = true;
        async move {
            call(&mut client, "bob", request)
                .await
                .unwrap()
                .task
                .expect("the held call became a task")
        }
    };
    let approval_of = |task: &pb::Task| {
        task.status_message
            .split_whitespace()
            .find(|w| w.starts_with("apv_"))
            .unwrap_or_else(|| panic!("{task:?}"))
            .to_owned()
    };

    // Approved: it starts at the next GetTask, and runs once.
    let task = park(&mut client, 900).await;
    assert_eq!(task.status(), pb::TaskStatus::Working, "{task:?}");
    let id = approval_of(&task);
    assert_eq!(
        get(&mut client, &task.task_id).await.status(),
        pb::TaskStatus::Working
    );
    assert!(payments.made().is_empty());
    approve(&mut approvals, APPROVER, &id).await.unwrap();
    let done = get(&mut client, &task.task_id).await;
    assert_eq!(done.status(), pb::TaskStatus::Completed, "{done:?}");
    assert_eq!(done.result.unwrap().text, "sent 900 to dave");
    let again = get(&mut client, &task.task_id).await;
    assert_eq!(again.result.unwrap().text, "sent 900 to dave");
    assert_eq!(payments.made().len(), 1);

    // Denied: it ends failed, saying so.
    let task = park(&mut client, 901).await;
    approvals
        .deny_call(authed(
            APPROVER,
            pb::DenyCallRequest {
                approval_id: approval_of(&task),
                reason: "no".to_owned(),
            },
        ))
        .await
        .unwrap();
    let denied = get(&mut client, &task.task_id).await;
    assert_eq!(denied.status(), pb::TaskStatus::Failed, "{denied:?}");
    assert!(denied.status_message.contains("denied"), "{denied:?}");

    // Cancelled while pending: approving it later starts nothing.
    let task = park(&mut client, 902).await;
    let cancelled = client
        .cancel_task(authed_as(
            TOKEN,
            "bob",
            pb::CancelTaskRequest {
                task_id: task.task_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.status(), pb::TaskStatus::Cancelled);
    approve(&mut approvals, APPROVER, &approval_of(&task))
        .await
        .unwrap();
    assert_eq!(
        get(&mut client, &task.task_id).await.status(),
        pb::TaskStatus::Cancelled
    );
    // Another subject does not find the task.
    let status = client
        .get_task(authed_as(
            TOKEN,
            "eve",
            pb::GetTaskRequest {
                task_id: task.task_id.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "TASK_NOT_FOUND");
    assert_eq!(payments.made().len(), 1, "{:?}", payments.made());
    gateway.shutdown().await;
}

/// Approvers by their JWT's claims: a member of `finance` decides, anyone
/// else sees nothing, and nobody approves a call made with their own
/// identity.
#[tokio::test]
async fn jwt_approvers_decide_by_their_claims_never_their_own_calls() {
    use crate::jwt::{CLUSTER, jwks_doc_text, keys, sa_claims, with};
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, jwks_doc_text(&[&keys().rsa1])).unwrap();
    let top = format!(
        "callers:\n  jwt:\n    - issuer: \"{CLUSTER}\"\n      audiences: [toolgate]\n      \
         jwks: {{ file: \"{}\" }}\n      tenant: 'claims[\"kubernetes.io\"].namespace'\n",
        jwks.display()
    );
    let options = "        approval:\n          approvers: \"has(claims.groups) && 'finance' in claims.groups\"\n";
    let Local {
        dir: _dir,
        payments,
        gateway,
        mut client,
        mut approvals,
        ..
    } = Local::start(dir, &top, options, "", |y| y).await;
    let finance = keys().rsa1.sign(&with(
        sa_claims("acme"),
        "groups",
        serde_json::json!(["finance"]),
    ));
    let sales = keys().rsa1.sign(&with(
        sa_claims("acme"),
        "groups",
        serde_json::json!(["sales"]),
    ));
    let id = pending_id(call(&mut client, "bob", send(r#"{"amount": 600, "to": "x"}"#)).await);
    // Not finance: nothing to see, nothing to decide; an approver token
    // is no approver of a rule that names its approvers.
    assert!(pending(&mut approvals, &sales).await.is_empty());
    let status = approve(&mut approvals, &sales, &id).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_NOT_FOUND", "{status:?}");
    let status = approve(&mut approvals, APPROVER, &id).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_NOT_FOUND", "{status:?}");
    // Finance: sees it, decides it, named as the JWT's issuer and subject.
    let listed = pending(&mut approvals, &finance).await;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].may_decide);
    let approved = approve(&mut approvals, &finance, &id).await.unwrap();
    assert!(
        approved.decided_by.contains(CLUSTER)
            && approved
                .decided_by
                .contains("system:serviceaccount:acme:worker"),
        "{approved:?}"
    );
    let done = call(
        &mut client,
        "bob",
        with_id(send(r#"{"amount": 600, "to": "x"}"#), &id),
    )
    .await
    .unwrap();
    assert_eq!(done.text, "sent 600 to x");
    // A call made with the finance identity itself: not its own approver.
    let own = client
        .invoke_tool(authed(&finance, send(r#"{"amount": 700, "to": "y"}"#)))
        .await
        .map(tonic::Response::into_inner);
    let own = pending_id(own);
    let status = approve(&mut approvals, &finance, &own).await.unwrap_err();
    assert_eq!(reason(&status), "CALL_APPROVAL_NOT_APPROVER", "{status:?}");
    assert!(status.message().contains("self-approval"), "{status:?}");
    assert_eq!(payments.made().len(), 1);
    gateway.shutdown().await;
}

/// Opens `InvokeToolInteractive` for `arguments` as `bob` (with
/// `deadline`, when given) and reads its first event.
async fn interactive(
    client: &mut ToolGatewayClient<Channel>,
    arguments: &str,
    deadline: Option<Duration>,
) -> (
    tonic::Streaming<pb::InvokeToolEvent>,
    tokio::sync::mpsc::Sender<pb::InteractiveRequest>,
    pb::ApprovalPending,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::InteractiveRequest {
        message: Some(pb::interactive_request::Message::Call(send(arguments))),
    })
    .await
    .unwrap();
    let mut request = authed_as(
        TOKEN,
        "bob",
        tokio_stream::wrappers::ReceiverStream::new(rx),
    );
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    let mut events = client
        .invoke_tool_interactive(request)
        .await
        .unwrap()
        .into_inner();
    let first = events.message().await.unwrap().unwrap();
    let Some(pb::invoke_tool_event::Event::ApprovalPending(waiting)) = first.event else {
        panic!("{first:?}");
    };
    (events, tx, waiting)
}

/// A waiting call ends when nobody decides in time, or at its caller's
/// deadline, with nothing sent; requests, decisions and their time are
/// counted.
#[tokio::test]
async fn a_waiting_call_ends_at_expiry_or_its_deadline_and_is_counted() {
    let metrics_port = free_port();
    let Local {
        dir: _dir,
        payments,
        gateway,
        mut client,
        mut approvals,
        ..
    } = Local::start(
        tempfile::tempdir().unwrap(),
        &format!("metrics:\n  listen: \"127.0.0.1:{metrics_port}\"\n"),
        "        approval:\n          wait: 1s\n",
        "",
        |y| y,
    )
    .await;

    // Nobody decides within `wait`.
    let started = std::time::Instant::now();
    let (mut events, _tx, waiting) =
        interactive(&mut client, r#"{"amount": 800, "to": "a"}"#, None).await;
    let status = events.message().await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "APPROVAL_EXPIRED", "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(info(&status, "approval_id"), waiting.approval_id);

    // The caller's deadline comes first.
    let (mut events, _tx, _) = interactive(
        &mut client,
        r#"{"amount": 801, "to": "b"}"#,
        Some(Duration::from_millis(600)),
    )
    .await;
    let status = events.message().await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");

    // Decided: counted, with the time it took.
    let (mut events, _tx, waiting) =
        interactive(&mut client, r#"{"amount": 802, "to": "c"}"#, None).await;
    // A reason past 1,024 characters decides nothing.
    let status = approvals
        .approve_call(authed(
            APPROVER,
            pb::ApproveCallRequest {
                approval_id: waiting.approval_id.clone(),
                reason: "x".repeat(1025),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(&status), "CALL_APPROVAL_REASON_TOO_LONG");
    approve(&mut approvals, APPROVER, &waiting.approval_id)
        .await
        .unwrap();
    let last = events.message().await.unwrap().unwrap();
    assert!(
        matches!(last.event, Some(pb::invoke_tool_event::Event::Result(_))),
        "{last:?}"
    );
    let page = scrape(metrics_port).await;
    let count = |event: &str| {
        sample(
            &page,
            &format!("toolgate_call_approvals_total{{tenant=\"acme\",event=\"{event}\"}}"),
        )
    };
    assert_eq!(count("requested").as_deref(), Some("3"), "{page}");
    assert_eq!(count("approved").as_deref(), Some("1"), "{page}");
    assert_eq!(count("spent").as_deref(), Some("1"), "{page}");
    assert_eq!(
        sample(
            &page,
            "toolgate_call_approval_decision_seconds_count{tenant=\"acme\"}"
        )
        .as_deref(),
        Some("1"),
        "{page}"
    );
    let made = payments.made();
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["amount"], 802);
    gateway.shutdown().await;
}

/// Guards see a call only once it is approved; a call a guard then
/// refuses sent nothing, so the approval's use goes back (recorded), and
/// the approval still serves its call.
#[tokio::test]
async fn a_call_refused_after_its_approval_gives_the_use_back() {
    let dir = tempfile::tempdir().unwrap();
    let guard = crate::guards::start_guard(dir.path(), &[]);
    let top = format!(
        "guards:\n  - name: veto\n    url: http://127.0.0.1:{}\n",
        guard.port
    );
    let Local {
        dir: _dir,
        payments,
        audit,
        gateway,
        mut client,
        mut approvals,
    } = Local::start(dir, &top, "", "    guards: [veto]\n", |y| y).await;
    // The guard refuses this memo, but only once it is asked: after the
    // approval (a held call reaches no guard).
    let payment = send(r#"{"amount": 650, "to": "hal", "memo": "DENY-ME"}"#);
    let id = pending_id(call(&mut client, "bob", payment.clone()).await);
    assert!(
        crate::guards::checks(&guard).is_empty(),
        "a held call reached the guard"
    );
    approve(&mut approvals, APPROVER, &id).await.unwrap();
    let status = call(&mut client, "bob", with_id(payment.clone(), &id))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(reason(&status).starts_with("GUARD_"), "{status:?}");
    // The use went back: still approved, one use left.
    let now = approvals
        .get_call_approval(authed(
            APPROVER,
            pb::GetCallApprovalRequest {
                approval_id: id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(now.state(), pb::CallApprovalState::Approved, "{now:?}");
    assert_eq!(now.uses_left, 1);
    let returned = audited(&[audit.as_path()], "call_approval_returned").await;
    assert_eq!(returned["call_approval"], id.as_str());
    assert_eq!(returned["tool"], "pay__send_payment");
    assert_eq!(crate::guards::checks(&guard).len(), 1);
    assert!(payments.made().is_empty());
    gateway.shutdown().await;
}
