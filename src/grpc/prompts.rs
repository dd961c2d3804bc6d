//! `ListPrompts` and `GetPrompt`: a tenant's prompts under exposed names,
//! with policy and approvals as for tools, and a prompt rendered by its
//! server (admission, limits, audit and the 2026-07-28 rounds of
//! questions as for a call).

use std::sync::Arc;
use std::time::{Duration, Instant};

use globset::GlobSet;
use tonic::{Request, Status};
use tracing::Instrument;

use super::call_audit::{AuditedCall, Progress};
use super::error::{CallError, Feature, MAX_TOOL_NAME, Target, quoted};
use super::listing::{self, Viewer};
use super::{
    Gateway, caller_timeout, convert, deadline_margin, input_round, input_state, questions,
    upstream_session,
};
use crate::catalog::{Catalog, CatalogPrompt, ServerState};
use crate::pb;
use crate::registry::{Resolved, Tenant};
use crate::telemetry::trace;
use crate::upstream::{PromptOutcome, PromptRequest, UpstreamError};

/// `ListPrompts`.
pub(super) async fn list(
    gateway: &Gateway,
    request: Request<pb::ListPromptsRequest>,
) -> Result<pb::ListPromptsResponse, Status> {
    let (tenant, _busy) = gateway.listing_tenant(&request)?;
    let filter = Filter::new(request.get_ref())?;
    let catalog = super::settled_catalog(&tenant, &request, "ListPrompts").await;
    let (caller, subject) = super::caller_of(&request);
    let policy = listing::policy_for(&tenant, &catalog);
    let viewer = Viewer {
        policy: policy.as_deref(),
        caller: &caller,
        subject: &subject,
    };
    // The caller's view of this snapshot, cached per snapshot and caller
    // (None: the policy hides nothing from it).
    let view = viewer.view(&catalog);
    let allowed = |prompt: &CatalogPrompt| {
        view.as_deref()
            .is_none_or(|v| v.allows_prompt_name(&catalog, &prompt.name))
    };
    let prompts = catalog
        .prompts()
        .iter()
        .filter(|p| filter.allows(p) && allowed(p))
        .map(prompt)
        .collect();
    let mut servers = convert::server_statuses(&catalog);
    for (status, server) in servers.iter_mut().zip(catalog.servers()) {
        // What this caller may use, as for tools.
        status.prompt_count = u32::try_from(
            catalog
                .prompts()
                .iter()
                .filter(|p| p.server == server.name && allowed(p))
                .count(),
        )
        .unwrap_or(u32::MAX);
        status.withheld_prompts = server
            .withheld_prompts
            .iter()
            .filter(|w| {
                view.as_deref()
                    .is_none_or(|v| !v.hides_withheld_prompt(&w.prompt.name))
            })
            .map(|w| w.prompt.name.clone())
            .collect();
        status.prompts_error = server.prompts_error.clone().unwrap_or_default();
    }
    listing::show_consent_in(&tenant, &catalog, &viewer, &mut servers).await;
    Ok(pb::ListPromptsResponse {
        prompts,
        // The caller's own: it changes when what this caller sees changes.
        prompts_version: view
            .as_deref()
            .map_or(catalog.prompts_version(), |v| v.prompts_version())
            .to_owned(),
        servers,
    })
}

/// One catalog prompt as a `Prompt` message.
fn prompt(prompt: &CatalogPrompt) -> pb::Prompt {
    pb::Prompt {
        name: prompt.name.clone(),
        server: prompt.server.clone(),
        title: prompt.title.clone(),
        description: prompt.description.clone(),
        arguments: prompt
            .arguments
            .iter()
            .map(|a| pb::PromptArgument {
                name: a.name.clone(),
                title: a.title.clone(),
                description: a.description.clone(),
                required: a.required,
            })
            .collect(),
        definition_hash: prompt.definition_hash.clone(),
    }
}

/// A validated ListPromptsRequest filter (as ListTools': servers and
/// globs over exposed names).
struct Filter {
    servers: Vec<String>,
    names: Option<GlobSet>,
}

