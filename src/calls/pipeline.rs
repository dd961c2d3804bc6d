//! The pipeline: the steps every call takes, in one order, for every kind
//! of operation ([`run`]). An [`Operation`] supplies only what differs
//! between kinds: how its request is checked and resolved (with the
//! policy and pins), its arguments, how it is sent and what it answers.
//!
//! The envelope ([`run`]): the audit record begun, the drain entered, the
//! span, the steps raced against the shutdown's abort, what the call had
//! reached carried into the record, the record written before the answer
//! leaves, the metrics and the log. The steps ([`Steps::run`]), in order:
//!
//! 1. **check**: the request's own shape (a name, a URI in normal form);
//! 2. **admission**: the subject's and the tenant's rate and concurrency;
//! 3. **resolve**: the target in the tenant's catalog or servers, the
//!    policy as listings apply it (a rule that reads `args` does not
//!    decide yet), the caller's pins;
//! 4. **arguments**: within `limits.max_argument_bytes`;
//! 5. **policy on arguments, approval**: the rules that read `args` or
//!    require approval, decided on this call; a call a `require_approval`
//!    rule holds spends an approval bound to exactly this call, or asks
//!    for one and stops (or, interactive, waits for the decision without
//!    its admission slot);
//! 6. **retry**: a retry's sealed `request_state` and answers, checked
//!    and its round claimed (before anything is sent);
//! 7. **server slot**: the server's concurrency limit;
//! 8. **session**: the tenant's session of the server, or the subject's
//!    own for a per-user server;
//! 9. **capability**: the server declared what the operation needs;
//! 10. **ready**: the kind's last check before sending (a listed size, a
//!     task store);
//! 11. **guards, request phase**: after the policy and the approval;
//!
//!     11a. **cache lookup** ([`super::cache`]): a fresh result the server
//!     marked reusable, for this tenant (and subject), target, definition
//!     and arguments as sent;
//! 12. **audit place** (`audit.required`); a cache hit then skips 13 to
//!     16 (nothing is sent) and goes to 17 with the kept result;
//! 13. **answers on record**: a retry's answers, before they leave;
//! 14. **deadline**: what is left of the caller's, within the server's
//!     timeouts;
//! 15. **send**: the upstream request;
//! 16. **answer**: the upstream failure as a call error (whether it had
//!     left after all), a round of questions the caller did not opt in to;
//!
//!     16a. **cache store**: a complete result the server marked reusable
//!     (before the guards' response phase), within the tenant's bounds;
//! 17. **outcome**: a result through the guards' response phase, a round
//!     of questions sealed and handed out, or a task kept;
//! 18. **reply**: the surface's reply, within `limits.max_message_bytes`.
//!
//! A call that spent an approval and then sent nothing (a server down, a
//! guard's refusal) gives the use back ([`run`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CreateTaskResult, InputRequiredResult, JsonObject};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::error::{CallError, Feature};
pub use super::record::Recorded;
use super::record::{AuditedCall, Progress};
use super::rounds::{self, Binding, InputFields, Method, Questions};
pub(crate) use super::routed::{Reached, Routed};
use super::{Calls, Origin, classify, guards};
use crate::pb::guard::TargetKind;
use crate::registry::Tenant;
use crate::telemetry::metrics::TenantCalls;
use crate::telemetry::trace;
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

/// An upstream failure of the call `routed` as its error (step 16): a
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

    /// Step 5, a held call that becomes a task (`accepts_task`): its
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

    /// Step 8: the session (the tenant's, or the subject's own).
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

    /// Step 10: the kind's last check before sending.
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

    /// Step 15: the upstream request. The outer error ends the call
    /// without an upstream answer (an answer that could not be recorded).
    fn send(
        &self,
        sending: Sending<'_, Self::Extra>,
    ) -> impl Future<Output = Result<Result<Upstream<Self::Output>, UpstreamError>, CallError>> + Send;

    /// Step 16: an upstream failure as the call's error.
    fn failure(
        &self,
        routed: &Routed<Self::Extra>,
        origin: &Origin,
        error: UpstreamError,
    ) -> CallError {
        failure_of(routed, origin, error)
    }

    /// Step 17: the task a call became (tool calls that accept one).
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

