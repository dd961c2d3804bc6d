//! `tenants_dir`: tenants from a watched directory of one-tenant files,
//! with the real binary and real stdio MCP servers. A file added serves
//! its tenant; a change keeps the unchanged server's session; an invalid
//! file is refused (the log names the file and the field) while its
//! previous version serves; a removed file ends its tenant; names and
//! tokens taken by the configuration file or by an earlier file are
//! refused naming both; the Kubernetes projected-volume swap is seen; a
//! configuration reload validates every file again (precedence too); a
//! named pipe is refused without blocking a scan or the shutdown; and
//! `toolgate check` validates tenant files offline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use toolgate::pb;

use crate::binary::cli;
use crate::common::*;

/// How long any condition is waited for.
const PATIENCE: Duration = Duration::from_secs(30);

/// A stdio `env_server.py` named `name`, its environment `ROLE=role`.
fn py_server(name: &str, role: &str) -> String {
    format!(
        "  - name: {name}\n    command: [\"{}\", \"{}\"]\n    env: {{ROLE: {role}}}\n",
        python().display(),
        fixture("python/env_server.py").display()
    )
}

/// A tenant file: `tokens`, then `servers` (from [`py_server`]).
fn tenant_file(tokens: &[&str], servers: &str) -> String {
    format!("tokens: [{}]\nservers:\n{servers}", tokens.join(", "))
}

/// A tenant file without servers.
fn serverless(token: &str) -> String {
    format!("tokens: [{token}]\nservers: []\n")
}

/// Writes `text` to `path` atomically (write, then rename), as editors and
/// config management do.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A gateway configuration: one file tenant `filed` (token `file-token`,
/// no servers), then `more` tenants, and `tenants_dir` scanned every
/// 200 ms.
fn gateway_config(port: u16, metrics: u16, dir: &Path, more: &str) -> String {
    format!(
        "listen: \"127.0.0.1:{port}\"\nmetrics: {{listen: \"127.0.0.1:{metrics}\"}}\n\
         shutdown_delay: \"0s\"\ntenants:\n  - name: filed\n    tokens: [file-token]\n    \
         servers: []\n{more}tenants_dir:\n  path: {}\n  poll_interval: 200ms\n",
        dir.display()
    )
}

/// Evaluates `$cond` (which may `.await`) every 100 ms until it holds,
/// at most [`PATIENCE`].
macro_rules! eventually {
    ($what:expr, $cond:expr) => {{
        let started = Instant::now();
        while !$cond {
            assert!(started.elapsed() < PATIENCE, "never: {}", $what);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }};
}

/// Waits until the log at `path` has a line with every one of `needles`;
/// returns that line.
async fn log_line(path: &Path, needles: &[&str]) -> String {
    let started = Instant::now();
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return line.to_owned();
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no log line with {needles:?}:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

type Client = pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>;

/// The tenant's listing when `token` authenticates, else the status code.
async fn listing(client: &mut Client, token: &str) -> Result<pb::ListToolsResponse, tonic::Code> {
    client
        .list_tools(authed(token, pb::ListToolsRequest::default()))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| s.code())
}

/// Whether `token` lists exactly `servers`, all connected.
async fn serves(client: &mut Client, token: &str, servers: &[&str]) -> bool {
    listing(client, token).await.is_ok_and(|l| {
        l.servers
            .iter()
            .map(|s| s.name.as_str())
            .eq(servers.iter().copied())
            && l.servers.iter().all(|s| s.connected)
    })
}

/// Whether `token` is refused as unauthenticated.
async fn refused(client: &mut Client, token: &str) -> bool {
    listing(client, token).await == Err(tonic::Code::Unauthenticated)
}

/// The child of `parent` whose environment holds `ROLE=role`.
fn child_with_role(parent: u32, role: &str) -> Option<u32> {
    let wanted = format!("ROLE={role}");
    children_of(parent).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .any(|var| var == wanted.as_bytes())
    })
}

/// What `get_env(ROLE)` of `server` answers as the tenant of `token` (or
/// the error).
async fn role(client: &mut Client, token: &str, server: &str) -> String {
    let result = invoke(
        client,
        token,
        &format!("{server}__get_env"),
        r#"{"name":"ROLE"}"#,
    )
    .await;
    result.map_or_else(|status| format!("error: {status}"), |r| r.text)
}

struct Gateway {
    process: ChildGuard,
    client: Client,
    log: PathBuf,
    metrics: u16,
    port: u16,
    config: PathBuf,
}

