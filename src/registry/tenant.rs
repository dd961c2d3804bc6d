//! One tenant: its slots, limits and published catalog.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::Spawner;
use super::slot::{Slot, SlotState};
use crate::catalog::{Catalog, InputState, PromptInput, ServerInput, SharedCatalog};
use crate::config::{ConnectMode, Limits, ServerConfig, TenantConfig, TenantLimits};
use crate::registry::limits::{Concurrency, TenantLimiter};
use crate::upstream::Session;

/// Catalog versions remembered per tenant for pinned plans.
const CATALOG_HISTORY: usize = 16;

/// Stamps of tenant objects: each [`Tenant`] gets its own, and every
/// catalog it builds carries it, so a call can tell whether the catalog it
/// read was built from the slots of the tenant it holds.
static STAMPS: AtomicU64 = AtomicU64::new(1);

/// Where a tenant publishes its catalog; kept across configuration
/// reloads, so watchers and pinned plans see one continuous history. One
/// allocation per tenant: a configured tenant that is never used costs
/// little more than its configuration.
#[derive(Debug, Clone)]
pub(super) struct Publication(Arc<Shared>);

/// What a tenant's generations share.
#[derive(Debug)]
pub(super) struct Shared {
    /// The current catalog, read without locking.
    current: ArcSwap<Catalog>,
    /// The sender of every new catalog to watchers, made on the first
    /// subscription (most tenants are never watched). Its lock also
    /// orders a new catalog with a first subscription, so no watcher
    /// misses one.
    watch: Mutex<Option<watch::Sender<SharedCatalog>>>,
    history: Mutex<VecDeque<SharedCatalog>>,
    /// The tenant object that publishes here now (the newest generation's).
    /// Its lock serialises every rebuild of every generation: only the
    /// owner publishes, so a stale generation can never publish after a
    /// newer one.
    owner: Mutex<Weak<Tenant>>,
    /// Cancelled when a reload removes the tenant: watches end.
    pub(super) removed: tokio_util::sync::CancellationToken,
    /// Calls of the tenant running now, across reloads (idle eviction
    /// waits for zero).
    in_flight: AtomicUsize,
    /// `WatchResource` streams of the tenant open now, across reloads
    /// (bounded by `limits.max_watches`; see `registry/watches.rs`).
    pub(super) watches: Arc<AtomicUsize>,
    /// When the tenant was last used, in ms since the registry started
    /// (kept across reloads).
    last_used: AtomicU64,
    /// Held while a lazy tenant is marked used and connected, and while the
    /// reaper closes it: a call that has marked itself busy is never closed
    /// under.
    activity: Mutex<()>,
}

impl std::ops::Deref for Publication {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl Publication {
    pub(super) fn new(now_ms: u64) -> Self {
        Self(Arc::new(Shared {
            current: ArcSwap::from_pointee(Catalog::default()),
            watch: Mutex::new(None),
            history: Mutex::default(),
            owner: Mutex::new(Weak::new()),
            removed: tokio_util::sync::CancellationToken::new(),
            in_flight: AtomicUsize::new(0),
            watches: Arc::default(),
            last_used: AtomicU64::new(now_ms),
            activity: Mutex::new(()),
        }))
    }

    /// Makes `catalog` the current one and sends it to the watchers.
    fn publish(&self, catalog: SharedCatalog) {
        let watch = self.watch.lock().expect("watch lock");
        self.current.store(catalog.clone());
        if let Some(sender) = watch.as_ref() {
            sender.send_replace(catalog);
        }
    }

