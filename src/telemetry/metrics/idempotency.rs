//! Metrics of idempotency keys: what became of each call that carried
//! one. Never a key: the labels are the tenant and a fixed outcome.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// An outcome of a tenant's keyed call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    tenant: String,
    outcome: &'static str,
}

/// `toolgate_idempotency_keys_total`.
#[derive(Debug)]
pub struct IdempotencyMetrics {
    outcomes: Family<OutcomeLabels, Counter>,
}

impl IdempotencyMetrics {
    /// The metrics, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let outcomes = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "toolgate_idempotency_keys",
            "Tool calls that carried an idempotency key, by tenant and outcome: claimed (the call \
             ran under a new key), replayed (a recorded response answered it), in_progress (the \
             first call was still running when this one's deadline ended), in_doubt (the first \
             call may have acted and is never sent again), reused (other arguments), not_kept \
             (done, its response not kept), limit (the tenant had its most live keys)",
            outcomes.clone(),
        );
        Self { outcomes }
    }

    /// Counts `outcome` of a keyed call of `tenant`'s.
    pub fn outcome(&self, tenant: &str, outcome: &'static str) {
        self.outcomes
            .get_or_create(&OutcomeLabels {
                tenant: tenant.to_owned(),
                outcome,
            })
            .inc();
    }
}
