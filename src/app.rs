//! Wiring: the registry of upstream sessions, the gRPC server (ToolGateway,
//! health, reflection), the metrics listener, and the shutdown sequence.
//! A file of its own (the one layer between the surfaces and the command
//! line): it knows every room and none knows it.
//! `run` takes a bound listener and a [`Shutdown`] so tests can serve on
//! port 0 and stop the gateway when they like.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

use crate::calls::Calls;
use crate::calls::drain::Drain;
use crate::config::{Config, Environment};
use crate::grpc::AuthLayer;
use crate::grpc::Gateway;
use crate::grpc::server::tool_gateway_server::ToolGatewayServer;
use crate::listen::{Alpn, TlsIncoming, TlsListener};
use crate::registry::Registry;
use crate::registry::tenants_dir::TenantSources;
use crate::telemetry::{Metrics, metrics};

/// After the grace period, how long cancelled calls get to send their
/// UNAVAILABLE answers before connections are dropped.
const ABORT_FLUSH: Duration = Duration::from_secs(1);

/// The gRPC service name reported by the health service.
pub const SERVICE_NAME: &str = "toolgate.v1.ToolGateway";

/// Why the gateway could not serve.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server error: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The reflection service could not be built.
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The state store cannot be opened (a malformed `state.url`, or a
    /// `state.keys` entry that is not a 32-byte base64 key).
    #[error("state store: {0}")]
    State(String),
    /// The approvals file exists but cannot be read or is malformed.
    #[error("{0}")]
    Approvals(#[from] crate::approvals::ApprovalsError),
    /// A listener's TLS files no longer load (they did when the
    /// configuration was read).
    #[error("{0}")]
    Tls(#[from] crate::config::TlsFileError),
}

/// The state store and the keys that seal its values and the
/// `request_state` of rounds of questions.
#[derive(Debug, Clone)]
pub struct OpenedState {
    /// The store (connected on first use).
    pub store: crate::state::StateStore,
    /// `state.keys`, or one random key of this process when none are
    /// configured (and no server uses OAuth, which requires them).
    pub keys: crate::state::KeyRing,
}

/// Opens the state store and its keys: OAuth servers, questions to
/// workers and tasks (`servers[].input`), tenants of the store (`admin:`
/// or `tenant_store:`), call approvals and idempotency keys (any tool
/// call may carry one) keep their state there. The store connects
/// lazily, so a gateway that never uses it creates no file, and a store
/// that is down at start fails only the calls that need it.
/// Without `state.keys`, a random key of this process seals (logged at
/// INFO): a `request_state` then opens only at this process.
///
/// # Errors
/// The URL or a key is malformed (never echoing either).
pub fn open_state(config: &Config) -> Result<Option<OpenedState>, AppError> {
    let uses_oauth = uses_oauth(config);
    // Tenants in the state store (`admin:` or `tenant_store:`): state.keys
    // is required then (the configuration says so).
    let holds_tenants = config.tenant_store.is_some();
    if config.state.keys.is_empty() && uses_call_approvals(config) {
        tracing::warn!(
            "a policy holds calls for approval (require_approval) and state.keys is not set: call \
             approvals are sealed with a key of this process, so those pending or approved are \
             lost at a restart (the workers ask again), and no other replica can read them; set \
             state.keys"
        );
    }
    let keys = if config.state.keys.is_empty() && !uses_oauth && !holds_tenants {
        tracing::info!(
            "state.keys is not set: the request_state of questions to workers is sealed with a \
             random key of this process; a retry that reaches another replica, or this one after \
             a restart, gets REQUEST_STATE_KEY_RETIRED, and tasks handed to workers are followed \
             at this process only (set state.keys on every replica to share them)"
        );
        crate::state::KeyRing::ephemeral()
    } else {
        let keys: Vec<&str> = config.state.keys.iter().map(|k| k.expose()).collect();
        crate::state::KeyRing::from_base64(&keys)
            .map_err(|e| AppError::State(format!("state.keys: {e}")))?
    };
    let store = crate::state::StateStore::open_lazy(config.state.url(), keys.clone())
        .map_err(|e| AppError::State(format!("state.url: {e}")))?;
    tracing::info!(backend = ?store.backend(), "state store configured");
    Ok(Some(OpenedState { store, keys }))
}

/// Opens the state store when a server uses OAuth (a gateway without one
/// needs no store and creates no file). The store connects lazily: a
/// store that is down at start fails only the calls that need it.
///
/// # Errors
/// The URL or a key is malformed (never echoing either).
pub fn open_oauth(config: &Config) -> Result<Option<crate::registry::OAuthContext>, AppError> {
    if !uses_oauth(config) {
        return Ok(None);
    }
    Ok(oauth_context(config, open_state(config)?.as_ref()))
}

/// Whether a tenant's policy holds calls for a person's approval
/// (`require_approval`), or tenants of the state store (which may) are
/// served: call approvals live in the state store.
fn uses_call_approvals(config: &Config) -> bool {
    config.tenant_store.is_some()
        || config.tenants.iter().any(|t| {
            t.policy.as_ref().is_some_and(|rules| {
                rules
                    .rules
                    .iter()
                    .any(|r| r.effect == crate::config::policy::Effect::RequireApproval)
            })
        })
}

/// Whether some server uses OAuth.
fn uses_oauth(config: &Config) -> bool {
    // A tenant of the state store may have OAuth servers, loaded any time.
    config.tenant_store.is_some()
        || config
            .tenants
            .iter()
            .any(|t| t.servers.iter().any(|s| s.oauth.is_some()))
}

/// What OAuth servers share, over the opened state store; `None` when no
/// server uses OAuth.
fn oauth_context(
    config: &Config,
    state: Option<&OpenedState>,
) -> Option<crate::registry::OAuthContext> {
    let state = state.filter(|_| uses_oauth(config))?.store.clone();
    Some(crate::registry::OAuthContext {
        store: Arc::new(crate::credentials::StateOAuthStore::new(state.clone())),
        state,
        listener: config.oauth.clone(),
        audit: crate::audit::Audit::disabled(),
        subject_tokens: Arc::default(),
    })
}

/// The two stages of stopping: `drain` starts the graceful sequence;
/// `now` (a second signal) ends it at once.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    drain: CancellationToken,
    now: CancellationToken,
}

impl Shutdown {
    /// A shutdown handle that nothing has triggered yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the graceful shutdown.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Ends the drain at once (implies [`Shutdown::drain`]).
    pub fn now(&self) {
        self.drain.cancel();
        self.now.cancel();
    }

    /// A handle driven by SIGTERM and SIGINT: the first signal drains, the
    /// second ends the drain at once.
    ///
    /// # Errors
    /// The signal handlers cannot be installed.
    pub fn on_signals() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let shutdown = Self::new();
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let handle = shutdown.clone();
        tokio::spawn(async move {
            for stage in 0..2 {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                if stage == 0 {
                    tracing::info!(
                        signal = name,
                        "shutdown: draining (signal again to stop at once)"
                    );
                    handle.drain();
                } else {
                    tracing::warn!(signal = name, "second signal: ending the drain now");
                    handle.now();
                }
            }
        });
        Ok(shutdown)
    }
}