async fn start(work: &Path, dir: &Path) -> Gateway {
    let (port, metrics) = (free_port(), free_port());
    let config = work.join("toolgate.yaml");
    std::fs::write(&config, gateway_config(port, metrics, dir, "")).unwrap();
    let log = work.join("gateway.log");
    let process = serve_binary(&config, &log, &[]);
    wait_for_port(port).await;
    Gateway {
        process,
        client: client_at(port).await,
        log,
        metrics,
        port,
        config,
    }
}

impl Gateway {
    async fn stop(mut self) {
        signal(self.process.0.id(), "TERM");
        let status = wait_exit(&mut self.process.0, PATIENCE).await;
        assert!(status.success(), "{status:?}");
    }
}

/// `toolgate_tenants_dir_files{state}` of the gateway whose metrics
/// listener is at `port`.
async fn files(port: u16, state: &str) -> Option<String> {
    sample(
        &scrape(port).await,
        &format!("toolgate_tenants_dir_files{{state=\"{state}\"}}"),
    )
}

#[tokio::test]
async fn files_added_changed_refused_and_removed() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("tenants");
    std::fs::create_dir(&dir).unwrap();
    let mut gateway = start(work.path(), &dir).await;
    let (pid, metrics) = (gateway.process.0.id(), gateway.metrics);
    let client = &mut gateway.client;
    assert!(refused(client, "acme-token").await);

    // Added: its token serves its servers.
    let acme = dir.join("acme.yaml");
    replace(
        &acme,
        &tenant_file(
            &["acme-token"],
            &(py_server("py", "py-1") + &py_server("py2", "py2-1")),
        ),
    );
    eventually!(
        "acme serves py and py2",
        serves(client, "acme-token", &["py", "py2"]).await
    );
    assert_eq!(role(client, "acme-token", "py2").await, "py2-1");
    let py_child = child_with_role(pid, "py-1").expect("py's child");
    let py2_child = child_with_role(pid, "py2-1").expect("py2's child");

    // Changed: py2's environment changes; py's session is kept.
    replace(
        &acme,
        &tenant_file(
            &["acme-token"],
            &(py_server("py", "py-1") + &py_server("py2", "py2-2")),
        ),
    );
    eventually!(
        "py2 restarted with its new environment",
        serves(client, "acme-token", &["py", "py2"]).await
            && role(client, "acme-token", "py2").await == "py2-2"
    );
    assert!(
        process_alive(py_child),
        "the unchanged server's child lives on"
    );
    assert_eq!(child_with_role(pid, "py-1"), Some(py_child));
    eventually!("py2's old child ends", !process_alive(py2_child));
    let before = listing(client, "acme-token").await.unwrap();
    assert_eq!(files(metrics, "ok").await.as_deref(), Some("1"));

    // Made invalid: refused, naming the file and the field; the previous
    // version keeps serving.
    replace(
        &acme,
        "tokens: [acme-token]\nservers:\n  - name: py\n    url: \"not a url\"\n",
    );
    let line = log_line(
        &gateway.log,
        &["tenants_dir file refused", "tenants[acme].servers[0].url"],
    )
    .await;
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(&acme.display().to_string()), "{line}");
    assert!(line.contains("previous version keeps serving"), "{line}");
    let still = listing(client, "acme-token").await.unwrap();
    assert_eq!(still.catalog_version, before.catalog_version);
    assert_eq!(role(client, "acme-token", "py2").await, "py2-2");
    assert_eq!(files(metrics, "invalid").await.as_deref(), Some("1"));
    assert_eq!(files(metrics, "ok").await.as_deref(), Some("0"));

    // A file naming the configuration file's tenant: refused, naming both.
    replace(&dir.join("filed.yaml"), &serverless("filed-2"));
    let line = log_line(&gateway.log, &["filed.yaml", "tenants[filed].name"]).await;
    assert!(
        line.contains("tenant `filed` is already defined by the configuration file"),
        "{line}"
    );
    assert!(refused(client, "filed-2").await);
    assert!(listing(client, "file-token").await.is_ok());

    // Two files naming one tenant: the later path is refused, naming the
    // earlier.
    replace(
        &dir.join("beta.json"),
        r#"{"tokens": ["beta-json"], "servers": []}"#,
    );
    replace(&dir.join("beta.yaml"), &serverless("beta-yaml"));
    let line = log_line(&gateway.log, &["beta.yaml", "tenants[beta].name"]).await;
    let first = dir.join("beta.json").display().to_string();
    assert!(
        line.contains(&format!(
            "tenant `beta` is already defined by tenants_dir file {first}"
        )),
        "{line}"
    );
    eventually!(
        "beta.json serves",
        listing(client, "beta-json").await.is_ok()
    );
    assert!(refused(client, "beta-yaml").await);

    // A file giving a token another tenant has: refused naming the owner,
    // never the token.
    replace(&dir.join("gamma.yaml"), &serverless("file-token"));
    let line = log_line(&gateway.log, &["gamma.yaml", "tenants[gamma].tokens[0]"]).await;
    assert!(line.contains("already tenant `filed`'s"), "{line}");
    assert!(
        !line.contains("file-token"),
        "the token is never logged: {line}"
    );
    let filed = listing(client, "file-token").await.unwrap();
    assert!(filed.servers.is_empty(), "the token still selects `filed`");

    // Removed: the tenant goes, its sessions close.
    std::fs::remove_file(&acme).unwrap();
    eventually!("acme removed", refused(client, "acme-token").await);
    eventually!("acme's children end", !process_alive(py_child));

    gateway.stop().await;
}

