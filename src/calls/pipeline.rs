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
//! 1. **check**: the request's own shape (a name, a URI in normal form,
//!    an idempotency key);
//! 2. **admission**: the subject's and the tenant's rate and concurrency;
//! 3. **resolve**: the target in the tenant's catalog or servers, the
//!    policy as listings apply it (a rule that reads `args` does not
//!    decide yet), the caller's pins; a keyed call whose target cannot be
//!    routed now is still answered from its key's record;
//! 4. **arguments**: within `limits.max_argument_bytes`;
//! 5. **policy on arguments**: the rules that read `args`, decided on
//!    this call;
//! 6. **idempotency key** ([`super::idempotency`]): the key claimed in
//!    the state store before anything is sent, or the call answered from
//!    its record (replayed, waited for, in doubt, reused), never sent
//!    again; before the approval, so that a retry of an approved call
//!    replays without asking again;
//! 7. **approval**: a call a `require_approval` rule holds spends an
//!    approval bound to exactly this call, or asks for one and stops (or,
//!    interactive, waits for the decision without its admission slot);
//! 8. **retry**: a retry's sealed `request_state` and answers, checked
//!    and its round claimed (before anything is sent);
//! 9. **circuit breaker** ([`super::breaker`]): a server whose breaker is
//!    open fails fast (nothing sent), without waiting for a slot; the
//!    session's and the answer's outcome (steps 11 and 20) are recorded
//!    on it;
//! 10. **server slot**: the server's concurrency limit;
//! 11. **session**: the tenant's session of the server, or the subject's
//!     own for a per-user server;
//! 12. **capability**: the server declared what the operation needs;
//! 13. **ready**: the kind's last check before sending (a listed size, a
//!     task store);
//! 14. **guards, request phase**: after the policy and the approval;
//! 15. **cache lookup** ([`super::cache`]): a fresh result the server
//!     marked reusable, for this tenant (and subject), target, definition
//!     and arguments as sent;
//! 16. **audit place** (`audit.required`); a cache hit then skips 17 to
//!     20 (nothing is sent) and goes to 21 with the kept result;
//! 17. **answers on record**: a retry's answers, before they leave;
//! 18. **deadline**: what is left of the caller's, within the server's
//!     timeouts (a keyed call runs on past its caller's deadline);
//! 19. **send**: the upstream request;
//! 20. **answer**: the upstream failure as a call error (whether it had
//!     left after all), a round of questions the caller did not opt in
//!     to; a complete result the server marked reusable is kept in the
//!     cache (before the guards' response phase), within the tenant's
//!     bounds;
//! 21. **outcome**: a result through the guards' response phase, a round
//!     of questions sealed and handed out, or a task kept;
//! 22. **reply**: the surface's reply, within `limits.max_message_bytes`
//!     (what an idempotency key keeps of it made first).
//!
//! A call that spent an approval and then sent nothing (a server down, a
//! guard's refusal) gives the use back, and one that claimed an
//! idempotency key and sent nothing lets it go; a keyed call's end is
//! recorded on its key once the audit record is written ([`run`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::Instrument;

