//! The main run's report: the table of every path (and mcpo), the target
//! ratios read from it, the many-tenant rows, and number formatting.

use std::collections::BTreeMap;

use crate::measure::median;
use crate::paths::{AUDITED, Figures, Path_};

/// The figures the targets read, by path name: p50 ms, calls/s @16, CPU
/// ms/call @16 (serving), gateway-only CPU ms/call @16.
pub(crate) type Summary = BTreeMap<&'static str, (f64, f64, f64, f64)>;

/// Prints the table of every path and mcpo's row: the summary the targets
/// read, and mcpo's calls/s @16 (NaN without mcpo runs).
pub(crate) fn table(
    paths: &[Path_],
    figures: &[Figures],
    mcpo_runs: &[serde_json::Value],
) -> (Summary, f64) {
    println!(
        "| path | p50 ms | p90 ms | p99 ms | calls/s @1 | @16 | @64 | CPU ms/call @16 (serving) | gateway-only CPU ms/call @16 | peak RSS MiB |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut summary: Summary = BTreeMap::new();
    for (path, f) in paths.iter().zip(figures) {
        let p50 = median(f.latency.iter().map(|l| l.p50).collect());
        let p90 = median(f.latency.iter().map(|l| l.p90).collect());
        let p99 = median(f.latency.iter().map(|l| l.p99).collect());
        let rps = |l: usize| median(f.rps.get(&l).cloned().unwrap_or_default());
        let cpu = median(f.cpu_ms.get(&16).cloned().unwrap_or_default());
        let gw_cpu = median(f.gateway_cpu_ms.get(&16).cloned().unwrap_or_default());
        let rss = median(f.peak_rss.clone());
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            path.name,
            fmt(p50, 3),
            fmt(p90, 3),
            fmt(p99, 3),
            fmt(rps(1), 0),
            fmt(rps(16), 0),
            fmt(rps(64), 0),
            fmt(cpu, 3),
            fmt(gw_cpu, 3),
            fmt(rss, 1)
        );
        summary.insert(path.name, (p50, rps(16), cpu, gw_cpu));
    }
    let mcpo_rps16 = median(
        mcpo_runs
            .iter()
            .filter_map(|v| v["rps"]["16"].as_f64())
            .collect(),
    );
    if !mcpo_runs.is_empty() {
        let m = |k: &str| median(mcpo_runs.iter().filter_map(|v| v[k].as_f64()).collect());
        let rps = |l: &str| {
            median(
                mcpo_runs
                    .iter()
                    .filter_map(|v| v["rps"][l].as_f64())
                    .collect(),
            )
        };
        let cpu = median(
            mcpo_runs
                .iter()
                .filter_map(|v| v["cpu_ms_per_call"]["16"].as_f64())
                .collect(),
        );
        let rss: f64 = mcpo_runs
            .last()
            .map(|v| {
                v["peak_rss_mib"]["mcpo"].as_f64().unwrap_or(0.0)
                    + v["peak_rss_mib"]["node"].as_f64().unwrap_or(0.0)
            })
            .unwrap_or(f64::NAN);
        println!(
            "| mcpo → everything stdio (wrk) | {} | {} | {} | {} | {} | {} | {} | - | {} |",
            fmt(m("p50_ms"), 3),
            fmt(m("p90_ms"), 3),
            fmt(m("p99_ms"), 3),
            fmt(rps("1"), 0),
            fmt(rps("16"), 0),
            fmt(rps("64"), 0),
            fmt(cpu, 3),
            fmt(rss, 1)
        );
    }

    (summary, mcpo_rps16)
}

/// Prints the target ratios of the main run.
pub(crate) fn targets(summary: &Summary, mcpo_rps16: f64) {
    let floor = summary["floor: bare tonic echo"];
    let via_fast = summary["toolgate → fast stdio"];
    let direct_fast = summary["direct rmcp → fast stdio"];
    let via_every = summary["toolgate → everything stdio"];
    let direct_every = summary["direct rmcp → everything stdio"];
    println!("\n| target | figure | goal | |");
    println!("| --- | --- | --- | --- |");
    let cpu_ratio = via_fast.3 / floor.2;
    println!(
        "| gateway CPU per call / bare tonic echo CPU per call | {} | ≤ 2 | {} |",
        fmt(cpu_ratio, 2),
        verdict(cpu_ratio <= 2.0)
    );
    let added = (via_fast.0 - direct_fast.0) / floor.0;
    println!(
        "| added p50 (toolgate − direct, fast stdio) / bare echo p50 | {} | ≤ 1.5 | {} |",
        fmt(added, 2),
        verdict(added <= 1.5)
    );
    let audited = summary[AUDITED];
    println!(
        "| audit cost per call (fast stdio, audited − not): p50 | {} ms | | |",
        fmt(audited.0 - via_fast.0, 3)
    );
    println!(
        "| audit cost per call (fast stdio, audited − not): gateway CPU @16 | {} ms | | |",
        fmt(audited.3 - via_fast.3, 3)
    );
    println!(
        "| audit cost: calls/s @16, audited / not | {} | | |",
        fmt(audited.1 / via_fast.1, 2)
    );
    crate::https::targets(summary);
    let vs_direct = via_every.1 / direct_every.1;
    println!(
        "| everything stdio @16: toolgate / direct rmcp throughput | {} | ≥ 0.7 | {} |",
        fmt(vs_direct, 2),
        verdict(vs_direct >= 0.7)
    );
    if !mcpo_rps16.is_nan() {
        let vs_mcpo = via_every.1 / mcpo_rps16;
        println!(
            "| everything stdio @16: toolgate / mcpo throughput | {} | ≥ 3 | {} |",
            fmt(vs_mcpo, 2),
            verdict(vs_mcpo >= 3.0)
        );
    }
}

/// Prints the many-tenant rows.
pub(crate) fn tenants(serving_ms: f64, idle_rss: f64, live_rss: f64) {
    println!(
        "| start to SERVING, 10,000 tenants | {} ms | ≤ 200 ms | {} |",
        fmt(serving_ms, 0),
        verdict(serving_ms <= 200.0)
    );
    println!(
        "| RSS, 10,000 idle tenants | {} MiB | ≤ 40 MiB | {} |",
        fmt(idle_rss, 1),
        verdict(idle_rss <= 40.0)
    );
    println!(
        "| RSS, 1,000 tenants × 2 live HTTP sessions | {} MiB | ≤ 100 MiB | {} |",
        fmt(live_rss, 1),
        verdict(live_rss <= 100.0)
    );
}

/// `v` with `digits` decimals, or `-` for a missing figure (NaN).
pub(crate) fn fmt(v: f64, digits: usize) -> String {
    if v.is_nan() {
        "-".to_owned()
    } else {
        format!("{v:.digits$}")
    }
}

/// How a figure fares against its goal.
pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}