    /// A receiver of every catalog from the current one on.
    fn subscribe(&self) -> watch::Receiver<SharedCatalog> {
        let mut watch = self.watch.lock().expect("watch lock");
        watch
            .get_or_insert_with(|| watch::channel(self.current.load_full()).0)
            .subscribe()
    }
}

/// One tenant: its servers' slots and its current catalog.
#[derive(Debug)]
pub struct Tenant {
    /// The configured tenant name.
    pub name: String,
    /// Rate and concurrency limits of the tenant's calls (kept across
    /// reloads that leave them unchanged).
    pub limiter: Arc<TenantLimiter>,
    /// The limits the limiter was built from.
    pub(super) limiter_config: TenantLimits,
    pub(super) slots: Vec<Arc<Slot>>,
    limits: Limits,
    publication: Publication,
    /// This tenant object's stamp, carried by every catalog it builds.
    stamp: u64,
    pub(super) connect: ConnectMode,
    pub(super) idle_timeout: Duration,
    spawner: Arc<Spawner>,
    /// The tenant's per-tool policy, compiled with the configuration;
    /// `None` when it has no rules.
    policy: Option<Arc<crate::policy::Policy>>,
    /// How an end user's consent becomes usable (confirmed by the tenant's
    /// application, by default).
    pub consent: crate::config::TenantConsent,
    /// Where the tenant is defined (the file, `tenants_dir`, the state
    /// store).
    pub origin: crate::config::TenantOrigin,
    /// What is redacted from the tenant's upstream text, audit records and
    /// errors: the configuration's redactor itself for a tenant of the
    /// file or `tenants_dir` (which it holds the credentials of); for a
    /// tenant of the state store,
    /// the configuration's credentials and its own (`own`), kept current
    /// by [`Tenant::refresh_redactor`] at every reload.
    redactor: crate::credentials::SharedRedactor,
    /// A tenant of the state store's own credentials.
    own_credentials: Option<Arc<crate::credentials::Redactor>>,
    /// Each server's guards (by server index): the tenant's, then the
    /// server's, from the configuration this object was built from.
    guards: Vec<crate::guards::Chain>,
}

/// Holds a tenant as busy while a call runs.
#[derive(Debug)]
pub struct Busy(Publication);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A call's tenant resolved against the catalog it routes by: the catalog
/// was built from exactly this tenant's slots, so the catalog's server
/// index names the slot of the same server.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The tenant object that built `catalog`.
    pub tenant: Arc<Tenant>,
    /// The catalog snapshot.
    pub catalog: SharedCatalog,
}

/// Why a call's tenant could not be resolved against a current catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// A configuration reload removed the tenant.
    Removed,
    /// Reloads kept replacing the tenant while the call resolved it.
    Unsettled,
}

/// Whether a subject has authorized a per-user server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsentState {
    /// The subject holds a token (or the server is not per-user).
    Authorized,
    /// The subject consents at this URL.
    Required(String),
    /// It cannot be told now (the state store is down, or discovery
    /// failed), for this reason.
    Unavailable(String),
    /// A delegated server (`token_exchange`, `identity_assertion`) this
    /// caller cannot use, for this reason (it presented no JWT, or one of
    /// another issuer): there is nothing to consent to.
    Delegation(String),
}

/// How long an authorization URL made for a `ListTools` view is shown again
/// before a new one is made (its pending flow lives [`PENDING_TTL`]).
///
/// [`PENDING_TTL`]: crate::credentials::oauth::PENDING_TTL
pub const CONSENT_URL_REUSE: Duration = Duration::from_secs(300);

/// Why a server's session could not be had for a call.
#[derive(Debug, Clone)]
pub enum SessionUnavailable {
    /// Still connecting after the caller's wait.
    Connecting,
    /// Not connected, for this reason.
    Down(String),
}

impl Tenant {
    /// A tenant object for `config`, publishing on `publication` (the
    /// previous generation's, when the tenant existed before). Its limiter
    /// is `previous`'s when the limits did not change, so rate buckets and
    /// concurrency permits carry over a reload. From now on only this
    /// object publishes catalogs there.
    pub(super) fn new(
        config: &TenantConfig,
        slots: Vec<Arc<Slot>>,
        limits: Limits,
        publication: Publication,
        previous: Option<&Tenant>,
        spawner: Arc<Spawner>,
    ) -> Arc<Tenant> {
        let limiter = match previous {
            Some(previous) if previous.limiter_config == config.limits => previous.limiter.clone(),
            _ => Arc::new(TenantLimiter::new(&config.name, &config.limits)),
        };
        // A tenant of the state store is not in the configuration the
        // shared redactor is built from (the file's and `tenants_dir`'s
        // tenants are): it adds its own credentials.
        let own_credentials = matches!(config.origin, crate::config::TenantOrigin::Store { .. })
            .then(|| Arc::new(crate::credentials::Redactor::for_tenant(config)));
        let redactor = match &own_credentials {
            None => spawner.redactor().clone(),
            Some(own) => Arc::new(arc_swap::ArcSwap::from_pointee(
                spawner.redactor().load().merged(own),
            )),
        };
        let all_guards = spawner.guards();
        let guards = config
            .servers
            .iter()
            .map(|server| all_guards.chain(&config.guards, &server.guards))
            .collect();
        let tenant = Arc::new(Tenant {
            name: config.name.clone(),
            limiter,
            limiter_config: config.limits.clone(),
            slots,
            limits,
            publication,
            stamp: STAMPS.fetch_add(1, Ordering::Relaxed),
            connect: config.connect,
            idle_timeout: config.idle_timeout,
            spawner,
            policy: config
                .policy
                .as_deref()
                .map(|rules| Arc::new(crate::policy::Policy::new(rules))),
            consent: config.consent.clone(),
            origin: config.origin.clone(),
            redactor,
            own_credentials,
            guards,
        });
        {
            let mut owner = tenant.publication.owner.lock().expect("publication lock");
            *owner = Arc::downgrade(&tenant);
            for slot in &tenant.slots {
                slot.set_owner(&tenant);
            }
            tenant.publish(&owner);
        }
        tenant
    }

