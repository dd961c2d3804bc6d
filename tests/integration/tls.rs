//! HTTPS upstreams: a server whose certificate chains to a private CA is
//! refused until `servers[].tls.ca_file` trusts that CA; then its calls
//! reuse pooled connections instead of a TLS handshake each.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use toolgate::pb;

use crate::common::*;

fn config(url: &str, tls: &str) -> String {
    format!(
        "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: s\n        url: \"{url}\"\n{tls}"
    )
}

/// Polls (bounded) until the server is connected or has failed.
async fn settled(gateway: &TestGateway) -> pb::ServerStatus {
    let mut client = gateway.client().await;
    let started = Instant::now();
    loop {
        let listing = list(&mut client, "t").await;
        let status = listing.servers[0].clone();
        if status.connected || !status.error.is_empty() {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never settled: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_trusted_through_its_ca_file_and_its_connections_reused() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path()).expect("certificates from the openssl CLI");
    let upstream = serve_mcp_tls(TestServer::new(&["echo"]), dir.path()).await;
    let url = &upstream.server.url;

    // The system's roots do not know the test CA.
    let gateway = TestGateway::start(&config(url, ""), &[]).await;
    let status = settled(&gateway).await;
    assert!(!status.connected, "{status:?}");
    assert!(
        status.error.to_lowercase().contains("certificate"),
        "the error names the certificate: {status:?}"
    );
    gateway.shutdown().await;
    assert_eq!(upstream.handshakes.load(Ordering::SeqCst), 0);

    // Trusted through the configuration.
    let tls = format!(
        "        tls:\n          ca_file: \"{}\"\n",
        dir.path().join("ca.pem").display()
    );
    let gateway = TestGateway::start(&config(url, &tls), &[]).await;
    let status = settled(&gateway).await;
    assert!(status.connected, "{status:?}");
    let mut client = gateway.client().await;
    let first = invoke(&mut client, "t", "s__echo", r#"{"text":"over tls"}"#)
        .await
        .unwrap();
    assert_eq!(first.text, "over tls");
    let before = upstream.handshakes.load(Ordering::SeqCst);
    for _ in 0..20 {
        invoke(&mut client, "t", "s__echo", r#"{"text":"again"}"#)
            .await
            .unwrap();
    }
    let after = upstream.handshakes.load(Ordering::SeqCst);
    // Pooled: the handshakes do not grow with the calls (a client without
    // reuse makes 20). A connection still on its way back to the pool when
    // the next call starts (the answer's body is read by another task) is
    // replaced now and then on a loaded machine: up to 5 (seen: 2 and 3 in
    // full local CI runs on 2 cores).
    assert!(
        after - before <= 5,
        "20 sequential calls made {} TLS handshakes (connections not reused)",
        after - before
    );
    gateway.shutdown().await;
}
