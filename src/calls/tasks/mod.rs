//! Tasks (SEP-2663) that workers follow themselves: a call with
//! `accepts_task` that the server turns into a task answers at once with
//! toolgate's own task id, and `GetTask`, `UpdateTask`, `CancelTask` reach
//! the server's task from any replica.
//!
//! The id a worker sees is `tgt_` and 16 random bytes (base64url); the state
//! store keeps, under a hash of it and sealed to it and the tenant, whose
//! task it is (subject), its server, tool and the server's task id. A
//! lookup that finds nothing, an expired task, a malformed id and another
//! tenant's or subject's task all get the one answer `TASK_NOT_FOUND`. Each
//! task RPC takes a token of the tenant's rate, and the tenant's policy and
//! the approvals apply to the stored tool as to a call; the request goes to
//! the server through this replica's own session of (tenant[, subject],
//! server). A stdio server's task lives in the child of the replica that
//! started it: another replica answers `TASK_ELSEWHERE` (UNAVAILABLE).

mod held;

pub(crate) use held::{Parked, park};

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use base64::Engine as _;
use rmcp::model::CreateTaskResult;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::error::CallError;
use super::{Calls, rounds};
use crate::callers::{Caller, Subject};
use crate::catalog::CatalogTool;
use crate::config::{ServerConfig, Transport};
use crate::registry::Tenant;
use crate::state::{StateError, StateStore};
use crate::telemetry::Metrics;
use crate::upstream::tasks::{DetailedTask, TaskPayload, TaskStatus};
use crate::upstream::{Session, UpstreamError};

/// The prefix of toolgate's task ids.
const PREFIX: &str = "tgt_";

/// The length of a task id: the prefix and 16 bytes in base64url.
const ID_LEN: usize = PREFIX.len() + 22;

/// The most open tasks a tenant may have.
pub(crate) const MAX_OPEN_TASKS: u64 = 1000;

/// How long a task RPC waits for the server when the caller set no
/// deadline.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// This process, for the tasks of stdio servers (which only it reaches).
static REPLICA: LazyLock<String> = LazyLock::new(|| random_id(""));

/// Where tasks are kept, and where their events go.
#[derive(Debug, Clone)]
pub(crate) struct Events {
    store: Option<StateStore>,
    metrics: Arc<Metrics>,
    audit: crate::audit::Audit,
}

impl Events {
    /// The gateway's task store, metrics and audit trail.
    pub(crate) fn of(calls: &Calls) -> Self {
        Self {
            store: calls.task_store.clone(),
            metrics: calls.metrics.clone(),
            audit: calls.audit.clone(),
        }
    }

    /// Counts and records `event` of the task `task_id` described by
    /// `stored`.
    fn record(&self, tenant: &str, task_id: &str, stored: &Stored, event: &str) {
        self.metrics
            .task_event(tenant, &stored.server, &stored.tool, event);
        self.audit.task(
            tenant,
            &stored.subject,
            &stored.server,
            &stored.tool,
            &format!("task_{event}"),
            &id_hash(task_id),
        );
    }
}

/// What the state store keeps of a task (sealed).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    /// The subject key of the caller that started it (empty: the tenant).
    subject: String,
    /// The server.
    server: String,
    /// The exposed tool name.
    tool: String,
    /// The server's task id.
    upstream_id: String,
    /// For a stdio server: the replica whose child runs it.
    replica: Option<String>,
    /// The status last seen (`working`, `input_required`, `completed`,
    /// `failed`, `cancelled`).
    status: String,
    /// A call held for approval, not started yet (`upstream_id` empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    held: Option<held::HeldCall>,
}

/// A call that became a task, and for whom.
pub(crate) struct Started<'a> {
    /// The tenant object that routed the call.
    pub(crate) tenant: &'a Tenant,
    /// The tool's server.
    pub(crate) server: &'a ServerConfig,
    /// The tool.
    pub(crate) tool: &'a CatalogTool,
    /// Whose call it was.
    pub(crate) subject: &'a Subject,
    /// Where its events go.
    pub(crate) events: &'a Events,
    /// Whether the tool is annotated `idempotentHint: true`.
    pub(crate) idempotent: bool,
    /// The held task this call was started for (its id and expiry): the
    /// server's task is kept under that id instead of a new one.
    pub(crate) adopt: Option<(&'a str, i64)>,
}