impl Filter {
    /// # Errors
    /// INVALID_ARGUMENT naming a glob that does not parse.
    fn new(request: &pb::ListPromptsRequest) -> Result<Self, Status> {
        let names = super::listing::glob_set("name_globs", &request.name_globs)?;
        Ok(Self {
            servers: request.servers.clone(),
            names,
        })
    }

    fn allows(&self, prompt: &CatalogPrompt) -> bool {
        (self.servers.is_empty() || self.servers.contains(&prompt.server))
            && self.names.as_ref().is_none_or(|n| n.is_match(&prompt.name))
    }
}

/// `GetPrompt`.
pub(super) async fn get(
    gateway: &Gateway,
    request: Request<pb::GetPromptRequest>,
) -> Result<pb::GetPromptResponse, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let started = Instant::now();
    let arguments = arguments_object(&request.get_ref().arguments);
    let arguments_json = serde_json::Value::Object(arguments.clone()).to_string();
    let mut audited = AuditedCall::of(
        &gateway.audit,
        &request,
        &tenant,
        "GetPrompt",
        started,
        Some(&arguments_json),
    );
    let name = request.get_ref().name.clone();
    audited.describe(|record| record.prompt = Some(quoted(&name).into_owned()));
    let Some(_call) = gateway.drain.enter() else {
        let refused = Err(CallError::Draining);
        audited.finish(&refused, Progress::none()).await;
        return refused.map_err(Status::from);
    };
    let span = super::rpc_span("GetPrompt", &tenant.name);
    trace::continue_caller_trace(&span, request.metadata());
    audited.trace(&span, request.metadata());
    let (caller, subject) = super::caller_of(&request);
    let context = Context {
        gateway,
        caller_deadline: caller_timeout(&request).map(|t| t.saturating_sub(deadline_margin(t))),
        started,
        inherited_trace: trace::caller_context(request.metadata()),
        caller,
        subject,
        call_id: super::guarding::call_id(&span, request.metadata()),
    };
    let request = request.into_inner();
    let mut routing = Routing::default();
    let work = async {
        tokio::select! {
            result = render(&tenant, &request, arguments, &context, &mut routing, &mut audited) => result,
            () = gateway.abort.cancelled() => Err(CallError::ShuttingDown { sent: false, idempotent: false }),
        }
    };
    let mut result = work.instrument(span.clone()).await;
    if let Err(CallError::ShuttingDown { sent, .. }) = &mut result {
        *sent = routing.sent;
    }
    let progress = Progress {
        server: routing.server.as_deref(),
        definition_hash: routing.definition_hash.as_deref(),
        sent: routing.sent,
        idempotent: false,
    };
    if let Some(withheld) = audited.finish(&result, progress).await {
        result = Err(withheld);
    }
    gateway.metrics.request(
        &tenant.name,
        routing.server.as_deref(),
        "GetPrompt",
        match &result {
            Ok(_) => "ok",
            Err(error) => super::status::classify(error).1,
        },
    );
    span.in_scope(|| {
        if let Err(error) = &result {
            tracing::info!(%error, elapsed_ms = started.elapsed().as_millis() as u64, "GetPrompt failed");
        }
    });
    result.map_err(Status::from)
}

/// What a GetPrompt brings from its RPC.
struct Context<'a> {
    gateway: &'a Gateway,
    caller_deadline: Option<Duration>,
    started: Instant,
    inherited_trace: Vec<(String, String)>,
    caller: crate::callers::Caller,
    subject: crate::callers::Subject,
    /// toolgate's id of the call, as guards see it.
    call_id: String,
}

/// How far a GetPrompt got, for its audit record.
#[derive(Default)]
struct Routing {
    server: Option<String>,
    definition_hash: Option<String>,
    sent: bool,
}

/// The arguments as a JSON object of strings.
fn arguments_object(
    arguments: &std::collections::HashMap<String, String>,
) -> rmcp::model::JsonObject {
    // Sorted: the digest and the request state do not depend on map order.
    let mut sorted: Vec<_> = arguments.iter().collect();
    sorted.sort();
    sorted
        .into_iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect()
}

