//! Metrics of call approvals (tool calls a policy rule holds for a
//! person's decision): their events, the decisions and how long they took,
//! and how many are pending. Never an approval id or an argument: the
//! labels are bounded by the configuration.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// An event of a tenant's call approvals.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    tenant: String,
    event: String,
}

/// A tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

/// `toolgate_call_approvals_total`, `toolgate_call_approvals_pending` and
/// `toolgate_call_approval_decision_seconds`.
#[derive(Debug)]
pub struct CallApprovalMetrics {
    events: Family<EventLabels, Counter>,
    pending: Family<TenantLabels, Gauge>,
    decision: Family<TenantLabels, Histogram, fn() -> Histogram>,
}

/// Buckets from one second to a week: people decide in minutes or hours.
fn decision_histogram() -> Histogram {
    Histogram::new([
        1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14_400.0, 86_400.0, 604_800.0,
    ])
}

impl CallApprovalMetrics {
    /// The metrics, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let events = Family::<EventLabels, Counter>::default();
        registry.register(
            "toolgate_call_approvals",
            "Events of call approvals (tool calls held for a person's decision) by tenant and \
             event: requested, approved, denied, expired, spent (a call ran on it), returned (a \
             call that spent it sent nothing), refused (a call named one it could not use), \
             limited (a subject had its most pending)",
            events.clone(),
        );
        let pending = Family::<TenantLabels, Gauge>::default();
        registry.register(
            "toolgate_call_approvals_pending",
            "Call approvals waiting for a decision, by tenant (counted in the state store, so \
             every replica reports the same; refreshed every 15 s)",
            pending.clone(),
        );
        let decision = Family::<TenantLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            decision_histogram,
        );
        registry.register(
            "toolgate_call_approval_decision_seconds",
            "How long call approvals waited for a decision (approved or denied), by tenant",
            decision.clone(),
        );
        CallApprovalMetrics {
            events,
            pending,
            decision,
        }
    }

    /// Counts `event` of one of `tenant`'s approvals.
    pub fn event(&self, tenant: &str, event: &str) {
        self.events
            .get_or_create(&EventLabels {
                tenant: tenant.to_owned(),
                event: event.to_owned(),
            })
            .inc();
    }

    /// A decision of one of `tenant`'s approvals, `waited` after it was
    /// asked for.
    pub fn decided(&self, tenant: &str, decision: &str, waited: Duration) {
        self.event(tenant, decision);
        self.decision
            .get_or_create(&TenantLabels {
                tenant: tenant.to_owned(),
            })
            .observe(waited.as_secs_f64());
    }

    /// Sets how many approvals each tenant has pending (`counts`); a
    /// tenant that had some and is not in `counts` has none now.
    pub fn set_pending(&self, counts: &[(String, u64)]) {
        // A gauge must not keep a count from before the last decision:
        // tenants not in this count go away.
        self.pending.clear();
        for (tenant, count) in counts {
            self.pending
                .get_or_create(&TenantLabels {
                    tenant: tenant.clone(),
                })
                .set(i64::try_from(*count).unwrap_or(i64::MAX));
        }
    }
}
