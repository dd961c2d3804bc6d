//! The rounds of questions of a 2026-07-28 server on `InvokeTool` and
//! `InvokeToolStream`: a retry's sealed `request_state` opened and its
//! answers turned into the server's `inputResponses` (audited before they
//! leave), a round handed out to the worker (`INPUT_NOT_ACCEPTED`,
//! `INPUT_ROUNDS_EXCEEDED`, sealed, audited), a `-32021` naming kinds of
//! question, and their `toolgate_input_rounds_total`.

mod answers;
pub(crate) mod asking;
pub(crate) mod state;

pub use answers::{InputFields, InputResponse, MAX_ANSWERS, answers};
pub(crate) use state::{Binding, Method, arguments_digest};

use super::classify;
use super::record::AuditedCall;
use super::viewer::Viewer;
use crate::calls::error::{CallError, Pin};
use crate::catalog::{Catalog, CatalogTool};
use crate::config::ServerConfig;
use crate::registry::Tenant;
use crate::telemetry::Metrics;
use crate::upstream::{Asked, InputKinds, UpstreamError};
use state as input_state;

/// A round of questions for the caller: what the server asked, and
/// toolgate's sealed state of the round, which the caller's retry passes
/// back with its answers.
#[derive(Debug, Clone)]
pub struct Questions {
    /// The questions.
    pub asked: Vec<Asked>,
    /// The sealed `request_state`.
    pub request_state: String,
}

/// A round of questions being handed out.
pub(crate) struct Handing<'a> {
    pub(crate) keys: &'a crate::state::KeyRing,
    pub(crate) metrics: &'a Metrics,
    pub(crate) binding: &'a input_state::Binding,
    pub(crate) server: &'a ServerConfig,
    pub(crate) accepts: InputKinds,
    /// Its number (1 for the first).
    pub(crate) number: u32,
}

impl Handing<'_> {
    /// A round of questions for the worker: `INPUT_NOT_ACCEPTED` when the
    /// call did not opt in to every kind asked, else the questions with
    /// the sealed state of this round (counted and audited).
    ///
    /// `protocol` is the error of a round the server put malformed.
    pub(crate) fn hand_out(
        &self,
        asked: rmcp::model::InputRequiredResult,
        audited: &AuditedCall,
        protocol: impl Fn(String) -> CallError,
    ) -> Result<Questions, CallError> {
        let span = asking::round_span("2026-07-28", self.number);
        let handed = span.in_scope(|| self.questions(asked, audited, protocol));
        span.record(
            "outcome",
            match &handed {
                Ok(_) => "asked",
                Err(e) => classify(e).1,
            },
        );
        handed
    }

    /// [`Handing::hand_out`], in the round's span.
    fn questions(
        &self,
        asked: rmcp::model::InputRequiredResult,
        audited: &AuditedCall,
        protocol: impl Fn(String) -> CallError,
    ) -> Result<Questions, CallError> {
        let kinds_of =
            |ids: &[input_state::AskedId]| ids.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>();
        let questions = input_state::round(
            asked,
            self.accepts,
            |kinds| {
                for kind in &kinds {
                    self.count(kind, "not_accepted");
                }
                CallError::InputNotAccepted {
                    server: self.binding.server.clone(),
                    tool: self.binding.target(),
                    kinds,
                }
            },
            protocol,
        )?;
        tracing::Span::current().record("kinds", kinds_of(&questions.ids).join(","));
        let limit = self.server.input.max_rounds;
        if self.number > limit {
            for kind in kinds_of(&questions.ids) {
                self.count(kind, "rounds_exceeded");
            }
            return Err(CallError::InputRoundsExceeded {
                server: self.binding.server.clone(),
                tool: self.binding.target(),
                limit,
            });
        }
        let state = input_state::seal(
            self.keys,
            self.binding,
            &questions,
            self.number,
            self.server.input.state_ttl,
            std::time::SystemTime::now(),
        );
        for kind in kinds_of(&questions.ids) {
            self.count(kind, "asked");
        }
        let b = self.binding;
        audited.input_asked(
            &questions.asked,
            (&b.server, &b.definition_hash),
            self.number,
        );
        Ok(Questions {
            asked: questions.asked,
            request_state: state,
        })
    }

    fn count(&self, kind: &str, outcome: &str) {
        let b = self.binding;
        self.metrics
            .input_round(&b.tenant, &b.server, &b.exposed_name, kind, outcome);
    }
}

/// A retry checked: its state opened, its answers as `inputResponses`.
pub(crate) struct CheckedRetry {
    state: input_state::Retry,
    answers: Vec<crate::upstream::Answer>,
    responses: rmcp::model::InputResponses,
}