/// Binds `config.listen` and runs the gateway until shut down.
///
/// # Errors
/// An address cannot be bound, or the server fails.
pub async fn serve(
    config: Config,
    env: Arc<dyn Environment>,
    shutdown: Shutdown,
    reload: Option<crate::registry::reload::ConfigSource>,
) -> Result<(), AppError> {
    let listener = bind(config.listen).await?;
    run_with_reload(config, listener, env, shutdown, reload).await
}

/// Runs the gateway on `listener` until `shutdown` drains it, in the order
/// gRPC's graceful-stop guidance gives:
/// 1. health turns NOT_SERVING at once (and keeps answering through the
///    drain);
/// 2. new calls are still served for `shutdown_delay` while load balancers
///    withdraw the endpoint;
/// 3. new calls are refused (UNAVAILABLE, reason DRAINING, safe to retry
///    elsewhere) and calls in flight finish within `shutdown_grace`;
/// 4. calls still running are cancelled upstream and answered
///    SHUTTING_DOWN (UNKNOWN when the request was sent and the tool is not
///    idempotent, else UNAVAILABLE); then the listener closes (HTTP/2
///    GOAWAY);
/// 5. every upstream session is closed (children: stdin closed, SIGTERM,
///    SIGKILL of the process group).
///
/// [`Shutdown::now`] skips what is left of steps 2 and 3.
///
/// # Errors
/// The metrics address cannot be bound, or the server fails.
pub async fn run(
    config: Config,
    listener: TcpListener,
    env: Arc<dyn Environment>,
    shutdown: Shutdown,
) -> Result<(), AppError> {
    run_with_reload(config, listener, env, shutdown, None).await
}

