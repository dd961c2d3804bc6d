//! Why an upstream session or call failed. Messages never contain secrets:
//! transport errors are described by kind, not by the request they carried,
//! and every text that came from an upstream is redacted and bounded when
//! the error is built ([`UpstreamError::from_service`]).

use std::time::Duration;

use crate::credentials::Redaction;

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
    /// The MCP handshake failed (the server's text redacted and bounded).
    #[error("MCP handshake failed: {0}")]
    Handshake(String),
    /// Starting the session and listing its tools took too long.
    #[error("connecting took longer than {}", humantime::format_duration(*.0))]
    ConnectTimeout(Duration),
    /// Listing the tools failed (the server's text redacted and bounded).
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
    /// The transport failed: the connection refused, reset or lost, or an
    /// HTTP session id the server no longer knows. The session ends (the
    /// supervisor reconnects it). The text is redacted and bounded.
    #[error("transport error: {0}")]
    Transport(String),
    /// The request never reached a server that could act on it: the
    /// connection was refused, or the HTTP server answered that it does
    /// not know the session (404). Nothing ran, so a retry is safe; the
    /// session ends (the supervisor reconnects it).
    #[error("the request did not reach the server: {0}")]
    Unreachable(String),
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
    /// The server's address is one its tenant may not reach (a tenant of
    /// `tenants_dir` or of the admin API, and a private, loopback,
    /// link-local or metadata address `upstream_allow` does not allow):
    /// nothing was sent.
    #[error("server `{server}`: {reason}")]
    AddressRefused {
        /// The server's name.
        server: String,
        /// The address, its class and the setting that would allow it.
        reason: String,
    },
    /// The HTTP server refused the configured credentials.
    #[error("the server refused the gateway's credentials (HTTP 401/403)")]
    AuthRejected {
        /// The server's `WWW-Authenticate` challenge, when it sent one
        /// (redacted and bounded; used to refresh or step up an OAuth token).
        challenge: Option<String>,
    },
    /// The server acts for each end user and this subject has not
    /// authorized it (or its grant was revoked): consent at `url`.
    #[error("the subject must authorize the server first")]
    AuthorizationRequired {
        /// Where the end user consents.
        url: String,
    },
    /// The state store holding OAuth tokens cannot be reached: nothing was
    /// sent.
    #[error("the state store is unavailable: {0}")]
    StateUnavailable(String),
    /// An OAuth token could not be had (the authorization server refused or
    /// could not be reached): nothing was sent.
    #[error("no access token: {0}")]
    TokenFailed(String),
    /// The OAuth setup cannot give a token (settings that cannot work,
    /// failed discovery, a refused client, step-ups spent): retrying will
    /// not help until the configuration or the authorization server
    /// changes. Never contains a token or secret.
    #[error("no access token: {0}")]
    OAuthFailed(String),
    /// A delegation grant (`token_exchange`, `identity_assertion`) gave no
    /// token: the caller has no JWT, one of another issuer, or the token
    /// endpoint refused or could not be reached. Nothing was sent.
    #[error("no delegated token: {0}")]
    Delegation(crate::credentials::oauth::DelegationError),
    /// The request ran out of time; the server was sent a cancellation.
    #[error("no answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// The server answered with a JSON-RPC error.
    #[error("JSON-RPC error {code}: {message}")]
    JsonRpc {
        /// The JSON-RPC error code.
        code: i32,
        /// The server's message, redacted and bounded (logged; shown to
        /// callers only where they can act on it).
        message: String,
    },
    /// The server refused the request for want of client capabilities it
    /// needs (`-32021`, SEP-2133): elicitation or sampling the call's
    /// worker did not opt in to, or an extension. The tool did not get to
    /// ask anything.
    #[error("the server requires client capabilities not declared for this call: {}", .required.join(", "))]
    MissingCapability {
        /// What it named in `data.requiredCapabilities`: `form`, `url`,
        /// `sampling`, `roots`, or an extension's id; `unknown` when it
        /// named nothing toolgate knows.
        required: Vec<String>,
        /// The server's message, redacted and bounded.
        message: String,
    },
    /// The server answered something the protocol does not allow here
    /// (its text redacted and bounded).
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// The server asked the call's worker a question it opted in to, and
    /// only `InvokeToolInteractive` can carry it: the call was cancelled
    /// upstream and the server's request refused. (Tasks: a task toolgate
    /// followed went `input_required` for a call without an asker; the
    /// task was cancelled.)
    #[error("the server asked a {} question, which reaches a worker only over InvokeToolInteractive; the call was cancelled", .0.as_str())]
    InputRequiresInteractive(super::QuestionKind),
    /// The worker did not answer a question within
    /// `servers[].input.answer_timeout`: the call was cancelled.
    #[error("the worker did not answer the server's question within {} (servers[].input.answer_timeout); the call was cancelled", humantime::format_duration(*.0))]
    InputAnswerTimeout(Duration),
    /// The server kept asking beyond `servers[].input.max_rounds`.
    #[error("the server asked more than {0} rounds of questions (servers[].input.max_rounds)")]
    InputRoundsExceeded(u32),
    /// The worker went away while it was asked (its stream closed).
    #[error("the worker went away while the server's question was pending")]
    InputAbandoned,
    /// The server asked for client input (elicitation, sampling) or started
    /// a task, which the gateway cannot provide or follow.
    #[error("the server asked for {0}, which the gateway does not support")]
    Unsupported(&'static str),
    /// The server runs the tool only as a task and refused the call because
    /// the tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) was
    /// not declared (JSON-RPC `-32021`): the tool did not run.
    #[error(
        "the server runs this tool only as a task, and the tasks extension could not be declared for it"
    )]
    TasksRequired,
    /// The task the call became was cancelled on the server.
    #[error("the server cancelled the task")]
    TaskCancelled,
}

