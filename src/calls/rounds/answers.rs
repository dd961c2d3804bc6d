//! A caller's answers to a round of questions, as a surface hands them
//! in ([`InputResponse`]), checked into [`Answer`]s before anything is
//! sent upstream.

use crate::calls::error::CallError;
use crate::upstream::{Action, Answer, InputKinds};

/// At most this many answers in one message or retry.
pub const MAX_ANSWERS: usize = 32;

/// One answer as the caller gave it, not checked yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputResponse {
    /// The id of the question it answers.
    pub id: String,
    /// What the caller did (`None`: no action, or one this gateway does
    /// not know).
    pub action: Option<Action>,
    /// The content (JSON text; empty: none).
    pub content_json: String,
}

/// What a caller sends of rounds of questions with a request: the kinds
/// of question it answers, and on a retry the round's sealed state with
/// its answers.
#[derive(Debug, Clone, Default)]
pub struct InputFields {
    /// The kinds of question the caller answers (`accepts_input`).
    pub accepts: InputKinds,
    /// The sealed state of the round answered (empty: not a retry).
    pub request_state: String,
    /// The answers to that round.
    pub input_responses: Vec<InputResponse>,
}

/// The caller's answers, each with an action and, when given, content
/// that is JSON of at most `max_content_bytes`.
///
/// # Errors
/// `INPUT_RESPONSE_INVALID`, naming the response.
pub fn answers(
    responses: &[InputResponse],
    max_content_bytes: usize,
) -> Result<Vec<Answer>, CallError> {
    if responses.len() > MAX_ANSWERS {
        return Err(CallError::InputResponseInvalid {
            reason: format!(
                "{} responses in one message, over {MAX_ANSWERS}",
                responses.len()
            ),
        });
    }
    responses
        .iter()
        .map(|r| answer(r, max_content_bytes))
        .collect()
}

/// One answer.
fn answer(response: &InputResponse, max_content_bytes: usize) -> Result<Answer, CallError> {
    let id = crate::callers::quoted(&response.id);
    let invalid = |reason: String| CallError::InputResponseInvalid { reason };
    if response.id.is_empty() {
        return Err(invalid("a response has no `id`".to_owned()));
    }
    let Some(action) = response.action else {
        return Err(invalid(format!(
            "response `{id}` has no action (INPUT_ACTION_ACCEPT, _DECLINE or _CANCEL)"
        )));
    };
    let content = if response.content_json.is_empty() {
        None
    } else if response.content_json.len() > max_content_bytes {
        return Err(invalid(format!(
            "response `{id}`: content_json is {} bytes, over {max_content_bytes}",
            response.content_json.len()
        )));
    } else {
        Some(
            serde_json::from_str(&response.content_json)
                .map_err(|e| invalid(format!("response `{id}`: content_json is not JSON: {e}")))?,
        )
    };
    Ok(Answer {
        id: response.id.clone(),
        action,
        content,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(id: &str, action: Option<Action>, content: &str) -> InputResponse {
        InputResponse {
            id: id.to_owned(),
            action,
            content_json: content.to_owned(),
        }
    }

    #[test]
    fn responses_need_an_id_an_action_and_json() {
        let ok = answer(&response("q1", Some(Action::Accept), r#"{"n":1}"#), 100).unwrap();
        assert_eq!(ok.action, Action::Accept);
        assert_eq!(ok.content, Some(serde_json::json!({"n": 1})));
        for bad in [
            response("", Some(Action::Accept), "{}"),
            response("q1", None, ""),
            response("q1", Some(Action::Accept), "{not json"),
            response(
                "q1",
                Some(Action::Accept),
                &format!("\"{}\"", "x".repeat(200)),
            ),
        ] {
            let error = answer(&bad, 100).unwrap_err();
            assert!(
                matches!(error, CallError::InputResponseInvalid { .. }),
                "{error}"
            );
        }
        let many = vec![response("q", Some(Action::Cancel), ""); MAX_ANSWERS + 1];
        assert!(answers(&many, 100).is_err());
    }
}