/// [`run`], reloading the configuration from `reload` on SIGHUP and when
/// the file changes.
///
/// # Errors
/// The metrics address cannot be bound, or the server fails.
pub async fn run_with_reload(
    config: Config,
    listener: TcpListener,
    env: Arc<dyn Environment>,
    shutdown: Shutdown,
    reload: Option<crate::registry::reload::ConfigSource>,
) -> Result<(), AppError> {
    let local = local_addr(&listener);
    let metrics = Arc::new(Metrics::new());
    let stop_metrics =
        start_metrics(config.metrics_listen, config.metrics_tls.as_ref(), &metrics).await?;
    config.log_warnings();
    let Some((sources, config)) = start_tenant_sources(config, &env, &metrics, &shutdown).await
    else {
        stop_metrics.cancel();
        return Ok(());
    };
    let audit = start_audit(&config, env.as_ref(), &metrics);
    let state = open_state(&config)?;
    let oauth =
        oauth_context(&config, state.as_ref()).map(|context| crate::registry::OAuthContext {
            audit: audit.clone(),
            ..context
        });
    let (registry, stop_approvals) = start_registry(&config, env.clone(), &metrics, &oauth)?;
    let stop_consent = start_consent(&config, &oauth, &registry, &metrics).await?;
    let stop_follow = start_follow(&config, state.as_ref(), &registry);
    let sweeps_approvals = uses_call_approvals(&config);
    let (config, tenant_count) = without_tenants(config);
    let stop_reload = start_reload(reload, &config, &registry, &metrics, sources);
    let stop_admin =
        start_admin(&config, state.as_ref(), &registry, &audit, &metrics, &env).await?;
    let abort = CancellationToken::new();
    let drain = Arc::new(Drain::default());
    let mut calls = Calls::new(abort.clone(), metrics.clone(), drain.clone())
        .with_audit(audit.clone())
        .with_webhooks(config.upstream_allow.clone());
    // A session established closes the breakers it concerns; a retired
    // server's go with it.
    registry.observe_sessions(calls.breakers().clone());
    if let Some(state) = &state {
        calls = calls
            .with_request_keys(state.keys.clone())
            .with_answered_rounds(state.store.clone())
            .with_task_store(state.store.clone())
            .with_call_approvals(state.store.clone())
            .with_idempotency_keys(state.store.clone());
    }
    // Expired call approvals are marked and recorded, old ones forgotten,
    // for as long as this gateway runs.
    let stop_sweep = CancellationToken::new();
    let _stop_sweep = stop_sweep.clone().drop_guard();
    if sweeps_approvals {
        tokio::spawn(
            calls
                .call_approvals()
                .clone()
                .sweep_until(stop_sweep.clone()),
        );
        tokio::spawn(
            calls
                .call_approvals()
                .clone()
                .follow_until(stop_sweep.clone()),
        );
    }
    // Expired idempotency keys are purged (once this process has used the
    // store: a gateway that never did creates nothing).
    if let Some(state) = &state {
        tokio::spawn(crate::calls::idempotency::purge_until(
            state.store.clone(),
            stop_sweep,
        ));
    }
    let gateway = Gateway::new(calls);
    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(
        &health,
        tonic_health::ServingStatus::Serving,
        config.grpc.mcp_transport,
    )
    .await;
    let stop_accepting = CancellationToken::new();
    let server = grpc_server(
        &config,
        listener,
        gateway,
        &registry,
        &audit,
        health_service,
        &metrics,
        stop_accepting.clone(),
    )?;
    tokio::pin!(server);
    tracing::info!(addr = %local, tenants = tenant_count, "toolgate serving");

    let served = tokio::select! {
        result = &mut server => Some(result),
        () = shutdown.drain.cancelled() => None,
    };
    let result = match served {
        Some(result) => result,
        None => {
            let stages = Stages {
                health: &health,
                drain: &drain,
                abort: &abort,
                stop_accepting: &stop_accepting,
            };
            drain_in_stages(&config, &shutdown, stages, server.as_mut()).await
        }
    };
    let background = Background {
        follow: stop_follow,
        reload: stop_reload,
        approvals: stop_approvals,
        consent: stop_consent,
        admin: stop_admin,
        metrics: stop_metrics,
    };
    close(background, &registry, state.as_ref()).await;
    // The summaries of the last interval's refusals, and whatever is
    // still queued, reach the trail before the process ends.
    if !audit.close().await {
        tracing::warn!("the audit trail's last records may not all be written");
    }
    tracing::info!("toolgate stopped");
    result.map_err(AppError::from)
}

