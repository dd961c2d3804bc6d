//! The Streamable HTTP transport, carrying the configured headers on every
//! request. Header values are marked sensitive so the HTTP stack never
//! prints them. The W3C trace context of a `tools/call` (put in `_meta` by
//! the session) is also sent as `traceparent`/`tracestate` headers. Error
//! bodies are read only as a bounded prefix and redacted before rmcp sees
//! them; one client (and connection pool) serves every session with the
//! same TLS trust (the system's roots, or a server's `tls.ca_file`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};

use self::layer::{Attempt, Body, Headers, HttpError, HttpLayer, Layered, Request};
use super::{Bearer, UpstreamError, error};
use crate::config::{Reach, Secret, TlsTrust};
use crate::credentials::Redaction;

pub(crate) mod layer;

/// A session's Streamable HTTP transport.
pub(super) type HttpTransport = StreamableHttpClientTransport<Layered<TraceHeaders>>;

/// Installs the process-wide TLS crypto provider (ring) once.
fn ensure_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Fails only if another provider is installed already: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Most bytes of an HTTP error body read (a prefix; the rest is dropped
/// with the connection). Redaction runs on this prefix before it is cut to
/// [`MAX_UPSTREAM_TEXT`](crate::credentials::MAX_UPSTREAM_TEXT), so a
/// credential that straddles the final cut is still recognised whole.
const MAX_ERROR_BODY: usize = 4096;

/// Idle connections kept per upstream host (shared by every session).
const POOL_MAX_IDLE_PER_HOST: usize = 32;

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Builds the transport for `url` with `headers`, checking an HTTPS
/// server's certificate against `tls` (when set) instead of the system's
/// roots. Error texts the server sends back are redacted with `redaction`
/// before rmcp sees (or logs) them.
///
/// # Errors
/// The HTTP client cannot be built (its TLS backend failed to initialise,
/// or refused the configured CA certificates).
pub(super) fn transport(
    url: &url::Url,
    headers: &[(HeaderName, Secret)],
    tls: Option<&TlsTrust>,
    reach: &Reach,
    max_result_bytes: usize,
    redaction: &Redaction,
    bearer: Option<Bearer>,
) -> Result<HttpTransport, UpstreamError> {
    ensure_crypto_provider();
    let mut custom = HashMap::new();
    for (name, value) in headers {
        // Validated at config load.
        if let Ok(mut value) = HeaderValue::from_str(value.expose()) {
            value.set_sensitive(true);
            custom.insert(name.clone(), value);
        }
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
        .custom_headers(custom)
        .max_json_response_size(max_result_bytes)
        .max_sse_event_size(max_result_bytes)
        .max_error_response_size(MAX_ERROR_BODY)
        // A server that forgot the session (404) fails the call in flight;
        // the supervisor then reconnects and re-reads the tool list (a
        // transparent re-initialisation would keep a stale catalog).
        .reinit_on_expired_session(false);
    let client = match (reach, tls) {
        // Under the address rule: shared by the sessions with the same
        // TLS trust, port and allow-list.
        (Reach::Restricted(allow), tls) => {
            super::reach::client(tls, url.port_or_known_default().unwrap_or(443), allow)?
        }
        // Shared by every session with the same TLS trust.
        (Reach::Any, None) => shared_client()?,
        (Reach::Any, Some(tls)) => trusting_client(tls)?,
    };
    let layer = TraceHeaders {
        redaction: redaction.clone(),
        bearer,
    };
    Ok(StreamableHttpClientTransport::with_client(
        Layered::new(client, layer),
        config,
    ))
}

/// One HTTP client for every session of the process: its TLS roots,
/// settings and connection pool are built once (per-session clients cost
/// hundreds of KiB each, and could not share connections). Headers are per
/// session, passed with every request.
fn shared_client() -> Result<Arc<reqwest::Client>, UpstreamError> {
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
fn trusting_client(tls: &TlsTrust) -> Result<Arc<reqwest::Client>, UpstreamError> {
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
pub(super) fn build_client(
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

/// The settings of every HTTP client of the gateway.
pub(super) fn client_builder() -> reqwest::ClientBuilder {
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

/// The answer to an HTTP request that failed with an error status, as rmcp
/// reports it (`HTTP 400 Bad Request: <body prefix>`): the status code and
/// the body. `None` for any other text.
pub(super) fn split_status(text: &str) -> Option<(u16, &str)> {
    let rest = text.strip_prefix("HTTP ")?;
    let code = rest.get(..3)?;
    if !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let status = code.parse().ok()?;
    let body = rest.split_once(": ").map_or("", |(_, body)| body);
    Some((status, body))
}

/// The layer of a session's HTTP requests: it adds the trace-context
/// headers of each `tools/call` request, and takes configured credentials,
/// live tokens (and the URL) out of the errors it hands to rmcp.
#[derive(Clone, Debug)]
pub(super) struct TraceHeaders {
    redaction: Redaction,
    /// The session's OAuth token, sent as `Authorization: Bearer` with
    /// every request (read per request: a refreshed token applies at once).
    bearer: Option<Bearer>,
}

impl TraceHeaders {
    /// The bearer token for this request: the session's OAuth token when
    /// it has one, else what rmcp passes (none: static credentials travel
    /// as configured headers).
    fn auth(&self, auth_header: Option<String>) -> Option<String> {
        self.bearer
            .as_ref()
            .and_then(Bearer::header)
            .or(auth_header)
    }

    /// `error` without upstream text that could carry a credential: an
    /// error body redacted and bounded, a reqwest error without its URL
    /// (whose query may hold a token).
    fn clean(&self, error: HttpError) -> HttpError {
        match error {
            StreamableHttpError::UnexpectedServerResponse(text) => {
                StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                    self.redaction.upstream_text(&text),
                ))
            }
            StreamableHttpError::Client(e) => StreamableHttpError::Client(e.without_url()),
            other => other,
        }
    }
}

fn with_trace_headers(message: &ClientJsonRpcMessage, mut headers: Headers) -> Headers {
    if let JsonRpcMessage::Request(request) = message
        && let ClientRequest::CallToolRequest(call) = &request.request
        && let Some(meta) = &call.params.meta
    {
        for (name, value) in [
            ("traceparent", meta.get_traceparent()),
            ("tracestate", meta.get_tracestate()),
        ] {
            if let Some(value) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
    }
    headers
}

impl HttpLayer for TraceHeaders {
    async fn send<M: Body, T: Send>(
        &self,
        request: Request<'_, M>,
        attempt: impl Attempt<M, T>,
    ) -> Result<T, HttpError> {
        let headers = match request.message.message() {
            Some(message) => with_trace_headers(message, request.headers),
            None => request.headers,
        };
        attempt(request.message, self.auth(request.auth_header), headers)
            .await
            .map_err(|e| self.clean(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_certs::{CA_1, CA_2};

    fn trust(dir: &std::path::Path, name: &str, pem: &str) -> TlsTrust {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        TlsTrust::from_pem_file(&path).unwrap()
    }

    #[test]
    fn sessions_with_the_same_roots_share_one_client() {
        ensure_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let a = trusting_client(&trust(dir.path(), "a.pem", CA_1)).unwrap();
        // The same certificates under another name: the same client.
        let b = trusting_client(&trust(dir.path(), "b.pem", CA_1)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let other = trusting_client(&trust(dir.path(), "c.pem", CA_2)).unwrap();
        assert!(!Arc::ptr_eq(&a, &other));
        assert!(!Arc::ptr_eq(&a, &shared_client().unwrap()));
        // Once no session holds it, the client (and its pool) is dropped.
        let weak = Arc::downgrade(&other);
        drop(other);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn split_status_reads_rmcps_error_text() {
        assert_eq!(
            split_status("HTTP 400 Bad Request: no such tool"),
            Some((400, "no such tool"))
        );
        assert_eq!(
            split_status("HTTP 418 <unknown status code>: "),
            Some((418, ""))
        );
        assert_eq!(split_status("could not parse JSON response"), None);
        assert_eq!(split_status("HTTP abc"), None);
    }
}
