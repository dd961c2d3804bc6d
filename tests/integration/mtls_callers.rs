//! Callers identified by their client certificate (`callers.mtls`): a CA
//! made here (rcgen) issues SPIFFE client certificates
//! `spiffe://cluster.local/ns/<ns>/sa/<sa>`; the worked example's entry
//! names the tenant from the namespace (`cert.spiffe_id.path.split("/")[2]`).
//! End to end, the `toolgate` binary serves TLS on its gRPC port and a
//! Python grpcio client presents the certificates; in process,
//! `callers::authenticate` and `callers::recheck` are asked directly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use toolgate::callers::{CallerError, CallerIdentity, CertError, Presented};
use toolgate::config::Config;
use toolgate::registry::Registry;

use crate::common::*;

const NAMESPACE_TENANT: &str = r#"cert.spiffe_id.path.split("/")[2]"#;
const ACME_WORKER: &str = "spiffe://cluster.local/ns/acme/sa/worker";

/// A CA and the certificates it issued, as PEM files in a directory.
struct Pki {
    ca: pki::TestCa,
    dir: PathBuf,
}

/// A client certificate: its files and its DER.
struct ClientCert {
    cert: PathBuf,
    key: PathBuf,
    der: Vec<u8>,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let ca = pki::TestCa::new("test mesh CA");
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki {
            ca,
            dir: dir.to_owned(),
        }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Issues a certificate named `name` (files `<name>.pem`, `<name>-key.pem`).
    fn issue(
        &self,
        name: &str,
        sans: Vec<rcgen::SanType>,
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> ClientCert {
        self.issue_with(name, sans, usage, rcgen::CertificateParams::default())
    }

    fn issue_with(
        &self,
        name: &str,
        sans: Vec<rcgen::SanType>,
        usage: rcgen::ExtendedKeyUsagePurpose,
        mut params: rcgen::CertificateParams,
    ) -> ClientCert {
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![usage];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let (cert, key) = self.ca.sign(params);
        let files = ClientCert {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}-key.pem")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    /// A client certificate whose one URI SAN is `spiffe_id`.
    fn workload(&self, name: &str, spiffe_id: &str) -> ClientCert {
        self.issue(
            name,
            vec![rcgen::SanType::URI(spiffe_id.try_into().unwrap())],
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// The gateway's own certificate, for `localhost` and 127.0.0.1.
    fn server(&self) -> ClientCert {
        self.issue(
            "gateway",
            vec![
                rcgen::SanType::DnsName("localhost".try_into().unwrap()),
                rcgen::SanType::IpAddress([127, 0, 0, 1].into()),
            ],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        )
    }
}

/// A configuration with TLS on the gRPC port (`client_auth: optional`),
/// the worked example's `callers.mtls` entry, tenants `acme` and `globex`
/// (each with a static token and the server `t` at `url`) and `extra`
/// appended (at the top level).
fn config_yaml(pki: &Pki, gateway: &ClientCert, url: &str, extra: &str) -> String {
    format!(
        r#"grpc:
  tls:
    cert_file: "{cert}"
    key_file: "{key}"
    client_ca_file: "{ca}"
    client_auth: optional
callers:
  mtls:
    - trust_domain: cluster.local
      tenant: '{NAMESPACE_TENANT}'
tenants:
  - name: acme
    tokens: [acme-token]
    servers:
      - name: t
        url: "{url}"
  - name: globex
    tokens: [globex-token]
    servers:
      - name: t
        url: "{url}"
{extra}"#,
        cert = gateway.cert.display(),
        key = gateway.key.display(),
        ca = pki.ca_file().display(),
    )
}

/// What a Python grpcio call answered: its exit code and its JSON output.
async fn grpcio(
    port: u16,
    pki: &Pki,
    cert: Option<&ClientCert>,
    token: Option<&str>,
) -> (i32, Value) {
    let mut command = tokio::process::Command::new(python());
    command
        .arg(fixture("python/grpc_client.py"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .arg("--ca")
        .arg(pki.ca_file())
        .args(["--server-name", "localhost"])
        .kill_on_drop(true);
    if let Some(cert) = cert {
        command
            .arg("--cert")
            .arg(&cert.cert)
            .arg("--key")
            .arg(&cert.key);
    }
    command.args(["invoke", "t__echo", r#"{"text": "hi"}"#]);
    command.env_remove("TOOLGATE_TOKEN");
    if let Some(token) = token {
        command.env("TOOLGATE_TOKEN", token);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("grpc_client.py finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let answer = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&output.stderr)));
    (output.status.code().unwrap_or(-1), answer)
}

/// The reason of a refusal grpc_client.py printed.
fn refusal(answer: &Value) -> (&str, &str) {
    (
        answer["error"]["code"].as_str().unwrap_or_default(),
        answer["error"]["details"][0]["reason"]
            .as_str()
            .unwrap_or_default(),
    )
}

/// The audit file's call records, parsed.
fn call_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|r| r["kind"] == "call")
        .collect()
}

#[tokio::test]
async fn a_spiffe_certificate_names_its_tenant_and_subject_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let gateway = pki.server();
    let worker = pki.workload("worker", ACME_WORKER);
    let bot = pki.workload("bot", "spiffe://cluster.local/ns/globex/sa/bot");
    let stranger = pki.workload("stranger", "spiffe://evil.example/ns/acme/sa/worker");
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let port = free_port();
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\naudit:\n  path: \"{}\"\n{}",
            audit.display(),
            config_yaml(&pki, &gateway, &server.url, "")
        ),
    )
    .unwrap();
    let log = dir.path().join("toolgate.log");
    let _child = serve_binary(&config, &log, &[]);
    wait_for_port(port).await;

    // The certificate alone (no token): tenant acme, the SPIFFE ID as the
    // subject. Bounded wait for the server to connect.
    let started = Instant::now();
    let answer = loop {
        let (code, answer) = grpcio(port, &pki, Some(&worker), None).await;
        if code == 0 {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30) && refusal(&answer).1 == "TOOL_NOT_FOUND",
            "{answer} {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(answer["is_error"], false, "{answer}");
    let record = call_records(&audit).pop().expect("the call's audit record");
    assert_eq!(record["tenant"], "acme", "{record}");
    assert_eq!(
        record["subject"],
        format!("cert:cluster.local {ACME_WORKER}"),
        "{record}"
    );
    assert_eq!(record["caller"]["kind"], "cert", "{record}");
    assert_eq!(record["caller"]["id"], ACME_WORKER, "{record}");
    assert_eq!(record["caller"]["trust_domain"], "cluster.local");
    assert_eq!(
        record["caller"]["sha256"].as_str().map(str::len),
        Some(64),
        "{record}"
    );

    // Another namespace is another tenant.
    let (code, answer) = grpcio(port, &pki, Some(&bot), None).await;
    assert_eq!(code, 0, "{answer}");
    assert_eq!(call_records(&audit).pop().unwrap()["tenant"], "globex");

    // A certificate of another trust domain (the same CA) is refused.
    let (code, answer) = grpcio(port, &pki, Some(&stranger), None).await;
    assert_eq!(code, 3, "{answer}");
    assert_eq!(
        refusal(&answer),
        ("UNAUTHENTICATED", "CERTIFICATE_UNMATCHED"),
        "{answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("evil.example"),
        "{answer}"
    );

    // A token of another tenant than the certificate's is refused; the
    // certificate's own tenant's token is the token caller, as without.
    let (code, answer) = grpcio(port, &pki, Some(&worker), Some("globex-token")).await;
    assert_eq!(code, 3, "{answer}");
    assert_eq!(
        refusal(&answer),
        ("UNAUTHENTICATED", "CALLER_IDENTITY_CONFLICT"),
        "{answer}"
    );
    let (code, answer) = grpcio(port, &pki, Some(&worker), Some("acme-token")).await;
    assert_eq!(code, 0, "{answer}");
    let record = call_records(&audit).pop().unwrap();
    assert_eq!(record["caller"]["kind"], "token", "{record}");
    assert_eq!(record["tenant"], "acme", "{record}");

    // `client_auth: optional`: a token caller without a certificate still
    // calls; without either, the call is refused.
    let (code, answer) = grpcio(port, &pki, None, Some("globex-token")).await;
    assert_eq!(code, 0, "{answer}");
    assert_eq!(call_records(&audit).pop().unwrap()["tenant"], "globex");
    let (code, answer) = grpcio(port, &pki, None, None).await;
    assert_eq!(code, 3, "{answer}");
    assert_eq!(refusal(&answer), ("UNAUTHENTICATED", "UNAUTHENTICATED"));

    // No certificate in the log, nor its key.
    let log_text = std::fs::read_to_string(&log).unwrap();
    let pem = std::fs::read_to_string(&worker.cert).unwrap();
    let body = pem.lines().nth(1).unwrap();
    assert!(!log_text.contains(body), "the certificate is in the log");
}

/// A registry over `yaml` (TLS files in `pki`'s directory).
fn registry(yaml: &str, dir: &Path) -> (Arc<Registry>, Config) {
    let env: HashMap<String, String> = HashMap::new();
    let config = Config::from_yaml(yaml, "test.yaml", dir, &env)
        .unwrap_or_else(|e| panic!("test config invalid: {e}"));
    let registry = Registry::start(
        &config,
        Arc::new(env),
        Arc::new(toolgate::telemetry::Metrics::new()),
    );
    (registry, config)
}

fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            )
        })
        .collect()
}

/// The reason the gRPC status table gives a refused caller.
fn reason_of(error: &CallerError) -> &'static str {
    match error {
        CallerError::Certificate(CertError::Unmatched(_)) => "CERTIFICATE_UNMATCHED",
        CallerError::Certificate(CertError::TenantInvalid(_)) => "CERTIFICATE_TENANT_INVALID",
        CallerError::Certificate(CertError::TenantUnknown(_)) => "CERTIFICATE_TENANT_UNKNOWN",
        CallerError::Certificate(CertError::SubjectInvalid(_)) => "CERTIFICATE_SUBJECT_INVALID",
        CallerError::Certificate(CertError::Conflict(_)) => "CALLER_IDENTITY_CONFLICT",
        CallerError::Certificate(CertError::Expired(_)) => "CERTIFICATE_EXPIRED",
        CallerError::InvalidSubject(_) => "INVALID_SUBJECT",
        _ => "other",
    }
}

#[tokio::test]
async fn each_certificate_refusal_has_its_reason_and_a_reload_rechecks() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let gateway = pki.server();
    let worker = pki.workload("worker", ACME_WORKER);
    let unknown = pki.workload("unknown", "spiffe://cluster.local/ns/initech/sa/x");
    let short = pki.workload("short", "spiffe://cluster.local/x");
    let url = "http://127.0.0.1:9/mcp";
    let (registry, _) = registry(&config_yaml(&pki, &gateway, url, ""), dir.path());
    let authenticate = |pairs: &'static [(&'static str, &'static str)], der: Option<Vec<u8>>| {
        let registry = registry.clone();
        async move { toolgate::callers::authenticate(&registry, &headers(pairs), der.as_deref()).await }
    };

    let ok = authenticate(&[], Some(worker.der.clone())).await.unwrap();
    assert_eq!(ok.tenant.name, "acme");
    assert_eq!(ok.subject.id(), Some(ACME_WORKER));
    assert!(matches!(
        &ok.caller.identity,
        CallerIdentity::Certificate { id, .. } if id == ACME_WORKER
    ));
    assert_eq!(ok.caller.claims["spiffe_id"]["path"], "/ns/acme/sa/worker");
    assert!(matches!(ok.presented, Presented::Certificate(_)));
    // A header may repeat the certificate's subject, not name another.
    authenticate(
        &[("x-toolgate-subject", ACME_WORKER)],
        Some(worker.der.clone()),
    )
    .await
    .unwrap();
    let other = authenticate(&[("x-toolgate-subject", "alice")], Some(worker.der.clone()))
        .await
        .unwrap_err();
    assert_eq!(reason_of(&other), "INVALID_SUBJECT");

    let error = authenticate(&[], Some(unknown.der.clone()))
        .await
        .unwrap_err();
    assert_eq!(reason_of(&error), "CERTIFICATE_TENANT_UNKNOWN", "{error}");
    assert!(error.to_string().contains("`initech`"), "{error}");
    let error = authenticate(&[], Some(short.der.clone()))
        .await
        .unwrap_err();
    assert_eq!(reason_of(&error), "CERTIFICATE_TENANT_INVALID", "{error}");
    assert!(
        error.to_string().contains("callers.mtls[0].tenant"),
        "{error}"
    );
    let error = authenticate(
        &[("authorization", "Bearer globex-token")],
        Some(worker.der.clone()),
    )
    .await
    .unwrap_err();
    assert_eq!(reason_of(&error), "CALLER_IDENTITY_CONFLICT", "{error}");
    let with_token = authenticate(
        &[("authorization", "Bearer acme-token")],
        Some(worker.der.clone()),
    )
    .await
    .unwrap();
    assert!(matches!(
        with_token.caller.identity,
        CallerIdentity::Token { index: 0 }
    ));

    // What a long-lived stream asks at a reload: the tenant the caller
    // is of now (a stream ends when it is another) or the refusal.
    let recheck = |a: &toolgate::callers::Authenticated<Arc<toolgate::registry::Tenant>>| {
        toolgate::callers::recheck(&registry, &a.presented, &a.caller, &a.subject)
    };
    assert_eq!(recheck(&ok).unwrap().name, "acme");
    assert_eq!(recheck(&with_token).unwrap().name, "acme");
    let moved = config_yaml(&pki, &gateway, url, "").replace(NAMESPACE_TENANT, r#""globex""#);
    let env: HashMap<String, String> = HashMap::new();
    registry.apply(&Config::from_yaml(&moved, "test.yaml", dir.path(), &env).unwrap());
    assert_eq!(recheck(&ok).unwrap().name, "globex");
    let conflict = recheck(&with_token).unwrap_err();
    assert_eq!(reason_of(&conflict), "CALLER_IDENTITY_CONFLICT");
    let strict = config_yaml(&pki, &gateway, url, "")
        .replace("trust_domain: cluster.local", "trust_domain: prod.example");
    registry.apply(&Config::from_yaml(&strict, "test.yaml", dir.path(), &env).unwrap());
    let gone = recheck(&ok).unwrap_err();
    assert_eq!(reason_of(&gone), "CERTIFICATE_UNMATCHED", "{gone}");
    // The token caller's certificate now matches no entry: the token alone.
    assert_eq!(recheck(&with_token).unwrap().name, "acme");

    // A stream's certificate caller ends when its certificate expires
    // (the handshake checked it only at the start).
    registry.apply(
        &Config::from_yaml(
            &config_yaml(&pki, &gateway, url, ""),
            "test.yaml",
            dir.path(),
            &env,
        )
        .unwrap(),
    );
    let mut params = rcgen::CertificateParams::default();
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let expired = pki.issue_with(
        "expired",
        vec![rcgen::SanType::URI(ACME_WORKER.try_into().unwrap())],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        params,
    );
    let old = authenticate(&[], Some(expired.der.clone())).await.unwrap();
    let error = recheck(&old).unwrap_err();
    assert_eq!(reason_of(&error), "CERTIFICATE_EXPIRED", "{error}");
    assert_eq!(recheck(&ok).unwrap().name, "acme");
    registry.shutdown().await;
}
