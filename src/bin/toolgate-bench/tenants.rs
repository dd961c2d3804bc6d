//! The many-tenant figures: start to SERVING with 10,000 lazy tenants,
//! their idle RSS, and RSS with 1,000 tenants of two live HTTP sessions.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::harness::{fast_http_server, free_port, grpc, serving_ms, spawn_gateway, wait_port};
use crate::measure;
use toolgate::pb;

/// Many tenants: (ms to SERVING with 10,000 tenants, idle RSS MiB,
/// RSS MiB with 1,000 tenants × 2 live HTTP sessions).
pub(crate) async fn many_tenants() -> anyhow::Result<(f64, f64, f64)> {
    let (server, port) = fast_http_server(0);
    wait_port(port).await;
    let dir = std::env::temp_dir().join(format!("toolgate-bench-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let write = |name: &str,
                 tenants: usize,
                 connect: &str,
                 servers: usize|
     -> anyhow::Result<(PathBuf, u16)> {
        let gw_port = free_port();
        let mut yaml = format!(
            "listen: \"127.0.0.1:{gw_port}\"\nshutdown_delay: \"0s\"\ndefaults:\n  connect: {connect}\ntenants:\n"
        );
        for t in 0..tenants {
            yaml.push_str(&format!(
                "  - name: t{t}\n    tokens: [token-{t:05}-bench]\n    servers:\n"
            ));
            for s in 0..servers {
                yaml.push_str(&format!(
                    "      - name: s{s}\n        url: \"http://127.0.0.1:{port}/mcp\"\n"
                ));
            }
        }
        let path = dir.join(name);
        std::fs::write(&path, yaml)?;
        Ok((path, gw_port))
    };

    // 10,000 idle (lazy) tenants: time to SERVING and RSS.
    let (config, gw_port) = write("idle.yaml", 10_000, "lazy", 1)?;
    let started = Instant::now();
    let gw = spawn_gateway(&config);
    let serving_ms = serving_ms(gw_port, started).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = measure::rss_mib(gw.pid());
    drop(gw);

    // 1,000 tenants × 2 live HTTP sessions.
    let (config, gw_port) = write("live.yaml", 1_000, "eager", 2)?;
    let gw = spawn_gateway(&config);
    wait_port(gw_port).await;
    let client = grpc(gw_port).await;
    let started = Instant::now();
    for t in [0usize, 499, 999] {
        loop {
            let mut request = tonic::Request::new(pb::ListToolsRequest::default());
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer token-{t:05}-bench").parse()?,
            );
            if let Ok(r) = client.clone().list_tools(request).await
                && r.get_ref().servers.iter().all(|s| s.connected)
            {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(120),
                "sessions never all connected"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let live_rss = measure::rss_mib(gw.pid());
    drop((gw, server));
    let _ = std::fs::remove_dir_all(&dir);
    Ok((serving_ms, idle_rss, live_rss))
}
