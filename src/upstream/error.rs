//! Why an upstream session or call failed. Messages never contain secrets:
//! transport errors are described by kind, not by the request they carried.

use std::time::Duration;

/// A failure to start a session or to complete a request on one.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The stdio program could not be started.
    #[error("cannot start `{program}`: {reason}")]
    Spawn {
        /// The configured program.
        program: String,
        /// Why, e.g. "not found on the gateway's PATH".
        reason: String,
    },
    /// The MCP handshake failed.
    #[error("MCP handshake failed: {0}")]
    Handshake(String),
    /// Starting the session and listing its tools took too long.
    #[error("connecting took longer than {}", humantime::format_duration(*.0))]
    ConnectTimeout(Duration),
    /// Listing the tools failed.
    #[error("tools/list failed: {0}")]
    ListTools(String),
    /// The server kept paging beyond the configured bound.
    #[error("tools/list returned more than {0} pages (raise max_list_pages if this is real)")]
    TooManyPages(u32),
    /// The server returned a cursor it had returned before.
    #[error("tools/list repeated the cursor of an earlier page; the listing would never end")]
    RepeatedCursor,
    /// The session was already gone when the call came: nothing was sent,
    /// so a retry is safe.
    #[error("the session is closed")]
    Closed,
    /// The session ended while the request was in flight: the server may
    /// or may not have acted on it.
    #[error("the session ended while the request was in flight; the server may have acted on it")]
    Lost,
    /// Sending on the transport failed.
    #[error("transport error: {0}")]
    Transport(String),
    /// The server's answer is larger than `limits.max_result_bytes`.
    #[error("the server's answer exceeds limits.max_result_bytes ({0} bytes)")]
    TooLarge(usize),
    /// The HTTP server answered this one request with an error status. The
    /// session stays up: only session-level failures (its session id
    /// unknown, the connection lost) end a session. `body` is redacted and
    /// bounded.
    #[error("the server answered HTTP {status}: {body}")]
    HttpStatus {
        /// The HTTP status code.
        status: u16,
        /// The start of the response body, credentials redacted.
        body: String,
    },
    /// The HTTP server refused the configured credentials.
    #[error("the server refused the gateway's credentials (HTTP 401/403)")]
    AuthRejected,
    /// The request ran out of time; the server was sent a cancellation.
    #[error("no answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// The server answered with a JSON-RPC error.
    #[error("JSON-RPC error {code}: {message}")]
    JsonRpc {
        /// The JSON-RPC error code.
        code: i32,
        /// The server's message (logged; shown to callers only where they
        /// can act on it).
        message: String,
    },
    /// The server answered something the protocol does not allow here.
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// The server asked for client input (elicitation, sampling) or started
    /// a task, which the gateway cannot provide or follow.
    #[error("the server asked for {0}, which the gateway does not support")]
    Unsupported(&'static str),
}

impl UpstreamError {
    /// Maps an rmcp request error.
    pub(crate) fn from_service(error: rmcp::ServiceError) -> Self {
        use rmcp::ServiceError as E;
        if error.auth_challenge().is_some() {
            return UpstreamError::AuthRejected;
        }
        match error {
            E::McpError(data) => UpstreamError::JsonRpc {
                code: data.code.0,
                message: data.message.into_owned(),
            },
            E::TransportClosed => UpstreamError::Closed,
            E::TransportSend(e) => {
                let text = root_cause(e.error.as_ref());
                match too_large(e.error.as_ref()) {
                    Some(max) => UpstreamError::TooLarge(max),
                    None => UpstreamError::Transport(text),
                }
            }
            E::Timeout { timeout } => UpstreamError::Timeout(timeout),
            E::Cancelled { .. } => UpstreamError::Closed,
            E::UnexpectedResponse => {
                UpstreamError::Protocol("a response of the wrong type".to_owned())
            }
            E::InputRequiredRoundsExceeded { .. } => UpstreamError::Unsupported("client input"),
            other => UpstreamError::Protocol(other.to_string()),
        }
    }
}

/// The innermost source of an error.
pub(crate) fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}

/// The byte limit, when the error is an HTTP response over the size cap.
fn too_large(error: &(dyn std::error::Error + 'static)) -> Option<usize> {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(StreamableHttpError::<reqwest::Error>::ResponseBodyTooLarge { max_size }) =
            e.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            return Some(*max_size);
        }
        current = e.source();
    }
    None
}
