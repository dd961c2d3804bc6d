//! One tool call, shared by `InvokeTool` and `InvokeToolStream`: drain
//! admission, span and metrics, tool lookup (with plan pins), limits,
//! arguments, the upstream call with its deadline, and conversion.

use std::time::{Duration, Instant};

use tonic::{Request, Status};
use tracing::Instrument;

use super::{
    Gateway, LIST_SETTLE_WAIT, caller_timeout, convert, deadline_margin, parse_arguments, status,
};
use crate::catalog::{Catalog, CatalogTool};
use crate::error::{CallError, Pin};
use crate::pb;
use crate::registry::{SessionUnavailable, Tenant};
use crate::telemetry::{Metrics, trace};
use crate::upstream::UpstreamError;

/// Where a call's progress notifications go.
pub(crate) type ProgressSink = tokio::sync::mpsc::Sender<rmcp::model::ProgressNotificationParam>;

/// Runs one call for the tenant that `request` authenticated as.
///
/// # Errors
/// The status the call ends with.
pub(crate) async fn run_call(
    gateway: &Gateway,
    request: Request<pb::InvokeToolRequest>,
    progress: Option<ProgressSink>,
) -> Result<pb::InvokeToolResponse, Status> {
    let tenant = gateway.tenant(&request)?;
    let _busy = tenant.busy();
    let started = Instant::now();
    let Some(_call) = gateway.drain.enter() else {
        gateway
            .metrics
            .call_finished(&tenant.name, "", "", "DRAINING", 0.0);
        return Err(CallError::Draining.into());
    };
    let caller_deadline = caller_timeout(&request).map(|t| t.saturating_sub(deadline_margin(t)));
    let span = tracing::info_span!(
        "InvokeTool",
        otel.name = "toolgate.v1.ToolGateway/InvokeTool",
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = "toolgate.v1.ToolGateway",
        rpc.method = "InvokeTool",
        rpc.grpc.status_code = tracing::field::Empty,
        tenant = %tenant.name,
        gen_ai.tool.name = %request.get_ref().name,
        server = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    trace::continue_caller_trace(&span, request.metadata());
    let inherited_trace = trace::caller_context(request.metadata());
    let request = request.into_inner();
    let progress = progress;
    let _in_flight = gateway.metrics.in_flight(&tenant.name);
    let call = async {
        tokio::select! {
            result = invoke(&tenant, &request, caller_deadline, started, &gateway.metrics, inherited_trace, progress) => result,
            () = gateway.abort.cancelled() => Err((None, CallError::ShuttingDown)),
        }
    };
    let result = call.instrument(span.clone()).await;
    let (routed, outcome, code) = match &result {
        Ok((routed, r)) if r.is_error => (Some(routed), "tool_error", tonic::Code::Ok),
        Ok((routed, _)) => (Some(routed), "ok", tonic::Code::Ok),
        Err((routed, e)) => {
            let (code, reason) = status::classify(e);
            (routed.as_ref(), reason, code)
        }
    };
    let elapsed = started.elapsed();
    span.record("outcome", outcome);
    span.record("rpc.grpc.status_code", code as i32);
    if code != tonic::Code::Ok {
        span.record("otel.status_code", "ERROR");
    }
    // Only names that resolved to a tool become label values: callers
    // cannot grow the metric set with made-up names.
    let tool_label = match routed {
        Some((_, true)) => request.name.as_str(),
        _ => "",
    };
    gateway.metrics.call_finished(
        &tenant.name,
        routed.map(|(s, _)| s.as_str()).unwrap_or(""),
        tool_label,
        outcome,
        elapsed.as_secs_f64(),
    );
    span.in_scope(|| match &result {
        Err((_, error)) => tracing::info!(
            elapsed_ms = elapsed.as_millis() as u64,
            %error,
            "call failed"
        ),
        Ok(_) => tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, "call done"),
    });
    result
        .map(|(_, response)| response)
        .map_err(|(_, e)| Status::from(e))
}

/// The server a call went to (when known), and whether the requested name
/// resolved to a tool of it.
type Routed = (String, bool);

