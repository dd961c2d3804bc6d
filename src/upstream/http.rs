//! The Streamable HTTP transport, carrying the configured headers on every
//! request. Header values are marked sensitive so the HTTP stack never
//! prints them. The W3C trace context of a `tools/call` (put in `_meta` by
//! the session) is also sent as `traceparent`/`tracestate` headers.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use crate::config::Secret;

/// Installs the process-wide TLS crypto provider (ring) once.
fn ensure_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Fails only if another provider is installed already: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Builds the transport for `url` with `headers`.
pub(super) fn transport(
    url: &url::Url,
    headers: &[(HeaderName, Secret)],
    max_result_bytes: usize,
) -> StreamableHttpClientTransport<TraceHeaders> {
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
        // A server that forgot the session (404, 400) fails the call in
        // flight; the supervisor then reconnects and re-reads the tool list
        // (a transparent re-initialisation would keep a stale catalog).
        .reinit_on_expired_session(false);
    StreamableHttpClientTransport::with_client(TraceHeaders(shared_client()), config)
}

/// One HTTP client for every session of the process: its TLS roots and
/// settings are built once (per-session clients cost hundreds of KiB
/// each). Headers are per session, passed with every request.
fn shared_client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                // Redirects could carry the configured credentials elsewhere.
                .redirect(reqwest::redirect::Policy::none())
                // As rmcp's own client: no idle pooling, which avoids
                // delayed-ACK stalls when a response body was not read to
                // the end.
                .pool_max_idle_per_host(0)
                .build()
                .unwrap_or_default()
        })
        .clone()
}

/// A reqwest client that adds the trace-context headers of each
/// `tools/call` request.
#[derive(Clone, Debug)]
pub(super) struct TraceHeaders(reqwest::Client);

fn with_trace_headers(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
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

impl StreamableHttpClient for TraceHeaders {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_trace_headers(&message, custom_headers);
        self.0
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_trace_headers(&message, custom_headers);
        self.0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
