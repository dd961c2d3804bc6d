//! Questions a server puts to a call's worker, in toolgate's own terms, and
//! what a call asks of [`Session::call`](super::Session::call).
//!
//! A server asks in one of two ways. Up to protocol 2025-11-25 it sends
//! `elicitation/create` or `sampling/createMessage` while the call is
//! pending; from 2026-07-28 the call ends with an `input_required` result
//! (SEP-2322) and is sent again with the answers. Either way a question
//! becomes a [`Question`] with an id ([`Asked`]), and the worker's
//! [`Answer`] is turned back into what that protocol expects. Roots are
//! never asked of a worker: toolgate answers them itself.

// Sampling is deprecated by SEP-2577 but still part of every revision
// toolgate speaks; workers may opt in to it.
#![allow(deprecated)]

use rmcp::model::{
    CallToolResult, CreateMessageRequestParams, CreateMessageResult, CreateTaskResult,
    ElicitRequestParams, ElicitResult, ElicitationAction, InputRequest, InputRequiredResult,
    InputResponses, JsonObject, ProgressNotificationParam,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// The kinds of question a call's worker answers (what it set in
/// `accepts_input`, within what its server's `input` allows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputKinds {
    /// Form elicitation.
    pub form: bool,
    /// URL elicitation.
    pub url: bool,
    /// Sampling (`sampling/createMessage`).
    pub sampling: bool,
}

impl InputKinds {
    /// Whether the worker answers any question at all.
    #[must_use]
    pub fn any(self) -> bool {
        self.form || self.url || self.sampling
    }

    /// Whether the worker answers `question`.
    #[must_use]
    pub fn accepts(self, question: &Question) -> bool {
        match question.kind() {
            QuestionKind::Form => self.form,
            QuestionKind::Url => self.url,
            QuestionKind::Sampling => self.sampling,
        }
    }

    /// Both sets' kinds (a worker's wishes within a server's allowance).
    #[must_use]
    pub fn and(self, other: Self) -> Self {
        Self {
            form: self.form && other.form,
            url: self.url && other.url,
            sampling: self.sampling && other.sampling,
        }
    }
}

/// Which kind a question is (for metrics, audit and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuestionKind {
    /// A form.
    Form,
    /// A URL to open.
    Url,
    /// A completion for the worker's model.
    Sampling,
}

impl QuestionKind {
    /// The kind's name in metrics, audit records and errors.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Form => "form",
            Self::Url => "url",
            Self::Sampling => "sampling",
        }
    }
}

/// One question of a server, protocol-neutral.
#[derive(Debug, Clone, PartialEq)]
pub enum Question {
    /// Fill in a form: `schema` is the requested JSON schema (flat,
    /// primitive properties).
    Form {
        /// What the server asks, for the user.
        message: String,
        /// The requested schema.
        schema: Value,
    },
    /// Open a URL.
    Url {
        /// Why the user should open it.
        message: String,
        /// The URL.
        url: String,
        /// The server's id for the elicitation (empty on 2026-07-28).
        elicitation_id: String,
    },
    /// Make a completion: the `sampling/createMessage` params.
    Sampling {
        /// The params as the server sent them.
        params: Value,
    },
}

impl Question {
    /// Which kind of question this is.
    #[must_use]
    pub fn kind(&self) -> QuestionKind {
        match self {
            Self::Form { .. } => QuestionKind::Form,
            Self::Url { .. } => QuestionKind::Url,
            Self::Sampling { .. } => QuestionKind::Sampling,
        }
    }

    /// Takes every configured credential and live token out of the
    /// question's texts (message, URL, schema, sampling params): a server
    /// that echoes one back never hands it to a worker.
    pub(crate) fn redact(&mut self, redaction: &crate::credentials::Redaction) {
        match self {
            Self::Form { message, schema } => {
                redaction.redact_in_place(message);
                redaction.redact_json(schema);
            }
            Self::Url {
                message,
                url,
                elicitation_id,
            } => {
                redaction.redact_in_place(message);
                redaction.redact_in_place(url);
                redaction.redact_in_place(elicitation_id);
            }
            Self::Sampling { params } => redaction.redact_json(params),
        }
    }