/// Runs `operation` for `origin`: the envelope around [`Steps::run`].
pub(crate) async fn run<O: Operation, R: Reply<O::Output>>(
    calls: &Calls,
    origin: Origin,
    operation: O,
) -> Result<R, CallError> {
    let tenant = origin.tenant.clone();
    let started = origin.started;
    let mut audited = AuditedCall::of(&calls.audit, &origin, || operation.audited_arguments());
    audited.describe(|record| operation.describe(record, &tenant));
    let meter = Meter::new::<O>(calls, &tenant.name, origin.rpc);
    let Some(_entered) = calls.drain.enter() else {
        let refused = Err(CallError::Draining);
        audited.finish(&refused, Progress::none()).await;
        meter.finished(
            &tracing::Span::none(),
            &refused,
            &mut Reached::default(),
            started,
        );
        return refused;
    };
    let span = operation.span(&tenant.name);
    trace::continue_trace(&span, &origin.trace);
    audited.trace(&span, &origin.trace);
    let _in_flight = meter.in_flight();
    let mut reached = Reached {
        idempotent: O::IDEMPOTENT,
        series: meter.series.clone(),
        ..Reached::default()
    };
    let steps = Steps {
        calls,
        origin: &origin,
    };
    let work = async {
        tokio::select! {
            result = steps.run::<O, R>(&operation, &mut reached, &mut audited) => result,
            () = calls.abort.cancelled() => Err(CallError::ShuttingDown { sent: false, idempotent: false }),
        }
    };
    let mut result = work.instrument(span.clone()).await;
    if let Err(CallError::ShuttingDown { sent, idempotent }) = &mut result {
        // The steps' future is gone: what it had got to is in `reached`.
        *sent = reached.sent;
        *idempotent = reached.idempotent;
    }
    // A call that spent an approval and sent nothing has not run: the use
    // goes back.
    if let Some(id) = &reached.call_approval
        && result.is_err()
        && !reached.sent
    {
        super::approval::return_use(&calls.approvals, &origin, id).await;
    }
    let approval = reached
        .call_approval
        .clone()
        .or_else(|| reached.asked_approval.clone())
        .or_else(|| match &result {
            Err(CallError::ApprovalPending { approval_id, .. }) => Some(approval_id.clone()),
            _ => None,
        });
    if approval.is_some() {
        audited.describe(|record| record.call_approval = approval);
    }
    if let Some(cache) = reached.cache {
        audited.describe(|record| record.cache = Some(cache.to_owned()));
    }
    // What the guards did is on the record, whatever became of the call.
    audited.guarded(
        &reached.guards,
        reached.replaced_arguments.as_deref(),
        || tenant.redactor(),
    );
    // The record is written before the response leaves.
    let progress = Progress {
        server: reached.server.as_deref(),
        definition_hash: reached.definition_hash.as_deref(),
        sent: reached.sent,
        idempotent: reached.idempotent,
    };
    if let Some(withheld) = audited.finish(&result, progress).await {
        result = Err(withheld);
    }
    meter.finished(&span, &result, &mut reached, started);
    result
}

/// The metrics of one call: the per-tool series of tool calls, the
/// request counter of the others.
struct Meter<'a> {
    calls: &'a Calls,
    tenant: &'a str,
    rpc: &'static str,
    series: Option<Arc<TenantCalls>>,
}

impl<'a> Meter<'a> {
    fn new<O: Operation>(calls: &'a Calls, tenant: &'a str, rpc: &'static str) -> Self {
        Self {
            calls,
            tenant,
            rpc,
            series: O::TOOL_SERIES.then(|| calls.metrics.calls(tenant)),
        }
    }

    /// Counts the call in flight (tool calls) until the guard drops.
    fn in_flight(&self) -> Option<crate::telemetry::metrics::InFlight> {
        self.series.as_ref().map(|series| series.in_flight())
    }

