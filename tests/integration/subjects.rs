//! Subjects are keyed by who vouched for them: a static token naming the
//! subject a JWT issuer produces, or a second issuer of the same tenant
//! producing the same `sub`, never reaches the first one's upstream
//! consent; and tokens stored under a bare subject by an earlier release
//! are moved by `toolgate state migrate-subjects` (or, left alone, make
//! their subjects consent again). The upstream is the Python OAuth fixture
//! pair of `oauth.rs`; JWT callers are signed with the keys of `jwt.rs`.

use std::time::{Duration, Instant};

use serde_json::json;
use tonic::transport::Channel;
use toolgate::callers::Namespace;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;
use toolgate::state::{KeyRing, StateStore, TokenKey};

use crate::common::*;
use crate::jwt::{CLUSTER, jwks_doc_text, keys, sa_claims, with};
use crate::oauth::{
    STATE_KEY, Upstream, authorization_url, config as oauth_config, consent, env, unconfirmed,
    upstream,
};

/// A second issuer mapped to the same tenant.
const OTHER: &str = "https://other-cluster.test";
/// The subject both issuers name.
const WORKER: &str = "system:serviceaccount:acme:worker";

/// oauth.rs's gateway (`docs` per user, `svc` the tenant's own, static
/// token `acme-token`) without consent confirmation, and (with
/// `jwks_file`) two JWT issuers mapped to `acme`.
fn config(
    upstream: &Upstream,
    state_url: &str,
    consent_port: u16,
    jwks_file: Option<&std::path::Path>,
) -> String {
    let callers = jwks_file.map_or_else(String::new, |file| {
        let issuer = |iss: &str| {
            format!(
                "    - issuer: \"{iss}\"\n      audiences: [toolgate]\n      jwks: {{ file: \"{}\" }}\n      tenant: \"'acme'\"\n",
                file.display()
            )
        };
        format!("callers:\n  jwt:\n{}{}", issuer(CLUSTER), issuer(OTHER))
    });
    // The keying of subjects is under test here; consent confirmation in
    // consent.rs and oauth_oidc.rs.
    format!(
        "{callers}{}",
        unconfirmed(&oauth_config(upstream, state_url, consent_port))
    )
}

/// Invokes `docs__whoami` with `bearer`, naming `subject` when given,
/// until the answer is not UNAVAILABLE (the server listing after a first
/// consent), bounded. Returns the user the upstream token is for.
async fn whoami(
    client: &mut ToolGatewayClient<Channel>,
    bearer: &str,
    subject: Option<&str>,
) -> Result<String, tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut request = authed(
            bearer,
            pb::InvokeToolRequest {
                name: "docs__whoami".to_owned(),
                arguments_json: "{}".to_owned(),
                ..Default::default()
            },
        );
        if let Some(subject) = subject {
            request
                .metadata_mut()
                .insert("x-toolgate-subject", subject.parse().unwrap());
        }
        match client.invoke_tool(request).await {
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => return Err(status),
            Ok(response) => {
                let response = response.into_inner();
                assert!(!response.is_error, "tool error: {}", response.text);
                return Ok(response.text);
            }
        }
    }
}

#[tokio::test]
async fn a_subject_named_by_a_static_token_or_another_issuer_is_not_the_jwt_callers() {
    let upstream = upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks_doc_text(&[&keys().rsa1])).unwrap();
    let state_url = format!("sqlite://{}/state.db", dir.path().display());
    let consent_port = free_port();
    let yaml = config(&upstream, &state_url, consent_port, Some(&file));
    let gateway = TestGateway::start(&yaml, &env()).await;
    let mut client = gateway.client().await;
    let cluster = keys().rsa1.sign(&sa_claims("acme"));
    let other = keys()
        .rsa1
        .sign(&with(sa_claims("acme"), "iss", json!(OTHER)));

    // The service account consents (as user `worker` at the upstream).
    let status = whoami(&mut client, &cluster, None).await.unwrap_err();
    let (code, page) = consent(&authorization_url(&status), "worker", consent_port).await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(whoami(&mut client, &cluster, None).await.unwrap(), "worker");

    // A static token naming the same subject is another subject: it is
    // asked to consent, and nothing runs with the service account's token.
    let status = whoami(&mut client, "acme-token", Some(WORKER))
        .await
        .expect_err("a static token used the JWT caller's upstream token");
    authorization_url(&status);
    let mut listing = authed("acme-token", pb::ListToolsRequest::default());
    listing
        .metadata_mut()
        .insert("x-toolgate-subject", WORKER.parse().unwrap());
    let listing = client.list_tools(listing).await.unwrap().into_inner();
    let docs = listing.servers.iter().find(|s| s.name == "docs").unwrap();
    assert_eq!(docs.state, pb::ServerState::AuthorizationRequired as i32);

    // So is the same `sub` from another issuer of the same tenant.
    let status = whoami(&mut client, &other, None)
        .await
        .expect_err("another issuer's caller used the first issuer's upstream token");
    let other_url = authorization_url(&status);

    // Each consents for itself; none disturbs the others.
    let (code, page) = consent(&other_url, "other-worker", consent_port).await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(
        whoami(&mut client, &other, None).await.unwrap(),
        "other-worker"
    );
    assert_eq!(whoami(&mut client, &cluster, None).await.unwrap(), "worker");
    let status = whoami(&mut client, "acme-token", Some(WORKER))
        .await
        .unwrap_err();
    authorization_url(&status);
    gateway.shutdown().await;

    // The rows of `docs` say who vouched for each subject (`svc` holds the
    // tenant's own token).
    let state = StateStore::open_lazy(&state_url, ring()).unwrap();
    let mut subjects: Vec<String> = state
        .token_keys()
        .await
        .unwrap()
        .into_iter()
        .filter(|k| k.server == "docs")
        .map(|k| k.subject)
        .collect();
    subjects.sort();
    assert_eq!(
        subjects,
        [
            format!("jwt:{CLUSTER} {WORKER}"),
            format!("jwt:{OTHER} {WORKER}")
        ]
    );
}

