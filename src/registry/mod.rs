//! The per-tenant registry: for each tenant, one upstream session per
//! configured server and the catalog snapshot built from them.
//!
//! Nothing is shared between tenants: two tenants naming the same command or
//! URL get two sessions. Each tenant's catalog is published on a `watch`
//! channel, so readers take the current snapshot without locking and callers
//! can wait for servers that are still connecting.
//!
//! The registry is replaced as a whole on a configuration reload
//! ([`Registry::apply`]): a server whose configuration is unchanged keeps
//! its slot and session; added or changed servers get new sessions;
//! removed or replaced sessions close once the calls running on them end.

pub mod approvals;
mod events;
pub mod follow;
pub mod limits;
mod oauth;
pub mod reload;
mod slot;
mod store;
mod supervisor;
mod tenant;
pub mod tenants_dir;
mod users;
mod watches;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use events::SessionEvents;
pub use oauth::OAuthContext;
pub use slot::CONSENT_URL_REUSE;
pub use tenant::{Busy, ConsentState, Resolved, SessionUnavailable, Tenant, Unresolved};

pub use watches::WatchPermit;

use slot::Slot;
use store::StoredTenants;
use tenant::Publication;

use crate::callers::TokenTable;
use crate::config::{Config, ConnectMode, Environment};
use crate::credentials::{Redactor, SharedRedactor};
use crate::telemetry::Metrics;

/// How long a retired session may keep serving calls that started on it
/// before it is closed anyway.
const RETIRE_BOUND: Duration = Duration::from_secs(600);

/// One configuration's tenants and their tokens.
#[derive(Debug)]
struct Generation {
    tenants: Vec<Arc<Tenant>>,
    tokens: TokenTable,
    /// The JWT issuers (`callers.jwt`), their key caches kept across
    /// reloads that leave an issuer's keys' source unchanged.
    jwt: crate::callers::JwtCallers,
    /// The certificate callers (`callers.mtls`).
    mtls: crate::callers::CertCallers,
    /// Tenant name → index in `tenants`, for JWT and certificate callers
    /// (empty without).
    by_name: HashMap<String, usize>,
}

impl Generation {
    /// Whether callers name their tenant (JWT or certificate callers are
    /// configured), rather than only select it by a static token.
    fn callers_name_tenants(&self) -> bool {
        !self.jwt.is_empty() || !self.mtls.is_empty()
    }
}

/// What a reload changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Tenants added, by name.
    pub tenants_added: Vec<String>,
    /// Tenants removed, by name.
    pub tenants_removed: Vec<String>,
    /// Servers (`tenant/server`) that got a new session.
    pub servers_started: Vec<String>,
    /// Servers whose session was kept.
    pub servers_kept: Vec<String>,
    /// Servers whose session is closed (removed or changed).
    pub servers_retired: Vec<String>,
}

/// How often idle lazy tenants are looked for.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// The shortest time between two passes of the reaper that activations
/// start: under a stream of lazy connects (more active tenants than
/// `sessions.max_live`), one pass per activation over every configured
/// tenant took a fifth to a third of the gateway's CPU; activations within
/// this time share one pass, so the cap holds within it.
const REAP_COALESCE: Duration = Duration::from_millis(50);

/// Starts supervisors for slots, with what they need.
#[derive(Debug)]
pub(crate) struct Spawner {
    env: Arc<dyn Environment>,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    max_result_bytes: AtomicUsize,
    /// The current configuration's credential redactor.
    redactor: SharedRedactor,
    started: Instant,
    /// Woken when a lazy tenant connects, so the session cap is enforced.
    activated: Notify,
    /// The state store and consent listener, when OAuth servers exist.
    oauth: Option<OAuthContext>,
    /// The approved definitions in force (servers with `definitions:
    /// approved` serve only these).
    approvals: ArcSwap<crate::approvals::Approvals>,
    /// The guards of the configuration in force (`guards:`): the tenants
    /// built from it take their chains from these.
    guards: ArcSwap<crate::guards::Guards>,
    /// Who hears of sessions established and servers retired.
    /// (Shared with the supervisors, which start before it is set.)
    events: Arc<std::sync::OnceLock<Arc<dyn SessionEvents>>>,
}