use super::error::{CallError, Feature};
pub(crate) use super::operation::{Operation, Sending, Upstream, failure_of};
pub use super::operation::{Outcome, Reply, Unencodable};
pub use super::record::Recorded;
use super::record::{AuditedCall, Progress};
use super::rounds::{self, Binding};
pub(crate) use super::routed::{Reached, Routed};
use super::{Calls, Origin, classify, guards, idempotency};
use crate::telemetry::metrics::TenantCalls;
use crate::telemetry::trace;
use crate::upstream::{InputKinds, Session, UpstreamError};

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
    if let Err(CallError::Keyed(refusal)) = &result {
        audited.describe(|record| record.idempotency = Some(refusal.outcome().to_owned()));
    }
    if let Some(withheld) = audited.finish(&result, progress).await {
        result = Err(withheld);
    }
    // What a retry with the call's idempotency key gets, once the record
    // is written (a response the trail withheld is never replayed).
    if let Some(claim) = reached.key.take() {
        let ended = match (&result, reached.kept.take()) {
            (Ok(_), Some(kept)) => idempotency::Ended::Answered(kept),
            (Ok(_), None) => idempotency::Ended::Asked,
            (Err(error), _) => idempotency::Ended::Failed(error),
        };
        idempotency::finish(claim, reached.sent, ended).await;
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
        let routed = match operation.resolve(origin, reached).await {
            Ok(routed) => routed,
            Err(error) => return self.unresolved(operation, error, reached, audited).await,
        };
        // The kind put the server and definition hash in `reached` as
        // soon as it knew them (a refusal after that is recorded under them).
        tracing::Span::current().record("server", routed.server.as_str());
        reached.idempotent = routed.idempotent;
        let tenant = &routed.tenant;
        let limits = tenant.limits();
        // 4. arguments
        let arguments = operation.arguments(&routed, limits.max_argument_bytes)?;
        // 5. policy on arguments
        let verdict = operation.verdict(&routed, origin, &arguments);
        if let crate::policy::Verdict::Deny { rule, failed } = &verdict {
            return Err(CallError::CallNotPermitted {
                target: routed.target.clone(),
                rule: rule.clone(),
                failed: *failed,
            });
        }
        // 6. idempotency key: before the approval, so that a retry of an
        // approved call replays without asking again.
        if let Some(key) = operation.idempotency_key() {
            let waits = match &verdict {
                crate::policy::Verdict::RequireApproval(rule) => rule.wait,
                _ => Duration::ZERO,
            };
            let keyed = idempotency::KeyedCall {
                key,
                tool: &routed.target.name,
                request_state: operation.input().map_or("", |i| i.request_state.as_str()),
                arguments_sha256: rounds::arguments_digest(&arguments),
                longest: routed.config().max_call_timeout + waits,
            };
            let store = calls.idempotency.as_ref();
            match idempotency::claim(store, origin, &keyed, &calls.metrics, &mut admission).await? {
                idempotency::Keyed::Run(claim) => {
                    audited.describe(|r| r.keyed("claimed", &claim.call_id));
                    reached.key = Some(claim);
                }
                idempotency::Keyed::Replay { result, call_id } => {
                    audited.describe(|r| r.keyed("replayed", &call_id));
                    let mut reply = R::encode(Outcome::Done(result), &routed.server)
                        .map_err(|e| routed.upstream(UpstreamError::Protocol(e.0)))?;
                    reply.replayed();
                    return Ok(reply);
                }
            }
        }
        // 7. approval
        if let crate::policy::Verdict::RequireApproval(rule) = verdict {
            let held = super::approval::Held {
                tenant: tenant.as_ref(),
                server: &routed.server,
                tool: &routed.target.name,
                definition_hash: &routed.definition_hash,
                arguments: &arguments,
            };
            let approving = operation.approving();
            match super::approval::hold(
                &calls.approvals,
                &held,
                origin,
                &rule,
                approving,
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
        // 8. retry
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
        // 9. circuit breaker: a server that keeps failing is failed fast,
        // nothing sent, without waiting for a slot; what steps 11 and 20
        // come to is recorded on it.
        let mut breaker = calls.breakers.pass(&routed, origin)?;
        // 10. server slot
        let _server_slot = server_slot(&routed).await?;
        // 11. session
        let session = operation
            .session(&routed, origin)
            .await
            .inspect_err(|error| breaker.session_failed(error))?;
        // 12. capability
        if let Some(feature) = O::FEATURE
            && !supports(&session, feature)
        {
            return Err(CallError::Unsupported {
                server: routed.server.clone(),
                feature,
            });
        }
        // 13. ready
        operation.ready(&routed, &session, calls).await?;
        // 14. guards, request phase: after every check of toolgate's own,
        // before anything is sent; the chain is kept for the response phase.
        let guard = O::GUARDED.and_then(|kind| {
            guards::Guarding::new(kind, &routed, &session, origin, &calls.metrics)
        });
        let arguments = match &guard {
            Some(guard) => guard.request(arguments, reached).await?,
            None => arguments,
        };
        // 15. cache lookup
        let probe = O::CACHED_AS.and_then(|method| {
            calls
                .cache
                .probe(method, &routed, origin, &arguments, retrying)
        });
        let cached = probe.as_ref().and_then(|probe| probe.hit::<O::Output>());
        // 16. audit place (`audit.required`), before anything is sent (the
        // record of a call whose caller goes away included).
        audited.admit(routed.idempotent).await?;
        if let Some(result) = cached {
            // A hit: nothing is sent (13 to 16); 17 and 18 as for an answer.
            reached.cache = Some("hit");
            let result = match &guard {
                Some(guard) => guard.response(result, reached).await?,
                None => result,
            };
            return reply(Outcome::Done(result), &routed, limits, reached);
        }
        // 17. a retry's answers on record before they leave.
        let (round, answered) = match &binding {
            Some(binding) => {
                rounds::answered(retry, audited, &calls.metrics, binding, tenant).await?
            }
            None => (1, None),
        };
        // 18. deadline
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
        // A call with an idempotency key runs on past its caller's
        // deadline, within the server's: its outcome is what a retry gets.
        let remaining = remaining.filter(|_| reached.key.is_none());
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
        // 19. send
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
        // A timeout counts against the server only when it had its own.
        breaker.answered(&result, timeout >= operation.default_timeout(&routed));
        if let Some(tool) = &reached.tool_series {
            tool.upstream_finished(upstream_started.elapsed().as_secs_f64());
        }
        // 20. answer
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
        // 20a. cache store
        if let (Some(probe), Upstream::Complete(result)) = (&probe, &upstream)
            && probe.keep(O::cache_hint(result), result)
        {
            reached.cache = Some("stored");
        }
        // 21. outcome
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
        // 22. reply
        reply(outcome, &routed, limits, reached)
    }
}

/// Step 18: the surface's reply to `outcome` of the call `routed`, within
/// `limits.max_message_bytes`; what the call's idempotency key keeps of
/// the outcome is made first (into `reached`).
fn reply<R: Reply<T>, T: Serialize, E>(
    outcome: Outcome<T>,
    routed: &Routed<E>,
    limits: &crate::config::Limits,
    reached: &mut Reached,
) -> Result<R, CallError> {
    if reached.key.is_some() {
        reached.kept = match &outcome {
            Outcome::Done(result) => Some(idempotency::record_result(result)),
            Outcome::Task(task) => Some(idempotency::record_task(&task.task_id)),
            Outcome::Questions(_) => None,
        };
    }
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

impl Steps<'_> {
    /// A call whose target cannot be routed now (its server is down):
    /// with an idempotency key, the key's record answers if it can (a
    /// done call replays, one in doubt says so); else `error` stands.
    async fn unresolved<O: Operation, R: Reply<O::Output>>(
        &self,
        operation: &O,
        error: CallError,
        reached: &Reached,
        audited: &mut AuditedCall,
    ) -> Result<R, CallError> {
        let Some(call) = operation.unrouted_key() else {
            return Err(error);
        };
        if classify(&error).0 != tonic::Code::Unavailable {
            return Err(error);
        }
        let store = self.calls.idempotency.as_ref();
        let metrics = &self.calls.metrics;
        match idempotency::recorded(store, self.origin, &call, metrics).await {
            None => Err(error),
            Some(Err(refused)) => Err(refused),
            Some(Ok(idempotency::Keyed::Replay { result, call_id })) => {
                audited.describe(|r| r.keyed("replayed", &call_id));
                let server = reached.server.as_deref().unwrap_or_default();
                let mut reply = R::encode(Outcome::Done(result), server).map_err(|_| error)?;
                reply.replayed();
                Ok(reply)
            }
            Some(Ok(idempotency::Keyed::Run(_))) => Err(error),
        }
    }
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
        Feature::Skills => {
            crate::upstream::skills::offers_skills(&capabilities, session.is_stateless())
        }
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