#[tokio::test]
async fn the_projected_volume_swap_and_configuration_reloads_apply() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("tenants");
    std::fs::create_dir(&dir).unwrap();
    // What the kubelet writes: a timestamped directory, `..data` pointing
    // at it, and one symlink per key through `..data`.
    let first = dir.join("..2026_12_02_10_00_00.000000001");
    std::fs::create_dir(&first).unwrap();
    std::fs::write(
        first.join("acme.yaml"),
        tenant_file(&["acme-1"], &py_server("py", "v1")),
    )
    .unwrap();
    std::os::unix::fs::symlink(first.file_name().unwrap(), dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/acme.yaml", dir.join("acme.yaml")).unwrap();
    let mut gateway = start(work.path(), &dir).await;
    let metrics = gateway.metrics;
    let client = &mut gateway.client;
    eventually!("acme serves", serves(client, "acme-1", &["py"]).await);

    // An update: a new directory, then `..data` swapped to it atomically
    // (a new link renamed over the old one).
    let second = dir.join("..2026_12_02_10_05_00.000000002");
    std::fs::create_dir(&second).unwrap();
    std::fs::write(
        second.join("acme.yaml"),
        tenant_file(&["acme-2"], &py_server("py", "v2")),
    )
    .unwrap();
    std::os::unix::fs::symlink(second.file_name().unwrap(), dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();
    eventually!(
        "the new version serves",
        serves(client, "acme-2", &["py"]).await && role(client, "acme-2", "py").await == "v2"
    );
    assert!(refused(client, "acme-1").await);
    // The hidden entries are not tenants.
    let log = std::fs::read_to_string(&gateway.log).unwrap();
    assert!(!log.contains("tenants_dir file refused"), "{log}");
    assert_eq!(files(metrics, "ok").await.as_deref(), Some("1"));

    // A configuration reload (SIGHUP) validates every file again against
    // the new configuration: one that now defines `acme` wins over the
    // file, and the file's tenant serves again once it is gone.
    let (pid, port, config) = (gateway.process.0.id(), gateway.port, gateway.config.clone());
    let acme_in_file = "  - name: acme\n    tokens: [file-acme]\n    servers: []\n";
    replace(&config, &gateway_config(port, metrics, &dir, acme_in_file));
    signal(pid, "HUP");
    eventually!(
        "the file's acme serves",
        listing(client, "file-acme").await.is_ok()
    );
    assert!(refused(client, "acme-2").await);
    let line = log_line(&gateway.log, &["tenants_dir file refused", "acme.yaml"]).await;
    assert!(
        line.contains("tenant `acme` is already defined by the configuration file"),
        "{line}"
    );
    assert_eq!(files(metrics, "invalid").await.as_deref(), Some("1"));
    replace(&config, &gateway_config(port, metrics, &dir, ""));
    signal(pid, "HUP");
    eventually!(
        "the directory's acme serves again",
        serves(client, "acme-2", &["py"]).await
    );
    assert!(refused(client, "file-acme").await);
    log_line(&gateway.log, &["tenants_dir file accepted", "acme.yaml"]).await;
    gateway.stop().await;
}

/// Makes a named pipe at `path` (no writer ever opens it).
fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Item 6 of issue 37: a named pipe in the directory, there at start and
/// added later, is refused naming the file, without blocking the scans:
/// the other tenants load, at start and after it, a reload reads every
/// file again, and SIGTERM ends the real binary promptly.
#[tokio::test]
async fn a_named_pipe_is_refused_and_blocks_neither_scans_nor_the_shutdown() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("tenants");
    std::fs::create_dir(&dir).unwrap();
    let early_pipe = dir.join("piped.yaml");
    mkfifo(&early_pipe);
    replace(&dir.join("early.yaml"), &serverless("early-token"));
    let mut gateway = start(work.path(), &dir).await;
    let (pid, metrics) = (gateway.process.0.id(), gateway.metrics);
    let line = log_line(
        &gateway.log,
        &[
            "tenants_dir file refused",
            &early_pipe.display().to_string(),
        ],
    )
    .await;
    assert!(
        line.contains("is a named pipe (FIFO), not a regular file"),
        "{line}"
    );
    let client = &mut gateway.client;
    eventually!("early serves", listing(client, "early-token").await.is_ok());
    assert!(listing(client, "file-token").await.is_ok());

    // Added while serving: another pipe, then a tenant; the scans go on.
    let late_pipe = dir.join("late-pipe.yml");
    mkfifo(&late_pipe);
    replace(&dir.join("late.yaml"), &serverless("late-token"));
    eventually!("late serves", listing(client, "late-token").await.is_ok());
    log_line(
        &gateway.log,
        &[
            "tenants_dir file refused",
            &late_pipe.display().to_string(),
            "named pipe",
        ],
    )
    .await;
    assert_eq!(files(metrics, "invalid").await.as_deref(), Some("2"));
    assert_eq!(files(metrics, "ok").await.as_deref(), Some("2"));

    // A reload reads every file again, the pipes too.
    signal(pid, "HUP");
    log_line(&gateway.log, &["configuration reloaded"]).await;
    assert!(listing(client, "late-token").await.is_ok());

    // SIGTERM: the process ends promptly (no shutdown delay configured).
    let asked = Instant::now();
    signal(pid, "TERM");
    let status = wait_exit(&mut gateway.process.0, Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "exited {:?} after SIGTERM",
        asked.elapsed()
    );
}

