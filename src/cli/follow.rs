//! `toolgate call --task`: follows a task with GetTask until it ends,
//! showing a one-line progress (redrawn on a terminal, a line per change
//! otherwise), answering its questions with UpdateTask, and cancelling it
//! with CancelTask on Ctrl-C ([cli.md](../../docs/cli.md)).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use tonic::transport::Channel;

use crate::pb;
use crate::pb::tool_gateway_client::ToolGatewayClient;

use super::answerer::{Answerer, AskError};

/// How a followed task ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// Completed: its result.
    Completed(pb::InvokeToolResponse),
    /// Failed (outside the tool) or cancelled (by the server, or by
    /// CancelTask after Ctrl-C when `interrupted`).
    Stopped {
        /// The task's last state.
        task: pb::Task,
        /// Whether the user pressed Ctrl-C.
        interrupted: bool,
    },
}

/// Following failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum FollowError {
    /// An RPC failed.
    #[error("{0}")]
    Status(#[from] tonic::Status),
    /// The task asks questions nobody here answers.
    #[error(
        "task {task_id} needs answers: run toolgate call on a terminal or pass --input FILE \
         (the task is left as it is)"
    )]
    Unanswerable {
        /// The task.
        task_id: String,
    },
    /// The questions could not be answered.
    #[error(transparent)]
    Ask(#[from] AskError),
}

/// Shortest wait between two GetTask calls, whatever the server suggests.
const MIN_POLL: Duration = Duration::from_millis(50);
/// Longest wait between two GetTask calls.
const MAX_POLL: Duration = Duration::from_secs(30);
/// The wait when the server suggests none.
const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// The status's name on the progress line.
#[must_use]
pub(super) fn status_name(status: pb::TaskStatus) -> &'static str {
    match status {
        pb::TaskStatus::Working => "working",
        pb::TaskStatus::InputRequired => "input required",
        pb::TaskStatus::Completed => "completed",
        pb::TaskStatus::Failed => "failed",
        pb::TaskStatus::Cancelled => "cancelled",
        pb::TaskStatus::Unspecified => "unknown",
    }
}

/// `task <id>: <status>[: <message>]`.
#[must_use]
pub(super) fn progress_line(task: &pb::Task) -> String {
    let mut line = format!("task {}: {}", task.task_id, status_name(task.status()));
    if !task.status_message.is_empty() {
        line.push_str(": ");
        line.push_str(&task.status_message);
    }
    line
}

/// The wait before the next GetTask.
#[must_use]
pub(super) fn poll_interval(task: &pb::Task) -> Duration {
    if task.poll_interval_ms == 0 {
        return DEFAULT_POLL;
    }
    Duration::from_millis(u64::from(task.poll_interval_ms)).clamp(MIN_POLL, MAX_POLL)
}

/// Writes the progress line: redrawn in place on a terminal, a new line
/// per change otherwise.
struct Progress {
    terminal: bool,
    last: String,
}

impl Progress {
    fn show(&mut self, task: &pb::Task) {
        let line = progress_line(task);
        if line == self.last {
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
        self.last = line;
    }

    /// Ends a redrawn line before anything else is written.
    fn end_line(&mut self) {
        if self.terminal && !self.last.is_empty() {
            eprintln!();
            self.last.clear();
        }
    }
}

/// Follows `task` to its end, making each request with `auth`.
///
/// # Errors
/// [`FollowError`]: an RPC failed, or questions could not be answered.
pub(super) async fn follow(
    client: &mut ToolGatewayClient<Channel>,
    auth: &Auth,
    mut task: pb::Task,
    mut answerer: Option<&mut Answerer>,
) -> Result<Ended, FollowError> {
    let mut progress = Progress {
        terminal: std::io::stderr().is_terminal(),
        last: String::new(),
    };
    // Registered now (not on first poll), so that Ctrl-C after the first
    // progress line always reaches CancelTask.
    let mut interrupt =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let ctrl_c = async move {
        match interrupt.as_mut() {
            Some(signal) => {
                signal.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(ctrl_c);
    let interrupted = loop {
        progress.show(&task);
        let next = match task.status() {
            pb::TaskStatus::Completed => {
                progress.end_line();
                return Ok(Ended::Completed(
                    task.result.map(|r| *r).unwrap_or_default(),
                ));
            }
            pb::TaskStatus::Failed | pb::TaskStatus::Cancelled => {
                progress.end_line();
                return Ok(Ended::Stopped {
                    task,
                    interrupted: false,
                });
            }
            pb::TaskStatus::InputRequired => {
                let asked = task.input_required.clone().unwrap_or_default();
                let Some(answerer) = answerer.as_deref_mut() else {
                    progress.end_line();
                    return Err(FollowError::Unanswerable {
                        task_id: task.task_id,
                    });
                };
                progress.end_line();
                let answers = tokio::select! {
                    answers = answerer.answer(&asked) => answers?,
                    _ = &mut ctrl_c => break true,
                };
                let update = pb::UpdateTaskRequest {
                    task_id: task.task_id.clone(),
                    input_responses: answers,
                };
                tokio::select! {
                    updated = client.update_task(auth.request(update)) => updated?.into_inner(),
                    _ = &mut ctrl_c => break true,
                }
            }
            pb::TaskStatus::Working | pb::TaskStatus::Unspecified => {
                let get = pb::GetTaskRequest {
                    task_id: task.task_id.clone(),
                };
                tokio::select! {
                    () = tokio::time::sleep(poll_interval(&task)) => {}
                    _ = &mut ctrl_c => break true,
                }
                tokio::select! {
                    got = client.get_task(auth.request(get)) => got?.into_inner(),
                    _ = &mut ctrl_c => break true,
                }
            }
        };
        task = next;
    };
    progress.end_line();
    eprintln!("toolgate: cancelling task {}", task.task_id);
    let cancel = pb::CancelTaskRequest {
        task_id: task.task_id.clone(),
    };
    let task = client.cancel_task(auth.request(cancel)).await?.into_inner();
    Ok(Ended::Stopped { task, interrupted })
}

/// The bearer token and deadline of every request of a call.
#[derive(Debug, Clone)]
pub(super) struct Auth {
    /// `Bearer <token>`.
    pub(super) authorization: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    /// Each request's deadline.
    pub(super) timeout: Duration,
}

impl Auth {
    /// `message` with the token and deadline.
    #[must_use]
    pub(super) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        request
            .metadata_mut()
            .insert("authorization", self.authorization.clone());
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_and_the_poll_interval() {
        let mut task = pb::Task {
            task_id: "tgt_abc".to_owned(),
            status: pb::TaskStatus::Working.into(),
            status_message: "step 3 of 10".to_owned(),
            poll_interval_ms: 100,
            ..Default::default()
        };
        assert_eq!(progress_line(&task), "task tgt_abc: working: step 3 of 10");
        assert_eq!(poll_interval(&task), Duration::from_millis(100));
        task.poll_interval_ms = 1;
        assert_eq!(poll_interval(&task), MIN_POLL);
        task.poll_interval_ms = 600_000;
        assert_eq!(poll_interval(&task), MAX_POLL);
        task.poll_interval_ms = 0;
        assert_eq!(poll_interval(&task), DEFAULT_POLL);
        task.status = pb::TaskStatus::InputRequired.into();
        task.status_message.clear();
        assert_eq!(progress_line(&task), "task tgt_abc: input required");
    }
}
