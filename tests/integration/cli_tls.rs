//! The client verbs against a running gateway over the transports a
//! platform gives them: `toolgate health` (the exec probe of a gateway
//! whose gRPC port speaks TLS, which Kubernetes' native gRPC probe cannot
//! reach), plaintext and TLS.

use crate::common::*;

use super::binary::cli;

#[tokio::test]
async fn health_answers_serving_and_exits_by_status() {
    let gateway = TestGateway::start("tenants:\n  - name: acme\n    tokens: [t]\n", &[]).await;
    let addr = gateway.addr.to_string();

    let readiness = [
        "health",
        "--addr",
        &addr,
        "--service",
        "toolgate.v1.ToolGateway",
    ];
    let (code, out, err) = cli(&["health", "--addr", &addr], None).await;
    assert_eq!((code, out.trim()), (0, "SERVING"), "{err}");
    let (code, out, err) = cli(&readiness, None).await;
    assert_eq!((code, out.trim()), (0, "SERVING"), "{err}");
    // An unknown service is the health service's NOT_FOUND (exit 5).
    let (code, _, err) = cli(&["health", "--addr", &addr, "--service", "nope"], None).await;
    assert_eq!(code, 5, "{err}");

    // Draining: NOT_SERVING, exit 1.
    gateway.stop.drain();
    let mut seen = None;
    for _ in 0..50 {
        let (code, out, _) = cli(&readiness, None).await;
        if code == 1 {
            seen = Some(out);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(seen.as_deref().map(str::trim), Some("NOT_SERVING"));
    gateway.shutdown().await;

    // Nobody there: UNAVAILABLE (14).
    let port = free_port();
    let (code, _, err) = cli(&["health", "--addr", &format!("127.0.0.1:{port}")], None).await;
    assert_eq!(code, 14, "{err}");
    assert!(err.contains("cannot connect to the gateway"), "{err}");
    // A usage problem: 64.
    let (code, _, err) = cli(
        &[
            "health",
            "--addr",
            "http://127.0.0.1:1",
            "--ca-file",
            "/nonexistent",
        ],
        None,
    )
    .await;
    assert_eq!(code, 64, "{err}");
}