#[tokio::test]
async fn check_validates_tenant_files() {
    let work = tempfile::tempdir().unwrap();
    let good = work.path().join("good.yaml");
    std::fs::write(&good, tenant_file(&["good-token"], &py_server("py", "x"))).unwrap();
    let bad = work.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: bad\ntokens: [bad-token]\nservers:\n  - name: web\n    url: \"not a url\"\n",
    )
    .unwrap();
    let path = |p: &Path| p.display().to_string();

    let (code, stdout, stderr) = cli(&["check", "--tenant", &path(&good)], None).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("tenant good is valid (1 server(s))"),
        "{stdout}"
    );

    let (code, stdout, stderr) = cli(&["check", "--tenant", &path(&good), &path(&bad)], None).await;
    assert_eq!(code, 64, "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: tenants[bad].servers[0].url: not a valid URL",
            path(&bad)
        )),
        "{stderr}"
    );
    assert!(stdout.contains("tenant good is valid"), "{stdout}");

    // Against a configuration that defines `good`: refused, naming it.
    let config = work.path().join("toolgate.yaml");
    std::fs::write(
        &config,
        "tenants:\n  - name: good\n    tokens: [other]\n    servers: []\n",
    )
    .unwrap();
    let (code, _, stderr) = cli(
        &[
            "check",
            "--config",
            &path(&config),
            "--tenant",
            &path(&good),
        ],
        None,
    )
    .await;
    assert_eq!(code, 64, "{stderr}");
    assert!(
        stderr.contains(
            "tenants[good].name: tenant `good` is already defined by the configuration file"
        ),
        "{stderr}"
    );

    // A configuration with tenants_dir: every file of it is checked.
    let dir = work.path().join("tenants");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(&good, dir.join("good2.yaml")).unwrap();
    std::fs::write(&config, "tenants: []\ntenants_dir: {path: tenants}\n").unwrap();
    let (code, stdout, stderr) = cli(&["check", "--offline", "-c", &path(&config)], None).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("1 file(s), 1 valid"), "{stdout}");
    std::fs::copy(&bad, dir.join("bad.yaml")).unwrap();
    let (code, stdout, stderr) = cli(&["check", "--offline", "-c", &path(&config)], None).await;
    assert_eq!(code, 64, "{stdout}{stderr}");
    assert!(
        stderr.contains("bad.yaml: tenants[bad].servers[0].url"),
        "{stderr}"
    );
}
