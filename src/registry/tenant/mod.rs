//! One tenant: the `Tenant` object a configuration generation builds (its
//! slots, limits, policy, redaction, guards) and its life: resolving a call
//! against the generation that built its catalog, being marked used and
//! busy, connecting and closing its servers. What the object does is split
//! by concern: `publication.rs` (where its catalogs go, kept across
//! reloads), `catalog.rs` (building and publishing them), `sessions.rs`
//! (the servers' sessions, per-user ones included), `consent.rs` (consent
//! and OAuth), `checks.rs` (policy, guards, limits, redaction).

mod catalog;
mod checks;
mod consent;
mod publication;
mod sessions;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Spawner;
use super::slot::Slot;
use crate::catalog::SharedCatalog;
use crate::config::{ConnectMode, Limits, TenantConfig, TenantLimits};
use crate::registry::limits::TenantLimiter;

pub use consent::ConsentState;
pub(super) use publication::Publication;
pub use sessions::SessionUnavailable;

/// Stamps of tenant objects: each [`Tenant`] gets its own, and every
/// catalog it builds carries it, so a call can tell whether the catalog it
/// read was built from the slots of the tenant it holds.
static STAMPS: AtomicU64 = AtomicU64::new(1);

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
    /// The tenant's `call_approvals` settings, with its approver tokens'
    /// digests (never the tokens).
    call_approvals: Arc<CallApprovalSettings>,
    /// The tenant's `idempotency` settings.
    idempotency: crate::config::IdempotencyConfig,
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
            call_approvals: approver_digests(&config.call_approvals),
            idempotency: config.idempotency.clone(),
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
}

/// A tenant's `call_approvals` settings as its calls and its approvers'
/// authentication use them.
#[derive(Debug)]
pub struct CallApprovalSettings {
    /// How many approvals one subject may have pending.
    pub max_pending_per_subject: u32,
    /// Where requests are announced.
    pub webhook: Option<crate::config::WebhookConfig>,
    /// Each approver token's SHA-256 and its name.
    approver_tokens: Vec<([u8; 32], String)>,
}

impl CallApprovalSettings {
    /// The name of the approver token with this digest (compared in
    /// constant time), if it is one of the tenant's.
    pub fn approver_named_by(&self, digest: &crate::callers::TokenDigest) -> Option<&str> {
        use subtle::ConstantTimeEq as _;
        let presented = digest.as_bytes();
        self.approver_tokens
            .iter()
            .find(|(known, _)| bool::from(known.ct_eq(presented)))
            .map(|(_, name)| name.as_str())
    }
}

/// The settings of `config`, its approver tokens kept as digests.
fn approver_digests(config: &crate::config::CallApprovalsConfig) -> Arc<CallApprovalSettings> {
    Arc::new(CallApprovalSettings {
        max_pending_per_subject: config.max_pending_per_subject,
        webhook: config.webhook.clone(),
        approver_tokens: config
            .approver_tokens
            .iter()
            .map(|t| {
                (
                    *crate::callers::TokenDigest::of(t.token.expose()).as_bytes(),
                    t.name.clone(),
                )
            })
            .collect(),
    })
}