    /// Records how the call ended: in its span (outcome, status), its
    /// series, and the log.
    fn finished<R: Reply<T>, T>(
        &self,
        span: &tracing::Span,
        result: &Result<R, CallError>,
        reached: &mut Reached,
        started: Instant,
    ) {
        let elapsed = started.elapsed();
        let (outcome, code) = match result {
            Ok(r) if r.is_error() => ("tool_error", tonic::Code::Ok),
            Ok(r) if r.asks() => ("input_required", tonic::Code::Ok),
            Ok(_) => ("ok", tonic::Code::Ok),
            Err(e) => {
                let (code, reason) = classify(e);
                (reason, code)
            }
        };
        span.record("outcome", outcome);
        span.record("rpc.grpc.status_code", code as i32);
        if code != tonic::Code::Ok {
            span.record("otel.status_code", "ERROR");
        }
        match &self.series {
            Some(series) => {
                // Only names that resolved to a tool become label values:
                // callers cannot grow the metric set with made-up names.
                let tool = reached
                    .tool_series
                    .take()
                    .unwrap_or_else(|| series.tool(reached.server.as_deref().unwrap_or(""), ""));
                tool.finished(outcome, elapsed.as_secs_f64());
            }
            None => self.calls.metrics.request(
                self.tenant,
                reached.server.as_deref(),
                self.rpc,
                match result {
                    Ok(_) => "ok",
                    Err(error) => classify(error).1,
                },
            ),
        }
        let rpc = self.rpc;
        span.in_scope(|| match result {
            Err(error) => tracing::info!(
                elapsed_ms = elapsed.as_millis() as u64,
                %error,
                rpc,
                "call failed"
            ),
            Ok(_) => tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, rpc, "call done"),
        });
    }
}

/// The steps of one call.
struct Steps<'a> {
    calls: &'a Calls,
    origin: &'a Origin,
}

