//! Callers with workload identity: JWTs from configured issuers select
//! the tenant (a CEL expression over the verified claims) and the subject;
//! keys come from a JWKS endpoint run by the test (axum on 127.0.0.1:0) or
//! a file; every refused token gets UNAUTHENTICATED with its own reason.
//! Keys are generated per test run with the `openssl` CLI (RS256 and
//! ES256), and tokens minted with `jsonwebtoken`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use toolgate::callers::{Caller, CallerIdentity, Subject};
use toolgate::config::Config;
use toolgate::pb;
use toolgate::registry::{Registry, Tenant};

use crate::common::*;

pub(crate) const CLUSTER: &str = "https://kubernetes.default.svc.cluster.local";
const FILES: &str = "https://idp.files.test";

// ---------------------------------------------------------------------------
// Keys and tokens
// ---------------------------------------------------------------------------

/// A private key and its public JWK.
pub(crate) struct TestKey {
    encoding: EncodingKey,
    jwk: Jwk,
    alg: Algorithm,
    kid: String,
}

impl TestKey {
    pub(crate) fn sign(&self, claims: &Value) -> String {
        mint(&self.encoding, self.alg, Some(&self.kid), claims)
    }
}

pub(crate) struct TestKeys {
    pub(crate) rsa1: TestKey,
    rsa2: TestKey,
    /// Same kid as `rsa1`, another key: its signatures do not verify.
    impostor: TestKey,
    ec1: TestKey,
    ec2: TestKey,
}

fn openssl_key(dir: &Path, name: &str, args: &[&str]) -> Vec<u8> {
    let path = dir.join(name);
    let status = std::process::Command::new("openssl")
        .arg("genpkey")
        .args(args)
        .arg("-out")
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the openssl CLI generates the test keys");
    assert!(status.success(), "openssl genpkey {args:?} failed");
    std::fs::read(path).unwrap()
}

fn test_key(pem: &[u8], alg: Algorithm, kid: &str) -> TestKey {
    let encoding = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(pem).unwrap(),
        _ => EncodingKey::from_rsa_pem(pem).unwrap(),
    };
    let mut jwk = Jwk::from_encoding_key(&encoding, alg).unwrap();
    jwk.common.key_id = Some(kid.to_owned());
    TestKey {
        encoding,
        jwk,
        alg,
        kid: kid.to_owned(),
    }
}

/// Keys generated once per test binary run.
pub(crate) fn keys() -> &'static TestKeys {
    static KEYS: OnceLock<TestKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let rsa = ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"];
        let ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
        TestKeys {
            rsa1: test_key(
                &openssl_key(dir.path(), "r1", &rsa),
                Algorithm::RS256,
                "rsa-1",
            ),
            rsa2: test_key(
                &openssl_key(dir.path(), "r2", &rsa),
                Algorithm::RS256,
                "rsa-2",
            ),
            impostor: test_key(
                &openssl_key(dir.path(), "r3", &rsa),
                Algorithm::RS256,
                "rsa-1",
            ),
            ec1: test_key(
                &openssl_key(dir.path(), "e1", &ec),
                Algorithm::ES256,
                "ec-1",
            ),
            ec2: test_key(
                &openssl_key(dir.path(), "e2", &ec),
                Algorithm::ES256,
                "ec-2",
            ),
        }
    })
}

