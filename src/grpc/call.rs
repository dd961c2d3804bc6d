//! One tool call, shared by `InvokeTool` and `InvokeToolStream`: drain
//! admission, span and metrics, tool lookup (with plan pins, in
//! [`super::call_route`]), limits, arguments, the guards, the upstream
//! call with its deadline, and conversion.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Request, Status};
use tracing::Instrument;

use super::call_audit::{AuditedCall, Progress};
use super::call_route::{
    self, check_name, check_pins, first_delegated_listing, not_routable, permitted, resolve,
    token_failure,
};
use super::listing::Viewer;
use super::{
    Gateway, LIST_SETTLE_WAIT, caller_timeout, convert, deadline_margin, input_relay, input_round,
    input_state, parse_arguments, questions, status,
};
use crate::catalog::CatalogTool;
use crate::config::ServerConfig;
use crate::grpc::error::{CallError, quoted};
use crate::pb;
use crate::registry::{Resolved, SessionUnavailable, Tenant};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::{TenantCalls, ToolCalls};
use crate::telemetry::trace;
use crate::upstream::{CallOutcome, CallRequest, InputKinds, InputSink, Session, UpstreamError};
use rmcp::model::CallToolResult;

/// Where a call's progress notifications go.
pub(crate) type ProgressSink = tokio::sync::mpsc::Sender<rmcp::model::ProgressNotificationParam>;

/// Where a call's events go besides its result: progress (InvokeToolStream,
/// InvokeToolInteractive) and questions for its worker
/// (InvokeToolInteractive).
#[derive(Debug, Default)]
pub(crate) struct Sinks {
    /// Progress notifications of the server.
    pub(crate) progress: Option<ProgressSink>,
    /// Questions of the server, answered by the worker on its stream.
    pub(crate) asker: Option<InputSink>,
}

/// Runs one call for the tenant that `request` authenticated as.
///
/// # Errors
/// The status the call ends with.
pub(crate) async fn run_call(
    gateway: &Gateway,
    request: Request<pb::InvokeToolRequest>,
    sinks: Sinks,
) -> Result<pb::InvokeToolResponse, Status> {
    let Sinks { progress, asker } = sinks;
    let (tenant, _busy) = gateway.tenant(&request)?;
    let started = Instant::now();
    let rpc = match (&progress, &asker) {
        (_, Some(_)) => "InvokeToolInteractive",
        (Some(_), None) => "InvokeToolStream",
        (None, None) => "InvokeTool",
    };
    let mut audited = AuditedCall::new(&gateway.audit, &request, &tenant, rpc, started);
    let series = gateway.metrics.calls(&tenant.name);
    let Some(_call) = gateway.drain.enter() else {
        series.tool("", "").finished("DRAINING", 0.0);
        let refused = Err(CallError::Draining);
        audited.finish(&refused, Progress::none()).await;
        return refused.map_err(Status::from);
    };
    let caller_deadline = caller_timeout(&request).map(|t| t.saturating_sub(deadline_margin(t)));
    let span = call_span(&tenant.name, &request.get_ref().name);
    trace::continue_caller_trace(&span, request.metadata());
    audited.trace(&span, request.metadata());
    let call_id = super::guarding::call_id(&span, request.metadata());
    let inherited_trace = trace::caller_context(request.metadata());
    let (caller, subject) = super::caller_of(&request);
    let request = request.into_inner();
    let _in_flight = series.in_flight();
    let mut routing = Routing::default();
    let context = CallContext {
        keys: gateway.request_keys.clone(),
        answered: gateway.answered_rounds.clone(),
        metrics: gateway.metrics.clone(),
        caller_deadline,
        started,
        inherited_trace,
        progress,
        asker,
        subject,
        caller,
        task_events: super::tasks::Events::of(gateway),
        call_id,
    };
    let call = async {
        tokio::select! {
            result = invoke(&tenant, &request, context, &series, &mut routing, &mut audited) => result,
            () = gateway.abort.cancelled() => Err(CallError::ShuttingDown { sent: false, idempotent: false }),
        }
    };
    let mut result = call.instrument(span.clone()).await;
    if let Err(CallError::ShuttingDown { sent, idempotent }) = &mut result {
        // The call future is gone: what it had got to is in `routing`.
        *sent = routing.sent;
        *idempotent = routing.idempotent;
    }
    // What the guards did is on the record, whatever became of the call.
    audited.guarded(
        &routing.guards,
        routing.replaced_arguments.as_deref(),
        || tenant.redactor(),
    );
    // The record is written before the response leaves.
    let progress = Progress {
        server: routing.server_name.as_deref(),
        definition_hash: routing.definition_hash.as_deref(),
        sent: routing.sent,
        idempotent: routing.idempotent,
    };
    if let Some(withheld) = audited.finish(&result, progress).await {
        result = Err(withheld);
    }
    record_outcome(&span, &result, &mut routing, &series, started.elapsed());
    result.map_err(Status::from)
}