/// Before a call with `accepts_task` is sent: the state store that would
/// keep its task is reachable, and the tenant has room for one more open
/// task. Else nothing is sent: a task that could not be kept would reach
/// the server (and the tool act) for a caller told to retry.
///
/// # Errors
/// The state store is missing or down (`STATE_UNAVAILABLE`), or the
/// tenant has [`MAX_OPEN_TASKS`] open tasks (`TASK_LIMIT`).
pub(crate) async fn admit(events: &Events, tenant: &str, server: &str) -> Result<(), CallError> {
    let state = events
        .store
        .as_ref()
        .ok_or_else(|| CallError::StateUnavailable {
            server: server.to_owned(),
            reason: "no state store is open for tasks: restart the gateway".to_owned(),
        })?;
    let open = state
        .count_tasks(tenant)
        .await
        .map_err(|e| state_failure(server, &e))?;
    if open >= MAX_OPEN_TASKS {
        return Err(CallError::TaskLimit {
            server: server.to_owned(),
            limit: MAX_OPEN_TASKS,
        });
    }
    Ok(())
}

/// Keeps the task a call became and returns toolgate's task for it. When it
/// cannot be kept, the server's task is cancelled.
///
/// # Errors
/// The state store went down since [`admit`] ([`CallError::TaskNotKept`]:
/// the tool may have acted), or the tenant has too many open tasks.
pub(crate) async fn start(
    started: &Started<'_>,
    session: &Arc<Session>,
    created: CreateTaskResult,
) -> Result<Task, CallError> {
    let Started {
        tenant,
        server,
        tool,
        events,
        ..
    } = *started;
    let upstream_id = created.task.task_id.clone();
    let kept = keep(started, &created).await;
    let (task_id, stored, expires_at_ms) = match kept {
        Ok(kept) => kept,
        Err(error) => {
            // Nobody could follow it: stop it.
            let session = session.clone();
            tokio::spawn(async move {
                let _ = session
                    .cancel_task(&upstream_id, crate::upstream::tasks::CANCEL_TIMEOUT)
                    .await;
            });
            // The server has the call: a store that failed since `admit`
            // is not "nothing reached the tool".
            return Err(match error {
                CallError::StateUnavailable { server, reason } => CallError::TaskNotKept {
                    server,
                    reason,
                    idempotent: started.idempotent,
                },
                other => other,
            });
        }
    };
    events.record(&tenant.name, &task_id, &stored, "created");
    tracing::debug!(tenant = %tenant.name, server = %server.name, tool = %tool.name, task = %id_hash(&task_id), "task created");
    Ok(Task {
        task_id,
        server: tool.server.clone(),
        tool: tool.name.clone(),
        status: created.task.status,
        status_message: status_message(session, created.task.status_message.as_deref()),
        poll_interval_ms: poll_ms(created.task.poll_interval_ms),
        expires_at_unix_ms: expires_at_ms,
        result: None,
        input_required: None,
        failed: None,
    })
}

/// Stores the task: its new id, what is kept, and when it expires.
async fn keep(
    started: &Started<'_>,
    created: &CreateTaskResult,
) -> Result<(String, Stored, i64), CallError> {
    let Started {
        tenant,
        server,
        tool,
        subject,
        events,
        ..
    } = *started;
    let state = events
        .store
        .clone()
        .ok_or_else(|| CallError::StateUnavailable {
            server: server.name.clone(),
            reason: "no state store is open for tasks: restart the gateway".to_owned(),
        })?;
    let unavailable = |e: StateError| state_failure(&server.name, &e);
    let ttl = created
        .task
        .ttl_ms
        .map_or(server.input.task_ttl, Duration::from_millis)
        .min(server.input.task_ttl);
    let expires_at_ms =
        crate::state::now_ms().saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
    let stored = Stored {
        subject: subject.key().to_owned(),
        server: server.name.clone(),
        tool: tool.name.clone(),
        upstream_id: created.task.task_id.clone(),
        replica: matches!(server.transport, Transport::Stdio { .. }).then(|| REPLICA.clone()),
        status: status_name(created.task.status).to_owned(),
        held: None,
    };
    let value = serde_json::to_vec(&stored).expect("a task record serialises");
    if let Some((task_id, expires_at_ms)) = started.adopt {
        // A held task started: it follows the server's task from now on.
        let kept = state
            .replace_task(task_id, &tenant.name, &value)
            .await
            .map_err(unavailable)?;
        if !kept {
            return Err(CallError::TaskNotFound);
        }
        return Ok((task_id.to_owned(), stored, expires_at_ms));
    }
    let task_id = random_id(PREFIX);
    // The count of open tasks and the insert are one step in the store:
    // racing calls cannot pass the limit together.
    let kept = state
        .put_task(
            &task_id,
            &tenant.name,
            &value,
            expires_at_ms,
            MAX_OPEN_TASKS,
        )
        .await
        .map_err(unavailable)?;
    if !kept {
        return Err(CallError::TaskLimit {
            server: server.name.clone(),
            limit: MAX_OPEN_TASKS,
        });
    }
    Ok((task_id, stored, expires_at_ms))
}

