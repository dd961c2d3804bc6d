//! The real `toolgate` binary: exit codes, `check`, and `serve` with
//! signals, drain and child cleanup.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn write_config(dir: &std::path::Path, yaml: &str) -> std::path::PathBuf {
    let path = dir.join("toolgate.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

#[test]
fn invalid_config_exits_64_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "tenants:\n  - name: acme\n    tokens: [{ env: TOOLGATE_TEST_UNSET_VAR }]\n    servers:\n      - name: a\n        command: [x]\n        url: \"http://127.0.0.1/\"\n",
    );
    for verb in ["serve", "check"] {
        let output = Command::new(toolgate_bin())
            .arg(verb)
            .arg("--config")
            .arg(&config)
            .env_remove("TOOLGATE_TEST_UNSET_VAR")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(64), "{verb}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(
                "tenants[0].tokens[0]: environment variable TOOLGATE_TEST_UNSET_VAR is not set"
            ),
            "{stderr}"
        );
        assert!(
            stderr.contains("tenants[0].servers[0]: set either"),
            "{stderr}"
        );
    }
    let unknown = write_config(dir.path(), "listen: \"127.0.0.1:1\"\ntenant: []\n");
    let output = Command::new(toolgate_bin())
        .args(["check", "--config"])
        .arg(&unknown)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown field `tenant`"));
}

#[test]
fn check_connects_and_prints_each_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let good = format!(
        "tenants:\n  - name: acme\n    tokens: [t1]\n    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n      - name: py\n        command: [\"{}\", \"{}\"]\n",
        node().display(),
        everything_js().display(),
        python().display(),
        fixture("python/env_server.py").display(),
    );
    let config = write_config(dir.path(), &good);
    let output = Command::new(toolgate_bin())
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        "tenant acme",
        "server everything (stdio): connected",
        "everything__echo",
        "py__get_env",
    ] {
        assert!(stdout.contains(expected), "{expected} in {stdout}");
    }

    let broken = format!(
        "{good}  - name: globex\n    tokens: [t2]\n    servers:\n      - name: gone\n        command: [\"/nonexistent/mcp-server\"]\n"
    );
    let config = write_config(dir.path(), &broken);
    let output = Command::new(toolgate_bin())
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("server gone (stdio): FAILED: cannot start `/nonexistent/mcp-server`"),
        "{stdout}"
    );
}

#[tokio::test]
async fn serve_drains_on_sigterm_and_leaves_no_child_behind() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        &format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"2s\"\nshutdown_grace: \"20s\"\ntenants:\n  - name: acme\n    tokens: [{{ env: ACME_TOKEN }}]\n    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n      - name: py\n        command: [\"{}\", \"{}\"]\n        env:\n          API_KEY: {{ env: PY_API_KEY }}\n",
            node().display(),
            everything_js().display(),
            python().display(),
            fixture("python/env_server.py").display(),
        ),
    );
    let log_path = dir.path().join("gateway.log");
    let mut gateway = ChildGuard(
        Command::new(toolgate_bin())
            .args(["serve", "--config"])
            .arg(&config)
            .env("ACME_TOKEN", "acme-token")
            .env("GATEWAY_ONLY_SECRET", "must-not-leak")
            .env("PY_API_KEY", "upstream-api-key-value")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let pid = gateway.0.id();
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    let listing = list(&mut client, "acme-token").await;
    assert!(
        listing.servers.iter().all(|s| s.connected),
        "{:?}",
        listing.servers
    );

    // A variable of the gateway's own environment is absent in the child.
    let leaked = invoke(
        &mut client,
        "acme-token",
        "py__get_env",
        r#"{"name":"GATEWAY_ONLY_SECRET"}"#,
    )
    .await
    .unwrap();
    assert_eq!(leaked.text, "<unset>");
    let configured = invoke(
        &mut client,
        "acme-token",
        "py__get_env",
        r#"{"name":"API_KEY"}"#,
    )
    .await
    .unwrap();
    // It arrived (it is set), and the gateway redacts a configured
    // credential from tool results by default.
    assert_eq!(configured.text, "[redacted]");

    let children = children_of(pid);
    assert_eq!(
        children.len(),
        2,
        "one child per stdio server: {children:?}"
    );

    // A slow call is in flight when SIGTERM arrives; it completes.
    let mut slow_client = client.clone();
    let slow = tokio::spawn(async move {
        invoke(
            &mut slow_client,
            "acme-token",
            "everything__trigger-long-running-operation",
            r#"{"duration":5,"steps":5}"#,
        )
        .await
    });
    // Give the call time to reach the server (it runs 5 s, so a second of
    // slack still leaves it in flight when the signal arrives).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sent = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );

    let result = tokio::time::timeout(Duration::from_secs(20), slow)
        .await
        .unwrap()
        .unwrap();
    let result = result.expect("the in-flight call completes during the drain");
    assert!(!result.is_error, "{result:?}");

    let status = loop {
        if let Some(status) = gateway.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(30),
            "gateway did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0));
    for child in children {
        assert!(!process_alive(child), "child {child} outlived the gateway");
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    // The child's stderr is captured into the gateway's log, labelled.
    assert!(
        log.lines()
            .any(|l| l.contains("Starting default (STDIO) server")
                && l.contains("server=everything")
                && l.contains("tenant=acme")),
        "{log}"
    );
    assert!(
        !log.contains("acme-token"),
        "the caller token never appears in logs"
    );
}

#[test]
fn demo_runs_end_to_end() {
    let output = Command::new(toolgate_bin()).arg("demo").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        "tool   repo__count_issues",
        "text=\"toolgate has 3 open issues\"",
        "[1 non-text content block(s) omitted]",
        "is_error=true",
        "NotFound",
    ] {
        assert!(stdout.contains(expected), "{expected} in {stdout}");
    }
}

/// The README's first command, taken from the README the way `.ci/run`
/// takes it (and runs it), starts this binary's demo: `cargo run` picks
/// `toolgate` among the package's binaries, and `demo` is a verb of it.
#[test]
fn readme_first_command_runs_the_demo() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("bash")
        .arg(root.join(".ci/run"))
        .arg("--print-readme-demo")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8(output.stdout).unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let dashes = words.iter().position(|w| *w == "--");
    let (cargo, args) = match dashes {
        Some(i) => (&words[..i], &words[i + 1..]),
        None => (&words[..], &[][..]),
    };
    assert_eq!(cargo.get(..2), Some(&["cargo", "run"][..]), "{line}");
    assert!(args.contains(&"demo"), "{line}");

    // Which binary `cargo run` runs: `--bin NAME`, else the package's
    // `default-run`, else its only binary.
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let binaries = manifest.lines().filter(|l| l.trim() == "[[bin]]").count();
    let default_run = manifest.lines().find_map(|l| {
        let (key, value) = l.split_once('=')?;
        (key.trim() == "default-run").then(|| value.trim().trim_matches('"').to_owned())
    });
    let chosen = match cargo.iter().position(|w| *w == "--bin") {
        Some(i) => cargo.get(i + 1).map(|b| (*b).to_owned()),
        None if binaries <= 1 => Some("toolgate".to_owned()),
        None => default_run,
    };
    assert_eq!(
        chosen.as_deref(),
        Some("toolgate"),
        "`{}` must run the toolgate binary ({binaries} binaries in Cargo.toml)",
        line.trim()
    );

    let output = Command::new(toolgate_bin()).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("done: the gateway drained"), "{stdout}");
}

