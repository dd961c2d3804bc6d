//! `CompleteAuthorization`: the tenant's application confirms a held
//! consent for the user it has logged in. Only the tenant and subject the
//! authorization link was made for make the grant usable; any other caller
//! is refused, the refusal recorded, and the held grant dropped.

use crate::callers::Subject;
use crate::credentials::oauth::{ConfirmError, confirm};
use crate::pb;
use crate::registry::Tenant;

use crate::calls::CallError;

/// Longest consent code accepted (the gateway issues 43 characters).
const MAX_CODE_LEN: usize = 128;

/// Confirms the consent held under `code` for `tenant`'s caller acting for
/// `subject`.
///
/// # Errors
/// [`CallError::ConsentCodeInvalid`] (unknown, used, expired or no state
/// store), [`CallError::ConsentNotYours`] (another tenant's or subject's
/// link: the grant is dropped), [`CallError::ConsentStoreUnavailable`].
pub(super) async fn complete_authorization(
    tenant: &Tenant,
    subject: &Subject,
    code: &str,
) -> Result<pb::CompleteAuthorizationResponse, CallError> {
    if code.is_empty() || code.len() > MAX_CODE_LEN {
        return Err(CallError::ConsentCodeInvalid);
    }
    let Some(context) = tenant.oauth_context() else {
        return Err(CallError::ConsentCodeInvalid);
    };
    match confirm(context.store.as_ref(), code, &tenant.name, subject.key()).await {
        Ok(key) => {
            tenant.consented(&key.server, &key.subject);
            tenant.oauth_event(&key.tenant, &key.server, "consent_completed");
            context.audit.authorization(
                &key.tenant,
                &key.subject,
                &key.server,
                "consent_completed",
                None,
            );
            context.audit.flush().await;
            tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth consent confirmed by the application");
            Ok(pb::CompleteAuthorizationResponse { server: key.server })
        }
        Err(ConfirmError::UnknownCode) => Err(CallError::ConsentCodeInvalid),
        Err(ConfirmError::NotYours(refused)) => {
            let flow = &refused.flow;
            let reason = if refused.other_tenant {
                "tenant_mismatch"
            } else {
                "subject_mismatch"
            };
            tracing::warn!(tenant = %tenant.name, flow_tenant = %flow.tenant, server = %flow.server, reason, "OAuth consent refused: confirmed for another subject than its link's; the grant was dropped");
            tenant.oauth_event(&flow.tenant, &flow.server, "consent_rejected");
            context.audit.authorization(
                &flow.tenant,
                &flow.subject,
                &flow.server,
                "consent_rejected",
                Some(reason),
            );
            if refused.other_tenant {
                // The confirming tenant's trail shows the attempt too.
                context.audit.authorization(
                    &tenant.name,
                    subject.key(),
                    &flow.server,
                    "consent_rejected",
                    Some(reason),
                );
            }
            context.audit.flush().await;
            Err(CallError::ConsentNotYours {
                server: (!refused.other_tenant).then(|| flow.server.clone()),
                reason: refused.to_string(),
            })
        }
        Err(ConfirmError::Store(error)) => {
            Err(CallError::ConsentStoreUnavailable(error.to_string()))
        }
    }
}
