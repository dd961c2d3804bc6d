//! The per-tenant registry: for each tenant, one upstream session per
//! configured server and the catalog snapshot built from them.
//!
//! Nothing is shared between tenants: two tenants naming the same command or
//! URL get two sessions. Each tenant's catalog is published on a `watch`
//! channel, so readers take the current snapshot without locking and callers
//! can wait for servers that are still connecting.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::catalog::{Catalog, InputState, ServerInput, SharedCatalog};
use crate::config::{Config, Environment, ServerConfig, TenantConfig};
use crate::telemetry::Metrics;
use crate::upstream::{self, Label, Session};

/// Index of a tenant in the registry (and in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TenantId(pub usize);

/// Every tenant of the gateway.
#[derive(Debug)]
pub struct Registry {
    tenants: Vec<Arc<Tenant>>,
    env: Arc<dyn Environment>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    max_result_bytes: usize,
}

/// One tenant: its servers' states and its current catalog.
#[derive(Debug)]
pub struct Tenant {
    /// The configured tenant name.
    pub name: String,
    /// Rate and concurrency limits of the tenant's calls.
    pub limiter: crate::limits::TenantLimiter,
    /// Per-server concurrency limits, by server index.
    server_limits: Vec<Option<crate::limits::Concurrency>>,
    servers: Vec<ServerConfig>,
    limits: crate::config::Limits,
    states: Mutex<Vec<SlotState>>,
    catalog: watch::Sender<SharedCatalog>,
    /// Recent catalogs by version, newest last, for plans pinned to one.
    history: Mutex<std::collections::VecDeque<SharedCatalog>>,
}

/// Catalog versions remembered per tenant for pinned plans.
const CATALOG_HISTORY: usize = 16;

/// The state of one server slot.
#[derive(Debug, Clone)]
enum SlotState {
    Connecting,
    Ready {
        session: Arc<Session>,
        tools: Arc<Vec<rmcp::model::Tool>>,
    },
    Failed {
        reason: String,
        /// What the server listed when it was last connected.
        last_tools: Option<Arc<Vec<rmcp::model::Tool>>>,
    },
}

/// Why a server's session could not be had for a call.
#[derive(Debug, Clone)]
pub enum SessionUnavailable {
    /// Still connecting after the caller's wait.
    Connecting,
    /// Not connected, for this reason.
    Down(String),
}

impl Registry {
    /// Builds the registry and starts connecting every server of every
    /// tenant in the background.
    pub fn start(
        config: &Config,
        env: Arc<dyn Environment>,
        metrics: Arc<Metrics>,
    ) -> Arc<Registry> {
        let tenants = config
            .tenants
            .iter()
            .map(|t| Tenant::new(t, &config.limits))
            .collect();
        let registry = Arc::new(Registry {
            tenants,
            env,
            metrics,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            max_result_bytes: config.limits.max_result_bytes,
        });
        for tenant in &registry.tenants {
            for index in 0..tenant.servers.len() {
                registry.spawn_connect(tenant.clone(), index);
            }
        }
        registry
    }

    /// The tenant with this id.
    pub fn tenant(&self, id: TenantId) -> &Arc<Tenant> {
        &self.tenants[id.0]
    }

    /// Every tenant, in configuration order.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    fn spawn_connect(&self, tenant: Arc<Tenant>, index: usize) {
        let supervisor = Supervisor {
            env: self.env.clone(),
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            max_result_bytes: self.max_result_bytes,
            tenant,
            index,
        };
        self.tasks.spawn(supervisor.run());
    }

    /// Stops connecting and closes every session (each bounded by
    /// [`upstream::CLOSE_TIMEOUT`]), all in parallel.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let mut closing = Vec::new();
        for tenant in &self.tenants {
            let states = std::mem::take(&mut *tenant.states.lock().expect("state lock"));
            for (index, state) in states.into_iter().enumerate() {
                if let SlotState::Ready { session, .. } = state {
                    let metrics = self.metrics.clone();
                    let tenant = tenant.clone();
                    closing.push(async move {
                        session.close().await;
                        metrics.session_closed(&tenant.name, &tenant.servers[index].name);
                    });
                }
            }
        }
        futures::future::join_all(closing).await;
    }
}

