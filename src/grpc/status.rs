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

use crate::credentials::oauth::DelegationFailure;
use crate::credentials::{MAX_STATUS_MESSAGE, bounded};
use crate::grpc::error::{CallError, quoted};
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

/// JSON-RPC error codes (JSON-RPC 2.0 and MCP).
mod jsonrpc {
    pub(super) const PARSE_ERROR: i32 = -32700;
    pub(super) const INVALID_REQUEST: i32 = -32600;
    pub(super) const METHOD_NOT_FOUND: i32 = -32601;
    pub(super) const INVALID_PARAMS: i32 = -32602;
    pub(super) const INTERNAL_ERROR: i32 = -32603;
    pub(super) const RESOURCE_NOT_FOUND: i32 = -32002;
    pub(super) const URL_ELICITATION_REQUIRED: i32 = -32042;
}

/// The status code and stable reason of an error.
pub fn classify(error: &CallError) -> (Code, &'static str) {
    match error {
        CallError::Unauthenticated(_) => (Code::Unauthenticated, "UNAUTHENTICATED"),
        CallError::ToolNotFound { .. } => (Code::NotFound, "TOOL_NOT_FOUND"),
        CallError::ToolNotPermitted { .. } => (Code::PermissionDenied, "TOOL_NOT_PERMITTED"),
        CallError::DefinitionNotApproved { .. } => {
            (Code::FailedPrecondition, "DEFINITION_NOT_APPROVED")
        }
        CallError::InvalidArguments { .. } => (Code::InvalidArgument, "INVALID_ARGUMENTS"),
        CallError::InvalidName { .. } => (Code::InvalidArgument, "INVALID_TOOL_NAME"),
        CallError::InvalidSubject(_) => (Code::InvalidArgument, "INVALID_SUBJECT"),
        CallError::Token(token) => classify_token(token),
        CallError::Certificate(cert) => classify_certificate(cert),
        CallError::AuthorizationRequired { .. } => {
            (Code::FailedPrecondition, "UPSTREAM_AUTHORIZATION_REQUIRED")
        }
        CallError::StateUnavailable { .. } => (Code::Unavailable, "STATE_UNAVAILABLE"),
        CallError::TaskNotKept { idempotent, .. } => {
            (in_doubt(true, *idempotent), "STATE_UNAVAILABLE")
        }
        CallError::ConsentCodeInvalid => (Code::InvalidArgument, "CONSENT_CODE_INVALID"),
        CallError::ConsentStoreUnavailable(_) => (Code::Unavailable, "STATE_UNAVAILABLE"),
        CallError::ConsentNotYours { .. } => (Code::PermissionDenied, "CONSENT_SUBJECT_MISMATCH"),
        CallError::Reloading => (Code::Unavailable, "RELOADING"),
        CallError::TenantStoreUnavailable(_) => (Code::Unavailable, "TENANT_STORE_UNAVAILABLE"),
        CallError::ResponseTooLarge { .. } => (Code::ResourceExhausted, "RESULT_TOO_LARGE"),
        CallError::ServerUnavailable { .. } => (Code::Unavailable, "UPSTREAM_UNAVAILABLE"),
        CallError::DeadlineExceeded { .. } => (Code::DeadlineExceeded, "DEADLINE_EXCEEDED"),
        CallError::ShuttingDown { sent, idempotent } => {
            (in_doubt(*sent, *idempotent), "SHUTTING_DOWN")
        }
        CallError::Draining => (Code::Unavailable, "DRAINING"),
        CallError::AuditUnavailable { sent, idempotent } => {
            (in_doubt(*sent, *idempotent), "AUDIT_UNAVAILABLE")
        }
        CallError::InvalidFilter(_) => (Code::InvalidArgument, "INVALID_FILTER"),
        CallError::InputResponseInvalid { .. } => (Code::InvalidArgument, "INPUT_RESPONSE_INVALID"),
        CallError::InputNotAccepted { .. } => (Code::FailedPrecondition, "INPUT_NOT_ACCEPTED"),
        CallError::InputRoundsExceeded { .. } => (Code::ResourceExhausted, "INPUT_ROUNDS_EXCEEDED"),
        CallError::RequestStateRefused { refusal, .. } => {
            use crate::grpc::error::StateRefusal;
            match refusal {
                StateRefusal::Invalid => (Code::InvalidArgument, "REQUEST_STATE_INVALID"),
                StateRefusal::KeyRetired => (Code::FailedPrecondition, "REQUEST_STATE_KEY_RETIRED"),
                StateRefusal::Foreign => (Code::InvalidArgument, "REQUEST_STATE_FOREIGN"),
                StateRefusal::OtherCall => (Code::InvalidArgument, "REQUEST_STATE_OTHER_CALL"),
                StateRefusal::Expired => (Code::FailedPrecondition, "REQUEST_STATE_EXPIRED"),
                StateRefusal::Used => (Code::FailedPrecondition, "REQUEST_STATE_USED"),
            }
        }
        CallError::TaskNotFound => (Code::NotFound, "TASK_NOT_FOUND"),
        CallError::TaskFinished { .. } => (Code::FailedPrecondition, "TASK_FINISHED"),
        CallError::TaskElsewhere { .. } => (Code::Unavailable, "TASK_ELSEWHERE"),
        CallError::TaskLimit { .. } => (Code::ResourceExhausted, "TASK_LIMIT"),
        CallError::InteractiveFirstMessage(_) => {
            (Code::InvalidArgument, "INTERACTIVE_FIRST_MESSAGE")
        }
        CallError::PlanOutdated { pin, .. } => (
            Code::FailedPrecondition,
            match pin {
                crate::grpc::error::Pin::DefinitionChanged => "TOOL_DEFINITION_CHANGED",
                crate::grpc::error::Pin::Gone => "TOOL_GONE",
                crate::grpc::error::Pin::VersionUnknown => "CATALOG_VERSION_UNKNOWN",
            },
        ),
        CallError::ArgumentsTooLarge { .. } => (Code::ResourceExhausted, "ARGUMENTS_TOO_LARGE"),
        CallError::Shed(shed, _) => match shed {
            crate::registry::limits::Shed::Rate(_) => (Code::ResourceExhausted, "RATE_LIMITED"),
            crate::registry::limits::Shed::TenantConcurrency(_) => {
                (Code::ResourceExhausted, "TENANT_CONCURRENCY_LIMIT")
            }
            crate::registry::limits::Shed::ServerConcurrency(_) => {
                (Code::ResourceExhausted, "SERVER_CONCURRENCY_LIMIT")
            }
            crate::registry::limits::Shed::SubjectRate(_) => {
                (Code::ResourceExhausted, "SUBJECT_RATE_LIMITED")
            }
            crate::registry::limits::Shed::SubjectConcurrency(_) => {
                (Code::ResourceExhausted, "SUBJECT_CONCURRENCY_LIMIT")
            }
        },
        CallError::Upstream {
            error, idempotent, ..
        } => classify_upstream(error, *idempotent),
        CallError::ServerNotFound { .. } => (Code::NotFound, "SERVER_NOT_FOUND"),
        CallError::Unsupported { feature, .. } => {
            use crate::grpc::error::Feature;
            (
                Code::FailedPrecondition,
                match feature {
                    Feature::Resources => "RESOURCES_UNSUPPORTED",
                    Feature::Prompts => "PROMPTS_UNSUPPORTED",
                    Feature::Completions => "COMPLETION_UNSUPPORTED",
                    Feature::Subscriptions => "SUBSCRIBE_UNSUPPORTED",
                },
            )
        }
        CallError::PromptNotFound { .. } => (Code::NotFound, "PROMPT_NOT_FOUND"),
        CallError::InvalidCompletion(_) => (Code::InvalidArgument, "INVALID_COMPLETION"),
        CallError::InvalidUri(_) => (Code::InvalidArgument, "INVALID_RESOURCE_URI"),
        CallError::NotPermitted { target, .. } => (
            Code::PermissionDenied,
            match target.kind {
                crate::grpc::error::TargetKind::Prompt => "PROMPT_NOT_PERMITTED",
                crate::grpc::error::TargetKind::Tool => "TOOL_NOT_PERMITTED",
                crate::grpc::error::TargetKind::Resource
                | crate::grpc::error::TargetKind::Template => "RESOURCE_NOT_PERMITTED",
            },
        ),
        CallError::ResourceNotFound { .. } => (Code::NotFound, "RESOURCE_NOT_FOUND"),
        CallError::PromptDefinitionChanged { .. } => {
            (Code::FailedPrecondition, "PROMPT_DEFINITION_CHANGED")
        }
        CallError::InvalidPageToken(_) => (Code::InvalidArgument, "INVALID_PAGE_TOKEN"),
        CallError::PageTokenExpired { .. } => (Code::FailedPrecondition, "PAGE_TOKEN_EXPIRED"),
        CallError::WatchLimit { .. } => (Code::ResourceExhausted, "WATCH_LIMIT"),
        CallError::ServerRemoved { .. } => (Code::NotFound, "SERVER_REMOVED"),
        // Guards.
        CallError::GuardDenied { .. } => (Code::PermissionDenied, "GUARD_DENIED"),
        CallError::GuardUnavailable {
            sent, idempotent, ..
        } => (in_doubt(*sent, *idempotent), "GUARD_UNAVAILABLE"),
    }
}

