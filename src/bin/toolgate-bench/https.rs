//! The HTTP upstream figures: the fast MCP server over HTTPS, with a
//! certificate made for the run (a CA and a server certificate for
//! 127.0.0.1, by the `openssl` CLI) that the gateway trusts through
//! `servers[].tls.ca_file`; the `toolgate → fast https` path of the full
//! run; and `--only-http`, which measures the fast stdio, http and https
//! paths alone, with the TCP connections each opened to its upstream.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tokio::net::TcpListener;

/// The certificates and the TLS listener, shared with the TLS tests.
#[path = "../../../tests/common/tls_server.rs"]
mod tls_server;
use tls_server::TlsListener;
pub(super) use tls_server::make_certs;

use super::args::Args;
use super::harness::Proc;
use super::measure::median;
use super::paths::{Figures, Path_};

/// The name of the HTTPS path in the tables.
pub const FAST_HTTPS: &str = "toolgate → fast https";

/// Serves the fast server's Streamable HTTP endpoint over HTTPS on
/// 127.0.0.1:`port`, with `dir`'s `server.pem` and `server.key`, until
/// killed.
pub async fn serve(port: u16, extra_tools: usize, dir: &Path) -> anyhow::Result<()> {
    let tcp = TcpListener::bind(("127.0.0.1", port)).await?;
    let listener =
        TlsListener::new(tcp, dir, Default::default()).map_err(anyhow::Error::from_boxed)?;
    axum::serve(listener, super::upstream::router(extra_tools)).await?;
    Ok(())
}

/// The fast server over HTTPS, its port and the CA file to trust.
async fn fast_https_server() -> anyhow::Result<(Proc, u16, PathBuf)> {
    let port = super::harness::free_port();
    let dir =
        std::env::temp_dir().join(format!("toolgate-bench-{}-tls-{port}", std::process::id()));
    make_certs(&dir)?;
    let mut command = Command::new(super::harness::exe());
    command
        .args(["mcp-server", "--http", &port.to_string(), "--tls"])
        .arg(&dir);
    let proc = super::harness::spawn(command);
    super::harness::wait_port(port).await;
    Ok((proc, port, dir.join("ca.pem")))
}

/// `toolgate → fast https`: a gateway whose one server is the fast server
/// over HTTPS, trusted through `tls.ca_file`; and the server's port.
pub async fn path() -> anyhow::Result<(Path_, u16)> {
    let (server, port, ca) = fast_https_server().await?;
    let path = super::paths::through_toolgate(
        FAST_HTTPS,
        &format!(
            "      - name: fast\n        url: \"https://127.0.0.1:{port}/mcp\"\n        tls:\n          ca_file: \"{}\"\n",
            ca.display()
        ),
        "fast__echo",
        vec![server],
    )
    .await?;
    Ok((path, port))
}

/// The HTTP targets of the full run: gateway CPU per call over HTTP (and
/// HTTPS) against stdio. `summary` holds, per path, p50, calls/s @16, CPU
/// per call and gateway-only CPU per call.
pub fn targets(summary: &BTreeMap<&str, (f64, f64, f64, f64)>) {
    let stdio = summary["toolgate → fast stdio"].3;
    let http = summary["toolgate → fast http"].3;
    let ratio = http / stdio;
    println!(
        "| gateway CPU per call @16, fast http / fast stdio ({:.3} / {:.3} ms) | {ratio:.2} | ≤ 1.5 | {} |",
        http,
        stdio,
        super::report::verdict(ratio <= 1.5)
    );
    if let Some(https) = summary.get(FAST_HTTPS) {
        println!(
            "| gateway CPU per call @16, fast https / fast http ({:.3} / {:.3} ms) | {:.2} | | |",
            https.3,
            http,
            https.3 / http
        );
    }
}

/// TCP connections to 127.0.0.1:`port` that are open (the client's end)
/// or closed within the last minute (`TIME_WAIT`, at either end): what
/// grows by one per connection opened during a short run.
fn connections(port: u16) -> usize {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return 0;
    };
    let port_of = |addr: &str| {
        addr.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(state)) =
                (fields.get(1), fields.get(2), fields.get(3))
            else {
                return false;
            };
            let (local, remote) = (port_of(local), port_of(remote));
            match *state {
                "01" => remote == Some(port),
                "06" => local == Some(port) || remote == Some(port),
                _ => false,
            }
        })
        .count()
}

/// `--only-http`: fast stdio, http and https through the gateway,
/// interleaved over `args.rounds`; a table of the figures, the TCP
/// connections an extra run at 16 in flight opened to each HTTP upstream
/// (after the measured runs, so with a warm pool), and the CPU ratios.
pub async fn report(args: &Args) -> anyhow::Result<()> {
    let exe = super::harness::exe().display().to_string();
    let mut paths = vec![
        super::paths::through_toolgate(
            "toolgate → fast stdio",
            &format!("      - name: fast\n        command: [\"{exe}\", \"mcp-server\"]\n"),
            "fast__echo",
            Vec::new(),
        )
        .await?,
    ];
    let mut ports = vec![None];
    let (server, port) = super::harness::fast_http_server(0);
    super::harness::wait_port(port).await;
    paths.push(
        super::paths::through_toolgate(
            "toolgate → fast http",
            &format!("      - name: fast\n        url: \"http://127.0.0.1:{port}/mcp\"\n"),
            "fast__echo",
            vec![server],
        )
        .await?,
    );
    ports.push(Some(port));
    let (https, port) = path().await?;
    paths.push(https);
    ports.push(Some(port));
    let mut figures: Vec<Figures> = vec![Figures::default(); paths.len()];
    let mut opened: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    for round in 0..args.rounds {
        for (i, path) in paths.iter().enumerate() {
            eprintln!("round {}: {}", round + 1, path.name);
            super::paths::measure(path, args, &mut figures[i]).await?;
            if let Some(port) = ports[i] {
                // One more run at 16 in flight, counting the connections
                // it opened (the pool holds those of the runs before).
                let before = connections(port);
                super::measure::throughput(&path.call, 16, args.duration).await?;
                opened[i].push(connections(port).saturating_sub(before) as f64);
            }
        }
    }
    println!(
        "| path | p50 ms | calls/s @1 | @16 | @64 | CPU ms/call @16 (serving) | gateway-only CPU ms/call @16 | TCP connections opened by a run @16 |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut summary = BTreeMap::new();
    for ((path, f), opened) in paths.iter().zip(&figures).zip(&opened) {
        let p50 = median(f.latency.iter().map(|l| l.p50).collect());
        let rps = |l: usize| median(f.rps.get(&l).cloned().unwrap_or_default());
        let cpu = median(f.cpu_ms.get(&16).cloned().unwrap_or_default());
        let gw_cpu = median(f.gateway_cpu_ms.get(&16).cloned().unwrap_or_default());
        let opened = if opened.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.0}", median(opened.clone()))
        };
        println!(
            "| {} | {p50:.3} | {:.0} | {:.0} | {:.0} | {cpu:.3} | {gw_cpu:.3} | {opened} |",
            path.name,
            rps(1),
            rps(16),
            rps(64)
        );
        summary.insert(path.name, (p50, rps(16), cpu, gw_cpu));
    }
    println!("\n| target | figure | goal | |");
    println!("| --- | --- | --- | --- |");
    targets(&summary);
    Ok(())
}
