//! SEP-2663 tasks (`io.modelcontextprotocol/tasks`) on an upstream
//! session: `tasks/get`, `tasks/update` and `tasks/cancel`, each sent with
//! the extension declared in the request's `_meta` client capabilities
//! (rmcp's own `get_task` and friends take no request options), and the
//! loop that follows a task to its end for a call whose worker did not
//! opt in to tasks.
//!
//! A server that runs a tool only as a task refuses a call that did not
//! declare the extension with JSON-RPC `-32021` naming it
//! ([`requires_tasks`](super::error::requires_tasks)); the tool did not run, and [`Session::call`] sends
//! it once more with the extension declared.

use std::time::Duration;

use rmcp::model::{
    CallToolResult, CancelTaskParams, CancelTaskRequest, ClientRequest, CreateTaskResult,
    ErrorCode, GetTaskParams, GetTaskRequest, InputResponses, JsonObject, RequestMetaObject,
    ServerResult, TASKS_EXTENSION_ID, UpdateTaskParams, UpdateTaskRequest,
};
use rmcp::service::PeerRequestOptions;
use serde_json::Value;
use tokio::time::Instant;
use tracing::Instrument;

pub use rmcp::model::{DetailedTask, TaskPayload, TaskStatus};

use super::input::{Asked, CallRequest, Question, Round};
use super::{End, Session, UpstreamError};

/// The shortest wait between two `tasks/get` of a followed task, whatever
/// the server's `pollIntervalMs`: low enough that a task done at once costs
/// little more than a call, high enough that a server suggesting 0 or 1 ms
/// is not polled in a loop.
pub const MIN_POLL: Duration = Duration::from_millis(50);

/// The longest wait between two `tasks/get` of a followed task.
pub const MAX_POLL: Duration = Duration::from_secs(30);