    /// The question of an `elicitation/create` request; `None` for a
    /// mode toolgate does not know.
    #[must_use]
    pub fn from_elicitation(params: &ElicitRequestParams) -> Option<Self> {
        Some(match params {
            ElicitRequestParams::FormElicitationParams {
                message,
                requested_schema,
                ..
            } => Self::Form {
                message: message.clone(),
                schema: serde_json::to_value(requested_schema).unwrap_or_default(),
            },
            ElicitRequestParams::UrlElicitationParams {
                message,
                url,
                elicitation_id,
                ..
            } => Self::Url {
                message: message.clone(),
                url: url.clone(),
                elicitation_id: elicitation_id.clone(),
            },
            #[allow(unreachable_patterns)]
            _ => return None,
        })
    }

    /// The question of a `sampling/createMessage` request.
    #[must_use]
    pub fn from_sampling(params: &CreateMessageRequestParams) -> Self {
        Self::Sampling {
            params: serde_json::to_value(params).unwrap_or_default(),
        }
    }

    /// The question of one entry of an `input_required` result; `None`
    /// for `roots/list`, which toolgate answers itself.
    #[must_use]
    pub fn from_input_request(request: &InputRequest) -> Option<Self> {
        match request {
            InputRequest::Elicitation(r) => Self::from_elicitation(&r.params),
            InputRequest::CreateMessage(r) => Some(Self::from_sampling(&r.params)),
            InputRequest::ListRoots(_) => None,
            // A kind added to rmcp later: not a question toolgate knows.
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// A question with the id its answer names.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    /// The server's key (2026-07-28) or toolgate's (earlier revisions).
    pub id: String,
    /// The question.
    pub question: Question,
}

/// What the user (or model) did with a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Answered.
    Accept,
    /// Said no.
    Decline,
    /// Dismissed.
    Cancel,
}

impl Action {
    /// The action's name in audit records.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Decline => "decline",
            Self::Cancel => "cancel",
        }
    }
}

/// A worker's answer to one question.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The id of the question answered.
    pub id: String,
    /// What was done.
    pub action: Action,
    /// With [`Action::Accept`]: the form's values (an object) or the
    /// sampling result; `None` otherwise and for a URL.
    pub content: Option<Value>,
}

/// Why an answer cannot be given to the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The answer names no question that was asked.
    #[error("answer `{0}` names no question that was asked")]
    UnknownId(String),
    /// A question was answered twice.
    #[error("question `{0}` is answered twice")]
    Duplicate(String),
    /// The content does not fit the question.
    #[error("answer `{id}`: {reason}")]
    Content {
        /// The question's id.
        id: String,
        /// What is wrong with the content.
        reason: String,
    },
}

impl Answer {
    /// The `elicitation/create` result: the action and, when accepted, a
    /// form's values (which must be a JSON object; a URL takes none).
    ///
    /// # Errors
    /// The content does not fit the question.
    pub fn to_elicit_result(&self, question: &Question) -> Result<ElicitResult, AnswerError> {
        let action = match self.action {
            Action::Accept => ElicitationAction::Accept,
            Action::Decline => ElicitationAction::Decline,
            Action::Cancel => ElicitationAction::Cancel,
        };
        let result = ElicitResult::new(action);
        match (question, self.action, &self.content) {
            (Question::Form { .. }, Action::Accept, Some(Value::Object(values))) => {
                Ok(result.with_content(Value::Object(values.clone())))
            }
            (Question::Form { .. }, Action::Accept, _) => Err(self.invalid(
                "accepting a form needs `content_json`: a JSON object of the form's values",
            )),
            (Question::Url { .. }, _, Some(_)) => {
                Err(self.invalid("a URL question takes no `content_json`"))
            }
            (_, Action::Decline | Action::Cancel, Some(_)) => {
                Err(self.invalid("only an accepted answer carries `content_json`"))
            }
            (Question::Sampling { .. }, ..) => {
                Err(self.invalid("a sampling question is not an elicitation"))
            }
            _ => Ok(result),
        }
    }

    /// The `sampling/createMessage` result of an accepted answer.
    ///
    /// # Errors
    /// Not accepted, or the content is not a `CreateMessageResult` with an
    /// assistant message.
    pub fn to_sampling_result(&self) -> Result<CreateMessageResult, AnswerError> {
        let Some(content) = (self.action == Action::Accept)
            .then_some(self.content.as_ref())
            .flatten()
        else {
            return Err(self.invalid(
                "only an accepted sampling answer has a result (`content_json`: an MCP CreateMessageResult)",
            ));
        };
        let result: CreateMessageResult = serde_json::from_value(content.clone()).map_err(|e| {
            self.invalid(&format!(
                "`content_json` is not an MCP CreateMessageResult: {e}"
            ))
        })?;
        result
            .validate()
            .map_err(|e| self.invalid(&format!("`content_json`: {e}")))?;
        Ok(result)
    }

