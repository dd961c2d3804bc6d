//! Hot reload of the configuration: SIGHUP and file changes (including a
//! Kubernetes-style symlink swap); invalid configurations are refused;
//! unchanged sessions are untouched; in-flight calls finish on the session
//! they started on.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use toolgate::pb;

use crate::common::*;

fn py_server(name: &str) -> String {
    format!(
        "      - name: {name}\n        command: [\"{}\", \"{}\"]\n",
        python().display(),
        fixture("python/env_server.py").display()
    )
}

fn everything_server() -> String {
    format!(
        "      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n",
        node().display(),
        everything_js().display()
    )
}

fn config(port: u16, tenants: &str) -> String {
    format!("listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\ntenants:\n{tenants}")
}

/// Writes `text` to `path` atomically (write, then rename), as editors and
/// config management do.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn wait_for<F: FnMut(&pb::ListToolsResponse) -> bool>(
    client: &mut pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
    token: &str,
    mut done: F,
) -> pb::ListToolsResponse {
    let started = Instant::now();
    loop {
        if let Ok(listing) = client
            .list_tools(authed(token, pb::ListToolsRequest::default()))
            .await
        {
            let listing = listing.into_inner();
            if done(&listing) {
                return listing;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the reload never showed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn command_line(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .replace('\0', " ")
}

#[tokio::test]
async fn reload_on_sighup_keeps_unchanged_sessions_and_refuses_bad_configs() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = dir.path().join("toolgate.yaml");
    let acme = |servers: &str| {
        format!("  - name: acme\n    tokens: [acme-token]\n    servers:\n{servers}")
    };
    std::fs::write(
        &path,
        config(port, &acme(&(py_server("py") + &everything_server()))),
    )
    .unwrap();
    let log_path = dir.path().join("gateway.log");
    let mut gateway = ChildGuard(
        Command::new(toolgate_bin())
            .args(["serve", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let pid = gateway.0.id();
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    wait_for(&mut client, "acme-token", |l| {
        l.servers.iter().all(|s| s.connected)
    })
    .await;
    let children = children_of(pid);
    let py_child = *children
        .iter()
        .find(|c| command_line(**c).contains("env_server.py"))
        .unwrap();
    let everything_child = *children
        .iter()
        .find(|c| command_line(**c).contains("server-everything"))
        .unwrap();

    // A call in flight on `everything`, which the reload removes.
    let mut slow_client = client.clone();
    let slow = tokio::spawn(async move {
        invoke(
            &mut slow_client,
            "acme-token",
            "everything__trigger-long-running-operation",
            r#"{"duration":3,"steps":3}"#,
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(800)).await;

    // Remove `everything`, add `py2` and a new tenant; `py` is unchanged.
    let globex = "  - name: globex\n    tokens: [globex-token]\n    servers:\n".to_owned()
        + &py_server("py");
    replace(
        &path,
        &config(
            port,
            &(acme(&(py_server("py") + &py_server("py2"))) + &globex),
        ),
    );
    signal(pid, "HUP");
    let listing = wait_for(&mut client, "acme-token", |l| {
        l.servers.iter().map(|s| s.name.as_str()).eq(["py", "py2"])
            && l.servers.iter().all(|s| s.connected)
    })
    .await;
    let servers: Vec<&str> = listing.servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(servers, ["py", "py2"]);
    assert!(
        listing
            .tools
            .iter()
            .all(|t| !t.name.starts_with("everything__"))
    );
    assert!(
        process_alive(py_child),
        "the unchanged session keeps its child"
    );
    assert!(children_of(pid).contains(&py_child));
    // The new tenant's token works at once.
    assert!(!list(&mut client, "globex-token").await.tools.is_empty());

    // The in-flight call finished on the session it started on.
    let result = tokio::time::timeout(Duration::from_secs(20), slow)
        .await
        .unwrap()
        .unwrap();
    assert!(!result.expect("in-flight call completes").is_error);
    // Then that session is closed.
    let started = Instant::now();
    while process_alive(everything_child) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the removed server's child lives on"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // An invalid config is refused; the gateway keeps serving the old one.
    replace(
        &path,
        "tenants:\n  - name: acme\n    tokens: [{ env: NOT_SET_ANYWHERE }]\n",
    );
    signal(pid, "HUP");
    let started = Instant::now();
    loop {
        let log = std::fs::read_to_string(&log_path).unwrap();
        if log.contains("configuration reload refused") {
            assert!(
                log.contains("NOT_SET_ANYWHERE"),
                "the reason names the problem"
            );
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let still = list(&mut client, "acme-token").await;
    assert_eq!(still.catalog_version, listing.catalog_version);
    signal(pid, "TERM");
    assert!(
        wait_exit(&mut gateway.0, Duration::from_secs(30))
            .await
            .success()
    );
}

#[tokio::test]
async fn a_configmap_style_symlink_swap_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Kubernetes layout: config.yaml -> ..data/config.yaml, ..data -> ..v1
    let write_version = |name: &str, tenants: &str| {
        let version = dir.path().join(name);
        std::fs::create_dir_all(&version).unwrap();
        std::fs::write(version.join("config.yaml"), config(port, tenants)).unwrap();
    };
    let tenant = |token: &str| {
        format!(
            "  - name: acme\n    tokens: [{token}]\n    servers:\n{}",
            py_server("py")
        )
    };
    write_version("..v1", &tenant("first-token"));
    std::os::unix::fs::symlink("..v1", dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yaml", dir.path().join("config.yaml")).unwrap();
    let mut gateway = ChildGuard(
        Command::new(toolgate_bin())
            .args(["serve", "--config"])
            .arg(dir.path().join("config.yaml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    wait_for(&mut client, "first-token", |l| !l.tools.is_empty()).await;

    // Swap ..data atomically to a new version with a rotated token.
    write_version("..v2", &tenant("rotated-token"));
    std::os::unix::fs::symlink("..v2", dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    wait_for(&mut client, "rotated-token", |l| !l.tools.is_empty()).await;
    let err = client
        .list_tools(authed("first-token", pb::ListToolsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::Unauthenticated,
        "the old token is gone"
    );
    signal(gateway.0.id(), "TERM");
    assert!(
        wait_exit(&mut gateway.0, Duration::from_secs(30))
            .await
            .success()
    );
}

/// A `WatchTools` stream whose static token a reload (SIGHUP) removes ends
/// with UNAUTHENTICATED at the reload, and never shows what the new
/// configuration adds; the tenant's other token sees it.
#[tokio::test]
async fn a_watch_ends_when_a_reload_removes_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = dir.path().join("toolgate.yaml");
    let acme = |tokens: &str, servers: &str| {
        format!("  - name: acme\n    tokens: [{tokens}]\n    servers:\n{servers}")
    };
    std::fs::write(
        &path,
        config(port, &acme("acme-token, keeper-token", &py_server("py"))),
    )
    .unwrap();
    let log_path = dir.path().join("gateway.log");
    let gateway = ChildGuard(
        Command::new(toolgate_bin())
            .args(["serve", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    wait_for(&mut client, "acme-token", |l| {
        l.servers.iter().all(|s| s.connected)
    })
    .await;
    let mut stream = client
        .watch_tools(authed("acme-token", pb::WatchToolsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().expect("a first snapshot");
    assert!(first.servers.iter().all(|s| s.connected), "{first:?}");

    // The token goes; a server comes, which a live watch would show.
    replace(
        &path,
        &config(
            port,
            &acme("keeper-token", &(py_server("py") + &py_server("py2"))),
        ),
    );
    let reloaded = Instant::now();
    signal(gateway.0.id(), "HUP");
    let ended = loop {
        let message = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("the stream ended within 20 s of the reload");
        match message {
            Ok(Some(snapshot)) => assert!(
                snapshot.servers.iter().all(|s| s.name != "py2"),
                "a snapshot of the new configuration reached the removed token: {snapshot:?}"
            ),
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    eprintln!("the watch ended {:?} after SIGHUP", reloaded.elapsed());
    assert_eq!(
        (ended.code(), crate::common::reason(&ended).as_str()),
        (tonic::Code::Unauthenticated, "UNAUTHENTICATED"),
        "{ended:?}"
    );
    assert!(
        stream.message().await.unwrap().is_none(),
        "nothing follows the end"
    );
    // The reload took effect: the other token sees the new server, the
    // removed one is refused.
    wait_for(&mut client, "keeper-token", |l| {
        l.servers.iter().any(|s| s.name == "py2")
    })
    .await;
    let refused = client
        .list_tools(authed("acme-token", pb::ListToolsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    drop(gateway);
}
