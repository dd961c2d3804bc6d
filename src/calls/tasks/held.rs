//! Tasks of calls held for approval: a call with `accepts_task` that a
//! `require_approval` rule holds becomes toolgate's own task at once,
//! `working` while the approval is pending. The first `GetTask` (at any
//! replica) after the approval is given starts the call: it spends the
//! approval and goes through the pipeline as the call would have; the
//! task then follows the server's task (the call became one), or holds
//! the call's result. A denial or an expiry ends the task `failed`.
//!
//! Of racing `GetTask`s one spends the approval and starts the call; the
//! others answer `working` until the row says how it went. A start that
//! sent nothing and may be retried (the server down) leaves the task
//! `working`, the approval's use given back: the next `GetTask` tries
//! again.

use rmcp::model::CallToolResult;
use serde::{Deserialize, Serialize};

use super::{Events, PREFIX, Stored, Task, TaskCall, id_hash, random_id};
use crate::calls::error::CallError;
use crate::calls::pipeline::{Outcome, Recorded, Reply, Unencodable};
use crate::calls::{ApprovalNotice, Origin, ToolCall};
use crate::state::StateStore;
use crate::state::call_approvals::states;
use crate::upstream::tasks::TaskStatus;

/// A held call, as its task row keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct HeldCall {
    /// The approval it waits for.
    pub(super) approval_id: String,
    /// The rule that asked.
    pub(super) rule: String,
    /// The call's arguments as the worker sent them.
    pub(super) arguments_json: String,
    /// The call's result, once it ran without becoming a task.
    #[serde(default)]
    pub(super) result: Option<CallToolResult>,
    /// Why it failed, as the worker is told (once it cannot run).
    #[serde(default)]
    pub(super) failure: Option<String>,
}

/// Makes the held call `call` of `tool` a task of the worker's, waiting
/// for approval `notice`, kept until the approval could have been used
/// and the server's task kept (`ttl` after the approval's expiry).
///
/// # Errors
/// The state store is missing or down, or the tenant has its most open
/// tasks.
pub(crate) async fn park(
    events: &Events,
    parked: &Parked<'_>,
    notice: &ApprovalNotice,
) -> Result<Task, CallError> {
    let state = events
        .store
        .as_ref()
        .ok_or_else(|| CallError::StateUnavailable {
            server: parked.server.to_owned(),
            reason: "no state store is open for tasks: restart the gateway".to_owned(),
        })?;
    let stored = Stored {
        subject: parked.subject.to_owned(),
        server: parked.server.to_owned(),
        tool: parked.tool.to_owned(),
        upstream_id: String::new(),
        replica: None,
        status: "working".to_owned(),
        held: Some(HeldCall {
            approval_id: notice.approval_id.clone(),
            rule: notice.rule.clone(),
            arguments_json: parked.arguments_json.to_owned(),
            result: None,
            failure: None,
        }),
    };
    let task_id = random_id(PREFIX);
    let expires_at_ms = notice
        .expires_at_ms
        .saturating_add(i64::try_from(parked.ttl.as_millis()).unwrap_or(i64::MAX));
    let value = serde_json::to_vec(&stored).expect("a task record serialises");
    let kept = state
        .put_task(
            &task_id,
            parked.tenant,
            &value,
            expires_at_ms,
            super::MAX_OPEN_TASKS,
        )
        .await
        .map_err(|e| super::state_failure(parked.server, &e))?;
    if !kept {
        return Err(CallError::TaskLimit {
            server: parked.server.to_owned(),
            limit: super::MAX_OPEN_TASKS,
        });
    }
    events.record(parked.tenant, &task_id, &stored, "created");
    Ok(waiting(&task_id, &stored, expires_at_ms, notice))
}

/// What a held call's task is made of.
pub(crate) struct Parked<'a> {
    /// The tenant.
    pub(crate) tenant: &'a str,
    /// The subject key of the call.
    pub(crate) subject: &'a str,
    /// The server.
    pub(crate) server: &'a str,
    /// The exposed tool name.
    pub(crate) tool: &'a str,
    /// The arguments as sent.
    pub(crate) arguments_json: &'a str,
    /// How long the task is kept past the approval's expiry (the server's
    /// `input.task_ttl`).
    pub(crate) ttl: std::time::Duration,
}