/// Binds a listen address, naming it when it cannot be bound.
async fn bind(addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { addr, source })
}

/// The address a listener is bound to, for the log (empty if unknown).
fn local_addr(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default()
}

/// Starts the metrics listener when one is configured (over TLS with
/// `metrics.tls`); the token stops it.
async fn start_metrics(
    addr: Option<SocketAddr>,
    tls: Option<&crate::config::ListenerTls>,
    metrics: &Arc<Metrics>,
) -> Result<CancellationToken, AppError> {
    let stop = CancellationToken::new();
    if let Some(addr) = addr {
        let listener = bind(addr).await?;
        tracing::info!(addr = %local_addr(&listener), tls = tls.is_some(), "metrics listener up");
        match tls {
            Some(tls) => {
                let incoming =
                    TlsIncoming::start(listener, tls, Alpn::Http1, None, metrics.clone(), &stop)?;
                let listener = TlsListener::from(incoming);
                tokio::spawn(metrics::serve(listener, metrics.clone(), stop.clone()));
            }
            None => {
                tokio::spawn(metrics::serve(listener, metrics.clone(), stop.clone()));
            }
        }
    }
    Ok(stop)
}

/// Starts the audit sink when one is configured (else a disabled one).
fn start_audit(
    config: &Config,
    env: &dyn Environment,
    metrics: &Arc<Metrics>,
) -> crate::audit::Audit {
    match &config.audit {
        Some(settings) => {
            crate::audit::Audit::start(settings, crate::audit::replica(env), metrics.clone())
        }
        None => crate::audit::Audit::disabled(),
    }
}

/// Starts the registry with the approvals file's first contents, and the
/// watcher that reloads that file; the token stops the watcher.
///
/// # Errors
/// The approvals file exists but cannot be read or is malformed.
fn start_registry(
    config: &Config,
    env: Arc<dyn Environment>,
    metrics: &Arc<Metrics>,
    oauth: &Option<crate::registry::OAuthContext>,
) -> Result<(Arc<Registry>, CancellationToken), AppError> {
    let (approvals, approvals_digest) = crate::approvals::initial(config.approvals.as_ref())?;
    let registry =
        Registry::start_with_approvals(config, env, metrics.clone(), oauth.clone(), approvals);
    let stop = CancellationToken::new();
    tokio::spawn(crate::registry::approvals::watch(
        registry.clone(),
        config
            .approvals
            .as_ref()
            .map(|a| (a.file.clone(), approvals_digest)),
        stop.clone(),
    ));
    Ok((registry, stop))
}

