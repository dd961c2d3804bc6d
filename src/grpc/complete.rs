//! `Complete`: argument completion for a prompt (by exposed name) or a
//! resource template (by server and URI template), handled like a call:
//! drain, admission (the tenant's rate and concurrency, the server's
//! concurrency), policy, the subject's own session for a per-user server,
//! a timeout within the caller's deadline, `limits.max_argument_bytes`
//! over the value and context, redaction of the values, and an audit
//! record (`rpc: Complete`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Request, Status};
use tracing::Instrument;

use super::call_audit::{AuditedCall, Progress};
use super::call_route::resolve_when;
use super::error::{CallError, Feature, Target, quoted};
use super::{Gateway, caller_timeout, deadline_margin, upstream_session};
use crate::callers::{Caller, Subject};
use crate::pb;
use crate::policy::ResourceUri;
use crate::registry::{Resolved, Tenant};
use crate::telemetry::trace;
use crate::upstream::{Completion, CompletionRef, CompletionRequest, UpstreamError};

/// `Complete`.
///
/// # Errors
/// The status the completion ends with.
pub(super) async fn complete(
    gateway: &Gateway,
    request: Request<pb::CompleteRequest>,
) -> Result<pb::CompleteResponse, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let started = Instant::now();
    let message = request.get_ref();
    let arguments = serde_json::json!({
        "argument": message.argument_name,
        "value": message.value,
        "context": message.context_arguments,
    })
    .to_string();
    let mut audited = AuditedCall::of(
        &gateway.audit,
        &request,
        &tenant,
        "Complete",
        started,
        Some(&arguments),
    );
    audited.describe(|record| match &message.r#ref {
        Some(pb::complete_request::Ref::Prompt(name)) => {
            record.prompt = Some(quoted(name).into_owned());
        }
        Some(pb::complete_request::Ref::ResourceTemplate(template)) => {
            // In its normal form, as the policy matched it (as asked,
            // when it has none).
            let normal = ResourceUri::template(&template.uri_template)
                .map_or_else(|_| template.uri_template.clone(), ResourceUri::into_string);
            record.uri_template = Some(Target::template(normal).name);
        }
        None => {}
    });
    let Some(_call) = gateway.drain.enter() else {
        let refused = Err(CallError::Draining);
        audited.finish(&refused, Progress::none()).await;
        return refused.map_err(Status::from);
    };
    let span = tracing::info_span!(
        "rpc",
        otel.name = "toolgate.v1.ToolGateway/Complete",
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = "toolgate.v1.ToolGateway",
        rpc.method = "Complete",
        tenant = %tenant.name,
        server = tracing::field::Empty,
    );
    trace::continue_caller_trace(&span, request.metadata());
    audited.trace(&span, request.metadata());
    let context = Context {
        caller_deadline: caller_timeout(&request).map(|t| t.saturating_sub(deadline_margin(t))),
        inherited_trace: trace::caller_context(request.metadata()),
        started,
    };
    let (caller, subject) = super::caller_of(&request);
    let request = request.into_inner();
    let mut routing = Routing::default();
    let run = async {
        tokio::select! {
            result = run(&tenant, &request, &context, (&caller, &subject), &mut routing) => result,
            () = gateway.abort.cancelled() => Err(CallError::ShuttingDown { sent: false, idempotent: true }),
        }
    };
    let mut result = run.instrument(span.clone()).await;
    if let Err(CallError::ShuttingDown { sent, .. }) = &mut result {
        *sent = routing.sent;
    }
    let progress = Progress {
        server: routing.server.as_deref(),
        definition_hash: routing.definition_hash.as_deref(),
        sent: routing.sent,
        idempotent: true,
    };
    if let Some(withheld) = audited.finish(&result, progress).await {
        result = Err(withheld);
    }
    gateway.metrics.request(
        &tenant.name,
        routing.server.as_deref(),
        "Complete",
        match &result {
            Ok(_) => "ok",
            Err(error) => super::status::classify(error).1,
        },
    );
    span.in_scope(|| match &result {
        Err(error) => tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            %error,
            "completion failed"
        ),
        Ok(_) => tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "completion done"
        ),
    });
    result.map_err(Status::from)
}