/// A held task waiting for its approval.
fn waiting(task_id: &str, stored: &Stored, expires_at_ms: i64, notice: &ApprovalNotice) -> Task {
    let mut task = held_task(task_id, stored, expires_at_ms, TaskStatus::Working);
    task.status_message = format!(
        "waiting for call approval {} (policy rule {}); it starts once approved",
        notice.approval_id, notice.rule
    );
    task
}

/// A held task's [`Task`] with `status` and nothing else said.
fn held_task(task_id: &str, stored: &Stored, expires_at_ms: i64, status: TaskStatus) -> Task {
    Task {
        task_id: task_id.to_owned(),
        server: stored.server.clone(),
        tool: stored.tool.clone(),
        status,
        status_message: String::new(),
        poll_interval_ms: 2000,
        expires_at_unix_ms: expires_at_ms,
        result: None,
        input_required: None,
        failed: None,
    }
}

/// What the pipeline answers a held call started here: its outcome.
pub(crate) struct Begun(Outcome<CallToolResult>);

impl Recorded for Begun {
    fn is_error(&self) -> bool {
        matches!(&self.0, Outcome::Done(result) if result.is_error == Some(true))
    }
}

impl Reply<CallToolResult> for Begun {
    fn encode(outcome: Outcome<CallToolResult>, _server: &str) -> Result<Self, Unencodable> {
        Ok(Self(outcome))
    }

    fn encoded_len(&self) -> usize {
        // Bounded when the task is answered (`max_message_bytes`).
        0
    }
}

/// `GetTask` of held task `task_id` (`stored`): its approval's state, or
/// the call started once approved.
///
/// # Errors
/// The state store down.
pub(super) async fn get(
    rpc: &TaskCall,
    task_id: &str,
    mut stored: Stored,
    expires_at_ms: i64,
    state: &StateStore,
) -> Result<Task, CallError> {
    let held = stored.held.clone().expect("a held task");
    if let Some(result) = held.result {
        let mut task = held_task(task_id, &stored, expires_at_ms, TaskStatus::Completed);
        task.result = Some(result);
        return Ok(task);
    }
    if let Some(failure) = held.failure {
        let mut task = held_task(task_id, &stored, expires_at_ms, TaskStatus::Failed);
        task.status_message = failure;
        return Ok(task);
    }
    if stored.status == "cancelled" {
        return Ok(held_task(
            task_id,
            &stored,
            expires_at_ms,
            TaskStatus::Cancelled,
        ));
    }
    let approvals = rpc.calls.call_approvals();
    let notice = ApprovalNotice {
        approval_id: held.approval_id.clone(),
        expires_at_ms,
        rule: held.rule.clone(),
    };
    let row = approvals
        .row_of(&rpc.tenant.name, &held.approval_id)
        .await?;
    let now = crate::state::now_ms();
    match row.as_ref().map(|r| r.state_now(now)) {
        Some(states::PENDING) => return Ok(waiting(task_id, &stored, expires_at_ms, &notice)),
        Some(states::APPROVED) => {}
        // Spent by a racing GetTask that is starting it: wait for it.
        Some(states::SPENT) => {
            let mut task = held_task(task_id, &stored, expires_at_ms, TaskStatus::Working);
            task.status_message = format!(
                "call approval {} was given; the call is starting",
                held.approval_id
            );
            return Ok(task);
        }
        _ => {
            // Denied, expired, or gone: the call will not run.
            let error = match row {
                Some(row) if row.state == states::DENIED => approvals.denial(&row),
                Some(row) => CallError::ApprovalExpired {
                    approval_id: row.id.clone(),
                    approved: row.decided_at_ms > 0,
                },
                None => CallError::ApprovalNotFound {
                    approval_id: held.approval_id.clone(),
                },
            };
            return end(rpc, task_id, &mut stored, expires_at_ms, state, &error).await;
        }
    }
    // Approved: start the call, as the worker's call would have run.
    let origin = Origin {
        tenant: rpc.tenant.clone(),
        caller: rpc.caller.clone(),
        subject: rpc.subject.clone(),
        deadline: rpc.deadline,
        started: std::time::Instant::now(),
        rpc: "GetTask",
        peer: None,
        trace: Vec::new(),
    };
    let call = ToolCall {
        name: stored.tool.clone(),
        arguments_json: held.arguments_json.clone(),
        accepts_task: true,
        approval_id: held.approval_id.clone(),
        adopt: Some((task_id.to_owned(), expires_at_ms)),
        ..ToolCall::default()
    };
    tracing::info!(tenant = %rpc.tenant.name, task = %id_hash(task_id), approval = %held.approval_id, "a held call's approval was given: starting it");
    match rpc.calls.run::<ToolCall, Begun>(origin, call).await {
        // It became the server's task, kept under this task's id.
        Ok(Begun(Outcome::Task(task))) => Ok(*task),
        Ok(Begun(Outcome::Done(result))) => {
            let mut kept = stored.clone();
            if let Some(held) = &mut kept.held {
                held.result = Some(result.clone());
            }
            kept.status = "completed".to_owned();
            replace(rpc, task_id, &kept, state).await;
            rpc.events
                .record(&rpc.tenant.name, task_id, &kept, "completed");
            let mut task = held_task(task_id, &kept, expires_at_ms, TaskStatus::Completed);
            task.result = Some(result);
            Ok(task)
        }
        Ok(Begun(Outcome::Questions(_))) => {
            let error = CallError::InputResponseInvalid {
                reason: "the tool asked questions, which a held task cannot carry: call it \
                         over InvokeToolInteractive"
                    .to_owned(),
            };
            end(rpc, task_id, &mut stored, expires_at_ms, state, &error).await
        }
        Err(error) => {
            let (code, _) = crate::calls::classify(&error);
            let raced = matches!(error, CallError::ApprovalSpent { .. });
            if raced || code == tonic::Code::Unavailable {
                // Another GetTask started it, or nothing was sent and a
                // retry is safe (the use was given back): still working.
                let mut task = held_task(task_id, &stored, expires_at_ms, TaskStatus::Working);
                task.status_message = if raced {
                    "the call is starting".to_owned()
                } else {
                    format!(
                        "approved; the call could not start yet ({}), the next GetTask tries again",
                        told(&error)
                    )
                };
                return Ok(task);
            }
            end(rpc, task_id, &mut stored, expires_at_ms, state, &error).await
        }
    }
}

