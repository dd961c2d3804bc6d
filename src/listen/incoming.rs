//! Accepting TLS connections: each accepted TCP connection handshakes in
//! a task of its own (with a timeout, so a slow or silent client never
//! holds up the accept loop) with the server configuration current when
//! it was accepted; handshaken connections queue for the server.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::{Stream, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::transport::server::TcpIncoming;

use super::server_config::{Alpn, server_config};
use super::watch;
use crate::config::{ListenerTls, TlsFileError};
use crate::telemetry::Metrics;

/// How long a client has to complete its handshake once connected.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server to take them.
const QUEUE: usize = 128;

/// Handshakes in progress at once on one listener. A connection accepted
/// beyond it is closed at once (and counted as a failed handshake): a flood
/// of connections that never speak holds at most this many tasks, each
/// for at most [`HANDSHAKE_TIMEOUT`].
pub const MAX_HANDSHAKES: usize = 1024;

/// Pause after a failed `accept` (e.g. out of file descriptors), so the
/// loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The stream of a TLS listener's handshaken connections, for tonic's
/// `serve_with_incoming_shutdown`. Dropping it (the server stopped) or
/// cancelling the token it was started with stops its accept loop and
/// its file watcher; connections already handed out keep going.
#[derive(Debug)]
pub struct TlsIncoming {
    connections: mpsc::Receiver<TlsStream<TcpStream>>,
    local_addr: Option<SocketAddr>,
    _stop: DropGuard,
}

impl TlsIncoming {
    /// Loads `tls`'s files and starts accepting on `listener` (nodelay,
    /// and TCP keepalive when given) and watching the files.
    ///
    /// # Errors
    /// The files do not load (named by their field), as at configuration
    /// load.
    pub fn start(
        listener: TcpListener,
        tls: &ListenerTls,
        alpn: Alpn,
        keepalive: Option<Duration>,
        metrics: Arc<Metrics>,
        stop: &CancellationToken,
    ) -> Result<TlsIncoming, TlsFileError> {
        let loaded = tls.load()?;
        let config = server_config(tls, &loaded, alpn)?;
        metrics
            .tls()
            .certificate_expiry(tls.listener, watch::unix_seconds(loaded.not_after));
        let current = Arc::new(ArcSwap::new(config));
        let local_addr = listener.local_addr().ok();
        let stop = stop.child_token();
        let tcp = TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(keepalive);
        let (queue, connections) = mpsc::channel(QUEUE);
        let accepting = Accepting {
            listener: tls.listener,
            handshakes: Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES)),
            current: current.clone(),
            queue,
            metrics: metrics.clone(),
            stop: stop.clone(),
        };
        tokio::spawn(accepting.run(tcp));
        tokio::spawn(watch::watch(
            tls.clone(),
            alpn,
            current,
            loaded.digest,
            metrics,
            stop.clone(),
        ));
        Ok(TlsIncoming {
            connections,
            local_addr,
            _stop: stop.drop_guard(),
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The next handshaken connection; `None` once the listener stopped.
    pub(super) async fn next_connection(&mut self) -> Option<TlsStream<TcpStream>> {
        self.connections.recv().await
    }
}

impl Stream for TlsIncoming {
    type Item = Result<TlsStream<TcpStream>, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.connections.poll_recv(cx).map(|c| c.map(Ok))
    }
}

/// The accept loop of one listener.
struct Accepting {
    listener: &'static str,
    /// Permits for handshakes in progress ([`MAX_HANDSHAKES`]).
    handshakes: Arc<tokio::sync::Semaphore>,
    current: Arc<ArcSwap<rustls::ServerConfig>>,
    queue: mpsc::Sender<TlsStream<TcpStream>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

impl Accepting {
    /// Accepts until stopped (or nobody takes connections any more),
    /// handing each connection to a handshake task.
    async fn run(self, mut tcp: TcpIncoming) {
        loop {
            let accepted = tokio::select! {
                () = self.stop.cancelled() => return,
                () = self.queue.closed() => return,
                accepted = tcp.next() => accepted,
            };
            match accepted {
                None => return,
                Some(Ok(stream)) => {
                    let Ok(permit) = self.handshakes.clone().try_acquire_owned() else {
                        tracing::debug!(
                            listener = self.listener,
                            limit = MAX_HANDSHAKES,
                            "too many TLS handshakes in progress: connection closed"
                        );
                        self.metrics.tls().handshake_failed(self.listener);
                        continue;
                    };
                    // The configuration current at accept: a reload while
                    // this client handshakes does not change its certificate.
                    let config = self.current.load_full();
                    let (queue, metrics, stop) =
                        (self.queue.clone(), self.metrics.clone(), self.stop.clone());
                    let listener = self.listener;
                    tokio::spawn(async move {
                        handshake(listener, config, stream, queue, metrics, stop).await;
                        drop(permit);
                    });
                }
                Some(Err(error)) => {
                    tracing::warn!(listener = self.listener, %error, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    }
}

/// Handshakes one connection within [`HANDSHAKE_TIMEOUT`] and queues it;
/// a failed handshake is logged at DEBUG (clients can cause any number)
/// and counted.
async fn handshake(
    listener: &'static str,
    config: Arc<rustls::ServerConfig>,
    stream: TcpStream,
    queue: mpsc::Sender<TlsStream<TcpStream>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let peer = stream.peer_addr().ok();
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
    let result = tokio::select! {
        () = stop.cancelled() => return,
        result = tokio::time::timeout(HANDSHAKE_TIMEOUT, accept) => result,
    };
    match result {
        Ok(Ok(stream)) => {
            // The server stopped taking connections: this one closes.
            let _ = queue.send(stream).await;
        }
        Ok(Err(error)) => {
            tracing::debug!(listener, ?peer, %error, "TLS handshake failed");
            metrics.tls().handshake_failed(listener);
        }
        Err(_) => {
            tracing::debug!(listener, ?peer, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out");
            metrics.tls().handshake_failed(listener);
        }
    }
}