    /// The catalog this call routes by, and the tenant object that built
    /// it. A call holds the tenant it authenticated as; when a reload has
    /// replaced that tenant since, the catalog it reads was built by the
    /// newer one, and the call continues with the newer one. A call never
    /// reads a catalog's server index against another generation's slots.
    ///
    /// # Errors
    /// The tenant was removed by a reload, or reloads kept replacing it.
    pub fn resolve(self: &Arc<Self>, catalog: SharedCatalog) -> Result<Resolved, Unresolved> {
        let mut tenant = self.clone();
        let mut catalog = catalog;
        for _ in 0..8 {
            if catalog.stamp() == tenant.stamp {
                return Ok(Resolved { tenant, catalog });
            }
            if self.publication.removed.is_cancelled() {
                return Err(Unresolved::Removed);
            }
            let owner = self
                .publication
                .owner
                .lock()
                .expect("publication lock")
                .upgrade();
            match owner {
                Some(owner) => {
                    catalog = owner.catalog();
                    tenant = owner;
                }
                None => return Err(Unresolved::Removed),
            }
        }
        Err(Unresolved::Unsettled)
    }

    /// The tenant object that replaced this one (a reload, or a change of
    /// a tenant of the state store), if one did and still serves.
    pub fn replacement(&self) -> Option<Arc<Tenant>> {
        let owner = self
            .publication
            .owner
            .lock()
            .expect("publication lock")
            .upgrade()?;
        (owner.stamp != self.stamp && !self.publication.removed.is_cancelled()).then_some(owner)
    }

    /// The tenant's per-tool policy; `None` when it has no rules (every
    /// caller sees and calls every tool).
    pub fn policy(&self) -> Option<&Arc<crate::policy::Policy>> {
        self.policy.as_ref()
    }

    /// This tenant object's stamp (see [`Tenant::resolve`]).
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Marks the tenant used now and connects its servers if it is lazy
    /// and idle. Concurrent first calls share one connect; callers then
    /// wait for the catalog to settle (bounded by their deadline).
    ///
    /// Mark the call busy ([`Tenant::busy`]) first: the reaper never closes
    /// a tenant with calls in flight, and it checks under the same lock.
    pub fn activate(&self) {
        if self.connect == ConnectMode::Eager {
            // Connected when the configuration was applied, never evicted.
            return;
        }
        let _activity = self.publication.activity.lock().expect("activity lock");
        self.publication
            .last_used
            .store(self.spawner.now_ms(), Ordering::Relaxed);
        self.connect_all();
    }

    /// Closes the sessions of a lazy tenant if no call is in flight and it
    /// was not used since `seen_used` (the reaper's check, repeated under
    /// the activity lock so that a call starting meanwhile wins).
    pub(super) fn deactivate_if_unused(&self, seen_used: u64) -> bool {
        let _activity = self.publication.activity.lock().expect("activity lock");
        if self.calls_in_flight() != 0
            || self.publication.last_used.load(Ordering::Relaxed) != seen_used
        {
            return false;
        }
        self.deactivate();
        true
    }

    /// When the tenant was last used, in ms since the registry started.
    pub(super) fn last_used(&self) -> u64 {
        self.publication.last_used.load(Ordering::Relaxed)
    }

    /// Starts a supervisor for every slot without one.
    pub(super) fn connect_all(&self) {
        let mut started = false;
        for slot in &self.slots {
            if let Some(stop) = slot.activate() {
                self.spawner
                    .supervise(&self.name, slot.clone(), stop, &self.redactor);
                started = true;
            }
        }
        if started {
            self.rebuild();
            self.spawner.activated();
        }
    }

