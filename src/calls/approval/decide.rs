//! What approvers do: list and read their tenant's call approvals, approve
//! or deny one, follow the changes. An approver is a caller of the tenant
//! (a JWT, a client certificate, a static token, or one of the tenant's
//! approver tokens) that the rule which asked admits (its
//! `approval.approvers`; unset: approver tokens only), and never the
//! subject that asked unless the rule allows self-approval. A caller sees
//! the approvals it may decide and the ones it asked for itself; any
//! other is "not found" to it, as another tenant's is.

use std::sync::Arc;

use super::hold::millis;
use super::{CallApprovals, Details, unavailable};
use crate::audit::CallApprovalEvent;
use crate::callers::{Caller, Subject};
use crate::calls::CallError;
use crate::calls::error::quoted;
use crate::policy::ApprovalRule;
use crate::registry::Tenant;
use crate::state::call_approvals::{ApprovalRow, states};
use crate::state::now_ms;

/// Longest reason an approver may give, in characters.
pub const MAX_REASON_CHARS: usize = 1024;

/// Most approvals one listing returns.
pub const MAX_LIST: u32 = 1000;

/// Who decides: an authenticated caller of `tenant`.
#[derive(Debug, Clone)]
pub struct Approver {
    /// Its tenant.
    pub tenant: Arc<Tenant>,
    /// How it authenticated.
    pub caller: Caller,
    /// The subject it names.
    pub subject: Subject,
}

impl Approver {
    /// How the audit trail and the approval name this approver.
    fn name(&self) -> String {
        match (&self.caller.identity, self.subject.id()) {
            // A static token names its subject in a header: both said.
            (crate::callers::CallerIdentity::Token { .. }, Some(_)) => {
                format!("{} as {}", self.caller.identity, self.subject.key())
            }
            (identity, _) => identity.to_string(),
        }
    }
}

/// One approval as an approver sees it.
#[derive(Debug, Clone)]
pub struct ApprovalView {
    /// Its id.
    pub id: String,
    /// Its state now (one of `state::call_approvals::states`).
    pub state: String,
    /// What the approver is shown and what was decided.
    pub details: ApprovalShown,
    /// The subject key of the call.
    pub subject: String,
    /// When it was asked for (Unix milliseconds).
    pub created_at_ms: i64,
    /// When it expires (pending: undecided; approved: unused).
    pub expires_at_ms: i64,
    /// Uses left (approved) or to be granted (pending).
    pub uses_left: u32,
    /// When it was decided (0: not yet).
    pub decided_at_ms: i64,
    /// When it last changed (what a watch follows).
    pub changed_at_ms: i64,
    /// Whether the caller may decide it.
    pub may_decide: bool,
}

/// The parts of an approval an approver reads.
#[derive(Debug, Clone)]
pub struct ApprovalShown {
    /// The tool's exposed name.
    pub tool: String,
    /// Its server.
    pub server: String,
    /// Its definition hash.
    pub definition_hash: String,
    /// The SHA-256 of the canonical arguments.
    pub arguments_sha256: String,
    /// The arguments, redacted.
    pub arguments_json: String,
    /// The rule that asked.
    pub rule: String,
    /// Who decided.
    pub decided_by: String,
    /// Why.
    pub reason: String,
}

/// How a caller stands to one approval.
enum Standing {
    /// It may decide it.
    Decides,
    /// It may read it: its own call, or one the rule lets it decide but for
    /// self-approval, or whose rule is gone.
    Reads(&'static str),
    /// It may not see it at all.
    Hidden,
}

impl CallApprovals {
    /// The approvals of `approver`'s tenant in `state` that it may see,
    /// newest first, at most `limit` (at most [`MAX_LIST`]).
    ///
    /// # Errors
    /// The state store is down or not configured.
    pub async fn list(
        &self,
        approver: &Approver,
        state: &str,
        limit: u32,
    ) -> Result<Vec<ApprovalView>, CallError> {
        let store = self.store()?;
        let rows = store
            .list_call_approvals(&approver.tenant.name, state, limit.clamp(1, MAX_LIST))
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(rows
            .iter()
            .filter_map(|row| self.view(approver, row).ok().flatten())
            .collect())
    }