/// What a task RPC brings ([`Calls::task_call`]).
#[derive(Debug)]
pub struct TaskCall {
    /// The caller's tenant.
    pub(crate) tenant: Arc<Tenant>,
    /// Who is calling.
    pub(crate) caller: Caller,
    /// For whom.
    pub(crate) subject: Subject,
    /// The caller's deadline, if it set one.
    pub(crate) deadline: Option<Duration>,
    /// Where task events go.
    pub(crate) events: Events,
    /// The calls (a held task's call starts through their pipeline).
    pub(crate) calls: Calls,
}

/// A task handed to a worker, as the server has it now.
#[derive(Debug)]
pub struct Task {
    /// toolgate's id of the task (not the server's).
    pub task_id: String,
    /// The tool's server.
    pub server: String,
    /// The exposed tool name.
    pub tool: String,
    /// Where the task is.
    pub status: TaskStatus,
    /// The server's description of the status (redacted, bounded).
    pub status_message: String,
    /// How long to wait before asking again, as the server suggests.
    pub poll_interval_ms: u32,
    /// When toolgate forgets the task (Unix time, milliseconds).
    pub expires_at_unix_ms: i64,
    /// The call's result, once the task completed (through the guards'
    /// response phase).
    pub result: Option<rmcp::model::CallToolResult>,
    /// The questions to answer, when the task waits for answers.
    pub input_required: Option<Vec<crate::upstream::Asked>>,
    /// What a failed task ended with, as a direct call's error would say
    /// it.
    pub failed: Option<CallError>,
}

/// A task found for its caller, with what reaches it.
struct Found {
    task_id: String,
    stored: Stored,
    expires_at_ms: i64,
    state: StateStore,
    tool: CatalogTool,
    session: Arc<Session>,
    timeout: Duration,
    max_result_bytes: usize,
    /// The guards of the tool's server (a completed task's result goes
    /// through their response phase).
    guards: crate::guards::Chain,
}

/// GetTask: the task as the server has it now.
///
/// # Errors
/// `TASK_NOT_FOUND`, the refusals of a call on the tool (policy,
/// approvals), `TASK_ELSEWHERE`, the server's failure.
pub async fn get(rpc: &TaskCall, task_id: &str) -> Result<Task, CallError> {
    let row = lookup(rpc, task_id).await?;
    if row.stored.held.is_some() {
        return held::get(rpc, task_id, row.stored, row.expires_at_ms, &row.state).await;
    }
    let mut found = find(rpc, task_id, row).await?;
    let task = found.upstream_get(rpc).await?;
    found.observe(rpc, &task).await;
    found.to_task(&task, rpc).await
}

