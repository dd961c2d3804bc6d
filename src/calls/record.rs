//! The audit record of one call ([`crate::audit`]): what is known when
//! the call starts (who, what, the arguments' digest), completed with how
//! it ended and written before the response leaves. A call dropped before
//! it ended (the caller went away) is recorded as cancelled. Under
//! `audit.required`, a place in the writer's queue is reserved before the
//! call is sent ([`AuditedCall::admit`]), and the record, whichever it is,
//! goes through it.

use std::time::Instant;

use super::{Origin, classify};
use crate::audit::{
    Audit, AuditSlot, CallerRecord, InputItem, Outcome, Record, RecordKind, code_name,
    error_outcome,
};
use crate::calls::error::CallError;

/// A call's record in the making.
pub(crate) struct AuditedCall {
    audit: Audit,
    /// `None` once written (or when the trail is disabled).
    record: Option<Record>,
    /// The place reserved for the record before the call was sent
    /// (`audit.required` only).
    slot: Option<AuditSlot>,
    /// No place could be reserved: the call was refused before sending,
    /// and its record is queued without waiting for room.
    no_room: bool,
    started: Instant,
}

/// How far a call got, as the record tells it.
pub(crate) struct Progress<'a> {
    /// The server the name resolved to (or whose namespace it is in).
    pub(crate) server: Option<&'a str>,
    /// The definition hash of the resolved tool.
    pub(crate) definition_hash: Option<&'a str>,
    /// Whether the request was handed to the upstream session.
    pub(crate) sent: bool,
    /// Whether the tool is annotated `idempotentHint: true`.
    pub(crate) idempotent: bool,
}

impl Progress<'static> {
    /// A call that got nowhere.
    pub(crate) fn none() -> Self {
        Progress {
            server: None,
            definition_hash: None,
            sent: false,
            idempotent: false,
        }
    }
}