    /// The approvals of `approver`'s tenant that changed at or after
    /// `since_ms` and that it may see, in the order they changed (what a
    /// watch follows).
    ///
    /// # Errors
    /// The state store is down or not configured.
    pub async fn changed_since(
        &self,
        approver: &Approver,
        since_ms: i64,
    ) -> Result<Vec<ApprovalView>, CallError> {
        let store = self.store()?;
        let rows = store
            .call_approvals_changed_since(&approver.tenant.name, since_ms, MAX_LIST)
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(rows
            .iter()
            .filter_map(|row| self.view(approver, row).ok().flatten())
            .collect())
    }

    /// Waits until an approval is requested or decided (at this replica,
    /// or announced by another), or until it is time to look at the store
    /// anyway: what a watch sleeps on between looks.
    pub async fn changes(&self) {
        let _ = tokio::time::timeout(self.poll(), self.decided.notified()).await;
    }

    /// Approval `id` of `approver`'s tenant.
    ///
    /// # Errors
    /// `CALL_APPROVAL_NOT_FOUND` (none, another tenant's, or one the
    /// caller may not see), the store down.
    pub async fn get(&self, approver: &Approver, id: &str) -> Result<ApprovalView, CallError> {
        let row = self.row(approver, id).await?;
        self.view(approver, &row)?.ok_or_else(|| not_found(id))
    }

