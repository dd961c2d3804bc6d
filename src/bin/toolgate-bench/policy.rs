//! What per-tool policy costs: a 20-rule policy against none.
//!
//! In process: one `Policy::allows` decision (what InvokeTool adds), the
//! evaluation of a caller's view of a 10,000-tool catalog (the first
//! ListTools of a snapshot per distinct caller) and the cached view
//! (every ListTools after). End to end: one gateway with two tenants on
//! the same upstreams, `bench` without policy and `bench-policy` with the
//! 20 rules, InvokeTool p50 of the fast stdio server and ListTools p50 of
//! a 10,000-tool catalog, interleaved.

use std::sync::Arc;
use std::time::{Duration, Instant};

use toolgate::callers::{Caller, CallerIdentity, Subject};
use toolgate::catalog::{Annotations, Catalog, CatalogTool, InputState, ServerInput};
use toolgate::pb;
use toolgate::policy::{Effect, Policy, RuleSpec, Targets};

use super::measure::{self, CallFn, median};

/// Twenty rules over every name (`*`), none of whose conditions holds for
/// the measured caller, so every one is checked: ten read the subject,
/// five the tool's annotations, five the claims.
fn rules() -> Vec<RuleSpec> {
    let mut rules = Vec::new();
    for i in 0..10 {
        rules.push((
            Effect::Deny,
            "*".to_owned(),
            format!("subject == 'blocked-{i}'"),
        ));
    }
    for i in 0..5 {
        rules.push((
            Effect::Deny,
            "*".to_owned(),
            format!("tool.annotations.destructive && subject == 'careful-{i}'"),
        ));
    }
    for i in 0..5 {
        rules.push((
            Effect::Deny,
            "*".to_owned(),
            format!("has(claims.groups) && 'admin-{i}' in claims.groups"),
        ));
    }
    rules
        .into_iter()
        .map(|(effect, glob, when)| RuleSpec {
            targets: Targets::Names,
            effect,
            globs: vec![glob],
            when: Some(when),
            approval: None,
        })
        .collect()
}

/// The rules as `tenants[].policy` YAML (indented for a tenant).
pub(super) fn rules_yaml() -> String {
    rules()
        .iter()
        .map(|r| {
            format!(
                "    - deny: \"{}\"\n      when: \"{}\"\n",
                r.globs[0],
                r.when.as_deref().unwrap_or("true")
            )
        })
        .collect()
}

fn jwt_caller() -> Caller {
    Caller {
        identity: CallerIdentity::Jwt {
            issuer: "https://issuer.example".to_owned(),
            subject: "worker-7".to_owned(),
        },
        claims: Arc::new(serde_json::json!({
            "iss": "https://issuer.example", "sub": "worker-7", "aud": "toolgate",
            "exp": 1_900_000_000, "iat": 1_800_000_000, "groups": ["dev", "ops"],
            "tenant": "bench", "scope": "tools:call tools:list"
        })),
    }
}

fn catalog(tools: usize) -> Catalog {
    let schema = Arc::new(
        serde_json::json!({"type": "object", "properties": {"message": {"type": "string"}}})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    let listed: Vec<rmcp::model::Tool> = (0..tools)
        .map(|i| rmcp::model::Tool::new(format!("tool_{i:05}"), "Filler tool.", schema.clone()))
        .collect();
    let filter = toolgate::config::ToolFilter::default();
    let overrides = std::collections::HashMap::new();
    let limits = toolgate::config::Limits {
        max_tools_per_server: tools + 1,
        ..Default::default()
    };
    Catalog::build(
        &[ServerInput {
            name: "big",
            transport: "http",
            bare: false,
            filter: &filter,
            overrides: &overrides,
            state: InputState::Listed(&listed),
            approved: None,
        }],
        &limits,
    )
}

/// Median of `rounds` timings of `f` run `n` times, in ns per run.
fn time_ns(rounds: usize, n: usize, mut f: impl FnMut()) -> f64 {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        for _ in 0..n {
            f();
        }
        samples.push(started.elapsed().as_nanos() as f64 / n as f64);
    }
    median(samples)
}

/// In-process figures: (ns per decision with 20 rules, ms to evaluate a
/// view of 10,000 tools, µs per cached view lookup).
pub fn in_process() -> anyhow::Result<(f64, f64, f64)> {
    let policy = Policy::compile("tenants[0].policy", &rules())
        .map_err(|e| anyhow::anyhow!("bench rules: {e:?}"))?;
    let caller = jwt_caller();
    let subject = Subject::named(caller.namespace(), "alice").map_err(anyhow::Error::msg)?;
    let tool = CatalogTool {
        name: "github__create_issue".to_owned(),
        server: "github".to_owned(),
        server_index: 0,
        upstream_name: "create_issue".to_owned(),
        description: "Creates an issue.".to_owned(),
        title: String::new(),
        input_schema_json: "{}".to_owned(),
        output_schema_json: String::new(),
        annotations: Annotations::default(),
        definition_hash: String::new(),
    };
    anyhow::ensure!(policy.allows(&caller, &subject, &tool), "no rule matches");
    let decision = time_ns(5, 20_000, || {
        std::hint::black_box(policy.allows(&caller, &subject, std::hint::black_box(&tool)));
    });
    let big = catalog(10_000);
    let evaluate = time_ns(5, 3, || {
        std::hint::black_box(toolgate::policy::View::evaluate(
            &policy, &big, &caller, &subject,
        ));
    }) / 1e6;
    toolgate::policy::caller_view(&policy, &big, &caller, &subject);
    let cached = time_ns(5, 20_000, || {
        std::hint::black_box(toolgate::policy::caller_view(
            &policy, &big, &caller, &subject,
        ));
    }) / 1e3;
    Ok((decision, evaluate, cached))
}

