//! The upstream session a call uses (a tool call, a read, a prompt, a
//! completion, a watch): the tenant's session of the server, or
//! for a per-user server the subject's own, with the same errors as a
//! call's (the consent URL for a subject that must consent first).

use std::sync::Arc;

use super::error::{CallError, Target};
use crate::callers::Subject;
use crate::registry::{SessionUnavailable, Tenant};
use crate::upstream::{Session, UpstreamError};

/// The session of server `index` of `tenant` for a request about
/// `target` on behalf of `subject`. Nothing is sent without a token.
///
/// # Errors
/// The server is down or connecting (`UPSTREAM_UNAVAILABLE`); a per-user
/// server's subject must consent (`UPSTREAM_AUTHORIZATION_REQUIRED`, the
/// URL remembered for `ListTools`) or the state store is down.
pub(crate) async fn session(
    tenant: &Tenant,
    index: usize,
    subject: &Subject,
    target: &Target,
    idempotent: bool,
) -> Result<Arc<Session>, CallError> {
    let server = tenant
        .servers()
        .nth(index)
        .map(|s| s.name.clone())
        .unwrap_or_default();
    if tenant.is_per_user(index) {
        return tenant
            .user_session(index, subject)
            .await
            .map_err(|error| failure(tenant, index, &server, target, subject, error, idempotent));
    }
    tenant
        .session(index)
        .map_err(|e| CallError::ServerUnavailable {
            server,
            tool: target.clone(),
            reason: match e {
                SessionUnavailable::Connecting => "still connecting".to_owned(),
                SessionUnavailable::Down(reason) => reason,
            },
        })
}

/// The status of an upstream failure of a request about `target` of
/// server `index`: a subject that must consent gets the URL (and it is
/// remembered for listings), a state store that is down is retryable,
/// anything else is the server's failure.
pub(crate) fn failure(
    tenant: &Tenant,
    index: usize,
    server: &str,
    target: &Target,
    subject: &Subject,
    error: UpstreamError,
    idempotent: bool,
) -> CallError {
    if let UpstreamError::AuthorizationRequired { url } = &error {
        tenant.remember_consent_url(index, subject, url);
    }
    unsent_failure(server, target, subject, error, idempotent)
}

/// [`failure`] without remembering a consent URL: a subject that must
/// consent gets the URL, a state store that is down is retryable, anything
/// else is the server's failure.
pub(crate) fn unsent_failure(
    server: &str,
    target: &Target,
    subject: &Subject,
    error: UpstreamError,
    idempotent: bool,
) -> CallError {
    match error {
        UpstreamError::AuthorizationRequired { url } => CallError::AuthorizationRequired {
            server: server.to_owned(),
            tool: target.clone(),
            subject: subject.key().to_owned(),
            url,
        },
        UpstreamError::StateUnavailable(reason) => CallError::StateUnavailable {
            server: server.to_owned(),
            reason,
        },
        error => CallError::Upstream {
            server: server.to_owned(),
            tool: target.clone(),
            error,
            idempotent,
        },
    }
}