/// A retry's `request_state` opened and checked, and its answers turned
/// into the server's `inputResponses`, and its round claimed in `used`
/// (a round is answered once): all before anything is sent. `None` for a
/// call that is no retry.
///
/// # Errors
/// One of the answers or the state is refused (each with its reason);
/// answers without a state, or a state without answers; the round was
/// answered before (`REQUEST_STATE_USED`); the store of answered rounds
/// is unreachable (`STATE_UNAVAILABLE`, nothing sent).
pub(crate) async fn open_retry(
    (keys, used): (&crate::state::KeyRing, &crate::state::FirstUse),
    tenant: &Tenant,
    server: &ServerConfig,
    (request_state, input_responses): (&str, &[InputResponse]),
    binding: &input_state::Binding,
    definition_changed: impl FnOnce() -> CallError,
) -> Result<Option<CheckedRetry>, CallError> {
    let invalid = |reason: &str| CallError::InputResponseInvalid {
        reason: reason.to_owned(),
    };
    match (request_state.is_empty(), input_responses.is_empty()) {
        (true, true) => return Ok(None),
        (true, false) => {
            return Err(invalid(
                "input_responses without request_state: pass back the request_state of the \
                 InputRequired being answered",
            ));
        }
        (false, true) => {
            return Err(invalid(
                "request_state without input_responses: answer the questions it came with",
            ));
        }
        (false, false) => {}
    }
    let state = input_state::open(
        keys,
        request_state,
        binding,
        std::time::SystemTime::now(),
        definition_changed,
    )?;
    let answers = answers(input_responses, tenant.limits().max_argument_bytes)?;
    let responses = state.responses(&answers, &server.roots)?;
    let limit = server.input.max_rounds;
    if state.round > limit {
        return Err(CallError::InputRoundsExceeded {
            server: binding.server.clone(),
            tool: binding.target(),
            limit,
        });
    }
    // Last, after every other check: a refused retry must not spend the
    // round.
    let claimed = used
        .claim(
            &state.nonce,
            i64::try_from(state.exp_ms).unwrap_or(i64::MAX),
        )
        .await
        .map_err(|e| CallError::StateUnavailable {
            server: binding.server.clone(),
            reason: e.to_string(),
        })?;
    if !claimed {
        return Err(CallError::RequestStateRefused {
            tool: binding.target(),
            refusal: crate::calls::error::StateRefusal::Used,
            detail: "its round was answered already (a round's answers are used once): call \
                     again without request_state and input_responses to start over"
                .to_owned(),
        });
    }
    Ok(Some(CheckedRetry {
        state,
        answers,
        responses,
    }))
}

/// Counts the answers of a retry, by kind and action.
fn count_answers(metrics: &Metrics, binding: &input_state::Binding, retry: &CheckedRetry) {
    for answer in &retry.answers {
        let kind = retry
            .state
            .kind_of(&answer.id)
            .map_or("unknown", input_state::Kind::as_str);
        metrics.input_round(
            &binding.tenant,
            &binding.server,
            &binding.exposed_name,
            kind,
            answer.action.as_str(),
        );
    }
}

/// `TOOL_DEFINITION_CHANGED` for a retry whose state was handed out for
/// an earlier definition of `tool`.
pub(crate) fn definition_changed(
    tool: &CatalogTool,
    viewer: &Viewer<'_>,
    catalog: &Catalog,
) -> CallError {
    CallError::PlanOutdated {
        tool: tool.name.clone(),
        pin: Pin::DefinitionChanged,
        detail: format!(
            "the definition of `{}` changed since its request_state was handed out: call again \
             without request_state and input_responses",
            tool.name
        ),
        current_version: viewer.version(catalog).into_owned(),
        current_hash: tool.definition_hash.clone(),
    }
}

/// `INPUT_NOT_ACCEPTED` for a `-32021` refusal naming only kinds of
/// question (the server would have asked, had the call opted in); any
/// other result as it is.
pub(crate) fn not_accepted<T>(
    result: Result<T, UpstreamError>,
    metrics: &Metrics,
    binding: &input_state::Binding,
) -> Result<Result<T, UpstreamError>, CallError> {
    let kinds = match &result {
        Err(UpstreamError::MissingCapability { required, .. }) => input_kinds(required),
        _ => None,
    };
    let Some(kinds) = kinds else {
        return Ok(result);
    };
    for kind in &kinds {
        let b = binding;
        metrics.input_round(&b.tenant, &b.server, &b.exposed_name, kind, "not_accepted");
    }
    Err(CallError::InputNotAccepted {
        server: binding.server.clone(),
        tool: binding.target(),
        kinds,
    })
}

/// The kinds of question `required` names (a `-32021` refusal), when it
/// names only kinds a worker can opt in to (roots: when none are
/// configured, a call cannot provide them either).
fn input_kinds(required: &[String]) -> Option<Vec<&'static str>> {
    required
        .iter()
        .map(|name| match name.as_str() {
            "form" => Some("form"),
            "url" => Some("url"),
            "sampling" => Some("sampling"),
            "roots" => Some("roots"),
            _ => None,
        })
        .collect()
}

/// What a call sends of a retry: the number of the round its server may
/// ask next, and its `inputResponses` and the server's `requestState`.
pub(crate) type Answered = (u32, Option<(rmcp::model::InputResponses, Option<String>)>);

/// A retry's answers on record (written before they leave; under
/// `audit.required`, a record that cannot be written refuses the retry)
/// and counted; a call that is no retry asks round 1.
///
/// # Errors
/// `AUDIT_UNAVAILABLE` (nothing sent).
pub(crate) async fn answered(
    retry: Option<CheckedRetry>,
    audited: &AuditedCall,
    metrics: &Metrics,
    binding: &input_state::Binding,
    tenant: &Tenant,
) -> Result<Answered, CallError> {
    let Some(retry) = retry else {
        return Ok((1, None));
    };
    audited
        .input_answered(
            &retry.answers,
            (&binding.server, &binding.definition_hash),
            retry.state.round,
            |id| retry.state.kind_of(id).map(input_state::Kind::as_str),
            || tenant.redactor(),
        )
        .await?;
    count_answers(metrics, binding, &retry);
    let next = retry.state.round + 1;
    Ok((next, Some((retry.responses, retry.state.server_state))))
}