    /// Approves (`approve`) or denies approval `id` for `reason`.
    ///
    /// # Errors
    /// `CALL_APPROVAL_NOT_FOUND`, `CALL_APPROVAL_NOT_APPROVER`,
    /// `CALL_APPROVAL_DECIDED` (not pending: decided, spent or expired),
    /// `CALL_APPROVAL_VOID` (the rule that asked is gone or changed), a
    /// reason too long, the store down.
    pub async fn decide(
        &self,
        approver: &Approver,
        id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<ApprovalView, CallError> {
        if reason.chars().count() > MAX_REASON_CHARS {
            return Err(CallError::ApprovalReasonTooLong {
                limit: MAX_REASON_CHARS,
            });
        }
        let store = self.store()?;
        let row = self.row(approver, id).await?;
        let mut details = Details::from_bytes(&row.value)?;
        let rule = match self.standing(approver, &row, &details) {
            (Standing::Hidden, _) => return Err(not_found(id)),
            (Standing::Reads(why), _) => {
                return Err(CallError::NotApprover {
                    approval_id: id.to_owned(),
                    why,
                });
            }
            (Standing::Decides, rule) => rule.expect("a rule admits who decides"),
        };
        let state = row.state_now(now_ms());
        if state != states::PENDING {
            return Err(CallError::ApprovalDecided {
                approval_id: id.to_owned(),
                state: state.to_owned(),
            });
        }
        let redactor = approver.tenant.redactor();
        details.decided_by = approver.name();
        details.reason = redactor.redact(reason).into_owned();
        let (new_state, expires_at_ms) = if approve {
            (
                states::APPROVED,
                now_ms().saturating_add(millis(rule.valid_for)),
            )
        } else {
            (states::DENIED, now_ms())
        };
        let won = store
            .decide_call_approval(
                id,
                &row.tenant,
                new_state,
                &details.to_bytes(),
                expires_at_ms,
            )
            .await
            .map_err(|e| unavailable(&e))?;
        if !won {
            let now = self.row(approver, id).await?;
            return Err(CallError::ApprovalDecided {
                approval_id: id.to_owned(),
                state: now.state_now(now_ms()).to_owned(),
            });
        }
        self.decided.notify_waiters();
        let event = if approve {
            "call_approval_approved"
        } else {
            "call_approval_denied"
        };
        self.audit.call_approval(&CallApprovalEvent {
            event,
            tenant: &row.tenant,
            subject: &row.subject,
            caller: Some(&approver.caller.identity),
            approval_id: id,
            tool: &details.tool,
            server: &details.server,
            definition_hash: &details.definition_hash,
            rule: &details.rule,
            note: Some(&details.reason),
            reason: None,
            trace_id: None,
        });
        let waited = std::time::Duration::from_millis(
            u64::try_from(now_ms().saturating_sub(row.created_at_ms)).unwrap_or(0),
        );
        self.metrics.call_approvals().decided(
            &row.tenant,
            if approve { "approved" } else { "denied" },
            waited,
        );
        tracing::info!(
            tenant = %row.tenant,
            approval = id,
            tool = %details.tool,
            decided_by = %details.decided_by,
            "call approval {}", if approve { "approved" } else { "denied" }
        );
        self.get(approver, id).await
    }

    /// The row of `id` in `approver`'s tenant.
    async fn row(&self, approver: &Approver, id: &str) -> Result<ApprovalRow, CallError> {
        if !super::well_formed(id) {
            return Err(not_found(&quoted(id)));
        }
        self.store()?
            .call_approval(id, &approver.tenant.name)
            .await
            .map_err(|e| unavailable(&e))?
            .ok_or_else(|| not_found(id))
    }

    /// `row` as `approver` sees it (`None`: it may not).
    fn view(
        &self,
        approver: &Approver,
        row: &ApprovalRow,
    ) -> Result<Option<ApprovalView>, CallError> {
        let details = Details::from_bytes(&row.value)?;
        let may_decide = match self.standing(approver, row, &details).0 {
            Standing::Hidden => return Ok(None),
            Standing::Reads(_) => false,
            Standing::Decides => true,
        };
        let state = row.state_now(now_ms()).to_owned();
        Ok(Some(ApprovalView {
            id: row.id.clone(),
            may_decide: may_decide && state == states::PENDING,
            state,
            subject: row.subject.clone(),
            created_at_ms: row.created_at_ms,
            expires_at_ms: row.expires_at_ms,
            uses_left: u32::try_from(row.uses_left).unwrap_or(0),
            decided_at_ms: row.decided_at_ms,
            changed_at_ms: row.changed_at_ms,
            details: ApprovalShown {
                tool: details.tool,
                server: details.server,
                definition_hash: details.definition_hash,
                arguments_sha256: details.arguments_sha256,
                arguments_json: details.arguments_json,
                rule: details.rule,
                decided_by: details.decided_by,
                reason: details.reason,
            },
        }))
    }

    /// How `approver` stands to `row`, and the rule that asked as the
    /// tenant's policy has it now (`None`: gone or changed since).
    fn standing(
        &self,
        approver: &Approver,
        row: &ApprovalRow,
        details: &Details,
    ) -> (Standing, Option<Arc<ApprovalRule>>) {
        // An approver token's subject (`approver:<name>`) is never a
        // caller's of the tool gateway.
        let own = approver.subject.key() == row.subject;
        let rule = approver
            .tenant
            .policy()
            .and_then(|policy| policy.approval_rule(&details.rule))
            .filter(|rule| rule.digest == details.rule_digest);
        let Some(rule) = rule else {
            // Nobody decides it any more; who asked may still read it.
            return if own {
                (
                    Standing::Reads("the rule that asked for it is gone or changed since"),
                    None,
                )
            } else {
                (Standing::Hidden, None)
            };
        };
        if !rule.admits(&approver.caller, &approver.subject) {
            return if own {
                (
                    Standing::Reads("the rule's approvers do not admit this caller"),
                    Some(rule),
                )
            } else {
                (Standing::Hidden, Some(rule))
            };
        }
        if own && !rule.self_approval {
            return (
                Standing::Reads(
                    "it is this caller's own call, and the rule does not allow self-approval",
                ),
                Some(rule),
            );
        }
        (Standing::Decides, Some(rule))
    }
}

/// The refusal of an id the caller may not see.
fn not_found(id: &str) -> CallError {
    CallError::ApprovalNotFound {
        approval_id: id.to_owned(),
    }
}
