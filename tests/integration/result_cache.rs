//! The result cache against `resources_server.py` on the Python `mcp` SDK
//! (2026-07-28, `lifecycle: discover`), whose read results carry the
//! revision's `ttlMs` and `cacheScope` (RESOURCES_READ_TTL_MS,
//! RESOURCES_READ_SCOPE) and whose `fixture://counter/<x>` answers how many
//! reads the server received: a read answered from the cache leaves the
//! count as it was. Hinted reads are answered once for many (counted in
//! `toolgate_cache_*`, audited `cache: hit` and `sent: false`); private
//! results are kept apart per subject and public ones shared; results
//! expire after their ttl; no hint (`ttlMs` 0, or a 2025-11-25 session
//! that carries none) and `cache_results: false` read every time; a
//! tenant's entries stay within `limits.max_cache_entries`, least recently
//! used dropped first.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;
use crate::resources::{TOKEN, py_server, tenant, wait_resources};

/// The fixture's environment: read results fresh for `ttl_ms`, of `scope`.
fn hinted<'a>(ttl_ms: &'a str, scope: &'a str) -> [(&'a str, &'a str); 2] {
    [
        ("RESOURCES_READ_TTL_MS", ttl_ms),
        ("RESOURCES_READ_SCOPE", scope),
    ]
}

/// Reads `uri` of server `py` as the tenant, or as `subject`: its text.
async fn read_as(
    client: &mut ToolGatewayClient<Channel>,
    subject: Option<&str>,
    uri: &str,
) -> String {
    let message = pb::ReadResourceRequest {
        server: "py".to_owned(),
        uri: uri.to_owned(),
        ..Default::default()
    };
    let request = match subject {
        Some(subject) => authed_as(TOKEN, subject, message),
        None => authed(TOKEN, message),
    };
    let response = client
        .read_resource(request)
        .await
        .unwrap_or_else(|e| panic!("ReadResource {uri}: {e:?}"))
        .into_inner();
    crate::resources::text(&response).to_owned()
}

async fn read(client: &mut ToolGatewayClient<Channel>, uri: &str) -> String {
    read_as(client, None, uri).await
}

/// Starts a gateway with `py` (2026-07-28, `env`, `extra` in its entry)
/// and `top` before the tenants; waits for its resources.
async fn start(
    env: &[(&str, &str)],
    extra: &str,
    top: &str,
) -> (TestGateway, ToolGatewayClient<Channel>) {
    let quoted: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), format!("\"{v}\"")))
        .collect();
    let env: Vec<(&str, &str)> = quoted
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let yaml = tenant(&py_server("py", "discover", &env, extra), top);
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    (gateway, client)
}

/// The call records of `ReadResource` in the audit file at `path` (waits,
/// bounded, for `count` of them).
async fn read_records(path: &Path, count: usize) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let records: Vec<Value> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|r| r["kind"] == "call" && r["rpc"] == "ReadResource")
            .collect();
        if records.len() >= count {
            return records;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} read records of {count}: {records:#?}",
            records.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A counter of a metrics page (0 when absent).
fn counter(page: &str, series: &str) -> u64 {
    sample(page, series).map_or(0, |v| v.parse::<f64>().unwrap() as u64)
}

/// Five reads of a result fresh for a minute reach the server once; the
/// other four are hits: counted, audited `cache: hit` with `sent: false`
/// (the first `cache: stored`, sent), and their answer is the first's.
#[tokio::test]
async fn a_hinted_read_is_answered_once_for_many() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let port = free_port();
    let top = format!(
        "metrics:\n  listen: \"127.0.0.1:{port}\"\naudit:\n  path: \"{}\"\n",
        audit.display()
    );
    let (gateway, mut client) = start(&hinted("60000", "public"), "", &top).await;
    let first = read(&mut client, "fixture://counter/a").await;
    assert!(first.starts_with("read "), "{first}");
    for _ in 0..4 {
        assert_eq!(read(&mut client, "fixture://counter/a").await, first);
    }
    // Another URI is another entry.
    let other = read(&mut client, "fixture://counter/b").await;
    assert_ne!(other, first);
    assert_eq!(read(&mut client, "fixture://counter/b").await, other);

    let records = read_records(&audit, 7).await;
    let cache: Vec<Option<&str>> = records.iter().map(|r| r["cache"].as_str()).collect();
    assert_eq!(
        cache,
        [
            Some("stored"),
            Some("hit"),
            Some("hit"),
            Some("hit"),
            Some("hit"),
            Some("stored"),
            Some("hit")
        ],
        "{records:#?}"
    );
    for record in &records {
        assert_eq!(record["outcome"], "ok", "{record}");
        assert_eq!(record["sent"], record["cache"] == "stored", "{record}");
    }

    let page = scrape(port).await;
    let labels = "{tenant=\"acme\",server=\"py\"}";
    assert_eq!(
        counter(&page, &format!("toolgate_cache_hits_total{labels}")),
        5,
        "{page}"
    );
    assert_eq!(
        counter(&page, &format!("toolgate_cache_misses_total{labels}")),
        2
    );
    assert_eq!(
        counter(&page, &format!("toolgate_cache_stores_total{labels}")),
        2
    );
    assert_eq!(counter(&page, "toolgate_cache_entries{tenant=\"acme\"}"), 2);
    assert!(counter(&page, "toolgate_cache_bytes{tenant=\"acme\"}") > 0);
    gateway.shutdown().await;
}