/// UpdateTask: answers the task's questions (`tasks/update`), then reads
/// it again.
///
/// # Errors
/// As [`get`], `INPUT_RESPONSE_INVALID`, and `TASK_FINISHED` for a task
/// that has ended.
pub async fn update(
    rpc: &TaskCall,
    task_id: &str,
    responses: &[rounds::InputResponse],
) -> Result<Task, CallError> {
    let answers = rounds::answers(responses, rpc.tenant.limits().max_argument_bytes)?;
    let row = lookup(rpc, task_id).await?;
    if row.stored.held.is_some() {
        let task = held::get(rpc, task_id, row.stored, row.expires_at_ms, &row.state).await?;
        if answers.is_empty() || task.status.is_terminal() {
            return Ok(task);
        }
        return Err(CallError::InputResponseInvalid {
            reason: "the task asks nothing now (it waits for a call approval)".to_owned(),
        });
    }
    let mut found = find(rpc, task_id, row).await?;
    let task = found.upstream_get(rpc).await?;
    found.observe(rpc, &task).await;
    let requests = match &task.payload {
        TaskPayload::InputRequired { input_requests } => input_requests,
        _ if task.status().is_terminal() => {
            return Err(CallError::TaskFinished {
                status: status_name(task.status()),
            });
        }
        _ => {
            if answers.is_empty() {
                return found.to_task(&task, rpc).await;
            }
            return Err(CallError::InputResponseInvalid {
                reason: "the task asks nothing now (it is working)".to_owned(),
            });
        }
    };
    let asked = crate::upstream::tasks::asked(requests);
    let invalid = |e: crate::upstream::AnswerError| CallError::InputResponseInvalid {
        reason: e.to_string(),
    };
    let mut inputs = crate::upstream::tasks::roots_responses(requests);
    for (question, answer) in
        crate::upstream::input::match_answers(&asked, &answers).map_err(invalid)?
    {
        if let Some(value) = answer
            .to_input_response(&question.question)
            .map_err(invalid)?
        {
            inputs.insert(question.id.clone(), value);
        }
    }
    found
        .session
        .update_task(&found.stored.upstream_id, inputs, found.timeout)
        .await
        .map_err(|e| upstream_failure(&found.tool, &rpc.subject, e))?;
    rpc.events
        .record(&rpc.tenant.name, &found.task_id, &found.stored, "updated");
    let task = found.upstream_get(rpc).await?;
    found.observe(rpc, &task).await;
    found.to_task(&task, rpc).await
}

/// CancelTask: asks the server to cancel the task (`tasks/cancel`; a
/// finished task stays as it ended), then reads it again.
///
/// # Errors
/// As [`get`].
pub async fn cancel(rpc: &TaskCall, task_id: &str) -> Result<Task, CallError> {
    let row = lookup(rpc, task_id).await?;
    if row.stored.held.is_some() {
        return held::cancel(rpc, task_id, row.stored, row.expires_at_ms, &row.state).await;
    }
    let mut found = find(rpc, task_id, row).await?;
    found
        .session
        .cancel_task(&found.stored.upstream_id, found.timeout)
        .await
        .map_err(|e| upstream_failure(&found.tool, &rpc.subject, e))?;
    let task = found.upstream_get(rpc).await?;
    found.observe(rpc, &task).await;
    found.to_task(&task, rpc).await
}

/// A task row of the caller's.
struct Row {
    stored: Stored,
    expires_at_ms: i64,
    state: StateStore,
}

/// The caller's task `task_id`: looked up by hash, for this tenant and
/// subject only.
async fn lookup(rpc: &TaskCall, task_id: &str) -> Result<Row, CallError> {
    if !well_formed(task_id) {
        return Err(CallError::TaskNotFound);
    }
    let Some(state) = rpc.events.store.clone() else {
        return Err(CallError::TaskNotFound);
    };
    let row = state
        .get_task(task_id, &rpc.tenant.name)
        .await
        .map_err(|e| state_failure("", &e))?;
    let Some((value, expires_at_ms)) = row else {
        return Err(CallError::TaskNotFound);
    };
    let stored: Stored = serde_json::from_slice(&value).map_err(|_| CallError::TaskNotFound)?;
    if stored.subject != rpc.subject.key() {
        return Err(CallError::TaskNotFound);
    }
    Ok(Row {
        stored,
        expires_at_ms,
        state,
    })
}

