//! Bounded soak test: drives mixed calls through a real `toolgate serve`
//! for a while, killing upstream children at intervals, then reports what
//! happened. Not part of `cargo test`; see docs/reliability.md.
//!
//! ```text
//! tests/setup.sh && cargo build --release
//! cargo run --release --example soak -- --minutes 2
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use toolgate::pb;

/// /proc accounting, shared with the benchmark.
#[path = "../src/bin/toolgate-bench/measure.rs"]
#[allow(dead_code)]
mod measure;
use toolgate::pb::tool_gateway_client::ToolGatewayClient;

const TOKENS: [&str; 2] = ["soak-a", "soak-b"];

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    unavailable: AtomicU64,
    /// In doubt: the session was lost after the request left.
    unknown: AtomicU64,
    deadline: AtomicU64,
    other_error: AtomicU64,
    hung: AtomicU64,
    wrong: AtomicU64,
}

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn binary() -> PathBuf {
    for profile in ["release", "debug"] {
        let path = repo().join("target").join(profile).join("toolgate");
        if path.exists() {
            return path;
        }
    }
    panic!("build toolgate first: cargo build --release");
}

fn which(program: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} not on PATH"))
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}

fn config(port: u16) -> String {
    let node = which("node");
    let everything = repo().join(
        "tests/fixtures/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    );
    let python = repo().join(".venv/bin/python");
    let server = repo().join("tests/fixtures/python/env_server.py");
    assert!(
        everything.exists() && python.exists(),
        "run tests/setup.sh first"
    );
    let servers = format!(
        "    servers:\n      - name: everything\n        command: [\"{}\", \"{}\", \"stdio\"]\n        reconnect: {{ initial_backoff: \"100ms\", max_backoff: \"1s\" }}\n      - name: py\n        command: [\"{}\", \"{}\"]\n        reconnect: {{ initial_backoff: \"100ms\", max_backoff: \"1s\" }}\n",
        node.display(),
        everything.display(),
        python.display(),
        server.display()
    );
    let mut yaml = format!(
        "listen: \"127.0.0.1:{port}\"\nshutdown_delay: \"0s\"\nshutdown_grace: \"5s\"\ntenants:\n"
    );
    for token in TOKENS {
        yaml.push_str(&format!(
            "  - name: {token}\n    tokens: [{token}]\n{servers}"
        ));
    }
    yaml
}

async fn one_call(
    client: &mut ToolGatewayClient<tonic::transport::Channel>,
    token: &str,
    n: u64,
    counts: &Counts,
) {
    let (name, args, expected) = match n % 3 {
        0 => (
            "everything__echo",
            format!(r#"{{"message":"m{n}"}}"#),
            format!("Echo: m{n}"),
        ),
        1 => ("py__echo", format!(r#"{{"text":"p{n}"}}"#), format!("p{n}")),
        _ => (
            "py__add",
            format!(r#"{{"a":{n},"b":1}}"#),
            format!("{}", n + 1),
        ),
    };
    let mut request = tonic::Request::new(pb::InvokeToolRequest {
        name: name.into(),
        arguments_json: args,
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request.set_timeout(Duration::from_secs(10));
    match tokio::time::timeout(Duration::from_secs(15), client.invoke_tool(request)).await {
        Err(_) => counts.hung.fetch_add(1, Ordering::Relaxed),
        Ok(Ok(response)) => {
            if response.into_inner().text == expected {
                counts.ok.fetch_add(1, Ordering::Relaxed)
            } else {
                counts.wrong.fetch_add(1, Ordering::Relaxed)
            }
        }
        Ok(Err(status)) => match status.code() {
            tonic::Code::Unavailable => counts.unavailable.fetch_add(1, Ordering::Relaxed),
            tonic::Code::Unknown => counts.unknown.fetch_add(1, Ordering::Relaxed),
            tonic::Code::DeadlineExceeded => counts.deadline.fetch_add(1, Ordering::Relaxed),
            _ => {
                eprintln!("unexpected: {status:?}");
                counts.other_error.fetch_add(1, Ordering::Relaxed)
            }
        },
    };
}

#[tokio::main]
async fn main() {
    let minutes = arg("--minutes", 1.0);
    let kill_every = Duration::from_secs_f64(arg("--kill-every", 5.0));
    let workers = arg("--workers", 8.0) as u64;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("toolgate-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("config.yaml");
    std::fs::write(&config_path, config(port)).unwrap();
    let mut gateway = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&config_path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = gateway.id();
    let channel = loop {
        if let Ok(c) = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
        {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Warm up: every server of every tenant answers once.
    let counts = Arc::new(Counts::default());
    let mut client = ToolGatewayClient::new(channel.clone());
    for token in TOKENS {
        for n in 0..3 {
            one_call(&mut client, token, n, &Counts::default()).await;
        }
    }
    let rss_start = measure::rss_mib(pid);
    let deadline = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    let seen_children = Arc::new(std::sync::Mutex::new(HashSet::new()));

    let mut tasks = Vec::new();
    for w in 0..workers {
        let counts = counts.clone();
        let mut client = ToolGatewayClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = w * 1_000_000;
            while Instant::now() < deadline {
                one_call(&mut client, TOKENS[(n % 2) as usize], n, &counts).await;
                n += 1;
            }
        }));
    }
    let killer = {
        let seen = seen_children.clone();
        tokio::spawn(async move {
            let mut kills = 0u64;
            while Instant::now() + kill_every < deadline {
                tokio::time::sleep(kill_every).await;
                let kids = measure::children(pid);
                seen.lock().unwrap().extend(kids.iter().copied());
                if let Some(victim) = kids.get(fastrand::usize(..kids.len().max(1))) {
                    let _ = Command::new("kill")
                        .args(["-KILL", &victim.to_string()])
                        .status();
                    kills += 1;
                }
            }
            kills
        })
    };
    for task in tasks {
        task.await.unwrap();
    }
    let kills = killer.await.unwrap();
    seen_children.lock().unwrap().extend(measure::children(pid));
    let rss_end = measure::rss_mib(pid);
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = gateway.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left: Vec<u32> = seen_children
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|p| alive(*p))
        .collect();

    let total = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "soak: {minutes} min, {workers} workers, a child killed every {kill_every:?} ({kills} kills)"
    );
    println!("| figure | value |\n| --- | --- |");
    println!("| calls OK | {} |", total(&counts.ok));
    println!("| calls UNAVAILABLE | {} |", total(&counts.unavailable));
    println!(
        "| calls UNKNOWN (in doubt: lost after the request left) | {} |",
        total(&counts.unknown)
    );
    println!("| calls DEADLINE_EXCEEDED | {} |", total(&counts.deadline));
    println!(
        "| calls with another error | {} |",
        total(&counts.other_error)
    );
    println!("| calls hung (must be 0) | {} |", total(&counts.hung));
    println!("| wrong results (must be 0) | {} |", total(&counts.wrong));
    println!("| gateway RSS at start / end | {rss_start:.0} / {rss_end:.0} MiB |",);
    println!("| child processes left (must be 0) | {} |", left.len());
    println!("| gateway exit code | {:?} |", status.code());
    let _ = std::fs::remove_dir_all(Path::new(&dir));
    let failed = total(&counts.hung) > 0
        || total(&counts.wrong) > 0
        || !left.is_empty()
        || !status.success();
    std::process::exit(i32::from(failed));
}
