//! `WatchResource` end to end against real servers: the Python `mcp` SDK's
//! `subscribe_server.py` (which counts what subscribes and unsubscribes,
//! and sends updates on demand) at 2025-11-25 (`resources/subscribe`) and
//! 2026-07-28 (`subscriptions/listen`), and server-everything over stdio
//! and Streamable HTTP. Every end of a watch and its status: the server
//! exiting, a reload removing the server or the caller's token, the drain.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tonic::Streaming;
use tonic::transport::Channel;
use toolgate::pb;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

use crate::common::*;

const TOKEN: &str = "watch-token";

/// The subscribe server over stdio as server `name` with `lifecycle`.
fn py_server(name: &str, lifecycle: &str) -> String {
    format!(
        "      - name: {name}\n        lifecycle: {lifecycle}\n        command: [\"{}\", \"{}\"]\n",
        python().display(),
        fixture("python/subscribe_server.py").display()
    )
}

fn tenant(servers: &str) -> String {
    format!("tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n{servers}")
}

async fn watch(
    client: &mut ToolGatewayClient<Channel>,
    token: &str,
    server: &str,
    uri: &str,
) -> Result<Streaming<pb::ResourceUpdate>, tonic::Status> {
    let opening = client.watch_resource(authed(
        token,
        pb::WatchResourceRequest {
            server: server.to_owned(),
            uri: uri.to_owned(),
        },
    ));
    tokio::time::timeout(Duration::from_secs(10), opening)
        .await
        .expect("the watch opens or is refused within 10 s")
        .map(tonic::Response::into_inner)
}

/// The next message of `stream`, within 10 s.
async fn next(
    stream: &mut Streaming<pb::ResourceUpdate>,
) -> Result<pb::ResourceUpdate, tonic::Status> {
    let message = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a message within 10 s");
    message.map(|m| m.expect("the stream ended without a status"))
}

/// Opens a watch and reads its first message (`initial`).
async fn watched(
    client: &mut ToolGatewayClient<Channel>,
    server: &str,
    uri: &str,
) -> Streaming<pb::ResourceUpdate> {
    let mut stream = watch(client, TOKEN, server, uri)
        .await
        .expect("the watch opens");
    let first = next(&mut stream).await.expect("a first message");
    assert_eq!(
        (first.server.as_str(), first.uri.as_str(), first.initial),
        (server, uri, true),
        "{first:?}"
    );
    stream
}

/// The status a stream ends with, within 20 s (updates before it skipped).
async fn ended(stream: &mut Streaming<pb::ResourceUpdate>) -> tonic::Status {
    let started = Instant::now();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("the stream ends within 20 s");
        match message {
            Ok(Some(update)) => assert!(!update.initial, "{update:?}"),
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => {
                assert!(started.elapsed() < Duration::from_secs(20));
                return status;
            }
        }
    }
}

/// The subscribe server's counts, through the gateway.
async fn counts(client: &mut ToolGatewayClient<Channel>, token: &str, server: &str) -> Value {
    let answer = invoke(client, token, &format!("{server}__counts"), "{}")
        .await
        .expect("counts");
    let Some(pb::content::Kind::Text(text)) = &answer.content[0].kind else {
        panic!("expected a text block: {answer:?}");
    };
    serde_json::from_str(&text.text).unwrap()
}

