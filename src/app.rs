//! Wiring: the registry of upstream sessions, the gRPC server, and the
//! shutdown sequence. `run` takes a bound listener and a shutdown future so
//! tests can serve on port 0 and stop the gateway when they like.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

use crate::auth::{Authenticate, TokenTable};
use crate::config::{Config, Environment};
use crate::grpc::Gateway;
use crate::pb::tool_gateway_server::ToolGatewayServer;
use crate::registry::Registry;

/// After the grace period, how long cancelled calls get to send their
/// UNAVAILABLE answers before connections are dropped.
const ABORT_FLUSH: Duration = Duration::from_secs(1);

/// Why the gateway could not serve.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The listen address could not be bound.
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
}

/// Binds `config.listen` and runs the gateway until `shutdown` resolves.
///
/// # Errors
/// The address cannot be bound, or the server fails.
pub async fn serve(
    config: Config,
    env: Arc<dyn Environment>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AppError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| AppError::Bind {
            addr: config.listen,
            source,
        })?;
    run(config, listener, env, shutdown).await
}

/// Runs the gateway on `listener` until `shutdown` resolves, then: stops
/// accepting, lets in-flight calls finish within `shutdown_grace`, cancels
/// what is left (answered UNAVAILABLE), and closes every upstream session.
///
/// # Errors
/// The server fails.
pub async fn run(
    config: Config,
    listener: TcpListener,
    env: Arc<dyn Environment>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AppError> {
    let local = listener.local_addr().ok();
    let registry = Registry::start(&config, env);
    let abort = CancellationToken::new();
    let gateway = Gateway::new(registry.clone(), abort.clone());
    let service =
        ToolGatewayServer::with_interceptor(gateway, Authenticate::new(TokenTable::new(&config)));
    let stop = CancellationToken::new();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned());
    tokio::pin!(server);
    tracing::info!(addr = ?local, tenants = config.tenants.len(), "toolgate serving");

    let served = tokio::select! {
        result = &mut server => Some(result),
        () = shutdown => None,
    };
    let result = match served {
        Some(result) => result,
        None => {
            tracing::info!(grace = ?config.shutdown_grace, "shutting down: draining calls");
            stop.cancel();
            match tokio::time::timeout(config.shutdown_grace, &mut server).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!("grace period over: cancelling calls still in flight");
                    abort.cancel();
                    tokio::time::timeout(ABORT_FLUSH, &mut server)
                        .await
                        .unwrap_or(Ok(()))
                }
            }
        }
    };
    tracing::info!("closing upstream sessions");
    registry.shutdown().await;
    tracing::info!("toolgate stopped");
    result.map_err(AppError::from)
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
