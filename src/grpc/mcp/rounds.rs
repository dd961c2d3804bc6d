//! The transport's input rounds as toolgate's rounds of questions: a
//! response's `common.input_requests` (keyed by question id) are the
//! questions, its `common.request_state` toolgate's sealed state of the
//! round; a retry's `common.input_responses` are the answers and its
//! `common.request_state` that state, bound and checked as on
//! `toolgate.v1`. The deprecated `resume_data` is neither handed out nor
//! taken.

use serde_json::{Value, json};

use super::{schema, structs};
use crate::calls::{CallError, InputFields, InputResponse, Questions};
use crate::pb::mcp;
use crate::upstream::{Action, Asked, InputKinds, Question};

/// A request's `common` fields as a call's rounds of questions. The
/// transport has no way to say which kinds a client answers: every kind
/// it can carry (form and URL elicitation, sampling) is taken as accepted.
///
/// # Errors
/// `MCP_REQUEST_INVALID`: `resume_data` that is not this gateway's, or
/// disagrees with `request_state`; an answer that holds no response, or a
/// root list (never asked).
pub(super) fn input_fields(common: Option<&mcp::RequestFields>) -> Result<InputFields, CallError> {
    let accepts = InputKinds {
        form: true,
        url: true,
        sampling: true,
    };
    let Some(common) = common else {
        return Ok(InputFields {
            accepts,
            ..InputFields::default()
        });
    };
    let mut responses: Vec<_> = common.input_responses.iter().collect();
    responses.sort_by(|a, b| a.0.cmp(b.0));
    Ok(InputFields {
        accepts,
        request_state: request_state(common)?,
        input_responses: responses
            .into_iter()
            .map(|(id, response)| answer(id, response))
            .collect::<Result<_, _>>()?,
    })
}

/// The sealed state a retry passes back in `request_state`. The release
/// deprecates `resume_data` for it, and this gateway never hands one out:
/// a retry that carries one did not get it here.
#[allow(deprecated)]
fn request_state(common: &mcp::RequestFields) -> Result<String, CallError> {
    if common
        .resume_data
        .as_ref()
        .is_some_and(|d| !d.fields.is_empty())
    {
        return Err(CallError::McpRequestInvalid(
            "`common.resume_data` is not state this gateway handed out (it never hands one out; \
             the release deprecates it): pass back `common.request_state` as the input_required \
             response gave it"
                .to_owned(),
        ));
    }
    Ok(common.request_state.clone().unwrap_or_default())
}

/// One answer, keyed by the question's id.
#[allow(deprecated)]
fn answer(id: &str, response: &mcp::InputResponse) -> Result<InputResponse, CallError> {
    let invalid = |why: &str| {
        CallError::McpRequestInvalid(format!(
            "`common.input_responses[{}]` {why}",
            crate::callers::quoted(id)
        ))
    };
    if let Some(elicited) = &response.elicit_result {
        use mcp::elicit_result::Type;
        let action = match Type::try_from(elicited.r#type) {
            Ok(Type::Accept) => Some(Action::Accept),
            Ok(Type::Decline) => Some(Action::Decline),
            Ok(Type::Cancel) => Some(Action::Cancel),
            Ok(Type::Unknown) | Err(_) => None,
        };
        let content_json = match &elicited.content {
            Some(content) => {
                let object = structs::to_object(content.clone())
                    .map_err(|e| invalid(&format!("content: {e}")))?;
                Value::Object(object).to_string()
            }
            None => String::new(),
        };
        return Ok(InputResponse {
            id: id.to_owned(),
            action,
            content_json,
        });
    }
    if let Some(sampled) = &response.sampling_create_message_result {
        return Ok(InputResponse {
            id: id.to_owned(),
            action: Some(Action::Accept),
            content_json: sampled_result(sampled).to_string(),
        });
    }
    if response.root_list_result.is_some() {
        return Err(invalid("is a root list: this gateway never asks for roots"));
    }
    Err(invalid(
        "holds no response (elicit_result or sampling_create_message_result)",
    ))
}

