//! Metrics of the result cache (`calls::cache`): lookups that hit or
//! missed, results kept, entries dropped, and what each tenant's cache
//! holds.

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

/// Entries a tenant's cache dropped, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    tenant: String,
    reason: String,
}

/// A tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

/// `toolgate_cache_hits_total`, `toolgate_cache_misses_total`,
/// `toolgate_cache_stores_total`, `toolgate_cache_evictions_total`,
/// `toolgate_cache_entries` and `toolgate_cache_bytes`.
#[derive(Debug)]
pub struct CacheMetrics {
    hits: Family<ServerLabels, Counter>,
    misses: Family<ServerLabels, Counter>,
    stores: Family<ServerLabels, Counter>,
    evictions: Family<EvictionLabels, Counter>,
    entries: Family<TenantLabels, Gauge>,
    bytes: Family<TenantLabels, Gauge>,
}

impl CacheMetrics {
    /// The metrics, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let hits = Family::<ServerLabels, Counter>::default();
        registry.register(
            "toolgate_cache_hits",
            "Requests answered from the result cache (nothing sent upstream), by tenant and server",
            hits.clone(),
        );
        let misses = Family::<ServerLabels, Counter>::default();
        registry.register(
            "toolgate_cache_misses",
            "Requests the result cache was asked for and had no fresh result for (sent \
             upstream), by tenant and server",
            misses.clone(),
        );
        let stores = Family::<ServerLabels, Counter>::default();
        registry.register(
            "toolgate_cache_stores",
            "Results kept in the result cache (the server marked them reusable: ttlMs above 0), \
             by tenant and server",
            stores.clone(),
        );
        let evictions = Family::<EvictionLabels, Counter>::default();
        registry.register(
            "toolgate_cache_evictions",
            "Entries dropped from a tenant's result cache, by reason (lru: over \
             limits.max_cache_entries or limits.max_cache_bytes; expired: past its ttlMs; \
             reload: the tenant was reloaded or removed)",
            evictions.clone(),
        );
        let entries = Family::<TenantLabels, Gauge>::default();
        registry.register(
            "toolgate_cache_entries",
            "Results a tenant's cache holds",
            entries.clone(),
        );
        let bytes = Family::<TenantLabels, Gauge>::default();
        registry.register(
            "toolgate_cache_bytes",
            "Bytes a tenant's cache holds (the results as JSON, and their keys)",
            bytes.clone(),
        );
        CacheMetrics {
            hits,
            misses,
            stores,
            evictions,
            entries,
            bytes,
        }
    }

    fn server(tenant: &str, server: &str) -> ServerLabels {
        ServerLabels {
            tenant: tenant.to_owned(),
            server: server.to_owned(),
        }
    }

    /// Counts a hit of `tenant`'s cache for `server`.
    pub fn hit(&self, tenant: &str, server: &str) {
        self.hits.get_or_create(&Self::server(tenant, server)).inc();
    }

    /// Counts a miss of `tenant`'s cache for `server`.
    pub fn miss(&self, tenant: &str, server: &str) {
        self.misses
            .get_or_create(&Self::server(tenant, server))
            .inc();
    }

    /// Counts a result of `server` kept in `tenant`'s cache.
    pub fn stored(&self, tenant: &str, server: &str) {
        self.stores
            .get_or_create(&Self::server(tenant, server))
            .inc();
    }

    /// Counts `count` entries `tenant`'s cache dropped for `reason`
    /// (`lru`, `expired`, `reload`).
    pub fn evicted(&self, tenant: &str, reason: &'static str, count: u64) {
        if count == 0 {
            return;
        }
        self.evictions
            .get_or_create(&EvictionLabels {
                tenant: tenant.to_owned(),
                reason: reason.to_owned(),
            })
            .inc_by(count);
    }

    /// What `tenant`'s cache holds now.
    pub fn holds(&self, tenant: &str, entries: usize, bytes: usize) {
        let labels = TenantLabels {
            tenant: tenant.to_owned(),
        };
        self.entries
            .get_or_create(&labels)
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
        self.bytes
            .get_or_create(&labels)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Drops the gauges of a tenant that is gone.
    pub fn forget(&self, tenant: &str) {
        let labels = TenantLabels {
            tenant: tenant.to_owned(),
        };
        self.entries.remove(&labels);
        self.bytes.remove(&labels);
    }
}
