//! Stdio servers as real processes: every end of a session stops the
//! server's whole process group (helpers included, even when the server
//! itself exits on EOF), an answer over `limits.max_result_bytes` fails its
//! call at once and leaves the session up, and stderr reaches the log
//! redacted.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tonic::Code;

use crate::common::*;

const TOKEN: &str = "acme-token";

/// A gateway config with one tenant and one `process_server.py` server
/// whose `env` block is `env` (YAML lines at the server's indentation + 4).
fn config(port: u16, env: &str, extra: &str) -> String {
    format!(
        "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\n{extra}tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: proc\n        command: [\"{}\", \"{}\"]\n        env:\n{env}",
        python().display(),
        fixture("python/process_server.py").display(),
    )
}

/// `toolgate serve` on `config`, its log in `log`; killed on drop.
/// Waits (bounded) until `file` holds a pid.
async fn read_pid(file: &Path) -> u32 {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no pid in {}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fields of `/proc/<pid>/stat` after the command name: state, ppid, pgrp.
fn stat(pid: u32) -> Option<(String, u32, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after) = text.rsplit_once(')')?;
    let mut fields = after.split_whitespace();
    let state = fields.next()?.to_owned();
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// Every process of process group `pgrp` that has not exited. Zombies do
/// not count: they are dead, and in this sandbox PID 1 never reaps the
/// orphans among them (a killed orphan stays a zombie of PID 1 forever).
fn live_members(pgrp: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some((state, _, group)) = stat(pid)
            && group == pgrp
            && state != "Z"
            && state != "X"
        {
            found.push(pid);
        }
    }
    found
}

/// The gateway's one stdio child, once it is up (bounded).
async fn server_pid(gateway: u32, not: Option<u32>) -> u32 {
    let started = Instant::now();
    loop {
        let children: Vec<u32> = children_of(gateway)
            .into_iter()
            .filter(|c| Some(*c) != not && process_alive(*c))
            .collect();
        if let [only] = children[..] {
            return only;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the gateway's children: {children:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_connected(port: u16) {
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    let started = Instant::now();
    while !list(&mut client, TOKEN)
        .await
        .servers
        .iter()
        .all(|s| s.connected)
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn env_line(key: &str, value: &Path) -> String {
    format!("          {key}: \"{}\"\n", value.display())
}

#[tokio::test]
async fn sigterm_leaves_no_process_of_the_server_group() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pid_file = dir.path().join("helper.pid");
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config_path,
        config(port, &env_line("HELPER_PID_FILE", &pid_file), ""),
    )
    .unwrap();
    let log = dir.path().join("gateway.log");
    let mut gateway = serve_binary(&config_path, &log, &[]);
    let gateway_pid = gateway.0.id();
    wait_connected(port).await;
    let server = server_pid(gateway_pid, None).await;
    let helper = read_pid(&pid_file).await;
    // The helper is a plain child of the server, in its process group
    // (the server leads it).
    assert_eq!(stat(helper).map(|s| (s.1, s.2)), Some((server, server)));

    signal(gateway_pid, "TERM");
    let status = wait_exit(&mut gateway.0, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0));
    // The gateway returned only once the group was gone: no wait here.
    assert_eq!(
        live_members(server),
        Vec::<u32>::new(),
        "processes of the server's group outlived the gateway"
    );
    assert!(
        !process_alive(helper),
        "the helper {helper} outlived the gateway"
    );
}

#[tokio::test]
async fn a_group_that_ignores_eof_and_sigterm_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pid_file = dir.path().join("helper.pid");
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config_path,
        config(
            port,
            &(env_line("HELPER_PID_FILE", &pid_file) + "          STUBBORN: \"1\"\n"),
            "",
        ),
    )
    .unwrap();
    let log = dir.path().join("gateway.log");
    let mut gateway = serve_binary(&config_path, &log, &[]);
    let gateway_pid = gateway.0.id();
    wait_connected(port).await;
    let server = server_pid(gateway_pid, None).await;
    let helper = read_pid(&pid_file).await;

    let sent = Instant::now();
    signal(gateway_pid, "TERM");
    let status = wait_exit(&mut gateway.0, Duration::from_secs(30)).await;
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(0));
    assert_eq!(live_members(server), Vec::<u32>::new());
    assert!(!process_alive(helper));
    // The grace (3 s), SIGTERM ignored (2 s), then SIGKILL; within the
    // close timeout (10 s).
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(10),
        "took {took:?}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("outlived SIGTERM; sending SIGKILL"), "{text}");
}

