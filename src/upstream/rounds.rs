//! Rounds of a 2026-07-28 call (SEP-2322) that toolgate drives itself:
//! the server ends a `tools/call` with `input_required`, and the call is
//! sent again with `inputResponses` and the server's `requestState`.
//!
//! toolgate answers and retries on its own when the round asks only for
//! roots (answered from `servers[].roots`) or asks nothing (state only:
//! retried after a short backoff), for every call; and, for a call whose
//! worker is on an open stream (`CallRequest.asker`) and answers every
//! kind asked, it puts the round's questions to the worker and sends its
//! answers. Anything else goes back to the caller as
//! [`CallOutcome::InputRequired`]. Every round counts against
//! `servers[].input.max_rounds`; the call's timeout covers all of them.

// Roots are deprecated by SEP-2577 but part of every revision toolgate
// speaks.
#![allow(deprecated)]

use std::borrow::Cow;
use std::time::Duration;

use rmcp::model::{InputRequest, InputRequiredResult, InputResponses};

use super::input::{Asked, CallOutcome, CallRequest, Question, match_answers};
use super::ties::{self, Unanswered};
use super::{Session, UpstreamError};

/// The longest key of an input request toolgate passes on as an id.
const MAX_KEY: usize = 128;

/// The most questions of one round put to a worker.
pub(super) const MAX_QUESTIONS: usize = 32;