impl AuditedCall {
    /// The record of a call of `origin`'s, with the digest of the
    /// arguments `arguments_json` gives (`None`: no arguments kept; not
    /// asked when the trail is disabled). What it is about
    /// (`tool`, `uri`, `prompt`, ...) is set with [`AuditedCall::describe`].
    pub(crate) fn of<'a>(
        audit: &Audit,
        origin: &Origin,
        arguments_json: impl FnOnce() -> Option<std::borrow::Cow<'a, str>>,
    ) -> Self {
        let record = audit.is_enabled().then(|| {
            let mut record = Record::new(RecordKind::Call, Outcome::Cancelled);
            record.rpc = Some(origin.rpc.to_owned());
            record.tenant = Some(origin.tenant.name.clone());
            record.subject = origin.subject.id().map(|_| origin.subject.key().to_owned());
            record.caller = Some(CallerRecord::from(&origin.caller.identity));
            record.peer = origin.peer.map(|a| a.to_string());
            if let Some(arguments_json) = arguments_json() {
                record.arguments = audit.arguments(&arguments_json, || origin.tenant.redactor());
            }
            record.trace_id = origin
                .trace
                .iter()
                .find(|(key, _)| key == "traceparent")
                .and_then(|(_, value)| crate::telemetry::trace::traceparent_id(value));
            record
        });
        Self {
            audit: audit.clone(),
            record,
            slot: None,
            no_room: false,
            started: origin.started,
        }
    }

    /// Sets what the record is about (`tool`, `uri`, `prompt`,
    /// `uri_template`); nothing when the trail is disabled.
    pub(crate) fn describe(&mut self, describe: impl FnOnce(&mut Record)) {
        if let Some(record) = &mut self.record {
            describe(record);
        }
    }

    /// Whether the call may be sent upstream. With `audit.required`, not
    /// while the sink is known to be broken, and only once a place in the
    /// writer's queue is reserved for its record (waiting at most
    /// [`crate::audit::ACK_TIMEOUT`]): the record then cannot be lost,
    /// even when the caller goes away mid-call.
    ///
    /// # Errors
    /// `AUDIT_UNAVAILABLE` (nothing sent).
    pub(crate) async fn admit(&mut self, idempotent: bool) -> Result<(), CallError> {
        if !self.audit.is_required() || self.slot.is_some() {
            return Ok(());
        }
        let refused = CallError::AuditUnavailable {
            sent: false,
            idempotent,
        };
        if !self.audit.is_healthy() {
            // Nothing is sent that could not be audited.
            return Err(refused);
        }
        match self.audit.reserve().await {
            Ok(slot) => {
                self.slot = slot;
                Ok(())
            }
            Err(_) => {
                self.no_room = true;
                Err(refused)
            }
        }
    }

    /// An `input` record of this call (`event`) to `tool` (its server and
    /// definition hash), from what is known of the call now; `None` when
    /// the trail is disabled.
    fn input_record(
        &self,
        event: &str,
        tool: (&str, &str),
        round: u32,
        items: Vec<InputItem>,
    ) -> Option<Record> {
        let mut record = self.record.as_ref()?.clone();
        record.server = Some(tool.0.to_owned());
        record.definition_hash = Some(tool.1.to_owned());
        record.time = crate::audit::now();
        record.kind = RecordKind::Input;
        record.outcome = Outcome::Ok;
        record.event = Some(event.to_owned());
        record.round = Some(round);
        record.input = Some(items);
        record.arguments = None;
        Some(record)
    }

    /// Records a round of questions handed to the worker (queued: the
    /// call's own record, written before the response leaves, says the
    /// call ended with questions).
    pub(crate) fn input_asked(
        &self,
        asked: &[crate::upstream::Asked],
        tool: (&str, &str),
        round: u32,
    ) {
        let items = asked
            .iter()
            .map(|a| InputItem {
                id: a.id.clone(),
                kind: a.question.kind().as_str().to_owned(),
                action: None,
                content: None,
            })
            .collect();
        if let Some(record) = self.input_record("input_asked", tool, round, items) {
            self.audit.enqueue(record);
        }
    }

    /// Records the worker's answers to round `round` before they are sent
    /// upstream, each answer's content kept as `audit.arguments` keeps
    /// arguments. Waits for the record; with `audit.required`, a record
    /// that cannot be written refuses the retry (nothing sent).
    ///
    /// # Errors
    /// `AUDIT_UNAVAILABLE` (nothing sent).
    pub(crate) async fn input_answered(
        &self,
        answers: &[crate::upstream::Answer],
        tool: (&str, &str),
        round: u32,
        kind_of: impl Fn(&str) -> Option<&'static str>,
        redactor: impl Fn() -> std::sync::Arc<crate::credentials::Redactor>,
    ) -> Result<(), CallError> {
        let items = answers
            .iter()
            .map(|a| InputItem {
                id: a.id.clone(),
                kind: kind_of(&a.id).unwrap_or("unknown").to_owned(),
                action: Some(a.action.as_str().to_owned()),
                content: a
                    .content
                    .as_ref()
                    .and_then(|c| self.audit.arguments(&c.to_string(), &redactor)),
            })
            .collect();
        let Some(record) = self.input_record("input_answered", tool, round, items) else {
            return Ok(());
        };
        match self.audit.write(record).await {
            Err(_) if self.audit.is_required() => Err(CallError::AuditUnavailable {
                sent: false,
                idempotent: false,
            }),
            _ => Ok(()),
        }
    }

    /// Records what the guards did in this call (`guards`): `acted` in
    /// order; `replaced_arguments`, the arguments sent upstream when a
    /// request-phase guard replaced them, kept on the last such entry as
    /// `audit.arguments` keeps arguments.
    pub(crate) fn guarded(
        &mut self,
        acted: &[crate::guards::Acted],
        replaced_arguments: Option<&str>,
        redactor: impl FnOnce() -> std::sync::Arc<crate::credentials::Redactor>,
    ) {
        if acted.is_empty() {
            return;
        }
        let Some(record) = &mut self.record else {
            return;
        };
        let mut guards: Vec<crate::audit::GuardRecord> = acted
            .iter()
            .map(|a| crate::audit::GuardRecord {
                guard: a.guard.clone(),
                phase: a.phase.as_str().to_owned(),
                verdict: a.verdict.as_str().to_owned(),
                arguments: None,
            })
            .collect();
        if let Some(text) = replaced_arguments
            && let Some(last) = guards
                .iter_mut()
                .rev()
                .find(|g| g.phase == "request" && g.verdict == "replace")
        {
            last.arguments = self.audit.arguments(text, redactor);
        }
        record.guards = Some(guards);
    }

    /// Takes the trace id of the call's span (the gateway's own trace when
    /// export is on).
    pub(crate) fn trace(&mut self, span: &tracing::Span, fields: &[(String, String)]) {
        if let Some(record) = &mut self.record {
            record.trace_id = crate::telemetry::trace::trace_id(span, fields);
        }
    }

    /// Writes the record of `result` and waits for it. Returns the error to
    /// answer instead when the trail is required and the record could not
    /// be written: `AUDIT_UNAVAILABLE`, in doubt (UNKNOWN) when the request
    /// was sent to a tool that is not idempotent. A call that was not sent
    /// keeps its own status: it served nothing.
    pub(crate) async fn finish<R: Recorded>(
        mut self,
        result: &Result<R, CallError>,
        progress: Progress<'_>,
    ) -> Option<CallError> {
        let mut record = self.record.take()?;
        record.time = crate::audit::now();
        record.server = progress.server.map(str::to_owned);
        record.definition_hash = progress.definition_hash.map(str::to_owned);
        record.duration_ms = Some(crate::audit::millis(self.started.elapsed()));
        // A result from the cache was not sent: it acted on nothing.
        let hit = record.cache.as_deref() == Some("hit");
        let sent = (result.is_ok() && !hit) || progress.sent;
        record.sent = Some(sent);
        match result {
            Ok(response) => {
                record.outcome = if response.is_error() {
                    Outcome::ToolError
                } else {
                    Outcome::Ok
                };
                // Reads and prompts, and a tool call a guard checked: the
                // size of what was handed out (a replacement's).
                record.bytes = response.recorded_bytes(record.guards.is_some());
                record.code = Some(code_name(tonic::Code::Ok).to_owned());
            }
            Err(error) => {
                let (code, reason) = classify(error);
                record.outcome = error_outcome(code, sent);
                record.code = Some(code_name(code).to_owned());
                record.reason = Some(reason.to_owned());
                if let CallError::DefinitionNotApproved {
                    definition_hash, ..
                } = error
                {
                    record.definition_hash = Some(definition_hash.clone());
                }
            }
        }
        let written = match self.slot.take() {
            Some(slot) => self.audit.write_reserved(slot, record).await,
            None if self.no_room => {
                // The queue had no room a moment ago: waiting for it would
                // only delay a refusal.
                self.audit.enqueue(record);
                return None;
            }
            None => self.audit.write(record).await,
        };
        (written.is_err() && self.audit.is_required() && sent).then(|| {
            tracing::error!(
                outcome = ?result.as_ref().map(Recorded::is_error).map_err(|e| classify(e).1),
                "the call's audit record cannot be written and audit.required is set: the result is withheld"
            );
            CallError::AuditUnavailable {
                sent,
                idempotent: progress.idempotent,
            }
        })
    }
}

impl Drop for AuditedCall {
    /// A call dropped before [`AuditedCall::finish`]: the caller went away
    /// (or the RPC was cancelled). Queued without waiting: there is no
    /// response left to hold back. Through the reserved place when the
    /// call had one (it may have been sent): that record cannot be lost.
    fn drop(&mut self) {
        if let Some(mut record) = self.record.take() {
            record.time = crate::audit::now();
            record.outcome = Outcome::Cancelled;
            record.code = Some(code_name(tonic::Code::Cancelled).to_owned());
            record.duration_ms = Some(crate::audit::millis(self.started.elapsed()));
            match self.slot.take() {
                Some(slot) => self.audit.enqueue_reserved(slot, record),
                None => self.audit.enqueue(record),
            }
        }
    }
}

/// What a call's record keeps of a successful reply.
pub trait Recorded {
    /// A tool that ran and reported failure (`outcome: tool_error`).
    fn is_error(&self) -> bool {
        false
    }

    /// The size handed out (`bytes`): reads and prompts always, a tool
    /// call's when a guard checked it (`guarded`).
    fn recorded_bytes(&self, guarded: bool) -> Option<u64> {
        let _ = guarded;
        None
    }
}
impl Recorded for () {}