/// Starts the OAuth consent listener when a server uses OAuth (over TLS
/// with `oauth.tls`); the token stops it.
async fn start_consent(
    config: &Config,
    oauth: &Option<crate::registry::OAuthContext>,
    registry: &Arc<Registry>,
    metrics: &Arc<Metrics>,
) -> Result<CancellationToken, AppError> {
    let stop = CancellationToken::new();
    if let (Some(context), Some(listener)) = (oauth, &config.oauth) {
        let bound = bind(listener.listen).await?;
        tracing::info!(
            addr = %local_addr(&bound),
            redirect_uris = %listener.redirect_uri("<tenant>", "<server>"),
            tls = listener.tls.is_some(),
            "OAuth consent listener up"
        );
        let router =
            crate::consent::router(registry.clone(), context.store.clone(), listener.clone());
        match &listener.tls {
            Some(tls) => {
                let incoming =
                    TlsIncoming::start(bound, tls, Alpn::Http1, None, metrics.clone(), &stop)?;
                let listener = TlsListener::from(incoming).with_peer_addr();
                tokio::spawn(crate::consent::serve(listener, router, stop.clone()));
            }
            None => {
                tokio::spawn(crate::consent::serve(bound, router, stop.clone()));
            }
        }
    }
    Ok(stop)
}

/// The gRPC service name of the admin API (health reports it).
pub const ADMIN_SERVICE_NAME: &str = "toolgate.admin.v1.Admin";

/// Starts the admin API on its own listener (`admin.listen`, never the
/// workers' port) when `admin:` is configured, with a health service of
/// its own; the token stops it. It validates specs against `config` (the
/// configuration at start; JWT callers are the registry's current ones).
/// Once the registry keeps the configuration in force (the state store's
/// follower does), hand that in instead so a reload reaches admin callers
/// and `admin.host_secrets` too.
///
/// # Errors
/// `admin.listen` cannot be bound.
async fn start_admin(
    config: &Config,
    state: Option<&OpenedState>,
    registry: &Arc<Registry>,
    audit: &crate::audit::Audit,
    metrics: &Arc<Metrics>,
    env: &Arc<dyn Environment>,
) -> Result<CancellationToken, AppError> {
    let stop = CancellationToken::new();
    let (Some(admin), Some(state)) = (&config.admin, state) else {
        return Ok(stop);
    };
    let bound = bind(admin.listen).await?;
    tracing::info!(addr = %local_addr(&bound), tls = admin.tls.is_some(), "admin API listener up");
    // Specs are validated against the configuration in force: reloads
    // reach the admin API too.
    let in_force: Arc<dyn crate::admin::ConfigInForce> = Arc::new(crate::admin::Followed {
        registry: registry.clone(),
        initial: Arc::new(config.clone()),
    });
    let service = crate::admin::AdminService::new(
        state.store.clone(),
        registry.clone(),
        in_force,
        env.clone(),
        audit.clone(),
        metrics.clone(),
    );
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(ADMIN_SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    let router = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(crate::admin::server::admin_server::AdminServer::new(
            service,
        ));
    let server: ServerFuture = match &admin.tls {
        Some(tls) => {
            let incoming = TlsIncoming::start(bound, tls, Alpn::H2, None, metrics.clone(), &stop)?;
            Box::pin(router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned()))
        }
        None => {
            let incoming = TcpIncoming::from(bound).with_nodelay(Some(true));
            Box::pin(router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned()))
        }
    };
    tokio::spawn(async move {
        if let Err(error) = server.await {
            tracing::error!(%error, "admin API listener failed");
        }
    });
    Ok(stop)
}

