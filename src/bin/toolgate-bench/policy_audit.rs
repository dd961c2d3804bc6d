//! A call's cost with the 20-rule policy of [`super::policy`] and the audit
//! trail together, against neither. Two gateways in front of the fast
//! stdio server: one without `audit`, serving a tenant without policy
//! (`bench`, the baseline) and one with the 20 rules (`bench-policy`,
//! policy alone); one with an audit file (`audit.path`, arguments
//! digested, as in the benchmark's audit path) serving the same policy
//! tenant (policy and audit). Interleaved rounds: InvokeTool p50, calls/s
//! at 16 in flight and the gateway's CPU per call at 16 in flight.

use std::time::Duration;

use super::measure::{self, CallFn, median};
use super::policy::{Client, invoke};

const NONE: &str = "none";
const POLICY: &str = "20-rule policy";
const BOTH: &str = "20-rule policy + audit file";

/// A gateway on the fast stdio server with the given top-level YAML and
/// tenants `bench` (no policy) and `bench-policy` (the 20 rules).
async fn gateway(
    dir: &std::path::Path,
    top: &str,
) -> anyhow::Result<(super::harness::Proc, Client)> {
    let port = super::harness::free_port();
    let exe = super::harness::exe().display().to_string();
    let servers = format!("      - name: fast\n        command: [\"{exe}\", \"mcp-server\"]\n");
    super::policy::two_tenant_gateway(dir, port, top, &servers, |listing| {
        !listing.servers.is_empty() && listing.servers.iter().all(|s| s.connected)
    })
    .await
}

/// One measured path and its figures over rounds.
struct Path {
    name: &'static str,
    call: CallFn,
    gateway: u32,
    p50: Vec<f64>,
    rps: Vec<f64>,
    cpu_ms: Vec<f64>,
}

impl Path {
    async fn measure(&mut self, sequential: usize, duration: Duration) -> anyhow::Result<()> {
        self.p50
            .push(measure::sequential(&self.call, sequential).await?.p50);
        let before = measure::cpu_seconds(self.gateway);
        let (rate, calls) = measure::throughput(&self.call, 16, duration).await?;
        let after = measure::cpu_seconds(self.gateway);
        self.rps.push(rate);
        self.cpu_ms
            .push((after - before) * 1000.0 / calls.max(1) as f64);
        Ok(())
    }
}

/// Runs the figure and prints its rows of the targets table.
///
/// # Errors
/// When a gateway does not start or connect, or any call fails.
pub async fn report(rounds: usize, sequential: usize, duration: Duration) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!(
        "toolgate-bench-policy-audit-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    let audit_file = dir.join("audit.jsonl");
    let (plain, plain_client) = gateway(&dir, "").await?;
    let (audited, audited_client) = gateway(
        &dir,
        &format!(
            "audit:\n  path: \"{}\"\n  arguments: digest\n",
            audit_file.display()
        ),
    )
    .await?;
    let path = |name, client: &Client, token, gateway: &super::harness::Proc| Path {
        name,
        call: invoke(client.clone(), token),
        gateway: gateway.pid(),
        p50: Vec::new(),
        rps: Vec::new(),
        cpu_ms: Vec::new(),
    };
    let mut paths = [
        path(NONE, &plain_client, "bench-token", &plain),
        path(POLICY, &plain_client, "policy-token", &plain),
        path(BOTH, &audited_client, "policy-token", &audited),
    ];
    for p in &paths {
        measure::sequential(&p.call, 50).await?;
    }
    for round in 0..rounds.max(1) {
        for p in &mut paths {
            eprintln!("round {}: policy + audit: {}", round + 1, p.name);
            p.measure(sequential, duration).await?;
        }
    }
    let records = std::fs::read_to_string(&audit_file)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    anyhow::ensure!(
        records > 0,
        "policy + audit: no record in {}",
        audit_file.display()
    );
    drop((plain, audited));
    let _ = std::fs::remove_dir_all(&dir);

    let fig = |p: &Path| {
        (
            median(p.p50.clone()),
            median(p.rps.clone()),
            median(p.cpu_ms.clone()),
        )
    };
    let [none, policy, both] = [fig(&paths[0]), fig(&paths[1]), fig(&paths[2])];
    let fmt = super::report::fmt;
    for (name, f) in [(POLICY, policy), (BOTH, both)] {
        println!(
            "| InvokeTool p50, fast stdio: {name} {} ms / none {} ms | {} ms added | | |",
            fmt(f.0, 3),
            fmt(none.0, 3),
            fmt(f.0 - none.0, 3)
        );
        println!(
            "| calls/s @16, fast stdio: {name} {} / none {} | {} | | |",
            fmt(f.1, 0),
            fmt(none.1, 0),
            fmt(f.1 / none.1, 2)
        );
        println!(
            "| gateway CPU ms/call @16, fast stdio: {name} {} / none {} | {} ms added | | |",
            fmt(f.2, 3),
            fmt(none.2, 3),
            fmt(f.2 - none.2, 3)
        );
    }
    Ok(())
}