/// A refused JWT is UNAUTHENTICATED with a reason per check; keys that
/// cannot be loaded are UNAVAILABLE (nothing is known of the token yet: a
/// retry may succeed).
fn classify_token(error: &crate::callers::TokenError) -> (Code, &'static str) {
    use crate::callers::TokenError;
    match error {
        TokenError::Expired => (Code::Unauthenticated, "TOKEN_EXPIRED"),
        TokenError::NotYetValid => (Code::Unauthenticated, "TOKEN_NOT_YET_VALID"),
        TokenError::Audience => (Code::Unauthenticated, "TOKEN_AUDIENCE"),
        TokenError::Issuer => (Code::Unauthenticated, "TOKEN_ISSUER"),
        TokenError::KeyUnknown { .. } => (Code::Unauthenticated, "TOKEN_KEY_UNKNOWN"),
        TokenError::Algorithm(_) => (Code::Unauthenticated, "TOKEN_ALGORITHM"),
        TokenError::TenantUnknown(_) => (Code::Unauthenticated, "TOKEN_TENANT_UNKNOWN"),
        TokenError::SubjectInvalid(_) => (Code::Unauthenticated, "TOKEN_SUBJECT_INVALID"),
        TokenError::Invalid(_) => (Code::Unauthenticated, "TOKEN_INVALID"),
        TokenError::KeysUnavailable { .. } => (Code::Unavailable, "JWKS_UNAVAILABLE"),
    }
}

