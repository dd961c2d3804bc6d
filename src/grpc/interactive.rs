//! `InvokeToolInteractive`: one call whose server may ask questions, with
//! its worker answering on the same stream. The first message carries the
//! call; the call runs as InvokeTool's does ([`calls::invoke`]) with a
//! progress sink and an asker. Each round of questions (a 2025-11-25
//! server's `elicitation/create` or `sampling/createMessage` tied to this
//! call, or a 2026-07-28 `input_required` round toolgate drives itself)
//! becomes one `input_required` event; the worker's `input_response`
//! messages are checked and matched to it, and once every question of the
//! round is answered the answers go back upstream. The result comes last.
//!
//! The worker closing its stream (or ending its side while a question is
//! pending) drops the call: the upstream request is cancelled
//! (`notifications/cancelled`), a pending question is answered with an
//! error upstream and the call leaves the session's registry.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

use super::stream::{PROGRESS_BUFFER, Thinning};
use super::{EventStream, Gateway, calls, questions};
use crate::calls::error::CallError;
use crate::pb;
use crate::upstream::{Answer, Asked, Round};

/// How long the first message (the call) may take to arrive.
const FIRST_MESSAGE_WAIT: Duration = Duration::from_secs(30);

/// Rounds of questions buffered between the call and the relay.
const ROUNDS_BUFFER: usize = 4;

/// Reads the call from the stream's first message and starts it.
///
/// # Errors
/// INVALID_ARGUMENT `INTERACTIVE_FIRST_MESSAGE` when the first message is
/// not a call (or none arrives); the status of a broken stream.
pub(super) async fn start(
    gateway: Gateway,
    request: Request<Streaming<pb::InteractiveRequest>>,
) -> Result<EventStream<pb::InvokeToolEvent>, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let max_content_bytes = tenant.limits().max_argument_bytes;
    let (metadata, extensions, mut inbound) = request.into_parts();
    let first = tokio::time::timeout(FIRST_MESSAGE_WAIT, inbound.message())
        .await
        .map_err(|_| CallError::InteractiveFirstMessage("none arrived within 30 s"))??;
    let call = match first {
        Some(pb::InteractiveRequest {
            message: Some(pb::interactive_request::Message::Call(call)),
        }) => call,
        Some(_) => {
            return Err(CallError::InteractiveFirstMessage("it does not carry `call`").into());
        }
        None => {
            return Err(CallError::InteractiveFirstMessage("the stream ended before it").into());
        }
    };
    let request = Request::from_parts(metadata, extensions, call);
    // The caller's deadline holds even while the upstream timeout stands
    // still for the worker's answers. A little after the point where the
    // call answers DEADLINE_EXCEEDED itself, so that it does when nothing
    // was asked.
    let deadline = super::caller_timeout(&request)
        .map(|t| tokio::time::Instant::now() + t.saturating_sub(super::deadline_margin(t) / 2));
    let (out, events) = mpsc::channel(16);
    let relay = Relay {
        gateway,
        inbound,
        out,
        max_content_bytes,
        deadline,
    };
    tokio::spawn(relay.run(request));
    Ok(Box::pin(ReceiverStream::new(events)))
}

/// A round of questions the worker has been sent and not fully answered.
struct Pending {
    asked: Vec<Asked>,
    answers: Vec<Answer>,
    reply: tokio::sync::oneshot::Sender<Vec<Answer>>,
}

/// One stream's relay between its call and its worker.
struct Relay {
    gateway: Gateway,
    inbound: Streaming<pb::InteractiveRequest>,
    out: mpsc::Sender<Result<pb::InvokeToolEvent, Status>>,
    max_content_bytes: usize,
    /// The caller's deadline, when it set one.
    deadline: Option<tokio::time::Instant>,
}