/// What a completion brings from its RPC.
struct Context {
    /// The caller's deadline, less the margin to answer in.
    caller_deadline: Option<Duration>,
    /// The caller's own trace context.
    inherited_trace: Vec<(String, String)>,
    started: Instant,
}

/// How far a completion got, for its record.
#[derive(Default)]
struct Routing {
    /// The server it went to.
    server: Option<String>,
    /// The prompt's definition hash (a prompt's completion).
    definition_hash: Option<String>,
    /// Whether the request was handed to the upstream session.
    sent: bool,
}

/// The server a completion goes to, and what it is about there.
struct Routed {
    /// The tenant object that built the catalog it was routed by.
    tenant: Arc<Tenant>,
    /// The server's index in that tenant's configuration.
    index: usize,
    /// The server's configured name.
    server: String,
    /// What the request named (for errors).
    target: Target,
    /// What is sent upstream.
    reference: CompletionRef,
}

/// Runs one completion: the request checked, admission, the target
/// resolved and permitted, the session, then the upstream request.
async fn run(
    authenticated: &Arc<Tenant>,
    request: &pb::CompleteRequest,
    context: &Context,
    (caller, subject): (&Caller, &Subject),
    routing: &mut Routing,
) -> Result<pb::CompleteResponse, CallError> {
    check(request)?;
    let _admission = authenticated
        .limiter
        .admit(subject)
        .await
        .map_err(|shed| CallError::Shed(shed, None))?;
    let routed = route(authenticated, request, context, (caller, subject), routing).await?;
    tracing::Span::current().record("server", routed.server.as_str());
    let Routed {
        tenant,
        index,
        server,
        target,
        reference,
    } = routed;
    let size = request.value.len()
        + request
            .context_arguments
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    let limit = tenant.limits().max_argument_bytes;
    if size > limit {
        return Err(CallError::ArgumentsTooLarge {
            tool: target,
            size,
            limit,
        });
    }
    let _server_slot = match tenant.server_limit(index) {
        None => None,
        Some(limit) => Some(
            limit
                .acquire(tenant.limiter.queue_timeout())
                .await
                .ok_or_else(|| {
                    CallError::Shed(
                        crate::registry::limits::Shed::ServerConcurrency(limit.limit()),
                        Some(server.clone()),
                    )
                })?,
        ),
    };
    let session = upstream_session::session(&tenant, index, subject, &target).await?;
    if session.server_capabilities().completions.is_none() {
        return Err(CallError::Unsupported {
            server,
            feature: Feature::Completions,
        });
    }
    let config = tenant.server(index);
    let remaining = context
        .caller_deadline
        .map(|d| d.saturating_sub(context.started.elapsed()));
    let deadline_exceeded = |sent| CallError::DeadlineExceeded {
        server: server.clone(),
        tool: target.clone(),
        after: context.started.elapsed(),
        sent,
    };
    if remaining.is_some_and(|r| r.is_zero()) {
        return Err(deadline_exceeded(false));
    }
    let timeout = remaining
        .unwrap_or(config.call_timeout)
        .min(config.max_call_timeout);
    let completion = CompletionRequest {
        reference,
        argument: request.argument_name.clone(),
        value: request.value.clone(),
        context: request
            .context_arguments
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    routing.sent = true;
    let answer = match session
        .complete(completion, timeout, context.inherited_trace.clone())
        .await
    {
        Ok(answer) => answer,
        Err(UpstreamError::Timeout(_))
            if remaining.is_some_and(|r| r <= config.max_call_timeout) =>
        {
            return Err(deadline_exceeded(true));
        }
        Err(error) => {
            if matches!(error, UpstreamError::Closed) || error.is_credential_failure() {
                routing.sent = false;
            }
            return Err(
                match upstream_session::failure(&tenant, index, &server, &target, subject, error) {
                    // Completion changes nothing upstream: safe to retry.
                    CallError::Upstream {
                        server,
                        tool,
                        error,
                        ..
                    } => CallError::Upstream {
                        server,
                        tool,
                        error,
                        idempotent: true,
                    },
                    other => other,
                },
            );
        }
    };
    let Completion {
        values,
        total,
        has_more,
    } = answer;
    let response = pb::CompleteResponse {
        values,
        total,
        has_more,
    };
    let size = prost::Message::encoded_len(&response);
    let limit = tenant.limits().max_message_bytes;
    if size > limit {
        return Err(CallError::ResponseTooLarge {
            server,
            tool: target,
            size,
            limit,
        });
    }
    Ok(response)
}

/// Refuses a request that names nothing to complete.
fn check(request: &pb::CompleteRequest) -> Result<(), CallError> {
    match &request.r#ref {
        None => Err(CallError::InvalidCompletion(
            "name a `prompt` or a `resource_template`",
        )),
        Some(pb::complete_request::Ref::Prompt(name)) if name.is_empty() => {
            Err(CallError::InvalidCompletion("`prompt` is empty"))
        }
        Some(pb::complete_request::Ref::ResourceTemplate(template))
            if template.server.is_empty() || template.uri_template.is_empty() =>
        {
            Err(CallError::InvalidCompletion(
                "`resource_template` needs its `server` and `uri_template`",
            ))
        }
        _ if request.argument_name.is_empty() => {
            Err(CallError::InvalidCompletion("`argument_name` is empty"))
        }
        _ => Ok(()),
    }
}

