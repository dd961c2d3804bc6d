//! Per-tool policy (`tenants[].policy`): each caller sees and calls only
//! what the tenant's ordered rules let it, through every catalog RPC and
//! both invoke RPCs, from Rust and from a Python grpcio client; bad rules
//! are configuration errors naming their path; views have their own
//! stable catalog versions; a reload that changes only the policy reaches
//! open watches.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rmcp::model::{Tool, ToolAnnotations};
use toolgate::pb;

use crate::common::*;

const OPS: &str = "ops-token";
const DOCS: &str = "docs-token";
const OPEN: &str = "open-token";

/// `ops`: deploy (no hints), status (read-only), delete_env (destructive),
/// restart (explicitly not destructive); `docs`: search (read-only),
/// publish (no hints).
async fn servers() -> (McpServer, McpServer) {
    let hinted = |name: &str, annotations: ToolAnnotations| {
        let mut t = tool(name);
        t.annotations = Some(annotations);
        t
    };
    let ops: Vec<Tool> = vec![
        tool("deploy"),
        annotated("status", true, "Shows the status."),
        hinted("delete_env", ToolAnnotations::new().destructive(true)),
        hinted(
            "restart",
            ToolAnnotations::new().read_only(false).destructive(false),
        ),
    ];
    let docs: Vec<Tool> = vec![
        annotated("search", true, "Searches the docs."),
        tool("publish"),
    ];
    (
        serve_mcp(TestServer::new(&[]).with_tools(ops)).await,
        serve_mcp(TestServer::new(&[]).with_tools(docs)).await,
    )
}

/// Tenant `acme` (tokens OPS and DOCS, the given policy) and tenant
/// `open` (token OPEN, no policy) over the same two servers.
fn yaml(ops: &McpServer, docs: &McpServer, policy: &str) -> String {
    let servers = format!(
        "      - name: ops\n        url: \"{}\"\n      - name: docs\n        url: \"{}\"\n",
        ops.url, docs.url
    );
    format!(
        "tenants:\n  - name: acme\n    tokens: [{OPS}, {DOCS}]\n    servers:\n{servers}    policy:\n{policy}\
         \n  - name: open\n    tokens: [{OPEN}]\n    servers:\n{servers}"
    )
}

/// `message` as the caller with `token`, acting for `subject` if any.
fn as_caller<T>(token: &str, subject: Option<&str>, message: T) -> tonic::Request<T> {
    let mut request = authed(token, message);
    if let Some(subject) = subject {
        request
            .metadata_mut()
            .insert("x-toolgate-subject", subject.parse().unwrap());
    }
    request
}

async fn list_as(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    token: &str,
    subject: Option<&str>,
) -> pb::ListToolsResponse {
    client
        .list_tools(as_caller(token, subject, pb::ListToolsRequest::default()))
        .await
        .expect("ListTools")
        .into_inner()
}

async fn invoke_as(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    token: &str,
    subject: Option<&str>,
    request: pb::InvokeToolRequest,
) -> Result<pb::InvokeToolResponse, tonic::Status> {
    client
        .invoke_tool(as_caller(token, subject, request))
        .await
        .map(tonic::Response::into_inner)
}

fn call(name: &str) -> pb::InvokeToolRequest {
    pb::InvokeToolRequest {
        name: name.to_owned(),
        arguments_json: "{}".to_owned(),
        ..Default::default()
    }
}

/// Asserts PERMISSION_DENIED / TOOL_NOT_PERMITTED naming the tool and
/// nothing of the rule.
fn assert_not_permitted(result: Result<pb::InvokeToolResponse, tonic::Status>, tool: &str) {
    use tonic_types::StatusExt;
    let status = result.expect_err("the call is refused");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert_eq!(reason(&status), "TOOL_NOT_PERMITTED");
    assert!(status.message().contains(tool), "{}", status.message());
    for secret in ["subject", "startsWith", "policy[", "ops-"] {
        assert!(
            !status.message().contains(secret),
            "the message tells nothing of the rule: {}",
            status.message()
        );
    }
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.metadata.get("tool").map(String::as_str), Some(tool));
}