/// Runs one call. The server name travels with the answer (when known)
/// for metrics and logs.
async fn invoke(
    tenant: &Tenant,
    request: &pb::InvokeToolRequest,
    caller_deadline: Option<Duration>,
    started: Instant,
    metrics: &Metrics,
    inherited_trace: Vec<(String, String)>,
    progress: Option<ProgressSink>,
) -> Result<(Routed, pb::InvokeToolResponse), (Option<Routed>, CallError)> {
    let mut routing = Routing {
        server_name: None,
        resolved: true,
    };
    let context = CallContext {
        caller_deadline,
        started,
        inherited_trace,
        progress,
    };
    let result = invoke_inner(tenant, request, context, metrics, &mut routing).await;
    let routed = routing.server_name.map(|s| (s, routing.resolved));
    result
        .map_err(|e| (routed.clone(), e))
        .map(|r| (routed.unwrap_or_default(), r))
}

/// What a call brings from its RPC.
struct CallContext {
    caller_deadline: Option<Duration>,
    started: Instant,
    inherited_trace: Vec<(String, String)>,
    progress: Option<ProgressSink>,
}

/// Where a call was routed, for metrics and logs.
struct Routing {
    server_name: Option<String>,
    /// Whether the name resolved to a tool (only then is it a label value).
    resolved: bool,
}

async fn invoke_inner(
    tenant: &Tenant,
    request: &pb::InvokeToolRequest,
    context: CallContext,
    metrics: &Metrics,
    routing: &mut Routing,
) -> Result<pb::InvokeToolResponse, CallError> {
    let CallContext {
        caller_deadline,
        started,
        inherited_trace,
        progress,
    } = context;
    let name = request.name.as_str();
    let mut catalog = tenant.catalog();
    if catalog.get(name).is_none() && catalog.is_settling() {
        // A server that is still connecting may provide the tool.
        let wait = caller_deadline
            .unwrap_or(LIST_SETTLE_WAIT)
            .min(LIST_SETTLE_WAIT);
        catalog = tenant.settled_catalog(wait).await;
    }
    let Some(tool) = catalog.get(name) else {
        // Not a resolved tool: the name must not become a metric label.
        routing.resolved = false;
        // A tool of a server that is down is unavailable, not unknown.
        if let Some(server) = catalog.down_server_for(name) {
            routing.server_name = Some(server.name.clone());
            return Err(CallError::ServerUnavailable {
                server: server.name.clone(),
                tool: name.to_owned(),
                reason: match &server.state {
                    crate::catalog::ServerState::Failed(reason) => reason.clone(),
                    _ => "still connecting".to_owned(),
                },
            });
        }
        if let Some(gone) = gone_since_pin(tenant, request) {
            return Err(gone);
        }
        return Err(CallError::ToolNotFound {
            name: name.to_owned(),
        });
    };
    tracing::Span::current().record("server", tool.server.as_str());
    routing.server_name = Some(tool.server.clone());
    check_pins(tenant, &catalog, tool, request)?;
    let max_arguments = tenant.limits().max_argument_bytes;
    if request.arguments_json.len() > max_arguments {
        return Err(CallError::ArgumentsTooLarge {
            tool: name.to_owned(),
            size: request.arguments_json.len(),
            limit: max_arguments,
        });
    }
    let arguments = parse_arguments(name, &request.arguments_json)?;
    let server = tenant.server(tool.server_index);
    // Load shedding: a bounded wait for a slot, never an unbounded queue.
    let _admission = tenant
        .limiter
        .admit()
        .await
        .map_err(|shed| CallError::Shed(shed, None))?;
    let _server_slot = match tenant.server_limit(tool.server_index) {
        Some(limit) => Some(
            limit
                .acquire(tenant.limiter.queue_timeout())
                .await
                .ok_or_else(|| {
                    CallError::Shed(
                        crate::limits::Shed::ServerConcurrency(limit.limit()),
                        Some(tool.server.clone()),
                    )
                })?,
        ),
        None => None,
    };
    let session = tenant
        .session(tool.server_index)
        .map_err(|e| CallError::ServerUnavailable {
            server: tool.server.clone(),
            tool: name.to_owned(),
            reason: match e {
                SessionUnavailable::Connecting => "still connecting".to_owned(),
                SessionUnavailable::Down(reason) => reason,
            },
        })?;
    let remaining = caller_deadline.map(|d| d.saturating_sub(started.elapsed()));
    let timeout = remaining
        .unwrap_or_else(|| server.timeout_for(&tool.upstream_name))
        .min(server.max_call_timeout);
    let upstream_started = Instant::now();
    let result = session
        .call(
            &tool.upstream_name,
            arguments,
            timeout,
            inherited_trace,
            progress,
        )
        .await;
    metrics.upstream_request(
        &tenant.name,
        &tool.server,
        "tools/call",
        upstream_started.elapsed().as_secs_f64(),
    );
    let result = match result {
        Ok(result) => result,
        Err(UpstreamError::Timeout(_))
            if remaining.is_some_and(|r| r <= server.max_call_timeout) =>
        {
            return Err(CallError::DeadlineExceeded {
                server: tool.server.clone(),
                tool: name.to_owned(),
                after: started.elapsed(),
            });
        }
        Err(error) => {
            return Err(CallError::Upstream {
                server: tool.server.clone(),
                tool: name.to_owned(),
                error,
            });
        }
    };
    convert::invoke_response(result).map_err(|e| CallError::Upstream {
        server: tool.server.clone(),
        tool: name.to_owned(),
        error: UpstreamError::Protocol(e.to_string()),
    })
}

