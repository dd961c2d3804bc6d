//! The pipeline's approval step: a call a `require_approval` rule holds
//! asks for an approval (or finds the one it named), and goes on only by
//! spending an approved one bound to exactly this call. A unary call
//! answers `APPROVAL_PENDING` with the id to retry with; an interactive
//! call says so on its stream and waits for the decision.

use std::time::Duration;

use rmcp::model::JsonObject;

use super::{Bound, CallApprovals, Details, binding, difference, unavailable, well_formed};
use crate::audit::CallApprovalEvent;
use crate::calls::error::quoted;
use crate::calls::{CallError, Origin};
use crate::policy::ApprovalRule;
use crate::registry::limits::Admission;
use crate::state::call_approvals::{ApprovalRow, NewApproval, Requested, states};
use crate::state::now_ms;

/// Told to a call that waits for a decision (`InvokeToolInteractive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalNotice {
    /// The approval's id.
    pub approval_id: String,
    /// When it expires undecided (Unix milliseconds).
    pub expires_at_ms: i64,
    /// The rule that asked.
    pub rule: String,
}

/// Where a call that waits for a decision says so.
pub type ApprovalSink = tokio::sync::mpsc::Sender<ApprovalNotice>;

/// What a call brings to the approval step.
#[derive(Debug, Default, Clone, Copy)]
pub struct Approving<'a> {
    /// The approval it spends (`approval_id`; empty: none named).
    pub approval_id: &'a str,
    /// Set for a call that waits for the decision (interactive).
    pub waiting: Option<&'a ApprovalSink>,
    /// A call that becomes a task while its approval is pending
    /// (`accepts_task`).
    pub parks: bool,
}

/// How the approval step let a call go on.
#[derive(Debug)]
pub(crate) enum Hold {
    /// It spent this approval: the call runs.
    Spent(String),
    /// It asked for this approval and becomes a task that starts once
    /// approved.
    Parked(ApprovalNotice),
}

/// The call the step holds: where it goes and what it is.
pub(crate) struct Held<'a> {
    /// The tenant object that routes the call.
    pub(crate) tenant: &'a crate::registry::Tenant,
    /// The server.
    pub(crate) server: &'a str,
    /// The tool's exposed name.
    pub(crate) tool: &'a str,
    /// Its definition hash.
    pub(crate) definition_hash: &'a str,
    /// The arguments as the caller sent them.
    pub(crate) arguments: &'a JsonObject,
}