/// A secret written where the file expects another shape is not echoed:
/// the error names the path and what was expected.
#[test]
fn config_errors_do_not_echo_a_misplaced_secret() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "tenants:\n  - name: acme\n    tokens: \"super-secret-value\"\n",
    );
    let output = Command::new(toolgate_bin())
        .args(["check", "--offline", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("tenants[0].tokens: invalid type: a string, expected a sequence"),
        "{stderr}"
    );
    assert!(!stderr.contains("super-secret-value"), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("super-secret-value"));
}

/// `check` warns about servers reached over plain http:// on another
/// host, naming tenant and server, with or without `--offline`.
#[test]
fn check_warns_about_plain_http_to_a_remote_host() {
    let dir = tempfile::tempdir().unwrap();
    let check = |yaml: &str, offline: bool| {
        let config = write_config(dir.path(), yaml);
        let mut command = Command::new(toolgate_bin());
        command.arg("check");
        if offline {
            command.arg("--offline");
        }
        let output = command.arg("--config").arg(&config).output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let tenant = "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: local\n        url: \"http://127.0.0.1:9/mcp\"\n        connect_timeout: \"300ms\"\n";
    let warning = "warning: tenants[0].servers[1] (tenant `acme`, server `crm`): url uses plain \
                   http:// to a non-loopback host";

    let remote = format!(
        "{tenant}      - name: crm\n        url: \"http://example.com/mcp\"\n        headers:\n          Authorization: \"Bearer abc\"\n"
    );
    let (code, stdout) = check(&remote, true);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "{warning} (example.com); configured headers travel unencrypted"
        )),
        "{stdout}"
    );
    assert_eq!(stdout.matches("warning:").count(), 1, "{stdout}");

    // Connecting: a non-routable address (TEST-NET-1) fails fast with a
    // short connect timeout; the warning is printed all the same.
    let unreachable = format!(
        "{tenant}      - name: crm\n        url: \"http://192.0.2.1:9/mcp\"\n        connect_timeout: \"300ms\"\n"
    );
    let (code, stdout) = check(&unreachable, false);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!("{warning} (192.0.2.1)")),
        "{stdout}"
    );

    let loopback = format!(
        "{tenant}      - name: crm\n        url: \"http://localhost:9/mcp\"\n        headers:\n          Authorization: \"Bearer abc\"\n"
    );
    let (code, stdout) = check(&loopback, true);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(!stdout.contains("warning"), "{stdout}");
}