/// Refuses the call when the caller pinned a definition or catalog version
/// and this tool changed since.
fn check_pins(
    tenant: &Tenant,
    current: &Catalog,
    tool: &CatalogTool,
    request: &pb::InvokeToolRequest,
) -> Result<(), CallError> {
    let refuse = |pin: Pin, detail: String| CallError::PlanOutdated {
        tool: tool.name.clone(),
        pin,
        detail,
        current_version: current.version().to_owned(),
        current_hash: tool.definition_hash.clone(),
    };
    if !request.definition_hash.is_empty() && request.definition_hash != tool.definition_hash {
        return Err(refuse(
            Pin::DefinitionChanged,
            format!(
                "the definition of `{}` changed since the plan (definition_hash {} is now {})",
                tool.name, request.definition_hash, tool.definition_hash
            ),
        ));
    }
    // A matching definition hash answers the question on its own: the
    // catalog version may be from before a restart or another replica.
    let hash_confirms =
        !request.definition_hash.is_empty() && request.definition_hash == tool.definition_hash;
    if !hash_confirms
        && !request.catalog_version.is_empty()
        && request.catalog_version != current.version()
    {
        let Some(pinned) = tenant.catalog_with_version(&request.catalog_version) else {
            return Err(refuse(
                Pin::VersionUnknown,
                format!(
                    "catalog_version {} is not known to this gateway (too old, or never served); \
                     the catalog is now {}",
                    request.catalog_version,
                    current.version()
                ),
            ));
        };
        match pinned.get(&tool.name) {
            Some(then) if then.definition_hash == tool.definition_hash => {}
            Some(_) => {
                return Err(refuse(
                    Pin::DefinitionChanged,
                    format!(
                        "the definition of `{}` changed since catalog_version {}",
                        tool.name, request.catalog_version
                    ),
                ));
            }
            None => {
                return Err(refuse(
                    Pin::DefinitionChanged,
                    format!(
                        "`{}` was not in catalog_version {}: the plan cannot have used it",
                        tool.name, request.catalog_version
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// For a name not in the catalog: TOOL_GONE when the caller's pins show
/// the tool existed when the plan was made.
fn gone_since_pin(tenant: &Tenant, request: &pb::InvokeToolRequest) -> Option<CallError> {
    let current = tenant.catalog();
    let existed = if !request.catalog_version.is_empty() {
        tenant
            .catalog_with_version(&request.catalog_version)
            .is_some_and(|c| c.get(&request.name).is_some())
    } else {
        // Only a hash this gateway has served for this name counts.
        !request.definition_hash.is_empty()
            && tenant.served_definition(&request.name, &request.definition_hash)
    };
    existed.then(|| CallError::PlanOutdated {
        tool: request.name.clone(),
        pin: Pin::Gone,
        detail: format!(
            "`{}` is gone from the catalog since the plan was made",
            request.name
        ),
        current_version: current.version().to_owned(),
        current_hash: String::new(),
    })
}
