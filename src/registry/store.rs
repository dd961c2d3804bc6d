//! `StoredTenants`: the tenants of the state store in the registry, loaded
//! on first use, kept in a bounded cache, evicted when idle, loaded again
//! when they change. The registry holds it and hands it itself where a
//! tenant object is built or retired.
//!
//! Nothing is read at start: a caller's unknown static token is looked up
//! by digest (`tenant_for_token`), a JWT naming an unknown tenant by name
//! (`get_tenant`). A load reads the spec and the stored secrets it names,
//! validates it against the current configuration like a file tenant
//! (`Config::validate_tenant` with `SpecSource::Store`) and builds the
//! tenant as a reload does ([`Registry::build_tenant`]). Loads of one name
//! share one flight; tokens found nowhere are remembered (a bounded
//! negative cache, forgotten at every change the follower sees, so a new
//! tenant's token works at once).
//!
//! At most `tenant_store.max_loaded` tenants are loaded: an idle one (no
//! call in flight, no stream open on it, unused for its `idle_timeout`) is
//! unloaded, and the least recently used idle one makes room for a new
//! one. An unloaded
//! tenant's sessions close; its next caller loads it again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::{Registry, ReloadSummary, Slot, Tenant};
use crate::callers::{CallerError, TokenDigest};
use crate::config::{SpecSource, TenantSpec};
use crate::state::{StateError, StateStore};
use crate::telemetry::metrics::LoadOutcome;

/// Most unknown token digests remembered; past it the set starts over.
const MAX_UNKNOWN: usize = 10_000;

/// The state store's tenants loaded now, and what loads them.
pub(crate) struct StoredTenants {
    pub(super) state: StateStore,
    loaded: RwLock<Loaded>,
    /// Digests of tokens the store did not know (bounded).
    unknown: Mutex<HashSet<[u8; 32]>>,
    /// One lock per tenant name being loaded: loads, reloads and removals
    /// of one tenant run one at a time.
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for StoredTenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredTenants")
            .field("loaded", &self.read().tenants.len())
            .finish_non_exhaustive()
    }
}

/// The loaded tenants and their tokens.
#[derive(Default)]
struct Loaded {
    tenants: HashMap<String, Entry>,
    /// Token digest → tenant name and the token's index in its `tokens`.
    tokens: HashMap<[u8; 32], (String, usize)>,
}

/// One loaded tenant.
struct Entry {
    tenant: Arc<Tenant>,
    /// The stored version loaded.
    version: i64,
    /// Digests of its tokens.
    digests: Vec<[u8; 32]>,
    /// When a caller last named it, in ms since the registry started.
    used: AtomicU64,
}

/// What a load should do with a tenant already loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refresh {
    /// First use: a loaded tenant is taken as it is.
    IfAbsent,
    /// A change was seen: load it again if loaded (and not yet at
    /// `version`, when given; 0 means deleted).
    Changed {
        /// The version the change wrote, if known.
        version: Option<i64>,
    },
    /// Validate it again even at the same version (the configuration
    /// changed).
    Revalidate,
}

/// What a refresh found.
#[derive(Debug)]
pub(super) enum Found {
    /// The tenant, loaded.
    Tenant(Arc<Tenant>),
    /// No tenant to serve (not stored, not loaded, shadowed, or invalid
    /// on first load).
    Nothing,
}

