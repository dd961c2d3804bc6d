//! The admin API (`toolgate.admin.v1.Admin`) of a real gateway process on
//! its own listener: tenants and secrets in the state store (SQLite, and
//! PostgreSQL), versions, every refusal with its reason, admin callers
//! (admin tokens, JWTs admitted by `callers.jwt[].admin`; a tenant's token
//! refused), secrets never readable back, audit records of every change.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;
use toolgate::pb::admin as pb;
use toolgate::pb::admin::admin_client::AdminClient;

use crate::common::*;
use crate::jwt::{CLUSTER, jwks_doc_text, keys, sa_claims};

const ADMIN: &str = "admin-token-0123456789";
const SECOND_ADMIN: &str = "admin-token-second";
const FILE_TOKEN: &str = "file-tenant-token";
const SECRET_VALUE: &str = "s3cr3t-value-never-shown";

/// A gateway with one file tenant (`acme`), the admin API on `admin_port`
/// and `extra` under `admin:` (admin writes at 1000 a second unless it
/// sets their rate), `audit_extra` under `audit:`.
fn config(dir: &Path, state_url: &str, ports: [u16; 3], extra: &str, audit_extra: &str) -> String {
    let [listen, admin_port, metrics_port] = ports;
    let rate = if extra.contains("write_") {
        ""
    } else {
        "  write_rate_per_second: 1000\n  write_burst: 1000\n"
    };
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, jwks_doc_text(&[&keys().rsa1])).unwrap();
    format!(
        r#"listen: 127.0.0.1:{listen}
metrics:
  listen: 127.0.0.1:{metrics_port}
audit:
  path: "{audit}"
{audit_extra}state:
  url: "{state_url}"
  keys: ["MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="]
admin:
  listen: 127.0.0.1:{admin_port}
  tokens: ["{ADMIN}", "{SECOND_ADMIN}"]
{extra}{rate}callers:
  jwt:
    - issuer: "{CLUSTER}"
      audiences: [toolgate]
      jwks: {{ file: "{jwks}" }}
      tenant: 'claims["kubernetes.io"].namespace'
      admin: 'claims["kubernetes.io"].namespace == "platform"'
tenants:
  - name: acme
    tokens: ["{FILE_TOKEN}"]
    servers:
      - name: a
        url: "http://127.0.0.1:9/mcp"
"#,
        audit = dir.join("audit.jsonl").display(),
        jwks = jwks.display(),
    )
}

struct Admin {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    _child: ChildGuard,
    client: AdminClient<Channel>,
    listen: u16,
    admin_port: u16,
    metrics_port: u16,
    state_url: String,
}

async fn start(state_url: Option<&str>, extra: &str) -> Admin {
    start_with(state_url, extra, "").await
}

async fn start_with(state_url: Option<&str>, extra: &str, audit_extra: &str) -> Admin {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let url = state_url
        .map(str::to_owned)
        .unwrap_or_else(|| format!("sqlite://{}/state.db", path.display()));
    let (listen, admin_port, metrics_port) = (free_port(), free_port(), free_port());
    std::fs::write(
        path.join("config.yaml"),
        config(
            &path,
            &url,
            [listen, admin_port, metrics_port],
            extra,
            audit_extra,
        ),
    )
    .unwrap();
    let child = serve_binary(
        &path.join("config.yaml"),
        &path.join("gateway.log"),
        &[("ADMIN_HOST_VAR", "host-value")],
    );
    wait_for_port(admin_port).await;
    wait_for_port(listen).await;
    let client = AdminClient::connect(format!("http://127.0.0.1:{admin_port}"))
        .await
        .unwrap();
    Admin {
        _dir: dir,
        dir: path,
        _child: child,
        client,
        listen,
        admin_port,
        metrics_port,
        state_url: url,
    }
}

fn as_<T>(token: &str, message: T) -> tonic::Request<T> {
    authed(token, message)
}