/// A sampling answer as an MCP `CreateMessageResult`.
fn sampled_result(result: &mcp::SamplingCreateMessageResult) -> Value {
    let message = result.message.clone().unwrap_or_default();
    let role = match mcp::Role::try_from(message.role) {
        Ok(mcp::Role::User) => "user",
        _ => "assistant",
    };
    let b64 = |bytes: &[u8]| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let content = if let Some(image) = &message.image {
        json!({"type": "image", "data": b64(&image.data), "mimeType": image.mime_type})
    } else if let Some(audio) = &message.audio {
        json!({"type": "audio", "data": b64(&audio.data), "mimeType": audio.mime_type})
    } else {
        let text = message.text.map(|t| t.text).unwrap_or_default();
        json!({"type": "text", "text": text})
    };
    let mut answer = json!({"role": role, "content": content, "model": result.model});
    if !result.stop_reason.is_empty() {
        answer["stopReason"] = Value::String(result.stop_reason.clone());
    }
    answer
}

/// The `common` fields of a complete response.
pub(super) fn complete() -> mcp::ResponseFields {
    mcp::ResponseFields {
        result_type: mcp::ResultType::Complete.into(),
        ..Default::default()
    }
}

/// The `common` fields of a response that hands the client a round of
/// questions.
pub(super) fn asking(questions: Questions) -> mcp::ResponseFields {
    mcp::ResponseFields {
        input_requests: questions
            .asked
            .iter()
            .map(|asked| (asked.id.clone(), input_request(asked)))
            .collect(),
        request_state: Some(questions.request_state),
        result_type: mcp::ResultType::InputRequired.into(),
        ..Default::default()
    }
}

/// One question as the transport's request.
#[allow(deprecated)]
fn input_request(asked: &Asked) -> mcp::InputRequest {
    match &asked.question {
        Question::Form { message, schema } => mcp::InputRequest {
            elicit_request: Some(schema::form(message, schema)),
            ..Default::default()
        },
        Question::Url {
            message,
            url,
            elicitation_id,
        } => mcp::InputRequest {
            elicit_request: Some(mcp::ElicitRequest {
                message: message.clone(),
                url_mode: Some(mcp::elicit_request::UrlMode {
                    id: elicitation_id.clone(),
                    url: url.clone(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        Question::Sampling { params } => mcp::InputRequest {
            sampling_create_message: Some(schema::sampling(params)),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::JsonObject;

    #[test]
    #[allow(deprecated)]
    fn state_comes_back_in_request_state_and_never_in_resume_data() {
        let state =
            |common: mcp::RequestFields| input_fields(Some(&common)).map(|i| i.request_state);
        let given = mcp::RequestFields {
            request_state: Some("s".into()),
            ..Default::default()
        };
        assert_eq!(state(given).unwrap(), "s");
        let mut forged = JsonObject::new();
        forged.insert("request_state".into(), "s".into());
        let error = state(mcp::RequestFields {
            resume_data: Some(structs::to_struct(forged)),
            ..Default::default()
        })
        .unwrap_err();
        assert!(matches!(error, CallError::McpRequestInvalid(_)), "{error}");
    }

    #[test]
    fn answers_keep_their_ids_actions_and_content() {
        let mut content = JsonObject::new();
        content.insert("n".into(), 3.into());
        let mut common = mcp::RequestFields::default();
        common.input_responses.insert(
            "q1".into(),
            mcp::InputResponse {
                elicit_result: Some(mcp::ElicitResult {
                    r#type: mcp::elicit_result::Type::Accept.into(),
                    content: Some(structs::to_struct(content)),
                }),
                ..Default::default()
            },
        );
        let fields = input_fields(Some(&common)).unwrap();
        assert_eq!(fields.input_responses[0].id, "q1");
        assert_eq!(fields.input_responses[0].action, Some(Action::Accept));
        assert_eq!(fields.input_responses[0].content_json, r#"{"n":3}"#);
        common
            .input_responses
            .insert("q2".into(), mcp::InputResponse::default());
        assert!(input_fields(Some(&common)).is_err());
    }

    #[test]
    fn questions_carry_the_sealed_state() {
        let asked = Questions {
            asked: vec![Asked {
                id: "a".into(),
                question: Question::Url {
                    message: "m".into(),
                    url: "https://example.com/x".into(),
                    elicitation_id: "e".into(),
                },
            }],
            request_state: "sealed".into(),
        };
        let common = asking(asked);
        assert_eq!(common.request_state.as_deref(), Some("sealed"));
        assert_eq!(
            common.result_type,
            i32::from(mcp::ResultType::InputRequired)
        );
        let url = common.input_requests["a"].elicit_request.clone().unwrap();
        assert_eq!(url.url_mode.unwrap().url, "https://example.com/x");
    }
}