/// The configuration without its tenants, and how many there were.
///
/// The registry holds what it needs of each tenant; the rest of the
/// configuration is kept without them (with many tenants, a second copy
/// would cost as much as the registry itself).
fn without_tenants(mut config: Config) -> (Config, usize) {
    let tenant_count = config.tenants.len();
    config.tenants = Vec::new();
    (config, tenant_count)
}

/// Serves the tenants of the state store when `tenant_store` is
/// configured (loaded on first use) and starts the follower that keeps
/// them as stored ([`crate::registry::follow`]); the token stops it.
fn start_follow(
    config: &Config,
    state: Option<&OpenedState>,
    registry: &Arc<Registry>,
) -> CancellationToken {
    let stop = CancellationToken::new();
    if let (Some(settings), Some(state)) = (&config.tenant_store, state) {
        registry.serve_store_tenants(state.store.clone());
        tokio::spawn(crate::registry::follow::follow(
            registry.clone(),
            settings.clone(),
            stop.clone(),
        ));
    }
    stop
}

/// Reads `tenants_dir` (off the async threads: thousands of files); the
/// configuration to start the registry with has the file's tenants and
/// the directory's. `None` when a shutdown signal came first: a read stuck
/// in the file system (a hung network mount) is left behind, and nothing
/// has been served yet.
async fn start_tenant_sources(
    config: Config,
    env: &Arc<dyn Environment>,
    metrics: &Arc<Metrics>,
    shutdown: &Shutdown,
) -> Option<(Arc<TenantSources>, Config)> {
    let (env, metrics) = (env.clone(), metrics.clone());
    let reading = tokio::task::spawn_blocking(move || TenantSources::start(config, env, metrics));
    tokio::select! {
        read = reading => Some(read.expect("reading tenants_dir does not panic")),
        () = shutdown.drain.cancelled() => {
            tracing::warn!("shutdown before tenants_dir was read: stopping without serving");
            None
        }
    }
}

/// Starts the configuration reload watcher when there is a source to
/// reload from, and the `tenants_dir` scanner; the token stops both.
fn start_reload(
    reload: Option<crate::registry::reload::ConfigSource>,
    config: &Config,
    registry: &Arc<Registry>,
    metrics: &Arc<Metrics>,
    sources: Arc<TenantSources>,
) -> CancellationToken {
    let stop = CancellationToken::new();
    if let Some(source) = reload {
        tokio::spawn(crate::registry::reload::watch(
            source,
            config.clone(),
            registry.clone(),
            metrics.clone(),
            sources.clone(),
            stop.clone(),
        ));
    }
    tokio::spawn(crate::registry::tenants_dir::watch(
        sources,
        registry.clone(),
        stop.clone(),
    ));
    stop
}

/// Sets the health of the gateway's services (`toolgate.v1`, and MCP's
/// transport when it is served) and of the server as a whole.
async fn set_health(
    health: &tonic_health::server::HealthReporter,
    status: tonic_health::ServingStatus,
    mcp_transport: bool,
) {
    health.set_service_status(SERVICE_NAME, status).await;
    if mcp_transport {
        health
            .set_service_status(crate::grpc::mcp::SERVICE_NAME, status)
            .await;
    }
    health.set_service_status("", status).await;
}

/// The reflection services (v1 and v1alpha), when enabled.
///
/// # Errors
/// A descriptor set cannot be registered.
fn reflection(
    config: &Config,
) -> Result<
    Option<(
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    )>,
    AppError,
> {
    if !config.reflection {
        return Ok(None);
    }
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(crate::pb::mcp::FILE_DESCRIPTOR_SET)
    };
    Ok(Some((builder().build_v1()?, builder().build_v1alpha()?)))
}