    /// The value of this answer in a 2026-07-28 `inputResponses` map;
    /// `None` for a declined or cancelled sampling question (the key is
    /// left out, as the protocol has no refusal for sampling).
    ///
    /// # Errors
    /// The content does not fit the question.
    pub fn to_input_response(&self, question: &Question) -> Result<Option<Value>, AnswerError> {
        match question {
            Question::Sampling { .. } if self.action != Action::Accept => Ok(None),
            Question::Sampling { .. } => {
                let result = self.to_sampling_result()?;
                Ok(Some(serde_json::to_value(result).unwrap_or_default()))
            }
            _ => {
                let result = self.to_elicit_result(question)?;
                Ok(Some(serde_json::to_value(result).unwrap_or_default()))
            }
        }
    }

    fn invalid(&self, reason: &str) -> AnswerError {
        AnswerError::Content {
            id: self.id.clone(),
            reason: reason.to_owned(),
        }
    }
}

/// Takes every configured credential and live token out of the requests
/// of an `input_required` result or of a task that asks (each request's
/// texts, as [`Question::redact`]). A request that no longer parses once
/// redacted (a credential was a value the protocol constrains) is
/// dropped: the server asks again or fails.
pub(crate) fn redact_requests(
    requests: &mut rmcp::model::InputRequests,
    redaction: &crate::credentials::Redaction,
) {
    if redaction.is_empty() {
        return;
    }
    requests.retain(|_, request| {
        let Ok(mut value) = serde_json::to_value(&*request) else {
            return false;
        };
        redaction.redact_json(&mut value);
        match serde_json::from_value(value) {
            Ok(redacted) => {
                *request = redacted;
                true
            }
            Err(_) => false,
        }
    });
}

/// Matches `answers` to the questions `asked`: every answer names a
/// question, none twice. Questions left unanswered are allowed (the
/// server asks again or fails).
///
/// # Errors
/// An unknown or repeated id.
pub fn match_answers<'a>(
    asked: &'a [Asked],
    answers: &'a [Answer],
) -> Result<Vec<(&'a Asked, &'a Answer)>, AnswerError> {
    let mut matched: Vec<(&Asked, &Answer)> = Vec::with_capacity(answers.len());
    for answer in answers {
        let Some(question) = asked.iter().find(|q| q.id == answer.id) else {
            return Err(AnswerError::UnknownId(answer.id.clone()));
        };
        if matched.iter().any(|(q, _)| q.id == answer.id) {
            return Err(AnswerError::Duplicate(answer.id.clone()));
        }
        matched.push((question, answer));
    }
    Ok(matched)
}

/// One round of questions for a worker on an open stream, and where its
/// answers go. Dropping `reply` (the worker went away) fails the call.
#[derive(Debug)]
pub struct Round {
    /// The questions of this round.
    pub asked: Vec<Asked>,
    /// The worker's answers.
    pub reply: oneshot::Sender<Vec<Answer>>,
}

/// Where a call sends questions for its worker (`InvokeToolInteractive`).
pub type InputSink = mpsc::Sender<Round>;

/// What [`Session::call`](super::Session::call) is asked to do.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// The tool's upstream name.
    pub tool: String,
    /// Its arguments.
    pub arguments: JsonObject,
    /// How long to wait for the answer.
    pub timeout: std::time::Duration,
    /// The caller's own trace context, sent when trace export is off.
    pub inherited_trace: Vec<(String, String)>,
    /// Where the server's progress notifications go.
    pub progress: Option<mpsc::Sender<ProgressNotificationParam>>,
    /// What the worker answers (empty: nothing, today's behaviour).
    pub accepts: InputKinds,
    /// The worker follows a task itself.
    pub accepts_task: bool,
    /// The server's tools may run as tasks (`servers[].input.tasks`): a
    /// call refused for want of the tasks extension is sent again with it
    /// declared, and followed by toolgate when the worker does not.
    pub tasks_allowed: bool,
    /// Declare the tasks extension for this call although the worker does
    /// not follow tasks itself (set by toolgate when it resends a call the
    /// server refused for want of it, and then follows the task).
    pub declare_tasks: bool,
    /// A 2026-07-28 retry: the answers to the previous round.
    pub input_responses: Option<InputResponses>,
    /// A 2026-07-28 retry: the server's own `requestState`, echoed.
    pub request_state: Option<String>,
    /// Where questions go while the call runs (`InvokeToolInteractive`).
    pub asker: Option<InputSink>,
}