/// Renders one prompt: admission, the name, policy, approvals and pin,
/// arguments, the server's slot and session, the upstream `prompts/get`
/// within the deadline, and conversion.
async fn render(
    authenticated: &Arc<Tenant>,
    request: &pb::GetPromptRequest,
    arguments: rmcp::model::JsonObject,
    context: &Context<'_>,
    routing: &mut Routing,
    audited: &mut AuditedCall,
) -> Result<pb::GetPromptResponse, CallError> {
    let name = request.name.as_str();
    if name.is_empty() || name.len() > MAX_TOOL_NAME {
        return Err(CallError::PromptNotFound {
            name: quoted(name).into_owned(),
        });
    }
    let _admission = authenticated
        .limiter
        .admit(&context.subject)
        .await
        .map_err(|shed| CallError::Shed(shed, None))?;
    let Resolved { tenant, catalog } =
        super::call_route::resolve_when(authenticated, context.caller_deadline, |catalog| {
            catalog.prompt(name).is_some()
        })
        .await?;
    let viewer = Viewer {
        policy: tenant.policy().map(AsRef::as_ref),
        caller: &context.caller,
        subject: &context.subject,
    };
    let permitted = |prompt: &CatalogPrompt| {
        if viewer
            .policy
            .is_none_or(|p| p.allows_prompt(viewer.caller, viewer.subject, prompt))
        {
            Ok(())
        } else {
            Err(CallError::NotPermitted {
                server: prompt.server.clone(),
                target: Target::prompt(prompt.name.clone()),
            })
        }
    };
    let Some(prompt) = catalog.prompt(name) else {
        return Err(not_listed(&tenant, &catalog, name, &viewer, routing, permitted).await);
    };
    routing.server = Some(prompt.server.clone());
    routing.definition_hash = Some(prompt.definition_hash.clone());
    tracing::Span::current().record("server", prompt.server.as_str());
    permitted(prompt)?;
    let changed = |pinned: &str| CallError::PromptDefinitionChanged {
        prompt: prompt.name.clone(),
        pinned_hash: pinned.to_owned(),
        current_hash: prompt.definition_hash.clone(),
    };
    if !request.definition_hash.is_empty() && request.definition_hash != prompt.definition_hash {
        return Err(changed(&quoted(&request.definition_hash)));
    }
    let limit = tenant.limits().max_argument_bytes;
    let size = serde_json::Value::Object(arguments.clone())
        .to_string()
        .len();
    if size > limit {
        return Err(CallError::ArgumentsTooLarge {
            tool: Target::prompt(name),
            size,
            limit,
        });
    }
    let index = prompt.server_index;
    let server = tenant.server(index);
    let binding = input_state::Binding {
        method: input_state::Method::GetPrompt,
        tenant: tenant.name.clone(),
        subject: context.subject.key().to_owned(),
        server: prompt.server.clone(),
        upstream_tool: prompt.upstream_name.clone(),
        exposed_name: prompt.name.clone(),
        definition_hash: prompt.definition_hash.clone(),
        args_sha256: input_state::arguments_digest(&arguments),
    };
    let gateway = context.gateway;
    // A retry's state and answers are checked before anything is sent.
    let retry = input_round::open_retry(
        (&gateway.request_keys, &gateway.answered_rounds),
        &tenant,
        server,
        (&request.request_state, &request.input_responses),
        &binding,
        || changed("the one its request_state was handed out for"),
    )
    .await?;
    let _server_slot = match tenant.server_limit(index) {
        None => None,
        Some(limit) => Some(
            limit
                .acquire(tenant.limiter.queue_timeout())
                .await
                .ok_or_else(|| {
                    CallError::Shed(
                        crate::registry::limits::Shed::ServerConcurrency(limit.limit()),
                        Some(prompt.server.clone()),
                    )
                })?,
        ),
    };
    let target = Target::prompt(name);
    let session = upstream_session::session(&tenant, index, &context.subject, &target).await?;
    if session.server_capabilities().prompts.is_none() {
        return Err(CallError::Unsupported {
            server: prompt.server.clone(),
            feature: Feature::Prompts,
        });
    }
    // The guards' request phase (the prompt's arguments): before anything
    // is sent; the chain is kept for the response phase.
    let chain = tenant.guards(index);
    let mut acted = Vec::new();
    let redaction = session.redaction().clone();
    let redact = move |text: &str| redaction.redact(text).into_owned();
    let guard_info = crate::guards::CallInfo {
        tenant: &tenant.name,
        subject: &context.subject,
        caller: Some(&context.caller),
        target: super::guarding::target(
            crate::pb::guard::TargetKind::Prompt,
            name,
            &prompt.server,
            &prompt.upstream_name,
            &prompt.definition_hash,
        ),
        call_id: context.call_id.clone(),
        trace: super::guarding::trace_fields(&context.inherited_trace),
        redact: &redact,
        metrics: &gateway.metrics,
    };
    // A read or a prompt acts on nothing: a retry is safe.
    let stopped = |stop| CallError::guard(stop, Target::prompt(name), &prompt.server, true);
    let checked = chain
        .request(&guard_info, arguments, limit, &mut acted)
        .await;
    let replaced = checked
        .as_ref()
        .ok()
        .and_then(|arguments| super::guarding::replaced_arguments(&acted, arguments));
    audited.guarded(&acted, replaced.as_deref(), || tenant.redactor());
    let arguments = checked.map_err(stopped)?;
    audited.admit(false).await?;
    let (round, answered) =
        input_round::answered(retry, audited, &gateway.metrics, &binding, &tenant).await?;
    let remaining = context
        .caller_deadline
        .map(|d| d.saturating_sub(context.started.elapsed()));
    let deadline_exceeded = |sent| CallError::DeadlineExceeded {
        server: prompt.server.clone(),
        tool: Target::prompt(name),
        after: context.started.elapsed(),
        sent,
    };
    if remaining.is_some_and(|r| r.is_zero()) {
        return Err(deadline_exceeded(false));
    }
    let timeout = remaining
        .unwrap_or(server.call_timeout)
        .min(server.max_call_timeout);
    let allowed = crate::upstream::InputKinds {
        form: server.input.form,
        url: server.input.url,
        sampling: server.input.sampling,
    };
    let accepts = questions::accepts(request.accepts_input.as_ref()).and(allowed);
    let (input_responses, request_state) = match answered {
        Some((responses, state)) => (Some(responses), state),
        None => (None, None),
    };
    let get = PromptRequest {
        name: prompt.upstream_name.clone(),
        arguments,
        timeout,
        accepts,
        input_responses,
        request_state,
        inherited_trace: context.inherited_trace.clone(),
    };
    routing.sent = true;
    let result = session.get_prompt(&get).await;
    let result = input_round::not_accepted(result, &gateway.metrics, &binding)?;
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(UpstreamError::Timeout(_))
            if remaining.is_some_and(|r| r <= server.max_call_timeout) =>
        {
            return Err(deadline_exceeded(true));
        }
        Err(error) => {
            if matches!(error, UpstreamError::Closed) || error.is_credential_failure() {
                routing.sent = false;
            }
            return Err(upstream_session::failure(
                &tenant,
                index,
                &prompt.server,
                &target,
                &context.subject,
                error,
            ));
        }
    };
    let response = match outcome {
        PromptOutcome::Complete(result) => {
            // The guards' response phase, before conversion, the record and
            // the answer.
            let checked = chain
                .response(
                    &guard_info,
                    result,
                    tenant.limits().max_result_bytes,
                    &mut acted,
                )
                .await;
            audited.guarded(&acted, replaced.as_deref(), || tenant.redactor());
            let result = checked.map_err(stopped)?;
            rendered(result, &prompt.server).map_err(|reason| {
                upstream_session::failure(
                    &tenant,
                    index,
                    &prompt.server,
                    &target,
                    &context.subject,
                    UpstreamError::Protocol(reason),
                )
            })?
        }
        PromptOutcome::InputRequired(asked) => {
            let questions = input_round::Questions {
                keys: &gateway.request_keys,
                metrics: &gateway.metrics,
                binding: &binding,
                server,
                accepts,
                number: round,
            };
            let message = questions.hand_out(asked, audited, |reason| {
                upstream_session::failure(
                    &tenant,
                    index,
                    &prompt.server,
                    &target,
                    &context.subject,
                    UpstreamError::Protocol(reason),
                )
            })?;
            pb::GetPromptResponse {
                input_required: Some(message),
                ..Default::default()
            }
        }
    };
    let size = prost::Message::encoded_len(&response);
    let limit = tenant.limits().max_message_bytes;
    if size > limit {
        return Err(CallError::ResponseTooLarge {
            server: prompt.server.clone(),
            tool: Target::prompt(name),
            size,
            limit,
        });
    }
    Ok(response)
}

