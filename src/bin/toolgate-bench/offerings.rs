//! Resources and prompts through the gateway, against the same server read
//! directly: `ReadResource` of a 1 MiB text and of a 1 MiB blob (p50, and
//! the gateway's CPU per read) against a direct rmcp `resources/read` of
//! the same resource from the same kind of child ([`super::offerings_server`],
//! stdio), and `ListPrompts` of 1,000 prompts against `ListTools` of 1,000
//! tools through the same gateway; and a `ReadResource` of the 1 MiB text
//! answered from the gateway's result cache (a 2026-07-28 session, the
//! result marked reusable) against the same read that reaches the server.
//! Interleaved over rounds; ratios of the same run.

use std::time::Instant;

use anyhow::Context as _;
use toolgate::pb;

use super::harness::{Proc, authed, exe, gateway, grpc};
use super::measure::{cpu_seconds, median};
use super::offerings_server::{PROMPTS, SIZE};

type Client = pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>;
type Direct = rmcp::service::RunningService<rmcp::service::RoleClient, ()>;

/// Sequential requests of each path per round.
const READS: usize = 50;
const LISTS: usize = 50;

async fn read(client: &mut Client, uri: &str) -> anyhow::Result<()> {
    read_of(client, "b", uri).await
}

async fn read_of(client: &mut Client, server: &str, uri: &str) -> anyhow::Result<()> {
    let request = pb::ReadResourceRequest {
        server: server.to_owned(),
        uri: uri.to_owned(),
        ..Default::default()
    };
    let read = client.read_resource(authed(request)).await?.into_inner();
    let size = match read.contents.first().and_then(|c| c.data.as_ref()) {
        Some(pb::resource_contents::Data::Text(t)) => t.len(),
        Some(pb::resource_contents::Data::Blob(b)) => b.len(),
        None => 0,
    };
    anyhow::ensure!(size == SIZE, "{uri}: {size} bytes, expected {SIZE}");
    Ok(())
}

async fn direct_read(direct: &Direct, uri: &str) -> anyhow::Result<()> {
    let read = direct
        .peer()
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
        .await?;
    anyhow::ensure!(read.contents.len() == 1, "{uri}: {read:?}");
    Ok(())
}

/// p50 (ms) and the gateway's CPU ms per request of `n` sequential runs.
async fn timed<F, Fut>(n: usize, gateway: &Proc, mut each: F) -> anyhow::Result<(f64, f64)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut samples = Vec::with_capacity(n);
    let before = cpu_seconds(gateway.pid());
    for _ in 0..n {
        let started = Instant::now();
        each().await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let cpu = (cpu_seconds(gateway.pid()) - before) * 1000.0 / n as f64;
    Ok((median(samples), cpu))
}