fn ring() -> KeyRing {
    KeyRing::from_base64(&[STATE_KEY]).unwrap()
}

/// Runs `toolgate state migrate-subjects --config CONFIG ARGS...`;
/// returns the exit code and stdout.
fn migrate_cli(config: &std::path::Path, args: &[&str]) -> (i32, String) {
    let output = std::process::Command::new(toolgate_bin())
        .args(["state", "migrate-subjects", "--config"])
        .arg(config)
        .args(args)
        .envs(env())
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test]
async fn tokens_stored_under_a_bare_subject_are_moved_by_migrate_subjects() {
    let upstream = upstream(3600);
    let dir = tempfile::tempdir().unwrap();
    let state_url = format!("sqlite://{}/state.db", dir.path().display());
    let consent_port = free_port();
    let yaml = config(&upstream, &state_url, consent_port, None);
    let config_file = dir.path().join("toolgate.yaml");
    std::fs::write(&config_file, &yaml).unwrap();
    let env = env();

    // Alice consents.
    let gateway = TestGateway::start(&yaml, &env).await;
    let mut client = gateway.client().await;
    let status = whoami(&mut client, "acme-token", Some("alice"))
        .await
        .unwrap_err();
    let (code, page) = consent(&authorization_url(&status), "alice", consent_port).await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(
        whoami(&mut client, "acme-token", Some("alice"))
            .await
            .unwrap(),
        "alice"
    );
    gateway.shutdown().await;

    // Her row as an earlier release stored it: under the bare id.
    let state = StateStore::open_lazy(&state_url, ring()).unwrap();
    let keyed = TokenKey::new("acme", "token:alice", "docs");
    let legacy = TokenKey::new("acme", "alice", "docs");
    let token = state.get_token(&keyed).await.unwrap().unwrap().value;
    state.put_token(&legacy, &token).await.unwrap();
    assert!(state.delete_token(&keyed).await.unwrap());

    // Nothing done: the row is read by nothing, and she consents again.
    let gateway = TestGateway::start(&yaml, &env).await;
    let mut client = gateway.client().await;
    let status = whoami(&mut client, "acme-token", Some("alice"))
        .await
        .expect_err("a bare-subject row served a subject key");
    authorization_url(&status);
    gateway.shutdown().await;

    // An issuer the configuration does not have is refused (a typo would
    // strand the rows); a dry run changes nothing.
    let (code, out) = migrate_cli(&config_file, &["--as", "jwt:https://nowhere.test"]);
    assert_eq!(code, 64, "{out}");
    assert!(out.contains("no `callers.jwt` entry"), "{out}");
    let (code, out) = migrate_cli(&config_file, &["--as", "token", "--dry-run"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("would move 1 token(s)"), "{out}");
    assert!(state.get_token(&legacy).await.unwrap().is_some());

    let (code, out) = migrate_cli(&config_file, &["--as", "token"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("moved 1 token(s) to `token` subject keys"),
        "{out}"
    );
    assert!(state.get_token(&legacy).await.unwrap().is_none());
    // Running it again finds nothing to move.
    let (code, out) = migrate_cli(&config_file, &["--as", "token"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("moved 0 token(s)"), "{out}");

    // Her consent serves her again, without asking.
    let gateway = TestGateway::start(&yaml, &env).await;
    let mut client = gateway.client().await;
    assert_eq!(
        whoami(&mut client, "acme-token", Some("alice"))
            .await
            .unwrap(),
        "alice"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn migrating_keeps_a_newer_consent_the_tenant_itself_and_other_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/state.db", dir.path().display());
    let state = StateStore::open_lazy(&url, ring()).unwrap();
    let key = |tenant: &str, subject: &str| TokenKey::new(tenant, subject, "docs");
    let issuer = "https://issuer.example";
    for (k, value) in [
        (key("acme", "ada"), "old-ada"),
        (key("acme", "bob"), "old-bob"),
        (key("acme", &format!("jwt:{issuer} bob")), "new-bob"),
        (key("acme", ""), "tenant"),
        (key("acme", "token:carol"), "carol"),
        (key("globex", "dan"), "dan"),
    ] {
        state.put_token(&k, value.as_bytes()).await.unwrap();
    }
    let tenants = ["acme".to_owned()];
    let done =
        toolgate::cli::subjects::migrate_subjects(&state, Namespace::Jwt(issuer), &tenants, false)
            .await
            .unwrap();
    assert_eq!((done.moved, done.superseded, done.untouched), (1, 1, 4));
    let value = |k: TokenKey| {
        let state = state.clone();
        async move { state.get_token(&k).await.unwrap().map(|v| v.value) }
    };
    assert_eq!(
        value(key("acme", &format!("jwt:{issuer} ada"))).await,
        Some(b"old-ada".to_vec())
    );
    assert_eq!(
        value(key("acme", &format!("jwt:{issuer} bob"))).await,
        Some(b"new-bob".to_vec()),
        "the consent given under the new key wins"
    );
    for gone in [key("acme", "ada"), key("acme", "bob")] {
        assert_eq!(value(gone).await, None);
    }
    for kept in [
        key("acme", ""),
        key("acme", "token:carol"),
        key("globex", "dan"),
    ] {
        assert!(value(kept.clone()).await.is_some(), "{kept:?}");
    }
}