impl Spawner {
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn supervise(
        &self,
        tenant: &str,
        slot: Arc<Slot>,
        stop: CancellationToken,
        redactor: &SharedRedactor,
    ) {
        self.tasks.spawn(
            supervisor::Supervisor {
                env: self.env.clone(),
                metrics: self.metrics.clone(),
                max_result_bytes: self.max_result_bytes.load(Ordering::Relaxed),
                redactor: redactor.clone(),
                oauth: self.oauth.clone(),
                events: self.events.clone(),
                tenant: tenant.to_owned(),
                slot,
                stop,
            }
            .run(),
        );
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(crate) fn env(&self) -> &dyn Environment {
        self.env.as_ref()
    }

    pub(crate) fn max_result_bytes(&self) -> usize {
        self.max_result_bytes.load(Ordering::Relaxed)
    }

    /// The guards of the configuration in force.
    pub(crate) fn guards(&self) -> Arc<crate::guards::Guards> {
        self.guards.load_full()
    }

    pub(crate) fn redactor(&self) -> &SharedRedactor {
        &self.redactor
    }

    pub(crate) fn oauth(&self) -> Option<&OAuthContext> {
        self.oauth.as_ref()
    }

    pub(crate) fn activated(&self) {
        self.activated.notify_one();
    }

    pub(crate) fn approvals(&self) -> arc_swap::Guard<Arc<crate::approvals::Approvals>> {
        self.approvals.load()
    }
}

/// Every tenant of the gateway.
#[derive(Debug)]
pub struct Registry {
    /// The current generation: read without locking by every call.
    generation: ArcSwap<Generation>,
    /// Serialises [`Registry::apply`]: one reload at a time.
    applying: Mutex<()>,
    spawner: Arc<Spawner>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Slots retired by reloads whose sessions are still closing; each is
    /// dropped once its session has closed.
    retired: Mutex<Vec<Arc<Slot>>>,
    /// `sessions.max_live`, 0 for no cap.
    max_live: AtomicUsize,
    /// The configured approvals file (`approvals.file`), if any.
    approvals_file: Mutex<Option<std::path::PathBuf>>,
    /// Woken when a reload names another approvals file.
    approvals_file_moved: Notify,
    /// Counts the configurations applied: watchers of it (long-lived
    /// streams) re-check their callers at each.
    applied: tokio::sync::watch::Sender<u64>,
    /// The state store's tenants, once served ([`Registry::serve_store_tenants`]).
    store: std::sync::OnceLock<StoredTenants>,
    /// The configuration in force without its tenants, when `tenant_store`
    /// is configured: what store tenants are validated against.
    config: arc_swap::ArcSwapOption<Config>,
    /// Woken when a configuration is applied: the follower validates the
    /// loaded store tenants again.
    config_changed: Notify,
}

/// Callers authenticate against the current generation, then the tenants
/// of the state store (loaded on first use).
impl crate::callers::Directory for Arc<Registry> {
    type Tenant = Arc<Tenant>;

    async fn by_token(
        &self,
        token: &str,
    ) -> Result<Option<(Arc<Tenant>, crate::callers::Caller)>, crate::callers::CallerError> {
        if let Some(found) = self.authenticate(token) {
            return Ok(Some(found));
        }
        let Some(store) = self.store.get() else {
            return Ok(None);
        };
        let digest = crate::callers::TokenDigest::of(token);
        Ok(store
            .by_token(self, &digest)
            .await?
            .map(|(tenant, index)| (tenant, crate::callers::Caller::static_token(index))))
    }

    fn by_token_digest(&self, digest: &crate::callers::TokenDigest) -> Option<Arc<Tenant>> {
        let generation = self.generation.load();
        if let Some((tenant, _)) = generation.tokens.tenant_for_digest(digest) {
            return generation.tenants.get(tenant).cloned();
        }
        self.loaded_by_digest(digest).map(|(tenant, _)| tenant)
    }

    fn jwt_callers(&self) -> crate::callers::JwtCallers {
        Registry::jwt_callers(self)
    }

    fn cert_callers(&self) -> crate::callers::CertCallers {
        self.generation.load().mtls.clone()
    }