/// A rendered prompt as a GetPromptResponse: each message's content as
/// a tool result's would be (links and embedded resources name `server`).
///
/// # Errors
/// A message whose content cannot be carried (invalid base64), in words.
fn rendered(
    result: rmcp::model::GetPromptResult,
    server: &str,
) -> Result<pb::GetPromptResponse, String> {
    let messages = result
        .messages
        .into_iter()
        .map(|message| {
            let role = match message.role {
                rmcp::model::Role::User => pb::Role::User,
                rmcp::model::Role::Assistant => pb::Role::Assistant,
            };
            let content = convert::content(message.content, server).map_err(|e| e.to_string())?;
            Ok(pb::PromptMessage {
                role: role.into(),
                content: Some(content),
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(pb::GetPromptResponse {
        description: result.description.unwrap_or_default(),
        messages,
        input_required: None,
    })
}

/// Why `name`, not among the catalog's prompts, cannot be rendered:
/// withheld for want of approval, its server down, or unknown.
async fn not_listed(
    tenant: &Tenant,
    catalog: &Catalog,
    name: &str,
    viewer: &Viewer<'_>,
    routing: &mut Routing,
    permitted: impl Fn(&CatalogPrompt) -> Result<(), CallError>,
) -> CallError {
    if let Some((server, withheld)) = catalog.withheld_prompt(name) {
        if let Err(refused) = permitted(&withheld.prompt) {
            return refused;
        }
        routing.server = Some(server.name.clone());
        return CallError::DefinitionNotApproved {
            server: server.name.clone(),
            tool: Target::prompt(name),
            definition_hash: withheld.prompt.definition_hash.clone(),
            approved_hash: withheld.approved_hash.clone(),
        };
    }
    // A name in the namespace of a server that is down is unavailable.
    if let Some(server) = catalog.down_server_for(name) {
        routing.server = Some(server.name.clone());
        // A per-user server nobody could list yet: this subject gets its
        // authorization URL (the policy permitting, as far as it can tell
        // by the name), or, having consented, waits for the listing.
        if let ServerState::AuthorizationRequired(_) = &server.state
            && let Some(index) = tenant.servers().position(|s| s.name == server.name)
        {
            if !viewer.may_call_unlisted(name, &server.name, index) {
                return CallError::NotPermitted {
                    server: server.name.clone(),
                    target: Target::prompt(name),
                };
            }
            let target = Target::prompt(name);
            if let Err(refused) =
                upstream_session::session(tenant, index, viewer.subject, &target).await
            {
                return refused;
            }
            return CallError::ServerUnavailable {
                server: server.name.clone(),
                tool: target,
                reason: "the server's prompts are being listed after a first authorization"
                    .to_owned(),
            };
        }
        return CallError::ServerUnavailable {
            server: server.name.clone(),
            tool: Target::prompt(name),
            reason: match &server.state {
                ServerState::Failed(reason) | ServerState::AuthorizationRequired(reason) => {
                    reason.clone()
                }
                _ => "still connecting".to_owned(),
            },
        };
    }
    CallError::PromptNotFound {
        name: quoted(name).into_owned(),
    }
}
