//! Questions and answers between a call and its worker, in the API's
//! messages: [`Asked`] questions become `InputRequired`, `InputResponse`s
//! become [`Answer`]s (checked before anything is sent upstream).

use crate::grpc::error::CallError;
use crate::pb;
use crate::upstream::{Action, Answer, Asked, InputKinds, Question};

/// At most this many answers in one message or retry.
pub(crate) const MAX_ANSWERS: usize = 32;

/// What the worker said it answers (`accepts_input`).
pub(crate) fn accepts(capabilities: Option<&pb::InputCapabilities>) -> InputKinds {
    capabilities.map_or_else(InputKinds::default, |c| InputKinds {
        form: c.form,
        url: c.url,
        sampling: c.sampling,
    })
}

/// The `InputRequired` message of `asked`, with the worker's
/// `request_state` (empty where none applies).
pub(crate) fn input_required(asked: &[Asked], request_state: String) -> pb::InputRequired {
    pb::InputRequired {
        requests: asked.iter().map(input_request).collect(),
        request_state,
    }
}

fn input_request(asked: &Asked) -> pb::InputRequest {
    use pb::input_request::Kind;
    let kind = match &asked.question {
        Question::Form { message, schema } => Kind::Form(pb::FormInput {
            message: message.clone(),
            requested_schema_json: schema.to_string(),
        }),
        Question::Url {
            message,
            url,
            elicitation_id,
        } => Kind::Url(pb::UrlInput {
            message: message.clone(),
            url: url.clone(),
            elicitation_id: elicitation_id.clone(),
        }),
        Question::Sampling { params } => Kind::Sampling(pb::SamplingInput {
            params_json: params.to_string(),
        }),
    };
    pb::InputRequest {
        id: asked.id.clone(),
        kind: Some(kind),
    }
}

/// The worker's answers, each with an action and, when given, content
/// that is JSON of at most `max_content_bytes`.
///
/// # Errors
/// `INPUT_RESPONSE_INVALID`, naming the response.
pub(crate) fn answers(
    responses: &[pb::InputResponse],
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
///
/// # Errors
/// `INPUT_RESPONSE_INVALID`, naming the response.
pub(crate) fn answer(
    response: &pb::InputResponse,
    max_content_bytes: usize,
) -> Result<Answer, CallError> {
    let id = crate::callers::quoted(&response.id);
    let invalid = |reason: String| CallError::InputResponseInvalid { reason };
    if response.id.is_empty() {
        return Err(invalid("a response has no `id`".to_owned()));
    }
    let action = match pb::InputAction::try_from(response.action) {
        Ok(pb::InputAction::Accept) => Action::Accept,
        Ok(pb::InputAction::Decline) => Action::Decline,
        Ok(pb::InputAction::Cancel) => Action::Cancel,
        Ok(pb::InputAction::Unspecified) | Err(_) => {
            return Err(invalid(format!(
                "response `{id}` has no action (INPUT_ACTION_ACCEPT, _DECLINE or _CANCEL)"
            )));
        }
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

    fn response(id: &str, action: pb::InputAction, content: &str) -> pb::InputResponse {
        pb::InputResponse {
            id: id.to_owned(),
            action: action as i32,
            content_json: content.to_owned(),
        }
    }

    #[test]
    fn responses_need_an_id_an_action_and_json() {
        let ok = answer(&response("q1", pb::InputAction::Accept, r#"{"n":1}"#), 100).unwrap();
        assert_eq!(ok.action, Action::Accept);
        assert_eq!(ok.content, Some(serde_json::json!({"n": 1})));
        for bad in [
            response("", pb::InputAction::Accept, "{}"),
            response("q1", pb::InputAction::Unspecified, ""),
            response("q1", pb::InputAction::Accept, "{not json"),
            response(
                "q1",
                pb::InputAction::Accept,
                &format!("\"{}\"", "x".repeat(200)),
            ),
        ] {
            let error = answer(&bad, 100).unwrap_err();
            assert!(
                matches!(error, CallError::InputResponseInvalid { .. }),
                "{error}"
            );
        }
        let many = vec![response("q", pb::InputAction::Cancel, ""); MAX_ANSWERS + 1];
        assert!(answers(&many, 100).is_err());
    }

    #[test]
    fn questions_keep_their_ids_and_kinds() {
        let asked = [Asked {
            id: "a".into(),
            question: Question::Url {
                message: "m".into(),
                url: "https://example.com/x".into(),
                elicitation_id: "e".into(),
            },
        }];
        let message = input_required(&asked, "s".into());
        assert_eq!(message.request_state, "s");
        assert_eq!(message.requests[0].id, "a");
        assert!(matches!(
            message.requests[0].kind,
            Some(pb::input_request::Kind::Url(ref u)) if u.url == "https://example.com/x"
        ));
    }
}
