//! The gateway's own listeners (the gRPC port, metrics, the consent
//! listener, the admin API): plaintext, or TLS with rustls when the
//! listener's `tls:` block is set (TLS 1.2 and 1.3 only; ALPN `h2` on the
//! gRPC ports), with client certificates asked for or required as
//! configured. The certificate, key and client CAs are re-read when their
//! files change: a new handshake gets the new ones, a connection already
//! open keeps its own, and files that fail [`crate::config::ListenerTls::load`]
//! are refused (a log line and a metric) while the last good ones serve.
//! Connections still handshaking are bounded per peer address and per
//! listener, and get a short time for their ClientHello, so a handshake
//! flood cannot keep other clients out (`flood`).
//!
//! [`TlsIncoming`] is the stream of handshaken connections tonic serves
//! (`serve_with_incoming_shutdown`); [`TlsListener`] wraps it for axum.

mod describe;
mod flood;
mod http;
mod incoming;
mod server_config;
mod watch;

pub use describe::{LeafSummary, describe_leaf};
pub use http::{PeerAddrTlsListener, TlsListener};
pub use incoming::TlsIncoming;
pub use server_config::Alpn;
pub use watch::POLL_INTERVAL;
