//! Wiring: the registry of upstream sessions, the gRPC server (ToolGateway,
//! health, reflection), the metrics listener, and the shutdown sequence.
//! `run` takes a bound listener and a [`Shutdown`] so tests can serve on
//! port 0 and stop the gateway when they like.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

use crate::config::{Config, Environment};
use crate::grpc::AuthLayer;
use crate::grpc::Gateway;
use crate::grpc::drain::Drain;
use crate::grpc::server::tool_gateway_server::ToolGatewayServer;
use crate::registry::Registry;
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
}

/// Opens the state store when a server uses OAuth (a gateway without one
/// needs no store and creates no file). The store connects lazily: a
/// store that is down at start fails only the calls that need it.
///
/// # Errors
/// The URL or a key is malformed (never echoing either).
pub fn open_oauth(config: &Config) -> Result<Option<crate::registry::OAuthContext>, AppError> {
    let uses_oauth = config
        .tenants
        .iter()
        .any(|t| t.servers.iter().any(|s| s.oauth.is_some()));
    if !uses_oauth {
        return Ok(None);
    }
    let keys: Vec<&str> = config.state.keys.iter().map(|k| k.expose()).collect();
    let keys = crate::state::KeyRing::from_base64(&keys)
        .map_err(|e| AppError::State(format!("state.keys: {e}")))?;
    let state = crate::state::StateStore::open_lazy(config.state.url(), keys)
        .map_err(|e| AppError::State(format!("state.url: {e}")))?;
    tracing::info!(backend = ?state.backend(), "state store configured");
    Ok(Some(crate::registry::OAuthContext {
        store: Arc::new(crate::credentials::StateOAuthStore::new(state.clone())),
        state,
        listener: config.oauth.clone(),
        audit: crate::audit::Audit::disabled(),
    }))
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
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| AppError::Bind {
            addr: config.listen,
            source,
        })?;
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
/// 4. calls still running are cancelled upstream and answered UNAVAILABLE
///    (SHUTTING_DOWN); then the listener closes (HTTP/2 GOAWAY);
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
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let metrics = Arc::new(Metrics::new());
    let stop_metrics = CancellationToken::new();
    if let Some(addr) = config.metrics_listen {
        let listener = metrics::bind(addr)
            .await
            .map_err(|source| AppError::Bind { addr, source })?;
        tracing::info!(
            addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            "metrics listener up"
        );
        tokio::spawn(metrics::serve(
            listener,
            metrics.clone(),
            stop_metrics.clone(),
        ));
    }

    config.log_warnings();
    let audit = match &config.audit {
        Some(settings) => crate::audit::Audit::start(
            settings,
            crate::audit::replica(env.as_ref()),
            metrics.clone(),
        ),
        None => crate::audit::Audit::disabled(),
    };
    let mut oauth = open_oauth(&config)?;
    if let Some(context) = &mut oauth {
        context.audit = audit.clone();
    }
    let (approvals, approvals_digest) = crate::approvals::initial(config.approvals.as_ref())?;
    let registry =
        Registry::start_with_approvals(&config, env, metrics.clone(), oauth.clone(), approvals);
    let stop_approvals = CancellationToken::new();
    tokio::spawn(crate::registry::approvals::watch(
        registry.clone(),
        config
            .approvals
            .as_ref()
            .map(|a| (a.file.clone(), approvals_digest)),
        stop_approvals.clone(),
    ));
    let stop_consent = CancellationToken::new();
    if let (Some(context), Some(listener)) = (&oauth, &config.oauth) {
        let addr = listener.listen;
        let bound = TcpListener::bind(addr)
            .await
            .map_err(|source| AppError::Bind { addr, source })?;
        tracing::info!(
            addr = %bound.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            redirect_uri = %listener.redirect_uri(),
            "OAuth consent listener up"
        );
        let router =
            crate::consent::router(registry.clone(), context.store.clone(), listener.clone());
        tokio::spawn(crate::consent::serve(bound, router, stop_consent.clone()));
    }
    // The registry holds what it needs of each tenant; the rest of the
    // configuration is kept without them (with many tenants, a second copy
    // would cost as much as the registry itself).
    let mut config = config;
    let tenant_count = config.tenants.len();
    config.tenants = Vec::new();
    let stop_reload = CancellationToken::new();
    if let Some(source) = reload {
        tokio::spawn(crate::registry::reload::watch(
            source,
            config.clone(),
            registry.clone(),
            metrics.clone(),
            stop_reload.clone(),
        ));
    }
    let abort = CancellationToken::new();
    let drain = Arc::new(Drain::default());
    let gateway =
        Gateway::new(abort.clone(), metrics.clone(), drain.clone()).with_audit(audit.clone());
    let service = tower::Layer::layer(
        &AuthLayer::new(registry.clone()),
        ToolGatewayServer::new(gateway)
            .max_decoding_message_size(config.limits.max_message_bytes)
            .max_encoding_message_size(config.limits.max_message_bytes),
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    let reflection = if config.reflection {
        let builder = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(crate::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        Some((builder().build_v1()?, builder().build_v1alpha()?))
    } else {
        None
    };

    let stop_accepting = CancellationToken::new();
    let grpc = &config.grpc;
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(grpc.tcp_keepalive));
    let max_message_bytes = config.limits.max_message_bytes;
    let mut builder = tonic::transport::Server::builder()
        // Outermost: records ToolGateway calls refused before the service
        // (authentication), with the status that leaves.
        .layer(crate::audit::RefusalLayer::new(audit.clone()))
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
        .add_optional_service(reflection.as_ref().map(|r| r.0.clone()))
        .add_optional_service(reflection.map(|r| r.1));
    let server =
        router.serve_with_incoming_shutdown(incoming, stop_accepting.clone().cancelled_owned());
    tokio::pin!(server);
    tracing::info!(addr = %local, tenants = tenant_count, "toolgate serving");

    let served = tokio::select! {
        result = &mut server => Some(result),
        () = shutdown.drain.cancelled() => None,
    };
    let result = match served {
        Some(result) => result,
        None => {
            // 1. Health says NOT_SERVING at once, and keeps answering: the
            //    listener stays open until the drain is over.
            health
                .set_service_status(SERVICE_NAME, tonic_health::ServingStatus::NotServing)
                .await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
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
            //    callers get UNAVAILABLE/SHUTTING_DOWN.
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
            tokio::time::timeout(ABORT_FLUSH, &mut server)
                .await
                .unwrap_or(Ok(()))
        }
    };
    stop_reload.cancel();
    stop_approvals.cancel();
    // 5. Close every upstream session.
    tracing::info!("closing upstream sessions");
    registry.shutdown().await;
    stop_consent.cancel();
    if let Some(context) = &oauth {
        context.state.close().await;
    }
    stop_metrics.cancel();
    tracing::info!("toolgate stopped");
    result.map_err(AppError::from)
}
