//! The `toolgate.v1.ToolGateway` service. Handlers stay thin: find the
//! caller's tenant (put there by [`crate::auth`]), look the tool up in the
//! tenant's catalog snapshot, call the upstream session, convert.

pub mod convert;
pub mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::error::CallError;
use crate::pb;
use crate::registry::{Registry, SessionUnavailable, Tenant, TenantId};
use crate::upstream::UpstreamError;

/// How long ListTools waits for servers that are still connecting when the
/// caller set no deadline.
const LIST_SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Answer this much before the caller's deadline, so that the caller gets
/// our DEADLINE_EXCEEDED (with details) rather than tonic's own cut-off.
const DEADLINE_MARGIN: Duration = Duration::from_millis(5);

/// The ToolGateway service.
#[derive(Debug, Clone)]
pub struct Gateway {
    registry: Arc<Registry>,
    /// Cancelled when the shutdown grace period runs out: calls still in
    /// flight are cancelled upstream and answered UNAVAILABLE.
    abort: CancellationToken,
}

impl Gateway {
    /// A service over `registry`; `abort` ends calls still running when the
    /// shutdown grace period is over.
    pub fn new(registry: Arc<Registry>, abort: CancellationToken) -> Self {
        Self { registry, abort }
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
fn parse_arguments(tool: &str, text: &str) -> Result<rmcp::model::JsonObject, CallError> {
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
        let span = tracing::info_span!("ListTools", tenant = %tenant.name);
        let _enter = span.enter();
        let wait = caller_timeout(&request)
            .map(|t| t.saturating_sub(DEADLINE_MARGIN))
            .unwrap_or(LIST_SETTLE_WAIT)
            .min(LIST_SETTLE_WAIT);
        drop(_enter);
        let catalog = tenant.settled_catalog(wait).await;
        Ok(Response::new(convert::list_response(&catalog)))
    }

    async fn invoke_tool(
        &self,
        request: Request<pb::InvokeToolRequest>,
    ) -> Result<Response<pb::InvokeToolResponse>, Status> {
        let started = Instant::now();
        let tenant = self.tenant(&request)?.clone();
        let caller_deadline = caller_timeout(&request).map(|t| t.saturating_sub(DEADLINE_MARGIN));
        let request = request.into_inner();
        let span = tracing::info_span!(
            "InvokeTool",
            tenant = %tenant.name,
            tool = %request.name,
            server = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let result = tokio::select! {
            result = invoke(&tenant, &request, caller_deadline, started, &span) => result,
            () = self.abort.cancelled() => Err(CallError::ShuttingDown),
        };
        let outcome = match &result {
            Ok(r) if r.is_error => "tool_error",
            Ok(_) => "ok",
            Err(e) => status::classify(e).1,
        };
        span.record("outcome", outcome);
        span.in_scope(|| {
            tracing::debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "call done"
            );
        });
        result.map(Response::new).map_err(Status::from)
    }
}

async fn invoke(
    tenant: &Tenant,
    request: &pb::InvokeToolRequest,
    caller_deadline: Option<Duration>,
    started: Instant,
    span: &tracing::Span,
) -> Result<pb::InvokeToolResponse, CallError> {
    let name = request.name.as_str();
    let mut catalog = tenant.catalog();
    if catalog.get(name).is_none() && catalog.is_settling() {
        // A server that is still connecting may provide the tool.
        let wait = caller_deadline
            .unwrap_or(LIST_SETTLE_WAIT)
            .min(LIST_SETTLE_WAIT);
        catalog = tenant.settled_catalog(wait).await;
    }
    let tool = catalog.get(name).ok_or_else(|| CallError::ToolNotFound {
        name: name.to_owned(),
    })?;
    span.record("server", tool.server.as_str());
    let arguments = parse_arguments(name, &request.arguments_json)?;
    let server = tenant.server(tool.server_index);
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
        .unwrap_or(server.call_timeout)
        .min(server.max_call_timeout);
    let result = session.call(&tool.upstream_name, arguments, timeout).await;
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
