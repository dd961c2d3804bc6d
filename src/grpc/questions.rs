//! Questions and answers between a call and its worker, in the API's
//! messages: [`Asked`] questions become `InputRequired`, `InputResponse`
//! messages the calls' [`InputResponse`]s (checked by the pipeline before
//! anything is sent upstream).

use crate::calls::{InputFields, InputResponse, Questions};
use crate::pb;
use crate::upstream::{Action, Asked, InputKinds, Question};

/// What the worker said it answers (`accepts_input`).
fn accepts(capabilities: Option<&pb::InputCapabilities>) -> InputKinds {
    capabilities.map_or_else(InputKinds::default, |c| InputKinds {
        form: c.form,
        url: c.url,
        sampling: c.sampling,
    })
}

/// A request's fields of rounds of questions.
pub(crate) fn input_fields(
    accepts_input: Option<&pb::InputCapabilities>,
    request_state: &str,
    input_responses: &[pb::InputResponse],
) -> InputFields {
    InputFields {
        accepts: accepts(accepts_input),
        request_state: request_state.to_owned(),
        input_responses: responses(input_responses),
    }
}

/// The worker's answers as the calls take them.
pub(crate) fn responses(responses: &[pb::InputResponse]) -> Vec<InputResponse> {
    responses.iter().map(response).collect()
}

/// One answer as the calls take it.
pub(crate) fn response(response: &pb::InputResponse) -> InputResponse {
    InputResponse {
        id: response.id.clone(),
        action: match pb::InputAction::try_from(response.action) {
            Ok(pb::InputAction::Accept) => Some(Action::Accept),
            Ok(pb::InputAction::Decline) => Some(Action::Decline),
            Ok(pb::InputAction::Cancel) => Some(Action::Cancel),
            Ok(pb::InputAction::Unspecified) | Err(_) => None,
        },
        content_json: response.content_json.clone(),
    }
}

/// The `InputRequired` message of a round of questions.
pub(crate) fn questions(questions: Questions) -> pb::InputRequired {
    input_required(&questions.asked, questions.request_state)
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

#[cfg(test)]
mod tests {
    use super::*;

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