/// Waits (bounded) until the server's counts satisfy `done`.
async fn counts_until(
    client: &mut ToolGatewayClient<Channel>,
    server: &str,
    mut done: impl FnMut(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let counts = counts(client, TOKEN, server).await;
        if done(&counts) {
            return counts;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the server's counts never got there: {counts}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn touch(client: &mut ToolGatewayClient<Channel>, server: &str, uri: &str) {
    invoke(
        client,
        TOKEN,
        &format!("{server}__touch"),
        &serde_json::json!({ "uri": uri }).to_string(),
    )
    .await
    .expect("touch");
}

fn code_reason(status: &tonic::Status) -> (tonic::Code, String) {
    (status.code(), reason(status))
}

/// 2025-11-25: two watchers of one URI share one `resources/subscribe`;
/// both see an update; the upstream subscription stays while one watcher
/// does, and `resources/unsubscribe` goes once the last one leaves (a
/// worker that just disconnects). A new watcher subscribes again.
#[tokio::test]
async fn watchers_share_one_subscription_undone_when_the_last_leaves() {
    let gateway = TestGateway::start(&tenant(&py_server("py", "initialize")), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__counts").await;
    let mut first = watched(&mut client, "py", "watch://a").await;
    let mut second = watched(&mut client, "py", "watch://a").await;
    let counted = counts(&mut client, TOKEN, "py").await;
    assert_eq!(
        counted["subscribe"],
        serde_json::json!({"watch://a": 1}),
        "{counted}"
    );

    touch(&mut client, "py", "watch://a").await;
    for stream in [&mut first, &mut second] {
        let update = next(stream).await.unwrap();
        assert_eq!(
            (update.server.as_str(), update.uri.as_str(), update.initial),
            ("py", "watch://a", false)
        );
    }
    // Another URI's update reaches nobody here.
    touch(&mut client, "py", "watch://b").await;

    drop(first);
    touch(&mut client, "py", "watch://a").await;
    let update = next(&mut second).await.unwrap();
    assert_eq!(
        update.uri, "watch://a",
        "only watch://a's updates: {update:?}"
    );
    let counted = counts(&mut client, TOKEN, "py").await;
    assert_eq!(
        counted["unsubscribe"],
        serde_json::json!({}),
        "one watcher left: {counted}"
    );

    drop(second);
    let counted = counts_until(&mut client, "py", |c| c["unsubscribe"]["watch://a"] == 1).await;
    assert_eq!(counted["subscribe"]["watch://a"], 1, "{counted}");

    let _again = watched(&mut client, "py", "watch://a").await;
    let counted = counts(&mut client, TOKEN, "py").await;
    assert_eq!(counted["subscribe"]["watch://a"], 2, "{counted}");
    gateway.shutdown().await;
}

/// 2026-07-28, over stdio and Streamable HTTP: one `subscriptions/listen`
/// per URI, shared by its watchers, cancelled when the last one leaves;
/// updates arrive on it.
#[tokio::test]
async fn a_2026_session_listens_per_uri() {
    let port = free_port();
    let _http = ChildGuard(
        Command::new(python())
            .arg(fixture("python/subscribe_server.py"))
            .args(["http", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port).await;
    let servers = format!(
        "{}      - name: http\n        lifecycle: discover\n        url: \"http://127.0.0.1:{port}/mcp\"\n",
        py_server("stdio", "discover")
    );
    let gateway = TestGateway::start(&tenant(&servers), &[]).await;
    let mut client = gateway.client().await;
    for server in ["stdio", "http"] {
        wait_listed(&mut client, TOKEN, &format!("{server}__counts")).await;
        // The session's own listen stream for list changes (tools, prompts:
        // the server announces them) is open before any watch.
        counts_until(&mut client, server, |c| c["listen_opened"] == 1).await;
        let mut first = watched(&mut client, server, "watch://a").await;
        let second = watched(&mut client, server, "watch://a").await;
        let counted = counts(&mut client, TOKEN, server).await;
        assert_eq!(
            counted["listen_opened"], 2,
            "{server}: one more, for the URI: {counted}"
        );
        assert_eq!(
            counted["subscribe"],
            serde_json::json!({}),
            "{server}: {counted}"
        );

        touch(&mut client, server, "watch://a").await;
        let update = next(&mut first).await.unwrap();
        assert_eq!(
            (update.server.as_str(), update.uri.as_str(), update.initial),
            (server, "watch://a", false)
        );

        drop(first);
        drop(second);
        counts_until(&mut client, server, |c| c["listen_closed"] == 1).await;
    }
    gateway.shutdown().await;
}

/// server-everything (2025-11-25, a server nobody here wrote) over stdio and
/// Streamable HTTP: `toggle-subscriber-updates` sends an update of every
/// URI the session subscribed to at once, then every 5 s.
#[tokio::test]
async fn server_everything_sends_updates_over_stdio_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let (_http, port) = start_everything_http(&dir.path().join("headers.log")).await;
    let servers = format!(
        "      - name: stdio\n        command: [\"{}\", \"{}\", \"stdio\"]\n      - name: http\n        url: \"http://127.0.0.1:{port}/mcp\"\n",
        node().display(),
        everything_js().display()
    );
    let gateway = TestGateway::start(&tenant(&servers), &[]).await;
    let mut client = gateway.client().await;
    let uri = "demo://resource/static/document/architecture.md";
    for server in ["stdio", "http"] {
        wait_listed(
            &mut client,
            TOKEN,
            &format!("{server}__toggle-subscriber-updates"),
        )
        .await;
        let mut stream = watched(&mut client, server, uri).await;
        invoke(
            &mut client,
            TOKEN,
            &format!("{server}__toggle-subscriber-updates"),
            "{}",
        )
        .await
        .expect("toggle");
        let update = next(&mut stream).await.unwrap();
        assert_eq!(
            (update.server.as_str(), update.uri.as_str(), update.initial),
            (server, uri, false),
            "{update:?}"
        );
    }
    gateway.shutdown().await;
}

/// What is refused before anything is subscribed: an unknown server, a
/// server without resources, one with resources but no subscriptions, one
/// over `limits.max_watches`.
#[tokio::test]
async fn refusals_name_what_is_wrong() {
    let tools_only = serve_mcp(TestServer::new(&["echo"])).await;
    let servers = format!(
        "{}      - name: plain\n        command: [\"{}\", \"{}\"]\n      - name: tools\n        url: \"{}\"\n",
        py_server("py", "initialize"),
        python().display(),
        fixture("python/env_server.py").display(),
        tools_only.url
    );
    let config = format!("limits:\n  max_watches: 1\n{}", tenant(&servers));
    let gateway = TestGateway::start(&config, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__counts").await;
    wait_listed(&mut client, TOKEN, "plain__echo").await;
    wait_listed(&mut client, TOKEN, "tools__echo").await;

    let unknown = watch(&mut client, TOKEN, "nope", "watch://a")
        .await
        .unwrap_err();
    assert_eq!(
        code_reason(&unknown),
        (tonic::Code::NotFound, "SERVER_NOT_FOUND".to_owned())
    );
    let tools = watch(&mut client, TOKEN, "tools", "watch://a")
        .await
        .unwrap_err();
    assert_eq!(
        code_reason(&tools),
        (
            tonic::Code::FailedPrecondition,
            "RESOURCES_UNSUPPORTED".to_owned()
        ),
        "{tools:?}"
    );
    // The Python SDK declares resources, without `subscribe` here.
    let plain = watch(&mut client, TOKEN, "plain", "watch://a")
        .await
        .unwrap_err();
    assert_eq!(
        code_reason(&plain),
        (
            tonic::Code::FailedPrecondition,
            "SUBSCRIBE_UNSUPPORTED".to_owned()
        ),
        "{plain:?}"
    );
    let held = watched(&mut client, "py", "watch://a").await;
    let over = watch(&mut client, TOKEN, "py", "watch://b")
        .await
        .unwrap_err();
    assert_eq!(
        code_reason(&over),
        (tonic::Code::ResourceExhausted, "WATCH_LIMIT".to_owned()),
        "{over:?}"
    );
    let counted = counts(&mut client, TOKEN, "py").await;
    assert_eq!(
        counted["subscribe"],
        serde_json::json!({"watch://a": 1}),
        "{counted}"
    );
    // The place is given back when the watch ends.
    drop(held);
    let started = Instant::now();
    loop {
        match watch(&mut client, TOKEN, "py", "watch://b").await {
            Ok(_) => break,
            Err(status) => {
                assert_eq!(reason(&status), "WATCH_LIMIT");
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "the place never came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    gateway.shutdown().await;
}

/// The server exits: the watch ends UNAVAILABLE (`UPSTREAM_CONNECTION_LOST`)
/// so the worker watches again. The gateway draining ends a watch
/// UNAVAILABLE (`DRAINING`).
#[tokio::test]
async fn a_watch_ends_when_the_server_exits_or_the_gateway_drains() {
    let servers = py_server("py", "initialize") + &py_server("other", "initialize");
    let gateway = TestGateway::start(&tenant(&servers), &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__exit").await;
    wait_listed(&mut client, TOKEN, "other__exit").await;
    let mut stream = watched(&mut client, "py", "watch://a").await;
    let mut other = watched(&mut client, "other", "watch://a").await;
    invoke(&mut client, TOKEN, "py__exit", "{}")
        .await
        .expect("exit");
    let status = ended(&mut stream).await;
    assert_eq!(
        code_reason(&status),
        (
            tonic::Code::Unavailable,
            "UPSTREAM_CONNECTION_LOST".to_owned()
        ),
        "{status:?}"
    );

    gateway.stop.drain();
    let status = ended(&mut other).await;
    assert_eq!(
        code_reason(&status),
        (tonic::Code::Unavailable, "DRAINING".to_owned()),
        "{status:?}"
    );
    gateway.shutdown().await;
}

/// Reloads (SIGHUP to a `toolgate serve`): one that removes the caller's
/// token ends its watch UNAUTHENTICATED while another token's watch goes
/// on; one that removes the server ends that watch NOT_FOUND
/// (`SERVER_REMOVED`).
#[tokio::test]
async fn reloads_end_watches_of_removed_tokens_and_servers() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = dir.path().join("toolgate.yaml");
    let config = |tokens: &str, servers: &str| {
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\ntenants:\n  - name: acme\n    tokens: [{tokens}]\n    servers:\n{servers}"
        )
    };
    let both = py_server("py", "initialize") + &py_server("keep", "initialize");
    std::fs::write(&path, config(&format!("{TOKEN}, other-token"), &both)).unwrap();
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
    let mut client = client_at(port).await;
    wait_listed(&mut client, TOKEN, "py__counts").await;
    wait_listed(&mut client, TOKEN, "keep__counts").await;
    let mut mine = watched(&mut client, "py", "watch://a").await;
    let mut theirs = watch(&mut client, "other-token", "py", "watch://a")
        .await
        .unwrap();
    assert!(next(&mut theirs).await.unwrap().initial);
    let mut kept = watch(&mut client, "other-token", "keep", "watch://a")
        .await
        .unwrap();
    assert!(next(&mut kept).await.unwrap().initial);

    // The token goes.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, config("other-token", &both)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    signal(gateway.0.id(), "HUP");
    let status = ended(&mut mine).await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // The server `py` goes: its watch ends, `keep`'s goes on.
    std::fs::write(
        &tmp,
        config("other-token", &py_server("keep", "initialize")),
    )
    .unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    signal(gateway.0.id(), "HUP");
    let status = ended(&mut theirs).await;
    assert_eq!(
        code_reason(&status),
        (tonic::Code::NotFound, "SERVER_REMOVED".to_owned()),
        "{status:?}"
    );
    let started = Instant::now();
    loop {
        let answer = invoke(
            &mut client,
            "other-token",
            "keep__touch",
            r#"{"uri":"watch://a"}"#,
        )
        .await;
        if answer.is_ok() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{answer:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let update = next(&mut kept)
        .await
        .expect("the kept server's watch goes on");
    assert_eq!((update.server.as_str(), update.initial), ("keep", false));
    drop(gateway);
}

/// Every audit record of a file, parsed.
fn audit_records(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// A watch's opening and its end are audit records (`rpc: WatchResource`,
/// `event: watch_opened` / `watch_ended`, with the server and URI); a
/// refused watch is one record.
#[tokio::test]
async fn a_watch_is_audited_when_it_opens_and_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let config = format!(
        "audit:\n  path: \"{}\"\nlimits:\n  max_watches: 1\n{}",
        path.display(),
        tenant(&py_server("py", "initialize"))
    );
    let gateway = TestGateway::start(&config, &[]).await;
    let mut client = gateway.client().await;
    wait_listed(&mut client, TOKEN, "py__counts").await;
    watch(&mut client, TOKEN, "nope", "watch://a")
        .await
        .unwrap_err();
    let stream = watched(&mut client, "py", "watch://a").await;
    // A refusal of a server the tenant has names the server.
    watch(&mut client, TOKEN, "py", "watch://b")
        .await
        .unwrap_err();
    drop(stream);
    let started = Instant::now();
    let watches = loop {
        let watches: Vec<Value> = audit_records(&path)
            .into_iter()
            .filter(|r| r["rpc"] == "WatchResource")
            .collect();
        if watches.len() >= 4 {
            break watches;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{watches:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let fields = |r: &Value| {
        (
            r["kind"].as_str().map(str::to_owned),
            r["event"].as_str().map(str::to_owned),
            r["server"].as_str().map(str::to_owned),
            r["uri"].as_str().map(str::to_owned),
            r["outcome"].as_str().map(str::to_owned),
            r["reason"].as_str().map(str::to_owned),
        )
    };
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        watches.iter().map(fields).collect::<Vec<_>>(),
        vec![
            (
                s("call"),
                s("watch_opened"),
                None,
                s("watch://a"),
                s("refused"),
                s("SERVER_NOT_FOUND")
            ),
            (
                s("call"),
                s("watch_opened"),
                s("py"),
                s("watch://a"),
                s("ok"),
                None
            ),
            (
                s("call"),
                s("watch_opened"),
                s("py"),
                s("watch://b"),
                s("refused"),
                s("WATCH_LIMIT")
            ),
            (
                s("call"),
                s("watch_ended"),
                s("py"),
                s("watch://a"),
                s("cancelled"),
                None
            ),
        ],
        "{watches:#?}"
    );
    assert_eq!(watches[3]["tenant"], "acme");
    gateway.shutdown().await;
}

/// A per-user server is watched on the subject's own session: a subject
/// that has not consented gets `UPSTREAM_AUTHORIZATION_REQUIRED` with its
/// consent URL, as a call does; once it consented, its watch reaches its
/// own session (this server offers resources without subscriptions:
/// `SUBSCRIBE_UNSUPPORTED`), while another subject still must consent.
#[tokio::test]
async fn a_per_user_server_is_watched_on_the_subjects_own_session() {
    use crate::oauth::{Scratch, authorization_url, config, consent_confirmed, env, upstream};
    let upstream = upstream(3600);
    let Scratch {
        dir: _dir,
        state_url,
        ..
    } = Scratch::new();
    let consent_port = free_port();
    let gateway = TestGateway::start(&config(&upstream, &state_url, consent_port), &env()).await;
    let mut client = gateway.client().await;
    let watch_as = |subject: &str| {
        let mut request = authed(
            "acme-token",
            pb::WatchResourceRequest {
                server: "docs".to_owned(),
                uri: "docs://readme".to_owned(),
            },
        );
        request
            .metadata_mut()
            .insert("x-toolgate-subject", subject.parse().unwrap());
        request
    };
    // Bounded: the server may still be connecting (UNAVAILABLE) at first.
    let started = Instant::now();
    let refused = loop {
        let status = client.watch_resource(watch_as("alice")).await.unwrap_err();
        if status.code() != tonic::Code::Unavailable {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{status:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let url = authorization_url(&refused);
    assert!(url.starts_with(&upstream.as_url), "{url}");

    consent_confirmed(&mut client, &url, "alice", consent_port).await;
    let status = client.watch_resource(watch_as("alice")).await.unwrap_err();
    assert_eq!(
        code_reason(&status),
        (
            tonic::Code::FailedPrecondition,
            "SUBSCRIBE_UNSUPPORTED".to_owned()
        ),
        "{status:?}"
    );
    let bob = client.watch_resource(watch_as("bob")).await.unwrap_err();
    authorization_url(&bob);
    gateway.shutdown().await;
}