    fn tenant_name<'t>(&self, tenant: &'t Arc<Tenant>) -> &'t str {
        &tenant.name
    }

    async fn tenant_named(
        &self,
        name: &str,
    ) -> Result<Option<Arc<Tenant>>, crate::callers::CallerError> {
        if let Some(tenant) = Registry::tenant_named(self, name) {
            return Ok(Some(tenant));
        }
        if !self.generation.load().callers_name_tenants() {
            return Ok(None);
        }
        match self.store.get() {
            Some(store) => store.tenant_named(self, name).await,
            None => Ok(None),
        }
    }

    fn loaded_tenant_named(&self, name: &str) -> Option<Arc<Tenant>> {
        Registry::tenant_named(self, name)
    }
}

impl Registry {
    /// Builds the registry and starts connecting every server of every
    /// tenant in the background (no OAuth servers: see
    /// [`Registry::start_with_oauth`]).
    pub fn start(
        config: &Config,
        env: Arc<dyn Environment>,
        metrics: Arc<Metrics>,
    ) -> Arc<Registry> {
        Self::start_with_oauth(config, env, metrics, None)
    }

    /// [`Registry::start`] with the state store and consent listener that
    /// OAuth servers use.
    pub fn start_with_oauth(
        config: &Config,
        env: Arc<dyn Environment>,
        metrics: Arc<Metrics>,
        oauth: Option<OAuthContext>,
    ) -> Arc<Registry> {
        Self::start_with_approvals(
            config,
            env,
            metrics,
            oauth,
            crate::approvals::Approvals::new(),
        )
    }

    /// [`Registry::start_with_oauth`] with the approved definitions in
    /// force from the start (see [`Registry::set_approvals`]).
    pub fn start_with_approvals(
        config: &Config,
        env: Arc<dyn Environment>,
        metrics: Arc<Metrics>,
        oauth: Option<OAuthContext>,
        approvals: crate::approvals::Approvals,
    ) -> Arc<Registry> {
        // (`apply` is also what a reload calls.)
        let tasks = TaskTracker::new();
        let registry = Arc::new(Registry {
            generation: ArcSwap::from_pointee(Generation {
                tenants: Vec::new(),
                tokens: TokenTable::default(),
                jwt: crate::callers::JwtCallers::default(),
                mtls: crate::callers::CertCallers::default(),
                by_name: HashMap::new(),
            }),
            applying: Mutex::new(()),
            spawner: Arc::new(Spawner {
                env,
                metrics: metrics.clone(),
                tasks: tasks.clone(),
                max_result_bytes: AtomicUsize::new(config.limits.max_result_bytes),
                redactor: Redactor::for_config(config).shared(),
                started: Instant::now(),
                activated: Notify::new(),
                oauth,
                approvals: ArcSwap::from_pointee(approvals),
                guards: ArcSwap::from_pointee(crate::guards::Guards::default()),
                events: Arc::default(),
            }),
            metrics,
            shutdown: CancellationToken::new(),
            tasks,
            retired: Mutex::default(),
            max_live: AtomicUsize::new(0),
            approvals_file: Mutex::default(),
            approvals_file_moved: Notify::new(),
            applied: tokio::sync::watch::Sender::new(0),
            store: std::sync::OnceLock::new(),
            config: arc_swap::ArcSwapOption::empty(),
            config_changed: Notify::new(),
        });
        registry.apply(config);
        registry.tasks.spawn(reap(registry.clone()));
        registry
    }

    fn current(&self) -> Arc<Generation> {
        self.generation.load_full()
    }

    /// Serves the tenants of the state store (`tenant_store` is
    /// configured): they are loaded on first use. Called once, before
    /// serving; later calls change nothing.
    pub fn serve_store_tenants(&self, state: crate::state::StateStore) {
        let _ = self.store.set(StoredTenants::new(state));
    }

    /// The state store's tenants, when served.
    pub(super) fn store_tenants(&self) -> Option<&StoredTenants> {
        self.store.get()
    }

