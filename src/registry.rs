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
}

/// One tenant: its servers' states and its current catalog.
#[derive(Debug)]
pub struct Tenant {
    /// The configured tenant name.
    pub name: String,
    servers: Vec<ServerConfig>,
    states: Mutex<Vec<SlotState>>,
    catalog: watch::Sender<SharedCatalog>,
}

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
        let tenants = config.tenants.iter().map(Tenant::new).collect();
        let registry = Arc::new(Registry {
            tenants,
            env,
            metrics,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
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
        let env = self.env.clone();
        let metrics = self.metrics.clone();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let server = &tenant.servers[index];
            let label = Label {
                tenant: tenant.name.clone(),
                server: server.name.clone(),
            };
            // A panic while connecting (a bug, or a misbehaving library)
            // must fail this server, not leave it "connecting" forever.
            let connect = AssertUnwindSafe(upstream::connect(server, &label, env.as_ref()))
                .catch_unwind();
            let result = tokio::select! {
                result = connect => result.unwrap_or_else(|_| {
                    Err(upstream::UpstreamError::Handshake(
                        "the connection attempt panicked (a bug: see the gateway log)".to_owned(),
                    ))
                }),
                () = shutdown.cancelled() => return,
            };
            match result {
                Ok(connected) => {
                    tracing::info!(
                        tenant = %tenant.name,
                        server = %server.name,
                        tools = connected.tools.len(),
                        "upstream connected"
                    );
                    metrics.connect_result(&tenant.name, &server.name, true);
                    let session = connected.session.clone();
                    let tools = Arc::new(connected.tools);
                    tenant.set_state(
                        index,
                        SlotState::Ready {
                            session: connected.session,
                            tools: tools.clone(),
                        },
                    );
                    // The session may end on its own (child exit, server
                    // gone): report it so the catalog drops its tools.
                    tokio::select! {
                        () = session.wait_ended() => {
                            tracing::warn!(
                                tenant = %tenant.name,
                                server = %server.name,
                                "upstream session ended"
                            );
                            metrics.session_lost(&tenant.name, &server.name);
                            tenant.set_state(
                                index,
                                SlotState::Failed {
                                    reason: "the session ended (server exited or closed the connection)".to_owned(),
                                    last_tools: Some(tools),
                                },
                            );
                        }
                        () = shutdown.cancelled() => {}
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        tenant = %tenant.name,
                        server = %server.name,
                        %error,
                        "upstream connect failed"
                    );
                    metrics.connect_result(&tenant.name, &server.name, false);
                    tenant.set_state(
                        index,
                        SlotState::Failed {
                            reason: error.to_string(),
                            last_tools: None,
                        },
                    );
                }
            }
        });
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
    fn new(config: &TenantConfig) -> Arc<Tenant> {
        let states = vec![SlotState::Connecting; config.servers.len()];
        let catalog = Arc::new(build_catalog(&config.servers, &states));
        Arc::new(Tenant {
            name: config.name.clone(),
            servers: config.servers.clone(),
            states: Mutex::new(states),
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
        let catalog = Arc::new(build_catalog(&self.servers, &states));
        self.catalog.send_replace(catalog);
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

fn build_catalog(servers: &[ServerConfig], states: &[SlotState]) -> Catalog {
    let inputs: Vec<ServerInput<'_>> = servers
        .iter()
        .zip(states)
        .map(|(server, state)| ServerInput {
            name: &server.name,
            transport: server.transport.kind(),
            bare: server.bare,
            filter: &server.filter,
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
    Catalog::build(&inputs)
}