/// The approval step of `held` for `origin`, under `rule`: returns the id
/// of the approval the call spent. While it waits for a decision, the
/// call gives up its `admission` slot and takes one again after.
///
/// # Errors
/// `APPROVAL_PENDING` (the id to retry with), a decision or state that
/// does not let the call run (`APPROVAL_DENIED`, `APPROVAL_EXPIRED`,
/// `APPROVAL_SPENT`, `APPROVAL_MISMATCH`, `CALL_APPROVAL_NOT_FOUND`), too
/// many pending (`APPROVAL_LIMIT`), the store down, the caller's deadline.
pub(crate) async fn hold(
    approvals: &CallApprovals,
    held: &Held<'_>,
    origin: &Origin,
    rule: &ApprovalRule,
    approving: Approving<'_>,
    admission: &mut Option<Admission>,
) -> Result<Hold, CallError> {
    let store = approvals.store()?;
    let arguments_sha256 = crate::calls::rounds::arguments_digest(held.arguments);
    let bound = Bound {
        tenant: &held.tenant.name,
        subject: origin.subject.key(),
        tool: held.tool,
        server: held.server,
        definition_hash: held.definition_hash,
        arguments_sha256: &arguments_sha256,
        rule: &rule.path,
        rule_digest: &rule.digest,
    };
    let binding = binding(&bound);
    let recorder = Recorder {
        approvals,
        held,
        origin,
        rule: &rule.path,
    };
    let (id, expires_at_ms) = if approving.approval_id.is_empty() {
        request(approvals, held, origin, rule, &bound, &binding, &recorder).await?
    } else {
        let id = approving.approval_id;
        if !well_formed(id) {
            recorder.refused(&quoted(id), "CALL_APPROVAL_NOT_FOUND");
            return Err(CallError::ApprovalNotFound {
                approval_id: quoted(id).into_owned(),
            });
        }
        let row = store
            .call_approval(id, &held.tenant.name)
            .await
            .map_err(|e| unavailable(&e))?;
        let Some(row) = row else {
            recorder.refused(id, "CALL_APPROVAL_NOT_FOUND");
            return Err(CallError::ApprovalNotFound {
                approval_id: id.to_owned(),
            });
        };
        let details = Details::from_bytes(&row.value)?;
        if let Some(what) = difference(&bound, &row.subject, &details) {
            recorder.refused(id, "APPROVAL_MISMATCH");
            return Err(CallError::ApprovalMismatch {
                approval_id: id.to_owned(),
                what,
            });
        }
        if row.state_now(now_ms()) != states::PENDING {
            return spend(approvals, &row, &binding, &recorder)
                .await
                .map(Hold::Spent);
        }
        (id.to_owned(), row.expires_at_ms)
    };
    let pending = || CallError::ApprovalPending {
        tool: held.tool.to_owned(),
        approval_id: id.clone(),
        rule: rule.path.clone(),
        expires_at_ms,
    };
    let notice = ApprovalNotice {
        approval_id: id.clone(),
        expires_at_ms,
        rule: rule.path.clone(),
    };
    let Some(sink) = approving.waiting else {
        if approving.parks && approving.approval_id.is_empty() {
            return Ok(Hold::Parked(notice));
        }
        return Err(pending());
    };
    if sink.send(notice).await.is_err() {
        // The worker went away.
        return Err(pending());
    }
    // Waiting for a person holds no slot of the tenant's.
    *admission = None;
    let row = wait(approvals, &held.tenant.name, &id, origin).await?;
    *admission = Some(origin.admit().await?);
    spend(approvals, &row, &binding, &recorder)
        .await
        .map(Hold::Spent)
}

/// Asks for a new approval of the call (or finds the same call's pending
/// one): its id and when it expires undecided.
async fn request(
    approvals: &CallApprovals,
    held: &Held<'_>,
    origin: &Origin,
    rule: &ApprovalRule,
    bound: &Bound<'_>,
    binding: &str,
    recorder: &Recorder<'_>,
) -> Result<(String, i64), CallError> {
    let store = approvals.store()?;
    let tenant = &held.tenant.name;
    let mut shown = serde_json::Value::Object(held.arguments.clone());
    held.tenant.redactor().redact_json(&mut shown);
    let details = Details {
        tool: held.tool.to_owned(),
        server: held.server.to_owned(),
        definition_hash: held.definition_hash.to_owned(),
        arguments_sha256: bound.arguments_sha256.to_owned(),
        arguments_json: shown.to_string(),
        rule: rule.path.clone(),
        rule_digest: rule.digest.clone(),
        requested_by: origin.caller.identity.to_string(),
        decided_by: String::new(),
        reason: String::new(),
    };
    let id = super::new_id();
    let expires_at_ms = now_ms().saturating_add(millis(rule.wait));
    let settings = held.tenant.call_approvals();
    let new = NewApproval {
        id: &id,
        tenant,
        subject: origin.subject.key(),
        binding,
        uses: rule.uses,
        expires_at_ms,
        value: &details.to_bytes(),
    };
    match store
        .request_call_approval(&new, settings.max_pending_per_subject)
        .await
        .map_err(|e| unavailable(&e))?
    {
        Requested::Stored => {
            recorder.event(&id, "call_approval_requested", None);
            approvals
                .metrics
                .call_approvals()
                .event(tenant, "requested");
            if let Some(webhook) = &settings.webhook {
                approvals.notifier.notify(
                    webhook,
                    super::notify::Summary {
                        event: super::notify::REQUESTED,
                        approval_id: id.clone(),
                        tenant: tenant.clone(),
                        tool: details.tool.clone(),
                        server: details.server.clone(),
                        subject: origin.subject.key().to_owned(),
                        rule: details.rule.clone(),
                        arguments_json: details.arguments_json.clone(),
                        arguments_sha256: details.arguments_sha256.clone(),
                        created_at_unix_ms: now_ms(),
                        expires_at_unix_ms: expires_at_ms,
                    },
                );
            }
            Ok((id, expires_at_ms))
        }
        Requested::Existing(row) => Ok((row.id, row.expires_at_ms)),
        Requested::Limit => {
            approvals.metrics.call_approvals().event(tenant, "limited");
            Err(CallError::ApprovalLimit {
                limit: settings.max_pending_per_subject,
            })
        }
    }
}

