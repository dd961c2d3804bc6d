//! The calls' tasks as `toolgate.v1` `Task` messages (`GetTask`,
//! `UpdateTask`, `CancelTask`, and the task an `InvokeTool` became).

use super::{convert, questions, status};
use crate::calls::{CallError, Task};
use crate::pb;
use crate::registry::Tenant;
use crate::upstream::UpstreamError;
use crate::upstream::tasks::TaskStatus;

/// The `Task` message of `task` (its result converted: `result`).
pub(super) fn message(task: Task, result: Option<pb::InvokeToolResponse>) -> pb::Task {
    pb::Task {
        task_id: task.task_id,
        status: status_of(task.status) as i32,
        status_message: match &task.failed {
            // As a direct call's status would say it: the server's text
            // withheld (and logged) but for invalid params, and redacted.
            Some(error) => status::worker_message(error),
            None => task.status_message,
        },
        poll_interval_ms: task.poll_interval_ms,
        expires_at_unix_ms: task.expires_at_unix_ms,
        result: result.map(Box::new),
        input_required: task
            .input_required
            .map(|asked| questions::input_required(&asked, String::new())),
    }
}

/// The answer to a task RPC: `task` as a message, within the tenant's
/// `limits.max_message_bytes`.
///
/// # Errors
/// The result cannot be carried, or the message is over the bound.
pub(super) fn task(mut task: Task, tenant: &Tenant) -> Result<pb::Task, CallError> {
    let (server, tool) = (task.server.clone(), task.tool.clone());
    let result =
        match task.result.take() {
            Some(result) => Some(convert::invoke_response(result, &server).map_err(|e| {
                CallError::Upstream {
                    server: server.clone(),
                    tool: tool.as_str().into(),
                    error: UpstreamError::Protocol(e.to_string()),
                    idempotent: false,
                }
            })?),
            None => None,
        };
    let out = message(task, result);
    let size = prost::Message::encoded_len(&out);
    let limit = tenant.limits().max_message_bytes;
    if size > limit {
        return Err(CallError::ResponseTooLarge {
            server,
            tool: tool.into(),
            size,
            limit,
        });
    }
    Ok(out)
}

/// The API's status of a server's task status.
fn status_of(status: TaskStatus) -> pb::TaskStatus {
    match status {
        TaskStatus::Working => pb::TaskStatus::Working,
        TaskStatus::InputRequired => pb::TaskStatus::InputRequired,
        TaskStatus::Completed => pb::TaskStatus::Completed,
        TaskStatus::Failed => pb::TaskStatus::Failed,
        TaskStatus::Cancelled => pb::TaskStatus::Cancelled,
        #[allow(unreachable_patterns)]
        _ => pb::TaskStatus::Unspecified,
    }
}
