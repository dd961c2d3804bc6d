//! The Streamable HTTP transport, carrying the configured headers on every
//! request. Header values are marked sensitive so the HTTP stack never
//! prints them. The W3C trace context of a `tools/call` (put in `_meta` by
//! the session) is also sent as `traceparent`/`tracestate` headers. Error
//! bodies are read only as a bounded prefix and redacted before rmcp sees
//! them; one client (and connection pool) serves every session with the
//! same TLS trust (the system's roots, or a server's `tls.ca_file`).

use std::borrow::Cow;
use std::collections::HashMap;

use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};

use self::layer::{Attempt, Body, Headers, HttpError, HttpLayer, Layered, Request};
use super::{Bearer, UpstreamError};
use crate::config::{Reach, Secret, TlsTrust};
use crate::credentials::Redaction;

pub(super) mod client;
pub(crate) mod layer;

/// A session's Streamable HTTP transport.
pub(super) type HttpTransport = StreamableHttpClientTransport<Layered<TraceHeaders>>;

/// Most bytes of an HTTP error body read (a prefix; the rest is dropped
/// with the connection). Redaction runs on this prefix before it is cut to
/// [`MAX_UPSTREAM_TEXT`](crate::credentials::MAX_UPSTREAM_TEXT), so a
/// credential that straddles the final cut is still recognised whole.
const MAX_ERROR_BODY: usize = 4096;

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
    client::ensure_crypto_provider();
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
        (Reach::Any, None) => client::shared_client()?,
        (Reach::Any, Some(tls)) => client::trusting_client(tls)?,
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
    use std::sync::Arc;

    use super::client::{shared_client, trusting_client};
    use super::*;
    use crate::config::test_certs::{CA_1, CA_2};

    fn trust(dir: &std::path::Path, name: &str, pem: &str) -> TlsTrust {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        TlsTrust::from_pem_file(&path).unwrap()
    }

    #[test]
    fn sessions_with_the_same_roots_share_one_client() {
        client::ensure_crypto_provider();
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
}