/// A gRPC server running (plaintext or TLS incoming alike).
type ServerFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// The gRPC server on `listener` (over TLS with `grpc.tls`), with its
/// layers (refusal audit outermost, then the oversized-message status),
/// HTTP/2 settings, and services (health, ToolGateway behind
/// authentication, reflection); it stops accepting when `stop_accepting`
/// is cancelled.
///
/// # Errors
/// The reflection service cannot be built, or the TLS files no longer load.
#[allow(clippy::too_many_arguments)]
fn grpc_server(
    config: &Config,
    listener: TcpListener,
    gateway: Gateway,
    registry: &Arc<Registry>,
    audit: &crate::audit::Audit,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    metrics: &Arc<Metrics>,
    stop_accepting: CancellationToken,
) -> Result<ServerFuture, AppError> {
    let approvals = tower::Layer::layer(
        &AuthLayer::new(registry.clone()).for_approvers(),
        crate::grpc::server::call_approvals_service_server::CallApprovalsServiceServer::new(
            crate::grpc::call_approvals::CallApprovalsApi::new(gateway.calls().clone()),
        ),
    );
    let service = tower::Layer::layer(
        &AuthLayer::new(registry.clone()),
        ToolGatewayServer::new(gateway.clone())
            .max_decoding_message_size(config.limits.max_message_bytes)
            .max_encoding_message_size(config.limits.max_message_bytes),
    );
    // MCP's own gRPC transport, behind the same authentication.
    let mcp = config.grpc.mcp_transport.then(|| {
        tower::Layer::layer(
            &AuthLayer::new(registry.clone()),
            crate::pb::mcp::mcp_server::McpServer::new(crate::grpc::mcp::McpGateway::new(
                gateway.clone(),
            ))
            .max_decoding_message_size(config.limits.max_message_bytes)
            .max_encoding_message_size(config.limits.max_message_bytes),
        )
    });
    let reflection = reflection(config)?;
    let grpc = &config.grpc;
    let max_message_bytes = config.limits.max_message_bytes;
    let mut builder = tonic::transport::Server::builder()
        // Outermost: records ToolGateway calls refused before the service
        // (authentication), with the status that leaves. Without an audit
        // trail there is nothing to record: no layer, so a call pays for
        // neither a clone of the service stack nor a boxed future.
        .layer(tower::util::option_layer(
            audit
                .is_enabled()
                .then(|| crate::audit::RefusalLayer::new(audit.clone())),
        ))
        .layer(tower::util::MapResponseLayer::new(
            move |response: http::Response<tonic::body::Body>| {
                crate::grpc::status::oversized_message(response, max_message_bytes)
            },
        ))
        .http2_keepalive_interval(Some(grpc.keepalive_interval))
        .http2_keepalive_timeout(Some(grpc.keepalive_timeout))
        .max_concurrent_streams(Some(grpc.max_concurrent_streams));
    let router = builder
        .add_service(health_service)
        .add_service(service)
        .add_service(approvals)
        .add_optional_service(mcp)
        .add_optional_service(reflection.as_ref().map(|r| r.0.clone()))
        .add_optional_service(reflection.map(|r| r.1));
    let stop = stop_accepting.clone().cancelled_owned();
    Ok(match &grpc.tls {
        Some(tls) => {
            let incoming = TlsIncoming::start(
                listener,
                tls,
                Alpn::H2,
                Some(grpc.tcp_keepalive),
                metrics.clone(),
                &stop_accepting,
            )?;
            Box::pin(router.serve_with_incoming_shutdown(incoming, stop))
        }
        None => {
            let incoming = TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(grpc.tcp_keepalive));
            Box::pin(router.serve_with_incoming_shutdown(incoming, stop))
        }
    })
}

/// What the staged drain turns off, one after the other.
struct Stages<'a> {
    /// Turns NOT_SERVING first.
    health: &'a tonic_health::server::HealthReporter,
    /// Refuses new calls, then counts those in flight down.
    drain: &'a Drain,
    /// Cancels the calls still running after the grace.
    abort: &'a CancellationToken,
    /// Closes the listener (GOAWAY on every connection).
    stop_accepting: &'a CancellationToken,
}

