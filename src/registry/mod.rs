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

mod slot;
mod supervisor;
mod tenant;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use supervisor::backoff;
pub use tenant::{SessionUnavailable, Tenant};

use slot::Slot;
use tenant::Publication;

use crate::auth::TokenTable;
use crate::config::{Config, Environment};
use crate::limits::TenantLimiter;
use crate::telemetry::Metrics;

/// How long a retired session may keep serving calls that started on it
/// before it is closed anyway.
const RETIRE_BOUND: Duration = Duration::from_secs(600);

/// One configuration's tenants and their tokens.
#[derive(Debug)]
struct Generation {
    tenants: Vec<Arc<Tenant>>,
    tokens: TokenTable,
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

/// Every tenant of the gateway.
#[derive(Debug)]
pub struct Registry {
    generation: RwLock<Arc<Generation>>,
    env: Arc<dyn Environment>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Slots retired by reloads whose sessions may still be closing.
    retired: Mutex<Vec<Arc<Slot>>>,
}

impl Registry {
    /// Builds the registry and starts connecting every server of every
    /// tenant in the background.
    pub fn start(
        config: &Config,
        env: Arc<dyn Environment>,
        metrics: Arc<Metrics>,
    ) -> Arc<Registry> {
        let registry = Arc::new(Registry {
            generation: RwLock::new(Arc::new(Generation {
                tenants: Vec::new(),
                tokens: TokenTable::default(),
            })),
            env,
            metrics,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            retired: Mutex::default(),
        });
        registry.apply(config);
        registry
    }

    fn current(&self) -> Arc<Generation> {
        self.generation.read().expect("generation lock").clone()
    }

    /// The tenant a bearer token selects.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Tenant>> {
        let generation = self.current();
        generation
            .tokens
            .tenant_for(token)
            .and_then(|index| generation.tenants.get(index).cloned())
    }

    /// Every tenant, in configuration order.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.current().tenants.clone()
    }

    /// Switches to `config`: unchanged servers keep their sessions, added
    /// and changed ones connect, removed and changed ones close once idle.
    pub fn apply(&self, config: &Config) -> ReloadSummary {
        let mut summary = ReloadSummary::default();
        let mut generation = self.generation.write().expect("generation lock");
        let old = generation.clone();
        let old_by_name: HashMap<&str, &Arc<Tenant>> =
            old.tenants.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut kept: HashSet<*const Slot> = HashSet::new();
        let mut tenants = Vec::with_capacity(config.tenants.len());
        for tenant_config in &config.tenants {
            let previous = old_by_name.get(tenant_config.name.as_str());
            if previous.is_none() && !old.tenants.is_empty() {
                summary.tenants_added.push(tenant_config.name.clone());
            }
            let mut slots = Vec::with_capacity(tenant_config.servers.len());
            for server in &tenant_config.servers {
                let fingerprint = server.fingerprint();
                let label = format!("{}/{}", tenant_config.name, server.name);
                let reusable = previous.and_then(|t| {
                    t.slots
                        .iter()
                        .find(|s| s.config.name == server.name && s.fingerprint == fingerprint)
                });
                match reusable {
                    Some(slot) => {
                        kept.insert(Arc::as_ptr(slot));
                        slots.push(slot.clone());
                        summary.servers_kept.push(label);
                    }
                    None => {
                        let slot = Arc::new(Slot::new(
                            server.clone(),
                            fingerprint,
                            self.shutdown.child_token(),
                        ));
                        self.tasks.spawn(
                            supervisor::Supervisor {
                                env: self.env.clone(),
                                metrics: self.metrics.clone(),
                                max_result_bytes: config.limits.max_result_bytes,
                                tenant: tenant_config.name.clone(),
                                slot: slot.clone(),
                            }
                            .run(),
                        );
                        slots.push(slot);
                        summary.servers_started.push(label);
                    }
                }
            }
            let publication = previous
                .map(|t| t.publication().clone())
                .unwrap_or_else(Publication::new);
            tenants.push(Tenant::new(
                tenant_config.name.clone(),
                TenantLimiter::new(&tenant_config.limits),
                slots,
                config.limits.clone(),
                publication,
            ));
        }
        let new_names: HashSet<&str> = config.tenants.iter().map(|t| t.name.as_str()).collect();
        for tenant in &old.tenants {
            if !new_names.contains(tenant.name.as_str()) {
                summary.tenants_removed.push(tenant.name.clone());
            }
            for slot in &tenant.slots {
                if !kept.contains(&Arc::as_ptr(slot)) {
                    summary
                        .servers_retired
                        .push(format!("{}/{}", tenant.name, slot.config.name));
                    self.retire(slot.clone());
                }
            }
        }
        *generation = Arc::new(Generation {
            tokens: TokenTable::new(config),
            tenants,
        });
        summary
    }

    /// Stops a slot's supervisor and closes its session once no call runs
    /// on it (bounded by [`RETIRE_BOUND`]).
    fn retire(&self, slot: Arc<Slot>) {
        slot.stop.cancel();
        self.retired
            .lock()
            .expect("retired lock")
            .push(slot.clone());
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let Some(session) = slot.session() else {
                return;
            };
            let deadline = tokio::time::Instant::now() + RETIRE_BOUND;
            // The slot's state holds one reference, this task another;
            // every call in flight holds one more.
            while Arc::strong_count(&session) > 2
                && tokio::time::Instant::now() < deadline
                && !shutdown.is_cancelled()
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            session.close().await;
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
        slots.extend(self.retired.lock().expect("retired lock").drain(..));
        let closing = slots.into_iter().filter_map(|slot| {
            let session = slot.session()?;
            Some(async move { session.close().await })
        });
        futures::future::join_all(closing).await;
        for tenant in self.current().tenants.iter() {
            for server in tenant.servers() {
                self.metrics.session_closed(&tenant.name, &server.name);
            }
        }
    }
}