/// The wait when the server suggests no `pollIntervalMs`.
const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// How long a `tasks/cancel` sent for an abandoned task may take.
pub const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Rounds of questions one followed task may ask (as for `input_required`
/// results).
const MAX_TASK_ROUNDS: u32 = 10;

/// How long to wait before the next `tasks/get`: the server's
/// `pollIntervalMs` within [`MIN_POLL`] and [`MAX_POLL`].
#[must_use]
pub fn poll_interval(poll_interval_ms: Option<u64>) -> Duration {
    poll_interval_ms
        .map_or(DEFAULT_POLL, Duration::from_millis)
        .clamp(MIN_POLL, MAX_POLL)
}

impl Session {
    /// The `_meta` that declares the tasks extension for one request: the
    /// session's own client capabilities plus the extension (the peer puts
    /// the session's capabilities into every request first; this replaces
    /// them for the request).
    pub(super) fn tasks_meta(&self) -> RequestMetaObject {
        let mut capabilities = rmcp::ClientHandler::get_info(&self.client).capabilities;
        capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(TASKS_EXTENSION_ID.to_owned(), JsonObject::new());
        let mut meta = RequestMetaObject::new();
        meta.set_client_capabilities(capabilities);
        meta
    }

    /// The state of the server's task `task_id` (`tasks/get`), waiting at
    /// most `timeout`.
    ///
    /// # Errors
    /// The session is closed, the transport fails, the server answers an
    /// error (an unknown task is its `-32602`) or something else than a
    /// task, or the timeout passes.
    pub async fn get_task(
        &self,
        task_id: &str,
        timeout: Duration,
    ) -> Result<DetailedTask, UpstreamError> {
        let request =
            ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(task_id)));
        match self.task_request(request, "tasks/get", timeout).await? {
            ServerResult::GetTaskResult(mut result) => {
                // A task's questions reach workers: no credential in them.
                if let rmcp::model::TaskPayload::InputRequired { input_requests } =
                    &mut result.task.payload
                {
                    super::input::redact_requests(input_requests, &self.redaction);
                }
                Ok(result.task)
            }
            _ => Err(UpstreamError::Protocol(
                "an answer to tasks/get that is not a task".to_owned(),
            )),
        }
    }

    /// Answers the questions of the server's task `task_id`
    /// (`tasks/update`), keyed as the server asked them.
    ///
    /// # Errors
    /// As [`Session::get_task`].
    pub async fn update_task(
        &self,
        task_id: &str,
        responses: InputResponses,
        timeout: Duration,
    ) -> Result<(), UpstreamError> {
        let request = ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(
            UpdateTaskParams::new(task_id, responses),
        ));
        self.task_request(request, "tasks/update", timeout)
            .await
            .map(drop)
    }

    /// Asks the server to cancel its task `task_id` (`tasks/cancel`). A
    /// finished task stays as it ended.
    ///
    /// # Errors
    /// As [`Session::get_task`].
    pub async fn cancel_task(&self, task_id: &str, timeout: Duration) -> Result<(), UpstreamError> {
        let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
            CancelTaskParams::new(task_id),
        ));
        self.task_request(request, "tasks/cancel", timeout)
            .await
            .map(drop)
    }

    /// The tool result of a completed task (its `result`), redacted as a
    /// call's result is.
    ///
    /// # Errors
    /// [`UpstreamError::Protocol`] when `result` is not a `CallToolResult`.
    pub fn task_result(&self, result: JsonObject) -> Result<CallToolResult, UpstreamError> {
        let mut result: CallToolResult =
            serde_json::from_value(Value::Object(result)).map_err(|e| {
                UpstreamError::Protocol(format!(
                    "a completed task's result is not a tool result: {e}"
                ))
            })?;
        if self.redact_results {
            super::redact::redact_result(&mut result, &self.redaction);
        }
        Ok(result)
    }

    /// The error of a failed task (its JSON-RPC `error`), redacted and
    /// bounded as a call's error is.
    #[must_use]
    pub fn task_error(&self, error: &JsonObject) -> UpstreamError {
        let code = error
            .get("code")
            .and_then(Value::as_i64)
            .and_then(|c| i32::try_from(c).ok())
            .unwrap_or(ErrorCode::INTERNAL_ERROR.0);
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("the task failed");
        UpstreamError::JsonRpc {
            code,
            message: self.redaction.upstream_text(message),
        }
    }

    /// One `tasks/*` request with the extension declared, with the
    /// session's credentials (an OAuth token refreshed first, renewed once
    /// when refused).
    async fn task_request(
        &self,
        request: ClientRequest,
        method: &'static str,
        timeout: Duration,
    ) -> Result<ServerResult, UpstreamError> {
        let Some(bearer) = &self.bearer else {
            return self.task_request_once(request, method, timeout).await;
        };
        bearer.refresh().await?;
        match self
            .task_request_once(request.clone(), method, timeout)
            .await
        {
            Err(UpstreamError::AuthRejected { challenge }) => {
                bearer.refused(challenge.as_deref()).await?;
                self.task_request_once(request, method, timeout).await
            }
            other => other,
        }
    }

    async fn task_request_once(
        &self,
        request: ClientRequest,
        method: &'static str,
        timeout: Duration,
    ) -> Result<ServerResult, UpstreamError> {
        if self.is_ended() {
            return Err(UpstreamError::Closed);
        }
        let span = tracing::info_span!(
            "mcp.request",
            otel.name = method,
            otel.kind = "client",
            mcp.method.name = method,
            tenant = %self.label.tenant,
            server = %self.label.server,
        );
        let mut ended = self.end.clone();
        async {
            let options = PeerRequestOptions::no_options().with_meta(self.tasks_meta());
            let live = self.hold().await?;
            let handle = live
                .send_request_with_option(request, options)
                .await
                .map_err(|e| self.classify(e, false))?;
            tokio::select! {
                result = tokio::time::timeout(timeout, handle.await_response()) => match result {
                    Ok(result) => result.map_err(|e| self.classify(e, true)),
                    Err(_) => Err(UpstreamError::Timeout(timeout)),
                },
                _ = ended.wait_for(|end| *end >= End::Ended) => Err(UpstreamError::Lost),
            }
        }
        .instrument(span)
        .await
    }

    /// Follows the task a call became until it ends, within `deadline`:
    /// `tasks/get` every [`poll_interval`]; a completed task's result is
    /// the call's. Questions go to `call.asker` (answered with
    /// `tasks/update`) when the call has one. When the deadline passes,
    /// the task asks what no one here can answer, or the returned future
    /// is dropped (the caller went away), `tasks/cancel` is sent.
    ///
    /// # Errors
    /// The task failed (the server's error), was cancelled
    /// ([`UpstreamError::TaskCancelled`]), needs answers the call cannot
    /// give ([`UpstreamError::InputRequiresInteractive`]), the deadline
    /// passed ([`UpstreamError::Timeout`] of `call.timeout`), or a request
    /// failed.
    pub(super) async fn follow(
        &self,
        created: CreateTaskResult,
        call: &CallRequest,
        deadline: Instant,
    ) -> Result<CallToolResult, UpstreamError> {
        let task_id = created.task.task_id;
        let mut cancel = CancelTaskOnDrop {
            peer: self.hold().await?,
            meta: self.tasks_meta(),
            task_id: Some(task_id.clone()),
        };
        let timed_out = || UpstreamError::Timeout(call.timeout);
        let mut interval = poll_interval(created.task.poll_interval_ms);
        let mut rounds = 0;
        loop {
            if tokio::time::timeout_at(deadline, tokio::time::sleep(interval))
                .await
                .is_err()
            {
                return Err(timed_out());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(timed_out());
            }
            let task = match self.get_task(&task_id, remaining).await {
                Err(UpstreamError::Timeout(_)) => return Err(timed_out()),
                other => other?,
            };
            interval = poll_interval(task.task.poll_interval_ms);
            match task.payload {
                TaskPayload::Completed { result } => {
                    cancel.task_id = None;
                    return self.task_result(result);
                }
                TaskPayload::Failed { error } => {
                    cancel.task_id = None;
                    return Err(self.task_error(&error));
                }
                TaskPayload::Cancelled => {
                    cancel.task_id = None;
                    return Err(UpstreamError::TaskCancelled);
                }
                TaskPayload::InputRequired { input_requests } => {
                    let asked = asked(&input_requests);
                    rounds += 1;
                    if rounds > MAX_TASK_ROUNDS {
                        return Err(UpstreamError::Protocol(format!(
                            "the task asked more than {MAX_TASK_ROUNDS} rounds of questions"
                        )));
                    }
                    let responses = match (asked.first(), &call.asker) {
                        // Roots only: toolgate answers them itself.
                        (None, _) => roots_responses(&input_requests),
                        (Some(first), None) => {
                            // Dropping `cancel` sends tasks/cancel.
                            return Err(UpstreamError::InputRequiresInteractive(
                                first.question.kind(),
                            ));
                        }
                        (Some(_), Some(asker)) => ask(asker, asked, &input_requests, deadline)
                            .await
                            .map_err(|e| e.unwrap_or_else(timed_out))?,
                    };
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    match self.update_task(&task_id, responses, remaining).await {
                        Err(UpstreamError::Timeout(_)) => return Err(timed_out()),
                        other => other?,
                    }
                    // Look again soon: the answers usually move the task on.
                    interval = MIN_POLL;
                }
                // A status added to rmcp later: keep polling.
                #[allow(unreachable_patterns)]
                _ => {}
            }
        }
    }
}