    /// A loaded store tenant a token with this digest selects, and the
    /// token's index.
    fn loaded_by_digest(
        &self,
        digest: &crate::callers::TokenDigest,
    ) -> Option<(Arc<Tenant>, usize)> {
        self.store.get()?.by_digest(digest, self.spawner.now_ms())
    }

    /// The loaded store tenant named `name`.
    fn loaded_named(&self, name: &str) -> Option<Arc<Tenant>> {
        self.store.get()?.named(name, self.spawner.now_ms())
    }

    /// The tenant a bearer token selects, and the caller it proves (among
    /// the configuration's tenants and the store tenants loaded now).
    pub fn authenticate(&self, token: &str) -> Option<(Arc<Tenant>, crate::callers::Caller)> {
        let generation = self.generation.load();
        let Some((tenant, token_index)) = generation.tokens.tenant_for(token) else {
            let (tenant, token_index) =
                self.loaded_by_digest(&crate::callers::TokenDigest::of(token))?;
            return Some((tenant, crate::callers::Caller::static_token(token_index)));
        };
        let tenant = generation.tenants.get(tenant).cloned()?;
        Some((tenant, crate::callers::Caller::static_token(token_index)))
    }

    /// The tenant one of whose approver tokens (`call_approvals`) `token`
    /// is, and the token's name: among the configuration's tenants and the
    /// store tenants loaded now. An approver token reaches only the
    /// CallApprovalsService.
    pub fn approver(&self, token: &str) -> Option<(Arc<Tenant>, String)> {
        let digest = crate::callers::TokenDigest::of(token);
        let found = |tenant: &Arc<Tenant>| {
            tenant
                .call_approvals()
                .approver_named_by(&digest)
                .map(|name| (tenant.clone(), name.to_owned()))
        };
        let generation = self.generation.load();
        generation
            .tenants
            .iter()
            .find_map(found)
            .or_else(|| self.store.get()?.loaded().iter().find_map(found))
    }

    /// [`Registry::approver`], and else, with tenants in the state store,
    /// the store tenant whose approver token it is, loaded now.
    ///
    /// # Errors
    /// The token is not known here and the state store cannot be asked.
    pub async fn approver_loading(
        self: &Arc<Self>,
        token: &str,
    ) -> Result<Option<(Arc<Tenant>, String)>, crate::callers::CallerError> {
        if let Some(found) = self.approver(token) {
            return Ok(Some(found));
        }
        let Some(store) = self.store.get() else {
            return Ok(None);
        };
        let digest = crate::callers::TokenDigest::of(token);
        let owner = store
            .state
            .tenant_for_approver_token(&digest)
            .await
            .map_err(|e| crate::callers::CallerError::TenantStoreUnavailable(e.to_string()))?;
        let Some(name) = owner else { return Ok(None) };
        let Some(tenant) = store.tenant_named(self, &name).await? else {
            return Ok(None);
        };
        // The spec loaded decides (the index may lag a write).
        let name = tenant
            .call_approvals()
            .approver_named_by(&digest)
            .map(str::to_owned);
        Ok(name.map(|name| (tenant, name)))
    }

    /// The JWT issuers of the current configuration (`callers.jwt`).
    pub fn jwt_callers(&self) -> crate::callers::JwtCallers {
        self.generation.load().jwt.clone()
    }

    /// The current tenant named `name`, when JWT or certificate callers
    /// are configured (they name their tenant; static tokens select it): one of the
    /// configuration's, or a store tenant loaded now.
    pub fn tenant_named(&self, name: &str) -> Option<Arc<Tenant>> {
        let generation = self.generation.load();
        match generation.by_name.get(name) {
            Some(index) => generation.tenants.get(*index).cloned(),
            None if !generation.callers_name_tenants() => None,
            None => self.loaded_named(name),
        }
    }

