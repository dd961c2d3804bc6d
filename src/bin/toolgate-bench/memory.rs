//! The memory-only mode (`--only-tenants`): the many-tenant figures alone,
//! repeated `--rounds` times (each round starts fresh gateways), with the
//! medians and what they give per tenant and per live session.

use crate::measure::median;

/// RSS of a gateway with one idle tenant, the base of the per-tenant and
/// per-session figures (docs/scaling.md).
const BASE_MIB: f64 = 11.0;

/// Runs the many-tenant measurement `rounds` times and prints a table.
pub async fn report(rounds: usize) -> anyhow::Result<()> {
    let mut serving = Vec::new();
    let mut idle = Vec::new();
    let mut live = Vec::new();
    for round in 0..rounds.max(1) {
        eprintln!("round {}: many tenants", round + 1);
        let (serving_ms, idle_rss, live_rss) = crate::tenants::many_tenants().await?;
        eprintln!(
            "  start to SERVING {serving_ms:.0} ms, idle RSS {idle_rss:.1} MiB, live RSS {live_rss:.1} MiB"
        );
        serving.push(serving_ms);
        idle.push(idle_rss);
        live.push(live_rss);
    }
    let (serving, idle, live) = (median(serving), median(idle), median(live));
    let per_tenant_kib = (idle - BASE_MIB) * 1024.0 / 10_000.0;
    let per_session_kib = (live - BASE_MIB - 1_000.0 * per_tenant_kib / 1024.0) * 1024.0 / 2_000.0;
    println!("| figure | median | goal | |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| start to SERVING, 10,000 tenants | {serving:.0} ms | ≤ 200 ms | {} |",
        crate::report::verdict(serving <= 200.0)
    );
    println!(
        "| RSS, 10,000 idle tenants | {idle:.1} MiB | ≤ 40 MiB | {} |",
        crate::report::verdict(idle <= 40.0)
    );
    println!(
        "| RSS, 1,000 tenants × 2 live HTTP sessions | {live:.1} MiB | ≤ 100 MiB | {} |",
        crate::report::verdict(live <= 100.0)
    );
    println!("| per idle tenant (base {BASE_MIB} MiB) | {per_tenant_kib:.2} KiB | | |");
    println!("| per live HTTP session | {per_session_kib:.1} KiB | | |");
    Ok(())
}