/// The questions of an input-required task, with the server's keys as
/// ids (roots are answered by toolgate itself).
pub fn asked(requests: &rmcp::model::InputRequests) -> Vec<Asked> {
    requests
        .iter()
        .filter_map(|(key, request)| {
            Question::from_input_request(request).map(|question| Asked {
                id: key.clone(),
                question,
            })
        })
        .collect()
}

/// The `inputResponses` of a task's roots requests: toolgate declares no
/// roots to a task.
pub fn roots_responses(requests: &rmcp::model::InputRequests) -> InputResponses {
    requests
        .iter()
        .filter(|(_, request)| matches!(request, rmcp::model::InputRequest::ListRoots(_)))
        .map(|(key, _)| (key.clone(), serde_json::json!({ "roots": [] })))
        .collect()
}

/// Puts `asked` to the call's worker and turns its answers into the
/// task's `inputResponses`. `Err(None)`: the deadline passed.
async fn ask(
    asker: &super::InputSink,
    asked: Vec<Asked>,
    requests: &rmcp::model::InputRequests,
    deadline: Instant,
) -> Result<InputResponses, Option<UpstreamError>> {
    let kind = asked.first().map(|a| a.question.kind());
    let gone = || kind.map(UpstreamError::InputRequiresInteractive);
    let (reply, answers) = tokio::sync::oneshot::channel();
    let round = Round {
        asked: asked.clone(),
        reply,
    };
    match tokio::time::timeout_at(deadline, asker.send(round)).await {
        Err(_) => return Err(None),
        Ok(Err(_)) => return Err(gone()),
        Ok(Ok(())) => {}
    }
    let answers = match tokio::time::timeout_at(deadline, answers).await {
        Err(_) => return Err(None),
        Ok(Err(_)) => return Err(gone()),
        Ok(Ok(answers)) => answers,
    };
    let mut responses = roots_responses(requests);
    let invalid =
        |e: super::AnswerError| Some(UpstreamError::Protocol(format!("the worker's answer: {e}")));
    for (question, answer) in super::input::match_answers(&asked, &answers).map_err(invalid)? {
        if let Some(value) = answer
            .to_input_response(&question.question)
            .map_err(invalid)?
        {
            responses.insert(question.id.clone(), value);
        }
    }
    Ok(responses)
}

