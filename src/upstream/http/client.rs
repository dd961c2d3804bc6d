//! The HTTP clients of the gateway's sessions: the settings every client
//! shares (no redirects, a pool of idle connections, no Nagle), the TLS
//! roots a client trusts, one client for every session of the process and
//! one per distinct set of roots.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::config::TlsTrust;
use crate::upstream::UpstreamError;
use crate::upstream::error;

/// Idle connections kept per upstream host (shared by every session).
const POOL_MAX_IDLE_PER_HOST: usize = 32;

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// One HTTP client for every session of the process: its TLS roots,
/// settings and connection pool are built once (per-session clients cost
/// hundreds of KiB each, and could not share connections). Headers are per
/// session, passed with every request.
pub(super) fn shared_client() -> Result<Arc<reqwest::Client>, UpstreamError> {
    static CLIENT: std::sync::OnceLock<Result<Arc<reqwest::Client>, String>> =
        std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            client_builder()
                .build()
                .map(Arc::new)
                .map_err(|e| error::root_cause(&e))
        })
        .clone()
        .map_err(|reason| {
            UpstreamError::Transport(format!("cannot build the HTTP client: {reason}"))
        })
}

/// The client of every session whose server trusts `tls`'s roots: one per
/// distinct set of roots, shared (with its connection pool) by all the
/// sessions that use it, and dropped with the last of them.
pub(super) fn trusting_client(tls: &TlsTrust) -> Result<Arc<reqwest::Client>, UpstreamError> {
    type Clients = std::sync::Mutex<HashMap<[u8; 32], Weak<reqwest::Client>>>;
    static CLIENTS: std::sync::OnceLock<Clients> = std::sync::OnceLock::new();
    let clients = CLIENTS.get_or_init(Default::default);
    // Poisoning cannot leave the map inconsistent (single inserts).
    let mut clients = clients.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(client) = clients.get(&tls.digest()).and_then(Weak::upgrade) {
        return Ok(client);
    }
    let client = Arc::new(build_client(client_builder(), Some(tls))?);
    clients.retain(|_, client| client.strong_count() > 0);
    clients.insert(tls.digest(), Arc::downgrade(&client));
    Ok(client)
}

/// Builds a client from `builder` trusting `tls`'s roots only (the
/// system's without).
///
/// # Errors
/// The CA certificates cannot be used, or the client cannot be built.
pub(in crate::upstream) fn build_client(
    builder: reqwest::ClientBuilder,
    tls: Option<&TlsTrust>,
) -> Result<reqwest::Client, UpstreamError> {
    let Some(tls) = tls else {
        return builder.build().map_err(|e| {
            UpstreamError::Transport(format!(
                "cannot build the HTTP client: {}",
                error::root_cause(&e)
            ))
        });
    };
    let mut roots = Vec::with_capacity(tls.roots().len());
    for der in tls.roots() {
        roots.push(reqwest::Certificate::from_der(der).map_err(|e| {
            UpstreamError::Transport(format!(
                "cannot use the CA certificates of {}: {}",
                tls.ca_file().display(),
                error::root_cause(&e)
            ))
        })?);
    }
    builder.tls_certs_only(roots).build().map_err(|e| {
        UpstreamError::Transport(format!(
            "cannot build the HTTP client trusting {}: {}",
            tls.ca_file().display(),
            error::root_cause(&e)
        ))
    })
}

/// Installs the process-wide TLS crypto provider (ring) once.
pub(in crate::upstream) fn ensure_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Fails only if another provider is installed already: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The settings of every HTTP client of the gateway.
pub(in crate::upstream) fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        // Redirects could carry the configured credentials elsewhere.
        .redirect(reqwest::redirect::Policy::none())
        // Keep connections (and their TLS sessions) for reuse: a call to an
        // HTTPS upstream must not cost a new TCP and TLS handshake. hyper
        // puts a connection back in the pool only once its response body
        // was read to the end; a response dropped early (rmcp reads only a
        // prefix of an error body) closes its connection instead, so no
        // reused connection waits on unread bytes.
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        // No Nagle: a request written in two segments (headers, body) must
        // not wait for the server's delayed ACK.
        .tcp_nodelay(true)
}
