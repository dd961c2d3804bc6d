//! The code and stable reason of every [`CallError`]: the table every
//! API surface answers with (`docs/errors.md` documents it; the gRPC
//! surface builds its statuses on it, with their messages and details).

use tonic::Code;

use crate::calls::error::CallError;
use crate::calls::idempotency::refusal::KeyRefusal;
use crate::credentials::oauth::DelegationFailure;
use crate::upstream::{UpstreamError, truncate};

/// JSON-RPC error codes (JSON-RPC 2.0 and MCP).
pub(crate) mod jsonrpc {
    pub(crate) const PARSE_ERROR: i32 = -32700;
    pub(crate) const INVALID_REQUEST: i32 = -32600;
    pub(crate) const METHOD_NOT_FOUND: i32 = -32601;
    pub(crate) const INVALID_PARAMS: i32 = -32602;
    pub(crate) const INTERNAL_ERROR: i32 = -32603;
    pub(crate) const RESOURCE_NOT_FOUND: i32 = -32002;
    pub(crate) const URL_ELICITATION_REQUIRED: i32 = -32042;
}

/// The message a caller sees of `error` (before the status's bound).
/// Upstream JSON-RPC messages are shown only where the caller can act
/// on them (invalid params), and then cut short.
pub fn caller_message(error: &CallError) -> String {
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
        CallError::CircuitOpen { .. } => (Code::Unavailable, "SERVER_CIRCUIT_OPEN"),
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
            use crate::calls::error::StateRefusal;
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
                crate::calls::error::Pin::DefinitionChanged => "TOOL_DEFINITION_CHANGED",
                crate::calls::error::Pin::Gone => "TOOL_GONE",
                crate::calls::error::Pin::VersionUnknown => "CATALOG_VERSION_UNKNOWN",
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
            use crate::calls::error::Feature;
            (
                Code::FailedPrecondition,
                match feature {
                    Feature::Resources => "RESOURCES_UNSUPPORTED",
                    Feature::Prompts => "PROMPTS_UNSUPPORTED",
                    Feature::Completions => "COMPLETION_UNSUPPORTED",
                    Feature::Subscriptions => "SUBSCRIBE_UNSUPPORTED",
                    Feature::Skills => "SKILLS_UNSUPPORTED",
                },
            )
        }
        CallError::PromptNotFound { .. } => (Code::NotFound, "PROMPT_NOT_FOUND"),
        CallError::SkillNotFound { .. } => (Code::NotFound, "SKILL_NOT_FOUND"),
        CallError::SkillDefinitionChanged { .. } => {
            (Code::FailedPrecondition, "SKILL_DEFINITION_CHANGED")
        }
        CallError::SkillMismatch { frontmatter, .. } => (
            Code::FailedPrecondition,
            if *frontmatter {
                "SKILL_FRONTMATTER_MISMATCH"
            } else {
                "SKILL_DIGEST_MISMATCH"
            },
        ),
        CallError::SkillFileNotListed { .. } => (Code::InvalidArgument, "SKILL_FILE_NOT_LISTED"),
        CallError::CallNotPermitted { target, .. } => (
            Code::PermissionDenied,
            match target.kind {
                crate::calls::error::TargetKind::Prompt => "PROMPT_NOT_PERMITTED",
                _ => "TOOL_NOT_PERMITTED",
            },
        ),
        CallError::ApprovalPending { .. } => (Code::FailedPrecondition, "APPROVAL_PENDING"),
        CallError::ApprovalDenied { .. } => (Code::PermissionDenied, "APPROVAL_DENIED"),
        CallError::ApprovalExpired { .. } => (Code::FailedPrecondition, "APPROVAL_EXPIRED"),
        CallError::ApprovalSpent { .. } => (Code::FailedPrecondition, "APPROVAL_SPENT"),
        CallError::ApprovalMismatch { .. } => (Code::FailedPrecondition, "APPROVAL_MISMATCH"),
        CallError::ApprovalNotFound { .. } => (Code::NotFound, "CALL_APPROVAL_NOT_FOUND"),
        CallError::ApprovalLimit { .. } => (Code::ResourceExhausted, "APPROVAL_LIMIT"),
        CallError::NotApprover { .. } => (Code::PermissionDenied, "CALL_APPROVAL_NOT_APPROVER"),
        CallError::ApprovalDecided { .. } => (Code::FailedPrecondition, "CALL_APPROVAL_DECIDED"),
        CallError::ApprovalReasonTooLong { .. } => {
            (Code::InvalidArgument, "CALL_APPROVAL_REASON_TOO_LONG")
        }
        CallError::ApprovalStoreUnavailable { .. } => (Code::Unavailable, "STATE_UNAVAILABLE"),
        CallError::Keyed(refusal) => classify_key(refusal),
        CallError::Replayed(status) => (status.code(), status.reason()),
        CallError::InvalidCompletion(_) => (Code::InvalidArgument, "INVALID_COMPLETION"),
        CallError::McpRequestInvalid(_) => (Code::InvalidArgument, "MCP_REQUEST_INVALID"),
        CallError::RoutingHeaderMismatch { .. } => {
            (Code::InvalidArgument, "ROUTING_HEADER_MISMATCH")
        }
        CallError::InvalidUri(_) => (Code::InvalidArgument, "INVALID_RESOURCE_URI"),
        CallError::NotPermitted { target, .. } => (
            Code::PermissionDenied,
            match target.kind {
                crate::calls::error::TargetKind::Prompt => "PROMPT_NOT_PERMITTED",
                crate::calls::error::TargetKind::Tool => "TOOL_NOT_PERMITTED",
                crate::calls::error::TargetKind::Resource
                | crate::calls::error::TargetKind::Template => "RESOURCE_NOT_PERMITTED",
                crate::calls::error::TargetKind::Skill => "SKILL_NOT_PERMITTED",
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
        // `calls/rounds/mod.rs`); any other (an extension toolgate does not declare)
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

/// The code and reason of a call with an idempotency key that was not
/// run (docs/api.md, "Retrying safely").
fn classify_key(refusal: &KeyRefusal) -> (Code, &'static str) {
    match refusal {
        KeyRefusal::Invalid(_) => (Code::InvalidArgument, "IDEMPOTENCY_KEY_INVALID"),
        KeyRefusal::Reused { .. } => (Code::InvalidArgument, "IDEMPOTENCY_KEY_REUSED"),
        KeyRefusal::InProgress { .. } => (Code::Aborted, "CALL_IN_PROGRESS"),
        KeyRefusal::InDoubt { .. } => (Code::FailedPrecondition, "CALL_IN_DOUBT"),
        KeyRefusal::NotKept { .. } => (Code::FailedPrecondition, "CALL_ALREADY_DONE"),
        KeyRefusal::Limit { .. } => (Code::ResourceExhausted, "IDEMPOTENCY_KEY_LIMIT"),
        KeyRefusal::StoreUnavailable { .. } => (Code::Unavailable, "STATE_UNAVAILABLE"),
    }
}
