//! Certificates for 127.0.0.1 made by the `openssl` CLI, and an axum
//! listener that serves them: the HTTPS upstream of the TLS tests and of
//! the benchmark's `toolgate → fast https` path. Self-contained (std,
//! rustls, tokio), so that `toolgate-bench` includes this same file
//! (`#[path]`) rather than a copy.

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

/// Writes into `dir` (created if missing) `ca.pem` (a CA to trust),
/// `server.pem` and `server.key` (a P-256 certificate for IP 127.0.0.1
/// that the CA signed, valid two days).
///
/// # Errors
/// `openssl` is missing or one of its steps fails (its stderr is in the
/// error), or `dir` cannot be written.
pub fn make_certs(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )?;
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
            .output()?;
        if !output.status.success() {
            return Err(std::io::Error::other(format!(
                "openssl {step}: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
    }
    Ok(())
}

/// Accepts TCP connections on `tcp` (with `TCP_NODELAY`) and hands them to
/// axum once their TLS handshake, with the certificate [`make_certs`]
/// wrote to `dir`, is done. Each handshake runs in its own task (a slow
/// or failed one holds no other connection back; failed ones are
/// dropped); `handshakes` counts those that succeeded.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: Arc<AtomicUsize>,
    done: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// # Errors
    /// The certificate or key in `dir` cannot be read or used.
    pub fn new(
        tcp: TcpListener,
        dir: &Path,
        handshakes: Arc<AtomicUsize>,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let chain = CertificateDer::pem_file_iter(dir.join("server.pem"))?
            .collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(dir.join("server.key"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let (done, ready) = mpsc::channel(64);
        Ok(Self {
            tcp,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            handshakes,
            done,
            ready,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                Some(ready) = self.ready.recv() => return ready,
                accepted = self.tcp.accept() => {
                    let Ok((tcp, addr)) = accepted else {
                        // Out of descriptors, or similar: wait a little.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
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