    /// Where a tenant named `name` is defined outside the state store (the
    /// file or `tenants_dir`), if anywhere: such a name cannot be written
    /// through the admin API.
    pub fn defined_outside_store(&self, name: &str) -> Option<crate::config::TenantOrigin> {
        self.generation
            .load()
            .tenants
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.origin.clone())
            .filter(|o| !matches!(o, crate::config::TenantOrigin::Store { .. }))
    }

    /// The tenant of the file or `tenants_dir` a static token with this
    /// digest selects, if any: such a token cannot be given to a tenant
    /// of the state store.
    pub fn token_owner_outside_store(
        &self,
        digest: &crate::callers::TokenDigest,
    ) -> Option<(String, crate::config::TenantOrigin)> {
        let generation = self.generation.load();
        let (tenant, _) = generation.tokens.tenant_for_digest(digest)?;
        let tenant = generation.tenants.get(tenant)?;
        Some((tenant.name.clone(), tenant.origin.clone()))
    }

    /// Every tenant, in configuration order.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.current().tenants.clone()
    }

    /// Counts an OAuth event of a server (`toolgate_oauth_events_total`).
    pub fn oauth_event(&self, tenant: &str, server: &str, event: &str) {
        self.metrics.oauth_event(tenant, server, event);
    }

    /// Counts a callback that completed no pending flow
    /// (`toolgate_oauth_callbacks_unmatched_total`).
    pub fn callback_unmatched(&self, outcome: &str) {
        self.metrics.callback_unmatched(outcome);
    }

    /// The state store and consent listener OAuth servers use, if open.
    pub fn oauth(&self) -> Option<&OAuthContext> {
        self.spawner.oauth()
    }

    /// The approved definitions in force.
    pub fn approvals(&self) -> Arc<crate::approvals::Approvals> {
        self.spawner.approvals.load_full()
    }

    /// Puts `approvals` in force: every tenant with a `definitions:
    /// approved` server whose approvals changed publishes a new catalog
    /// (withheld tools appear once approved, and the other way round).
    pub fn set_approvals(&self, approvals: crate::approvals::Approvals) {
        let new = Arc::new(approvals);
        let old = self.spawner.approvals.swap(new.clone());
        for tenant in self.current().tenants.iter() {
            if tenant.servers().any(|s| s.needs_approval())
                && (old.tenant(&tenant.name) != new.tenant(&tenant.name)
                    || old.tenant_prompts(&tenant.name) != new.tenant_prompts(&tenant.name)
                    || old.tenant_skills(&tenant.name) != new.tenant_skills(&tenant.name))
            {
                tenant.rebuild();
            }
        }
    }

    /// The configured approvals file (`approvals.file`), if any.
    pub fn approvals_file(&self) -> Option<std::path::PathBuf> {
        self.approvals_file
            .lock()
            .expect("approvals file lock")
            .clone()
    }

    /// Resolves when a configuration reload names another approvals file.
    pub async fn approvals_file_changed(&self) {
        self.approvals_file_moved.notified().await;
    }

    /// Slots retired by reloads whose sessions have not closed yet (they
    /// close once the calls running on them end).
    pub fn retiring(&self) -> usize {
        self.retired.lock().expect("retired lock").len()
    }

    /// Switches to `config`: unchanged servers keep their sessions, added
    /// and changed ones connect, removed and changed ones close once idle.
    /// The new generation is built first and swapped in at once: callers
    /// authenticating meanwhile never wait for the build.
    pub fn apply(self: &Arc<Self>, config: &Config) -> ReloadSummary {
        let _applying = self.applying.lock().expect("apply lock");
        let mut summary = ReloadSummary::default();
        self.spawner
            .max_result_bytes
            .store(config.limits.max_result_bytes, Ordering::Relaxed);
        self.spawner
            .redactor
            .store(Arc::new(Redactor::for_config(config)));
        // Tenants of other sources redact the new configuration's
        // credentials with their own (the ones built below already do).
        for tenant in self.current().tenants.iter().chain(
            self.store
                .get()
                .map(StoredTenants::tenants)
                .unwrap_or_default()
                .iter(),
        ) {
            tenant.refresh_redactor();
        }
        self.max_live
            .store(config.max_live_sessions.unwrap_or(0), Ordering::Relaxed);
        // The tenants built below (and store tenants built later) take
        // their chains from this generation's guards; calls in flight keep
        // the chains of the tenant object they started with.
        self.spawner
            .guards
            .store(Arc::new(crate::guards::Guards::new(&config.guards)));
        {
            let file = config.approvals.as_ref().map(|a| a.file.clone());
            let mut current = self.approvals_file.lock().expect("approvals file lock");
            if *current != file {
                *current = file;
                self.approvals_file_moved.notify_one();
            }
        }
        if config.tenant_store.is_some() {
            let mut kept = config.clone();
            kept.tenants = Vec::new();
            self.config.store(Some(Arc::new(kept)));
            self.config_changed.notify_one();
        }
        let old = self.current();
        let old_by_name: HashMap<&str, &Arc<Tenant>> =
            old.tenants.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut kept: HashSet<*const Slot> = HashSet::new();
        let mut tenants = Vec::with_capacity(config.tenants.len());
        for tenant_config in &config.tenants {
            let previous = old_by_name.get(tenant_config.name.as_str()).copied();
            if previous.is_none() && !old.tenants.is_empty() {
                summary.tenants_added.push(tenant_config.name.clone());
            }
            tenants.push(self.build_tenant(
                tenant_config,
                previous,
                &config.limits,
                &mut kept,
                &mut summary,
            ));
        }
        let new_names: HashSet<&str> = config.tenants.iter().map(|t| t.name.as_str()).collect();
        for tenant in &old.tenants {
            let removed = !new_names.contains(tenant.name.as_str());
            if removed {
                summary.tenants_removed.push(tenant.name.clone());
            }
            self.retire_tenant(tenant, &kept, removed, &mut summary);
        }
        let jwt = crate::callers::JwtCallers::new(&config.callers, Some(&old.jwt));
        let mtls = crate::callers::CertCallers::new(&config.callers);
        let by_name = if jwt.is_empty() && mtls.is_empty() {
            HashMap::new()
        } else {
            tenants
                .iter()
                .enumerate()
                .map(|(index, t)| (t.name.clone(), index))
                .collect()
        };
        self.generation.store(Arc::new(Generation {
            tokens: TokenTable::new(config),
            tenants,
            jwt,
            mtls,
            by_name,
        }));
        self.metrics.tenants().set_tenants(
            "file",
            config
                .tenants
                .iter()
                .filter(|t| t.origin == crate::config::TenantOrigin::File)
                .count(),
        );
        // After the swap: a watcher woken now re-checks against it.
        self.applied.send_modify(|n| *n += 1);
        summary
    }

    /// The object of tenant `tenant_config` for a new generation (of the
    /// configuration, or of one tenant of the state store): the servers of
    /// `previous` whose configuration is unchanged (same fingerprint) keep
    /// their slot and session (each added to `kept`), the others get a new
    /// slot; the catalog history, limiter and usage carry over from
    /// `previous`. Eager tenants, and lazy ones in use, connect their new
    /// servers now.
    fn build_tenant(
        &self,
        tenant_config: &crate::config::TenantConfig,
        previous: Option<&Arc<Tenant>>,
        limits: &crate::config::Limits,
        kept: &mut HashSet<*const Slot>,
        summary: &mut ReloadSummary,
    ) -> Arc<Tenant> {
        let mut slots = Vec::with_capacity(tenant_config.servers.len());
        for server in &tenant_config.servers {
            let label = format!("{}/{}", tenant_config.name, server.name);
            // Fingerprints only where there is a slot to compare with
            // (not at start: 10,000 tenants would hash for nothing).
            let reusable = previous.and_then(|t| {
                t.slots.iter().find(|s| {
                    s.config.name == server.name && s.fingerprint() == server.fingerprint()
                })
            });
            match reusable {
                Some(slot) => {
                    kept.insert(Arc::as_ptr(slot));
                    slots.push(slot.clone());
                    summary.servers_kept.push(label);
                }
                None => {
                    let oauth = oauth::client_for(
                        &tenant_config.name,
                        server,
                        self.spawner.oauth(),
                        &self.metrics,
                    );
                    if let Err(reason) = &oauth {
                        tracing::error!(tenant = %tenant_config.name, server = %server.name, %reason, "OAuth client not available");
                    }
                    let slot = Arc::new(Slot::new(
                        server.clone(),
                        self.shutdown.child_token(),
                        oauth,
                    ));
                    slots.push(slot);
                    summary.servers_started.push(label);
                }
            }
        }
        // A tenant that connects now (eager, or lazy and in use) shows
        // its new servers as connecting from its first catalog on: a call
        // arriving in between waits for them instead of finding neither
        // the tool nor a server that may bring it.
        let connect_now =
            tenant_config.connect == ConnectMode::Eager || previous.is_some_and(|t| t.is_active());
        if connect_now {
            for slot in &slots {
                slot.expect_connect();
            }
        }
        let publication = previous
            .map(|t| t.publication().clone())
            .unwrap_or_else(|| Publication::new(self.spawner.now_ms()));
        let tenant = Tenant::new(
            tenant_config,
            slots,
            limits.clone(),
            publication,
            previous.map(|t| t.as_ref()),
            self.spawner.clone(),
        );
        if connect_now || tenant.is_active() {
            // Eager tenants connect now; a lazy tenant in use connects
            // its added or changed servers now too.
            tenant.connect_all();
        }
        tenant
    }

    /// Retires the slots of `old` (a tenant object being replaced or
    /// removed) that the new generation did not keep: their sessions close
    /// once the calls running on them end. A `removed` tenant's watchers
    /// end too.
    fn retire_tenant(
        self: &Arc<Self>,
        old: &Tenant,
        kept: &HashSet<*const Slot>,
        removed: bool,
        summary: &mut ReloadSummary,
    ) {
        if removed {
            old.publication().removed.cancel();
        }
        for slot in &old.slots {
            if !kept.contains(&Arc::as_ptr(slot)) {
                summary
                    .servers_retired
                    .push(format!("{}/{}", old.name, slot.config.name));
                self.metrics.session_closed(&old.name, &slot.config.name);
                if let Some(events) = self.spawner.events() {
                    events.retired(&old.name, &slot.config.name);
                }
                self.retire(slot.clone());
            }
        }
    }

    /// The configuration in force (without its tenants), when
    /// `tenant_store` is configured: the last one applied.
    pub fn store_config(&self) -> Option<Arc<Config>> {
        self.config.load_full()
    }

    /// A receiver that changes at every configuration applied from now on
    /// (a reload): long-lived streams re-check their callers then.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Stops a slot's supervisor and closes its session once no call runs
    /// on it (bounded by [`RETIRE_BOUND`]).
    fn retire(self: &Arc<Self>, slot: Arc<Slot>) {
        slot.stop.cancel();
        self.retired
            .lock()
            .expect("retired lock")
            .push(slot.clone());
        let shutdown = self.shutdown.clone();
        let registry = Arc::downgrade(self);
        self.tasks.spawn(async move {
            let mut sessions = slot.users.take_all();
            sessions.extend(slot.take_session());
            let deadline = tokio::time::Instant::now() + RETIRE_BOUND;
            for session in sessions {
                // This task holds one reference; every call in flight
                // holds one more.
                while Arc::strong_count(&session) > 1
                    && tokio::time::Instant::now() < deadline
                    && !shutdown.is_cancelled()
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                session.close().await;
            }
            // Closed: the slot (its tool list, its secrets) goes now.
            if let Some(registry) = registry.upgrade() {
                registry
                    .retired
                    .lock()
                    .expect("retired lock")
                    .retain(|s| !Arc::ptr_eq(s, &slot));
            }
        });
    }

    /// Stops connecting and closes every session (each bounded by
    /// [`crate::upstream::CLOSE_TIMEOUT`]), all in parallel.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let mut slots: Vec<Arc<Slot>> = self
            .current()
            .tenants
            .iter()
            .flat_map(|t| t.slots.iter().cloned())
            .collect();
        let store_slots = self
            .store
            .get()
            .map(StoredTenants::slots)
            .unwrap_or_default();
        slots.extend(store_slots.iter().map(|(_, slot)| slot.clone()));
        slots.extend(self.retired.lock().expect("retired lock").drain(..));
        let closing = slots
            .into_iter()
            .flat_map(|slot| {
                let mut sessions = slot.users.take_all();
                sessions.extend(slot.session());
                sessions
            })
            .map(|session| async move { session.close().await });
        futures::future::join_all(closing).await;
        for tenant in self.current().tenants.iter() {
            for server in tenant.servers() {
                self.metrics.session_closed(&tenant.name, &server.name);
            }
        }
        for (tenant, slot) in &store_slots {
            self.metrics.session_closed(tenant, &slot.config.name);
        }
    }
}