/// What reaches the caller's task of `row`: the tool checked as for a
/// call.
async fn find(rpc: &TaskCall, task_id: &str, row: Row) -> Result<Found, CallError> {
    let Row {
        stored,
        expires_at_ms,
        state,
    } = row;
    let resolved =
        super::route::task_tool(&rpc.tenant, &stored.tool, &rpc.caller, &rpc.subject).await?;
    let Some(tool) = resolved.catalog.get(&stored.tool).cloned() else {
        return Err(CallError::ToolNotFound {
            name: stored.tool.clone(),
        });
    };
    if tool.server != stored.server {
        // The name routes to another server since a reload.
        return Err(CallError::TaskNotFound);
    }
    if let Some(replica) = &stored.replica
        && *replica != *REPLICA
    {
        return Err(CallError::TaskElsewhere {
            server: stored.server.clone(),
        });
    }
    // The tenant's session, or for a per-user server the subject's own,
    // as for a call.
    let session = super::session::session(
        &resolved.tenant,
        tool.server_index,
        &rpc.subject,
        &tool.name.as_str().into(),
        false,
    )
    .await?;
    let server = resolved.tenant.server(tool.server_index);
    let timeout = rpc
        .deadline
        .unwrap_or(DEFAULT_TIMEOUT)
        .min(server.max_call_timeout);
    Ok(Found {
        task_id: task_id.to_owned(),
        stored,
        expires_at_ms,
        state,
        max_result_bytes: resolved.tenant.limits().max_result_bytes,
        guards: resolved.tenant.guards(tool.server_index),
        tool,
        session,
        timeout,
    })
}

impl Found {
    /// `tasks/get` at the server.
    async fn upstream_get(&self, rpc: &TaskCall) -> Result<DetailedTask, CallError> {
        self.session
            .get_task(&self.stored.upstream_id, self.timeout)
            .await
            .map_err(|e| upstream_failure(&self.tool, &rpc.subject, e))
    }

    /// Notes a change of status: the row, the metric and the record (a
    /// change seen by two replicas at once may be counted twice).
    async fn observe(&mut self, rpc: &TaskCall, task: &DetailedTask) {
        let status = status_name(task.status());
        if self.stored.status == status {
            return;
        }
        self.stored.status = status.to_owned();
        let value = serde_json::to_vec(&self.stored).expect("a task record serialises");
        if let Err(error) = self
            .state
            .replace_task(&self.task_id, &rpc.tenant.name, &value)
            .await
        {
            tracing::warn!(tenant = %rpc.tenant.name, server = %self.stored.server, %error, "a task's status could not be stored");
        }
        if task.status().is_terminal() {
            rpc.events
                .record(&rpc.tenant.name, &self.task_id, &self.stored, status);
        }
    }

    /// A completed task's result through the response phase of its
    /// server's guards (a retry of GetTask is safe: it acts on nothing).
    async fn guarded(
        &self,
        result: rmcp::model::CallToolResult,
        rpc: &TaskCall,
    ) -> Result<rmcp::model::CallToolResult, CallError> {
        if self.guards.skips(crate::guards::Phase::Response) {
            return Ok(result);
        }
        let redaction = self.session.redaction().clone();
        let redact = move |text: &str| redaction.redact(text).into_owned();
        let info = crate::guards::CallInfo {
            tenant: &rpc.tenant.name,
            subject: &rpc.subject,
            caller: Some(&rpc.caller),
            target: crate::pb::guard::Target {
                kind: crate::pb::guard::TargetKind::Tool as i32,
                name: self.stored.tool.clone(),
                server: self.tool.server.clone(),
                upstream_name: self.tool.upstream_name.clone(),
                definition_hash: self.tool.definition_hash.clone(),
            },
            // The task's, as its audit records name it.
            call_id: id_hash(&self.task_id),
            trace: super::guards::trace_fields(&[]),
            redact: &redact,
            metrics: &rpc.events.metrics,
        };
        let mut acted = Vec::new();
        self.guards
            .response(&info, result, self.max_result_bytes, &mut acted)
            .await
            .map_err(|stop| {
                CallError::guard(
                    stop,
                    self.stored.tool.clone().into(),
                    &self.tool.server,
                    true,
                )
            })
    }