/// Waits for the decision of approval `id`, within the caller's deadline:
/// the row once it is no longer pending.
async fn wait(
    approvals: &CallApprovals,
    tenant: &str,
    id: &str,
    origin: &Origin,
) -> Result<ApprovalRow, CallError> {
    let store = approvals.store()?;
    let deadline = origin.deadline.map(|d| origin.started + d);
    loop {
        // Registered before the look, so a decision between the two wakes
        // the next wait.
        let decided = approvals.decided.notified();
        let row = store
            .call_approval(id, tenant)
            .await
            .map_err(|e| unavailable(&e))?
            .ok_or_else(|| CallError::ApprovalNotFound {
                approval_id: id.to_owned(),
            })?;
        if row.state_now(now_ms()) != states::PENDING {
            return Ok(row);
        }
        let until_expiry = Duration::from_millis(
            u64::try_from(row.expires_at_ms.saturating_sub(now_ms())).unwrap_or(0),
        );
        let nap = approvals
            .poll()
            .min(until_expiry + Duration::from_millis(1));
        let timer = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = decided => {}
            () = tokio::time::sleep(nap) => {}
            () = timer => {
                return Err(CallError::DeadlineExceeded {
                    server: String::new(),
                    tool: crate::calls::error::Target::from(id),
                    after: origin.started.elapsed(),
                    sent: false,
                });
            }
        }
    }
}

/// Spends `row` (no longer pending) for the call of `binding`, or says
/// why it cannot.
async fn spend(
    approvals: &CallApprovals,
    row: &ApprovalRow,
    binding: &str,
    recorder: &Recorder<'_>,
) -> Result<String, CallError> {
    let store = approvals.store()?;
    let id = row.id.clone();
    let refusal = |row: &ApprovalRow| -> CallError {
        match row.state_now(now_ms()) {
            states::DENIED => approvals.denial(row),
            states::SPENT => CallError::ApprovalSpent {
                approval_id: row.id.clone(),
            },
            states::PENDING => CallError::ApprovalPending {
                tool: recorder.held.tool.to_owned(),
                approval_id: row.id.clone(),
                rule: recorder.rule.to_owned(),
                expires_at_ms: row.expires_at_ms,
            },
            _ => CallError::ApprovalExpired {
                approval_id: row.id.clone(),
                approved: row.decided_at_ms > 0,
            },
        }
    };
    if row.state_now(now_ms()) == states::APPROVED {
        if store
            .spend_call_approval(&id, &row.tenant, binding)
            .await
            .map_err(|e| unavailable(&e))?
        {
            recorder.event(&id, "call_approval_spent", None);
            approvals
                .metrics
                .call_approvals()
                .event(&row.tenant, "spent");
            return Ok(id);
        }
        // Another call spent it (or it expired) meanwhile.
        let now = store
            .call_approval(&id, &row.tenant)
            .await
            .map_err(|e| unavailable(&e))?;
        let error = now.as_ref().map_or_else(
            || CallError::ApprovalNotFound {
                approval_id: id.clone(),
            },
            refusal,
        );
        recorder.refused(&id, crate::calls::classify(&error).1);
        return Err(error);
    }
    let error = refusal(row);
    if !matches!(error, CallError::ApprovalPending { .. }) {
        recorder.refused(&id, crate::calls::classify(&error).1);
    }
    Err(error)
}