/// A refused client certificate is UNAUTHENTICATED with a reason per
/// check.
fn classify_certificate(error: &crate::callers::CertError) -> (Code, &'static str) {
    use crate::callers::CertError;
    match error {
        CertError::Unreadable(_) => (Code::Unauthenticated, "CERTIFICATE_UNREADABLE"),
        CertError::Unmatched(_) => (Code::Unauthenticated, "CERTIFICATE_UNMATCHED"),
        CertError::TenantInvalid(_) => (Code::Unauthenticated, "CERTIFICATE_TENANT_INVALID"),
        CertError::TenantUnknown(_) => (Code::Unauthenticated, "CERTIFICATE_TENANT_UNKNOWN"),
        CertError::SubjectInvalid(_) => (Code::Unauthenticated, "CERTIFICATE_SUBJECT_INVALID"),
        CertError::Expired(_) => (Code::Unauthenticated, "CERTIFICATE_EXPIRED"),
        CertError::Conflict(_) => (Code::Unauthenticated, "CALLER_IDENTITY_CONFLICT"),
    }
}

/// The code of a call that ended before its outcome was known: when the
/// request may have reached the tool, `UNKNOWN` (standard retry policies
/// replay `UNAVAILABLE` on the code alone, and the tool may have acted),
/// unless the tool says it is idempotent; `UNAVAILABLE` when nothing was
/// sent.
fn in_doubt(sent: bool, idempotent: bool) -> Code {
    if sent && !idempotent {
        Code::Unknown
    } else {
        Code::Unavailable
    }
}

