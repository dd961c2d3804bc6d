//! Metrics of the TLS of the gateway's own listeners: the certificate in
//! force, its reloads, failed handshakes and the connections closed
//! before their handshake (a handshake flood's bounds).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A listener (`grpc`, `metrics`, `oauth`, `admin`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

/// A reload of a listener's files, and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    listener: String,
    outcome: String,
}

/// A connection closed before its handshake, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    listener: String,
    reason: String,
}

/// `toolgate_tls_certificate_expiry_timestamp_seconds`,
/// `toolgate_tls_reloads_total`, `toolgate_tls_handshake_failures_total`
/// and `toolgate_tls_connections_refused_total`.
#[derive(Debug)]
pub struct TlsMetrics {
    expiry: Family<ListenerLabels, Gauge>,
    reloads: Family<ReloadLabels, Counter>,
    handshake_failures: Family<ListenerLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
}

impl TlsMetrics {
    /// The metrics, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let expiry = Family::<ListenerLabels, Gauge>::default();
        registry.register(
            "toolgate_tls_certificate_expiry_timestamp_seconds",
            "When the certificate a TLS listener serves now stops being valid (its notAfter, \
             Unix seconds), by listener: grpc, metrics, oauth, admin",
            expiry.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "toolgate_tls_reloads",
            "Changes of a TLS listener's certificate, key or client CA files, by listener and \
             outcome: applied (new handshakes use them), refused (they do not load; the last \
             good ones are kept)",
            reloads.clone(),
        );
        let handshake_failures = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "toolgate_tls_handshake_failures",
            "TLS handshakes that failed or timed out after the client's ClientHello, by \
             listener (a client without a valid certificate on client_auth: required, an old \
             protocol version, a plaintext client)",
            handshake_failures.clone(),
        );
        let refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "toolgate_tls_connections_refused",
            "Connections a TLS listener closed before their handshake, by listener and reason: \
             peer_limit (the peer address had tls.max_handshakes_per_peer handshakes in \
             progress), listener_limit (the listener had tls.max_handshakes), \
             client_hello_timeout (no ClientHello within tls.client_hello_timeout)",
            refused.clone(),
        );
        TlsMetrics {
            expiry,
            reloads,
            handshake_failures,
            refused,
        }
    }

    /// Sets the expiry of the certificate `listener` serves now.
    pub fn certificate_expiry(&self, listener: &str, not_after_unix: i64) {
        self.expiry
            .get_or_create(&ListenerLabels {
                listener: listener.to_owned(),
            })
            .set(not_after_unix);
    }

    /// Counts a change of `listener`'s files: `applied` or refused.
    pub fn reload(&self, listener: &str, applied: bool) {
        self.reloads
            .get_or_create(&ReloadLabels {
                listener: listener.to_owned(),
                outcome: if applied { "applied" } else { "refused" }.to_owned(),
            })
            .inc();
    }

    /// Counts a failed (or timed out) handshake on `listener`.
    pub fn handshake_failed(&self, listener: &str) {
        self.handshake_failures
            .get_or_create(&ListenerLabels {
                listener: listener.to_owned(),
            })
            .inc();
    }

    /// Counts a connection `listener` closed before its handshake, for
    /// `reason` (`peer_limit`, `listener_limit`, `client_hello_timeout`).
    pub fn connection_refused(&self, listener: &str, reason: &str) {
        self.refused
            .get_or_create(&RefusedLabels {
                listener: listener.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }
}
