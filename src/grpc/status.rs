//! The one place where gateway errors become gRPC statuses.
//!
//! Every status carries `google.rpc.ErrorInfo` (domain `toolgate`, a stable
//! `reason`, and `server`/`tool` metadata where known); retryable failures
//! also carry `google.rpc.RetryInfo`. The table is documented in
//! `docs/errors.md`; keep the two in step.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::calls::classify;
use crate::calls::error::{CallError, quoted};
use crate::credentials::{MAX_STATUS_MESSAGE, bounded};
use crate::upstream::{UpstreamError, truncate};

/// The `ErrorInfo.domain` of every toolgate error.
pub const DOMAIN: &str = "toolgate";

/// The RPC that carries a server's questions to a worker (named in the
/// metadata of INPUT_REQUIRES_INTERACTIVE).
const INTERACTIVE_RPC: &str = "toolgate.v1.ToolGateway/InvokeToolInteractive";

/// How long a client should wait before retrying an unavailable server.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// How long a client should wait after a concurrency limit shed its call.
const SHED_RETRY_DELAY: Duration = Duration::from_millis(100);

/// The message a caller sees ([`crate::calls::caller_message`]).
fn message(error: &CallError) -> String {
    crate::calls::caller_message(error)
}

fn metadata(error: &CallError) -> HashMap<String, String> {
    let mut metadata = HashMap::new();
    match error {
        CallError::ToolNotFound { name } => {
            metadata.insert("tool".to_owned(), quoted(name).into_owned());
        }
        CallError::ToolNotPermitted { tool } => {
            metadata.insert("tool".to_owned(), tool.clone());
        }
        CallError::AuthorizationRequired {
            server, tool, url, ..
        } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert("authorization_url".to_owned(), url.clone());
        }
        CallError::StateUnavailable { server, .. }
        | CallError::TaskNotKept { server, .. }
        | CallError::ConsentNotYours {
            server: Some(server),
            ..
        } => {
            metadata.insert("server".to_owned(), server.clone());
        }
        CallError::ConsentNotYours { server: None, .. } => {}
        CallError::DefinitionNotApproved {
            server,
            tool,
            definition_hash,
            approved_hash,
        } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert("definition_hash".to_owned(), definition_hash.clone());
            if let Some(approved) = approved_hash {
                metadata.insert("approved_hash".to_owned(), approved.clone());
            }
        }
        CallError::ResponseTooLarge {
            server,
            tool,
            limit,
            ..
        } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert("limit".to_owned(), "limits.max_message_bytes".to_owned());
            metadata.insert("limit_value".to_owned(), limit.to_string());
        }
        CallError::InvalidArguments { tool, .. } => {
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
        }
        CallError::ArgumentsTooLarge { tool, limit, .. } => {
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert("limit".to_owned(), "limits.max_argument_bytes".to_owned());
            metadata.insert("limit_value".to_owned(), limit.to_string());
        }
        CallError::Shed(shed, server) => {
            if let Some(server) = server {
                metadata.insert("server".to_owned(), server.clone());
            }
            let (limit, value) = match shed {
                crate::registry::limits::Shed::Rate(_) => ("limits.rate_per_second", None),
                crate::registry::limits::Shed::TenantConcurrency(n) => {
                    ("limits.max_concurrent_calls", Some(n))
                }
                crate::registry::limits::Shed::ServerConcurrency(n) => {
                    ("max_concurrent_calls", Some(n))
                }
                crate::registry::limits::Shed::SubjectRate(_) => {
                    ("limits.per_subject.rate_per_second", None)
                }
                crate::registry::limits::Shed::SubjectConcurrency(n) => {
                    ("limits.per_subject.max_concurrent_calls", Some(n))
                }
            };
            metadata.insert("limit".to_owned(), limit.to_owned());
            if let Some(value) = value {
                metadata.insert("limit_value".to_owned(), value.to_string());
            }
        }
        CallError::CircuitOpen {
            server,
            tool,
            retry_after,
            ..
        } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert(
                "retry_after_ms".to_owned(),
                retry_after.as_millis().max(1).to_string(),
            );
        }
        CallError::ServerUnavailable { server, tool, .. }
        | CallError::DeadlineExceeded { server, tool, .. } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
        }
        CallError::Upstream {
            server,
            tool,
            error,
            ..
        } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            if let UpstreamError::JsonRpc { code, .. } = error {
                metadata.insert("jsonrpc_code".to_owned(), code.to_string());
            }
            if let UpstreamError::MissingCapability { required, .. } = error {
                metadata.insert(
                    "jsonrpc_code".to_owned(),
                    crate::upstream::MISSING_REQUIRED_CLIENT_CAPABILITY.to_string(),
                );
                metadata.insert("required_capabilities".to_owned(), required.join(","));
            }
            if let UpstreamError::TooLarge(max) = error {
                metadata.insert("limit".to_owned(), "limits.max_result_bytes".to_owned());
                metadata.insert("limit_value".to_owned(), max.to_string());
            }
            match error {
                UpstreamError::InputRequiresInteractive(kind) => {
                    metadata.insert("rpc".to_owned(), INTERACTIVE_RPC.to_owned());
                    metadata.insert("kind".to_owned(), kind.as_str().to_owned());
                }
                UpstreamError::InputAnswerTimeout(after) => {
                    metadata.insert(
                        "limit".to_owned(),
                        "servers[].input.answer_timeout".to_owned(),
                    );
                    metadata.insert(
                        "limit_value".to_owned(),
                        humantime::format_duration(*after).to_string(),
                    );
                }
                UpstreamError::InputRoundsExceeded(max) => {
                    metadata.insert("limit".to_owned(), "servers[].input.max_rounds".to_owned());
                    metadata.insert("limit_value".to_owned(), max.to_string());
                }
                _ => {}
            }
        }
        CallError::PlanOutdated {
            tool,
            current_version,
            current_hash,
            ..
        } => {
            metadata.insert("tool".to_owned(), tool.clone());
            metadata.insert(
                "current_catalog_version".to_owned(),
                current_version.clone(),
            );
            if !current_hash.is_empty() {
                metadata.insert("current_definition_hash".to_owned(), current_hash.clone());
            }
        }
        CallError::InputNotAccepted {
            server,
            tool,
            kinds,
        } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert("kinds".to_owned(), kinds.join(","));
            metadata.insert("field".to_owned(), "accepts_input".to_owned());
        }
        CallError::InputRoundsExceeded {
            server,
            tool,
            limit,
        } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert("limit".to_owned(), "servers[].input.max_rounds".to_owned());
            metadata.insert("limit_value".to_owned(), limit.to_string());
        }
        CallError::RequestStateRefused { tool, .. } => {
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert("field".to_owned(), "request_state".to_owned());
        }
        CallError::Token(
            crate::callers::TokenError::KeyUnknown { issuer }
            | crate::callers::TokenError::KeysUnavailable { issuer, .. },
        ) => {
            metadata.insert("issuer".to_owned(), issuer.clone());
        }
        CallError::ServerNotFound { server }
        | CallError::Unsupported { server, .. }
        | CallError::PageTokenExpired { server }
        | CallError::ServerRemoved { server } => {
            metadata.insert("server".to_owned(), server.clone());
        }
        CallError::NotPermitted { server, target } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(target.metadata_key().to_owned(), target.name.clone());
        }
        CallError::ResourceNotFound { server, uri } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert("uri".to_owned(), uri.clone());
        }
        CallError::PromptNotFound { name } => {
            metadata.insert("prompt".to_owned(), name.clone());
        }
        CallError::SkillNotFound { name } => {
            metadata.insert("skill".to_owned(), name.clone());
        }
        CallError::SkillDefinitionChanged {
            skill,
            current_hash,
            ..
        } => {
            metadata.insert("skill".to_owned(), skill.clone());
            metadata.insert("current_definition_hash".to_owned(), current_hash.clone());
        }
        CallError::SkillMismatch {
            server, skill, uri, ..
        } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert("skill".to_owned(), skill.clone());
            metadata.insert("uri".to_owned(), truncate(uri, 1024));
        }
        CallError::SkillFileNotListed { skill, path } => {
            metadata.insert("skill".to_owned(), skill.clone());
            metadata.insert("path".to_owned(), path.clone());
        }
        CallError::CallNotPermitted { target, rule, .. } => {
            metadata.insert(target.metadata_key().to_owned(), target.name.clone());
            metadata.insert("rule".to_owned(), rule.clone());
        }
        CallError::ApprovalPending {
            tool,
            approval_id,
            rule,
            expires_at_ms,
        } => {
            metadata.insert("tool".to_owned(), tool.clone());
            metadata.insert("approval_id".to_owned(), approval_id.clone());
            metadata.insert("rule".to_owned(), rule.clone());
            metadata.insert("expires_at_unix_ms".to_owned(), expires_at_ms.to_string());
        }
        CallError::ApprovalDenied { approval_id, .. }
        | CallError::ApprovalExpired { approval_id, .. }
        | CallError::ApprovalSpent { approval_id }
        | CallError::ApprovalMismatch { approval_id, .. }
        | CallError::ApprovalNotFound { approval_id }
        | CallError::NotApprover { approval_id, .. }
        | CallError::ApprovalDecided { approval_id, .. } => {
            metadata.insert("approval_id".to_owned(), approval_id.clone());
        }
        CallError::ApprovalReasonTooLong { limit } => {
            metadata.insert("field".to_owned(), "reason".to_owned());
            metadata.insert("limit_value".to_owned(), limit.to_string());
        }
        CallError::ApprovalLimit { limit } => {
            metadata.insert(
                "limit".to_owned(),
                "call_approvals.max_pending_per_subject".to_owned(),
            );
            metadata.insert("limit_value".to_owned(), limit.to_string());
        }
        CallError::PromptDefinitionChanged {
            prompt,
            current_hash,
            ..
        } => {
            metadata.insert("prompt".to_owned(), prompt.clone());
            metadata.insert("current_definition_hash".to_owned(), current_hash.clone());
        }
        CallError::WatchLimit { limit } => {
            metadata.insert("limit".to_owned(), "limits.max_watches".to_owned());
            metadata.insert("limit_value".to_owned(), limit.to_string());
        }
        CallError::InvalidPageToken(_) => {
            metadata.insert("field".to_owned(), "page_token".to_owned());
        }
        CallError::InvalidCompletion(_) => {}
        CallError::McpRequestInvalid(_) => {}
        CallError::RoutingHeaderMismatch { header, .. } => {
            metadata.insert("header".to_owned(), (*header).to_owned());
        }
        CallError::InvalidUri(error) => {
            let field = if error.of_template() {
                "uri_template"
            } else {
                "uri"
            };
            metadata.insert("field".to_owned(), field.to_owned());
            metadata.insert("refused".to_owned(), error.kind().to_owned());
        }
        CallError::Unauthenticated(_)
        | CallError::Token(_)
        | CallError::Certificate(_)
        | CallError::ShuttingDown { .. }
        | CallError::AuditUnavailable { .. }
        | CallError::Draining
        | CallError::ApprovalStoreUnavailable { .. }
        | CallError::Reloading
        | CallError::TenantStoreUnavailable(_)
        | CallError::InvalidName { .. }
        | CallError::InvalidSubject(_)
        | CallError::ConsentCodeInvalid
        | CallError::ConsentStoreUnavailable(_)
        | CallError::InvalidFilter(_)
        | CallError::InputResponseInvalid { .. }
        | CallError::TaskNotFound
        | CallError::TaskFinished { .. }
        | CallError::InteractiveFirstMessage(_) => {}
        CallError::TaskElsewhere { server } => {
            metadata.insert("server".to_owned(), server.clone());
        }
        CallError::Keyed(refusal) => refusal.metadata(&mut metadata),
        CallError::Replayed(status) => {
            metadata.insert("call_id".to_owned(), status.call_id.clone());
            metadata.insert("replayed".to_owned(), "true".to_owned());
        }
        CallError::TaskLimit { server, limit } => {
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert("limit_value".to_owned(), limit.to_string());
        }
        // Guards.
        CallError::GuardDenied {
            guard,
            phase,
            tool,
            server,
            reason,
        } => {
            metadata.insert("guard".to_owned(), guard.clone());
            metadata.insert("phase".to_owned(), (*phase).to_owned());
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
            metadata.insert("guard_reason".to_owned(), reason.clone());
        }
        CallError::GuardUnavailable {
            guard,
            phase,
            tool,
            server,
            ..
        } => {
            metadata.insert("guard".to_owned(), guard.clone());
            metadata.insert("phase".to_owned(), (*phase).to_owned());
            metadata.insert("server".to_owned(), server.clone());
            metadata.insert(tool.metadata_key().to_owned(), tool.name.clone());
        }
    }
    metadata
}

