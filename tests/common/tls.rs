//! An in-process MCP server over HTTPS, with a CA and a server certificate
//! for 127.0.0.1 made by the `openssl` CLI for the test.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::{McpServer, TestServer};

/// Writes `ca.pem` (a CA to trust), `server.pem` and `server.key` (a
/// certificate for IP 127.0.0.1 that the CA signed) into `dir`.
pub fn make_certs(dir: &Path) {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    for step in [
        format!("req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=toolgate-test-CA"),
        format!("req {ec} -keyout server.key -out server.csr -subj /CN=127.0.0.1"),
        "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
         -out server.pem -days 2 -extfile server.ext"
            .to_string(),
    ] {
        let output = std::process::Command::new("openssl")
            .args(step.split_whitespace())
            .current_dir(dir)
            .output()
            .expect("the openssl CLI");
        assert!(
            output.status.success(),
            "openssl {step}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// An MCP server over HTTPS, and the TLS handshakes it completed.
pub struct TlsMcpServer {
    pub server: McpServer,
    pub handshakes: Arc<AtomicUsize>,
}

/// Serves `server` over Streamable HTTP and TLS on 127.0.0.1, with the
/// certificate [`make_certs`] wrote to `dir`.
pub async fn serve_mcp_tls(server: TestServer, dir: &Path) -> TlsMcpServer {
    let chain = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let log = server.log.clone();
    let stop = CancellationToken::new();
    let router = super::mcp_router(server, false, &stop);
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let (done, ready) = mpsc::channel(16);
    let listener = TlsListener {
        tcp,
        acceptor: TlsAcceptor::from(Arc::new(config)),
        handshakes: handshakes.clone(),
        done,
        ready,
    };
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

/// Hands axum the connections whose TLS handshake succeeded (each
/// handshake in its own task; failed ones are dropped).
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: Arc<AtomicUsize>,
    done: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                Some(ready) = self.ready.recv() => return ready,
                accepted = self.tcp.accept() => {
                    let Ok((tcp, addr)) = accepted else { continue };
                    let acceptor = self.acceptor.clone();
                    let handshakes = self.handshakes.clone();
                    let done = self.done.clone();
                    tokio::spawn(async move {
                        let handshake = acceptor.accept(tcp);
                        if let Ok(Ok(tls)) =
                            tokio::time::timeout(Duration::from_secs(10), handshake).await
                        {
                            handshakes.fetch_add(1, Ordering::SeqCst);
                            let _ = done.send((tls, addr)).await;
                        }
                    });
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