fn classify_upstream(error: &UpstreamError, idempotent: bool) -> (Code, &'static str) {
    match error {
        UpstreamError::Spawn { .. }
        | UpstreamError::Handshake(_)
        | UpstreamError::ConnectTimeout(_)
        | UpstreamError::ListTools(_)
        | UpstreamError::TooManyPages(_)
        | UpstreamError::RepeatedCursor
        | UpstreamError::Closed
        | UpstreamError::Unreachable(_) => (Code::Unavailable, "UPSTREAM_UNAVAILABLE"),
        // A transport that failed mid-call may have delivered the request.
        UpstreamError::Lost | UpstreamError::Transport(_) => {
            (in_doubt(true, idempotent), "UPSTREAM_CONNECTION_LOST")
        }
        UpstreamError::TooLarge(_) => (Code::ResourceExhausted, "RESULT_TOO_LARGE"),
        UpstreamError::HttpStatus { status: 429, .. } => {
            (Code::Unavailable, "UPSTREAM_RATE_LIMITED")
        }
        UpstreamError::HttpStatus { status, .. } if *status >= 500 => {
            (in_doubt(true, idempotent), "UPSTREAM_HTTP_ERROR")
        }
        UpstreamError::HttpStatus { .. } => (Code::Internal, "UPSTREAM_HTTP_ERROR"),
        // Not retryable: the operator must fix the configured credentials.
        UpstreamError::AuthRejected { .. } => (Code::FailedPrecondition, "UPSTREAM_AUTH_REJECTED"),
        UpstreamError::AddressRefused { .. } => {
            (Code::FailedPrecondition, "UPSTREAM_ADDRESS_REFUSED")
        }
        UpstreamError::AuthorizationRequired { .. } => {
            (Code::FailedPrecondition, "UPSTREAM_AUTHORIZATION_REQUIRED")
        }
        UpstreamError::StateUnavailable(_) => (Code::Unavailable, "STATE_UNAVAILABLE"),
        UpstreamError::TokenFailed(_) => (Code::Unavailable, "UPSTREAM_TOKEN_UNAVAILABLE"),
        // Not retryable: the OAuth settings or the authorization server
        // must change first.
        UpstreamError::OAuthFailed(_) => (Code::FailedPrecondition, "UPSTREAM_OAUTH_FAILED"),
        // Issue 23, delegation: nothing was sent upstream.
        UpstreamError::Delegation(e) => match e.kind {
            DelegationFailure::RequiresJwt => (Code::FailedPrecondition, "DELEGATION_REQUIRES_JWT"),
            DelegationFailure::IssuerMismatch => {
                (Code::FailedPrecondition, "DELEGATION_ISSUER_MISMATCH")
            }
            DelegationFailure::UntrustedEndpoint => {
                (Code::FailedPrecondition, "DELEGATION_UNTRUSTED_ENDPOINT")
            }
            DelegationFailure::Refused => (Code::PermissionDenied, "DELEGATION_REFUSED"),
            DelegationFailure::Unavailable => (Code::Unavailable, "DELEGATION_UNAVAILABLE"),
        },
        UpstreamError::Timeout(_) => (Code::DeadlineExceeded, "UPSTREAM_TIMEOUT"),
        UpstreamError::Protocol(_) => (Code::Internal, "UPSTREAM_PROTOCOL_ERROR"),
        UpstreamError::Unsupported(_) => (Code::Unimplemented, "UPSTREAM_UNSUPPORTED"),
        // Capabilities the worker can give are INPUT_NOT_ACCEPTED (see
        // `call.rs`); any other (an extension toolgate does not declare)
        // is the server's own error, as before.
        UpstreamError::MissingCapability { .. } => (Code::Unknown, "UPSTREAM_ERROR"),
        UpstreamError::TasksRequired => (Code::FailedPrecondition, "TASK_REQUIRED"),
        UpstreamError::TaskCancelled => (Code::Aborted, "TASK_CANCELLED"),
        UpstreamError::InputRequiresInteractive(_) => {
            (Code::FailedPrecondition, "INPUT_REQUIRES_INTERACTIVE")
        }
        UpstreamError::InputAnswerTimeout(_) => (Code::DeadlineExceeded, "INPUT_ANSWER_TIMEOUT"),
        UpstreamError::InputRoundsExceeded(_) => (Code::ResourceExhausted, "INPUT_ROUNDS_EXCEEDED"),
        UpstreamError::InputAbandoned => (Code::Cancelled, "INPUT_ABANDONED"),
        UpstreamError::JsonRpc { code, .. } => match *code {
            jsonrpc::INVALID_PARAMS => (Code::InvalidArgument, "UPSTREAM_INVALID_PARAMS"),
            jsonrpc::METHOD_NOT_FOUND => (Code::Unimplemented, "UPSTREAM_METHOD_NOT_FOUND"),
            jsonrpc::RESOURCE_NOT_FOUND => (Code::NotFound, "UPSTREAM_RESOURCE_NOT_FOUND"),
            jsonrpc::URL_ELICITATION_REQUIRED => {
                (Code::FailedPrecondition, "UPSTREAM_INPUT_REQUIRED")
            }
            jsonrpc::PARSE_ERROR | jsonrpc::INVALID_REQUEST => {
                (Code::Internal, "UPSTREAM_REJECTED_REQUEST")
            }
            jsonrpc::INTERNAL_ERROR => (Code::Internal, "UPSTREAM_INTERNAL_ERROR"),
            _ => (Code::Unknown, "UPSTREAM_ERROR"),
        },
    }
}

/// The message a caller sees. Upstream JSON-RPC messages are shown only
/// where the caller can act on them (invalid params), and then cut short.
fn message(error: &CallError) -> String {
    match error {
        CallError::Upstream {
            server,
            tool,
            error: UpstreamError::JsonRpc { code, message },
            ..
        } => {
            if *code == jsonrpc::INVALID_PARAMS {
                format!(
                    "server `{server}` refused the arguments of {tool}: {}",
                    truncate(message, 500)
                )
            } else {
                format!(
                    "server `{server}` answered {tool} with JSON-RPC error {code} (details in the gateway log)"
                )
            }
        }
        other => other.to_string(),
    }
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
pub(super) fn worker_message(error: &CallError) -> String {
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
