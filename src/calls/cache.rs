//! The result cache: results a server marks as reusable, kept per tenant
//! and answered again while they are fresh, without an upstream request.
//!
//! What marks a result reusable is the MCP 2026-07-28 revision's caching
//! hints ("Caching", `server/utilities/caching`; SEP-2549): `ttlMs`, how
//! many milliseconds the result may be considered fresh (absent or `0`:
//! immediately stale, never kept), and `cacheScope`, `public` (the same
//! for every caller) or `private` (only within the same authorization
//! context). The revision puts them on the results of `server/discover`,
//! the lists and `resources/read`; a `tools/call` result carries none, so
//! an operation says through [`super::pipeline::Operation::cache_hint`]
//! where its results carry one (today: resource reads).
//!
//! The key ([`Key`]): the method, the server, the upstream name (tool, or
//! URI in normal form), the definition hash, the SHA-256 of the canonical
//! arguments as they are sent (after the guards' request phase), and the
//! subject's key for a `private` result or any result of a per-user
//! server: a subject is never answered another's result. Each tenant's
//! entries are bounded (`limits.max_cache_entries`,
//! `limits.max_cache_bytes`), the least recently used dropped first, and
//! belong to one tenant object: a reload (a new object) starts its tenant
//! afresh, and the entries of a tenant that is gone are dropped (looked
//! for whenever a tenant object is new to the cache, and every 10 s).
//!
//! The cache's `Debug` shows counts, never a result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hashlink::LruCache;
use rmcp::model::{CacheScope, JsonObject};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Origin;
use super::routed::Routed;
use crate::registry::Tenant;
use crate::telemetry::Metrics;

/// The longest a result is kept, whatever its `ttlMs` says.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How often, at most, the caches of tenants that are gone are looked
/// for (besides whenever a tenant object is new to the cache).
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// Who may be answered a kept result again (the result's `cacheScope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Any subject of the tenant (`public`).
    Public,
    /// Only the subject it was fetched for (`private`, or absent).
    Private,
}

/// A server's hint that a result may be answered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hint {
    /// How long it is fresh (`ttlMs`, at most [`MAX_TTL`]).
    pub(crate) ttl: Duration,
    /// Who may be answered it.
    pub(crate) scope: Scope,
}

impl Hint {
    /// The hint of a result's `ttlMs` and `cacheScope`: none when `ttlMs`
    /// is absent or `0` (immediately stale). An absent scope is taken as
    /// `private`: a scope the server did not state is never widened.
    #[must_use]
    pub(crate) fn of(ttl_ms: Option<u64>, scope: Option<CacheScope>) -> Option<Self> {
        let ttl = Duration::from_millis(ttl_ms.filter(|ms| *ms > 0)?).min(MAX_TTL);
        let scope = match scope {
            Some(CacheScope::Public) => Scope::Public,
            _ => Scope::Private,
        };
        Some(Self { ttl, scope })
    }
}

/// What identifies a kept result within its tenant.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    method: &'static str,
    /// The subject's key (`private`, per-user servers), or `None`.
    subject: Option<String>,
    server: String,
    name: String,
    definition_hash: String,
    arguments_sha256: String,
}

impl Key {
    /// What the key itself costs, roughly.
    fn size(&self) -> usize {
        self.subject.as_ref().map_or(0, String::len)
            + self.server.len()
            + self.name.len()
            + self.definition_hash.len()
            + self.arguments_sha256.len()
            + 64
    }
}

/// A kept result: its JSON, until when it is fresh.
struct Entry {
    json: Arc<[u8]>,
    expires: Instant,
    size: usize,
}

/// One tenant object's entries.
struct TenantCache {
    lru: LruCache<Key, Entry>,
    bytes: usize,
}

impl TenantCache {
    fn new() -> Self {
        Self {
            lru: LruCache::new_unbounded(),
            bytes: 0,
        }
    }

    /// The fresh result under `key` (an expired one is dropped: `true`).
    fn get(&mut self, key: &Key, now: Instant) -> (Option<Arc<[u8]>>, bool) {
        match self.lru.get(key) {
            Some(entry) if entry.expires > now => (Some(entry.json.clone()), false),
            Some(_) => {
                if let Some(entry) = self.lru.remove(key) {
                    self.bytes -= entry.size;
                }
                (None, true)
            }
            None => (None, false),
        }
    }

    /// Keeps `entry` under `key` within `max_entries` and `max_bytes`:
    /// how many entries were dropped as expired and as least recently used.
    fn insert(
        &mut self,
        key: Key,
        entry: Entry,
        (max_entries, max_bytes): (usize, usize),
        now: Instant,
    ) -> (u64, u64) {
        let (mut expired, mut lru) = (0, 0);
        if let Some(old) = self.lru.remove(&key) {
            self.bytes -= old.size;
        }
        self.bytes += entry.size;
        self.lru.insert(key, entry);
        while self.lru.len() > max_entries || self.bytes > max_bytes {
            let Some((_, dropped)) = self.lru.remove_lru() else {
                break;
            };
            self.bytes -= dropped.size;
            if dropped.expires <= now {
                expired += 1;
            } else {
                lru += 1;
            }
        }
        (expired, lru)
    }
}