/// A `private` result is answered again only to the subject it was read
/// for (the tenant acting for itself is one more); a `public` one to any.
#[tokio::test]
async fn private_results_are_kept_apart_per_subject_and_public_ones_shared() {
    let (gateway, mut client) = start(&hinted("60000", "private"), "", "").await;
    let uri = "fixture://counter/p";
    let alice = read_as(&mut client, Some("alice"), uri).await;
    let bob = read_as(&mut client, Some("bob"), uri).await;
    assert_ne!(alice, bob, "bob was answered alice's private result");
    let tenant = read_as(&mut client, None, uri).await;
    assert!(tenant != alice && tenant != bob, "{tenant}");
    assert_eq!(read_as(&mut client, Some("alice"), uri).await, alice);
    assert_eq!(read_as(&mut client, Some("bob"), uri).await, bob);
    assert_eq!(read_as(&mut client, None, uri).await, tenant);
    gateway.shutdown().await;

    let (gateway, mut client) = start(&hinted("60000", "public"), "", "").await;
    let alice = read_as(&mut client, Some("alice"), uri).await;
    assert_eq!(read_as(&mut client, Some("bob"), uri).await, alice);
    assert_eq!(read_as(&mut client, None, uri).await, alice);
    gateway.shutdown().await;
}

/// A result is answered again within its ttl, and read again after it.
#[tokio::test]
async fn a_result_expires_after_its_ttl() {
    let (gateway, mut client) = start(&hinted("1500", "public"), "", "").await;
    let uri = "fixture://counter/t";
    let started = Instant::now();
    let first = read(&mut client, uri).await;
    let second = read(&mut client, uri).await;
    if started.elapsed() < Duration::from_millis(1200) {
        assert_eq!(second, first, "a hit within the ttl");
    }
    tokio::time::sleep(Duration::from_millis(1600).saturating_sub(started.elapsed())).await;
    let third = read(&mut client, uri).await;
    assert_ne!(third, first, "read again after the ttl");
    assert_eq!(read(&mut client, uri).await, third, "and kept again");
    gateway.shutdown().await;
}

/// Never without a hint: `ttlMs` 0 (the SDK's default), or a 2025-11-25
/// session (no hints on that revision: the SDK strips them).
#[tokio::test]
async fn without_a_hint_every_read_reaches_the_server() {
    for (env, lifecycle) in [
        (vec![], "discover"),
        (vec![("RESOURCES_READ_TTL_MS", "\"0\"")], "discover"),
        (
            vec![
                ("RESOURCES_READ_TTL_MS", "\"60000\""),
                ("RESOURCES_READ_SCOPE", "public"),
            ],
            "initialize",
        ),
    ] {
        let yaml = tenant(&py_server("py", lifecycle, &env, ""), "");
        let gateway = TestGateway::start(&yaml, &[]).await;
        let mut client = gateway.client().await;
        wait_resources(&mut client, "py").await;
        let first = read(&mut client, "fixture://counter/n").await;
        let second = read(&mut client, "fixture://counter/n").await;
        assert_ne!(first, second, "{lifecycle} {env:?}: answered from a cache");
        gateway.shutdown().await;
    }
}

/// `cache_results: false` turns the cache off for the server.
#[tokio::test]
async fn cache_results_false_reads_every_time() {
    let (gateway, mut client) = start(
        &hinted("60000", "public"),
        "        cache_results: false\n",
        "",
    )
    .await;
    let first = read(&mut client, "fixture://counter/o").await;
    let second = read(&mut client, "fixture://counter/o").await;
    assert_ne!(first, second);
    gateway.shutdown().await;
}

