//! The rounds of questions an `InvokeToolInteractive` call puts to its
//! worker (a 2025-11-25 server's `elicitation/create` and
//! `sampling/createMessage`, a 2026-07-28 server's `input_required`, a
//! followed task's questions), on record: each round passes through a
//! forwarding asker between the upstream call and the worker's stream
//! that audits the questions (`input_asked`, queued) and the answers
//! (`input_answered`, written before they go upstream; under
//! `audit.required` a record that cannot be written ends the call instead),
//! counts them (`toolgate_input_rounds_total`) and traces the round
//! (`toolgate.input_round`). The records are built by
//! [`AuditedCall::input_asked`] and [`AuditedCall::input_answered`], as
//! for a unary call's rounds.

use std::collections::HashMap;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::state::Binding;
use crate::calls::error::CallError;
use crate::calls::record::AuditedCall;
use crate::credentials::Redactor;
use crate::telemetry::Metrics;
use crate::upstream::{Answer, CallOutcome, CallRequest, InputSink, Round, Session, UpstreamError};

/// Rounds buffered between the upstream call and the relay.
const BUFFER: usize = 4;

/// The span of one round of questions put to a worker: its revision
/// (`era`), its number, and (recorded later) the kinds asked
/// (comma-separated) and how it ended.
pub(crate) fn round_span(era: &'static str, round: u32) -> tracing::Span {
    tracing::info_span!(
        "toolgate.input_round",
        era,
        round,
        kinds = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// The protocol revision of a session's questions, as spans name it.
pub(crate) fn era(session: &Session) -> &'static str {
    if session.is_stateless() {
        "2026-07-28"
    } else {
        "2025-11-25"
    }
}

/// The rounds of one call on their way to its worker.
pub(crate) struct Asking<'a, R> {
    /// Where the records go.
    pub(crate) audited: &'a AuditedCall,
    /// Where rounds are counted.
    pub(crate) metrics: &'a Metrics,
    /// The call: tenant, server, tool, definition hash.
    pub(crate) binding: &'a Binding,
    /// Keeps answers' content as `audit.arguments` keeps arguments.
    pub(crate) redactor: R,
    /// The revision of the session's questions.
    pub(crate) era: &'static str,
    /// The number of the first round (1, or the next after a retry's).
    pub(crate) first: u32,
    /// Whether the tool is annotated `idempotentHint: true`.
    pub(crate) idempotent: bool,
}

/// A forwarding asker for the upstream call and the rounds it will carry;
/// [`Asking::run`] them to the worker.
fn channel() -> (InputSink, mpsc::Receiver<Round>) {
    mpsc::channel(BUFFER)
}

impl<R: Fn() -> std::sync::Arc<Redactor>> Asking<'_, R> {
    /// Runs `call` on `session`; when it has a `worker` to ask, every
    /// round goes to it through this relay.
    ///
    /// # Errors
    /// An answer could not be recorded under `audit.required` (the call
    /// is dropped: cancelled upstream).
    pub(crate) async fn call(
        &self,
        session: &Session,
        call: &mut CallRequest,
        worker: Option<InputSink>,
    ) -> Result<Result<CallOutcome, UpstreamError>, CallError> {
        let Some(worker) = worker else {
            return Ok(session.call(call).await);
        };
        let (asker, rounds) = channel();
        call.asker = Some(asker);
        tokio::select! {
            result = session.call(call) => Ok(result),
            refused = self.run(rounds, worker) => Err(refused),
        }
    }

    /// Forwards every round of `rounds` to `worker`, on record. Runs
    /// beside the upstream call, which ends it; returns only when an
    /// answer could not be recorded under `audit.required` (the answers
    /// are not sent: the call ends with that error).
    pub(crate) async fn run(
        &self,
        mut rounds: mpsc::Receiver<Round>,
        worker: InputSink,
    ) -> CallError {
        let mut next = self.first;
        let mut in_flight = FuturesUnordered::new();
        loop {
            tokio::select! {
                Some(round) = rounds.recv() => {
                    in_flight.push(self.round(round, &worker, next));
                    next += 1;
                }
                Some(Err(refused)) = in_flight.next(), if !in_flight.is_empty() => return refused,
                else => std::future::pending::<()>().await,
            }
        }
    }

    /// One round: recorded, counted, put to the worker; its answers
    /// recorded, counted and handed back.
    async fn round(
        &self,
        Round { asked, mut reply }: Round,
        worker: &InputSink,
        number: u32,
    ) -> Result<(), CallError> {
        let kinds: Vec<&'static str> = asked.iter().map(|a| a.question.kind().as_str()).collect();
        let span = round_span(self.era, number);
        span.record("kinds", kinds.join(","));
        let b = self.binding;
        let tool = (b.server.as_str(), b.definition_hash.as_str());
        let count = |kind: &str, outcome: &str| {
            self.metrics
                .input_round(&b.tenant, &b.server, &b.exposed_name, kind, outcome);
        };
        let outcome = async {
            for kind in &kinds {
                count(kind, "asked");
            }
            self.audited.input_asked(&asked, tool, number);
            let kind_of: HashMap<String, &'static str> = asked
                .iter()
                .map(|a| (a.id.clone(), a.question.kind().as_str()))
                .collect();
            let (forwarded, answered) = oneshot::channel::<Vec<Answer>>();
            if worker
                .send(Round {
                    asked,
                    reply: forwarded,
                })
                .await
                .is_err()
            {
                return Ok("gone");
            }
            let answers = tokio::select! {
                answers = answered => answers,
                // The call no longer waits (timed out, ended): nor does
                // the worker's stream.
                () = reply.closed() => return Ok("withdrawn"),
            };
            let Ok(answers) = answers else {
                return Ok("gone");
            };
            self.audited
                .input_answered(
                    &answers,
                    tool,
                    number,
                    |id| kind_of.get(id).copied(),
                    &self.redactor,
                )
                .await
                .map_err(|_| CallError::AuditUnavailable {
                    sent: true,
                    idempotent: self.idempotent,
                })?;
            for answer in &answers {
                count(
                    kind_of.get(&answer.id).copied().unwrap_or("unknown"),
                    answer.action.as_str(),
                );
            }
            let _ = reply.send(answers);
            Ok("answered")
        }
        .instrument(span.clone())
        .await;
        span.record(
            "outcome",
            match &outcome {
                Ok(outcome) => *outcome,
                Err(_) => "AUDIT_UNAVAILABLE",
            },
        );
        outcome.map(|_| ())
    }
}