/// A tenant's cache, with the tenant object it belongs to.
struct Held {
    stamp: u64,
    tenant: Weak<Tenant>,
    cache: Arc<Mutex<TenantCache>>,
}

/// The result cache of a gateway: each tenant's entries ([`Probe`]).
pub(crate) struct ResultCache {
    tenants: Mutex<HashMap<String, Held>>,
    metrics: Arc<Metrics>,
    /// When the caches of tenants that are gone were last looked for.
    swept: Mutex<Instant>,
    stores: AtomicU64,
}

impl std::fmt::Debug for ResultCache {
    /// Tenants and counts only: kept results may hold anything.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tenants = self.tenants.lock().map_or(0, |t| t.len());
        f.debug_struct("ResultCache")
            .field("tenants", &tenants)
            .field("stores", &self.stores.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ResultCache {
    /// An empty cache, counted in `metrics`.
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            tenants: Mutex::default(),
            metrics,
            swept: Mutex::new(Instant::now()),
            stores: AtomicU64::new(0),
        }
    }

    /// The probe of a request of `method` routed as `routed`, with the
    /// `arguments` it would send; `None` when its results are not kept:
    /// the server's `cache_results` is off, or the request is a retry of
    /// rounds of questions (the spec: never cached, its inputs are not in
    /// the key).
    pub(crate) fn probe<'a, E>(
        &'a self,
        method: &'static str,
        routed: &'a Routed<E>,
        origin: &Origin,
        arguments: &JsonObject,
        retrying: bool,
    ) -> Option<Probe<'a>> {
        if retrying || !routed.config().cache_results {
            return None;
        }
        Some(Probe {
            cache: self,
            tenant: &routed.tenant,
            per_user: routed.tenant.is_per_user(routed.index),
            key: Key {
                method,
                subject: None,
                server: routed.server.clone(),
                name: routed.upstream_name.clone(),
                definition_hash: routed.definition_hash.clone(),
                arguments_sha256: super::rounds::arguments_digest(arguments),
            },
            subject: origin.subject.key().to_owned(),
        })
    }

    /// The cache of `tenant`'s object: `None` for an object a reload has
    /// replaced (its calls neither read nor keep). A newer object than the
    /// one the entries belong to starts afresh.
    fn of(&self, tenant: &Arc<Tenant>) -> Option<Arc<Mutex<TenantCache>>> {
        let mut tenants = self.tenants.lock().ok()?;
        let due = self
            .swept
            .lock()
            .is_ok_and(|s| s.elapsed() >= SWEEP_INTERVAL);
        if due {
            self.sweep(&mut tenants);
        }
        let stamp = tenant.stamp();
        if let Some(held) = tenants.get(&tenant.name) {
            if held.stamp == stamp {
                return Some(held.cache.clone());
            }
            if held.stamp > stamp {
                return None;
            }
        }
        let cache = Arc::new(Mutex::new(TenantCache::new()));
        let replaced = tenants.insert(
            tenant.name.clone(),
            Held {
                stamp,
                tenant: Arc::downgrade(tenant),
                cache: cache.clone(),
            },
        );
        if let Some(old) = replaced {
            let count = old.cache.lock().map_or(0, |c| c.lru.len());
            self.metrics
                .cache()
                .evicted(&tenant.name, "reload", count as u64);
        }
        self.metrics.cache().holds(&tenant.name, 0, 0);
        self.sweep(&mut tenants);
        Some(cache)
    }

    /// Drops the caches of tenant objects that are gone (a tenant removed
    /// by a reload, with no call left on it).
    fn sweep(&self, tenants: &mut HashMap<String, Held>) {
        if let Ok(mut swept) = self.swept.lock() {
            *swept = Instant::now();
        }
        tenants.retain(|name, held| {
            if held.tenant.strong_count() > 0 {
                return true;
            }
            let count = held.cache.lock().map_or(0, |c| c.lru.len());
            self.metrics.cache().evicted(name, "reload", count as u64);
            self.metrics.cache().forget(name);
            false
        });
    }
}

/// One request's way into the cache: its lookup before sending, and the
/// keeping of the server's result after.
pub(crate) struct Probe<'a> {
    cache: &'a ResultCache,
    tenant: &'a Arc<Tenant>,
    per_user: bool,
    /// The key with no subject (filled in for a private lookup).
    key: Key,
    subject: String,
}