#[tokio::test]
async fn a_reload_that_replaces_the_server_stops_its_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let first_file = dir.path().join("first.pid");
    let second_file = dir.path().join("second.pid");
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config_path,
        config(port, &env_line("HELPER_PID_FILE", &first_file), ""),
    )
    .unwrap();
    let log = dir.path().join("gateway.log");
    let mut gateway = serve_binary(&config_path, &log, &[]);
    let gateway_pid = gateway.0.id();
    wait_connected(port).await;
    let first = server_pid(gateway_pid, None).await;
    let first_helper = read_pid(&first_file).await;
    assert_eq!(stat(first_helper).map(|s| s.2), Some(first));

    // A changed `env` replaces the server.
    let tmp = dir.path().join("toolgate.yaml.tmp");
    std::fs::write(
        &tmp,
        config(
            port,
            &(env_line("HELPER_PID_FILE", &second_file) + "          EXTRA: \"1\"\n"),
            "",
        ),
    )
    .unwrap();
    std::fs::rename(&tmp, &config_path).unwrap();
    signal(gateway_pid, "HUP");
    let second_helper = read_pid(&second_file).await;
    let second = server_pid(gateway_pid, Some(first)).await;
    assert_ne!(second, first);

    let started = Instant::now();
    while !live_members(first).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the old server's group outlived the reload: {:?}",
            live_members(first)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!process_alive(first_helper));
    assert!(
        gateway.0.try_wait().unwrap().is_none(),
        "the gateway still runs"
    );
    assert!(process_alive(second_helper), "the new server's helper runs");
    let mut client = client_at(port).await;
    let echoed = invoke(&mut client, TOKEN, "proc__echo", r#"{"text":"hi"}"#)
        .await
        .unwrap();
    assert_eq!(echoed.text, "hi");

    signal(gateway_pid, "TERM");
    wait_exit(&mut gateway.0, Duration::from_secs(30)).await;
    assert!(live_members(second).is_empty());
    assert!(!process_alive(second_helper));
}

#[tokio::test]
async fn an_answer_over_max_result_bytes_fails_that_call_at_once() {
    let yaml = format!(
        "limits:\n  max_result_bytes: 1048576\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: proc\n        command: [\"{}\", \"{}\"]\n        call_timeout: \"60s\"\n",
        python().display(),
        fixture("python/process_server.py").display(),
    );
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    let pid = invoke(&mut client, TOKEN, "proc__pid", "{}")
        .await
        .unwrap()
        .text;

    // Under the limit: fine.
    let fits = invoke(&mut client, TOKEN, "proc__big", r#"{"size":900000}"#)
        .await
        .unwrap();
    assert_eq!(fits.text.len(), 900_000);

    let started = Instant::now();
    let status = invoke(&mut client, TOKEN, "proc__big", r#"{"size":3145728}"#)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "RESULT_TOO_LARGE", "{status:?}");
    assert!(
        status.message().contains("1048576"),
        "the message names the limit: {}",
        status.message()
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // The session is the same one, and works.
    let echoed = invoke(&mut client, TOKEN, "proc__echo", r#"{"text":"after"}"#)
        .await
        .unwrap();
    assert_eq!(echoed.text, "after");
    let same = invoke(&mut client, TOKEN, "proc__pid", "{}")
        .await
        .unwrap()
        .text;
    assert_eq!(same, pid, "the session was not replaced");
    gateway.shutdown().await;
}

#[tokio::test]
async fn stderr_lines_are_redacted_in_the_log() {
    const SECRET: &str = "stdio-secret-7d1e9c2b4a";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config_path = dir.path().join("toolgate.yaml");
    std::fs::write(
        &config_path,
        config(
            port,
            "          LEAKY_SECRET: { env: PROC_TEST_SECRET }\n",
            "",
        ),
    )
    .unwrap();
    let log: PathBuf = dir.path().join("gateway.log");
    let mut gateway = serve_binary(&config_path, &log, &[("PROC_TEST_SECRET", SECRET)]);
    wait_connected(port).await;
    // The server printed the line before it answered `initialize`.
    signal(gateway.0.id(), "TERM");
    wait_exit(&mut gateway.0, Duration::from_secs(30)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("the secret is [redacted]") && l.contains("server=proc")),
        "{text}"
    );
    assert!(!text.contains(SECRET), "the secret reached the log: {text}");
}