impl UpstreamError {
    /// Maps an rmcp request error. Every text that came from the upstream
    /// (a JSON-RPC message, an HTTP error body, a transport error) is
    /// redacted and bounded here, so no later use (status, `ServerStatus`,
    /// log, span) can leak a credential or carry an unbounded text.
    pub(crate) fn from_service(error: rmcp::ServiceError, redaction: &Redaction) -> Self {
        use rmcp::ServiceError as E;
        if let Some(challenge) = error.auth_challenge() {
            return UpstreamError::AuthRejected {
                challenge: Some(redaction.upstream_text(challenge)),
            };
        }
        match error {
            // The stdio transport's answer for a result over the limit.
            E::McpError(data) if super::stdio::too_large_limit(&data).is_some() => {
                UpstreamError::TooLarge(super::stdio::too_large_limit(&data).unwrap_or_default())
            }
            E::McpError(data) if requires_tasks(&data) => UpstreamError::TasksRequired,
            E::McpError(data) if data.code.0 == MISSING_REQUIRED_CLIENT_CAPABILITY => {
                UpstreamError::MissingCapability {
                    required: required_capabilities(data.data.as_ref()),
                    message: redaction.upstream_text(&data.message),
                }
            }
            E::McpError(data) => UpstreamError::JsonRpc {
                code: data.code.0,
                message: redaction.upstream_text(&data.message),
            },
            E::TransportClosed => UpstreamError::Closed,
            E::TransportSend(e) => from_transport(e.error.as_ref(), redaction),
            E::Timeout { timeout } => UpstreamError::Timeout(timeout),
            E::Cancelled { .. } => UpstreamError::Closed,
            E::UnexpectedResponse => {
                UpstreamError::Protocol("a response of the wrong type".to_owned())
            }
            E::InputRequiredRoundsExceeded { .. } => UpstreamError::Unsupported("client input"),
            other => UpstreamError::Protocol(redaction.upstream_text(&other.to_string())),
        }
    }

