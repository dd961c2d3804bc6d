//! A TLS listener for axum (metrics and the consent listener; HTTP/1.1).

use std::io;
use std::net::SocketAddr;

use axum::serve::{ListenerExt, TapIo};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::incoming::TlsIncoming;

/// [`TlsIncoming`] as an [`axum::serve::Listener`]; its address is the
/// peer's `SocketAddr`. For handlers that take `ConnectInfo<SocketAddr>`,
/// serve [`TlsListener::with_peer_addr`] instead.
#[derive(Debug)]
pub struct TlsListener {
    incoming: TlsIncoming,
}

/// A [`TlsListener`] that gives axum's `ConnectInfo<SocketAddr>` (axum
/// implements it for listeners wrapped in `tap_io`).
pub type PeerAddrTlsListener = TapIo<TlsListener, fn(&mut TlsStream<TcpStream>)>;

impl TlsListener {
    /// This listener for a router served with
    /// `into_make_service_with_connect_info::<SocketAddr>()`.
    pub fn with_peer_addr(self) -> PeerAddrTlsListener {
        fn untouched(_: &mut TlsStream<TcpStream>) {}
        self.tap_io(untouched as fn(&mut TlsStream<TcpStream>))
    }
}

impl From<TlsIncoming> for TlsListener {
    fn from(incoming: TlsIncoming) -> Self {
        TlsListener { incoming }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.next_connection().await {
                Some(stream) => {
                    let Ok(peer) = stream.get_ref().0.peer_addr() else {
                        // Gone already.
                        continue;
                    };
                    return (stream, peer);
                }
                // Stopped: axum's graceful shutdown ends the server; until
                // then nothing more is accepted.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.incoming
            .local_addr()
            .ok_or_else(|| io::Error::other("the listener's address is unknown"))
    }
}