/// Closes lazy tenants' sessions after `idle_timeout` without use, and the
/// least recently used ones while more than `sessions.max_live` are live.
/// Tenants with calls in flight are never touched.
async fn reap(registry: Arc<Registry>) {
    loop {
        tokio::select! {
            () = registry.shutdown.cancelled() => return,
            () = tokio::time::sleep(REAP_INTERVAL) => {}
            () = registry.spawner.activated.notified() => {
                // Activations arriving meanwhile are served by this pass.
                tokio::select! {
                    () = registry.shutdown.cancelled() => return,
                    () = tokio::time::sleep(REAP_COALESCE) => {}
                }
            }
        }
        reap_once(&registry);
        if let Some(store) = registry.store.get() {
            store.evict_idle(&registry);
        }
    }
}

/// One pass of [`reap`]. Only active tenants hold sessions (a tenant's
/// per-user sessions go with its slots' activation), so the others are
/// passed over after one look.
fn reap_once(registry: &Registry) {
    let now = registry.spawner.now_ms();
    let generation = registry.current();
    let active: Vec<&Arc<Tenant>> = generation
        .tenants
        .iter()
        .filter(|t| t.is_active())
        .collect();
    for tenant in &active {
        let closed = tenant.close_idle_user_sessions(now);
        if closed > 0 {
            tracing::info!(tenant = %tenant.name, closed, "closed idle per-user sessions");
        }
    }
    let mut lazy: Vec<&Arc<Tenant>> = active
        .iter()
        .copied()
        .filter(|t| t.connect == ConnectMode::Lazy && t.calls_in_flight() == 0)
        .collect();
    for tenant in &lazy {
        let last_used = tenant.last_used();
        let idle_ms = now.saturating_sub(last_used);
        if Duration::from_millis(idle_ms) >= tenant.idle_timeout
            && tenant.deactivate_if_unused(last_used)
        {
            tracing::info!(tenant = %tenant.name, "closed the sessions of an idle tenant");
        }
    }
    let cap = registry.max_live.load(Ordering::Relaxed);
    if cap == 0 {
        return;
    }
    let mut live: usize = active.iter().map(|t| t.live_sessions()).sum();
    lazy.retain(|t| t.is_active());
    for tenant in least_recently_used_first(lazy, |t| t.last_used()) {
        if live <= cap {
            break;
        }
        let sessions = tenant.live_sessions();
        if tenant.deactivate_if_unused(tenant.last_used()) {
            tracing::info!(tenant = %tenant.name, live, cap, "closed the least recently used tenant's sessions");
            live = live.saturating_sub(sessions);
        }
    }
}