impl Steps<'_> {
    /// The steps in their order (the module's list).
    async fn run<O: Operation, R: Reply<O::Output>>(
        &self,
        operation: &O,
        reached: &mut Reached,
        audited: &mut AuditedCall,
    ) -> Result<R, CallError> {
        let (calls, origin) = (self.calls, self.origin);
        // 1. check
        operation.check()?;
        // 2. admission: a bounded wait for a slot, never an unbounded queue.
        let mut admission = Some(origin.admit().await?);
        // 3. resolve
        let routed = operation.resolve(origin, reached).await?;
        // The kind put the server and definition hash in `reached` as
        // soon as it knew them (a refusal after that is recorded under them).
        tracing::Span::current().record("server", routed.server.as_str());
        reached.idempotent = routed.idempotent;
        let tenant = &routed.tenant;
        let limits = tenant.limits();
        // 4. arguments
        let arguments = operation.arguments(&routed, limits.max_argument_bytes)?;
        // 5. policy on arguments, approval
        match operation.verdict(&routed, origin, &arguments) {
            crate::policy::Verdict::Allow => {}
            crate::policy::Verdict::Deny { rule, failed } => {
                return Err(CallError::CallNotPermitted {
                    target: routed.target.clone(),
                    rule,
                    failed,
                });
            }
            crate::policy::Verdict::RequireApproval(rule) => {
                let held = super::approval::Held {
                    tenant: tenant.as_ref(),
                    server: &routed.server,
                    tool: &routed.target.name,
                    definition_hash: &routed.definition_hash,
                    arguments: &arguments,
                };
                match super::approval::hold(
                    &calls.approvals,
                    &held,
                    origin,
                    &rule,
                    operation.approving(),
                    &mut admission,
                )
                .await?
                {
                    super::approval::Hold::Spent(spent) => reached.call_approval = Some(spent),
                    super::approval::Hold::Parked(notice) => {
                        // It becomes a task that starts once approved:
                        // nothing more happens now.
                        reached.asked_approval = Some(notice.approval_id.clone());
                        let task = operation.park(&routed, origin, &notice, calls).await?;
                        return R::encode(Outcome::Task(Box::new(task)), &routed.server)
                            .map_err(|e| routed.upstream(UpstreamError::Protocol(e.0)));
                    }
                }
            }
        }
        // 6. retry
        // The digest of the arguments (as the caller sent them) binds
        // sealed state: made only for a retry, or once questions are
        // handed out (step 16), never for a call that has neither.
        let input = operation.input();
        let retrying = input.is_some_and(|i| !i.request_state.is_empty());
        let mut binding = O::ROUNDS.map(|method| Binding {
            method,
            tenant: tenant.name.clone(),
            subject: origin.subject.key().to_owned(),
            server: routed.server.clone(),
            upstream_tool: routed.upstream_name.clone(),
            exposed_name: routed.target.name.clone(),
            definition_hash: routed.definition_hash.clone(),
            args_sha256: if retrying {
                rounds::arguments_digest(&arguments)
            } else {
                String::new()
            },
        });
        let retry = match (&binding, input) {
            (Some(binding), Some(input)) => {
                rounds::open_retry(
                    (&calls.request_keys, &calls.answered_rounds),
                    tenant,
                    routed.config(),
                    (&input.request_state, &input.input_responses),
                    binding,
                    || operation.definition_changed(&routed, origin),
                )
                .await?
            }
            _ => None,
        };
        // 7. server slot
        let _server_slot = server_slot(&routed).await?;
        // 8. session
        let session = operation.session(&routed, origin).await?;
        // 9. capability
        if let Some(feature) = O::FEATURE
            && !supports(&session, feature)
        {
            return Err(CallError::Unsupported {
                server: routed.server.clone(),
                feature,
            });
        }
        // 10. ready
        operation.ready(&routed, &session, calls).await?;
        // 11. guards, request phase: after every check of toolgate's own,
        // before anything is sent; the chain is kept for the response phase.
        let guard = O::GUARDED.and_then(|kind| {
            guards::Guarding::new(kind, &routed, &session, origin, &calls.metrics)
        });
        let arguments = match &guard {
            Some(guard) => guard.request(arguments, reached).await?,
            None => arguments,
        };
        // 11a. cache lookup
        let probe = O::CACHED_AS.and_then(|method| {
            calls
                .cache
                .probe(method, &routed, origin, &arguments, retrying)
        });
        let cached = probe.as_ref().and_then(|probe| probe.hit::<O::Output>());
        // 12. audit place (`audit.required`), before anything is sent (the
        // record of a call whose caller goes away included).
        audited.admit(routed.idempotent).await?;
        if let Some(result) = cached {
            // A hit: nothing is sent (13 to 16); 17 and 18 as for an answer.
            reached.cache = Some("hit");
            let result = match &guard {
                Some(guard) => guard.response(result, reached).await?,
                None => result,
            };
            return reply(Outcome::Done(result), &routed, limits);
        }
        // 13. a retry's answers on record before they leave.
        let (round, answered) = match &binding {
            Some(binding) => {
                rounds::answered(retry, audited, &calls.metrics, binding, tenant).await?
            }
            None => (1, None),
        };
        // 14. deadline
        let config = routed.config();
        let remaining = origin
            .deadline
            .map(|d| d.saturating_sub(origin.started.elapsed()));
        let deadline_exceeded = |sent| CallError::DeadlineExceeded {
            server: routed.server.clone(),
            tool: routed.target.clone(),
            after: origin.started.elapsed(),
            sent,
        };
        if remaining.is_some_and(|r| r.is_zero()) {
            // Sending now would let the server act while the caller is
            // told DEADLINE_EXCEEDED: nothing is sent.
            return Err(deadline_exceeded(false));
        }
        let timeout = remaining
            .unwrap_or_else(|| operation.default_timeout(&routed))
            .min(config.max_call_timeout);
        // What the caller answers, within what the server's tools may ask.
        let allowed = InputKinds {
            form: config.input.form,
            url: config.input.url,
            sampling: config.input.sampling,
        };
        let accepts = input.map_or(InputKinds::default(), |i| i.accepts.and(allowed));
        // 15. send
        reached.sent = true;
        let sending = Sending {
            routed: &routed,
            session: &session,
            arguments,
            timeout,
            accepts,
            answered,
            round,
            binding: binding.as_ref(),
            audited,
            calls,
            origin,
        };
        let upstream_started = Instant::now();
        let result = operation.send(sending).await?;
        if let Some(tool) = &reached.tool_series {
            tool.upstream_finished(upstream_started.elapsed().as_secs_f64());
        }
        // 16. answer
        let result = match &binding {
            Some(binding) => rounds::not_accepted(result, &calls.metrics, binding)?,
            None => result,
        };
        let upstream = match result {
            Ok(upstream) => upstream,
            Err(UpstreamError::Timeout(_))
                if remaining.is_some_and(|r| r <= config.max_call_timeout) =>
            {
                return Err(deadline_exceeded(true));
            }
            Err(error) => {
                if matches!(error, UpstreamError::Closed) || error.is_credential_failure() {
                    // The session was gone, or no token could be had,
                    // before the request left: nothing was sent.
                    reached.sent = false;
                }
                return Err(operation.failure(&routed, origin, error));
            }
        };
        // 16a. cache store
        if let (Some(probe), Upstream::Complete(result)) = (&probe, &upstream)
            && probe.keep(O::cache_hint(result), result)
        {
            reached.cache = Some("stored");
        }
        // 17. outcome
        let outcome = match upstream {
            Upstream::Complete(result) => Outcome::Done(match &guard {
                Some(guard) => guard.response(result, reached).await?,
                None => result,
            }),
            Upstream::InputRequired(asked) => {
                let binding = binding.as_mut().ok_or_else(|| {
                    routed.upstream(UpstreamError::Protocol(
                        "questions where none can be asked".to_owned(),
                    ))
                })?;
                if binding.args_sha256.is_empty() {
                    binding.args_sha256 = operation.arguments_digest(&routed)?;
                }
                let binding = &*binding;
                let round = rounds::Handing {
                    keys: &calls.request_keys,
                    metrics: &calls.metrics,
                    binding,
                    server: config,
                    accepts,
                    number: round,
                };
                Outcome::Questions(round.hand_out(asked, audited, |reason| {
                    routed.upstream(UpstreamError::Protocol(reason))
                })?)
            }
            Upstream::Task(created) => Outcome::Task(Box::new(
                operation
                    .task(&routed, &session, created, calls, origin)
                    .await?,
            )),
        };
        // 18. reply
        reply(outcome, &routed, limits)
    }
}

