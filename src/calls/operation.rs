//! What a kind of operation supplies to the pipeline ([`Operation`]),
//! what the pipeline hands back ([`Outcome`], through a surface's
//! [`Reply`]), and what the send step hands an operation ([`Sending`],
//! [`Upstream`]). The steps themselves are in [`super::pipeline`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CreateTaskResult, InputRequiredResult, JsonObject};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::{CallError, Feature};
use super::record::{AuditedCall, Recorded};
use super::rounds::{self, Binding, InputFields, Method, Questions};
use super::routed::{Reached, Routed};
use super::{Calls, Origin, idempotency};
use crate::pb::guard::TargetKind;
use crate::registry::Tenant;
use crate::upstream::{InputKinds, Session, UpstreamError};

/// What a call answers besides an error: its result, a round of
/// questions for the caller, or the task it became.
#[derive(Debug)]
pub enum Outcome<T> {
    /// The server's result (through the guards' response phase).
    Done(T),
    /// Questions the caller answers on a retry, with toolgate's sealed
    /// state of the round.
    Questions(Questions),
    /// The call became a task the caller follows (tool calls with
    /// `accepts_task`).
    Task(Box<super::Task>),
}

/// An outcome a surface could not carry in its messages: the server's
/// result is malformed for it (an invalid base64 blob, ...).
#[derive(Debug)]
pub struct Unencodable(pub String);

/// A surface's reply to an outcome of `T`: what the pipeline hands out,
/// and what the call's record and metrics say of it.
pub trait Reply<T>: Recorded + Sized + Send {
    /// The reply to `outcome` of `server` (links and embedded resources
    /// of a result name it).
    ///
    /// # Errors
    /// The outcome cannot be carried (a protocol error of the server's).
    fn encode(outcome: Outcome<T>, server: &str) -> Result<Self, Unencodable>;

    /// Its size on the wire (bounded by `limits.max_message_bytes`).
    fn encoded_len(&self) -> usize;

    /// Whether it hands the caller questions (`outcome: input_required`).
    fn asks(&self) -> bool {
        false
    }

    /// Marks it as the recorded response of an earlier call with the
    /// same idempotency key (nothing was sent for this one).
    fn replayed(&mut self) {}
}

/// What the upstream session answered to an operation's request.
pub(crate) enum Upstream<T> {
    /// The result.
    Complete(T),
    /// A 2026-07-28 round of questions for the caller.
    InputRequired(InputRequiredResult),
    /// A task the call became (tool calls that accept one).
    Task(CreateTaskResult),
}

impl From<crate::upstream::CallOutcome> for Upstream<rmcp::model::CallToolResult> {
    fn from(outcome: crate::upstream::CallOutcome) -> Self {
        use crate::upstream::CallOutcome;
        match outcome {
            CallOutcome::Complete(result) => Self::Complete(result),
            CallOutcome::InputRequired(asked) => Self::InputRequired(asked),
            CallOutcome::Task(created) => Self::Task(created),
        }
    }
}

impl From<crate::upstream::PromptOutcome> for Upstream<rmcp::model::GetPromptResult> {
    fn from(outcome: crate::upstream::PromptOutcome) -> Self {
        use crate::upstream::PromptOutcome;
        match outcome {
            PromptOutcome::Complete(result) => Self::Complete(result),
            PromptOutcome::InputRequired(asked) => Self::InputRequired(asked),
        }
    }
}

impl From<crate::upstream::resources::ReadOutcome> for Upstream<rmcp::model::ReadResourceResult> {
    fn from(outcome: crate::upstream::resources::ReadOutcome) -> Self {
        use crate::upstream::resources::ReadOutcome;
        match outcome {
            ReadOutcome::Complete(result) => Self::Complete(result),
            ReadOutcome::InputRequired(asked) => Self::InputRequired(asked),
        }
    }
}

