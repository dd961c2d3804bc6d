//! A tenant onboarded end to end through the admin API, as a control plane
//! does it: its caller token and its upstream credential written as stored
//! secrets, its spec referencing them, then served to a worker by a real
//! `toolgate serve` process against a real upstream that echoes the
//! credential it receives. The credential reaches the upstream (the echo
//! is there, redacted), and is never readable back: not through any admin
//! RPC, not in a tool result or an error, not in the gateway's log. A
//! rotated credential is followed, and redacted in its turn.

use std::time::{Duration, Instant};

use tonic::Code;
use toolgate::pb::admin as admin_pb;

use crate::common::{ChildGuard, client_at, free_port, invoke, serve_binary, wait_for_port};
use crate::redaction::start_upstream;

const STATE_KEY: &str = "b25ib2FyZGluZy10ZXN0LXN0YXRlLWtleS0zMmJ5dGU=";
const ADMIN_TOKEN: &str = "onboarding-admin-token";
const CALLER_TOKEN: &str = "acme-caller-token-7c1d";
const UPSTREAM_KEY: &str = "sk-onboard-2a9f7e11c4d8b6";
const ROTATED_KEY: &str = "sk-rotated-93be0c5a7f2d41";

fn admin_request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
    );
    request
}

/// Calls `echo__echo_auth` until `check` holds for its text (bounded).
async fn wait_echo(
    client: &mut toolgate::pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    what: &str,
    check: impl Fn(&str) -> bool,
) -> String {
    let started = Instant::now();
    loop {
        let answer = invoke(client, CALLER_TOKEN, "echo__echo_auth", "{}").await;
        if let Ok(result) = &answer
            && check(&result.text)
        {
            return result.text.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what} not seen: last answer {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_tenant_onboarded_through_the_admin_api_uses_its_secret_and_never_shows_it() {
    let upstream = start_upstream(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nstate:\n  url: \"sqlite://{}/state.db\"\n  keys: [\"{STATE_KEY}\"]\nadmin:\n  listen: \"127.0.0.1:{admin_port}\"\n  tokens: [{ADMIN_TOKEN}]\ntenant_store:\n  poll_interval: \"200ms\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let log = dir.path().join("gateway.log");
    let _gateway: ChildGuard = serve_binary(&config, &log, &[]);
    wait_for_port(admin_port).await;
    wait_for_port(port).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{admin_port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut admin = admin_pb::admin_client::AdminClient::new(channel);

    // Secrets first, then the spec that references them.
    for (name, value) in [
        ("caller-token", CALLER_TOKEN),
        ("upstream-key", &format!("Bearer {UPSTREAM_KEY}")),
    ] {
        admin
            .put_secret(admin_request(admin_pb::PutSecretRequest {
                tenant: "acme".into(),
                name: name.into(),
                value: value.as_bytes().to_vec(),
            }))
            .await
            .unwrap();
    }
    let spec = format!(
        "tokens: [{{stored: caller-token}}]\nservers:\n  - name: echo\n    url: \"http://127.0.0.1:{}/mcp\"\n    headers:\n      Authorization: {{stored: upstream-key}}\n",
        upstream.port
    );
    let created = admin
        .put_tenant(admin_request(admin_pb::PutTenantRequest {
            name: "acme".into(),
            spec_yaml: spec.clone(),
            expected_version: String::new(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.spec_yaml, spec);

    // The worker's call reaches the upstream with the stored credential:
    // the upstream echoes it, and the gateway redacts it.
    let mut client = client_at(port).await;
    let text = wait_echo(&mut client, "the echoed credential, redacted", |t| {
        t.contains("[redacted]")
    })
    .await;
    assert!(
        !text.contains(UPSTREAM_KEY),
        "the credential in a result: {text}"
    );
    // An upstream error that echoes it is redacted too.
    let error = invoke(&mut client, CALLER_TOKEN, "echo__rpc_error", "{}")
        .await
        .expect_err("rpc_error fails");
    assert!(
        !error.message().contains(UPSTREAM_KEY),
        "the credential in a status: {}",
        error.message()
    );

    // Never readable back through the admin API.
    let secrets = admin
        .list_secrets(admin_request(admin_pb::ListSecretsRequest {
            tenant: "acme".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = secrets.secrets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["caller-token", "upstream-key"]);
    let debug = format!("{secrets:?}");
    let stored = admin
        .get_tenant(admin_request(admin_pb::GetTenantRequest {
            name: "acme".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    let listed = admin
        .list_tenants(admin_request(admin_pb::ListTenantsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    for shown in [debug, format!("{stored:?}"), format!("{listed:?}")] {
        assert!(!shown.contains(UPSTREAM_KEY) && !shown.contains(CALLER_TOKEN));
    }

    // A rotated credential is followed, and redacted in its turn.
    admin
        .put_secret(admin_request(admin_pb::PutSecretRequest {
            tenant: "acme".into(),
            name: "upstream-key".into(),
            value: format!("Bearer {ROTATED_KEY}").into_bytes(),
        }))
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        // The rotated tenant's session sends the new key: the upstream's
        // echo of it is redacted, so no call result ever holds either key.
        let answer = invoke(&mut client, CALLER_TOKEN, "echo__echo_auth", "{}").await;
        if let Ok(result) = &answer {
            assert!(
                !result.text.contains(ROTATED_KEY) && !result.text.contains(UPSTREAM_KEY),
                "a key in a result: {}",
                result.text
            );
        }
        let version = admin
            .get_tenant(admin_request(admin_pb::GetTenantRequest {
                name: "acme".into(),
            }))
            .await
            .unwrap()
            .into_inner()
            .version;
        if version != created.version
            && answer.as_ref().is_ok_and(|r| r.text.contains("[redacted]"))
            && started.elapsed() > Duration::from_secs(1)
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "rotation never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A worker's token is not an admin's.
    let mut as_worker = tonic::Request::new(admin_pb::ListTenantsRequest::default());
    as_worker.metadata_mut().insert(
        "authorization",
        format!("Bearer {CALLER_TOKEN}").parse().unwrap(),
    );
    let refused = admin.list_tenants(as_worker).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);

    // Deleted: the worker is refused.
    admin
        .delete_tenant(admin_request(admin_pb::DeleteTenantRequest {
            name: "acme".into(),
            expected_version: String::new(),
        }))
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        match invoke(&mut client, CALLER_TOKEN, "echo__ok", "{}").await {
            Err(status) if status.code() == Code::Unauthenticated => break,
            other => assert!(
                started.elapsed() < Duration::from_secs(20),
                "still served after the delete: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Nothing of either key, nor of the caller's token, in the log.
    let log = std::fs::read_to_string(&log).unwrap();
    for secret in [UPSTREAM_KEY, ROTATED_KEY, CALLER_TOKEN] {
        assert!(!log.contains(secret), "a secret in the gateway's log");
    }
}