/// Calls `request`, answering the rounds toolgate may answer.
///
/// # Errors
/// As [`Session::call`]; also `InputRoundsExceeded`, `InputAnswerTimeout`,
/// `InputAbandoned`, and `Protocol` for a round toolgate cannot read.
pub(super) async fn drive(
    session: &Session,
    request: &CallRequest,
) -> Result<CallOutcome, UpstreamError> {
    let questions = session.client.questions();
    let max_rounds = questions.input.max_rounds;
    // Time spent waiting for the worker's answers does not count (the
    // caller's own deadline is kept by the RPC).
    let mut deadline = tokio::time::Instant::now() + request.timeout;
    let mut request = Cow::Borrowed(request);
    let mut rounds: u32 = 0;
    let mut state_only: u32 = 0;
    loop {
        let outcome = session.call_authorized(&request).await?;
        let CallOutcome::InputRequired(input) = outcome else {
            return Ok(outcome);
        };
        let Some(plan) = plan(&input, &request)? else {
            return Ok(CallOutcome::InputRequired(input));
        };
        rounds += 1;
        if rounds > max_rounds {
            return Err(UpstreamError::InputRoundsExceeded(max_rounds));
        }
        let mut responses = InputResponses::new();
        let roots = serde_json::json!({ "roots": questions.roots });
        for key in plan.roots {
            responses.insert(key, roots.clone());
        }
        if plan.asked.is_empty() && responses.is_empty() {
            // State only: back off a little, as rmcp's own client does.
            let millis = (50u64 << state_only.min(3)).min(250);
            state_only += 1;
            tokio::time::sleep(Duration::from_millis(millis)).await;
        }
        if !plan.asked.is_empty() {
            let asker = request.asker.as_ref().expect("planned with an asker");
            let asking = tokio::time::Instant::now();
            let answered =
                ties::ask(asker, plan.asked.clone(), questions.input.answer_timeout).await;
            deadline += asking.elapsed();
            let answers = match answered {
                Ok(answers) => answers,
                Err(Unanswered::Timeout) => {
                    return Err(UpstreamError::InputAnswerTimeout(
                        questions.input.answer_timeout,
                    ));
                }
                Err(Unanswered::Gone) => return Err(UpstreamError::InputAbandoned),
            };
            let matched = match_answers(&plan.asked, &answers)
                .map_err(|e| UpstreamError::Protocol(format!("the worker's answers: {e}")))?;
            for (asked, answer) in matched {
                let value = answer
                    .to_input_response(&asked.question)
                    .map_err(|e| UpstreamError::Protocol(format!("the worker's answers: {e}")))?;
                if let Some(value) = value {
                    responses.insert(asked.id.clone(), value);
                }
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(UpstreamError::Timeout(request.timeout));
        }
        let mut next = request.into_owned();
        next.timeout = left;
        next.input_responses = (!responses.is_empty()).then_some(responses);
        next.request_state = input.request_state;
        request = Cow::Owned(next);
    }
}

/// What toolgate does with one round.
struct Plan {
    /// Keys of `roots/list` requests.
    roots: Vec<String>,
    /// The questions for the worker (ids: the server's keys).
    asked: Vec<Asked>,
}

/// The round's plan, or `None` when the caller must answer it.
///
/// # Errors
/// A key too long to pass on, or a round the worker cannot take whole.
fn plan(input: &InputRequiredResult, request: &CallRequest) -> Result<Option<Plan>, UpstreamError> {
    let mut roots = Vec::new();
    let mut asked = Vec::new();
    for (key, entry) in input.input_requests.iter().flatten() {
        if key.len() > MAX_KEY {
            return Err(UpstreamError::Protocol(format!(
                "an input request's key is {} characters, over {MAX_KEY}",
                key.len()
            )));
        }
        if let InputRequest::ListRoots(_) = entry {
            roots.push(key.clone());
            continue;
        }
        let Some(question) = Question::from_input_request(entry) else {
            // A kind toolgate does not know: the caller sees the round.
            return Ok(None);
        };
        asked.push(Asked {
            id: key.clone(),
            question,
        });
    }
    if !asked.is_empty() {
        let answerable = request.asker.is_some()
            && asked.iter().all(|a| request.accepts.accepts(&a.question))
            && asked.len() <= MAX_QUESTIONS
            && asked
                .iter()
                .all(|a| ties::question_bytes(&a.question) <= ties::MAX_QUESTION_BYTES);
        if !answerable {
            return Ok(None);
        }
    }
    Ok(Some(Plan { roots, asked }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::upstream::input::InputKinds;

    fn round(requests: serde_json::Value) -> InputRequiredResult {
        serde_json::from_value(json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": "s",
        }))
        .expect("an input_required result")
    }

    fn form() -> serde_json::Value {
        json!({"method": "elicitation/create", "params": {
            "mode": "form", "message": "Name?",
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}
        }})
    }

    fn roots() -> serde_json::Value {
        json!({"method": "roots/list"})
    }

    fn request(asker: bool, form: bool) -> CallRequest {
        let mut request = CallRequest::new("t", Default::default(), Duration::from_secs(1));
        request.accepts = InputKinds {
            form,
            ..InputKinds::default()
        };
        request.asker = asker.then(|| tokio::sync::mpsc::channel(1).0);
        request
    }

    #[test]
    fn roots_and_state_only_rounds_are_answered_for_every_call() {
        let plain = request(false, false);
        let plan = plan(&round(json!({"r": roots()})), &plain)
            .unwrap()
            .expect("roots only");
        assert_eq!(plan.roots, ["r"]);
        assert!(plan.asked.is_empty());
        let state_only: InputRequiredResult =
            serde_json::from_value(json!({"resultType": "input_required", "requestState": "s"}))
                .unwrap();
        assert!(plan_is_some(&state_only, &plain));
    }

    fn plan_is_some(input: &InputRequiredResult, request: &CallRequest) -> bool {
        plan(input, request).unwrap().is_some()
    }

    #[test]
    fn questions_go_to_a_worker_on_a_stream_that_answers_every_kind() {
        let mixed = round(json!({"r": roots(), "q": form()}));
        // Asked of the worker: every non-roots question, under the server's key.
        let asked = plan(&mixed, &request(true, true)).unwrap().expect("asked");
        assert_eq!(asked.roots, ["r"]);
        assert_eq!(asked.asked.len(), 1);
        assert_eq!(asked.asked[0].id, "q");
        // No stream, or not that kind: the caller gets the round.
        assert!(!plan_is_some(&mixed, &request(false, true)));
        assert!(!plan_is_some(&mixed, &request(true, false)));
        // A key too long to pass on is the server's error.
        let long = round(json!({"k".repeat(129): form()}));
        assert!(plan(&long, &request(true, true)).is_err());
    }
}