    /// Closes the sessions of a lazy tenant (idle, or evicted for room).
    pub(super) fn deactivate(&self) {
        for slot in &self.slots {
            if slot.is_active() {
                slot.deactivate();
                self.spawner
                    .metrics()
                    .session_closed(&self.name, &slot.config.name);
            }
        }
    }

    /// Whether any of the tenant's servers is active.
    pub(super) fn is_active(&self) -> bool {
        self.slots.iter().any(|s| s.is_active())
    }

    /// Active sessions of the tenant (per-user sessions included).
    pub(super) fn live_sessions(&self) -> usize {
        self.slots
            .iter()
            .map(|s| usize::from(s.is_active()) + s.users.live())
            .sum()
    }

    /// Marks a call running until the guard drops.
    pub fn busy(&self) -> Busy {
        self.publication.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.publication.clone())
    }

    /// Calls of the tenant running now.
    pub(super) fn calls_in_flight(&self) -> usize {
        self.publication.in_flight.load(Ordering::Acquire)
    }

    /// Whether anything but the registry holds this tenant: a call in
    /// flight, a stream, or an older object of the same tenant (a stream
    /// that started before a reload). Such a tenant is never unloaded.
    pub(super) fn held_elsewhere(self: &Arc<Self>) -> bool {
        // The registry's reference; the publication's is this object's.
        Arc::strong_count(self) > 1 || Arc::strong_count(&self.publication.0) > 1
    }

    pub(super) fn publication(&self) -> &Publication {
        &self.publication
    }

    /// Builds and publishes a new catalog from the slots' states, if this
    /// tenant object still owns its publication (a tenant replaced by a
    /// reload publishes nothing more).
    pub(super) fn rebuild(&self) {
        let owner = self.publication.owner.lock().expect("publication lock");
        if !std::ptr::eq(owner.as_ptr(), self) {
            return;
        }
        self.publish(&owner);
    }

    /// Builds and publishes; the caller holds the publication lock.
    fn publish(&self, _owner: &Weak<Tenant>) {
        let states: Vec<SlotState> = self.slots.iter().map(|s| s.state()).collect();
        let approvals = self.spawner.approvals();
        let inputs: Vec<ServerInput<'_>> = self
            .slots
            .iter()
            .zip(&states)
            .map(|(slot, state)| ServerInput {
                name: &slot.config.name,
                transport: slot.config.transport.kind(),
                bare: slot.config.bare,
                filter: &slot.config.filter,
                overrides: &slot.config.overrides,
                state: match state {
                    SlotState::Idle => InputState::Idle,
                    SlotState::Connecting => InputState::Connecting,
                    SlotState::Ready { tools, .. } => InputState::Listed(tools),
                    SlotState::Failed { reason, last_tools } => InputState::Failed {
                        reason,
                        last_tools: last_tools.as_deref().map(Vec::as_slice),
                    },
                    SlotState::AuthorizationRequired { reason } => {
                        InputState::AuthorizationRequired(reason)
                    }
                },
                approved: slot
                    .config
                    .needs_approval()
                    .then(|| approvals.server(&self.name, &slot.config.name)),
            })
            .collect();
        // Each listing's part is built once and kept by its slot: only
        // servers whose listing changed are serialised again.
        let catalog = Catalog::build_with(&inputs, |index, input, listed| {
            let build = || Catalog::server_part(index, input, listed, &self.limits);
            let listing = match &states[index] {
                SlotState::Ready { tools, .. } => Some(tools),
                SlotState::Failed {
                    last_tools: Some(tools),
                    ..
                } => Some(tools),
                _ => None,
            };
            match listing {
                Some(listing) if std::ptr::eq(listing.as_slice(), listed) => {
                    self.slots[index].part(listing, index, &self.limits, build)
                }
                _ => build(),
            }
        });
        // Prompts: from connected servers that offer them.
        let prompts: Vec<PromptInput<'_>> = self
            .slots
            .iter()
            .zip(&states)
            .map(|(slot, state)| PromptInput {
                listed: match state {
                    SlotState::Ready {
                        prompts: Some(prompts),
                        ..
                    } => Some(prompts.as_ref()),
                    _ => None,
                },
                approved: slot
                    .config
                    .needs_approval()
                    .then(|| approvals.server_prompts(&self.name, &slot.config.name)),
            })
            .collect();
        let catalog = catalog.with_prompts(&inputs, &prompts, &self.limits);
        let catalog = Arc::new(catalog.with_stamp(self.stamp));
        self.report_withheld(&catalog);
        {
            let mut history = self.history();
            if history
                .back()
                .is_none_or(|c| c.version() != catalog.version())
            {
                if history.len() == CATALOG_HISTORY {
                    history.pop_front();
                }
                history.push_back(catalog.clone());
            }
        }
        self.publication.publish(catalog);
    }

    /// Counts the withheld tools of each `definitions: approved` server
    /// (`toolgate_tools_withheld`) and logs, at WARN, each tool withheld
    /// now that the published catalog did not withhold (with this
    /// definition): once per change, not per rebuild.
    fn report_withheld(&self, catalog: &Catalog) {
        let previous = self.publication.current.load_full();
        for (slot, server) in self.slots.iter().zip(catalog.servers()) {
            if !slot.config.needs_approval() {
                continue;
            }
            self.spawner
                .metrics()
                .tools_withheld(&self.name, &server.name, server.withheld.len());
            for withheld in &server.withheld {
                let known = previous
                    .withheld(&withheld.tool.name)
                    .is_some_and(|(s, w)| {
                        s.name == server.name
                            && w.tool.definition_hash == withheld.tool.definition_hash
                    });
                if known {
                    continue;
                }
                tracing::warn!(
                    tenant = %self.name,
                    server = %server.name,
                    tool = %withheld.tool.name,
                    definition_hash = %withheld.tool.definition_hash,
                    approved_hash = withheld.approved_hash.as_deref().unwrap_or("none"),
                    description = %crate::approvals::excerpt(&withheld.tool.description),
                    "tool withheld: its definition is not approved (run `toolgate approve` after review)"
                );
            }
            for withheld in &server.withheld_prompts {
                let known =
                    previous
                        .withheld_prompt(&withheld.prompt.name)
                        .is_some_and(|(s, w)| {
                            s.name == server.name
                                && w.prompt.definition_hash == withheld.prompt.definition_hash
                        });
                if known {
                    continue;
                }
                tracing::warn!(
                    tenant = %self.name,
                    server = %server.name,
                    prompt = %withheld.prompt.name,
                    definition_hash = %withheld.prompt.definition_hash,
                    approved_hash = withheld.approved_hash.as_deref().unwrap_or("none"),
                    description = %crate::approvals::excerpt(&withheld.prompt.description),
                    "prompt withheld: its definition is not approved (run `toolgate approve` after review)"
                );
            }
        }
    }

    /// The current catalog snapshot.
    pub fn catalog(&self) -> SharedCatalog {
        self.publication.current.load_full()
    }

    /// Resolves when a configuration reload removes this tenant.
    pub async fn removed(&self) {
        self.publication.removed.cancelled().await;
    }

    /// A receiver of every new catalog snapshot.
    pub fn subscribe(&self) -> watch::Receiver<SharedCatalog> {
        self.publication.subscribe()
    }

    /// The remembered catalogs, oldest first (locked while held).
    fn history(&self) -> std::sync::MutexGuard<'_, VecDeque<SharedCatalog>> {
        self.publication.history.lock().expect("history lock")
    }

    /// A recent catalog with this version, if remembered.
    pub fn catalog_with_version(&self, version: &str) -> Option<SharedCatalog> {
        self.history()
            .iter()
            .rev()
            .find(|c| c.version() == version)
            .cloned()
    }

    /// The remembered catalogs (for pinned plans), newest first.
    pub fn recent_catalogs(&self) -> Vec<SharedCatalog> {
        self.history().iter().rev().cloned().collect()
    }

    /// Whether a remembered catalog exposed `name` with this definition
    /// hash.
    pub fn served_definition(&self, name: &str, hash: &str) -> bool {
        self.history()
            .iter()
            .any(|c| c.get(name).is_some_and(|t| t.definition_hash == hash))
    }

    /// The catalog once no server is connecting any more, or the current
    /// one when `wait` runs out first.
    pub async fn settled_catalog(&self, wait: Duration) -> SharedCatalog {
        let mut rx = self.subscribe();
        let settled = tokio::time::timeout(wait, rx.wait_for(|c| !c.is_settling())).await;
        match settled {
            Ok(Ok(catalog)) => catalog.clone(),
            _ => self.catalog(),
        }
    }

    /// Every configured server, in configuration order.
    pub fn servers(&self) -> impl Iterator<Item = &ServerConfig> {
        self.slots.iter().map(|s| &s.config)
    }

    /// The configuration of server `index`.
    pub fn server(&self, index: usize) -> &ServerConfig {
        &self.slots[index].config
    }

    /// Whether server `index` is a delegated one (`token_exchange`,
    /// `identity_assertion`) whose tools nobody could list yet (no subject
    /// has had a token): the session of a JWT caller, opened with
    /// [`Tenant::user_session`], exchanges its JWT and wakes the listing.
    pub fn awaits_delegated_listing(&self, index: usize) -> bool {
        self.slots.get(index).is_some_and(|slot| {
            matches!(slot.state(), SlotState::AuthorizationRequired { .. })
                && matches!(&slot.oauth, Ok(Some(client)) if client.is_delegated())
        })
    }

    /// The catalog once server `index` (woken by a subject's session) has
    /// left `AUTHORIZATION_REQUIRED` and nothing is connecting any more, or
    /// the current one when `wait` runs out first.
    pub async fn catalog_after_listing(&self, index: usize, wait: Duration) -> SharedCatalog {
        let Some(name) = self.slots.get(index).map(|s| s.config.name.clone()) else {
            return self.catalog();
        };
        let mut rx = self.subscribe();
        let listed = |catalog: &SharedCatalog| {
            !catalog.is_settling()
                && catalog.servers().iter().any(|s| {
                    s.name == name
                        && !matches!(
                            s.state,
                            crate::catalog::ServerState::AuthorizationRequired(_)
                        )
                })
        };
        match tokio::time::timeout(wait, rx.wait_for(listed)).await {
            Ok(Ok(catalog)) => catalog.clone(),
            _ => self.catalog(),
        }
    }

    /// The guards asked about calls to server `index` (its chain as this
    /// tenant object was built: a call keeps it for both phases).
    pub fn guards(&self, index: usize) -> crate::guards::Chain {
        self.guards.get(index).cloned().unwrap_or_default()
    }

    /// The concurrency limit of server `index`, if any.
    pub fn server_limit(&self, index: usize) -> Option<&Concurrency> {
        self.slots.get(index).and_then(|s| s.limit.as_ref())
    }

    /// The gateway-wide size limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The tenant's credential redactor: the configuration's, and for a
    /// tenant of `tenants_dir` or the state store its own credentials too.
    pub fn redactor(&self) -> Arc<crate::credentials::Redactor> {
        self.redactor.load_full()
    }

    /// After a reload changed the configuration's redactor: a tenant of
    /// another source takes the new one with its own credentials.
    pub(super) fn refresh_redactor(&self) {
        if let Some(own) = &self.own_credentials {
            self.redactor
                .store(Arc::new(self.spawner.redactor().load().merged(own)));
        }
    }

    /// The live session of server `index`.
    ///
    /// # Errors
    /// The server is not connected.
    pub fn session(&self, index: usize) -> Result<Arc<Session>, SessionUnavailable> {
        let Some(slot) = self.slots.get(index) else {
            return Err(SessionUnavailable::Down("no such server".to_owned()));
        };
        if slot.stop.is_cancelled() {
            return Err(SessionUnavailable::Down(
                "the server was removed or changed by a configuration reload".to_owned(),
            ));
        }
        match slot.state() {
            SlotState::Ready { session, .. } if !session.is_ended() => Ok(session),
            SlotState::Ready { .. } => {
                Err(SessionUnavailable::Down("the session ended".to_owned()))
            }
            SlotState::Connecting | SlotState::Idle => Err(SessionUnavailable::Connecting),
            SlotState::Failed { reason, .. } | SlotState::AuthorizationRequired { reason } => {
                Err(SessionUnavailable::Down(reason))
            }
        }
    }

    /// Whether calls to server `index` run on per-user sessions (an OAuth
    /// `authorization_code` server).
    pub fn is_per_user(&self, index: usize) -> bool {
        self.slots.get(index).is_some_and(|s| s.per_user())
    }

    /// The session of `subject` (possibly the tenant itself) on per-user
    /// server `index`: its own, with its own token, connected on first use.
    /// Sessions, tokens and consent URLs are kept by [`Subject::key`]
    /// (`crate::callers::Subject`), never by the bare id.
    /// A session connected for a subject wakes a server that waits for its
    /// first consent, so its tools get listed.
    ///
    /// # Errors
    /// The subject has not authorized the server (with the URL to consent
    /// at), the state store is down, or the server cannot be reached.
    pub async fn user_session(
        &self,
        index: usize,
        subject: &crate::callers::Subject,
    ) -> Result<Arc<Session>, crate::upstream::UpstreamError> {
        use crate::upstream::UpstreamError;
        let subject = subject.key();
        let slot = self
            .slots
            .get(index)
            .ok_or_else(|| UpstreamError::Handshake("no such server".to_owned()))?;
        if slot.stop.is_cancelled() {
            return Err(UpstreamError::Handshake(
                "the server was removed or changed by a configuration reload".to_owned(),
            ));
        }
        let client = match &slot.oauth {
            Ok(Some(client)) => client.clone(),
            Ok(None) => return Err(UpstreamError::Handshake("not an OAuth server".to_owned())),
            Err(reason) => return Err(UpstreamError::OAuthFailed(reason.clone())),
        };
        let spawner = &self.spawner;
        let label = crate::upstream::Label {
            tenant: self.name.clone(),
            server: slot.config.name.clone(),
        };
        let key = crate::state::TokenKey::new(&self.name, subject, &slot.config.name);
        if client.is_delegated() {
            // Refused before anything is exchanged or sent: only a JWT
            // caller's subject has a token to exchange.
            delegation_admits(&client, &key, &slot.config.name)?;
        }
        // A subject already sent to consent gets the same URL (no new
        // pending flow per call), with or without an open session, until
        // it has a token.
        if let Some(url) = slot.consent_url(subject)
            && client
                .store()
                .load_credentials(&key)
                .await
                .map_err(|e| UpstreamError::StateUnavailable(e.0))?
                .is_none()
        {
            return Err(UpstreamError::AuthorizationRequired { url });
        }
        let connect = async {
            let connected = crate::upstream::connect_with(
                &slot.config,
                &label,
                spawner.env(),
                spawner.max_result_bytes(),
                &self.redactor,
                super::oauth::options_for(&client, key),
            )
            .await
            .inspect_err(|e| {
                if let UpstreamError::AuthorizationRequired { url } = e {
                    slot.remember_consent_url(subject, url);
                }
            })?;
            if matches!(slot.state(), SlotState::AuthorizationRequired { .. }) {
                slot.wake.notify_one();
            }
            Ok(connected.session)
        };
        slot.users.get(subject, spawner.now_ms(), connect).await
    }

    /// Whether `subject` (possibly the tenant itself) has authorized
    /// per-user server `index`, for its `ListTools` view. An authorization
    /// URL is made (a pending flow stored) at most once per subject and
    /// server within [`CONSENT_URL_REUSE`].
    pub async fn consent_state(
        &self,
        index: usize,
        subject: &crate::callers::Subject,
    ) -> ConsentState {
        let subject = subject.key();
        let Some(slot) = self.slots.get(index) else {
            return ConsentState::Unavailable("no such server".to_owned());
        };
        let client = match &slot.oauth {
            Ok(Some(client)) => client.clone(),
            Ok(None) => return ConsentState::Authorized,
            Err(reason) => return ConsentState::Unavailable(reason.clone()),
        };
        let key = crate::state::TokenKey::new(&self.name, subject, &slot.config.name);
        if client.is_delegated() {
            // No consent: a JWT caller's token is exchanged on its call.
            return match delegation_admits(&client, &key, &slot.config.name) {
                Ok(()) => ConsentState::Authorized,
                Err(crate::upstream::UpstreamError::Delegation(error)) => {
                    ConsentState::Delegation(error.reason)
                }
                Err(error) => ConsentState::Unavailable(error.to_string()),
            };
        }
        match client.store().load_credentials(&key).await {
            Ok(Some(_)) => return ConsentState::Authorized,
            Ok(None) => {}
            Err(e) => return ConsentState::Unavailable(e.to_string()),
        }
        if let Some(url) = slot.consent_url(subject) {
            return ConsentState::Required(url);
        }
        match client.authorization_url(&key, None).await {
            Ok(url) => {
                slot.remember_consent_url(subject, &url);
                ConsentState::Required(url)
            }
            Err(e) => ConsentState::Unavailable(e.to_string()),
        }
    }

    /// Keeps the verified JWT a caller of this tenant presented as its
    /// subject's latest, when the tenant has a delegated server
    /// (`token_exchange`, `identity_assertion`): what that server's
    /// sessions exchange. The authentication layer calls it for every
    /// JWT caller.
    pub fn remember_subject_token(
        &self,
        subject: &crate::callers::Subject,
        token: &crate::callers::SubjectToken,
    ) {
        let delegated = self
            .slots
            .iter()
            .any(|s| s.config.oauth.as_ref().is_some_and(|o| o.delegated()));
        if let (true, Some(context)) = (delegated, self.oauth_context()) {
            context
                .subject_tokens
                .remember(&self.name, subject.key(), token);
        }
    }

    /// Remembers the authorization URL a call of `subject` on per-user
    /// server `index` was given (its grant ended while its session was
    /// open), so the next calls get the same URL.
    pub fn remember_consent_url(&self, index: usize, subject: &crate::callers::Subject, url: &str) {
        if let Some(slot) = self.slots.get(index) {
            slot.remember_consent_url(subject.key(), url);
        }
    }

    /// The OAuth client of the server named `server`, if it has one.
    pub fn oauth_client(
        &self,
        server: &str,
    ) -> Option<Arc<crate::credentials::oauth::OAuthClient>> {
        self.slots
            .iter()
            .find(|s| s.config.name == server)
            .and_then(|s| s.oauth.clone().ok().flatten())
    }

    /// The state store and consent listener of the gateway's OAuth servers,
    /// if the store is open.
    pub fn oauth_context(&self) -> Option<&super::OAuthContext> {
        self.spawner.oauth()
    }

    /// Counts an OAuth event of this gateway's `tenant` and `server`
    /// (`toolgate_oauth_events_total`).
    pub fn oauth_event(&self, tenant: &str, server: &str, event: &str) {
        self.spawner.metrics.oauth_event(tenant, server, event);
    }

    /// A consent of the subject keyed `subject` ([`Subject::key`]
    /// (crate::callers::Subject::key), as its pending flow stored it) for
    /// the server named `server` arrived: its tools can be listed now, and
    /// the subject's URL is spent.
    pub fn consented(&self, server: &str, subject: &str) {
        if let Some(slot) = self.slots.iter().find(|s| s.config.name == server) {
            slot.forget_consent_url(subject);
            slot.wake.notify_one();
        }
    }

    /// Closes per-user sessions unused for the tenant's `idle_timeout`.
    pub(super) fn close_idle_user_sessions(&self, now_ms: u64) -> usize {
        let idle = u64::try_from(self.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        let before = now_ms.saturating_sub(idle);
        self.slots
            .iter()
            .map(|slot| slot.users.close_idle(before))
            .sum()
    }
}