/// Ends held task `task_id` failed with `error` (kept, so that every
/// replica answers the same).
async fn end(
    rpc: &TaskCall,
    task_id: &str,
    stored: &mut Stored,
    expires_at_ms: i64,
    state: &StateStore,
    error: &CallError,
) -> Result<Task, CallError> {
    let message = told(error);
    if let Some(held) = &mut stored.held {
        held.failure = Some(message.clone());
    }
    stored.status = "failed".to_owned();
    replace(rpc, task_id, stored, state).await;
    rpc.events
        .record(&rpc.tenant.name, task_id, stored, "failed");
    let mut task = held_task(task_id, stored, expires_at_ms, TaskStatus::Failed);
    task.status_message = message;
    Ok(task)
}

/// Cancels held task `task_id`: it will not start (its approval, if
/// given, stays unused).
///
/// # Errors
/// `TASK_FINISHED` once it ended.
pub(super) async fn cancel(
    rpc: &TaskCall,
    task_id: &str,
    mut stored: Stored,
    expires_at_ms: i64,
    state: &StateStore,
) -> Result<Task, CallError> {
    if stored.status != "working" {
        return get(rpc, task_id, stored, expires_at_ms, state).await;
    }
    stored.status = "cancelled".to_owned();
    replace(rpc, task_id, &stored, state).await;
    rpc.events
        .record(&rpc.tenant.name, task_id, &stored, "cancelled");
    Ok(held_task(
        task_id,
        &stored,
        expires_at_ms,
        TaskStatus::Cancelled,
    ))
}

/// Writes `stored` back (a failure is logged: the next GetTask decides
/// again).
async fn replace(rpc: &TaskCall, task_id: &str, stored: &Stored, state: &StateStore) {
    let value = serde_json::to_vec(stored).expect("a task record serialises");
    if let Err(error) = state.replace_task(task_id, &rpc.tenant.name, &value).await {
        tracing::warn!(tenant = %rpc.tenant.name, task = %id_hash(task_id), %error, "a held task's state could not be stored");
    }
}

/// What a worker is told of `error` in a held task's status message.
fn told(error: &CallError) -> String {
    let text = error.to_string();
    match text.char_indices().nth(1024) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}
