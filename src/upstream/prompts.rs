//! `prompts/get` on a live session: the prompt rendered with its
//! arguments, or (2026-07-28) a round of questions the caller answers and
//! retries with. The listing itself is read at connect (`Connecting::finish`).

use std::time::Duration;

use rmcp::model::{
    ClientRequest, GetPromptRequest, GetPromptRequestParams, GetPromptResult, InputRequiredResult,
    InputResponses, JsonObject, ServerResult,
};

use super::redact::redact_block;
use super::{InputKinds, Request, Session, UpstreamError, input};

/// What `prompts/get` answered.
#[derive(Debug)]
pub enum PromptOutcome {
    /// The rendered prompt (redacted when the session redacts results).
    Complete(GetPromptResult),
    /// A 2026-07-28 round of questions (redacted): answer them and send
    /// the request again with its `request_state`.
    InputRequired(InputRequiredResult),
}

/// One `prompts/get` of [`Session::get_prompt`].
#[derive(Debug, Clone)]
pub struct PromptRequest {
    /// The prompt's name on its server.
    pub name: String,
    /// Its arguments.
    pub arguments: JsonObject,
    /// How long to wait for the answer.
    pub timeout: Duration,
    /// The kinds of question the caller answers (declared on 2026-07-28
    /// sessions).
    pub accepts: InputKinds,
    /// The answers of a retry.
    pub input_responses: Option<InputResponses>,
    /// The server's state of a retry.
    pub request_state: Option<String>,
    /// The caller's own trace context, sent when trace export is off.
    pub inherited_trace: Vec<(String, String)>,
}

impl Session {
    /// Renders a prompt: `prompts/get` with the request's arguments,
    /// within its timeout, as [`Session::request`] sends any request.
    ///
    /// # Errors
    /// As [`Session::request`]; `Protocol` for an answer that is not a
    /// prompt.
    pub async fn get_prompt(&self, prompt: &PromptRequest) -> Result<PromptOutcome, UpstreamError> {
        let mut params = GetPromptRequestParams::new(prompt.name.clone());
        params.arguments = Some(prompt.arguments.clone());
        params.input_responses.clone_from(&prompt.input_responses);
        params.request_state.clone_from(&prompt.request_state);
        let mut request = Request::new(
            ClientRequest::GetPromptRequest(GetPromptRequest::new(params)),
            prompt.timeout,
        );
        request.accepts = prompt.accepts;
        request.inherited_trace.clone_from(&prompt.inherited_trace);
        match self.request(&request).await? {
            ServerResult::GetPromptResult(mut result) => {
                if self.redacts_results() {
                    redact_prompt(&mut result, self.redaction());
                }
                Ok(PromptOutcome::Complete(result))
            }
            ServerResult::InputRequiredResult(mut asked) => {
                // Questions reach workers: no credential in them.
                if let Some(requests) = &mut asked.input_requests {
                    input::redact_requests(requests, self.redaction());
                }
                Ok(PromptOutcome::InputRequired(asked))
            }
            _ => Err(UpstreamError::Protocol(
                "an unknown kind of prompts/get result".to_owned(),
            )),
        }
    }
}

/// Takes every configured credential and live token out of a rendered
/// prompt: its description, each message's text, embedded resources'
/// text, links' text fields and `_meta` (as for tool results; binary
/// data is left alone).
fn redact_prompt(result: &mut GetPromptResult, redaction: &crate::credentials::Redaction) {
    if redaction.is_empty() {
        return;
    }
    if let Some(description) = &mut result.description {
        redaction.redact_in_place(description);
    }
    for message in &mut result.messages {
        redact_block(&mut message.content, redaction);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ContentBlock, PromptMessage, ResourceContents, Role};

    #[test]
    fn redacts_text_and_embedded_text_not_blobs() {
        let redactor = crate::credentials::Redactor::new(["s3cret-value"]).shared();
        let redaction = crate::credentials::Redaction::new(redactor);
        let mut result = GetPromptResult::new(vec![
            PromptMessage::new(Role::User, ContentBlock::text("key s3cret-value here")),
            PromptMessage::new(
                Role::Assistant,
                ContentBlock::embedded_text("file:///s3cret-value", "and s3cret-value"),
            ),
            PromptMessage::new(
                Role::User,
                ContentBlock::resource(ResourceContents::BlobResourceContents {
                    uri: "file:///b".to_owned(),
                    mime_type: None,
                    blob: "czNjcmV0LXZhbHVl".to_owned(),
                    meta: None,
                }),
            ),
        ])
        .with_description("uses s3cret-value");
        redact_prompt(&mut result, &redaction);
        let text = serde_json::to_string(&result).unwrap();
        assert!(!text.contains("s3cret-value"), "{text}");
        // Blobs are carried as they came.
        assert!(text.contains("czNjcmV0LXZhbHVl"), "{text}");
    }
}
