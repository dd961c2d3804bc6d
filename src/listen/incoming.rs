//! Accepting TLS connections: each accepted TCP connection handshakes in
//! a task of its own with the server configuration current when it was
//! accepted; handshaken connections queue for the server. A connection
//! holds a slot of its peer address and one of the listener while it
//! handshakes, and has a short time for its ClientHello and a longer one
//! for the whole handshake, so that silent or slow clients never hold up
//! the accept loop nor, from one address, every other client
//! ([`super::flood`]).

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
use tokio::time::Instant;
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::transport::server::TcpIncoming;

use super::flood::{Refusal, Refusals, Slots};
use super::server_config::{Alpn, server_config};
use super::watch;
use crate::config::{HandshakeLimits, ListenerTls, TlsFileError};
use crate::telemetry::Metrics;

/// Handshaken connections waiting for the server to take them.
const QUEUE: usize = 128;

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
            limits: tls.handshakes,
            slots: Slots::new(tls.handshakes),
            refusals: Arc::new(Refusals::new(tls.listener, metrics.clone())),
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
    limits: HandshakeLimits,
    /// Handshakes in progress, per peer and for the listener.
    slots: Slots,
    refusals: Arc<Refusals>,
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
                    let Ok(peer) = stream.peer_addr() else {
                        // Gone already.
                        continue;
                    };
                    let slot = match self.slots.take(peer.ip()) {
                        Ok(slot) => slot,
                        Err(why) => {
                            // Closed unanswered (dropped here).
                            self.refusals.refused(why, peer.ip());
                            continue;
                        }
                    };
                    let handshake = Handshake {
                        listener: self.listener,
                        limits: self.limits,
                        // The configuration current at accept: a reload while
                        // this client handshakes does not change its certificate.
                        config: self.current.load_full(),
                        peer,
                        queue: self.queue.clone(),
                        metrics: self.metrics.clone(),
                        refusals: self.refusals.clone(),
                    };
                    let stop = self.stop.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            () = stop.cancelled() => {}
                            () = handshake.run(stream) => {}
                        }
                        drop(slot);
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

/// One accepted connection's handshake.
struct Handshake {
    listener: &'static str,
    limits: HandshakeLimits,
    config: Arc<rustls::ServerConfig>,
    peer: SocketAddr,
    queue: mpsc::Sender<TlsStream<TcpStream>>,
    metrics: Arc<Metrics>,
    refusals: Arc<Refusals>,
}

impl Handshake {
    /// Reads the ClientHello within `limits.client_hello` (a connection
    /// that sends none is closed and counted as refused), completes the
    /// handshake within `limits.timeout` of the accept and queues the
    /// connection. A failed handshake is logged at DEBUG (clients can
    /// cause any number) and counted.
    async fn run(self, stream: TcpStream) {
        let (listener, peer) = (self.listener, self.peer);
        let deadline = Instant::now() + self.limits.timeout;
        let hello = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
        let mut hello = std::pin::pin!(hello);
        let start = match tokio::time::timeout(self.limits.client_hello, &mut hello).await {
            Ok(Ok(start)) => start,
            Ok(Err(error)) => {
                tracing::debug!(listener, %peer, %error, "TLS handshake failed");
                self.metrics.tls().handshake_failed(listener);
                return;
            }
            Err(_) => {
                // Counted while the connection is still open, so that
                // whoever sees it closed sees it counted.
                self.refusals
                    .refused(Refusal::ClientHelloTimeout, peer.ip());
                return;
            }
        };
        match tokio::time::timeout_at(deadline, start.into_stream(self.config)).await {
            Ok(Ok(stream)) => {
                // The server stopped taking connections: this one closes.
                let _ = self.queue.send(stream).await;
            }
            Ok(Err(error)) => {
                tracing::debug!(listener, %peer, %error, "TLS handshake failed");
                self.metrics.tls().handshake_failed(listener);
            }
            Err(_) => {
                tracing::debug!(listener, %peer, timeout = ?self.limits.timeout, "TLS handshake timed out");
                self.metrics.tls().handshake_failed(listener);
            }
        }
    }
}
