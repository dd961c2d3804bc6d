//! The `toolgate.v1.ToolGateway` service. Handlers stay thin: find the
//! caller's tenant (put there by [`crate::auth`]), look the tool up in the
//! tenant's catalog snapshot, call the upstream session, convert.

pub mod convert;
pub mod drain;
pub mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::error::CallError;
use crate::pb;
use crate::registry::{Registry, SessionUnavailable, Tenant, TenantId};
use crate::telemetry::{Metrics, trace};
use crate::upstream::UpstreamError;

/// How long ListTools waits for servers that are still connecting when the
/// caller set no deadline.
const LIST_SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Answer a little before the caller's deadline, so that the caller gets
/// our DEADLINE_EXCEEDED (with details) rather than its own cut-off: 5 % of
/// the deadline, at least 20 ms and at most 250 ms.
fn deadline_margin(deadline: Duration) -> Duration {
    (deadline / 20).clamp(Duration::from_millis(20), Duration::from_millis(250))
}

/// The ToolGateway service.
#[derive(Debug, Clone)]
pub struct Gateway {
    registry: Arc<Registry>,
    /// Cancelled when the shutdown grace period runs out: calls still in
    /// flight are cancelled upstream and answered UNAVAILABLE.
    abort: CancellationToken,
    metrics: Arc<Metrics>,
    drain: Arc<drain::Drain>,
}

impl Gateway {
    /// A service over `registry`; `abort` ends calls still running when the
    /// shutdown grace period is over.
    pub fn new(
        registry: Arc<Registry>,
        abort: CancellationToken,
        metrics: Arc<Metrics>,
        drain: Arc<drain::Drain>,
    ) -> Self {
        Self {
            registry,
            abort,
            metrics,
            drain,
        }
    }

    fn tenant<T>(&self, request: &Request<T>) -> Result<&Arc<Tenant>, Status> {
        let id = request
            .extensions()
            .get::<TenantId>()
            .copied()
            .ok_or(CallError::Unauthenticated("no credential was checked"))?;
        Ok(self.registry.tenant(id))
    }
}

/// The caller's deadline, from the `grpc-timeout` header.
fn caller_timeout<T>(request: &Request<T>) -> Option<Duration> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (amount, unit) = value.split_at(value.len() - 1);
    let amount: u64 = amount.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Parses `arguments_json`: empty means `{}`; anything but an object is
/// refused, saying what it is.
///
/// # Errors
/// The text is not empty and not a JSON object.
pub fn parse_arguments(tool: &str, text: &str) -> Result<rmcp::model::JsonObject, CallError> {
    let invalid = |reason: String| CallError::InvalidArguments {
        tool: tool.to_owned(),
        reason,
    };
    if text.trim().is_empty() {
        return Ok(rmcp::model::JsonObject::new());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(invalid(format!(
            "must be a JSON object, but is {}",
            match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::Object(_) => unreachable!(),
            }
        ))),
        Err(e) => Err(invalid(format!("is not valid JSON: {e}"))),
    }
}

#[tonic::async_trait]
impl pb::tool_gateway_server::ToolGateway for Gateway {
    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let tenant = self.tenant(&request)?;
        let span = tracing::info_span!(
            "ListTools",
            otel.name = "toolgate.v1.ToolGateway/ListTools",
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = "toolgate.v1.ToolGateway",
            rpc.method = "ListTools",
            tenant = %tenant.name,
        );
        trace::continue_caller_trace(&span, request.metadata());
        let wait = caller_timeout(&request)
            .map(|t| t.saturating_sub(deadline_margin(t)))
            .unwrap_or(LIST_SETTLE_WAIT)
            .min(LIST_SETTLE_WAIT);
        let catalog = tenant.settled_catalog(wait).instrument(span).await;
        Ok(Response::new(convert::list_response(&catalog)))
    }

    async fn invoke_tool(
        &self,
        request: Request<pb::InvokeToolRequest>,
    ) -> Result<Response<pb::InvokeToolResponse>, Status> {
        let started = Instant::now();
        let tenant = self.tenant(&request)?.clone();
        let Some(_call) = self.drain.enter() else {
            return Err(CallError::Draining.into());
        };
        let caller_deadline =
            caller_timeout(&request).map(|t| t.saturating_sub(deadline_margin(t)));
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
        let _in_flight = self.metrics.in_flight(&tenant.name);
        let call = async {
            tokio::select! {
                result = invoke(&tenant, &request, caller_deadline, started, &self.metrics, inherited_trace) => result,
                () = self.abort.cancelled() => Err((None, CallError::ShuttingDown)),
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
        self.metrics.call_finished(
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
            .map(|(_, response)| Response::new(response))
            .map_err(|(_, e)| Status::from(e))
    }
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
) -> Result<(Routed, pb::InvokeToolResponse), (Option<Routed>, CallError)> {
    let mut routing = Routing {
        server_name: None,
        resolved: true,
    };
    let context = CallContext {
        caller_deadline,
        started,
        inherited_trace,
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
        return Err(CallError::ToolNotFound {
            name: name.to_owned(),
        });
    };
    tracing::Span::current().record("server", tool.server.as_str());
    routing.server_name = Some(tool.server.clone());
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
        .call(&tool.upstream_name, arguments, timeout, inherited_trace)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_must_be_an_object() {
        assert!(parse_arguments("t", "").unwrap().is_empty());
        assert!(
            parse_arguments("t", " {\"a\": 1} ")
                .unwrap()
                .contains_key("a")
        );
        let err = parse_arguments("t", "[1]").unwrap_err().to_string();
        assert!(err.contains("an array"), "{err}");
        let err = parse_arguments("t", "{nope").unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }

    #[test]
    fn parses_grpc_timeouts() {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("grpc-timeout", "250m".parse().unwrap());
        assert_eq!(caller_timeout(&request), Some(Duration::from_millis(250)));
        request
            .metadata_mut()
            .insert("grpc-timeout", "2S".parse().unwrap());
        assert_eq!(caller_timeout(&request), Some(Duration::from_secs(2)));
        request
            .metadata_mut()
            .insert("grpc-timeout", "x".parse().unwrap());
        assert_eq!(caller_timeout(&request), None);
    }
}