    /// Whether no credential could be had for the server (no consent yet,
    /// the state store down, the token endpoint failing): nothing was sent.
    pub(crate) fn is_credential_failure(&self) -> bool {
        matches!(
            self,
            UpstreamError::AuthorizationRequired { .. }
                | UpstreamError::StateUnavailable(_)
                | UpstreamError::TokenFailed(_)
                | UpstreamError::OAuthFailed(_)
                | UpstreamError::Delegation(_)
        )
    }

    /// Whether the error ends the session: the transport itself failed (the
    /// connection refused, reset or lost; an HTTP session id the server no
    /// longer knows), so nothing more can be sent on it. An HTTP error
    /// status answered to one request, a JSON-RPC error or a malformed
    /// answer fail that request only.
    pub(crate) fn ends_session(&self) -> bool {
        matches!(
            self,
            UpstreamError::Transport(_) | UpstreamError::Unreachable(_)
        )
    }
}

/// Maps a transport's failure to send a request (and, over HTTP, to read
/// its answer).
fn from_transport(
    error: &(dyn std::error::Error + 'static),
    redaction: &Redaction,
) -> UpstreamError {
    use rmcp::transport::streamable_http_client::StreamableHttpError as H;
    let Some(http) = find::<H<reqwest::Error>>(error) else {
        // stdio: writing to the child failed.
        return UpstreamError::Transport(redaction.upstream_text(&root_cause(error)));
    };
    match http {
        H::ResponseBodyTooLarge { max_size } => UpstreamError::TooLarge(*max_size),
        H::HttpStatus(status) => http_status(status.status, "", redaction),
        H::UnexpectedServerResponse(text) => match split_status(text) {
            Some((status, body)) => http_status(status, body, redaction),
            None => UpstreamError::Protocol(redaction.upstream_text(text)),
        },
        H::AuthRequired(_) | H::InsufficientScope(_) => UpstreamError::AuthRejected {
            challenge: http.auth_challenge().map(|c| redaction.upstream_text(c)),
        },
        H::SessionExpired => UpstreamError::Unreachable(
            "the server no longer knows the session (HTTP 404)".to_owned(),
        ),
        H::UnexpectedContentType(_) | H::Deserialize(_) => {
            UpstreamError::Protocol(redaction.upstream_text(&http.to_string()))
        }
        // The connection refused, reset or lost: the session is not usable
        // any more. reqwest's own text (its URL already removed) and the
        // cause under it, e.g. "error sending request: Connection refused".
        H::Client(e) => {
            let cause = root_cause(e);
            let text = if cause == e.to_string() {
                cause
            } else {
                format!("{e}: {cause}")
            };
            let text = redaction.upstream_text(&text);
            if e.is_connect() {
                // No connection: the request cannot have been delivered.
                UpstreamError::Unreachable(text)
            } else {
                UpstreamError::Transport(text)
            }
        }
        // A broken stream: the session is not usable any more either.
        _ => UpstreamError::Transport(redaction.upstream_text(&root_cause(error))),
    }
}

/// An HTTP error status answered to one request; 401/403 are the
/// credentials refused.
fn http_status(status: u16, body: &str, redaction: &Redaction) -> UpstreamError {
    match status {
        401 | 403 => UpstreamError::AuthRejected { challenge: None },
        _ => UpstreamError::HttpStatus {
            status,
            body: redaction.upstream_text(body.trim()),
        },
    }
}

/// The first error of type `T` in `error`'s source chain.
fn find<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

/// The innermost source of an error. rmcp's HTTP client error does not
/// name the reqwest error it wraps as its source, so the chain is
/// followed into it by hand (a TLS failure then reads `invalid peer
/// certificate: UnknownIssuer`, not `error sending request`).
pub(crate) fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let mut current = error;
    loop {
        if let Some(StreamableHttpError::Client(inner)) =
            current.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            current = inner;
        } else if let Some(source) = current.source() {
            current = source;
        } else {
            return current.to_string();
        }
    }
}