impl Probe<'_> {
    /// The key of a result of `scope`.
    fn key(&self, scope: Scope) -> Key {
        let mut key = self.key.clone();
        if self.per_user || scope == Scope::Private {
            key.subject = Some(self.subject.clone());
        }
        key
    }

    /// The fresh result kept for this request (the subject's own first,
    /// then a `public` one of a shared server), counted as a hit or a miss.
    pub(crate) fn hit<T: DeserializeOwned>(&self) -> Option<T> {
        let metrics = self.cache.metrics.cache();
        let (tenant, server) = (&self.tenant.name, &self.key.server);
        let Some(cache) = self.cache.of(self.tenant) else {
            metrics.miss(tenant, server);
            return None;
        };
        let now = Instant::now();
        let (found, expired) = {
            let Ok(mut cache) = cache.lock() else {
                return None;
            };
            let (mut found, mut expired) = cache.get(&self.key(Scope::Private), now);
            if found.is_none() && !self.per_user {
                let (shared, gone) = cache.get(&self.key(Scope::Public), now);
                found = shared;
                expired |= gone;
            }
            if expired {
                metrics.holds(tenant, cache.lru.len(), cache.bytes);
            }
            (found, expired)
        };
        if expired {
            metrics.evicted(tenant, "expired", 1);
        }
        // A kept result that no longer reads as the kind's (never expected)
        // is a miss: the request goes upstream.
        match found.and_then(|json| serde_json::from_slice(&json).ok()) {
            Some(result) => {
                metrics.hit(tenant, server);
                Some(result)
            }
            None => {
                metrics.miss(tenant, server);
                None
            }
        }
    }

    /// Keeps `result` when the server marked it reusable (`hint`), within
    /// the tenant's bounds; whether it was kept.
    pub(crate) fn keep(&self, hint: Option<Hint>, result: &impl Serialize) -> bool {
        let Some(hint) = hint else {
            return false;
        };
        let Ok(json) = serde_json::to_vec(result) else {
            return false;
        };
        let limits = self.tenant.limits();
        let key = self.key(hint.scope);
        let size = json.len() + key.size();
        if size > limits.max_cache_bytes {
            return false;
        }
        let Some(cache) = self.cache.of(self.tenant) else {
            return false;
        };
        let now = Instant::now();
        let entry = Entry {
            json: json.into(),
            expires: now + hint.ttl,
            size,
        };
        let metrics = self.cache.metrics.cache();
        let tenant = &self.tenant.name;
        let (expired, lru) = {
            let Ok(mut cache) = cache.lock() else {
                return false;
            };
            let dropped = cache.insert(
                key,
                entry,
                (limits.max_cache_entries, limits.max_cache_bytes),
                now,
            );
            metrics.holds(tenant, cache.lru.len(), cache.bytes);
            dropped
        };
        metrics.evicted(tenant, "expired", expired);
        metrics.evicted(tenant, "lru", lru);
        metrics.stored(tenant, &self.key.server);
        self.cache.stores.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, subject: Option<&str>) -> Key {
        Key {
            method: "resources/read",
            subject: subject.map(str::to_owned),
            server: "s".to_owned(),
            name: name.to_owned(),
            definition_hash: String::new(),
            arguments_sha256: "0".repeat(64),
        }
    }

    fn entry(bytes: usize, expires: Instant) -> Entry {
        Entry {
            json: vec![b'x'; bytes].into(),
            expires,
            size: bytes,
        }
    }

    #[test]
    fn hints_need_a_positive_ttl_and_default_to_private() {
        assert_eq!(Hint::of(None, Some(CacheScope::Public)), None);
        assert_eq!(Hint::of(Some(0), Some(CacheScope::Public)), None);
        let hint = Hint::of(Some(1500), None).unwrap();
        assert_eq!(hint.ttl, Duration::from_millis(1500));
        assert_eq!(hint.scope, Scope::Private);
        let hint = Hint::of(Some(u64::MAX), Some(CacheScope::Public)).unwrap();
        assert_eq!((hint.ttl, hint.scope), (MAX_TTL, Scope::Public));
    }

    #[test]
    fn entries_expire() {
        let now = Instant::now();
        let mut cache = TenantCache::new();
        let later = now + Duration::from_secs(1);
        cache.insert(key("a", None), entry(10, later), (10, 1000), now);
        assert!(cache.get(&key("a", None), now).0.is_some());
        // Another subject's key is another entry.
        assert!(cache.get(&key("a", Some("token:x")), now).0.is_none());
        assert_eq!(cache.get(&key("a", None), later), (None, true));
        assert_eq!((cache.lru.len(), cache.bytes), (0, 0));
    }

    #[test]
    fn least_recently_used_go_first_within_entries_and_bytes() {
        let now = Instant::now();
        let fresh = now + Duration::from_secs(60);
        let mut cache = TenantCache::new();
        for name in ["a", "b", "c"] {
            cache.insert(key(name, None), entry(10, fresh), (3, 1000), now);
        }
        // `a` used: `b` is the least recently used.
        assert!(cache.get(&key("a", None), now).0.is_some());
        let dropped = cache.insert(key("d", None), entry(10, fresh), (3, 1000), now);
        assert_eq!(dropped, (0, 1));
        assert!(cache.get(&key("b", None), now).0.is_none());
        assert_eq!(cache.lru.len(), 3);
        // Bytes: 25 more need two entries gone (c, then a).
        let dropped = cache.insert(key("e", None), entry(25, fresh), (10, 40), now);
        assert_eq!(dropped, (0, 2));
        assert_eq!(cache.bytes, 35);
        assert!(cache.get(&key("d", None), now).0.is_some());
        // Replacing a key does not count it twice.
        cache.insert(key("e", None), entry(5, fresh), (10, 40), now);
        assert_eq!((cache.lru.len(), cache.bytes), (2, 15));
    }
}
