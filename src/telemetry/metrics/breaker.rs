//! Metrics of the calls' circuit breakers: how many of a server's breakers
//! are open, how often they opened, and what their probes came to.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A tenant's server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    tenant: String,
    server: String,
}

/// A probe of a server's breaker, and what came of it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    tenant: String,
    server: String,
    result: String,
}

/// `toolgate_circuit_open`, `toolgate_circuit_opened_total` and
/// `toolgate_circuit_probes_total`.
#[derive(Debug)]
pub struct CircuitMetrics {
    open: Family<ServerLabels, Gauge>,
    opened: Family<ServerLabels, Counter>,
    probes: Family<ProbeLabels, Counter>,
}

impl CircuitMetrics {
    /// The metrics, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let open = Family::<ServerLabels, Gauge>::default();
        registry.register(
            "toolgate_circuit_open",
            "Open circuit breakers of a server (open or half-open: its calls fail fast with \
             SERVER_CIRCUIT_OPEN): 0 or 1, or for a per-user server the number of subjects whose \
             breaker is open",
            open.clone(),
        );
        let opened = Family::<ServerLabels, Counter>::default();
        registry.register(
            "toolgate_circuit_opened",
            "Times a server's circuit breaker opened (after its run of breaking failures, or \
             again after a failed probe)",
            opened.clone(),
        );
        let probes = Family::<ProbeLabels, Counter>::default();
        registry.register(
            "toolgate_circuit_probes",
            "Probe calls of an open breaker whose cool-down ended, by result: closed (the \
             server answered), reopened (it failed again), released (the call ended before an \
             answer, so the next call probes)",
            probes.clone(),
        );
        CircuitMetrics {
            open,
            opened,
            probes,
        }
    }

    fn labels(tenant: &str, server: &str) -> ServerLabels {
        ServerLabels {
            tenant: tenant.to_owned(),
            server: server.to_owned(),
        }
    }

    /// A breaker of `tenant`'s `server` opened from closed.
    pub fn opened(&self, tenant: &str, server: &str) {
        let labels = Self::labels(tenant, server);
        self.opened.get_or_create(&labels).inc();
        self.open.get_or_create(&labels).inc();
    }

    /// A breaker of `tenant`'s `server` opened again after a failed probe
    /// (it was counted open already).
    pub fn reopened(&self, tenant: &str, server: &str) {
        self.opened
            .get_or_create(&Self::labels(tenant, server))
            .inc();
        self.probe(tenant, server, "reopened");
    }

    /// `count` breakers of `tenant`'s `server` closed, or were forgotten
    /// while open (the server removed, a subject's evicted).
    pub fn closed(&self, tenant: &str, server: &str, count: usize) {
        if count > 0 {
            self.open
                .get_or_create(&Self::labels(tenant, server))
                .dec_by(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// A probe of `tenant`'s `server` came to `result` (`closed`,
    /// `reopened`, `released`).
    pub fn probe(&self, tenant: &str, server: &str, result: &str) {
        self.probes
            .get_or_create(&ProbeLabels {
                tenant: tenant.to_owned(),
                server: server.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }
}