/// Runs the figures and prints their rows of the targets table.
///
/// # Errors
/// When the gateway or the server does not start, or a read or listing
/// gives the wrong answer.
pub async fn report(rounds: usize) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let servers = format!(
        "      - name: b\n        command: [\"{}\", \"offerings-server\"]\n",
        exe().display()
    );
    let (proc, port) = gateway(&servers).await;
    let mut client = grpc(port).await;
    // A second gateway with the same server as `c` on 2026-07-28, whose
    // hints the result cache reads.
    let cached = format!(
        "      - name: c\n        command: [\"{}\", \"offerings-server\"]\n        \
         lifecycle: discover\n",
        exe().display()
    );
    let (cache_proc, cache_port) = gateway(&cached).await;
    let mut cache_client = grpc(cache_port).await;
    let mut connected = false;
    for _ in 0..300 {
        if read_of(&mut cache_client, "c", "bench://text")
            .await
            .is_ok()
        {
            connected = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    anyhow::ensure!(connected, "the 2026-07-28 gateway never read bench://text");
    let mut command = tokio::process::Command::new(exe());
    command
        .arg("offerings-server")
        .stderr(std::process::Stdio::null());
    let direct: Direct = ().serve(rmcp::transport::TokioChildProcess::new(command)?).await?;
    direct
        .peer()
        .set_response_cache_config(rmcp::service::ClientCacheConfig::disabled())
        .await;
    // The first listing waits for the server to connect.
    let mut listed = None;
    for _ in 0..300 {
        let request = pb::ListPromptsRequest::default();
        match client.list_prompts(authed(request)).await {
            Ok(r) if r.get_ref().prompts.len() == PROMPTS => {
                listed = Some(());
                break;
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    listed.context("ListPrompts never listed the server's 1,000 prompts")?;
    let mut figures: [Vec<(f64, f64)>; 8] = Default::default();
    for round in 0..rounds.max(1) {
        eprintln!("round {}: resources and prompts", round + 1);
        for (i, uri) in ["bench://text", "bench://blob"].into_iter().enumerate() {
            let gateway_read = timed(READS, &proc, || {
                let mut client = client.clone();
                async move { read(&mut client, uri).await }
            })
            .await?;
            let direct_read = timed(READS, &proc, || direct_read(&direct, uri)).await?;
            figures[i * 2].push(gateway_read);
            figures[i * 2 + 1].push(direct_read);
        }
        let prompts = timed(LISTS, &proc, || {
            let mut client = client.clone();
            async move {
                let listing = client
                    .list_prompts(authed(pb::ListPromptsRequest::default()))
                    .await?
                    .into_inner();
                anyhow::ensure!(listing.prompts.len() == PROMPTS);
                Ok(())
            }
        })
        .await?;
        let tools = timed(LISTS, &proc, || {
            let mut client = client.clone();
            async move {
                let listing = client
                    .list_tools(authed(pb::ListToolsRequest::default()))
                    .await?
                    .into_inner();
                anyhow::ensure!(listing.tools.len() == PROMPTS);
                Ok(())
            }
        })
        .await?;
        figures[4].push(prompts);
        figures[5].push(tools);
        // The first read of a round may be the one that fills the cache.
        read_of(&mut cache_client, "c", "bench://cached-text").await?;
        let hit = timed(READS, &cache_proc, || {
            let mut client = cache_client.clone();
            async move { read_of(&mut client, "c", "bench://cached-text").await }
        })
        .await?;
        let miss = timed(READS, &cache_proc, || {
            let mut client = cache_client.clone();
            async move { read_of(&mut client, "c", "bench://text").await }
        })
        .await?;
        figures[6].push(hit);
        figures[7].push(miss);
    }
    drop(direct);
    drop(proc);
    drop(cache_proc);
    let p50 = |i: usize| median(figures[i].iter().map(|f| f.0).collect());
    let cpu = |i: usize| median(figures[i].iter().map(|f| f.1).collect());
    let fmt = super::report::fmt;
    for (i, what) in [(0, "1 MiB text"), (2, "1 MiB blob")] {
        println!(
            "| p50, ReadResource {what}: {} ms / direct rmcp read {} ms | {}x | | |",
            fmt(p50(i), 3),
            fmt(p50(i + 1), 3),
            fmt(p50(i) / p50(i + 1), 2)
        );
        println!(
            "| gateway CPU ms per ReadResource, {what} | {} | | |",
            fmt(cpu(i), 3)
        );
    }
    println!(
        "| p50, ListPrompts of 1,000 prompts: {} ms / ListTools of 1,000 tools {} ms | {}x | | |",
        fmt(p50(4), 3),
        fmt(p50(5), 3),
        fmt(p50(4) / p50(5), 2)
    );
    println!(
        "| gateway CPU ms per ListPrompts of 1,000 / per ListTools of 1,000 | {} / {} | | |",
        fmt(cpu(4), 3),
        fmt(cpu(5), 3)
    );
    println!(
        "| p50, ReadResource 1 MiB text from the result cache: {} ms / from the server {} ms | {}x | | |",
        fmt(p50(6), 3),
        fmt(p50(7), 3),
        fmt(p50(6) / p50(7), 2)
    );
    println!(
        "| gateway CPU ms per ReadResource 1 MiB text, cache hit / from the server | {} / {} | | |",
        fmt(cpu(6), 3),
        fmt(cpu(7), 3)
    );
    Ok(())
}