/// Logs what a worker is not told of `error`: an upstream JSON-RPC
/// error's message.
fn log_withheld(error: &CallError) {
    if let CallError::Upstream {
        server,
        tool,
        error: UpstreamError::JsonRpc { code, message },
        ..
    } = error
    {
        tracing::warn!(%server, %tool, code, message = %truncate(message, 2000), "upstream JSON-RPC error");
    }
}

/// What a worker is told of `error`, exactly as the message of its status
/// (an upstream JSON-RPC error's text withheld but for invalid params,
/// and logged): for the `status_message` of a task that failed with it.
pub(crate) fn worker_message(error: &CallError) -> String {
    log_withheld(error);
    bounded(&message(error), MAX_STATUS_MESSAGE)
}

impl From<CallError> for Status {
    fn from(error: CallError) -> Status {
        log_withheld(&error);
        let (code, reason) = classify(&error);
        let mut details = ErrorDetails::with_error_info(reason, DOMAIN, metadata(&error));
        // RetryInfo where a retry is safe: a limit shed the call, or the
        // code is UNAVAILABLE, which the table gives only when nothing
        // reached the upstream (or the tool is idempotent). A call that may
        // have acted is UNKNOWN, without RetryInfo.
        let retry = match &error {
            CallError::Shed(
                crate::registry::limits::Shed::Rate(wait)
                | crate::registry::limits::Shed::SubjectRate(wait),
                _,
            ) => Some((*wait).max(Duration::from_millis(1))),
            CallError::Shed(..) => Some(SHED_RETRY_DELAY),
            // Until the breaker lets a probe through.
            CallError::CircuitOpen { retry_after, .. } => {
                Some((*retry_after).max(Duration::from_millis(1)))
            }
            _ if code == Code::Unavailable => Some(RETRY_DELAY),
            _ => None,
        };
        if let Some(delay) = retry {
            details.set_retry_info(Some(delay));
        }
        let message = bounded(&message(&error), MAX_STATUS_MESSAGE);
        Status::with_error_details(code, message, details)
    }
}

/// Rewrites tonic's answer to a request message over the size limit
/// (OUT_OF_RANGE, "decoded message length too large") as RESOURCE_EXHAUSTED
/// naming the limit, like every other limit. A tower response layer: the
/// message is refused while decoding, before any handler runs.
pub fn oversized_message<B>(mut response: http::Response<B>, limit: usize) -> http::Response<B> {
    let headers = response.headers();
    let oversized = headers.get("grpc-status").and_then(|v| v.to_str().ok()) == Some(OUT_OF_RANGE)
        && headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|m| {
                m.contains("message%20length%20too%20large")
                    || m.contains("message length too large")
            });
    if oversized {
        let status = Status::resource_exhausted(format!(
            "the request message is over limits.max_message_bytes ({limit} bytes)"
        ));
        let headers = response.headers_mut();
        headers.remove("grpc-message");
        headers.remove("grpc-status");
        let _ = status.add_header(headers);
    }
    response
}

/// `grpc-status` of OUT_OF_RANGE.
const OUT_OF_RANGE: &str = "11";
