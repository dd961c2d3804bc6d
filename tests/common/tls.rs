//! An in-process MCP server over HTTPS, with a CA and a server certificate
//! for 127.0.0.1 made by the `openssl` CLI for the test
//! ([`tls_server`](super::tls_server)).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::tls_server::TlsListener;
use super::{McpServer, TestServer};

/// An MCP server over HTTPS, and the TLS handshakes it completed.
pub struct TlsMcpServer {
    pub server: McpServer,
    pub handshakes: Arc<AtomicUsize>,
}

/// Serves `server` over Streamable HTTP and TLS on 127.0.0.1, with the
/// certificate [`make_certs`](super::make_certs) wrote to `dir`.
pub async fn serve_mcp_tls(server: TestServer, dir: &Path) -> TlsMcpServer {
    let log = server.log.clone();
    let stop = CancellationToken::new();
    let router = super::mcp_router(server, false, &stop);
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let listener = TlsListener::new(tcp, dir, handshakes.clone()).unwrap();
    let shutdown = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
    });
    TlsMcpServer {
        server: McpServer {
            url: format!("https://{addr}/mcp"),
            log,
            stop,
        },
        handshakes,
    }
}
