//! The one place where admin API errors become gRPC statuses: a code, a
//! stable `google.rpc.ErrorInfo` reason (domain `toolgate`, with the
//! tenant, secret and versions as metadata where known), a
//! `google.rpc.BadRequest` with every field error of a spec that does not
//! validate, and `google.rpc.RetryInfo` when the state store cannot be
//! reached. The table is documented in docs/errors.md ("Admin API");
//! keep the two in step.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::callers::TokenError;
use crate::config::TenantOrigin;
use crate::grpc::status::DOMAIN;
use crate::state::StateError;

/// How long a client should wait before retrying when the state store
/// cannot be reached.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Why an admin request was refused or failed. Never holds a secret's
/// value, a spec or a token.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No credential, a malformed one, or one that is neither an admin
    /// token nor a JWT (a tenant's token is refused here too).
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),
    /// A JWT that does not verify.
    #[error("unauthenticated: {0}")]
    Token(TokenError),
    /// A verified JWT whose issuer's `admin` expression does not hold.
    #[error(
        "the token of issuer `{issuer}` is not admitted to the admin API (callers.jwt[].admin is \
         unset, or not true for its claims)"
    )]
    NotAdmin {
        /// The issuer.
        issuer: String,
    },
    /// A tenant or secret name that breaks the name rule.
    #[error("{field}: not a valid name (1 to 64 of a-z A-Z 0-9 . _ -)")]
    InvalidName {
        /// The request field.
        field: &'static str,
    },
    /// An `expected_version` that is not a version.
    #[error("expected_version: not a version (a decimal number as returned by the API)")]
    InvalidVersion,
    /// A `page_token` this API did not hand out.
    #[error("page_token: not a token from a previous ListTenants page")]
    InvalidPageToken,
    /// A secret's value is empty, too large or not UTF-8.
    #[error("value: {0}")]
    InvalidSecret(&'static str),
    /// The spec does not parse or validate: every error, with its path.
    #[error("the spec is invalid: {0}")]
    InvalidSpec(crate::config::SpecError),
    /// A create of a tenant that exists.
    #[error("tenant `{name}` exists (version {version}); replace it with its expected_version")]
    TenantExists {
        /// The tenant.
        name: String,
        /// Its stored version.
        version: i64,
    },
    /// The stored version is not the expected one.
    #[error("tenant `{name}` is at version {current}, not the expected {expected}")]
    VersionMismatch {
        /// The tenant.
        name: String,
        /// The version the request expected.
        expected: i64,
        /// The stored version.
        current: i64,
    },
    /// No tenant of this name in the state store.
    #[error("tenant `{name}` is not in the state store")]
    TenantNotFound {
        /// The tenant.
        name: String,
    },
    /// No secret of this name for the tenant.
    #[error("tenant `{tenant}` has no secret `{name}`")]
    SecretNotFound {
        /// The tenant.
        tenant: String,
        /// The secret.
        name: String,
    },
    /// The name is defined by the configuration file or `tenants_dir`.
    #[error(
        "tenant `{name}` is defined by {origin}, which takes precedence over the state store; \
         remove it there first"
    )]
    DefinedElsewhere {
        /// The tenant.
        name: String,
        /// Where it is defined.
        origin: TenantOrigin,
    },
    /// One of the spec's tokens already selects another tenant.
    #[error("tenants[{name}].tokens[{index}] already selects tenant `{owner}` of {origin}")]
    TokenTaken {
        /// The tenant written.
        name: String,
        /// The token's index in its spec.
        index: usize,
        /// The tenant it selects.
        owner: String,
        /// Where that tenant is defined.
        origin: TenantOrigin,
    },
    /// One of the spec's approver tokens is already a token of another
    /// tenant (of the file or `tenants_dir`: `origin`; else of the store).
    #[error("tenants[{name}].call_approvals.approver_tokens[{index}] is already a token of tenant `{owner}`{}", .origin.as_ref().map(|o| format!(" of {o}")).unwrap_or_default())]
    ApproverTokenTaken {
        /// The tenant written.
        name: String,
        /// The approver token's index in its spec.
        index: usize,
        /// The tenant it is a token of.
        owner: String,
        /// Where that tenant is defined, when not in the store.
        origin: Option<TenantOrigin>,
    },
    /// The tenant's spec still references the secret.
    #[error(
        "secret `{name}` is referenced by tenant `{tenant}`'s spec ({{stored: {name}}}); change the spec first"
    )]
    SecretInUse {
        /// The tenant.
        tenant: String,
        /// The secret.
        name: String,
    },
    /// The state store failed.
    #[error("state store: {0}")]
    Store(#[from] StateError),
    /// Admin writes come faster than `admin.write_rate_per_second`.
    #[error(
        "admin writes are over this replica's rate (admin.write_rate_per_second); retry in {} ms",
        .wait.as_millis()
    )]
    WriteRateLimited {
        /// How long until a write is taken again.
        wait: Duration,
    },
    /// With `audit.required`, the change's audit record cannot be written:
    /// nothing was changed.
    #[error(
        "the audit trail cannot record the change (audit.required): nothing was changed; retry later"
    )]
    AuditUnavailable,
}