/// Steps 1 to 4 of the shutdown (see [`run`]): NOT_SERVING, the delay, the
/// drain within the grace, cancelling what is left; then the listener
/// closes and `server` gets [`ABORT_FLUSH`] to finish.
///
/// `server` is polled the whole time: it is the server's accept loop, so
/// health checks and new calls on new connections are answered through
/// the delay and the drain (NOT_SERVING, then DRAINING) rather than left
/// unanswered.
async fn drain_in_stages(
    config: &Config,
    shutdown: &Shutdown,
    stages: Stages<'_>,
    mut server: std::pin::Pin<&mut impl Future<Output = Result<(), tonic::transport::Error>>>,
) -> Result<(), tonic::transport::Error> {
    let stages = run_stages(config, shutdown, stages);
    tokio::pin!(stages);
    let ended_first = tokio::select! {
        result = server.as_mut() => Some(result),
        () = &mut stages => None,
    };
    match ended_first {
        Some(result) => result,
        None => tokio::time::timeout(ABORT_FLUSH, server)
            .await
            .unwrap_or(Ok(())),
    }
}

/// The stages themselves, ending with the listener told to stop.
async fn run_stages(config: &Config, shutdown: &Shutdown, stages: Stages<'_>) {
    let Stages {
        health,
        drain,
        abort,
        stop_accepting,
    } = stages;
    // 1. Health says NOT_SERVING at once, and keeps answering: the
    //    listener stays open until the drain is over.
    set_health(
        health,
        tonic_health::ServingStatus::NotServing,
        config.grpc.mcp_transport,
    )
    .await;
    // 2. Keep serving new calls while endpoints are withdrawn.
    tracing::info!(delay = ?config.shutdown_delay, "shutdown: NOT_SERVING; still taking calls");
    tokio::select! {
        () = tokio::time::sleep(config.shutdown_delay) => {}
        () = shutdown.now.cancelled() => {}
    }
    // 3. No new calls (UNAVAILABLE/DRAINING, safe to retry
    //    elsewhere); calls in flight finish within the grace.
    drain.start();
    tracing::info!(grace = ?config.shutdown_grace, in_flight = drain.in_flight(), "shutdown: draining calls in flight");
    let drained = tokio::select! {
        () = drain.idle() => true,
        () = tokio::time::sleep(config.shutdown_grace) => false,
        () = shutdown.now.cancelled() => false,
    };
    // 4. Cancel what is left: upstream gets notifications/cancelled,
    //    callers get SHUTTING_DOWN (UNKNOWN if it may have acted).
    if !drained {
        tracing::warn!(
            in_flight = drain.in_flight(),
            "shutdown: cancelling calls still in flight"
        );
        abort.cancel();
        let _ = tokio::time::timeout(ABORT_FLUSH, drain.idle()).await;
    }
    // Stop the listener and send GOAWAY on every connection.
    stop_accepting.cancel();
}

/// What runs beside the gRPC server, each stopped by its token.
struct Background {
    /// The follower of the state store's tenants.
    follow: CancellationToken,
    /// The configuration reload watcher.
    reload: CancellationToken,
    /// The approvals file watcher.
    approvals: CancellationToken,
    /// The OAuth consent listener.
    consent: CancellationToken,
    /// The admin API listener.
    admin: CancellationToken,
    /// The metrics listener.
    metrics: CancellationToken,
}

/// Step 5 of the shutdown: the watchers and the admin listener stop,
/// every upstream session closes, then the consent listener, the state
/// store and the metrics listener.
async fn close(background: Background, registry: &Registry, state: Option<&OpenedState>) {
    background.reload.cancel();
    background.follow.cancel();
    background.approvals.cancel();
    background.admin.cancel();
    // 5. Close every upstream session.
    tracing::info!("closing upstream sessions");
    registry.shutdown().await;
    background.consent.cancel();
    if let Some(state) = state {
        state.store.close().await;
    }
    background.metrics.cancel();
}