/// The span of one call: its outcome and status are recorded at the end,
/// its server once the name resolves.
fn call_span(tenant: &str, tool: &str) -> tracing::Span {
    tracing::info_span!(
        "InvokeTool",
        otel.name = "toolgate.v1.ToolGateway/InvokeTool",
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = "toolgate.v1.ToolGateway",
        rpc.method = "InvokeTool",
        rpc.grpc.status_code = tracing::field::Empty,
        tenant = %tenant,
        gen_ai.tool.name = %quoted(tool),
        server = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// Records how the call ended: in its span (outcome, status), its tool's
/// series, and the log.
fn record_outcome(
    span: &tracing::Span,
    result: &Result<pb::InvokeToolResponse, CallError>,
    routing: &mut Routing,
    series: &TenantCalls,
    elapsed: Duration,
) {
    let (outcome, code) = match result {
        Ok(r) if r.is_error => ("tool_error", tonic::Code::Ok),
        Ok(r) if r.input_required.is_some() => ("input_required", tonic::Code::Ok),
        Ok(_) => ("ok", tonic::Code::Ok),
        Err(e) => {
            let (code, reason) = status::classify(e);
            (reason, code)
        }
    };
    span.record("outcome", outcome);
    span.record("rpc.grpc.status_code", code as i32);
    if code != tonic::Code::Ok {
        span.record("otel.status_code", "ERROR");
    }
    // Only names that resolved to a tool become label values (`tool`
    // series): callers cannot grow the metric set with made-up names.
    let tool_series = routing
        .series
        .take()
        .unwrap_or_else(|| series.tool(routing.server_name.as_deref().unwrap_or(""), ""));
    tool_series.finished(outcome, elapsed.as_secs_f64());
    span.in_scope(|| match result {
        Err(error) => tracing::info!(
            elapsed_ms = elapsed.as_millis() as u64,
            %error,
            "call failed"
        ),
        Ok(_) => tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, "call done"),
    });
}

/// What a call brings from its RPC.
struct CallContext {
    /// The keys that seal and open `request_state`.
    keys: crate::state::KeyRing,
    /// Where answered rounds are claimed.
    answered: crate::state::FirstUse,
    /// Where input rounds are counted.
    metrics: Arc<Metrics>,
    caller_deadline: Option<Duration>,
    started: Instant,
    inherited_trace: Vec<(String, String)>,
    progress: Option<ProgressSink>,
    /// Where the server's questions go (InvokeToolInteractive).
    asker: Option<InputSink>,
    /// Whose credential a per-user server uses.
    subject: crate::callers::Subject,
    /// Who is calling: the tenant's policy reads its claims.
    caller: crate::callers::Caller,
    /// Where a task's events go (metrics, audit).
    task_events: super::tasks::Events,
    /// toolgate's id of the call, as guards see it.
    call_id: String,
}

/// How far a call got, for metrics, logs and the shutdown status.
#[derive(Default)]
struct Routing {
    /// The server the name resolved to (or whose namespace it is in).
    server_name: Option<String>,
    /// The series of the tool the name resolved to (only then is the
    /// name a label value).
    series: Option<Arc<ToolCalls>>,
    /// The resolved tool's definition hash (for the audit record).
    definition_hash: Option<String>,
    /// Whether the tool is annotated `idempotentHint: true`.
    idempotent: bool,
    /// Whether the request was handed to the upstream session.
    sent: bool,
    /// What the guards did, in order.
    guards: Vec<crate::guards::Acted>,
    /// The arguments sent upstream when a guard replaced them.
    replaced_arguments: Option<String>,
}

/// Runs one call: admission first (a shed call costs nothing more), then
/// the name, the catalog it resolves in (and the tenant object that built
/// that catalog), pins, arguments, the upstream call and conversion.
async fn invoke(
    authenticated: &Arc<Tenant>,
    request: &pb::InvokeToolRequest,
    context: CallContext,
    series: &TenantCalls,
    routing: &mut Routing,
    audited: &mut AuditedCall,
) -> Result<pb::InvokeToolResponse, CallError> {
    let name = request.name.as_str();
    check_name(name)?;
    // Load shedding: a bounded wait for a slot, never an unbounded queue.
    let _admission = authenticated
        .limiter
        .admit(&context.subject)
        .await
        .map_err(|shed| CallError::Shed(shed, None))?;
    let resolved = resolve(authenticated, name, context.caller_deadline).await?;
    let who = call_route::Caller {
        caller: &context.caller,
        subject: &context.subject,
        deadline: context.caller_deadline,
    };
    let Resolved { tenant, catalog } = first_delegated_listing(resolved, name, &who).await?;
    // How this caller reads catalogs: under the policy of the tenant that
    // built the one it routes by.
    let viewer = Viewer {
        policy: tenant.policy().map(AsRef::as_ref),
        caller: &context.caller,
        subject: &context.subject,
    };
    let Some(tool) = catalog.get(name) else {
        return Err(not_routable(
            &tenant,
            &catalog,
            request,
            &viewer,
            &mut routing.server_name,
        )
        .await);
    };
    let (tool_series, idempotent) = route(tool, name, series, routing);
    // Before anything else about the tool is told or done.
    permitted(&viewer, &catalog, tool)?;
    check_pins(&tenant, &catalog, tool, request, &viewer)?;
    let arguments = arguments(&tenant, name, request)?;
    let server = tenant.server(tool.server_index);
    let binding = input_state::Binding {
        method: input_state::Method::Call,
        tenant: tenant.name.clone(),
        subject: context.subject.key().to_owned(),
        server: tool.server.clone(),
        upstream_tool: tool.upstream_name.clone(),
        exposed_name: name.to_owned(),
        definition_hash: tool.definition_hash.clone(),
        args_sha256: input_state::arguments_digest(&arguments),
    };
    // A retry's state and answers are checked before anything is sent.
    let retry = input_round::open_retry(
        (&context.keys, &context.answered),
        &tenant,
        server,
        (&request.request_state, &request.input_responses),
        &binding,
        || input_round::definition_changed(tool, &viewer, &catalog),
    )
    .await?;
    let _server_slot = server_slot(&tenant, tool).await?;
    let target = Target {
        tenant: &tenant,
        tool,
        name,
        subject: &context.subject,
        idempotent,
    };
    let session = target.session().await?;
    // A task the state store cannot keep must not reach the server.
    let accepts_task = request.accepts_task && server.input.tasks;
    if accepts_task {
        super::tasks::admit(&context.task_events, &tenant.name, &tool.server).await?;
    }
    // The guards' request phase: after every check of toolgate's own,
    // before anything is sent; the chain is kept for the response phase.
    let chain = tenant.guards(tool.server_index);
    let redaction = session.redaction().clone();
    let redact = move |text: &str| redaction.redact(text).into_owned();
    let guard_info = crate::guards::CallInfo {
        tenant: &tenant.name,
        subject: &context.subject,
        caller: Some(&context.caller),
        target: super::guarding::target(
            crate::pb::guard::TargetKind::Tool,
            name,
            &tool.server,
            &tool.upstream_name,
            &tool.definition_hash,
        ),
        call_id: context.call_id.clone(),
        trace: super::guarding::trace_fields(&context.inherited_trace),
        redact: &redact,
        metrics: &context.metrics,
    };
    let stopped = |stop| CallError::guard(stop, name.into(), &tool.server, idempotent);
    let arguments = chain
        .request(
            &guard_info,
            arguments,
            tenant.limits().max_argument_bytes,
            &mut routing.guards,
        )
        .await
        .map_err(stopped)?;
    routing.replaced_arguments = super::guarding::replaced_arguments(&routing.guards, &arguments);
    // `audit.required`: a place for the call's record, before anything is
    // sent (the record of a call whose caller goes away included).
    audited.admit(idempotent).await?;
    // A retry's answers are on record before they leave.
    let (round, answered) =
        input_round::answered(retry, audited, &context.metrics, &binding, &tenant).await?;
    let (remaining, timeout) = target.timeout(server, context.caller_deadline, context.started)?;
    let upstream_started = Instant::now();
    routing.sent = true;
    let mut call = CallRequest::new(tool.upstream_name.clone(), arguments, timeout);
    call.inherited_trace = context.inherited_trace;
    call.progress = context.progress;
    // What the worker answers, within what the server's tools may ask.
    let allowed = InputKinds {
        form: server.input.form,
        url: server.input.url,
        sampling: server.input.sampling,
    };
    call.accepts = questions::accepts(request.accepts_input.as_ref()).and(allowed);
    call.accepts_task = accepts_task;
    call.tasks_allowed = server.input.tasks;
    if let Some((responses, state)) = answered {
        call.input_responses = Some(responses);
        call.request_state = state;
    }
    // Every round put to the worker goes through the relay, on record.
    let relay = input_relay::Relay {
        audited: &*audited,
        metrics: &context.metrics,
        binding: &binding,
        redactor: || tenant.redactor(),
        era: input_relay::era(&session),
        first: round,
        idempotent,
    };
    let result = relay.call(&session, &mut call, context.asker).await?;
    tool_series.upstream_finished(upstream_started.elapsed().as_secs_f64());
    let result = input_round::not_accepted(result, &context.metrics, &binding)?;
    match target.answer(result, remaining, server, context.started, routing)? {
        CallOutcome::Complete(result) => {
            // The guards' response phase: before conversion, the audit
            // record and the answer.
            let result = chain
                .response(
                    &guard_info,
                    result,
                    tenant.limits().max_result_bytes,
                    &mut routing.guards,
                )
                .await
                .map_err(stopped)?;
            target.response(result)
        }
        CallOutcome::InputRequired(asked) => {
            let round = input_round::Questions {
                keys: &context.keys,
                metrics: &context.metrics,
                binding: &binding,
                server,
                accepts: call.accepts,
                number: round,
            };
            let message = round.hand_out(asked, audited, |reason| {
                target.upstream(UpstreamError::Protocol(reason))
            })?;
            target.sized(pb::InvokeToolResponse {
                input_required: Some(message),
                ..pb::InvokeToolResponse::default()
            })
        }
        // Only a call with accepts_task ends here (Session::call follows
        // any other task itself): the worker gets toolgate's task.
        CallOutcome::Task(created) => {
            let started = super::tasks::Started {
                tenant: &tenant,
                server,
                tool,
                subject: &context.subject,
                events: &context.task_events,
                idempotent,
            };
            let task = super::tasks::start(&started, &session, created).await?;
            Ok(pb::InvokeToolResponse {
                task: Some(Box::new(task)),
                ..Default::default()
            })
        }
    }
}

/// The session a task RPC on `tool` uses: the tenant's, or for a per-user
/// server the subject's own, as for a call.
///
/// # Errors
/// As a call's session.
pub(super) async fn task_session(
    tenant: &Tenant,
    tool: &CatalogTool,
    subject: &crate::callers::Subject,
) -> Result<Arc<Session>, CallError> {
    Target {
        tenant,
        tool,
        name: &tool.name,
        subject,
        idempotent: false,
    }
    .session()
    .await
}

/// The status of an upstream failure of a task RPC on `tool`.
pub(super) fn task_failure(
    tool: &CatalogTool,
    subject: &crate::callers::Subject,
    error: UpstreamError,
) -> CallError {
    upstream_failure(tool, &tool.name, subject, error, false)
}

/// Records in `routing` (and the span) what the name resolved to; the
/// tool's series and whether it is idempotent.
fn route(
    tool: &CatalogTool,
    name: &str,
    series: &TenantCalls,
    routing: &mut Routing,
) -> (Arc<ToolCalls>, bool) {
    tracing::Span::current().record("server", tool.server.as_str());
    routing.server_name = Some(tool.server.clone());
    let tool_series = series.tool(&tool.server, name);
    routing.series = Some(tool_series.clone());
    routing.definition_hash = Some(tool.definition_hash.clone());
    let idempotent = tool.annotations.idempotent == Some(true);
    routing.idempotent = idempotent;
    (tool_series, idempotent)
}

/// The call's arguments, within the tenant's size limit.
fn arguments(
    tenant: &Tenant,
    name: &str,
    request: &pb::InvokeToolRequest,
) -> Result<rmcp::model::JsonObject, CallError> {
    let max_arguments = tenant.limits().max_argument_bytes;
    if request.arguments_json.len() > max_arguments {
        return Err(CallError::ArgumentsTooLarge {
            tool: (name.to_owned()).into(),
            size: request.arguments_json.len(),
            limit: max_arguments,
        });
    }
    parse_arguments(name, &request.arguments_json)
}

/// A slot of the tool's server, when the server has a concurrency limit
/// (a bounded wait, as for the tenant's).
async fn server_slot(
    tenant: &Tenant,
    tool: &CatalogTool,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, CallError> {
    let Some(limit) = tenant.server_limit(tool.server_index) else {
        return Ok(None);
    };
    limit
        .acquire(tenant.limiter.queue_timeout())
        .await
        .map(Some)
        .ok_or_else(|| {
            CallError::Shed(
                crate::registry::limits::Shed::ServerConcurrency(limit.limit()),
                Some(tool.server.clone()),
            )
        })
}

/// The tool a call resolved to, and for whom: what the steps from the
/// session on share.
#[derive(Clone, Copy)]
struct Target<'a> {
    /// The tenant object that built the catalog the call routes by.
    tenant: &'a Tenant,
    /// The resolved tool.
    tool: &'a CatalogTool,
    /// The name it was called by.
    name: &'a str,
    /// The subject whose credential a per-user server uses.
    subject: &'a crate::callers::Subject,
    /// Whether the tool is annotated `idempotentHint: true`.
    idempotent: bool,
}

impl Target<'_> {
    /// The status of an upstream failure of this call.
    fn upstream(&self, error: UpstreamError) -> CallError {
        upstream_failure(self.tool, self.name, self.subject, error, self.idempotent)
    }

    /// The tenant's session, or for a per-user server the subject's own,
    /// with the subject's token (nothing is sent without one).
    async fn session(&self) -> Result<Arc<Session>, CallError> {
        let index = self.tool.server_index;
        if self.tenant.is_per_user(index) {
            self.tenant
                .user_session(index, self.subject)
                .await
                .map_err(|error| self.upstream(error))
        } else {
            match self.tenant.session(index) {
                Ok(session) => return Ok(session),
                Err(SessionUnavailable::Down(_)) if self.tenant.replacement().is_some() => {
                    // Replaced between routing and now (a reload, a change
                    // of a stored tenant): nothing was sent, so the call
                    // goes to the server of this name in the tenant now.
                    if let Some(session) = self.replaced_session().await {
                        return Ok(session);
                    }
                }
                Err(_) => {}
            }
            self.tenant
                .session(index)
                .map_err(|e| CallError::ServerUnavailable {
                    server: self.tool.server.clone(),
                    tool: (self.name.to_owned()).into(),
                    reason: match e {
                        SessionUnavailable::Connecting => "still connecting".to_owned(),
                        SessionUnavailable::Down(reason) => reason,
                    },
                })
        }
    }

    /// The session of this call's server in the tenant object that
    /// replaced the one it routed by, once that one has settled (bounded):
    /// `None` when the name now routes elsewhere or nowhere.
    async fn replaced_session(&self) -> Option<Arc<Session>> {
        let newer = self.tenant.replacement()?;
        let catalog = newer.settled_catalog(LIST_SETTLE_WAIT).await;
        let Resolved { tenant, catalog } = newer.resolve(catalog).ok()?;
        let tool = catalog.get(self.name)?;
        if tool.server != self.tool.server || tool.upstream_name != self.tool.upstream_name {
            return None;
        }
        tenant.session(tool.server_index).ok()
    }

    /// What is left of the caller's deadline (if it set one), and the
    /// upstream call's timeout: that, or the tool's, within the server's
    /// maximum.
    fn timeout(
        &self,
        server: &ServerConfig,
        caller_deadline: Option<Duration>,
        started: Instant,
    ) -> Result<(Option<Duration>, Duration), CallError> {
        let remaining = caller_deadline.map(|d| d.saturating_sub(started.elapsed()));
        if remaining.is_some_and(|r| r.is_zero()) {
            // Sending now would let the tool act while the caller is told
            // DEADLINE_EXCEEDED: nothing is sent.
            return Err(CallError::DeadlineExceeded {
                server: self.tool.server.clone(),
                tool: (self.name.to_owned()).into(),
                after: started.elapsed(),
                sent: false,
            });
        }
        let timeout = remaining
            .unwrap_or_else(|| server.timeout_for(&self.tool.upstream_name))
            .min(server.max_call_timeout);
        Ok((remaining, timeout))
    }

    /// The upstream's answer, or the status of its failure (and in
    /// `routing`, whether the request had left after all).
    fn answer<T>(
        &self,
        result: Result<T, UpstreamError>,
        remaining: Option<Duration>,
        server: &ServerConfig,
        started: Instant,
        routing: &mut Routing,
    ) -> Result<T, CallError> {
        match result {
            Ok(result) => Ok(result),
            Err(UpstreamError::Timeout(_))
                if remaining.is_some_and(|r| r <= server.max_call_timeout) =>
            {
                Err(CallError::DeadlineExceeded {
                    server: self.tool.server.clone(),
                    tool: (self.name.to_owned()).into(),
                    after: started.elapsed(),
                    sent: true,
                })
            }
            Err(error @ UpstreamError::Closed) => {
                // The session was gone before the request left: nothing sent.
                routing.sent = false;
                Err(self.upstream(error))
            }
            Err(error) if error.is_credential_failure() => {
                // No token could be had: the request was not sent.
                routing.sent = false;
                if let UpstreamError::AuthorizationRequired { url } = &error {
                    self.tenant
                        .remember_consent_url(self.tool.server_index, self.subject, url);
                }
                Err(self.upstream(error))
            }
            Err(error) => Err(self.upstream(error)),
        }
    }

    /// The gRPC response to the upstream's answer, within the size limit.
    fn response(&self, result: CallToolResult) -> Result<pb::InvokeToolResponse, CallError> {
        let response = convert::invoke_response(result, &self.tool.server)
            .map_err(|e| self.upstream(UpstreamError::Protocol(e.to_string())))?;
        self.sized(response)
    }

    /// `response`, unless it is over `limits.max_message_bytes`.
    fn sized(&self, response: pb::InvokeToolResponse) -> Result<pb::InvokeToolResponse, CallError> {
        let size = prost::Message::encoded_len(&response);
        let limit = self.tenant.limits().max_message_bytes;
        if size > limit {
            return Err(CallError::ResponseTooLarge {
                server: self.tool.server.clone(),
                tool: (self.name.to_owned()).into(),
                size,
                limit,
            });
        }
        Ok(response)
    }
}

/// The status of an upstream failure: a subject that must consent first
/// gets the URL, a state store that is down is retryable, anything else is
/// the server's failure.
fn upstream_failure(
    tool: &CatalogTool,
    name: &str,
    subject: &crate::callers::Subject,
    error: UpstreamError,
    idempotent: bool,
) -> CallError {
    match error {
        error if error.is_credential_failure() => token_failure(&tool.server, name, subject, error),
        error => CallError::Upstream {
            server: tool.server.clone(),
            tool: (name.to_owned()).into(),
            error,
            idempotent,
        },
    }
}