/// The JSON-RPC code of a request refused for want of a client capability
/// (SEP-2133).
pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i32 = -32021;

/// The capabilities a `-32021` error's `data.requiredCapabilities` names,
/// in toolgate's words (`form`, `url`, `sampling`, `roots`, extension ids).
fn required_capabilities(data: Option<&serde_json::Value>) -> Vec<String> {
    let mut required = Vec::new();
    let Some(caps) = data
        .and_then(|d| d.get("requiredCapabilities"))
        .and_then(serde_json::Value::as_object)
    else {
        return vec!["unknown".to_owned()];
    };
    if let Some(elicitation) = caps.get("elicitation") {
        let has = |mode: &str| elicitation.get(mode).is_some();
        // A bare `elicitation: {}` means form (as before modes existed).
        if has("form") || !has("url") {
            required.push("form".to_owned());
        }
        if has("url") {
            required.push("url".to_owned());
        }
    }
    for kind in ["sampling", "roots"] {
        if caps.contains_key(kind) {
            required.push(kind.to_owned());
        }
    }
    if let Some(extensions) = caps
        .get("extensions")
        .and_then(serde_json::Value::as_object)
    {
        required.extend(extensions.keys().cloned());
    }
    if required.is_empty() {
        required.push("unknown".to_owned());
    }
    required
}

/// Whether a JSON-RPC error is the server's refusal of a call that did not
/// declare the tasks extension: `-32021` (missing required client
/// capability) whose `data.requiredCapabilities.extensions` names it.
pub(super) fn requires_tasks(error: &rmcp::model::ErrorData) -> bool {
    error.code == rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        && error
            .data
            .as_ref()
            .and_then(|data| data.get("requiredCapabilities"))
            .and_then(|required| required.get("extensions"))
            .and_then(serde_json::Value::as_object)
            .is_some_and(|extensions| extensions.contains_key(rmcp::model::TASKS_EXTENSION_ID))
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

#[cfg(test)]
mod missing_capability_tests {
    use super::required_capabilities;
    use serde_json::json;

    #[test]
    fn the_required_capabilities_are_named() {
        let named = |data| required_capabilities(Some(&data));
        assert_eq!(
            named(json!({"requiredCapabilities": {"elicitation": {"form": {}}}})),
            ["form"]
        );
        assert_eq!(
            named(json!({"requiredCapabilities": {"elicitation": {}}})),
            ["form"]
        );
        assert_eq!(
            named(json!({"requiredCapabilities": {"elicitation": {"url": {}}, "sampling": {}}})),
            ["url", "sampling"]
        );
        assert_eq!(
            named(
                json!({"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}})
            ),
            ["io.modelcontextprotocol/tasks"]
        );
        assert_eq!(required_capabilities(None), ["unknown"]);
    }
}

#[cfg(test)]
mod classification_tests {
    use rmcp::model::{ErrorCode, ErrorData, TASKS_EXTENSION_ID};
    use serde_json::Value;

    use super::*;

    #[test]
    fn only_a_refusal_naming_the_tasks_extension_requires_tasks() {
        let refusal = |data: Value| {
            ErrorData::new(
                ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
                "Tool 'slow_report' requires the tasks extension",
                Some(data),
            )
        };
        assert!(requires_tasks(&refusal(serde_json::json!({
            "requiredCapabilities": {"extensions": {TASKS_EXTENSION_ID: {}}}
        }))));
        assert!(!requires_tasks(&refusal(serde_json::json!({
            "requiredCapabilities": {"elicitation": {}}
        }))));
        let other = ErrorData::new(
            ErrorCode::INVALID_PARAMS,
            "x",
            Some(serde_json::json!({
                "requiredCapabilities": {"extensions": {TASKS_EXTENSION_ID: {}}}
            })),
        );
        assert!(!requires_tasks(&other));
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