/// The status code and stable reason of an error.
pub fn classify(error: &AdminError) -> (Code, &'static str) {
    match error {
        AdminError::Unauthenticated(_) => (Code::Unauthenticated, "ADMIN_UNAUTHENTICATED"),
        AdminError::Token(TokenError::KeysUnavailable { .. }) => {
            (Code::Unavailable, "JWKS_UNAVAILABLE")
        }
        AdminError::Token(_) => (Code::Unauthenticated, "ADMIN_TOKEN_INVALID"),
        AdminError::NotAdmin { .. } => (Code::PermissionDenied, "ADMIN_NOT_PERMITTED"),
        AdminError::InvalidName { .. } => (Code::InvalidArgument, "INVALID_NAME"),
        AdminError::InvalidVersion => (Code::InvalidArgument, "INVALID_VERSION"),
        AdminError::InvalidPageToken => (Code::InvalidArgument, "INVALID_PAGE_TOKEN"),
        AdminError::InvalidSecret(_) => (Code::InvalidArgument, "INVALID_SECRET"),
        AdminError::InvalidSpec(_) => (Code::InvalidArgument, "INVALID_SPEC"),
        AdminError::TenantExists { .. } => (Code::AlreadyExists, "TENANT_EXISTS"),
        AdminError::VersionMismatch { .. } => (Code::Aborted, "VERSION_MISMATCH"),
        AdminError::TenantNotFound { .. } => (Code::NotFound, "TENANT_NOT_FOUND"),
        AdminError::SecretNotFound { .. } => (Code::NotFound, "SECRET_NOT_FOUND"),
        AdminError::DefinedElsewhere { .. } => {
            (Code::FailedPrecondition, "TENANT_DEFINED_ELSEWHERE")
        }
        AdminError::TokenTaken { .. } | AdminError::ApproverTokenTaken { .. } => {
            (Code::FailedPrecondition, "TOKEN_TAKEN")
        }
        AdminError::SecretInUse { .. } => (Code::FailedPrecondition, "SECRET_IN_USE"),
        AdminError::Store(e) if e.is_unavailable() => (Code::Unavailable, "STATE_UNAVAILABLE"),
        AdminError::Store(_) => (Code::Internal, "STATE_ERROR"),
        AdminError::WriteRateLimited { .. } => (Code::ResourceExhausted, "ADMIN_RATE_LIMITED"),
        AdminError::AuditUnavailable => (Code::Unavailable, "AUDIT_UNAVAILABLE"),
    }
}