/// `items` ordered by `last_used`, oldest first, reading each item's
/// `last_used` once. It changes while calls arrive; a sort that read it at
/// every comparison would not see a total order, and the standard sort
/// panics on that, which ended the reaper (and with it `max_live` and the
/// idle timeout) under load.
fn least_recently_used_first<T>(items: Vec<T>, last_used: impl Fn(&T) -> u64) -> Vec<T> {
    let mut keyed: Vec<(u64, T)> = items.into_iter().map(|t| (last_used(&t), t)).collect();
    keyed.sort_by_key(|(used, _)| *used);
    keyed.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod lru_tests {
    use std::cell::Cell;

    use super::least_recently_used_first;

    #[test]
    fn reads_each_last_used_once_while_it_changes() {
        // Every read of a tenant's `last_used` returns a later time, as
        // when calls keep arriving during the sort.
        let reads = Cell::new(0u64);
        let items: Vec<u64> = (0..1000).map(|i| (i * 7919) % 1000).collect();
        let ordered = least_recently_used_first(items, |&base| {
            reads.set(reads.get() + 1);
            base * 1_000_000 + reads.get()
        });
        assert_eq!(reads.get(), 1000, "last_used read more than once per item");
        assert!(ordered.windows(2).all(|w| w[0] <= w[1]), "not oldest first");
        assert_eq!(ordered.len(), 1000);
    }
}