/// Step 18: the surface's reply to `outcome` of the call `routed`, within
/// `limits.max_message_bytes`.
fn reply<R: Reply<T>, T, E>(
    outcome: Outcome<T>,
    routed: &Routed<E>,
    limits: &crate::config::Limits,
) -> Result<R, CallError> {
    let reply = R::encode(outcome, &routed.server)
        .map_err(|e| routed.upstream(UpstreamError::Protocol(e.0)))?;
    let size = reply.encoded_len();
    if size > limits.max_message_bytes {
        return Err(CallError::ResponseTooLarge {
            server: routed.server.clone(),
            tool: routed.target.clone(),
            size,
            limit: limits.max_message_bytes,
        });
    }
    Ok(reply)
}

/// Whether `session`'s server declared `feature`.
fn supports(session: &Session, feature: Feature) -> bool {
    let capabilities = session.server_capabilities();
    match feature {
        Feature::Prompts => capabilities.prompts.is_some(),
        Feature::Resources => capabilities.resources.is_some(),
        Feature::Completions => capabilities.completions.is_some(),
        Feature::Subscriptions => capabilities
            .resources
            .as_ref()
            .is_some_and(|r| r.subscribe == Some(true)),
    }
}

/// A slot of the server's concurrency limit, when it has one (a bounded
/// wait, as for the tenant's).
async fn server_slot<E>(
    routed: &Routed<E>,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, CallError> {
    let Some(limit) = routed.tenant.server_limit(routed.index) else {
        return Ok(None);
    };
    limit
        .acquire(routed.tenant.limiter.queue_timeout())
        .await
        .map(Some)
        .ok_or_else(|| {
            CallError::Shed(
                crate::registry::limits::Shed::ServerConcurrency(limit.limit()),
                Some(routed.server.clone()),
            )
        })
}