/// Whether the subject of `key` may call delegated server `server`: it has
/// an unexpired JWT at hand (only a `callers.jwt` caller does) of an issuer
/// the grant takes.
///
/// # Errors
/// `DELEGATION_REQUIRES_JWT` or `DELEGATION_ISSUER_MISMATCH`, naming the
/// server and why; nothing was exchanged or sent.
fn delegation_admits(
    client: &crate::credentials::oauth::OAuthClient,
    key: &crate::state::TokenKey,
    server: &str,
) -> Result<(), crate::upstream::UpstreamError> {
    use crate::credentials::oauth::{DelegationError, DelegationFailure};
    let refused = |kind, reason: String| {
        crate::upstream::UpstreamError::Delegation(DelegationError {
            kind,
            reason,
            code: None,
        })
    };
    let grant = client.settings().grant;
    let Some(token) = client.subject_token(key) else {
        return Err(refused(
            DelegationFailure::RequiresJwt,
            format!(
                "server `{server}` exchanges the caller's JWT for its token (grant: {grant}); \
                 this caller presented no JWT (a static-token or certificate caller): call \
                 with a callers.jwt token"
            ),
        ));
    };
    client.accepts_subject_token(&token).map_err(|e| {
        refused(
            e.kind,
            format!(
                "server `{server}` cannot take this caller's JWT: {}",
                e.reason
            ),
        )
    })?;
    // Redacted from the server's text, should it ever echo it (it is only
    // ever sent to the token endpoint).
    client.live_tokens().hold(key, [token.token().expose()]);
    Ok(())
}