fn metadata(error: &AdminError) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_owned(), v);
    };
    match error {
        AdminError::NotAdmin { issuer } => put("issuer", issuer.clone()),
        AdminError::InvalidName { field } => put("field", (*field).to_owned()),
        AdminError::TenantExists { name, version } => {
            put("tenant", name.clone());
            put("current_version", version.to_string());
        }
        AdminError::VersionMismatch {
            name,
            expected,
            current,
        } => {
            put("tenant", name.clone());
            put("expected_version", expected.to_string());
            put("current_version", current.to_string());
        }
        AdminError::TenantNotFound { name } => put("tenant", name.clone()),
        AdminError::SecretNotFound { tenant, name } | AdminError::SecretInUse { tenant, name } => {
            put("tenant", tenant.clone());
            put("secret", name.clone());
        }
        AdminError::DefinedElsewhere { name, origin } => {
            put("tenant", name.clone());
            put("defined_in", origin.to_string());
        }
        AdminError::ApproverTokenTaken {
            name, index, owner, ..
        } => {
            put("tenant", name.clone());
            put("approver_token_index", index.to_string());
            put("owner", owner.clone());
        }
        AdminError::TokenTaken {
            name,
            index,
            owner,
            origin,
        } => {
            put("tenant", name.clone());
            put("token_index", index.to_string());
            put("owner", owner.clone());
            put("defined_in", origin.to_string());
        }
        _ => {}
    }
    m
}

impl From<AdminError> for Status {
    fn from(error: AdminError) -> Status {
        let (code, reason) = classify(&error);
        let mut details = ErrorDetails::with_error_info(reason, DOMAIN, metadata(&error));
        if let AdminError::InvalidSpec(spec) = &error {
            for e in &spec.errors {
                details.add_bad_request_violation(e.path.clone(), e.message.clone());
            }
        }
        if let AdminError::WriteRateLimited { wait } = &error {
            details.set_retry_info(Some((*wait).max(Duration::from_millis(1))));
        } else if code == Code::Unavailable {
            details.set_retry_info(Some(RETRY_DELAY));
        }
        if let AdminError::Store(e) = &error
            && !e.is_unavailable()
        {
            tracing::error!(error = %e, "admin API: state store error");
        }
        let message = match &error {
            // Not the store's details: they are in the gateway's log.
            AdminError::Store(e) if !e.is_unavailable() => {
                "the state store failed (details in the gateway log)".to_owned()
            }
            other => other.to_string(),
        };
        Status::with_error_details(code, message, details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_spec_carries_every_path() {
        let status = Status::from(AdminError::InvalidSpec(crate::config::SpecError {
            errors: vec![
                crate::config::FieldError {
                    path: "tenants[a].servers[0].command".into(),
                    message: "refused".into(),
                },
                crate::config::FieldError {
                    path: "tenants[a].tokens[0]".into(),
                    message: "refused too".into(),
                },
            ],
        }));
        assert_eq!(status.code(), Code::InvalidArgument);
        let details = status.get_error_details();
        assert_eq!(details.error_info().unwrap().reason, "INVALID_SPEC");
        let fields: Vec<&str> = details
            .bad_request()
            .unwrap()
            .field_violations
            .iter()
            .map(|v| v.field.as_str())
            .collect();
        assert_eq!(
            fields,
            ["tenants[a].servers[0].command", "tenants[a].tokens[0]"]
        );
    }

    #[test]
    fn a_write_over_the_rate_is_resource_exhausted_with_retry_info() {
        let status = Status::from(AdminError::WriteRateLimited {
            wait: Duration::from_millis(250),
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        let details = status.get_error_details();
        assert_eq!(details.error_info().unwrap().reason, "ADMIN_RATE_LIMITED");
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn unavailable_carries_retry_info() {
        let status = Status::from(AdminError::Store(StateError::Contended {
            record: crate::state::Record::Tenant,
        }));
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.get_error_details().retry_info().is_some());
    }
}
