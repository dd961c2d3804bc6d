//! Load generation and process accounting: sequential latency, throughput
//! at a fixed number of calls in flight, CPU seconds and peak RSS of the
//! serving processes from /proc.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

/// One call of a path under test.
pub type CallFn = Arc<dyn Fn() -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// `n` calls one after another.
pub async fn sequential(call: &CallFn, n: usize) -> anyhow::Result<Latency> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        call().await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Ok(Latency {
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
    })
}

/// Calls per second with `in_flight` workers for `duration`; returns the
/// rate and the number of calls made.
pub async fn throughput(
    call: &CallFn,
    in_flight: usize,
    duration: Duration,
) -> anyhow::Result<(f64, u64)> {
    throughput_bounded(call, in_flight, duration, u64::MAX).await
}

/// [`throughput`] that also stops after `max_calls` calls, whichever ends
/// first.
pub async fn throughput_bounded(
    call: &CallFn,
    in_flight: usize,
    duration: Duration,
    max_calls: u64,
) -> anyhow::Result<(f64, u64)> {
    let taken = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..in_flight {
        let (call, taken, done) = (call.clone(), taken.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            while Instant::now() < deadline && taken.fetch_add(1, Ordering::Relaxed) < max_calls {
                call().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let calls = done.load(Ordering::Relaxed);
    Ok((calls as f64 / started.elapsed().as_secs_f64(), calls))
}

fn clock_ticks() -> f64 {
    // Linux exposes utime/stime in USER_HZ, 100 on every supported arch.
    100.0
}

/// CPU seconds (user + system) used so far by `pid`.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = read_stat(pid);
    let fields = stat_fields(&stat);
    // After the command: state is field 0; utime 11, stime 12.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / clock_ticks()
}

/// `/proc/PID/stat` (empty when the process is gone).
fn read_stat(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default()
}

/// The fields of a `/proc/PID/stat` after the command (state is field 0,
/// the parent 1).
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect()
}

/// Peak resident set size of `pid` in MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    status_kib(pid, "VmHWM:") / 1024.0
}

/// Current resident set size of `pid` in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_kib(pid, "VmRSS:") / 1024.0
}

fn status_kib(pid: u32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// Children of `parent` (direct only).
pub fn children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = read_stat(pid);
        let fields = stat_fields(&stat);
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// The median of some figures.
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