/// `limits.max_cache_entries: 2`: a third entry drops the least recently
/// used one, which is then read again; the others are still hits.
#[tokio::test]
async fn a_tenants_entries_stay_within_max_cache_entries_least_recently_used_first() {
    let port = free_port();
    let top =
        format!("metrics:\n  listen: \"127.0.0.1:{port}\"\nlimits:\n  max_cache_entries: 2\n");
    let (gateway, mut client) = start(&hinted("60000", "public"), "", &top).await;
    let a = read(&mut client, "fixture://counter/a").await;
    let b = read(&mut client, "fixture://counter/b").await;
    // `a` used last: `b` is the least recently used when `c` comes.
    assert_eq!(read(&mut client, "fixture://counter/a").await, a);
    let c = read(&mut client, "fixture://counter/c").await;
    assert_eq!(read(&mut client, "fixture://counter/a").await, a);
    assert_eq!(read(&mut client, "fixture://counter/c").await, c);
    let b_again = read(&mut client, "fixture://counter/b").await;
    assert_ne!(b_again, b, "b was dropped and read again");
    let page = scrape(port).await;
    assert_eq!(
        counter(&page, "toolgate_cache_entries{tenant=\"acme\"}"),
        2,
        "{page}"
    );
    assert_eq!(
        counter(
            &page,
            "toolgate_cache_evictions_total{tenant=\"acme\",reason=\"lru\"}"
        ),
        2,
        "{page}"
    );
    gateway.shutdown().await;
}

