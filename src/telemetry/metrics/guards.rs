//! Metrics of the guards (`guards:`): each check by guard, phase and
//! verdict, and how long a guard took to answer.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A check of a guard, and what came of it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    guard: String,
    phase: String,
    verdict: String,
}

/// A guard.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GuardLabels {
    guard: String,
}

/// `toolgate_guard_checks_total` and `toolgate_guard_check_seconds`.
#[derive(Debug)]
pub struct GuardMetrics {
    checks: Family<CheckLabels, Counter>,
    seconds: Family<GuardLabels, Histogram, fn() -> Histogram>,
}

impl GuardMetrics {
    /// The metrics, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let checks = Family::<CheckLabels, Counter>::default();
        registry.register(
            "toolgate_guard_checks",
            "Checks of guards by guard (its configured name), phase (request, response) and \
             verdict (allow, deny, replace; failed_open: the guard failed and `failure: open` let \
             the call go on; failed_closed: it failed and the call stopped)",
            checks.clone(),
        );
        let seconds = Family::<GuardLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            super::latency_histogram,
        );
        registry.register(
            "toolgate_guard_check_seconds",
            "How long a guard took to answer a check (or to fail), by guard",
            seconds.clone(),
        );
        GuardMetrics { checks, seconds }
    }

    /// Counts a check of `guard` in `phase` that came to `verdict` after
    /// `elapsed`. Guard names come from the configuration only.
    pub fn check(&self, guard: &str, phase: &str, verdict: &str, elapsed: Duration) {
        self.checks
            .get_or_create(&CheckLabels {
                guard: guard.to_owned(),
                phase: phase.to_owned(),
                verdict: verdict.to_owned(),
            })
            .inc();
        self.seconds
            .get_or_create(&GuardLabels {
                guard: guard.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }
}
