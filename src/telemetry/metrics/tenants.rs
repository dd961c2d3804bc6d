//! Metrics of where tenants come from and how the registry follows the
//! tenants of the state store.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Where tenants are defined.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

/// How a load of a store tenant ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoadLabels {
    outcome: String,
}

/// How a load of a tenant of the state store ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadOutcome {
    /// Loaded (or loaded again after a change).
    Ok,
    /// No such tenant is stored (or it is shadowed by the file).
    NotFound,
    /// Its spec does not validate (the loaded version, if any, is kept).
    Invalid,
    /// The store could not be reached.
    Unavailable,
}

impl LoadOutcome {
    fn label(self) -> &'static str {
        match self {
            LoadOutcome::Ok => "ok",
            LoadOutcome::NotFound => "not_found",
            LoadOutcome::Invalid => "invalid",
            LoadOutcome::Unavailable => "unavailable",
        }
    }
}

/// `toolgate_tenants`, `toolgate_store_tenants_loaded`,
/// `toolgate_store_tenants_evicted_total`,
/// `toolgate_store_tenant_loads_total` and
/// `toolgate_tenant_change_lag_seconds`.
#[derive(Debug)]
pub struct TenantMetrics {
    tenants: Family<SourceLabels, Gauge>,
    loaded: Gauge,
    evicted: Counter,
    loads: Family<LoadLabels, Counter>,
    lag: Histogram,
}

impl TenantMetrics {
    /// The metrics, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let tenants = Family::<SourceLabels, Gauge>::default();
        registry.register(
            "toolgate_tenants",
            "Tenants served, by source: file (the configuration file's tenants), dir \
             (tenants_dir files), store (tenants of the state store loaded now)",
            tenants.clone(),
        );
        let loaded = Gauge::default();
        registry.register(
            "toolgate_store_tenants_loaded",
            "Tenants of the state store loaded now (at most tenant_store.max_loaded)",
            loaded.clone(),
        );
        let evicted = Counter::default();
        registry.register(
            "toolgate_store_tenants_evicted",
            "Tenants of the state store unloaded because they were idle, or the least \
             recently used one to make room under tenant_store.max_loaded",
            evicted.clone(),
        );
        let loads = Family::<LoadLabels, Counter>::default();
        registry.register(
            "toolgate_store_tenant_loads",
            "Loads of tenants of the state store (on first use and after a change) by \
             outcome: ok, not_found, invalid (the spec does not validate; a loaded version is \
             kept), unavailable (the store could not be reached)",
            loads.clone(),
        );
        let lag = Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
            0.005, 2.0, 14,
        ));
        registry.register(
            "toolgate_tenant_change_lag_seconds",
            "Time from a tenant's write in the state store to this replica applying it",
            lag.clone(),
        );
        Self {
            tenants,
            loaded,
            evicted,
            loads,
            lag,
        }
    }

    /// Sets how many tenants of `source` (`file`, `dir`, `store`) are served.
    pub fn set_tenants(&self, source: &str, count: usize) {
        self.tenants
            .get_or_create(&SourceLabels {
                source: source.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Sets how many store tenants are loaded (both gauges).
    pub fn set_store_loaded(&self, count: usize) {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        self.loaded.set(count);
        self.tenants
            .get_or_create(&SourceLabels {
                source: "store".to_owned(),
            })
            .set(count);
    }

    /// Counts store tenants evicted.
    pub fn evicted(&self, count: usize) {
        self.evicted.inc_by(count as u64);
    }

    /// Counts a load of a store tenant.
    pub fn load(&self, outcome: LoadOutcome) {
        self.loads
            .get_or_create(&LoadLabels {
                outcome: outcome.label().to_owned(),
            })
            .inc();
    }

    /// Records the lag of a change applied here, in seconds.
    pub fn change_lag(&self, seconds: f64) {
        self.lag.observe(seconds.max(0.0));
    }
}