/// Gives back the use a call spent of approval `id` when it sent nothing
/// after all (a server down, a guard's refusal): the approved call has
/// not run.
pub(crate) async fn return_use(approvals: &CallApprovals, origin: &Origin, id: &str) {
    let Ok(store) = approvals.store() else { return };
    match store.return_call_approval(id, &origin.tenant.name).await {
        Ok(true) => {
            approvals
                .metrics
                .call_approvals()
                .event(&origin.tenant.name, "returned");
            // What the approval is about, for its record.
            let details = store
                .call_approval(id, &origin.tenant.name)
                .await
                .ok()
                .flatten()
                .and_then(|row| Details::from_bytes(&row.value).ok());
            let part = |get: fn(&Details) -> &str| details.as_ref().map_or("", get);
            approvals.audit.call_approval(&CallApprovalEvent {
                event: "call_approval_returned",
                tenant: &origin.tenant.name,
                subject: origin.subject.key(),
                caller: Some(&origin.caller.identity),
                approval_id: id,
                tool: part(|d| &d.tool),
                server: part(|d| &d.server),
                definition_hash: part(|d| &d.definition_hash),
                rule: part(|d| &d.rule),
                note: None,
                reason: None,
                trace_id: None,
            });
        }
        Ok(false) => {}
        Err(error) => tracing::warn!(
            %error,
            approval = id,
            "a call that spent a call approval sent nothing, and the use could not be given back"
        ),
    }
}

/// Puts one held call's approval events on the audit trail.
struct Recorder<'a> {
    approvals: &'a CallApprovals,
    held: &'a Held<'a>,
    origin: &'a Origin,
    rule: &'a str,
}

impl Recorder<'_> {
    fn event(&self, id: &str, event: &str, reason: Option<&str>) {
        let trace_id = self
            .origin
            .trace
            .iter()
            .find(|(key, _)| key == "traceparent")
            .and_then(|(_, value)| crate::telemetry::trace::traceparent_id(value));
        self.approvals.audit.call_approval(&CallApprovalEvent {
            event,
            tenant: &self.held.tenant.name,
            subject: self.origin.subject.key(),
            caller: Some(&self.origin.caller.identity),
            approval_id: id,
            tool: self.held.tool,
            server: self.held.server,
            definition_hash: self.held.definition_hash,
            rule: self.rule,
            note: None,
            reason,
            trace_id: trace_id.as_deref(),
        });
    }

    /// A call named approval `id` and may not use it, for `reason`.
    fn refused(&self, id: &str, reason: &str) {
        self.event(id, "call_approval_refused", Some(reason));
        self.approvals
            .metrics
            .call_approvals()
            .event(&self.held.tenant.name, "refused");
    }
}

/// A duration in milliseconds, saturating.
pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl CallApprovals {
    /// The refusal of a call whose approval `row` was denied: by whom, why.
    pub(crate) fn denial(&self, row: &ApprovalRow) -> CallError {
        let details = Details::from_bytes(&row.value).ok();
        CallError::ApprovalDenied {
            approval_id: row.id.clone(),
            decided_by: details
                .as_ref()
                .map_or_else(String::new, |d| d.decided_by.clone()),
            reason: details.map_or_else(String::new, |d| d.reason),
        }
    }

    /// Approval `id` of `tenant` as stored (`None`: none).
    ///
    /// # Errors
    /// The state store is down or not configured.
    pub(crate) async fn row_of(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<ApprovalRow>, CallError> {
        self.store()?
            .call_approval(id, tenant)
            .await
            .map_err(|e| unavailable(&e))
    }
}