impl CallRequest {
    /// A plain call: no input, no task.
    #[must_use]
    pub fn new(
        tool: impl Into<String>,
        arguments: JsonObject,
        timeout: std::time::Duration,
    ) -> Self {
        Self {
            tool: tool.into(),
            arguments,
            timeout,
            inherited_trace: Vec::new(),
            progress: None,
            accepts: InputKinds::default(),
            accepts_task: false,
            tasks_allowed: false,
            declare_tasks: false,
            input_responses: None,
            request_state: None,
            asker: None,
        }
    }
}

/// How an upstream call ended.
#[derive(Debug, Clone)]
pub enum CallOutcome {
    /// The tool finished (or reported failure with `isError`).
    Complete(CallToolResult),
    /// The server needs answers before the tool can finish (2026-07-28).
    InputRequired(InputRequiredResult),
    /// The call became a task on the server.
    Task(CreateTaskResult),
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn form() -> Question {
        Question::Form {
            message: "How many?".into(),
            schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        }
    }

    fn answer(action: Action, content: Option<Value>) -> Answer {
        Answer {
            id: "q".into(),
            action,
            content,
        }
    }

    #[test]
    fn a_form_is_accepted_only_with_an_object_of_values() {
        let ok = answer(Action::Accept, Some(json!({"n": 3})))
            .to_elicit_result(&form())
            .expect("accepted");
        assert_eq!(ok.action, ElicitationAction::Accept);
        assert_eq!(ok.content, Some(json!({"n": 3})));
        for content in [None, Some(json!([3])), Some(json!("3"))] {
            let refused = answer(Action::Accept, content).to_elicit_result(&form());
            assert!(matches!(refused, Err(AnswerError::Content { .. })));
        }
        let declined = answer(Action::Decline, None)
            .to_elicit_result(&form())
            .unwrap();
        assert_eq!(declined.action, ElicitationAction::Decline);
        assert!(declined.content.is_none());
        assert!(
            answer(Action::Cancel, Some(json!({})))
                .to_elicit_result(&form())
                .is_err()
        );
    }

    #[test]
    fn a_url_question_takes_no_content() {
        let url = Question::Url {
            message: "Sign in".into(),
            url: "https://example.com".into(),
            elicitation_id: "e1".into(),
        };
        assert!(answer(Action::Accept, None).to_elicit_result(&url).is_ok());
        assert!(
            answer(Action::Accept, Some(json!({})))
                .to_elicit_result(&url)
                .is_err()
        );
    }

    #[test]
    fn a_sampling_answer_is_an_assistant_message() {
        let sampling = Question::Sampling { params: json!({}) };
        let result = json!({
            "model": "m", "role": "assistant",
            "content": {"type": "text", "text": "hi"}
        });
        let value = answer(Action::Accept, Some(result))
            .to_input_response(&sampling)
            .expect("valid")
            .expect("present");
        assert_eq!(value["content"]["text"], "hi");
        let user = json!({"model": "m", "role": "user", "content": {"type": "text", "text": "hi"}});
        assert!(
            answer(Action::Accept, Some(user))
                .to_sampling_result()
                .is_err()
        );
        assert_eq!(
            answer(Action::Decline, None).to_input_response(&sampling),
            Ok(None)
        );
    }

    #[test]
    fn answers_name_asked_questions_once() {
        let asked = [Asked {
            id: "q".into(),
            question: form(),
        }];
        let one = [answer(Action::Decline, None)];
        assert_eq!(match_answers(&asked, &one).unwrap().len(), 1);
        let twice = [answer(Action::Decline, None), answer(Action::Cancel, None)];
        assert_eq!(
            match_answers(&asked, &twice).unwrap_err(),
            AnswerError::Duplicate("q".into())
        );
        let other = [Answer {
            id: "x".into(),
            action: Action::Decline,
            content: None,
        }];
        assert_eq!(
            match_answers(&asked, &other).unwrap_err(),
            AnswerError::UnknownId("x".into())
        );
    }
}