/// A hit passes what comes before sending: a subject the policy refuses
/// the resource is refused (`RESOURCE_NOT_PERMITTED`) though a fresh
/// public result is kept, and the others are still answered from it.
#[tokio::test]
async fn a_hit_still_passes_the_policy() {
    let policy = "    policy:\n      - deny_resources: \"py:fixture://counter/**\"\n        when: \"subject == 'mallory'\"\n";
    let env = [
        ("RESOURCES_READ_TTL_MS", "\"60000\""),
        ("RESOURCES_READ_SCOPE", "public"),
    ];
    let yaml = tenant(
        &format!("{}{policy}", py_server("py", "discover", &env, "")),
        "",
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let uri = "fixture://counter/x";
    let alice = read_as(&mut client, Some("alice"), uri).await;
    let refused = client
        .read_resource(authed_as(
            TOKEN,
            "mallory",
            pb::ReadResourceRequest {
                server: "py".to_owned(),
                uri: uri.to_owned(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&refused), "RESOURCE_NOT_PERMITTED", "{refused:?}");
    assert_eq!(read_as(&mut client, Some("bob"), uri).await, alice);
    gateway.shutdown().await;
}

/// A hit goes through the guards' response phase as a server's answer
/// does, and the cache keeps the server's result, not a guard's
/// replacement: the guard replaces `REPLACE-RESULT` with
/// `REPLACE-RESULT>first` on every read (kept replaced, a hit would show
/// `>first>first`), and is asked on every read though the server is
/// asked once.
#[tokio::test]
async fn a_hit_passes_the_guards_response_phase_on_the_servers_result() {
    let dir = tempfile::tempdir().unwrap();
    let guard = crate::guards::start_guard(dir.path(), &[]);
    let env = [
        ("RESOURCES_TAG", "REPLACE-RESULT"),
        ("RESOURCES_READ_TTL_MS", "\"60000\""),
        ("RESOURCES_READ_SCOPE", "public"),
    ];
    let yaml = format!(
        "guards:\n  - name: first\n    url: http://127.0.0.1:{}\n{}",
        guard.port,
        tenant(
            &py_server("py", "discover", &env, "        guards: [first]\n"),
            ""
        )
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    wait_resources(&mut client, "py").await;
    let before = crate::resources::counts(&mut client, "py").await["read"]
        .as_u64()
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            read(&mut client, "fixture://text").await,
            "hello from REPLACE-RESULT>first"
        );
    }
    let after = crate::resources::counts(&mut client, "py").await["read"]
        .as_u64()
        .unwrap();
    assert_eq!(after, before + 1, "the server was read once");
    let responses = crate::guards::checks(&guard)
        .into_iter()
        .filter(|c| {
            c["phase"] == "PHASE_RESPONSE" && c["target"].to_string().contains("fixture://text")
        })
        .count();
    assert_eq!(responses, 3, "{:#?}", crate::guards::checks(&guard));
    gateway.shutdown().await;
}

/// A reload (SIGHUP, `toolgate serve`) starts a tenant's cache afresh
/// (its entries belong to the tenant object of one generation: evicted as
/// `reload`) and drops the cache of a tenant it removed, gauges included;
/// turning `cache_results` off takes effect at the reload.
#[tokio::test]
async fn a_reload_starts_afresh_and_drops_removed_tenants() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolgate.yaml");
    let (port, metrics) = (free_port(), free_port());
    let env = [
        ("RESOURCES_READ_TTL_MS", "\"60000\""),
        ("RESOURCES_READ_SCOPE", "public"),
    ];
    let tenant_of = |name: &str, extra: &str| {
        format!(
            "  - name: {name}\n    tokens: [{name}-token]\n    servers:\n{}",
            py_server("py", "discover", &env, extra)
        )
    };
    let config = |tenants: &str| {
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nmetrics:\n  listen: \"127.0.0.1:{metrics}\"\ntenants:\n{tenants}"
        )
    };
    std::fs::write(
        &path,
        config(&(tenant_of("acme", "") + &tenant_of("globex", ""))),
    )
    .unwrap();
    let gateway = ChildGuard(
        Command::new(toolgate_bin())
            .args(["serve", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port).await;
    let client = client_at(port).await;
    let mut lister = client.clone();
    let read_of = |token: &'static str, uri: &'static str| {
        let mut client = client.clone();
        async move {
            let started = Instant::now();
            loop {
                let request = authed(
                    token,
                    pb::ReadResourceRequest {
                        server: "py".to_owned(),
                        uri: uri.to_owned(),
                        ..Default::default()
                    },
                );
                match client.read_resource(request).await {
                    Ok(read) => break crate::resources::text(&read.into_inner()).to_owned(),
                    Err(status) => assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "{token} {uri}: {status:?}"
                    ),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let acme = read_of("acme-token", "fixture://counter/r").await;
    assert_eq!(read_of("acme-token", "fixture://counter/r").await, acme);
    let globex = read_of("globex-token", "fixture://counter/r").await;
    assert_eq!(read_of("globex-token", "fixture://counter/r").await, globex);
    let page = scrape(metrics).await;
    assert_eq!(
        counter(&page, "toolgate_cache_entries{tenant=\"globex\"}"),
        1,
        "{page}"
    );

    // globex removed; acme unchanged.
    std::fs::write(&path, config(&tenant_of("acme", ""))).unwrap();
    signal(gateway.0.id(), "HUP");
    let started = Instant::now();
    while list_tools_status(&mut lister, "globex-token").await != tonic::Code::Unauthenticated {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the reload never showed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = read_of("acme-token", "fixture://counter/r").await;
    assert_ne!(after, acme, "a new generation starts afresh");
    assert_eq!(read_of("acme-token", "fixture://counter/r").await, after);
    let page = scrape(metrics).await;
    assert!(
        counter(
            &page,
            "toolgate_cache_evictions_total{tenant=\"acme\",reason=\"reload\"}"
        ) >= 1,
        "{page}"
    );
    // The removed tenant's cache goes once its object is gone (looked for
    // at least every 10 s while requests come).
    let started = Instant::now();
    loop {
        let page = scrape(metrics).await;
        if sample(&page, "toolgate_cache_entries{tenant=\"globex\"}").is_none() {
            assert!(
                counter(
                    &page,
                    "toolgate_cache_evictions_total{tenant=\"globex\",reason=\"reload\"}"
                ) == 1,
                "{page}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "globex's cache is still there: {page}"
        );
        read_of("acme-token", "fixture://counter/r").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // cache_results: false at a reload: every read reaches the server.
    std::fs::write(
        &path,
        config(&tenant_of("acme", "        cache_results: false\n")),
    )
    .unwrap();
    signal(gateway.0.id(), "HUP");
    let started = Instant::now();
    loop {
        let first = read_of("acme-token", "fixture://counter/r").await;
        if read_of("acme-token", "fixture://counter/r").await != first {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "cache_results: false never took effect"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(gateway);
}

/// The status of a ListTools as `token`.
async fn list_tools_status(client: &mut ToolGatewayClient<Channel>, token: &str) -> tonic::Code {
    match client
        .list_tools(authed(token, pb::ListToolsRequest::default()))
        .await
    {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    }
}