impl Tenant {
    fn new(config: &TenantConfig, limits: &crate::config::Limits) -> Arc<Tenant> {
        let states = vec![SlotState::Connecting; config.servers.len()];
        let catalog = Arc::new(build_catalog(&config.servers, &states, limits));
        Arc::new(Tenant {
            name: config.name.clone(),
            limiter: crate::limits::TenantLimiter::new(&config.limits),
            server_limits: config
                .servers
                .iter()
                .map(|s| s.max_concurrent_calls.map(crate::limits::Concurrency::new))
                .collect(),
            servers: config.servers.clone(),
            limits: limits.clone(),
            states: Mutex::new(states),
            history: Mutex::new(std::collections::VecDeque::from([catalog.clone()])),
            catalog: watch::channel(catalog).0,
        })
    }

    fn set_state(&self, index: usize, state: SlotState) {
        let mut states = self.states.lock().expect("state lock");
        if states.is_empty() {
            // Shut down: nothing more to publish. Close a late session.
            if let SlotState::Ready { session, .. } = state {
                tokio::spawn(async move { session.close().await });
            }
            return;
        }
        states[index] = state;
        let catalog = Arc::new(build_catalog(&self.servers, &states, &self.limits));
        {
            let mut history = self.history.lock().expect("history lock");
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
        self.catalog.send_replace(catalog);
    }

    /// A recent catalog with this version, if remembered.
    pub fn catalog_with_version(&self, version: &str) -> Option<SharedCatalog> {
        self.history
            .lock()
            .expect("history lock")
            .iter()
            .rev()
            .find(|c| c.version() == version)
            .cloned()
    }

    /// A receiver of every new catalog snapshot.
    pub fn subscribe(&self) -> watch::Receiver<SharedCatalog> {
        self.catalog.subscribe()
    }

    /// The current catalog snapshot.
    pub fn catalog(&self) -> SharedCatalog {
        self.catalog.borrow().clone()
    }

    /// The catalog once no server is connecting any more, or the current
    /// one when `wait` runs out first.
    pub async fn settled_catalog(&self, wait: Duration) -> SharedCatalog {
        let mut rx = self.catalog.subscribe();
        let settled = tokio::time::timeout(wait, rx.wait_for(|c| !c.is_settling())).await;
        match settled {
            Ok(Ok(catalog)) => catalog.clone(),
            _ => self.catalog(),
        }
    }

    /// The concurrency limit of server `index`, if any.
    pub fn server_limit(&self, index: usize) -> Option<&crate::limits::Concurrency> {
        self.server_limits.get(index).and_then(Option::as_ref)
    }

    /// The gateway-wide size limits.
    pub fn limits(&self) -> &crate::config::Limits {
        &self.limits
    }

    /// Every configured server, in configuration order.
    pub fn servers(&self) -> &[ServerConfig] {
        &self.servers
    }

    /// The configuration of server `index`.
    pub fn server(&self, index: usize) -> &ServerConfig {
        &self.servers[index]
    }

    /// The live session of server `index`.
    ///
    /// # Errors
    /// The server is not connected.
    pub fn session(&self, index: usize) -> Result<Arc<Session>, SessionUnavailable> {
        match &self.states.lock().expect("state lock").get(index) {
            Some(SlotState::Ready { session, .. }) if !session.is_ended() => Ok(session.clone()),
            Some(SlotState::Ready { .. }) => {
                Err(SessionUnavailable::Down("the session ended".to_owned()))
            }
            Some(SlotState::Connecting) => Err(SessionUnavailable::Connecting),
            Some(SlotState::Failed { reason, .. }) => Err(SessionUnavailable::Down(reason.clone())),
            None => Err(SessionUnavailable::Down(
                "the gateway is shutting down".to_owned(),
            )),
        }
    }
}

fn build_catalog(
    servers: &[ServerConfig],
    states: &[SlotState],
    limits: &crate::config::Limits,
) -> Catalog {
    let inputs: Vec<ServerInput<'_>> = servers
        .iter()
        .zip(states)
        .map(|(server, state)| ServerInput {
            name: &server.name,
            transport: server.transport.kind(),
            bare: server.bare,
            filter: &server.filter,
            overrides: &server.overrides,
            state: match state {
                SlotState::Connecting => InputState::Connecting,
                SlotState::Ready { tools, .. } => InputState::Listed(tools),
                SlotState::Failed { reason, last_tools } => InputState::Failed {
                    reason,
                    last_tools: last_tools.as_deref().map(Vec::as_slice),
                },
            },
        })
        .collect();
    Catalog::build(&inputs, limits)
}

/// A session that lived at least this long resets the backoff.
const STABLE_SESSION: Duration = Duration::from_secs(30);

/// Keeps one server slot connected: connects, waits for the session to end,
/// and reconnects with exponential backoff and jitter, until shutdown. The
/// catalog is re-read on every connect, so a changed tool list gives a new
/// catalog version. Calls are never replayed.
struct Supervisor {
    env: Arc<dyn Environment>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    max_result_bytes: usize,
    tenant: Arc<Tenant>,
    index: usize,
}

impl Supervisor {
    async fn run(self) {
        let server = &self.tenant.servers[self.index];
        let tenant = &self.tenant.name;
        let label = Label {
            tenant: tenant.clone(),
            server: server.name.clone(),
        };
        let mut attempt: u32 = 0;
        let mut first_attempt_done = false;
        let mut last_tools: Option<Arc<Vec<rmcp::model::Tool>>> = None;
        loop {
            // A panic while connecting (a bug, or a misbehaving library)
            // must fail this attempt, not leave the slot "connecting".
            let connect = AssertUnwindSafe(upstream::connect(
                server,
                &label,
                self.env.as_ref(),
                self.max_result_bytes,
            ))
            .catch_unwind();
            let result = tokio::select! {
                result = connect => result.unwrap_or_else(|_| {
                    Err(upstream::UpstreamError::Handshake(
                        "the connection attempt panicked (a bug: see the gateway log)".to_owned(),
                    ))
                }),
                () = self.shutdown.cancelled() => return,
            };
            // Any attempt after the first is a reconnect, whatever the backoff.
            let tried = std::mem::replace(&mut first_attempt_done, true);
            let reason = match result {
                Ok(connected) => {
                    tracing::info!(
                        tenant = %tenant,
                        server = %server.name,
                        tools = connected.tools.len(),
                        reconnect = tried,
                        "upstream connected"
                    );
                    self.metrics
                        .connect_result(tenant, &server.name, true, tried);
                    let session = connected.session.clone();
                    let tools = Arc::new(connected.tools);
                    last_tools = Some(tools.clone());
                    self.tenant.set_state(
                        self.index,
                        SlotState::Ready {
                            session: connected.session,
                            tools,
                        },
                    );
                    let up_since = tokio::time::Instant::now();
                    tokio::select! {
                        () = session.wait_ended() => {}
                        () = self.shutdown.cancelled() => return,
                    }
                    tracing::warn!(tenant = %tenant, server = %server.name, "upstream session ended");
                    self.metrics.session_lost(tenant, &server.name);
                    if up_since.elapsed() >= STABLE_SESSION {
                        attempt = 0;
                    }
                    "the session ended (server exited or closed the connection)".to_owned()
                }
                Err(error) => {
                    tracing::warn!(tenant = %tenant, server = %server.name, %error, "upstream connect failed");
                    self.metrics
                        .connect_result(tenant, &server.name, false, tried);
                    error.to_string()
                }
            };
            let delay = backoff(server.reconnect, attempt);
            attempt = attempt.saturating_add(1);
            self.tenant.set_state(
                self.index,
                SlotState::Failed {
                    reason: format!(
                        "{reason}; reconnecting in {}",
                        humantime::format_duration(Duration::from_millis(delay.as_millis() as u64))
                    ),
                    last_tools: last_tools.clone(),
                },
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.shutdown.cancelled() => return,
            }
        }
    }
}

/// The delay before reconnect attempt `attempt` (0-based): `initial × 2^n`
/// capped at `max`, with "equal jitter" (half fixed, half random) so that
/// many sessions lost together do not reconnect in step.
pub fn backoff(policy: crate::config::Reconnect, attempt: u32) -> Duration {
    let exp = policy
        .initial
        .saturating_mul(2u32.saturating_pow(attempt.min(20)))
        .min(policy.max);
    let half = exp / 2;
    half + half.mul_f64(fastrand::f64())
}