impl StoredTenants {
    pub(super) fn new(state: StateStore) -> Self {
        Self {
            state,
            loaded: RwLock::default(),
            unknown: Mutex::default(),
            flights: Mutex::default(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        self.loaded.read().expect("store tenants lock")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Loaded> {
        self.loaded.write().expect("store tenants lock")
    }

    /// Forgets every unknown token (a change was seen: one may be a new
    /// tenant's).
    pub(super) fn forget_unknown(&self) {
        self.unknown.lock().expect("unknown lock").clear();
    }

    fn is_unknown(&self, digest: &TokenDigest) -> bool {
        self.unknown
            .lock()
            .expect("unknown lock")
            .contains(digest.as_bytes())
    }

    fn remember_unknown(&self, digest: &TokenDigest) {
        let mut unknown = self.unknown.lock().expect("unknown lock");
        if unknown.len() >= MAX_UNKNOWN {
            unknown.clear();
        }
        unknown.insert(*digest.as_bytes());
    }

    /// The loaded tenants' names and versions.
    pub(super) fn versions(&self) -> Vec<(String, i64)> {
        self.read()
            .tenants
            .iter()
            .map(|(name, entry)| (name.clone(), entry.version))
            .collect()
    }

    /// The loaded version of `name`, if loaded.
    pub(super) fn version(&self, name: &str) -> Option<i64> {
        self.read().tenants.get(name).map(|e| e.version)
    }

    fn flight(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.flights
            .lock()
            .expect("flights lock")
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// Drops the flight lock of `name` when no one else holds it.
    fn land(&self, name: &str, flight: Arc<tokio::sync::Mutex<()>>) {
        let mut flights = self.flights.lock().expect("flights lock");
        // The map's reference and ours.
        if Arc::strong_count(&flight) <= 2 {
            flights.remove(name);
        }
    }

    /// A loaded tenant a token with this digest selects, and the token's
    /// index; marked used at `now_ms`.
    pub(super) fn by_digest(
        &self,
        digest: &TokenDigest,
        now_ms: u64,
    ) -> Option<(Arc<Tenant>, usize)> {
        let loaded = self.read();
        let (name, index) = loaded.tokens.get(digest.as_bytes())?;
        let entry = loaded.tenants.get(name)?;
        entry.used.store(now_ms, Ordering::Relaxed);
        Some((entry.tenant.clone(), *index))
    }

    /// Every loaded tenant.
    pub(super) fn loaded(&self) -> Vec<Arc<Tenant>> {
        self.read()
            .tenants
            .values()
            .map(|entry| entry.tenant.clone())
            .collect()
    }

    /// The loaded tenant named `name`; marked used at `now_ms`.
    pub(super) fn named(&self, name: &str, now_ms: u64) -> Option<Arc<Tenant>> {
        let loaded = self.read();
        let entry = loaded.tenants.get(name)?;
        entry.used.store(now_ms, Ordering::Relaxed);
        Some(entry.tenant.clone())
    }

    /// The tenant a static token selects, loading it on first use.
    ///
    /// # Errors
    /// The store cannot be reached.
    pub(super) async fn by_token(
        &self,
        registry: &Arc<Registry>,
        digest: &TokenDigest,
    ) -> Result<Option<(Arc<Tenant>, usize)>, CallerError> {
        if let Some(found) = self.by_digest(digest, registry.spawner.now_ms()) {
            return Ok(Some(found));
        }
        if self.is_unknown(digest) {
            return Ok(None);
        }
        let owner = match self.state.tenant_for_token(digest).await {
            Ok(owner) => owner,
            Err(error) => {
                registry.metrics.tenants().load(LoadOutcome::Unavailable);
                return Err(unavailable(&error));
            }
        };
        let Some((name, _)) = owner else {
            self.remember_unknown(digest);
            return Ok(None);
        };
        self.refresh(registry, &name, Refresh::IfAbsent)
            .await
            .map_err(|e| unavailable(&e))?;
        // The token index of the version loaded (the spec's tokens decide).
        let found = self.by_digest(digest, registry.spawner.now_ms());
        if found.is_none() {
            // Its tenant is not served (shadowed, or its spec does not
            // validate here): not asked again until something changes.
            self.remember_unknown(digest);
        }
        Ok(found)
    }

    /// The tenant named `name`, loading it on first use.
    ///
    /// # Errors
    /// The store cannot be reached.
    pub(super) async fn tenant_named(
        &self,
        registry: &Arc<Registry>,
        name: &str,
    ) -> Result<Option<Arc<Tenant>>, CallerError> {
        if let Some(tenant) = self.named(name, registry.spawner.now_ms()) {
            return Ok(Some(tenant));
        }
        match self.refresh(registry, name, Refresh::IfAbsent).await {
            Ok(Found::Tenant(tenant)) => Ok(Some(tenant)),
            Ok(Found::Nothing) => Ok(None),
            Err(error) => Err(unavailable(&error)),
        }
    }

    /// Loads tenant `name` from the store, or loads it again, as `how`
    /// says; one flight per name. A change to a loaded tenant applies like
    /// a reload of `registry` (unchanged servers keep their sessions); a
    /// tenant no longer stored is removed (its sessions close, its callers
    /// are refused); a spec that no longer validates is logged and counted,
    /// and the loaded version kept.
    ///
    /// # Errors
    /// The store cannot be reached (the loaded version, if any, is kept).
    pub(super) async fn refresh(
        &self,
        registry: &Arc<Registry>,
        name: &str,
        how: Refresh,
    ) -> Result<Found, StateError> {
        let flight = self.flight(name);
        let result = {
            let _flying = flight.lock().await;
            self.refresh_in_flight(registry, name, how).await
        };
        self.land(name, flight);
        if let Err(error) = &result {
            registry.metrics.tenants().load(LoadOutcome::Unavailable);
            tracing::warn!(tenant = %name, %error, "the tenant store cannot be reached to load a tenant");
        }
        result
    }

    async fn refresh_in_flight(
        &self,
        registry: &Arc<Registry>,
        name: &str,
        how: Refresh,
    ) -> Result<Found, StateError> {
        let loaded = self.version(name);
        match (how, loaded) {
            (Refresh::IfAbsent, Some(_)) => {
                return Ok(self
                    .named(name, registry.spawner.now_ms())
                    .map_or(Found::Nothing, Found::Tenant));
            }
            (Refresh::Changed { .. } | Refresh::Revalidate, None) => return Ok(Found::Nothing),
            (Refresh::Changed { version: Some(v) }, Some(at)) if v != 0 && v <= at => {
                return Ok(self
                    .named(name, registry.spawner.now_ms())
                    .map_or(Found::Nothing, Found::Tenant));
            }
            _ => {}
        }
        let metrics = registry.metrics.tenants();
        if let Some(origin) = registry.defined_outside_store(name) {
            if loaded.is_some() {
                tracing::warn!(tenant = %name, %origin, "a tenant of the state store is shadowed by a tenant defined elsewhere: it is no longer served from the store");
                self.unload(registry, name, true);
            }
            metrics.load(LoadOutcome::NotFound);
            return Ok(Found::Nothing);
        }
        let Some(stored) = self.state.get_tenant(name).await? else {
            if loaded.is_some() {
                tracing::info!(tenant = %name, "a tenant of the state store was deleted: removed");
                self.unload(registry, name, true);
            }
            metrics.load(LoadOutcome::NotFound);
            return Ok(Found::Nothing);
        };
        let Some(config) = registry.store_config() else {
            return Ok(Found::Nothing);
        };
        let validated = match TenantSpec::parse(&stored.spec, Some(name)) {
            Ok(spec) => {
                let references: Vec<String> = spec.stored_references().into_iter().collect();
                let secrets = if references.is_empty() {
                    HashMap::new()
                } else {
                    self.state.secrets(name, &references).await?
                };
                config.validate_tenant(
                    spec,
                    SpecSource::Store {
                        stored: &secrets,
                        version: stored.version,
                    },
                    registry.spawner.env(),
                )
            }
            Err(error) => Err(error),
        };
        let tenant_config = match validated {
            Ok(tenant_config) => tenant_config,
            Err(error) => {
                let paths: Vec<&str> = error.errors.iter().map(|e| e.path.as_str()).collect();
                tracing::error!(
                    tenant = %name,
                    version = stored.version,
                    paths = ?paths,
                    %error,
                    kept = loaded.is_some(),
                    "a tenant of the state store does not validate: it is not loaded (a loaded version is kept)"
                );
                metrics.load(LoadOutcome::Invalid);
                return Ok(self
                    .named(name, registry.spawner.now_ms())
                    .map_or(Found::Nothing, Found::Tenant));
            }
        };
        let previous = self.read().tenants.get(name).map(|e| e.tenant.clone());
        let mut kept = HashSet::new();
        let mut summary = ReloadSummary::default();
        let tenant = registry.build_tenant(
            &tenant_config,
            previous.as_ref(),
            &config.limits,
            &mut kept,
            &mut summary,
        );
        let digests: Vec<[u8; 32]> = tenant_config
            .tokens
            .iter()
            .map(|t| *TokenDigest::of(t.expose()).as_bytes())
            .collect();
        let evicted = {
            let mut loaded = self.write();
            remove_entry(&mut loaded, name);
            for (index, digest) in digests.iter().enumerate() {
                loaded.tokens.insert(*digest, (name.to_owned(), index));
            }
            loaded.tenants.insert(
                name.to_owned(),
                Entry {
                    tenant: tenant.clone(),
                    version: stored.version,
                    digests,
                    used: AtomicU64::new(registry.spawner.now_ms()),
                },
            );
            let max = config
                .tenant_store
                .as_ref()
                .map_or(usize::MAX, |s| s.max_loaded);
            make_room(&mut loaded, max, name)
        };
        if let Some(previous) = &previous {
            registry.retire_tenant(previous, &kept, false, &mut summary);
            tracing::info!(
                tenant = %name,
                version = stored.version,
                started = ?summary.servers_started,
                kept = ?summary.servers_kept,
                retired = ?summary.servers_retired,
                "a tenant of the state store changed: applied"
            );
        } else {
            tracing::debug!(tenant = %name, version = stored.version, "loaded a tenant of the state store");
        }
        self.retire_evicted(registry, evicted);
        metrics.load(LoadOutcome::Ok);
        metrics.set_store_loaded(self.read().tenants.len());
        if previous.is_some() {
            // Long-lived streams re-check their callers.
            registry.applied.send_modify(|n| *n += 1);
        }
        Ok(Found::Tenant(tenant))
    }

    /// Removes loaded tenant `name`: its sessions close; when `removed`
    /// (deleted or shadowed, not merely evicted), its watchers end and
    /// long-lived streams re-check their callers.
    pub(super) fn unload(&self, registry: &Arc<Registry>, name: &str, removed: bool) {
        let entry = remove_entry(&mut self.write(), name);
        if let Some(entry) = entry {
            let mut summary = ReloadSummary::default();
            registry.retire_tenant(&entry.tenant, &HashSet::new(), removed, &mut summary);
            registry
                .metrics
                .tenants()
                .set_store_loaded(self.read().tenants.len());
            if removed {
                registry.applied.send_modify(|n| *n += 1);
            }
        }
    }

    fn retire_evicted(&self, registry: &Arc<Registry>, evicted: Vec<Entry>) {
        if evicted.is_empty() {
            return;
        }
        registry.metrics.tenants().evicted(evicted.len());
        for entry in evicted {
            tracing::info!(tenant = %entry.tenant.name, "unloaded the least recently used tenant of the state store to make room (tenant_store.max_loaded)");
            let mut summary = ReloadSummary::default();
            registry.retire_tenant(&entry.tenant, &HashSet::new(), false, &mut summary);
        }
    }

    /// Unloads store tenants idle for their `idle_timeout` (no call in
    /// flight): the reaper's pass.
    pub(super) fn evict_idle(&self, registry: &Arc<Registry>) {
        let now = registry.spawner.now_ms();
        let idle: Vec<String> = self
            .read()
            .tenants
            .iter()
            .filter(|(_, e)| {
                let used = e.used.load(Ordering::Relaxed).max(e.tenant.last_used());
                !e.tenant.held_elsewhere()
                    && Duration::from_millis(now.saturating_sub(used)) >= e.tenant.idle_timeout
            })
            .map(|(name, _)| name.clone())
            .collect();
        if idle.is_empty() {
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut loaded = self.write();
            for name in &idle {
                // Checked again under the lock: a caller may have come.
                let still_idle = loaded.tenants.get(name).is_some_and(|e| {
                    let used = e.used.load(Ordering::Relaxed).max(e.tenant.last_used());
                    !e.tenant.held_elsewhere()
                        && Duration::from_millis(now.saturating_sub(used)) >= e.tenant.idle_timeout
                });
                if still_idle && let Some(entry) = remove_entry(&mut loaded, name) {
                    evicted.push(entry);
                }
            }
        }
        registry.metrics.tenants().evicted(evicted.len());
        for entry in evicted {
            tracing::info!(tenant = %entry.tenant.name, "unloaded an idle tenant of the state store");
            let mut summary = ReloadSummary::default();
            registry.retire_tenant(&entry.tenant, &HashSet::new(), false, &mut summary);
        }
        registry
            .metrics
            .tenants()
            .set_store_loaded(self.read().tenants.len());
    }

    /// Every loaded tenant.
    pub(super) fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.read()
            .tenants
            .values()
            .map(|e| e.tenant.clone())
            .collect()
    }

    /// Every slot of every loaded tenant (closed at shutdown).
    pub(super) fn slots(&self) -> Vec<(String, Arc<Slot>)> {
        self.read()
            .tenants
            .values()
            .flat_map(|e| {
                e.tenant
                    .slots
                    .iter()
                    .map(|s| (e.tenant.name.clone(), s.clone()))
            })
            .collect()
    }
}

/// Takes `name` and its tokens out of `loaded`.
fn remove_entry(loaded: &mut Loaded, name: &str) -> Option<Entry> {
    let entry = loaded.tenants.remove(name)?;
    for digest in &entry.digests {
        if loaded.tokens.get(digest).is_some_and(|(n, _)| n == name) {
            loaded.tokens.remove(digest);
        }
    }
    Some(entry)
}

/// Takes out the least recently used idle tenants (never `keep`) while more
/// than `max` are loaded.
fn make_room(loaded: &mut Loaded, max: usize, keep: &str) -> Vec<Entry> {
    if loaded.tenants.len() <= max {
        return Vec::new();
    }
    let excess = loaded.tenants.len() - max;
    let candidates: Vec<String> = super::least_recently_used_first(
        loaded
            .tenants
            .iter()
            .filter(|(name, e)| name.as_str() != keep && !e.tenant.held_elsewhere())
            .map(|(name, e)| (name.clone(), e.used.load(Ordering::Relaxed)))
            .collect(),
        |(_, used)| *used,
    )
    .into_iter()
    .take(excess)
    .map(|(name, _)| name)
    .collect();
    candidates
        .iter()
        .filter_map(|name| remove_entry(loaded, name))
        .collect()
}

/// The caller's error for a store that cannot be reached.
fn unavailable(error: &StateError) -> CallerError {
    CallerError::TenantStoreUnavailable(error.to_string())
}