/// Sends `tasks/cancel` for a followed task abandoned before it ended (the
/// deadline passed, the caller went away), in the background and bounded
/// by [`CANCEL_TIMEOUT`].
struct CancelTaskOnDrop {
    /// Held: a stateless session's service stays open to send it.
    peer: super::lease::Live,
    meta: RequestMetaObject,
    task_id: Option<String>,
}

impl Drop for CancelTaskOnDrop {
    fn drop(&mut self) {
        let Some(task_id) = self.task_id.take() else {
            return;
        };
        let peer = self.peer.clone();
        let options = PeerRequestOptions::no_options().with_meta(self.meta.clone());
        tokio::spawn(async move {
            let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
                CancelTaskParams::new(task_id),
            ));
            let cancelled = tokio::time::timeout(CANCEL_TIMEOUT, async {
                peer.send_request_with_option(request, options)
                    .await?
                    .await_response()
                    .await
            })
            .await;
            if !matches!(cancelled, Ok(Ok(_))) {
                tracing::debug!("tasks/cancel of an abandoned task did not complete");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_interval_is_clamped() {
        // The server's interval is honoured down to the 50 ms floor.
        assert_eq!(poll_interval(Some(100)), Duration::from_millis(100));
        assert_eq!(poll_interval(Some(60)), Duration::from_millis(60));
        assert_eq!(poll_interval(Some(1)), Duration::from_millis(50));
        assert_eq!(poll_interval(Some(0)), MIN_POLL);
        assert_eq!(poll_interval(Some(2_000)), Duration::from_secs(2));
        assert_eq!(poll_interval(Some(3_600_000)), MAX_POLL);
        assert_eq!(poll_interval(None), DEFAULT_POLL);
    }
}