/// What the send step hands an operation.
pub(crate) struct Sending<'a, E> {
    /// Where the call goes.
    pub(crate) routed: &'a Routed<E>,
    /// The session it goes on.
    pub(crate) session: &'a Arc<Session>,
    /// The arguments, as the guards let them through.
    pub(crate) arguments: JsonObject,
    /// The upstream request's timeout.
    pub(crate) timeout: Duration,
    /// The kinds of question the caller answers (within the server's).
    pub(crate) accepts: InputKinds,
    /// A retry's `inputResponses` and the server's `requestState`.
    pub(crate) answered: Option<(rmcp::model::InputResponses, Option<String>)>,
    /// The round the server may ask next.
    pub(crate) round: u32,
    /// The call's binding of sealed state (kinds with rounds).
    pub(crate) binding: Option<&'a Binding>,
    /// The call's record (its rounds are recorded on it).
    pub(crate) audited: &'a AuditedCall,
    /// The calls' shared parts.
    pub(crate) calls: &'a Calls,
    /// Who asks.
    pub(crate) origin: &'a Origin,
}

impl<E> Sending<'_, E> {
    /// A retry's `inputResponses` and the server's `requestState`, taken
    /// for the upstream request.
    pub(crate) fn take_answers(&mut self) -> (Option<rmcp::model::InputResponses>, Option<String>) {
        match self.answered.take() {
            Some((responses, state)) => (Some(responses), state),
            None => (None, None),
        }
    }
}

/// An upstream failure of the call `routed` as its error (step 20): a
/// subject that must consent gets the URL, a state store that is down is
/// retryable, anything else is the server's failure.
pub(crate) fn failure_of<E>(
    routed: &Routed<E>,
    origin: &Origin,
    error: UpstreamError,
) -> CallError {
    super::session::failure(
        &routed.tenant,
        routed.index,
        &routed.server,
        &routed.target,
        &origin.subject,
        error,
        routed.idempotent,
    )
}

/// One kind of operation: what it supplies to the pipeline.
pub(crate) trait Operation: Send + Sync + Sized {
    /// What a completed request answers (before conversion by a surface).
    type Output: Send + Serialize + DeserializeOwned;
    /// What a resolved target keeps besides [`Routed`].
    type Extra: Send + Sync;

    /// The capability the server must declare.
    const FEATURE: Option<Feature>;
    /// What guards are told the target is (`None`: no guard phases).
    const GUARDED: Option<TargetKind>;
    /// How sealed state binds its rounds (`None`: no rounds).
    const ROUNDS: Option<Method>;
    /// Whether a retry is safe before the target is known.
    const IDEMPOTENT: bool;
    /// Whether its metrics are the per-tool call series
    /// (`toolgate_calls_total`) rather than `toolgate_requests_total`.
    const TOOL_SERIES: bool = false;
    /// The method under which the result cache keeps its results
    /// (`None`: never kept; [`super::cache`]).
    const CACHED_AS: Option<&'static str> = None;

    /// The server's hint that `output` may be answered again (`ttlMs`,
    /// `cacheScope`; `None`: it may not).
    fn cache_hint(output: &Self::Output) -> Option<super::cache::Hint> {
        let _ = output;
        None
    }

    /// The call's span.
    fn span(&self, tenant: &str) -> tracing::Span;

    /// What the audit record says the call is about (`tool`, `prompt`,
    /// `uri`, `uri_template`).
    fn describe(&self, record: &mut crate::audit::Record, tenant: &Tenant);

    /// The arguments whose digest the record keeps (`None`: none).
    fn audited_arguments(&self) -> Option<std::borrow::Cow<'_, str>>;

    /// Step 1: the request's own shape.
    fn check(&self) -> Result<(), CallError>;

    /// Step 6: the idempotency key the call carries (tool calls).
    fn idempotency_key(&self) -> Option<&str> {
        None
    }