fn put(name: &str, spec: &str, expected: &str) -> pb::PutTenantRequest {
    pb::PutTenantRequest {
        name: name.into(),
        spec_yaml: spec.into(),
        expected_version: expected.into(),
    }
}

const SPEC: &str =
    "tokens: [globex-token]\nservers:\n  - name: g\n    url: \"http://127.0.0.1:9/mcp\"\n";

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits (bounded) for the admin records to reach `count`.
async fn admin_records(dir: &Path, count: usize) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let admin: Vec<Value> = records(&dir.join("audit.jsonl"))
            .into_iter()
            .filter(|r| r["kind"] == "admin")
            .collect();
        if admin.len() >= count {
            return admin;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{admin:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tenants: create, get, replace, stale and create-exists refused, list
/// by pages, delete; every change an audit record naming who.
async fn tenants_round_trip(a: &mut Admin) {
    let c = &mut a.client;
    let created = c
        .put_tenant(as_(ADMIN, put("globex", SPEC, "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.name, "globex");
    let v1: i64 = created.version.parse().unwrap();
    let got = c
        .get_tenant(as_(
            ADMIN,
            pb::GetTenantRequest {
                name: "globex".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, created);
    assert_eq!(got.spec_yaml, SPEC);

    let exists = c
        .put_tenant(as_(ADMIN, put("globex", SPEC, "")))
        .await
        .unwrap_err();
    assert_eq!(
        (exists.code(), reason(&exists).as_str()),
        (Code::AlreadyExists, "TENANT_EXISTS")
    );
    let replaced = c
        .put_tenant(as_(SECOND_ADMIN, put("globex", SPEC, &created.version)))
        .await
        .unwrap()
        .into_inner();
    let v2: i64 = replaced.version.parse().unwrap();
    assert!(v2 > v1);
    let stale = c
        .put_tenant(as_(ADMIN, put("globex", SPEC, &created.version)))
        .await
        .unwrap_err();
    assert_eq!(
        (stale.code(), reason(&stale).as_str()),
        (Code::Aborted, "VERSION_MISMATCH")
    );
    let info = stale.get_error_details().error_info().unwrap().clone();
    assert_eq!(info.metadata["current_version"], v2.to_string());
    for bad in ["x", "-1", "0", "1.5"] {
        let e = c
            .put_tenant(as_(ADMIN, put("globex", SPEC, bad)))
            .await
            .unwrap_err();
        assert_eq!(
            (e.code(), reason(&e).as_str()),
            (Code::InvalidArgument, "INVALID_VERSION"),
            "{bad}"
        );
    }
    let missing = c
        .get_tenant(as_(
            ADMIN,
            pb::GetTenantRequest {
                name: "nobody".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (missing.code(), reason(&missing).as_str()),
        (Code::NotFound, "TENANT_NOT_FOUND")
    );

    // Paging: 5 more tenants, pages of 2.
    for i in 0..5 {
        let spec = format!("tokens: [page-token-{i}]\n");
        c.put_tenant(as_(ADMIN, put(&format!("page-{i}"), &spec, "")))
            .await
            .unwrap();
    }
    let mut names = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = c
            .list_tenants(as_(
                ADMIN,
                pb::ListTenantsRequest {
                    page_size: 2,
                    page_token: token.clone(),
                },
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(page.tenants.len() <= 2);
        names.extend(page.tenants.into_iter().map(|t| t.name));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(
        names,
        ["globex", "page-0", "page-1", "page-2", "page-3", "page-4"]
    );
    let all = c
        .list_tenants(as_(ADMIN, pb::ListTenantsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((all.tenants.len(), all.next_page_token.as_str()), (6, ""));
    let bad = c
        .list_tenants(as_(
            ADMIN,
            pb::ListTenantsRequest {
                page_size: 1,
                page_token: "nonsense".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (bad.code(), reason(&bad).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_TOKEN")
    );

    // Delete: stale refused, then deleted; a version read before never
    // matches the tenant created again.
    let e = c
        .delete_tenant(as_(
            ADMIN,
            pb::DeleteTenantRequest {
                name: "globex".into(),
                expected_version: created.version.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    let deleted = c
        .delete_tenant(as_(
            ADMIN,
            pb::DeleteTenantRequest {
                name: "globex".into(),
                expected_version: replaced.version.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.version, replaced.version);
    let again = c
        .put_tenant(as_(ADMIN, put("globex", SPEC, "")))
        .await
        .unwrap()
        .into_inner();
    assert!(again.version.parse::<i64>().unwrap() > v2);
    let e = c
        .delete_tenant(as_(
            ADMIN,
            pb::DeleteTenantRequest {
                name: "globex".into(),
                expected_version: replaced.version.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::Aborted,
        "ABA: the old version does not match the new tenant"
    );
    c.delete_tenant(as_(
        ADMIN,
        pb::DeleteTenantRequest {
            name: "globex".into(),
            expected_version: String::new(),
        },
    ))
    .await
    .unwrap();
    let e = c
        .delete_tenant(as_(
            ADMIN,
            pb::DeleteTenantRequest {
                name: "globex".into(),
                expected_version: String::new(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::NotFound, "TENANT_NOT_FOUND")
    );

    let records = admin_records(&a.dir, 10).await;
    let first = &records[0];
    assert_eq!(first["v"], 8);
    // Admin changes are in the replica's one hash chain, with its calls
    // and refusals.
    assert!(first["seq"].as_u64().is_some(), "{first}");
    toolgate::audit::verify::verify_files(&[a.dir.join("audit.jsonl")]).unwrap();
    assert_eq!(first["rpc"], "PutTenant");
    assert_eq!(first["tenant"], "globex");
    assert_eq!(first["new_version"], v1);
    assert!(first.get("old_version").is_none());
    assert_eq!(
        first["caller"],
        json!({"kind": "admin_token", "admin_token_index": 0})
    );
    let second = &records[1];
    assert_eq!(
        (
            second["old_version"].as_i64(),
            second["new_version"].as_i64()
        ),
        (Some(v1), Some(v2))
    );
    assert_eq!(second["caller"]["admin_token_index"], 1);
    let delete = records.iter().find(|r| r["rpc"] == "DeleteTenant").unwrap();
    assert_eq!(delete["old_version"], v2);
    assert!(delete.get("new_version").is_none());
    for r in &records {
        assert!(
            !r.to_string().contains("globex-token"),
            "no spec in a record: {r}"
        );
    }
}

/// Every error of a spec, each with its path, in a BadRequest; what a
/// tenant of the admin API may not reach; names of file tenants and their
/// tokens refused naming both.
async fn refusals(a: &mut Admin) {
    let c = &mut a.client;
    let spec = "tokens: [ok-token]\nservers:\n  - name: s\n    command: [\"/bin/true\"]\n  - name: e\n    url: \"http://127.0.0.1:9/mcp\"\n    headers:\n      X-Key: { env: ADMIN_HOST_VAR }\n  - name: bad name\n    url: \"http://127.0.0.1:9/mcp\"\n";
    let e = c
        .put_tenant(as_(ADMIN, put("initech", spec, "")))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::InvalidArgument, "INVALID_SPEC")
    );
    let details = e.get_error_details();
    let fields: Vec<String> = details
        .bad_request()
        .expect("a BadRequest detail")
        .field_violations
        .iter()
        .map(|v| v.field.clone())
        .collect();
    for path in [
        "tenants[initech].servers[0].command",
        "tenants[initech].servers[1].headers.X-Key",
    ] {
        assert!(fields.iter().any(|f| f == path), "{path} in {fields:?}");
        assert!(e.message().contains(path), "{}", e.message());
    }
    assert!(fields.len() >= 3, "every error: {fields:?}");
    assert!(!e.message().contains("host-value"));

    let e = c
        .put_tenant(as_(ADMIN, put("not a name", SPEC, "")))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "INVALID_NAME");
    let e = c
        .put_tenant(as_(ADMIN, put("x", "name: y\n", "")))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "INVALID_SPEC");
    assert!(e.message().contains("tenants[x].name"), "{}", e.message());

    // The file's tenant: its name and its token.
    let e = c
        .put_tenant(as_(ADMIN, put("acme", SPEC, "")))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::FailedPrecondition, "TENANT_DEFINED_ELSEWHERE")
    );
    assert!(
        e.message().contains("acme") && e.message().contains("configuration file"),
        "{}",
        e.message()
    );
    let spec = format!("tokens: [own-token, \"{FILE_TOKEN}\"]\n");
    let e = c
        .put_tenant(as_(ADMIN, put("hooli", &spec, "")))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::FailedPrecondition, "TOKEN_TAKEN")
    );
    assert!(
        e.message().contains("tenants[hooli].tokens[1]") && e.message().contains("acme"),
        "{}",
        e.message()
    );
    assert!(!e.message().contains(FILE_TOKEN));
    // An admin token as a worker's token: the tenant's workers would hold
    // an admin credential.
    let spec = format!("tokens: [own-token, \"{SECOND_ADMIN}\"]\n");
    let e = c
        .put_tenant(as_(ADMIN, put("hooli", &spec, "")))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::InvalidArgument, "INVALID_SPEC")
    );
    let fields: Vec<String> = e
        .get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default();
    assert_eq!(fields, ["tenants[hooli].tokens[1]"], "{e:?}");
    assert!(e.message().contains("admin.tokens"), "{}", e.message());
    assert!(!e.message().contains(SECOND_ADMIN));
    // A store tenant's token given to another store tenant.
    c.put_tenant(as_(ADMIN, put("hooli", "tokens: [hooli-token]\n", "")))
        .await
        .unwrap();
    let e = c
        .put_tenant(as_(ADMIN, put("pied", "tokens: [hooli-token]\n", "")))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "TOKEN_TAKEN");
    assert!(e.message().contains("hooli"), "{}", e.message());
    c.delete_tenant(as_(
        ADMIN,
        pb::DeleteTenantRequest {
            name: "hooli".into(),
            expected_version: String::new(),
        },
    ))
    .await
    .unwrap();
}

/// A spec with a stdio server and a host variable, allowed by the file.
async fn host_access_when_allowed() {
    let mut a = start(
        None,
        "  allow_stdio_servers: true\n  host_secrets:\n    env: [ADMIN_HOST_VAR]\n",
    )
    .await;
    let spec = "servers:\n  - name: s\n    command: [\"/bin/true\"]\n  - name: e\n    url: \"http://127.0.0.1:9/mcp\"\n    headers:\n      X-Key: { env: ADMIN_HOST_VAR }\n";
    a.client
        .put_tenant(as_(ADMIN, put("initech", spec, "")))
        .await
        .unwrap();
    let e = a
        .client
        .put_tenant(as_(ADMIN, put("other", "servers:\n  - name: e\n    url: \"http://127.0.0.1:9/mcp\"\n    headers:\n      X-Key: { env: HOME }\n", "")))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "INVALID_SPEC");
    assert!(
        e.message()
            .contains("tenants[other].servers[0].headers.X-Key"),
        "{}",
        e.message()
    );
}

/// Who may call: admin tokens and admitted JWTs; a tenant's token, a
/// wrong token, no token: UNAUTHENTICATED; a JWT whose issuer's `admin`
/// expression is false: PERMISSION_DENIED.
async fn callers(a: &mut Admin) {
    let c = &mut a.client;
    let list = |token: Option<&str>| {
        let mut request = tonic::Request::new(pb::ListTenantsRequest::default());
        if let Some(t) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        request
    };
    for token in [None, Some(FILE_TOKEN), Some("wrong"), Some("hooli-token")] {
        let e = c.list_tenants(list(token)).await.unwrap_err();
        assert_eq!(
            (e.code(), reason(&e).as_str()),
            (Code::Unauthenticated, "ADMIN_UNAUTHENTICATED"),
            "{token:?}"
        );
    }
    let platform = keys().rsa1.sign(&sa_claims("platform"));
    c.list_tenants(list(Some(&platform))).await.unwrap();
    let created = c
        .put_tenant(as_(
            &platform,
            put("jwt-made", SPEC.replace("globex", "jwt").as_str(), ""),
        ))
        .await
        .unwrap()
        .into_inner();
    let worker = keys().rsa1.sign(&sa_claims("acme"));
    let e = c.list_tenants(list(Some(&worker))).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::PermissionDenied, "ADMIN_NOT_PERMITTED")
    );
    let e = c.list_tenants(list(Some("a.b.c"))).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::Unauthenticated, "ADMIN_TOKEN_INVALID")
    );
    let records = admin_records(&a.dir, 1).await;
    let record = records.iter().find(|r| r["tenant"] == "jwt-made").unwrap();
    assert_eq!(
        record["caller"],
        json!({"kind": "jwt", "issuer": CLUSTER, "subject": "system:serviceaccount:platform:worker"})
    );
    assert_eq!(
        record["new_version"].as_i64().unwrap().to_string(),
        created.version
    );
    // The workers' port has no admin API.
    let mut workers = AdminClient::connect(format!("http://127.0.0.1:{}", a.listen))
        .await
        .unwrap();
    let e = workers.list_tenants(list(Some(ADMIN))).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    // Every request counted by rpc and code.
    let page = scrape(a.metrics_port).await;
    for series in [
        r#"toolgate_admin_requests_total{rpc="ListTenants",code="OK"}"#,
        r#"toolgate_admin_requests_total{rpc="ListTenants",code="UNAUTHENTICATED"}"#,
        r#"toolgate_admin_requests_total{rpc="ListTenants",code="PERMISSION_DENIED"}"#,
        r#"toolgate_admin_requests_total{rpc="PutTenant",code="ALREADY_EXISTS"}"#,
    ] {
        assert!(sample(&page, series).is_some(), "{series} in\n{page}");
    }
}

/// Secrets: write-only, named, referenced, in use, and never shown.
async fn secrets(a: &mut Admin) {
    let c = &mut a.client;
    let put_secret = |tenant: &str, name: &str, value: &[u8]| pb::PutSecretRequest {
        tenant: tenant.into(),
        name: name.into(),
        value: value.to_vec(),
    };
    // Before the spec that reads it.
    let v = c
        .put_secret(as_(
            ADMIN,
            put_secret("vault", "api-key", SECRET_VALUE.as_bytes()),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.version, "1");
    for (name, value, expected) in [
        ("bad name", b"x".as_slice(), "INVALID_NAME"),
        ("empty", b"".as_slice(), "INVALID_SECRET"),
        ("binary", b"\xff\xfe".as_slice(), "INVALID_SECRET"),
    ] {
        let e = c
            .put_secret(as_(ADMIN, put_secret("vault", name, value)))
            .await
            .unwrap_err();
        assert_eq!(
            (e.code(), reason(&e).as_str()),
            (Code::InvalidArgument, expected),
            "{name}"
        );
    }
    let big = vec![b'x'; 64 * 1024 + 1];
    let e = c
        .put_secret(as_(ADMIN, put_secret("vault", "big", &big)))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "INVALID_SECRET");

    let spec = "servers:\n  - name: v\n    url: \"http://127.0.0.1:9/mcp\"\n    headers:\n      X-Key: { stored: api-key }\n      X-Other: { stored: missing }\n";
    let e = c
        .put_tenant(as_(ADMIN, put("vault", spec, "")))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "INVALID_SPEC");
    assert!(
        e.message()
            .contains("tenants[vault].servers[0].headers.X-Other"),
        "{}",
        e.message()
    );
    assert!(!e.message().contains(SECRET_VALUE));
    let spec = "tokens: [{ stored: token }]\nservers:\n  - name: v\n    url: \"http://127.0.0.1:9/mcp\"\n    headers:\n      X-Key: { stored: api-key }\n";
    c.put_secret(as_(ADMIN, put_secret("vault", "token", b"vault-token-1")))
        .await
        .unwrap();
    let t = c
        .put_tenant(as_(ADMIN, put("vault", spec, "")))
        .await
        .unwrap()
        .into_inner();
    // A secret of the tenant's: its version moves.
    c.put_secret(as_(ADMIN, put_secret("vault", "api-key", b"rotated-value")))
        .await
        .unwrap();
    let after = c
        .get_tenant(as_(
            ADMIN,
            pb::GetTenantRequest {
                name: "vault".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(after.version.parse::<i64>().unwrap() > t.version.parse::<i64>().unwrap());
    assert!(!after.spec_yaml.contains("rotated-value"));
    // The token's secret rotated: the token index follows it.
    c.put_secret(as_(ADMIN, put_secret("vault", "token", b"vault-token-2")))
        .await
        .unwrap();
    let store = toolgate::state::StateStore::connect(
        &a.state_url,
        toolgate::state::KeyRing::from_base64(&["MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="])
            .unwrap(),
    )
    .await
    .unwrap();
    let digest = toolgate::callers::TokenDigest::of;
    assert_eq!(
        store
            .tenant_for_token(&digest("vault-token-2"))
            .await
            .unwrap(),
        Some(("vault".to_owned(), 0))
    );
    assert_eq!(
        store
            .tenant_for_token(&digest("vault-token-1"))
            .await
            .unwrap(),
        None
    );
    store.close().await;
    // A token secret that is another tenant's token: refused.
    let e = c
        .put_secret(as_(
            ADMIN,
            put_secret("vault", "token", FILE_TOKEN.as_bytes()),
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "TOKEN_TAKEN");

    let listed = c
        .list_secrets(as_(
            ADMIN,
            pb::ListSecretsRequest {
                tenant: "vault".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<(&str, &str)> = listed
        .secrets
        .iter()
        .map(|s| (s.name.as_str(), s.version.as_str()))
        .collect();
    assert_eq!(names, [("api-key", "2"), ("token", "2")]);
    let e = c
        .delete_secret(as_(
            ADMIN,
            pb::DeleteSecretRequest {
                tenant: "vault".into(),
                name: "api-key".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::FailedPrecondition, "SECRET_IN_USE")
    );
    c.put_secret(as_(ADMIN, put_secret("vault", "unused", b"u")))
        .await
        .unwrap();
    c.delete_secret(as_(
        ADMIN,
        pb::DeleteSecretRequest {
            tenant: "vault".into(),
            name: "unused".into(),
        },
    ))
    .await
    .unwrap();
    let e = c
        .delete_secret(as_(
            ADMIN,
            pb::DeleteSecretRequest {
                tenant: "vault".into(),
                name: "unused".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::NotFound, "SECRET_NOT_FOUND")
    );

    let records = admin_records(&a.dir, 1).await;
    let secret_records: Vec<&Value> = records.iter().filter(|r| r["rpc"] == "PutSecret").collect();
    assert!(secret_records.len() >= 4);
    assert!(secret_records.iter().all(|r| r["secret"].is_string()));
    assert!(
        records
            .iter()
            .any(|r| r["rpc"] == "DeleteSecret" && r["secret"] == "unused")
    );
    // The value is nowhere: not in records, not in the log.
    let audit = std::fs::read_to_string(a.dir.join("audit.jsonl")).unwrap();
    let log = std::fs::read_to_string(a.dir.join("gateway.log")).unwrap();
    for value in [
        SECRET_VALUE,
        "rotated-value",
        "vault-token-1",
        "vault-token-2",
    ] {
        assert!(!audit.contains(value), "{value} in the audit trail");
        assert!(!log.contains(value), "{value} in the log");
    }
    assert!(log.contains("admin: secret written"), "{log}");
}

/// A Python grpcio client (stubs generated from admin.proto with
/// grpc_tools, ErrorInfo read with grpc_status): create, get, list, a
/// refused create and a stale replace with their reasons, delete.
async fn python_client(a: &Admin) {
    let output = tokio::process::Command::new(python())
        .arg(fixture("python/admin_client.py"))
        .args(["--addr", &format!("127.0.0.1:{}", a.admin_port)])
        .args(["--token", ADMIN, "--tenant", "python-made"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["created"]["name"], "python-made", "{out}");
    assert_eq!(out["got"], out["created"]);
    assert!(
        out["listed"]
            .as_array()
            .unwrap()
            .contains(&json!("python-made"))
    );
    assert_eq!(out["exists"]["code"], "ALREADY_EXISTS", "{out}");
    assert_eq!(out["exists"]["reason"], "TENANT_EXISTS");
    assert_eq!(out["exists"]["domain"], "toolgate");
    assert_eq!(
        out["exists"]["metadata"]["current_version"],
        out["created"]["version"]
    );
    assert_eq!(out["stale"]["code"], "ABORTED");
    assert_eq!(out["stale"]["reason"], "VERSION_MISMATCH");
    assert_eq!(out["deleted"], out["replaced"]);
    assert_eq!(out["gone"]["reason"], "TENANT_NOT_FOUND");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_on_sqlite() {
    let mut a = start(None, "").await;
    tenants_round_trip(&mut a).await;
    refusals(&mut a).await;
    callers(&mut a).await;
    secrets(&mut a).await;
    approver_tokens(&mut a).await;
    python_client(&a).await;
    host_access_when_allowed().await;
}

/// A tenant written through the admin API has approver tokens: one reaches
/// the CallApprovalsService while nobody has loaded its tenant (the store
/// indexes it), never the ToolGateway, and no other tenant may take it.
async fn approver_tokens(a: &mut Admin) {
    use toolgate::pb::call_approvals_service_client::CallApprovalsServiceClient;
    let spec = "tokens: [appr-worker-token]\ncall_approvals:\n  approver_tokens:\n    \
                - name: alice\n      token: appr-approver-token\nservers:\n  - name: g\n    \
                url: \"http://127.0.0.1:9/mcp\"\n";
    a.client
        .put_tenant(as_(ADMIN, put("appr", spec, "")))
        .await
        .unwrap();
    let mut approvals =
        CallApprovalsServiceClient::connect(format!("http://127.0.0.1:{}", a.listen))
            .await
            .unwrap();
    let listed = approvals
        .list_call_approvals(authed(
            "appr-approver-token",
            toolgate::pb::ListCallApprovalsRequest::default(),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.approvals.is_empty());
    let status = approvals
        .list_call_approvals(authed(
            "not-an-approver-token",
            toolgate::pb::ListCallApprovalsRequest::default(),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    // Not a caller's token.
    let mut gateway = client_at(a.listen).await;
    let status = gateway
        .list_tools(authed(
            "appr-approver-token",
            toolgate::pb::ListToolsRequest::default(),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    // No other tenant's token may be it.
    let taken = "tokens: [appr-approver-token]\nservers:\n  - name: g\n    url: \"http://127.0.0.1:9/mcp\"\n";
    let status = a
        .client
        .put_tenant(as_(ADMIN, put("appr2", taken, "")))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "TOKEN_TAKEN", "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_on_postgres() {
    let pg = PgCluster::start();
    let mut a = start(Some(&pg.url()), "").await;
    tenants_round_trip(&mut a).await;
    secrets(&mut a).await;
}

/// Admin writes over `admin.write_rate_per_second` are RESOURCE_EXHAUSTED
/// with RetryInfo (reads are not counted); with `audit.required`, a write
/// whose record cannot be written fails and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_writes_are_rate_limited_and_never_unaudited() {
    let a = start_with(
        None,
        "  write_rate_per_second: 1\n  write_burst: 2\n",
        "  required: true\n",
    )
    .await;
    let mut c = a.client.clone();
    let get = |name: &str| {
        as_(
            ADMIN,
            pb::GetTenantRequest {
                name: name.to_owned(),
            },
        )
    };
    // The burst: two writes; reads are not counted.
    for name in ["r1", "r2"] {
        let spec = format!("tokens: [{name}-token]\n");
        c.put_tenant(as_(ADMIN, put(name, &spec, "")))
            .await
            .unwrap();
        c.get_tenant(get(name)).await.unwrap();
    }
    let e = c
        .put_tenant(as_(ADMIN, put("r3", "tokens: [r3-token]\n", "")))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::ResourceExhausted, "ADMIN_RATE_LIMITED"),
        "{e:?}"
    );
    let wait = e
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("RetryInfo");
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(1),
        "{wait:?}"
    );
    assert_eq!(
        c.get_tenant(get("r3")).await.unwrap_err().code(),
        Code::NotFound
    );

    // The audit file replaced by a directory: no record can be written.
    let path = a.dir.join("audit.jsonl");
    std::fs::rename(&path, a.dir.join("audit.jsonl.1")).unwrap();
    std::fs::create_dir(&path).unwrap();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let e = c
            .put_tenant(as_(ADMIN, put("r3", "tokens: [r3-token]\n", "")))
            .await
            .unwrap_err();
        assert_eq!(
            (e.code(), reason(&e).as_str()),
            (Code::Unavailable, "AUDIT_UNAVAILABLE"),
            "{e:?}"
        );
        assert!(e.get_details_retry_info().is_some(), "{e:?}");
        assert_eq!(
            c.get_tenant(get("r3")).await.unwrap_err().code(),
            Code::NotFound,
            "a write whose record was not written changed nothing"
        );
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let e = c
        .delete_tenant(as_(
            ADMIN,
            pb::DeleteTenantRequest {
                name: "r1".into(),
                expected_version: String::new(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "AUDIT_UNAVAILABLE", "{e:?}");
    c.get_tenant(get("r1")).await.unwrap();

    // Writable again: a refusal's record finds the sink again, and the
    // next write is made and recorded.
    std::fs::remove_dir(&path).unwrap();
    let mut tries = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        match c
            .put_tenant(as_(ADMIN, put("r3", "tokens: [r3-token]\n", "")))
            .await
        {
            Ok(_) => break,
            Err(e) => assert_eq!(reason(&e), "AUDIT_UNAVAILABLE", "{e:?}"),
        }
        tries += 1;
        assert!(tries < 3, "still refused after the sink came back");
    }
    let written: Vec<Value> = records(&path)
        .into_iter()
        .filter(|r| r["kind"] == "admin")
        .collect();
    let last = written.last().expect("the write's record");
    assert_eq!(
        (&last["tenant"], &last["outcome"]),
        (&"r3".into(), &"ok".into())
    );
    for refused in &written[..written.len() - 1] {
        assert_eq!(refused["outcome"], "refused", "{refused}");
        assert_eq!(refused["reason"], "AUDIT_UNAVAILABLE", "{refused}");
    }
}

/// In process: the admin listener answers its health service and stops
/// with the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_stops_with_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let yaml = format!(
        "state:\n  url: \"sqlite://{}/state.db\"\n  keys: [\"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\"]\nadmin:\n  listen: 127.0.0.1:{admin_port}\n  tokens: [\"{ADMIN}\"]\ntenants: []\n",
        dir.path().display()
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    wait_for_port(admin_port).await;
    let channel = Channel::from_shared(format!("http://127.0.0.1:{admin_port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "toolgate.admin.v1.Admin".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serving.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let mut client = AdminClient::new(channel);
    client
        .put_tenant(as_(ADMIN, put("first", "tokens: [first-token]\n", "")))
        .await
        .unwrap();
    gateway.shutdown().await;
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", admin_port)).await;
    assert!(
        refused.is_err(),
        "the admin listener is closed after shutdown"
    );
}