/// The server and upstream reference of the request's prompt or template,
/// once the caller is known to be permitted it.
async fn route(
    authenticated: &Arc<Tenant>,
    request: &pb::CompleteRequest,
    context: &Context,
    (caller, subject): (&Caller, &Subject),
    routing: &mut Routing,
) -> Result<Routed, CallError> {
    match &request.r#ref {
        Some(pb::complete_request::Ref::Prompt(name)) => {
            let Resolved { tenant, catalog } =
                resolve_when(authenticated, context.caller_deadline, |catalog| {
                    catalog.prompt(name).is_some()
                })
                .await?;
            let policy = tenant.policy();
            let permitted = |prompt: &crate::catalog::CatalogPrompt| {
                policy.is_none_or(|p| p.allows_prompt(caller, subject, prompt))
            };
            let not_permitted = |server: &str| CallError::NotPermitted {
                server: server.to_owned(),
                target: Target::prompt(name.clone()),
            };
            if let Some(prompt) = catalog.prompt(name) {
                routing.server = Some(prompt.server.clone());
                routing.definition_hash = Some(prompt.definition_hash.clone());
                if !permitted(prompt) {
                    return Err(not_permitted(&prompt.server));
                }
                return Ok(Routed {
                    index: prompt.server_index,
                    server: prompt.server.clone(),
                    target: Target::prompt(name.clone()),
                    reference: CompletionRef::Prompt(prompt.upstream_name.clone()),
                    tenant,
                });
            }
            // A prompt withheld for want of approval is named as such (to
            // a caller the policy permits it).
            if let Some((server, withheld)) = catalog.withheld_prompt(name) {
                routing.server = Some(server.name.clone());
                if !permitted(&withheld.prompt) {
                    return Err(not_permitted(&server.name));
                }
                return Err(CallError::DefinitionNotApproved {
                    server: server.name.clone(),
                    tool: Target::prompt(name.clone()),
                    definition_hash: withheld.prompt.definition_hash.clone(),
                    approved_hash: withheld.approved_hash.clone(),
                });
            }
            Err(CallError::PromptNotFound {
                name: quoted(name).into_owned(),
            })
        }
        Some(pb::complete_request::Ref::ResourceTemplate(template)) => {
            // A server still connecting may be the one named: wait for it
            // (within the caller's deadline), as a call does.
            let Resolved { tenant, .. } =
                resolve_when(authenticated, context.caller_deadline, |_| false).await?;
            let Some(index) = tenant.servers().position(|s| s.name == template.server) else {
                return Err(CallError::ServerNotFound {
                    server: quoted(&template.server).into_owned(),
                });
            };
            routing.server = Some(template.server.clone());
            // Matched and sent in its normal form.
            let uri_template = ResourceUri::template(&template.uri_template)?;
            let target = Target::template(uri_template.as_str());
            let permitted = tenant.policy().is_none_or(|p| {
                p.allows_resource(caller, subject, &template.server, &uri_template)
            });
            if !permitted {
                return Err(CallError::NotPermitted {
                    server: template.server.clone(),
                    target,
                });
            }
            Ok(Routed {
                index,
                server: template.server.clone(),
                target,
                reference: CompletionRef::Template(uri_template.into_string()),
                tenant,
            })
        }
        None => Err(CallError::InvalidCompletion(
            "name a `prompt` or a `resource_template`",
        )),
    }
}