    /// The call's key as it binds before the call is resolved: what the
    /// key's record answers while the target cannot be routed (step 3).
    fn unrouted_key(&self) -> Option<idempotency::KeyedCall<'_>> {
        None
    }

    /// Step 3: the target, with the policy and the caller's pins. The
    /// server and definition hash go into `reached` as soon as they are
    /// known, so that a refusal after that is recorded under them.
    fn resolve(
        &self,
        origin: &Origin,
        reached: &mut Reached,
    ) -> impl Future<Output = Result<Routed<Self::Extra>, CallError>> + Send;

    /// Step 4: the arguments, within `limit` bytes.
    fn arguments(
        &self,
        routed: &Routed<Self::Extra>,
        limit: usize,
    ) -> Result<JsonObject, CallError>;

    /// The digest of the arguments as the caller sent them (before any
    /// guard), which sealed state binds (kinds with rounds).
    fn arguments_digest(&self, routed: &Routed<Self::Extra>) -> Result<String, CallError> {
        let limit = routed.tenant.limits().max_argument_bytes;
        Ok(rounds::arguments_digest(&self.arguments(routed, limit)?))
    }

    /// Step 5: the policy's verdict with the arguments read (the rules
    /// that read `args` or require approval); kinds whose rules never read
    /// them allow.
    fn verdict(
        &self,
        routed: &Routed<Self::Extra>,
        origin: &Origin,
        arguments: &JsonObject,
    ) -> crate::policy::Verdict {
        let _ = (routed, origin, arguments);
        crate::policy::Verdict::Allow
    }

    /// What the call brings to the approval step (tool calls).
    fn approving(&self) -> super::Approving<'_> {
        super::Approving::default()
    }

    /// Step 7, a held call that becomes a task (`accepts_task`): its
    /// task, waiting for approval `notice`. Only tool calls park.
    fn park(
        &self,
        routed: &Routed<Self::Extra>,
        origin: &Origin,
        notice: &super::ApprovalNotice,
        calls: &Calls,
    ) -> impl Future<Output = Result<super::Task, CallError>> + Send {
        let _ = (origin, calls);
        std::future::ready(Err(CallError::ApprovalPending {
            tool: routed.target.name.clone(),
            approval_id: notice.approval_id.clone(),
            rule: notice.rule.clone(),
            expires_at_ms: notice.expires_at_ms,
        }))
    }

    /// What the caller sent of rounds of questions (kinds with rounds).
    fn input(&self) -> Option<&InputFields> {
        None
    }

    /// The error of a retry whose state was handed out for another
    /// definition of the target.
    fn definition_changed(&self, routed: &Routed<Self::Extra>, origin: &Origin) -> CallError {
        let _ = (routed, origin);
        CallError::InputResponseInvalid {
            reason: "the request_state does not fit this request".to_owned(),
        }
    }

    /// Step 11: the session (the tenant's, or the subject's own).
    fn session(
        &self,
        routed: &Routed<Self::Extra>,
        origin: &Origin,
    ) -> impl Future<Output = Result<Arc<Session>, CallError>> + Send {
        super::session::session(
            &routed.tenant,
            routed.index,
            &origin.subject,
            &routed.target,
            routed.idempotent,
        )
    }

    /// Step 13: the kind's last check before sending.
    fn ready(
        &self,
        routed: &Routed<Self::Extra>,
        session: &Session,
        calls: &Calls,
    ) -> impl Future<Output = Result<(), CallError>> + Send {
        let _ = (routed, session, calls);
        std::future::ready(Ok(()))
    }

    /// The upstream timeout when the caller set no deadline.
    fn default_timeout(&self, routed: &Routed<Self::Extra>) -> Duration {
        routed.config().call_timeout
    }

    /// Step 19: the upstream request. The outer error ends the call
    /// without an upstream answer (an answer that could not be recorded).
    fn send(
        &self,
        sending: Sending<'_, Self::Extra>,
    ) -> impl Future<Output = Result<Result<Upstream<Self::Output>, UpstreamError>, CallError>> + Send;

    /// Step 20: an upstream failure as the call's error.
    fn failure(
        &self,
        routed: &Routed<Self::Extra>,
        origin: &Origin,
        error: UpstreamError,
    ) -> CallError {
        failure_of(routed, origin, error)
    }

    /// Step 21: the task a call became (tool calls that accept one).
    fn task(
        &self,
        routed: &Routed<Self::Extra>,
        session: &Arc<Session>,
        created: CreateTaskResult,
        calls: &Calls,
        origin: &Origin,
    ) -> impl Future<Output = Result<super::Task, CallError>> + Send {
        let _ = (session, created, calls, origin);
        std::future::ready(Err(routed.upstream(UpstreamError::Protocol(
            "a task where none was asked for".to_owned(),
        ))))
    }
}
