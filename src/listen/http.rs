//! A TLS listener for axum (metrics and the consent listener; HTTP/1.1).

use std::io;
use std::net::SocketAddr;

use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::incoming::TlsIncoming;

/// [`TlsIncoming`] as an [`axum::serve::Listener`]; its address is the
/// peer's `SocketAddr`. axum implements `ConnectInfo<SocketAddr>` for a
/// listener wrapped in `tap_io`, so serve
/// `TlsListener::from(incoming).tap_io(|_| {})` with
/// `into_make_service_with_connect_info::<SocketAddr>()`.
#[derive(Debug)]
pub struct TlsListener {
    incoming: TlsIncoming,
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