pub(super) fn request<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    request
        .metadata_mut()
        .insert("x-toolgate-subject", "alice".parse().expect("ascii"));
    request
}

pub(super) type Client = pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>;

pub(super) fn invoke(client: Client, token: &'static str) -> CallFn {
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            client
                .invoke_tool(request(
                    token,
                    pb::InvokeToolRequest {
                        name: "fast__echo".into(),
                        arguments_json: r#"{"message":"hello"}"#.into(),
                        ..Default::default()
                    },
                ))
                .await?;
            Ok(())
        })
    })
}

fn list(client: Client, token: &'static str) -> CallFn {
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            client
                .list_tools(request(token, pb::ListToolsRequest::default()))
                .await?;
            Ok(())
        })
    })
}

/// A gateway on 127.0.0.1:`port` (its config written in `dir`) with the
/// top-level YAML `top` and two tenants on the same `servers`: `bench`
/// (token `bench-token`, no policy) and `bench-policy` (`policy-token`,
/// the 20 rules); returned once `ready` holds for each tenant's listing.
pub(super) async fn two_tenant_gateway(
    dir: &std::path::Path,
    port: u16,
    top: &str,
    servers: &str,
    ready: impl Fn(&pb::ListToolsResponse) -> bool,
) -> anyhow::Result<(super::harness::Proc, Client)> {
    let config = dir.join(format!("config-{port}.yaml"));
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n{top}tenants:\n\
             \x20 - name: bench\n    tokens: [bench-token]\n    servers:\n{servers}\
             \x20 - name: bench-policy\n    tokens: [policy-token]\n    servers:\n{servers}    policy:\n{}",
            rules_yaml()
        ),
    )?;
    let gateway = super::harness::spawn_gateway(&config);
    super::harness::wait_port(port).await;
    let client = super::harness::grpc(port).await;
    for token in ["bench-token", "policy-token"] {
        let started = Instant::now();
        loop {
            let listing = client
                .clone()
                .list_tools(request(token, pb::ListToolsRequest::default()))
                .await?
                .into_inner();
            if ready(&listing) {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "the gateway never got ready for {token} ({} tools, servers {:?})",
                listing.tools.len(),
                listing
                    .servers
                    .iter()
                    .map(|s| (&s.name, s.connected))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok((gateway, client))
}

/// End-to-end p50s in ms: (InvokeTool without, with policy; ListTools of
/// 10,000 tools without, with policy).
pub async fn end_to_end(rounds: usize) -> anyhow::Result<(f64, f64, f64, f64)> {
    let (big, big_port) = super::harness::fast_http_server(9_999);
    super::harness::wait_port(big_port).await;
    let port = super::harness::free_port();
    let dir = std::env::temp_dir().join(format!(
        "toolgate-bench-policy-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    let exe = super::harness::exe().display().to_string();
    let servers = format!(
        "      - name: fast\n        command: [\"{exe}\", \"mcp-server\"]\n\
         \x20     - name: big\n        url: \"http://127.0.0.1:{big_port}/mcp\"\n        max_list_pages: 20\n"
    );
    let top = "limits:\n  max_message_bytes: 268435456\n  max_result_bytes: 268435456\n";
    let (gateway, client) = two_tenant_gateway(&dir, port, top, &servers, |listing| {
        listing.tools.len() == 10_001
    })
    .await?;
    let paths = [
        invoke(client.clone(), "bench-token"),
        invoke(client.clone(), "policy-token"),
        list(client.clone(), "bench-token"),
        list(client.clone(), "policy-token"),
    ];
    let sizes = [2_000, 2_000, 30, 30];
    let mut p50s: [Vec<f64>; 4] = Default::default();
    for (path, n) in paths.iter().zip(sizes) {
        measure::sequential(path, n / 10).await?;
    }
    for _ in 0..rounds.max(1) {
        for ((path, n), p50) in paths.iter().zip(sizes).zip(p50s.iter_mut()) {
            p50.push(measure::sequential(path, n).await?.p50);
        }
    }
    drop((gateway, big));
    let _ = std::fs::remove_dir_all(&dir);
    let [a, b, c, d] = p50s.map(median);
    Ok((a, b, c, d))
}

/// Prints the policy rows of the targets table.
pub async fn report(rounds: usize) -> anyhow::Result<()> {
    let (decision_ns, evaluate_ms, cached_us) = in_process()?;
    println!(
        "| policy, in process: one decision, 20 rules, all evaluated (InvokeTool before any ListTools of the snapshot) | {} µs | | |",
        super::report::fmt(decision_ns / 1000.0, 2)
    );
    println!(
        "| policy, in process: a caller's view of 10,000 tools, first ListTools of a snapshot | {} ms | | |",
        super::report::fmt(evaluate_ms, 2)
    );
    println!(
        "| policy, in process: the cached view (every later ListTools; InvokeTool's decision after one) | {} µs | | |",
        super::report::fmt(cached_us, 2)
    );
    let (invoke_none, invoke_policy, list_none, list_policy) = end_to_end(rounds).await?;
    println!(
        "| InvokeTool p50, fast stdio: 20-rule policy {} ms / none {} ms | {} ms added | | |",
        super::report::fmt(invoke_policy, 3),
        super::report::fmt(invoke_none, 3),
        super::report::fmt(invoke_policy - invoke_none, 3)
    );
    println!(
        "| ListTools p50, 10,000 tools: 20-rule policy {} ms / none {} ms | {} | | |",
        super::report::fmt(list_policy, 2),
        super::report::fmt(list_none, 2),
        super::report::fmt(list_policy / list_none, 2)
    );
    Ok(())
}
