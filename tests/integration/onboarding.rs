//! A tenant onboarded end to end through the admin API, as a control plane
//! does it: its caller token and its upstream credential written as stored
//! secrets, its spec referencing them, then served to a worker by a real
//! `toolgate serve` process against a real upstream that echoes the
//! credential it receives. The credential reaches the upstream (the echo
//! is there, redacted), and is never readable back: not through any admin
//! RPC, not in a tool result or an error, not in the gateway's log. A
//! rotated credential is followed, and redacted in its turn. Such a
//! tenant's servers reach the gateway's own network only where
//! `upstream_allow` allows it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;
use toolgate::pb::admin as admin_pb;

use crate::common::{
    ChildGuard, authed, client_at, free_port, invoke, serve_binary, wait_for_port,
};
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
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nstate:\n  url: \"sqlite://{}/state.db\"\n  keys: [\"{STATE_KEY}\"]\nadmin:\n  listen: \"127.0.0.1:{admin_port}\"\n  tokens: [{ADMIN_TOKEN}]\ntenant_store:\n  poll_interval: \"200ms\"\n\
             # The upstream runs on loopback: the operator allows it.\n\
             upstream_allow: [\"127.0.0.1:{}\"]\n",
            dir.path().display(),
            upstream.port
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

/// A TCP listener on loopback that counts the connections it gets (and
/// closes them): an address the gateway must not contact.
struct Trap {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl Trap {
    async fn start() -> Trap {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Trap { port, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// The servers `token`'s tenant lists, by name: (connected, error).
async fn statuses(
    client: &mut toolgate::pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    token: &str,
) -> std::collections::BTreeMap<String, (bool, String)> {
    client
        .list_tools(authed(token, toolgate::pb::ListToolsRequest::default()))
        .await
        .map(|r| {
            r.into_inner()
                .servers
                .into_iter()
                .map(|s| (s.name, (s.connected, s.error)))
                .collect()
        })
        .unwrap_or_default()
}

/// Item 3 of issue 37: the `url` servers of tenants written through the
/// admin API or in `tenants_dir` do not reach loopback (by address, or by
/// a name that resolves there) unless `upstream_allow` allows it; the
/// refusal names the server, the address and the setting, in
/// `ServerStatus` and the log, and the address is never contacted. The
/// configuration file's tenants are trusted.
#[tokio::test]
async fn admin_and_directory_tenants_reach_the_gateways_network_only_as_allowed() {
    let upstream = start_upstream(&[]);
    let (trap, file_trap) = (Trap::start().await, Trap::start().await);
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants");
    std::fs::create_dir(&tenants).unwrap();
    std::fs::write(
        tenants.join("dirt.yaml"),
        format!(
            "tokens: [dirt-token]\nservers:\n  - name: near\n    url: \"http://127.0.0.1:{}/mcp\"\n",
            trap.port
        ),
    )
    .unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n\
             state:\n  url: \"sqlite://{dir}/state.db\"\n  keys: [\"{STATE_KEY}\"]\n\
             admin:\n  listen: \"127.0.0.1:{admin_port}\"\n  tokens: [{ADMIN_TOKEN}]\n\
             tenant_store:\n  poll_interval: \"200ms\"\n\
             tenants_dir:\n  path: {tenants}\n  poll_interval: 200ms\n\
             upstream_allow: [\"127.0.0.1:{allowed}\"]\n\
             tenants:\n  - name: filed\n    tokens: [filed-token]\n    servers:\n\
             \x20     - name: own\n        url: \"http://127.0.0.1:{file_trap}/mcp\"\n",
            dir = dir.path().display(),
            tenants = tenants.display(),
            allowed = upstream.port,
            file_trap = file_trap.port,
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
    let spec = format!(
        "tokens: [acme-token]\nservers:\n\
         \x20 - name: direct\n    url: \"http://127.0.0.1:{trap}/mcp\"\n\
         \x20 - name: named\n    url: \"http://localhost:{trap}/mcp\"\n\
         \x20 - name: echo\n    url: \"http://127.0.0.1:{allowed}/mcp\"\n",
        trap = trap.port,
        allowed = upstream.port,
    );
    admin
        .put_tenant(admin_request(admin_pb::PutTenantRequest {
            name: "acme".into(),
            spec_yaml: spec,
            expected_version: String::new(),
        }))
        .await
        .unwrap();

    let mut client = client_at(port).await;
    let started = Instant::now();
    let (acme, dirt) = loop {
        let acme = statuses(&mut client, "acme-token").await;
        let dirt = statuses(&mut client, "dirt-token").await;
        let refused = |s: &std::collections::BTreeMap<String, (bool, String)>, name: &str| {
            s.get(name)
                .is_some_and(|(_, e)| e.contains("upstream_allow"))
        };
        if refused(&acme, "direct")
            && refused(&acme, "named")
            && acme.get("echo").is_some_and(|(up, _)| *up)
            && refused(&dirt, "near")
        {
            break (acme, dirt);
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not refused: acme {acme:?}, dirt {dirt:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let at = format!("127.0.0.1:{}", trap.port);
    let (up, direct) = &acme["direct"];
    assert!(!up);
    for part in [
        "server `direct`",
        at.as_str(),
        "a private or loopback address",
        "`upstream_allow`",
    ] {
        assert!(direct.contains(part), "{part} in {direct}");
    }
    let named = &acme["named"].1;
    assert!(
        named.contains("server `named`") && named.contains("localhost (resolved to "),
        "{named}"
    );
    assert!(dirt["near"].1.contains(&at), "{:?}", dirt["near"]);
    // The allowed upstream serves.
    assert!(
        invoke(&mut client, "acme-token", "echo__ok", "{}")
            .await
            .is_ok()
    );
    // The configuration file's tenant is trusted: its server is contacted.
    let started = Instant::now();
    while file_trap.connections() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the file tenant never connected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The refused address was never contacted, reconnects included.
    assert_eq!(trap.connections(), 0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("direct") && l.contains(&at) && l.contains("upstream_allow")),
        "no refusal in the log:\n{text}"
    );
}
