//! Many tenants: lazy sessions connect on first use (concurrent first
//! calls share one connect), close after an idle time, and a cap on live
//! sessions evicts the least recently used tenant.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

#[tokio::test]
async fn a_lazy_tenant_connects_on_first_use_once() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    // An eager tenant beside it is the witness that the gateway has
    // started its sessions.
    let witness = serve_mcp(TestServer::new(&["echo"])).await;
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [t]\n    connect: lazy\n    servers:\n      - name: s\n        url: \"{}\"\n  - name: eager\n    tokens: [e]\n    servers:\n      - name: s\n        url: \"{}\"\n",
            server.url, witness.url
        ),
        &[],
    )
    .await;
    let started = Instant::now();
    while *witness.log.list_calls.lock().unwrap() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the eager tenant never connected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        *server.log.list_calls.lock().unwrap(),
        0,
        "nothing connects before first use"
    );
    // Ten concurrent first calls share one connect.
    let mut calls = Vec::new();
    for i in 0..10 {
        let mut client = gateway.client().await;
        calls.push(tokio::spawn(async move {
            invoke(&mut client, "t", "s__echo", &format!(r#"{{"text":"{i}"}}"#)).await
        }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap().text, i.to_string());
    }
    assert_eq!(
        *server.log.list_calls.lock().unwrap(),
        1,
        "one connect, one tools/list"
    );
    gateway.shutdown().await;
}

fn py(name: &str) -> String {
    format!(
        "      - name: {name}\n        command: [\"{}\", \"{}\"]\n",
        python().display(),
        fixture("python/env_server.py").display()
    )
}

async fn wait_children(pid: u32, expected: usize) -> Vec<u32> {
    wait_children_within(pid, expected, Duration::from_secs(20)).await
}

/// [`wait_children`], waiting at most `within`.
async fn wait_children_within(pid: u32, expected: usize, within: Duration) -> Vec<u32> {
    let started = Instant::now();
    loop {
        let children: Vec<u32> = children_of(pid)
            .into_iter()
            .filter(|c| process_alive(*c))
            .collect();
        if children.len() == expected {
            return children;
        }
        assert!(
            started.elapsed() < within,
            "{} children, expected {expected}",
            children.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Longer than a tenant's stdio server takes to start and answer on a
/// loaded machine (5 s was not: `a` went idle while `b` started, and the
/// cap was never reached); what is shown is that idle sessions close, not
/// how soon.
const IDLE_TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn idle_tenants_close_and_the_session_cap_evicts_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nsessions:\n  max_live: 2\ndefaults:\n  connect: lazy\n  idle_timeout: \"{idle}s\"\ntenants:\n  - name: a\n    tokens: [ta]\n    servers:\n{}  - name: b\n    tokens: [tb]\n    servers:\n{}  - name: c\n    tokens: [tc]\n    servers:\n{}",
            py("py"),
            py("py"),
            py("py"),
            idle = IDLE_TIMEOUT.as_secs(),
        ),
    )
    .unwrap();
    let mut gateway = ChildGuard(
        Command::new(toolgate_bin())
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = gateway.0.id();
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    assert!(children_of(pid).is_empty(), "lazy tenants start nothing");
    let mut echo = async |token: &str, text: &str| {
        let answer = invoke(
            &mut client,
            token,
            "py__echo",
            &format!(r#"{{"text":"{text}"}}"#),
        )
        .await
        .unwrap();
        assert_eq!(answer.text, text);
    };
    echo("ta", "a").await;
    let a = wait_children(pid, 1).await;
    echo("tb", "b").await;
    let a_and_b = wait_children(pid, 2).await;
    assert!(a_and_b.contains(&a[0]));
    let b: Vec<u32> = a_and_b.into_iter().filter(|p| *p != a[0]).collect();
    // `a` is used again: `b` is now the least recently used.
    echo("ta", "a again").await;
    // Tenant c's first call needs a session; the cap of two evicts b's,
    // not a's.
    echo("tc", "c").await;
    let a_and_c = wait_children(pid, 2).await;
    assert!(
        a_and_c.contains(&a[0]),
        "a's session was evicted: {a_and_c:?}"
    );
    assert!(
        !a_and_c.contains(&b[0]),
        "b's session made room for c's: {a_and_c:?}"
    );
    // Unused for idle_timeout, the sessions close too (c's soonest,
    // IDLE_TIMEOUT after its call began; the reaper looks every second).
    wait_children_within(pid, 0, IDLE_TIMEOUT + Duration::from_secs(20)).await;
    // And come back on the next call.
    echo("tb", "again").await;
    signal(pid, "TERM");
    assert!(
        wait_exit(&mut gateway.0, Duration::from_secs(30))
            .await
            .success()
    );
}

/// Live stdio processes whose environment holds `marker`.
fn processes_with_marker(marker: &str) -> Vec<u32> {
    let needle = format!("TOOLGATE_CHURN={marker}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| process_alive(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// Two lazy tenants and room for one live session: every call evicts the
/// other tenant while its own connects, calls and listings interleaved.
/// Activation, eviction and connects racing must never leave a session
/// (and its process) that nothing owns: the processes settle at the cap,
/// and none is left after shutdown.
#[tokio::test]
async fn lazy_churn_under_a_session_cap_leaves_no_process_behind() {
    let marker = format!("{}-{}", std::process::id(), free_port());
    let server = |name: &str| {
        format!(
            "      - name: {name}\n        command: [\"{}\", \"{}\"]\n        env: {{ TOOLGATE_CHURN: \"{marker}\" }}\n",
            python().display(),
            fixture("python/env_server.py").display()
        )
    };
    let yaml = format!(
        "sessions:\n  max_live: 1\ntenants:\n  - name: a\n    tokens: [ta]\n    connect: lazy\n    servers:\n{}  - name: b\n    tokens: [tb]\n    connect: lazy\n    servers:\n{}",
        server("s"),
        server("s")
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let (mut answered, mut listed, mut most_processes) = (0, 0, 0);
    for round in 0..8 {
        let mut calls = Vec::new();
        for token in ["ta", "tb"] {
            let mut client = gateway.client().await;
            calls.push(tokio::spawn(async move {
                let text = format!("{token}{round}");
                let answer = invoke(
                    &mut client,
                    token,
                    "s__echo",
                    &format!(r#"{{"text":"{text}"}}"#),
                )
                .await;
                let listing = client
                    .list_tools(authed(token, toolgate::pb::ListToolsRequest::default()))
                    .await;
                (answer, listing, text)
            }));
        }
        for call in calls {
            let (answer, listing, text) = call.await.unwrap();
            // A tenant with a call in flight is not evicted for the cap
            // (docs/configuration.md, `sessions.max_live`): every call is
            // answered, and never with another tenant's answer.
            let answer = answer.unwrap_or_else(|e| panic!("call {text} under churn: {e:?}"));
            assert_eq!(answer.text, text);
            answered += 1;
            // A listing never fails: it reports the server's state.
            let listing = listing.expect("ListTools answers under churn").into_inner();
            assert_eq!(listing.servers.len(), 1, "{listing:?}");
            listed += 1;
        }
        most_processes = most_processes.max(processes_with_marker(&marker).len());
    }
    // The churn ran real sessions: the servers answered (each answer is the
    // child's own echo), and their processes were seen.
    assert_eq!((answered, listed), (16, 16));
    assert!(most_processes >= 1, "no server process was ever seen");
    let started = Instant::now();
    while processes_with_marker(&marker).len() > 1 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "more processes than the cap allows: {:?}",
            processes_with_marker(&marker)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gateway.shutdown().await;
    let started = Instant::now();
    while !processes_with_marker(&marker).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "processes outlived the gateway: {:?}",
            processes_with_marker(&marker)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