fn mint(key: &EncodingKey, alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The claims of a Kubernetes service-account token for `namespace`.
pub(crate) fn sa_claims(namespace: &str) -> Value {
    let now = now();
    json!({
        "iss": CLUSTER,
        "aud": ["toolgate"],
        "sub": format!("system:serviceaccount:{namespace}:worker"),
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "kubernetes.io": {
            "namespace": namespace,
            "serviceaccount": {"name": "worker", "uid": "8d6f3c1e"},
        },
    })
}

/// `claims` with `key` set to `value` (or removed when `value` is null).
pub(crate) fn with(mut claims: Value, key: &str, value: Value) -> Value {
    let object = claims.as_object_mut().unwrap();
    if value.is_null() {
        object.remove(key);
    } else {
        object.insert(key.to_owned(), value);
    }
    claims
}

fn jwks(keys: &[&TestKey]) -> Value {
    serde_json::to_value(JwkSet {
        keys: keys.iter().map(|k| k.jwk.clone()).collect(),
    })
    .unwrap()
}

// ---------------------------------------------------------------------------
// The JWKS endpoint
// ---------------------------------------------------------------------------

/// A JWKS endpoint on 127.0.0.1: serves `document`, counts fetches, and
/// answers 503 while `down`.
struct JwksServer {
    url: String,
    document: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl JwksServer {
    async fn start(document: Value) -> JwksServer {
        let document = Arc::new(Mutex::new(document));
        let fetches = Arc::new(AtomicUsize::new(0));
        let down = Arc::new(AtomicBool::new(false));
        let state = (document.clone(), fetches.clone(), down.clone());
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let (document, fetches, down) = state.clone();
                async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    if down.load(Ordering::SeqCst) {
                        return (http::StatusCode::SERVICE_UNAVAILABLE, String::new());
                    }
                    let body = document.lock().unwrap().to_string();
                    (http::StatusCode::OK, body)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        JwksServer {
            url,
            document,
            fetches,
            down,
            task,
        }
    }

    fn serve(&self, document: Value) {
        *self.document.lock().unwrap() = document;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------
// Gateways
// ---------------------------------------------------------------------------

/// The `callers:` block: the cluster issuer on `jwks_url` (tenant from the
/// namespace claim, subject `sub`), and a file issuer (ES256 only, tenant
/// from `team`, subject from `email`).
fn callers_yaml(jwks_url: &str, url_options: &str, jwks_file: &Path) -> String {
    format!(
        r#"callers:
  jwt:
    - issuer: "{CLUSTER}"
      audiences: [toolgate]
      jwks: {{ url: "{jwks_url}"{url_options} }}
      tenant: 'claims["kubernetes.io"].namespace'
    - issuer: "{FILES}"
      audiences: [toolgate, other]
      algorithms: [ES256]
      clock_skew: "30s"
      jwks: {{ file: "{}" }}
      tenant: claims.team
      subject: 'has(claims.email) ? claims.email : null'
"#,
        jwks_file.display()
    )
}

fn tenants_yaml(acme: &str, globex: &str) -> String {
    // globex has no static token: its callers are JWT callers only.
    format!(
        "tenants:\n  - name: acme\n    tokens: [acme-token, static.looks.jwt]\n    servers:\n      - name: a\n        url: \"{acme}\"\n  - name: globex\n    servers:\n      - name: g\n        url: \"{globex}\"\n"
    )
}

struct Setup {
    jwks: JwksServer,
    file: PathBuf,
    _dir: tempfile::TempDir,
    gateway: TestGateway,
    _servers: (McpServer, McpServer),
}

async fn setup(url_options: &str) -> Setup {
    let k = keys();
    let jwks = JwksServer::start(jwks(&[&k.rsa1])).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks_doc_text(&[&k.ec1])).unwrap();
    let acme = serve_mcp(TestServer::new(&["echo"])).await;
    let globex = serve_mcp(TestServer::new(&["ping"])).await;
    let yaml = format!(
        "{}{}",
        callers_yaml(&jwks.url, url_options, &file),
        tenants_yaml(&acme.url, &globex.url)
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    Setup {
        jwks,
        file,
        _dir: dir,
        gateway,
        _servers: (acme, globex),
    }
}

pub(crate) fn jwks_doc_text(keys: &[&TestKey]) -> String {
    jwks(keys).to_string()
}

async fn list_with(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    token: &str,
) -> Result<Vec<String>, tonic::Status> {
    client
        .list_tools(authed(token, pb::ListToolsRequest::default()))
        .await
        .map(|r| names(&r.into_inner()))
}

/// Lists with `token` until the tenant's catalog holds a tool (its server
/// connects in the background), bounded.
async fn listed(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    token: &str,
) -> Vec<String> {
    let started = Instant::now();
    loop {
        let names = list_with(client, token)
            .await
            .expect("the token is accepted");
        if !names.is_empty() {
            return names;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the tenant's server never connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that `token` is refused with `code` and `reason`, and that the
/// token appears nowhere in the status.
async fn refused(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    token: &str,
    code: tonic::Code,
    expected: &str,
) -> tonic::Status {
    let status = list_with(client, token)
        .await
        .expect_err(&format!("a token refused with {expected}"));
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (code, expected),
        "{status:?}"
    );
    let signature = token.rsplit('.').next().unwrap_or(token);
    assert!(
        signature.is_empty() || !format!("{status:?}").contains(signature),
        "the status quotes the token"
    );
    status
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test]
async fn jwt_callers_reach_the_tenant_their_claims_name_and_static_tokens_still_work() {
    let s = setup("").await;
    let k = keys();
    let mut client = s.gateway.client().await;
    // RS256 from the JWKS URL; the tenant is the namespace claim.
    assert_eq!(
        listed(&mut client, &k.rsa1.sign(&sa_claims("acme"))).await,
        ["a__echo"]
    );
    assert_eq!(
        listed(&mut client, &k.rsa1.sign(&sa_claims("globex"))).await,
        ["g__ping"]
    );
    // ES256 from the JWKS file; the tenant is the `team` claim.
    let now = now();
    let file_claims = json!({"iss": FILES, "aud": "other", "sub": "u-1", "exp": now + 60, "team": "globex", "email": "ada@example.com"});
    assert_eq!(
        listed(&mut client, &k.ec1.sign(&file_claims)).await,
        ["g__ping"]
    );
    // Static tokens work as before, one shaped like a JWT too (static
    // tokens are tried first).
    assert_eq!(listed(&mut client, "acme-token").await, ["a__echo"]);
    assert_eq!(listed(&mut client, "static.looks.jwt").await, ["a__echo"]);
    let err = list_with(&mut client, "not-a-token").await.unwrap_err();
    assert_eq!(reason(&err), "UNAUTHENTICATED");
    // Calls run too, for the tenant the token names.
    let token = k.rsa1.sign(&sa_claims("acme"));
    invoke(&mut client, &token, "a__echo", "{}").await.unwrap();
    let err = invoke(&mut client, &token, "g__ping", "{}")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    s.gateway.shutdown().await;
}

#[tokio::test]
async fn every_refused_jwt_is_unauthenticated_with_its_reason() {
    let s = setup("").await;
    let k = keys();
    let mut client = s.gateway.client().await;
    listed(&mut client, &k.rsa1.sign(&sa_claims("acme"))).await;
    use tonic::Code::{InvalidArgument, Unauthenticated};
    let now = now();
    let acme = sa_claims("acme");
    let cases: Vec<(&str, String)> = vec![
        // exp an hour ago (skew 60 s).
        (
            "TOKEN_EXPIRED",
            k.rsa1.sign(&with(acme.clone(), "exp", json!(now - 3600))),
        ),
        // nbf in an hour.
        (
            "TOKEN_NOT_YET_VALID",
            k.rsa1.sign(&with(acme.clone(), "nbf", json!(now + 3600))),
        ),
        (
            "TOKEN_AUDIENCE",
            k.rsa1
                .sign(&with(acme.clone(), "aud", json!("someone-else"))),
        ),
        (
            "TOKEN_AUDIENCE",
            k.rsa1.sign(&with(acme.clone(), "aud", Value::Null)),
        ),
        (
            "TOKEN_ISSUER",
            k.rsa1
                .sign(&with(acme.clone(), "iss", json!("https://evil.test"))),
        ),
        (
            "TOKEN_ISSUER",
            k.rsa1.sign(&with(acme.clone(), "iss", Value::Null)),
        ),
        // A kid the JWKS does not hold (it is fetched again: still unknown).
        ("TOKEN_KEY_UNKNOWN", k.rsa2.sign(&acme)),
        // Unsigned.
        ("TOKEN_ALGORITHM", unsigned(&acme)),
        // HMAC with a guessed secret: never accepted.
        (
            "TOKEN_ALGORITHM",
            mint(
                &EncodingKey::from_secret(b"guess"),
                Algorithm::HS256,
                Some("rsa-1"),
                &acme,
            ),
        ),
        // ES256 signed by a key whose kid names an RSA key.
        (
            "TOKEN_ALGORITHM",
            mint(&k.ec1.encoding, Algorithm::ES256, Some("rsa-1"), &acme),
        ),
        // The namespace names no tenant; the claim is missing.
        ("TOKEN_TENANT_UNKNOWN", k.rsa1.sign(&sa_claims("initech"))),
        (
            "TOKEN_TENANT_UNKNOWN",
            k.rsa1
                .sign(&with(acme.clone(), "kubernetes.io", Value::Null)),
        ),
        // Signed by another key under the same kid.
        ("TOKEN_INVALID", k.impostor.sign(&acme)),
        (
            "TOKEN_INVALID",
            k.rsa1.sign(&with(acme.clone(), "exp", Value::Null)),
        ),
        ("TOKEN_INVALID", "e30.e30.e30".to_owned()),
    ];
    for (expected, token) in &cases {
        refused(&mut client, token, Unauthenticated, expected).await;
    }
    // The file issuer accepts ES256 only.
    let file_claims =
        json!({"iss": FILES, "aud": "toolgate", "sub": "u-1", "exp": now + 60, "team": "acme"});
    let rs256 = mint(
        &k.rsa1.encoding,
        Algorithm::RS256,
        Some("ec-1"),
        &file_claims,
    );
    refused(&mut client, &rs256, Unauthenticated, "TOKEN_ALGORITHM").await;
    // Its subject expression must give a valid subject.
    let bad_subject = k
        .ec1
        .sign(&with(file_claims.clone(), "email", json!("has space")));
    refused(
        &mut client,
        &bad_subject,
        Unauthenticated,
        "TOKEN_SUBJECT_INVALID",
    )
    .await;
    // x-toolgate-subject may repeat the JWT's subject, never change it.
    let token = k.rsa1.sign(&acme);
    let with_subject = |subject: &str| {
        let mut request = authed(&token, pb::ListToolsRequest::default());
        request
            .metadata_mut()
            .insert("x-toolgate-subject", subject.parse().unwrap());
        request
    };
    let err = client
        .list_tools(with_subject("someone-else"))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (InvalidArgument, "INVALID_SUBJECT")
    );
    client
        .list_tools(with_subject("system:serviceaccount:acme:worker"))
        .await
        .expect("the same subject is accepted");
    s.gateway.shutdown().await;
}

/// `{"alg":"none"}` + claims + an empty signature.
fn unsigned(claims: &Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(claims.to_string())
    )
}

#[tokio::test]
async fn a_rotated_key_is_picked_up_through_the_kid_refresh() {
    let s = setup(", min_refresh_interval: \"0s\"").await;
    let k = keys();
    let mut client = s.gateway.client().await;
    listed(&mut client, &k.rsa1.sign(&sa_claims("acme"))).await;
    let before = s.jwks.fetches();
    // The issuer rotates: rsa-2 joins, then rsa-1 leaves.
    s.jwks.serve(jwks(&[&k.rsa1, &k.rsa2]));
    assert_eq!(
        list_with(&mut client, &k.rsa2.sign(&sa_claims("acme")))
            .await
            .unwrap(),
        ["a__echo"]
    );
    assert_eq!(
        s.jwks.fetches(),
        before + 1,
        "one fetch for the unknown kid"
    );
    // Known now: no further fetch.
    list_with(&mut client, &k.rsa2.sign(&sa_claims("globex")))
        .await
        .unwrap();
    assert_eq!(s.jwks.fetches(), before + 1);
    s.jwks.serve(jwks(&[&k.rsa2]));
    // rsa-1 stays cached until the set is fetched again (refresh_interval,
    // or another unknown kid).
    list_with(&mut client, &k.rsa1.sign(&sa_claims("acme")))
        .await
        .unwrap();
    refused(
        &mut client,
        &k.ec1.sign(&sa_claims("acme")),
        tonic::Code::Unauthenticated,
        "TOKEN_KEY_UNKNOWN",
    )
    .await;
    refused(
        &mut client,
        &k.rsa1.sign(&sa_claims("acme")),
        tonic::Code::Unauthenticated,
        "TOKEN_KEY_UNKNOWN",
    )
    .await;
    s.gateway.shutdown().await;
}

#[tokio::test]
async fn unknown_key_ids_refetch_the_jwks_at_most_once_per_min_refresh_interval() {
    let s = setup(", min_refresh_interval: \"1h\"").await;
    let k = keys();
    let mut client = s.gateway.client().await;
    listed(&mut client, &k.rsa1.sign(&sa_claims("acme"))).await;
    assert_eq!(s.jwks.fetches(), 1, "fetched once, at start");
    s.jwks.serve(jwks(&[&k.rsa1, &k.rsa2]));
    for kid in ["x1", "x2", "x3", "rsa-2"] {
        let token = mint(
            &k.rsa2.encoding,
            Algorithm::RS256,
            Some(kid),
            &sa_claims("acme"),
        );
        refused(
            &mut client,
            &token,
            tonic::Code::Unauthenticated,
            "TOKEN_KEY_UNKNOWN",
        )
        .await;
    }
    assert_eq!(s.jwks.fetches(), 1, "unknown kids do not hammer the issuer");
    s.gateway.shutdown().await;
}

#[tokio::test]
async fn cached_keys_keep_working_while_the_jwks_endpoint_is_down() {
    // Keys are due for a refresh every 100 ms: every call finds them stale.
    let s = setup(", refresh_interval: \"100ms\", min_refresh_interval: \"0s\"").await;
    let k = keys();
    let mut client = s.gateway.client().await;
    listed(&mut client, &k.rsa1.sign(&sa_claims("acme"))).await;
    s.jwks.down.store(true, Ordering::SeqCst);
    let fetches = s.jwks.fetches();
    let started = Instant::now();
    // Until background refreshes have failed (bounded), and after.
    while s.jwks.fetches() < fetches + 2 {
        assert_eq!(
            list_with(&mut client, &k.rsa1.sign(&sa_claims("acme")))
                .await
                .expect("a cached key verifies while the endpoint is down"),
            ["a__echo"]
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no refresh was tried"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    list_with(&mut client, &k.rsa1.sign(&sa_claims("acme")))
        .await
        .expect("still verified");
    // A key not cached cannot be checked: UNAVAILABLE (retry), not a
    // verdict on the token.
    let status = refused(
        &mut client,
        &k.rsa2.sign(&sa_claims("acme")),
        tonic::Code::Unavailable,
        "JWKS_UNAVAILABLE",
    )
    .await;
    use tonic_types::StatusExt;
    assert!(status.get_details_retry_info().is_some());
    // Back up, with the new key: served.
    s.jwks.serve(jwks(&[&k.rsa1, &k.rsa2]));
    s.jwks.down.store(false, Ordering::SeqCst);
    let started = Instant::now();
    loop {
        // The retry waits out the failed fetch's floor (1 s), bounded.
        match list_with(&mut client, &k.rsa2.sign(&sa_claims("acme"))).await {
            Ok(names) => {
                assert_eq!(names, ["a__echo"]);
                break;
            }
            Err(status) => assert_eq!(reason(&status), "JWKS_UNAVAILABLE", "{status:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never recovered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.gateway.shutdown().await;
}

#[tokio::test]
async fn a_jwks_file_is_read_again_when_it_changes() {
    let s = setup("").await;
    let k = keys();
    let mut client = s.gateway.client().await;
    let claims =
        json!({"iss": FILES, "aud": "toolgate", "sub": "u-1", "exp": now() + 60, "team": "acme"});
    listed(&mut client, &k.ec1.sign(&claims)).await;
    refused(
        &mut client,
        &k.ec2.sign(&claims),
        tonic::Code::Unauthenticated,
        "TOKEN_KEY_UNKNOWN",
    )
    .await;
    // Replaced as a mounted ConfigMap is: a new file renamed over the old.
    let tmp = s.file.with_extension("tmp");
    std::fs::write(&tmp, jwks_doc_text(&[&k.ec2])).unwrap();
    std::fs::rename(&tmp, &s.file).unwrap();
    assert_eq!(
        list_with(&mut client, &k.ec2.sign(&claims)).await.unwrap(),
        ["a__echo"]
    );
    s.gateway.shutdown().await;
}

/// The tenant, subject and caller the authentication layer put into a
/// request's extensions, and whether the credential went through.
#[derive(Debug, Clone)]
struct Seen {
    tenant: String,
    subject: Subject,
    caller: Caller,
    authorization_forwarded: bool,
}

async fn through_layer(
    registry: &Arc<Registry>,
    headers: &[(&str, &str)],
) -> Result<Seen, tonic::Status> {
    use tower::{Layer as _, Service as _, ServiceExt as _};
    let seen: Arc<Mutex<Option<Seen>>> = Arc::default();
    let record = seen.clone();
    let inner = tower::service_fn(move |request: http::Request<()>| {
        let extensions = request.extensions();
        *record.lock().unwrap() = Some(Seen {
            tenant: extensions.get::<Arc<Tenant>>().unwrap().name.clone(),
            subject: extensions.get::<Subject>().unwrap().clone(),
            caller: extensions.get::<Caller>().unwrap().clone(),
            authorization_forwarded: request.headers().contains_key("authorization"),
        });
        async {
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::default()))
        }
    });
    let mut service = toolgate::grpc::AuthLayer::new(registry.clone()).layer(inner);
    let mut request = http::Request::new(());
    for (name, value) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return Err(status);
    }
    Ok(seen.lock().unwrap().clone().expect("the inner service ran"))
}

#[tokio::test]
async fn the_subject_and_claims_of_a_jwt_reach_the_call() {
    let k = keys();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks_doc_text(&[&k.ec1])).unwrap();
    let jwks_server = JwksServer::start(jwks(&[&k.rsa1])).await;
    let yaml = format!(
        "{}tenants:\n  - name: acme\n    tokens: [acme-token]\n  - name: globex\n",
        callers_yaml(&jwks_server.url, "", &file)
    );
    let env: HashMap<String, String> = HashMap::new();
    let config = Config::from_yaml(&yaml, "test.yaml", Path::new("."), &env).unwrap();
    let registry = Registry::start(
        &config,
        Arc::new(env),
        Arc::new(toolgate::telemetry::Metrics::new()),
    );

    let token = k.rsa1.sign(&sa_claims("globex"));
    let bearer = format!("Bearer {token}");
    let seen = through_layer(&registry, &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(seen.tenant, "globex");
    assert_eq!(
        seen.subject.id(),
        Some("system:serviceaccount:globex:worker")
    );
    assert_eq!(
        seen.caller.identity,
        CallerIdentity::Jwt {
            issuer: CLUSTER.to_owned(),
            subject: "system:serviceaccount:globex:worker".to_owned(),
        }
    );
    assert_eq!(
        seen.caller.claims["kubernetes.io"]["serviceaccount"]["name"],
        "worker"
    );
    assert!(
        !seen.authorization_forwarded,
        "the credential stops at the layer"
    );

    // The file issuer's subject is the email claim, or the tenant itself.
    let claims = json!({"iss": FILES, "aud": "toolgate", "sub": "u-7", "exp": now() + 60, "team": "acme", "email": "ada@example.com"});
    let bearer = format!("Bearer {}", k.ec1.sign(&claims));
    let seen = through_layer(&registry, &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(
        (seen.tenant.as_str(), seen.subject.id()),
        ("acme", Some("ada@example.com"))
    );
    let bearer = format!("Bearer {}", k.ec1.sign(&with(claims, "email", Value::Null)));
    let seen = through_layer(&registry, &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(seen.subject, Subject::tenant());

    // A static token: the header names the subject, as before.
    let seen = through_layer(
        &registry,
        &[
            ("authorization", "Bearer acme-token"),
            ("x-toolgate-subject", "user-9"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        (seen.tenant.as_str(), seen.subject.id()),
        ("acme", Some("user-9"))
    );
    assert_eq!(seen.caller.identity, CallerIdentity::Token { index: 0 });
    assert_eq!(*seen.caller.claims, json!({}));

    let err = through_layer(&registry, &[]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    registry.shutdown().await;
}

#[tokio::test]
async fn a_reload_keeps_the_cached_keys_of_an_unchanged_issuer() {
    let k = keys();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks_doc_text(&[&k.ec1])).unwrap();
    let jwks_server = JwksServer::start(jwks(&[&k.rsa1])).await;
    let env: HashMap<String, String> = HashMap::new();
    let config = |audiences: &str, url: &str| {
        let yaml = format!(
            "{}tenants:\n  - name: acme\n    tokens: [acme-token]\n",
            callers_yaml(url, "", &file).replace("audiences: [toolgate]", audiences)
        );
        Config::from_yaml(&yaml, "test.yaml", Path::new("."), &env).unwrap()
    };
    let registry = Registry::start(
        &config("audiences: [toolgate]", &jwks_server.url),
        Arc::new(env.clone()),
        Arc::new(toolgate::telemetry::Metrics::new()),
    );
    let bearer = format!("Bearer {}", k.rsa1.sign(&sa_claims("acme")));
    through_layer(&registry, &[("authorization", &bearer)])
        .await
        .unwrap();
    jwks_server.down.store(true, Ordering::SeqCst);
    // Another audience, same keys' source: the cache is kept, so the key
    // verifies with the endpoint down.
    registry.apply(&config("audiences: [toolgate, more]", &jwks_server.url));
    through_layer(&registry, &[("authorization", &bearer)])
        .await
        .expect("the cached key survived the reload");
    // Another source: a new, empty cache, and the endpoint is down.
    let moved = format!("{}?v=2", jwks_server.url);
    registry.apply(&config("audiences: [toolgate]", &moved));
    let err = through_layer(&registry, &[("authorization", &bearer)])
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "JWKS_UNAVAILABLE");
    registry.shutdown().await;
}

#[test]
fn bad_callers_configuration_names_the_path() {
    let env: HashMap<String, String> = HashMap::new();
    let check = |callers: &str, expected: &str| {
        let yaml = format!("callers:\n  jwt:\n{callers}tenants:\n  - name: acme\n");
        let err = Config::from_yaml(&yaml, "test.yaml", Path::new("."), &env)
            .expect_err(expected)
            .to_string();
        assert!(err.contains(expected), "{expected:?} not in {err}");
    };
    let entry = |extra: &str| {
        format!(
            "    - issuer: https://i.test\n      audiences: [toolgate]\n      jwks: {{ url: \"https://i.test/jwks\" }}\n      tenant: claims.ns\n{extra}"
        )
    };
    check(
        &entry("      subject: 'claims.'\n"),
        "callers.jwt[0].subject: not a valid CEL expression",
    );
    check(
        &entry("").replace("tenant: claims.ns", "tenant: request.ns"),
        "callers.jwt[0].tenant: names the variable `request`",
    );
    check(
        &entry("      algorithms: [HS256]\n"),
        "callers.jwt[0].algorithms[0]: `HS256` is symmetric",
    );
    check(
        &entry("      algorithms: [none]\n"),
        "callers.jwt[0].algorithms[0]: `none`",
    );
    check(
        &entry("      clock_skew: 1h\n"),
        "callers.jwt[0].clock_skew: at most",
    );
    check(
        &entry("").replace("https://i.test/jwks", "http://idp.example/jwks"),
        "callers.jwt[0].jwks.url: must be https",
    );
    check(
        &entry("").replace("audiences: [toolgate]", "audiences: []"),
        "callers.jwt[0].audiences: at least one audience",
    );
    check(
        &entry("").replace(
            "{ url: \"https://i.test/jwks\" }",
            "{ file: /nonexistent/jwks.json }",
        ),
        "callers.jwt[0].jwks.file: cannot read /nonexistent/jwks.json",
    );
    check(
        &format!("{}{}", entry(""), entry("")),
        "callers.jwt[1].issuer: issuer `https://i.test` is configured twice",
    );
    // Without callers.jwt a tenant still needs a token.
    let err = Config::from_yaml("tenants:\n  - name: acme\n", "t.yaml", Path::new("."), &env)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tenants[0].tokens: at least one token is required"),
        "{err}"
    );
}

/// The four governance parts together: a JWT caller (tenant and subject
/// from its claims) calls a tool its policy allows and whose definition is
/// approved; a tool the policy denies and a tool not approved are refused;
/// every call leaves one audit record naming the JWT caller, never its token.
#[tokio::test]
async fn a_jwt_caller_calls_an_approved_permitted_tool_and_every_call_is_audited() {
    use toolgate::approvals::{self, Approval, Approvals, ServerApprovals};

    let k = keys();
    let dir = tempfile::tempdir().unwrap();
    let jwks_file = dir.path().join("jwks.json");
    std::fs::write(&jwks_file, jwks_doc_text(&[&k.ec1])).unwrap();
    let approvals_file = dir.path().join("approvals.yaml");
    let audit_file = dir.path().join("audit.jsonl");
    let server = serve_mcp(TestServer::new(&["echo", "delete", "fresh"])).await;
    let yaml = format!(
        r#"callers:
  jwt:
    - issuer: "{FILES}"
      audiences: [toolgate]
      algorithms: [ES256]
      jwks: {{ file: "{jwks}" }}
      tenant: claims.team
      subject: 'has(claims.email) ? claims.email : null'
approvals:
  file: "{approvals}"
audit:
  path: "{audit}"
tenants:
  - name: acme
    policy:
      - deny: ["s__delete"]
        when: '!("admin" in claims.groups)'
    servers:
      - name: s
        url: "{url}"
        definitions: approved
"#,
        jwks = jwks_file.display(),
        approvals = approvals_file.display(),
        audit = audit_file.display(),
        url = server.url,
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let now = now();
    let claims = json!({
        "iss": FILES, "aud": "toolgate", "sub": "worker-7", "team": "acme",
        "email": "alice@example.com", "groups": ["dev"],
        "iat": now, "nbf": now, "exp": now + 600,
    });
    let jwt = k.ec1.sign(&claims);
    let admin = k
        .ec1
        .sign(&with(claims.clone(), "groups", json!(["admin"])));
    // Every InvokeTool this test makes, to compare with the records.
    let made = std::sync::atomic::AtomicUsize::new(0);
    let call_as = |token: &str, name: &'static str| {
        made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let request = authed(
            token,
            pb::InvokeToolRequest {
                name: name.to_owned(),
                arguments_json: r#"{"text":"hi"}"#.to_owned(),
                ..Default::default()
            },
        );
        let mut client = client.clone();
        async move { client.invoke_tool(request).await }
    };
    let call = |name: &'static str| call_as(&jwt, name);

    // Nothing is approved yet (no file): the tool is withheld; its current
    // hash is in the refusal.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        match call("s__echo").await {
            Err(status) if reason(&status) == "DEFINITION_NOT_APPROVED" => break status,
            other if std::time::Instant::now() > deadline => panic!("{other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let hash_of = |status: &tonic::Status| {
        use tonic_types::StatusExt;
        status.get_details_error_info().unwrap().metadata["definition_hash"].clone()
    };
    let echo_hash = hash_of(&status);
    // `delete` is not this caller's to call (the policy answers first); an
    // admin's refusal shows its hash.
    assert_eq!(
        reason(&call("s__delete").await.unwrap_err()),
        "TOOL_NOT_PERMITTED"
    );
    let delete_hash = hash_of(&call_as(&admin, "s__delete").await.unwrap_err());

    // The reviewer approves `echo` and `delete` (not `fresh`).
    let mut tools = ServerApprovals::new();
    for (name, hash) in [("s__echo", &echo_hash), ("s__delete", &delete_hash)] {
        tools.insert(
            name.to_owned(),
            Approval {
                hash: hash.clone(),
                description: String::new(),
            },
        );
    }
    let mut approved = Approvals::new();
    approved.set_server("acme", "s", tools);
    approvals::write(&approvals_file, &approved).unwrap();

    // The approved, permitted tool runs for the JWT caller.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match call("s__echo").await {
            Ok(answer) => break answer.into_inner(),
            Err(status) if std::time::Instant::now() > deadline => panic!("{status:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(answer.text.contains("hi"), "{}", answer.text);
    // Approved but denied by the policy for this caller's claims.
    let denied = call("s__delete").await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    assert_eq!(reason(&denied), "TOOL_NOT_PERMITTED");
    // The same approved tool runs for a caller whose claims the policy allows.
    call_as(&admin, "s__delete")
        .await
        .expect("an admin may call the approved `delete`");
    // Permitted but not approved.
    let withheld = call("s__fresh").await.unwrap_err();
    assert_eq!(reason(&withheld), "DEFINITION_NOT_APPROVED");
    // The caller's listing shows exactly what it may call.
    let listing = client
        .list_tools(authed(&jwt, pb::ListToolsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&listing), vec!["s__echo".to_owned()]);
    gateway.shutdown().await;

    // One audit record per call, naming the JWT caller and its subject.
    let text = std::fs::read_to_string(&audit_file).unwrap();
    assert!(!text.contains(&jwt), "the token is never audited");
    let records: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let calls: Vec<&Value> = records.iter().filter(|r| r["kind"] == "call").collect();
    assert_eq!(
        calls.len(),
        made.load(std::sync::atomic::Ordering::Relaxed),
        "one record per call: {records:#?}"
    );
    let ok: Vec<&&Value> = calls
        .iter()
        .filter(|r| r["outcome"] == "ok" && r["tool"] == "s__echo")
        .collect();
    assert_eq!(ok.len(), 1, "{records:#?}");
    let ok = ok[0];
    assert_eq!(ok["tenant"], "acme");
    assert_eq!(ok["subject"], format!("jwt:{FILES} alice@example.com"));
    assert_eq!(
        ok["caller"],
        json!({"kind": "jwt", "issuer": FILES, "subject": "worker-7"})
    );
    assert_eq!(ok["tool"], "s__echo");
    assert_eq!(ok["definition_hash"], echo_hash.as_str());
    assert_eq!(ok["sent"], true);
    let refused = |tool: &str, why: &str| {
        calls
            .iter()
            .filter(|r| r["tool"] == tool && r["reason"] == why && r["sent"] == false)
            .count()
    };
    assert_eq!(
        refused("s__delete", "TOOL_NOT_PERMITTED"),
        2,
        "{records:#?}"
    );
    assert!(
        calls
            .iter()
            .any(|r| r["tool"] == "s__delete" && r["outcome"] == "ok"),
        "{records:#?}"
    );
    assert!(
        refused("s__fresh", "DEFINITION_NOT_APPROVED") >= 1,
        "{records:#?}"
    );
    assert!(
        refused("s__echo", "DEFINITION_NOT_APPROVED") >= 1,
        "{records:#?}"
    );
}

/// A `WatchTools` stream of a JWT caller ends with UNAUTHENTICATED /
/// TOKEN_EXPIRED at the token's `exp` plus the issuer's clock skew, on its
/// own (no catalog change wakes it), and sends no snapshot after that.
#[tokio::test]
async fn a_jwt_watch_ends_when_the_token_expires() {
    let k = keys();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks_doc_text(&[&k.ec1])).unwrap();
    let acme = serve_mcp(TestServer::new(&["echo"])).await;
    let globex = serve_mcp(TestServer::new(&["ping"])).await;
    let yaml = format!(
        r#"callers:
  jwt:
    - issuer: "{FILES}"
      audiences: [toolgate]
      algorithms: [ES256]
      clock_skew: "1s"
      jwks: {{ file: "{}" }}
      tenant: claims.team
{}"#,
        file.display(),
        tenants_yaml(&acme.url, &globex.url)
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let exp = now() + 3;
    let token = k.ec1.sign(
        &json!({"iss": FILES, "aud": "toolgate", "sub": "w-1", "exp": exp, "team": "globex"}),
    );
    // The server is up first: the stream then has nothing new to send.
    assert_eq!(listed(&mut client, &token).await, ["g__ping"]);
    let mut stream = client
        .watch_tools(authed(&token, pb::WatchToolsRequest::default()))
        .await
        .expect("the token is accepted")
        .into_inner();
    let first = stream.message().await.unwrap().expect("a first snapshot");
    assert_eq!(names(&first), ["g__ping"]);
    let ends_at = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(exp + 1).unwrap());
    let ended = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream ended within 10 s");
    let at = std::time::SystemTime::now();
    let status = ended.expect_err("no snapshot after the first: the stream ends");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (tonic::Code::Unauthenticated, "TOKEN_EXPIRED"),
        "{status:?}"
    );
    // Not before `exp` + skew, and without waiting for anything else.
    assert!(
        at >= ends_at,
        "ended {:?} before exp + skew",
        ends_at.duration_since(at)
    );
    let late = at.duration_since(ends_at).unwrap();
    eprintln!("the stream ended {late:?} after exp + clock_skew");
    assert!(
        late < Duration::from_millis(1500),
        "ended {late:?} after exp + skew"
    );
    assert!(
        stream.message().await.unwrap().is_none(),
        "nothing follows the end"
    );
    gateway.shutdown().await;
}