    /// The worker's [`Task`] of the server's `task`.
    async fn to_task(&self, task: &DetailedTask, rpc: &TaskCall) -> Result<Task, CallError> {
        let mut out = Task {
            task_id: self.task_id.clone(),
            server: self.stored.server.clone(),
            tool: self.stored.tool.clone(),
            status: task.status(),
            status_message: status_message(&self.session, task.task.status_message.as_deref()),
            poll_interval_ms: poll_ms(task.task.poll_interval_ms),
            expires_at_unix_ms: self.expires_at_ms,
            result: None,
            input_required: None,
            failed: None,
        };
        match &task.payload {
            TaskPayload::Completed { result } => {
                let result =
                    self.session
                        .task_result(result.clone())
                        .map_err(|e| CallError::Upstream {
                            server: self.stored.server.clone(),
                            tool: (self.stored.tool.clone()).into(),
                            error: UpstreamError::Protocol(e.to_string()),
                            idempotent: false,
                        })?;
                out.result = Some(self.guarded(result, rpc).await?);
            }
            TaskPayload::Failed { error } => {
                // The server's own status message may repeat the error:
                // logged, not handed out.
                if !out.status_message.is_empty() {
                    tracing::info!(server = %self.stored.server, tool = %self.stored.tool, task = %id_hash(&self.task_id), status_message = %out.status_message, "a task failed");
                }
                out.failed = Some(CallError::Upstream {
                    server: self.stored.server.clone(),
                    tool: (self.stored.tool.clone()).into(),
                    error: self.session.task_error(error),
                    idempotent: false,
                });
            }
            TaskPayload::InputRequired { input_requests } => {
                out.input_required = Some(crate::upstream::tasks::asked(input_requests));
            }
            _ => {}
        }
        Ok(out)
    }
}

/// A server's status message of a task as the worker sees it: redacted
/// and bounded like any upstream text.
fn status_message(session: &Session, message: Option<&str>) -> String {
    message.map_or_else(String::new, |m| session.redaction().upstream_text(m))
}

/// The status of a failed `tasks/*` request: a task the server no
/// longer knows (`-32602`: expired there, or its stdio child restarted) is
/// `TASK_NOT_FOUND`; anything else as for a call.
fn upstream_failure(tool: &CatalogTool, subject: &Subject, error: UpstreamError) -> CallError {
    match error {
        UpstreamError::JsonRpc { code: -32602, .. } => CallError::TaskNotFound,
        error if error.is_credential_failure() => {
            super::route::token_failure(&tool.server, &tool.name, subject, error)
        }
        error => CallError::Upstream {
            server: tool.server.clone(),
            tool: tool.name.as_str().into(),
            error,
            idempotent: false,
        },
    }
}

/// The status of a state store failure.
fn state_failure(server: &str, error: &StateError) -> CallError {
    CallError::StateUnavailable {
        server: server.to_owned(),
        reason: error.to_string(),
    }
}

/// Whether `task_id` has the shape of toolgate's ids (anything else is not
/// looked up).
fn well_formed(task_id: &str) -> bool {
    task_id.len() == ID_LEN
        && task_id.starts_with(PREFIX)
        && task_id[PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `prefix` and 16 random bytes in base64url.
fn random_id(prefix: &str) -> String {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system's random source works");
    format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What logs and audit records show of a task id: the first 16 hex digits
/// of its SHA-256.
fn id_hash(task_id: &str) -> String {
    hex::encode(&sha2::Sha256::digest(task_id.as_bytes())[..8])
}

/// A status's name in records, metrics and errors.
fn status_name(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Working => "working",
        TaskStatus::InputRequired => "input_required",
        TaskStatus::Completed => "completed",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
        #[allow(unreachable_patterns)]
        _ => "unknown",
    }
}

/// The server's suggested poll interval, within what toolgate itself
/// uses when following a task.
fn poll_ms(poll_interval_ms: Option<u64>) -> u32 {
    let interval = crate::upstream::tasks::poll_interval(poll_interval_ms);
    u32::try_from(interval.as_millis()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_well_formed_and_hashed_for_logs() {
        let a = random_id(PREFIX);
        let b = random_id(PREFIX);
        assert_ne!(a, b);
        assert!(well_formed(&a), "{a}");
        assert!(!well_formed("tgt_short"));
        assert!(!well_formed(&a.replace(PREFIX, "xyz_")));
        assert!(!well_formed(&format!("{}!", &a[..ID_LEN - 1])));
        let hash = id_hash(&a);
        assert_eq!(hash.len(), 16);
        assert!(!hash.contains(&a[PREFIX.len()..]));
    }
}