impl Relay {
    /// Runs the call and relays its events and the worker's answers until the
    /// result is out, the worker goes away, the caller's deadline passes, or an
    /// answer is refused.
    async fn run(self, request: Request<pb::InvokeToolRequest>) {
        let Relay {
            gateway,
            mut inbound,
            out,
            max_content_bytes,
            deadline,
        } = self;
        let tool = request.get_ref().name.clone();
        let started = std::time::Instant::now();
        let deadline_passed = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline_passed);
        let (progress_sink, mut progress) = mpsc::channel(PROGRESS_BUFFER);
        let (asker, mut rounds) = mpsc::channel::<Round>(ROUNDS_BUFFER);
        let (approval_sink, mut approvals) = mpsc::channel(1);
        let sinks = crate::calls::Sinks {
            progress: Some(progress_sink),
            asker: Some(asker),
            approval: Some(approval_sink),
        };
        let call = calls::invoke(&gateway, request, sinks);
        tokio::pin!(call);
        let mut thinning = Thinning::default();
        let mut pending: Vec<Pending> = Vec::new();
        let mut inbound_open = true;
        // Every `return` below drops the call: the upstream request is
        // cancelled, pending questions are answered with an error upstream.
        loop {
            tokio::select! {
                // The result first: nothing is relayed after it.
                biased;
                result = &mut call => {
                    let event = result.map(|response| pb::InvokeToolEvent {
                        event: Some(pb::invoke_tool_event::Event::Result(response)),
                    });
                    let _ = out.send(event).await;
                    return;
                }
                () = out.closed() => return,
                () = &mut deadline_passed => {
                    let passed = CallError::DeadlineExceeded {
                        server: String::new(),
                        tool: tool.into(),
                        after: started.elapsed(),
                        sent: true,
                    };
                    let _ = out.send(Err(passed.into())).await;
                    return;
                }
                Some(notice) = approvals.recv() => {
                    let event = pb::InvokeToolEvent {
                        event: Some(pb::invoke_tool_event::Event::ApprovalPending(
                            pb::ApprovalPending {
                                approval_id: notice.approval_id,
                                expires_at_unix_ms: notice.expires_at_ms,
                                rule: notice.rule,
                            },
                        )),
                    };
                    if out.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                Some(update) = progress.recv() => {
                    let Some(event) = thinning.admit(update) else { continue };
                    if out.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                Some(Round { asked, reply }) = rounds.recv() => {
                    if !inbound_open {
                        // The worker can no longer answer.
                        return;
                    }
                    let event = pb::InvokeToolEvent {
                        event: Some(pb::invoke_tool_event::Event::InputRequired(
                            questions::input_required(&asked, String::new()),
                        )),
                    };
                    pending.push(Pending { asked, answers: Vec::new(), reply });
                    if out.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                message = inbound.message(), if inbound_open => match message {
                    Ok(Some(pb::InteractiveRequest {
                        message: Some(pb::interactive_request::Message::InputResponse(response)),
                    })) => {
                        if let Err(refused) = take_answer(&mut pending, &response, max_content_bytes) {
                            let _ = out.send(Err(refused.into())).await;
                            return;
                        }
                    }
                    Ok(Some(_)) => {
                        let refused = CallError::InputResponseInvalid {
                            reason: "after the first message, every message must carry `input_response`".to_owned(),
                        };
                        let _ = out.send(Err(refused.into())).await;
                        return;
                    }
                    Ok(None) => {
                        inbound_open = false;
                        pending.retain(|p| !p.reply.is_closed());
                        if !pending.is_empty() {
                            return;
                        }
                    }
                    // The stream broke: the worker is gone.
                    Err(_) => return,
                },
            }
        }
    }
}

/// Checks one answer and adds it to the round it answers; a round whose
/// every question is answered goes back to the call.
///
/// # Errors
/// INVALID_ARGUMENT `INPUT_RESPONSE_INVALID`: malformed, answering no
/// pending question, answering one twice, or not fitting its question.
fn take_answer(
    pending: &mut Vec<Pending>,
    response: &pb::InputResponse,
    max_content_bytes: usize,
) -> Result<(), CallError> {
    // One response per message, within `rounds::MAX_ANSWERS` too.
    let answer =
        crate::calls::rounds::answers(&[questions::response(response)], max_content_bytes)?
            .pop()
            .expect("one response, one answer");
    let invalid = |reason: String| CallError::InputResponseInvalid { reason };
    // Rounds the call no longer waits for (withdrawn, timed out).
    pending.retain(|p| !p.reply.is_closed());
    let id = crate::callers::quoted(&answer.id).into_owned();
    let Some(index) = pending
        .iter()
        .position(|p| p.asked.iter().any(|q| q.id == answer.id))
    else {
        return Err(invalid(format!(
            "response `{id}` answers no pending question"
        )));
    };
    let round = &mut pending[index];
    if round.answers.iter().any(|a| a.id == answer.id) {
        return Err(invalid(format!("question `{id}` is answered twice")));
    }
    let question = &round
        .asked
        .iter()
        .find(|q| q.id == answer.id)
        .expect("found above")
        .question;
    answer
        .to_input_response(question)
        .map_err(|e| invalid(e.to_string()))?;
    round.answers.push(answer);
    if round.answers.len() == round.asked.len() {
        let Pending { answers, reply, .. } = pending.remove(index);
        let _ = reply.send(answers);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::upstream::Question;

    fn form(id: &str) -> Asked {
        Asked {
            id: id.to_owned(),
            question: Question::Form {
                message: "m".into(),
                schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            },
        }
    }

    fn response(id: &str, action: pb::InputAction, content: &str) -> pb::InputResponse {
        pb::InputResponse {
            id: id.to_owned(),
            action: action as i32,
            content_json: content.to_owned(),
        }
    }

    #[test]
    fn a_round_goes_back_once_every_question_is_answered() {
        let (reply, mut answered) = tokio::sync::oneshot::channel();
        let mut pending = vec![Pending {
            asked: vec![form("a"), form("b")],
            answers: Vec::new(),
            reply,
        }];
        take_answer(
            &mut pending,
            &response("a", pb::InputAction::Accept, r#"{"n":1}"#),
            1024,
        )
        .unwrap();
        assert!(answered.try_recv().is_err(), "not before `b`");
        // Twice, no such question, content that does not fit: refused.
        for bad in [
            response("a", pb::InputAction::Decline, ""),
            response("c", pb::InputAction::Decline, ""),
            response("b", pb::InputAction::Accept, "[1]"),
        ] {
            let refused = take_answer(&mut pending, &bad, 1024).unwrap_err();
            assert!(
                matches!(refused, CallError::InputResponseInvalid { .. }),
                "{refused}"
            );
        }
        take_answer(
            &mut pending,
            &response("b", pb::InputAction::Cancel, ""),
            1024,
        )
        .unwrap();
        let answers = answered.try_recv().expect("the round went back");
        assert_eq!(answers.len(), 2);
        assert!(pending.is_empty());
    }
}