/// Operators (subject `ops-…`) get `ops`; nobody else does; the tenant
/// itself (no subject) only gets read-only tools.
const ROLE_POLICY: &str = concat!(
    "      - allow: \"ops__*\"\n",
    "        when: \"subject.startsWith('ops-')\"\n",
    "      - deny: [\"ops__*\"]\n",
    "      - deny: \"*\"\n",
    "        when: \"!tool.annotations.read_only && subject == ''\"\n",
);

#[tokio::test]
async fn callers_of_one_tenant_see_and_call_only_what_the_policy_lets_them() {
    let (ops, docs) = servers().await;
    let gateway = TestGateway::start(&yaml(&ops, &docs, ROLE_POLICY), &[]).await;
    let mut client = gateway.client().await;

    let operator = list_as(&mut client, OPS, Some("ops-alice")).await;
    let writer = list_as(&mut client, DOCS, Some("bob")).await;
    let itself = list_as(&mut client, OPS, None).await;
    let open = list_as(&mut client, OPEN, None).await;
    assert_eq!(
        names(&operator),
        [
            "docs__publish",
            "docs__search",
            "ops__delete_env",
            "ops__deploy",
            "ops__restart",
            "ops__status"
        ]
    );
    assert_eq!(names(&writer), ["docs__publish", "docs__search"]);
    assert_eq!(names(&itself), ["docs__search"]);
    assert_eq!(names(&open), names(&operator));
    // Per-server counts are the caller's.
    let counts = |l: &pb::ListToolsResponse| -> HashMap<String, u32> {
        l.servers
            .iter()
            .map(|s| (s.name.clone(), s.tool_count))
            .collect()
    };
    assert_eq!(counts(&writer)["ops"], 0);
    assert_eq!(counts(&writer)["docs"], 2);
    assert_eq!(counts(&operator)["ops"], 4);

    // Calls follow the listing, for both invoke RPCs.
    assert!(
        invoke_as(&mut client, OPS, Some("ops-alice"), call("ops__deploy"))
            .await
            .is_ok()
    );
    assert_not_permitted(
        invoke_as(&mut client, DOCS, Some("bob"), call("ops__deploy")).await,
        "ops__deploy",
    );
    assert!(
        invoke_as(&mut client, DOCS, Some("bob"), call("docs__publish"))
            .await
            .is_ok()
    );
    assert_not_permitted(
        invoke_as(&mut client, OPS, None, call("docs__publish")).await,
        "docs__publish",
    );
    let mut stream = client
        .invoke_tool_stream(as_caller(DOCS, Some("bob"), call("ops__delete_env")))
        .await
        .expect("the stream opens")
        .into_inner();
    let refused = match stream.message().await {
        Err(status) => status,
        Ok(event) => panic!("expected a refusal, got {event:?}"),
    };
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(reason(&refused), "TOOL_NOT_PERMITTED");
    // A name in no catalog is still NOT_FOUND.
    let missing = invoke_as(&mut client, DOCS, Some("bob"), call("ops__nothing"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    // SearchTools and WatchTools show the same view, with its version.
    let found = client
        .search_tools(as_caller(
            DOCS,
            Some("bob"),
            pb::SearchToolsRequest {
                // Matches every tool: hidden ones must not come back.
                query: "tool docs status".to_owned(),
                limit: 100,
                filter: None,
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let mut searched: Vec<String> = found
        .results
        .iter()
        .map(|r| r.tool.as_ref().unwrap().name.clone())
        .collect();
    searched.sort();
    assert_eq!(searched, names(&writer));
    assert_eq!(found.catalog_version, writer.catalog_version);
    let mut watch = client
        .watch_tools(as_caller(
            DOCS,
            Some("bob"),
            pb::WatchToolsRequest::default(),
        ))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("a first snapshot")
        .unwrap()
        .unwrap();
    assert_eq!(names(&first), names(&writer));
    assert_eq!(first.catalog_version, writer.catalog_version);
    gateway.shutdown().await;
}

#[tokio::test]
async fn views_have_stable_versions_of_their_own_and_pins_use_them() {
    let (ops, docs) = servers().await;
    let gateway = TestGateway::start(&yaml(&ops, &docs, ROLE_POLICY), &[]).await;
    let mut client = gateway.client().await;

    let open = list_as(&mut client, OPEN, None).await;
    let operator = list_as(&mut client, OPS, Some("ops-alice")).await;
    let writer = list_as(&mut client, DOCS, Some("bob")).await;
    let other_writer = list_as(&mut client, OPS, Some("carol")).await;
    let itself = list_as(&mut client, OPS, None).await;
    // A caller who sees everything has the catalog's own version.
    assert_eq!(operator.catalog_version, open.catalog_version);
    // An unchanged view keeps its version; equal views share one
    // (whichever token); different views differ.
    assert_eq!(
        list_as(&mut client, DOCS, Some("bob"))
            .await
            .catalog_version,
        writer.catalog_version
    );
    assert_eq!(other_writer.catalog_version, writer.catalog_version);
    let versions = [
        &open.catalog_version,
        &writer.catalog_version,
        &itself.catalog_version,
    ];
    assert_eq!(
        versions
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        3,
        "{versions:?}"
    );

    // A plan pinned to the caller's own view version runs.
    let pinned = |version: &str| pb::InvokeToolRequest {
        catalog_version: version.to_owned(),
        ..call("docs__publish")
    };
    assert!(
        invoke_as(
            &mut client,
            DOCS,
            Some("bob"),
            pinned(&writer.catalog_version)
        )
        .await
        .is_ok()
    );
    // A version this caller was never served is unknown, and the status
    // gives the caller's current version.
    use tonic_types::StatusExt;
    let unknown = invoke_as(
        &mut client,
        DOCS,
        Some("bob"),
        pinned("0123456789abcdef01234567"),
    )
    .await
    .unwrap_err();
    assert_eq!(reason(&unknown), "CATALOG_VERSION_UNKNOWN");
    let info = unknown.get_details_error_info().unwrap();
    assert_eq!(
        info.metadata.get("current_catalog_version"),
        Some(&writer.catalog_version)
    );
    // The open tenant pins its catalog version as before.
    assert!(
        invoke_as(
            &mut client,
            OPEN,
            None,
            pb::InvokeToolRequest {
                catalog_version: open.catalog_version.clone(),
                ..call("ops__deploy")
            }
        )
        .await
        .is_ok()
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_first_matching_rule_wins_and_deny_globs_hide_tools() {
    let (ops, docs) = servers().await;
    let policy = concat!(
        "      - allow: \"ops__status\"\n",
        "      - deny: [\"ops__*\", \"*__publish\"]\n",
        "      - allow: \"ops__deploy\"\n",
    );
    let gateway = TestGateway::start(&yaml(&ops, &docs, policy), &[]).await;
    let mut client = gateway.client().await;
    let listing = list_as(&mut client, OPS, None).await;
    assert_eq!(names(&listing), ["docs__search", "ops__status"]);
    // The later allow is never reached.
    assert_not_permitted(
        invoke_as(&mut client, OPS, None, call("ops__deploy")).await,
        "ops__deploy",
    );
    assert_not_permitted(
        invoke_as(&mut client, OPS, None, call("docs__publish")).await,
        "docs__publish",
    );
    assert!(
        invoke_as(&mut client, OPS, None, call("ops__status"))
            .await
            .is_ok()
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn conditions_read_tool_annotations_with_mcp_defaults() {
    let (ops, docs) = servers().await;
    // Unset hints take the MCP defaults: destructive unless said otherwise.
    let policy = "      - deny: \"*\"\n        when: \"tool.annotations.destructive && !tool.annotations.read_only && tool.server == 'ops'\"\n";
    let gateway = TestGateway::start(&yaml(&ops, &docs, policy), &[]).await;
    let mut client = gateway.client().await;
    let listing = list_as(&mut client, DOCS, Some("anyone")).await;
    assert_eq!(
        names(&listing),
        [
            "docs__publish",
            "docs__search",
            "ops__restart",
            "ops__status"
        ]
    );
    assert_not_permitted(
        invoke_as(&mut client, DOCS, None, call("ops__delete_env")).await,
        "ops__delete_env",
    );
    assert!(
        invoke_as(&mut client, DOCS, None, call("ops__restart"))
            .await
            .is_ok()
    );
    gateway.shutdown().await;
}

#[test]
fn bad_rules_are_configuration_errors_naming_their_path() {
    let env: HashMap<String, String> = HashMap::new();
    let check = |policy: &str| -> String {
        let yaml = format!(
            "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: s\n        url: \"http://127.0.0.1:9/mcp\"\n    policy:\n{policy}"
        );
        match toolgate::config::Config::from_yaml(&yaml, "test.yaml", Path::new("."), &env) {
            Ok(_) => panic!("accepted:\n{policy}"),
            Err(e) => e.to_string(),
        }
    };
    let error = check(
        "      - allow: \"s__*\"\n      - deny: \"x\"\n      - deny: \"*\"\n        when: \"subject ==\"\n",
    );
    assert!(error.contains("tenants[0].policy[2].when"), "{error}");
    let error = check("      - deny: \"*\"\n        when: \"claim.groups.size() > 0\"\n");
    assert!(error.contains("tenants[0].policy[0].when"), "{error}");
    assert!(error.contains("`claim`"), "{error}");
    let error = check("      - allow: \"s__*\"\n      - deny: [\"ok\", \"[x\"]\n");
    assert!(error.contains("tenants[0].policy[1].deny[1]"), "{error}");
    let error = check("      - allow: \"a\"\n        deny: \"b\"\n");
    assert!(error.contains("tenants[0].policy[0]"), "{error}");
    assert!(error.contains("not both"), "{error}");
    let error = check("      - when: \"true\"\n");
    assert!(error.contains("tenants[0].policy[0]"), "{error}");
    let error = check("      - deny: []\n");
    assert!(error.contains("tenants[0].policy[0].deny"), "{error}");
    let error = check("      - effect: deny\n");
    assert!(error.contains("tenants[0].policy[0]"), "{error}");
    assert!(error.contains("effect"), "{error}");
}

#[tokio::test]
async fn toolgate_check_refuses_a_bad_rule_with_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &path,
        "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: s\n        url: \"http://127.0.0.1:9/mcp\"\n    policy:\n      - deny: \"*\"\n        when: \"tool.annotations.read_only &&\"\n",
    )
    .unwrap();
    let output = tokio::process::Command::new(toolgate_bin())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tenants[0].policy[0].when"), "{stderr}");
}

#[tokio::test]
async fn a_python_grpcio_client_sees_its_view_and_the_refusal_reason() {
    let (ops, docs) = servers().await;
    let gateway = TestGateway::start(&yaml(&ops, &docs, ROLE_POLICY), &[]).await;
    let addr = gateway.addr.to_string();
    let run = |token: &'static str, subject: &'static str, trailers: bool| {
        let addr = addr.clone();
        async move {
            let output = tokio::process::Command::new(python())
                .arg(fixture("python/policy_client.py"))
                .args(["--addr", &addr, "--token", token, "--subject", subject])
                .args(["--invoke", "ops__deploy", "--invoke", "docs__publish"])
                .args(trailers.then_some("--trailers"))
                .output()
                .await
                .unwrap();
            assert!(output.status.success(), "{output:?}");
            serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
        }
    };
    let bob = run(DOCS, "bob", false).await;
    assert_eq!(
        bob["tools"],
        serde_json::json!(["docs__publish", "docs__search"])
    );
    assert_eq!(bob["searched"], bob["tools"]);
    assert_eq!(bob["search_version"], bob["catalog_version"]);
    let refused = &bob["calls"]["ops__deploy"];
    assert_eq!(refused["code"], "PERMISSION_DENIED", "{bob}");
    assert_eq!(refused["reason"], "TOOL_NOT_PERMITTED", "{bob}");
    assert_eq!(refused["metadata"]["tool"], "ops__deploy");
    assert_eq!(
        refused["via"], "grpc_status",
        "grpcio-status is in the venv"
    );
    assert_eq!(bob["calls"]["docs__publish"]["ok"], true);
    // The same refusal read from the trailing metadata by hand.
    let by_hand = run(DOCS, "bob", true).await;
    let refused = &by_hand["calls"]["ops__deploy"];
    assert_eq!(refused["via"], "trailing_metadata");
    assert_eq!(refused["reason"], "TOOL_NOT_PERMITTED", "{by_hand}");
    assert_eq!(by_hand["catalog_version"], bob["catalog_version"]);

    let alice = run(OPS, "ops-alice", false).await;
    assert_eq!(alice["tools"].as_array().unwrap().len(), 6);
    assert_eq!(alice["calls"]["ops__deploy"]["ok"], true);
    assert_ne!(alice["catalog_version"], bob["catalog_version"]);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_reload_that_changes_only_the_policy_reaches_listings_and_watches() {
    let (ops, docs) = servers().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = dir.path().join("toolgate.yaml");
    let config = |policy: &str| {
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n{}",
            yaml(&ops, &docs, policy)
        )
    };
    std::fs::write(&path, config("      - deny: \"docs__*\"\n")).unwrap();
    let log = dir.path().join("gateway.log");
    let mut gateway = serve_binary(&path, &log, &[]);
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    let before = list_as(&mut client, DOCS, None).await;
    // Both servers are up; the policy hides every docs__ tool.
    assert!(
        before.servers.iter().all(|s| s.connected) && before.servers.len() == 2,
        "{before:?}"
    );
    assert!(!names(&before).is_empty(), "{before:?}");
    assert!(names(&before).iter().all(|n| n.starts_with("ops__")));
    let mut watch = client
        .watch_tools(authed(DOCS, pb::WatchToolsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.catalog_version, before.catalog_version);

    // The same servers; the policy now only hides docs__publish.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, config("      - deny: \"docs__publish\"\n")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    signal(gateway.0.id(), "HUP");
    let started = Instant::now();
    let after = loop {
        let listing = list_as(&mut client, DOCS, None).await;
        if names(&listing).contains(&"docs__search".to_owned()) {
            break listing;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the reload never showed: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!names(&after).contains(&"docs__publish".to_owned()));
    assert_ne!(after.catalog_version, before.catalog_version);
    // The open watch sends the new view (the catalog itself is unchanged).
    let started = Instant::now();
    loop {
        let snapshot = tokio::time::timeout(Duration::from_secs(20), watch.message())
            .await
            .expect("the watch sends the new view")
            .unwrap()
            .unwrap();
        if snapshot.catalog_version == after.catalog_version {
            assert_eq!(names(&snapshot), names(&after));
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20));
    }
    assert_not_permitted(
        invoke_as(&mut client, DOCS, None, call("docs__publish")).await,
        "docs__publish",
    );
    signal(gateway.0.id(), "TERM");
    assert!(
        wait_exit(&mut gateway.0, Duration::from_secs(30))
            .await
            .success()
    );
}

/// An ES256 key made with the `openssl` CLI, and its public JWK set.
fn es256_key(dir: &Path) -> (jsonwebtoken::EncodingKey, serde_json::Value) {
    let path = dir.join("key.pem");
    let status = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the openssl CLI makes the test key");
    assert!(status.success());
    let encoding = jsonwebtoken::EncodingKey::from_ec_pem(&std::fs::read(&path).unwrap()).unwrap();
    let mut jwk =
        jsonwebtoken::jwk::Jwk::from_encoding_key(&encoding, jsonwebtoken::Algorithm::ES256)
            .unwrap();
    jwk.common.key_id = Some("policy-1".to_owned());
    let set = jsonwebtoken::jwk::JwkSet { keys: vec![jwk] };
    (encoding, serde_json::to_value(set).unwrap())
}

#[tokio::test]
async fn jwt_callers_with_different_claims_see_and_call_different_tools() {
    let (ops, docs) = servers().await;
    let dir = tempfile::tempdir().unwrap();
    let (key, jwks) = es256_key(dir.path());
    let jwks_file = dir.path().join("jwks.json");
    std::fs::write(&jwks_file, jwks.to_string()).unwrap();
    let issuer = "https://idp.policy.test";
    let callers = format!(
        "callers:\n  jwt:\n    - issuer: \"{issuer}\"\n      audiences: [toolgate]\n      algorithms: [ES256]\n      jwks: {{ file: \"{}\" }}\n      tenant: claims.team\n",
        jwks_file.display()
    );
    // Claims decide: `ops` members get the ops server; a `level` below 3
    // (or none at all: the condition fails, which never grants) loses
    // every tool that is not read-only.
    let policy = concat!(
        "      - allow: \"ops__*\"\n",
        "        when: \"has(claims.groups) && 'ops' in claims.groups\"\n",
        "      - deny: \"ops__*\"\n",
        "      - deny: \"*\"\n",
        "        when: \"!tool.annotations.read_only && claims.level < 3\"\n",
    );
    let gateway = TestGateway::start(&(callers + &yaml(&ops, &docs, policy)), &[]).await;
    let mut client = gateway.client().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = |extra: serde_json::Value| {
        let mut claims = serde_json::json!({
            "iss": issuer, "aud": "toolgate", "sub": "worker", "team": "acme",
            "iat": now, "exp": now + 600,
        });
        claims
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some("policy-1".to_owned());
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    };
    let operator = token(serde_json::json!({"groups": ["ops", "dev"], "level": 5}));
    let developer = token(serde_json::json!({"groups": ["dev"], "level": 1}));
    let unleveled = token(serde_json::json!({"groups": ["dev"]}));

    let seen = |listing: pb::ListToolsResponse| names(&listing);
    assert_eq!(
        seen(list_as(&mut client, &operator, None).await),
        [
            "docs__publish",
            "docs__search",
            "ops__delete_env",
            "ops__deploy",
            "ops__restart",
            "ops__status"
        ]
    );
    assert_eq!(
        seen(list_as(&mut client, &developer, None).await),
        ["docs__search"]
    );
    assert_eq!(
        seen(list_as(&mut client, &unleveled, None).await),
        ["docs__search"]
    );
    assert!(
        invoke_as(&mut client, &operator, None, call("ops__deploy"))
            .await
            .is_ok()
    );
    assert_not_permitted(
        invoke_as(&mut client, &developer, None, call("ops__deploy")).await,
        "ops__deploy",
    );
    assert_not_permitted(
        invoke_as(&mut client, &developer, None, call("docs__publish")).await,
        "docs__publish",
    );
    assert!(
        invoke_as(&mut client, &developer, None, call("docs__search"))
            .await
            .is_ok()
    );
    // A static token of the same tenant has empty claims: `level` is
    // missing, so the deny holds for what is not read-only.
    assert_eq!(
        seen(list_as(&mut client, DOCS, None).await),
        ["docs__search"]
    );
    gateway.shutdown().await;
}