/// `serve` logs the plain-http warning at start, naming tenant and server.
#[tokio::test]
async fn serve_logs_the_plain_http_warning_at_start_and_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let yaml = |extra: &str| {
        format!(
            "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\ntenants:\n  - name: acme\n    tokens: [t]\n    connect: lazy\n    servers:\n      - name: crm\n        url: \"http://example.com/mcp\"\n      - name: local\n        url: \"http://127.0.0.1:9/mcp\"\n{extra}"
        )
    };
    let config = write_config(dir.path(), &yaml(""));
    let log_path = dir.path().join("gateway.log");
    let mut gateway = serve_binary(&config, &log_path, &[]);
    let wait_log = |needle: &'static str, count: usize| {
        let log_path = log_path.clone();
        async move {
            let started = Instant::now();
            loop {
                let log = std::fs::read_to_string(&log_path).unwrap();
                if log.matches(needle).count() >= count {
                    return log;
                }
                assert!(started.elapsed() < Duration::from_secs(20), "{log}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let log = wait_log("toolgate serving", 1).await;
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("configuration warning"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    for expected in [
        "WARN",
        "path=tenants[0].servers[0]",
        "tenant=acme",
        "server=crm",
        "plain http:// to a non-loopback host (example.com)",
    ] {
        assert!(warnings[0].contains(expected), "{expected} in {log}");
    }

    // A reload that adds another such server warns again, naming it.
    std::fs::write(
        &config,
        yaml("      - name: wiki\n        url: \"http://wiki.example.org/mcp\"\n"),
    )
    .unwrap();
    signal(gateway.0.id(), "HUP");
    let log = wait_log("server=wiki", 1).await;
    assert!(
        log.lines()
            .any(|l| l.contains("configuration warning") && l.contains("server=wiki")),
        "{log}"
    );

    signal(gateway.0.id(), "TERM");
    let status = wait_exit(&mut gateway.0, Duration::from_secs(40)).await;
    assert_eq!(status.code(), Some(0));
}

pub(crate) async fn cli(args: &[&str], token: Option<&str>) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(toolgate_bin());
    command
        .args(args)
        .env_remove("TOOLGATE_TOKEN")
        .env_remove("TOOLGATE_ADDR");
    if let Some(token) = token {
        command.env("TOOLGATE_TOKEN", token);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn cli_verbs_list_call_and_exit_by_status() {
    let gateway = TestGateway::start(
        &format!(
            "tenants:\n  - name: acme\n    tokens: [cli-token]\n    servers:\n      - name: py\n        command: [\"{}\", \"{}\"]\n",
            python().display(),
            fixture("python/env_server.py").display()
        ),
        &[],
    )
    .await;
    let addr = gateway.addr.to_string();
    let token = Some("cli-token");

    let (code, table, _) = cli(&["tools", "--addr", &addr], token).await;
    assert_eq!(code, 0);
    assert!(table.starts_with("TOOL"), "{table}");
    assert!(table.contains("py__tiny_image"), "{table}");
    let (code, json, _) = cli(&["tools", "--addr", &addr, "--json"], token).await;
    assert_eq!(code, 0);
    let listing: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        listing["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "py__echo")
    );

    let (code, out, _) = cli(
        &["call", "--addr", &addr, "py__echo", r#"{"text":"hello"}"#],
        token,
    )
    .await;
    assert_eq!((code, out.trim()), (0, "hello"));

    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    let (code, out, _) = cli(
        &[
            "call",
            "--addr",
            &addr,
            "--json",
            "--save-images",
            images.to_str().unwrap(),
            "py__tiny_image",
        ],
        token,
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let result: serde_json::Value = serde_json::from_str(&out).unwrap();
    let saved = result["saved"][0].as_str().unwrap();
    assert!(
        std::fs::read(saved).unwrap().starts_with(b"\x89PNG"),
        "{saved}"
    );

    let (code, out, _) = cli(
        &[
            "call",
            "--addr",
            &addr,
            "py__fail",
            r#"{"message":"broken"}"#,
        ],
        token,
    )
    .await;
    assert_eq!((code, out.trim()), (17, "broken"), "a tool error exits 17");
    let (code, _, err) = cli(&["call", "--addr", &addr, "py__nope"], token).await;
    assert_eq!(code, 5, "NOT_FOUND exits 5: {err}");
    assert!(err.contains("TOOL_NOT_FOUND"), "{err}");
    let (code, _, _) = cli(&["call", "--addr", &addr, "py__echo", "[1]"], token).await;
    assert_eq!(code, 3, "INVALID_ARGUMENT exits 3");
    let (code, _, _) = cli(&["tools", "--addr", &addr], Some("wrong")).await;
    assert_eq!(code, 16, "UNAUTHENTICATED exits 16");
    let (code, _, err) = cli(&["tools", "--addr", &addr], None).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("TOOLGATE_TOKEN"), "{err}");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "cli-token\n").unwrap();
    let (code, _, _) = cli(
        &[
            "tools",
            "--addr",
            &addr,
            "--token-file",
            token_file.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert_eq!(code, 0);
    let closed = format!("127.0.0.1:{}", free_port());
    let (code, _, _) = cli(&["tools", "--addr", &closed], token).await;
    assert_eq!(code, 14, "UNAVAILABLE exits 14");
    gateway.shutdown().await;
}
