//! Requests other than `tools/call` on a live session: `resources/list`,
//! `resources/read`, `prompts/list`, `prompts/get`, `completion/complete`,
//! subscriptions. Each has what a call has: the session's credentials
//! (refreshed, renewed once when refused), a timeout, the caller's trace
//! context, `notifications/cancelled` when abandoned, and the session's end
//! ending it at once. rmcp's response cache is off for every session
//! (`Connecting::finish`), so each one reaches the server.

use std::time::Duration;

use rmcp::model::{ClientRequest, ServerCapabilities, ServerResult};
use rmcp::service::PeerRequestOptions;
use tracing::Instrument;

use super::{CancelOnDrop, End, InputKinds, Session, UpstreamError, capabilities};
use crate::credentials::Redaction;

/// One request of [`Session::request`].
#[derive(Debug, Clone)]
pub struct Request {
    /// The MCP request.
    pub request: ClientRequest,
    /// How long to wait for the answer.
    pub timeout: Duration,
    /// The caller's own trace context, sent when trace export is off.
    pub inherited_trace: Vec<(String, String)>,
    /// The kinds of question the worker answers (2026-07-28 sessions
    /// declare exactly these in the request's `_meta`).
    pub accepts: InputKinds,
}

impl Request {
    /// `request`, answered within `timeout`; no question accepted.
    #[must_use]
    pub fn new(request: ClientRequest, timeout: Duration) -> Self {
        Self {
            request,
            timeout,
            inherited_trace: Vec::new(),
            accepts: InputKinds::default(),
        }
    }
}

impl Session {
    /// Sends `request` and waits for its answer, as [`Session::call`] does
    /// for a tool: a fresh token first, a refused one renewed once and the
    /// request resent; on timeout or when the returned future is dropped,
    /// `notifications/cancelled`. The answer is the server's, unredacted:
    /// callers redact what they hand out ([`Session::redaction`]).
    ///
    /// # Errors
    /// The session is closed or ends, the transport fails, the server
    /// answers a JSON-RPC error, or the timeout passes.
    pub async fn request(&self, request: &Request) -> Result<ServerResult, UpstreamError> {
        let Some(bearer) = &self.bearer else {
            return self.request_once(request).await;
        };
        bearer.refresh().await?;
        match self.request_once(request).await {
            Err(UpstreamError::AuthRejected { challenge }) => {
                bearer.refused(challenge.as_deref()).await?;
                self.request_once(request).await
            }
            other => other,
        }
    }

    /// One request with the current credentials.
    async fn request_once(&self, request: &Request) -> Result<ServerResult, UpstreamError> {
        if self.is_ended() {
            return Err(UpstreamError::Closed);
        }
        let method = request.request.method().to_owned();
        let span = tracing::info_span!(
            "mcp.request",
            otel.name = %method,
            otel.kind = "client",
            mcp.method.name = %method,
            tenant = %self.label.tenant,
            server = %self.label.server,
        );
        let mut meta = self.request_meta(request.accepts);
        let mut fields = crate::telemetry::trace::context_fields(&span);
        if fields.is_empty() {
            fields.clone_from(&request.inherited_trace);
        }
        if !fields.is_empty() {
            let meta = meta.get_or_insert_with(rmcp::model::RequestMetaObject::new);
            for (key, value) in fields {
                meta.0.insert(key, serde_json::Value::String(value));
            }
        }
        let options = match meta {
            Some(meta) => PeerRequestOptions::no_options().with_meta(meta),
            None => PeerRequestOptions::no_options(),
        };
        let timeout = request.timeout;
        let mut ended = self.end.clone();
        async {
            let live = self.hold().await?;
            let handle = live
                .send_request_with_option(request.request.clone(), options)
                .await
                .map_err(|e| self.classify(e, false))?;
            let mut cancel = CancelOnDrop {
                peer: live.clone(),
                id: Some(handle.id.clone()),
            };
            let result = tokio::select! {
                result = tokio::time::timeout(timeout, handle.await_response()) => match result {
                    Ok(result) => result.map_err(|e| self.classify(e, true)),
                    Err(_) => Err(UpstreamError::Timeout(timeout)),
                },
                _ = ended.wait_for(|end| *end >= End::Ended) => Err(UpstreamError::Lost),
            };
            if !matches!(result, Err(UpstreamError::Timeout(_) | UpstreamError::Lost)) {
                cancel.id = None;
            }
            result
        }
        .instrument(span)
        .await
    }

    /// The `_meta` a request that accepts `accepts` adds on a 2026-07-28
    /// session (its client capabilities); `None` on older sessions.
    fn request_meta(&self, accepts: InputKinds) -> Option<rmcp::model::RequestMetaObject> {
        if !self.is_stateless() {
            return None;
        }
        let session = rmcp::ClientHandler::get_info(&self.client).capabilities;
        capabilities::declared(accepts, false, &session)
    }

    /// What the server declared it offers (`resources`, `prompts`,
    /// `completions`, `subscribe`, `listChanged`); empty before the
    /// handshake.
    #[must_use]
    pub fn server_capabilities(&self) -> ServerCapabilities {
        self.peers
            .peer_info()
            .map(|info| info.capabilities.clone())
            .unwrap_or_default()
    }

    /// Whether the session speaks protocol 2026-07-28 or later (no
    /// `initialize`; capabilities per request; `subscriptions/listen`
    /// instead of `resources/subscribe`).
    #[must_use]
    pub fn is_stateless(&self) -> bool {
        self.peers.is_stateless()
    }

    /// What is taken out of what the server sends back: configured
    /// credentials and live tokens.
    #[must_use]
    pub fn redaction(&self) -> &Redaction {
        &self.redaction
    }

    /// Whether results (and so resource contents and prompt messages) are
    /// redacted too (`servers[].redact_results`).
    #[must_use]
    pub fn redacts_results(&self) -> bool {
        self.redact_results
    }
}
