//! The calls of `toolgate.v1`: `InvokeTool` (and the streams' calls),
//! `GetPrompt`, `ReadResource` and `Complete`, each its request turned
//! into an operation of [`crate::calls`] and run through the one
//! pipeline; the outcome comes back as this API's message
//! ([`super::outcome`]).

use tonic::{Request, Status};

use super::{Gateway, questions};
use crate::calls::{CompletionAsk, CompletionTarget, PromptGet, ResourceRead, Sinks, ToolCall};
use crate::pb;

/// Runs one tool call (`InvokeTool`, and the call of `InvokeToolStream`
/// and `InvokeToolInteractive`, whose `sinks` take its progress and
/// questions) for the tenant that `request` authenticated as.
///
/// # Errors
/// The status the call ends with.
pub(super) async fn invoke(
    gateway: &Gateway,
    request: Request<pb::InvokeToolRequest>,
    sinks: Sinks,
) -> Result<pb::InvokeToolResponse, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let rpc = match (&sinks.progress, &sinks.asker) {
        (_, Some(_)) => "InvokeToolInteractive",
        (Some(_), None) => "InvokeToolStream",
        (None, None) => "InvokeTool",
    };
    let origin = gateway.origin(&request, tenant, rpc);
    let metadata_key = request
        .metadata()
        .get(crate::calls::idempotency::KEY_METADATA)
        .map(|value| value.as_bytes().to_vec());
    let request = request.into_inner();
    let idempotency_key =
        crate::calls::idempotency::request_key(request.idempotency_key, metadata_key.as_deref())
            .map_err(crate::calls::CallError::Keyed)?;
    let call = ToolCall {
        input: questions::input_fields(
            request.accepts_input.as_ref(),
            &request.request_state,
            &request.input_responses,
        ),
        name: request.name,
        arguments_json: request.arguments_json,
        definition_hash: request.definition_hash,
        catalog_version: request.catalog_version,
        accepts_task: request.accepts_task,
        approval_id: request.approval_id,
        idempotency_key,
        sinks,
        ..ToolCall::default()
    };
    Ok(gateway.calls.run(origin, call).await?)
}

/// `GetPrompt`.
///
/// # Errors
/// The status the call ends with.
pub(super) async fn get_prompt(
    gateway: &Gateway,
    request: Request<pb::GetPromptRequest>,
) -> Result<pb::GetPromptResponse, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let origin = gateway.origin(&request, tenant, "GetPrompt");
    let request = request.into_inner();
    let mut prompt = PromptGet::new(request.name, &request.arguments);
    prompt.definition_hash = request.definition_hash;
    prompt.input = questions::input_fields(
        request.accepts_input.as_ref(),
        &request.request_state,
        &request.input_responses,
    );
    Ok(gateway.calls.run(origin, prompt).await?)
}

/// `ReadResource`.
///
/// # Errors
/// The status the call ends with.
pub(super) async fn read(
    gateway: &Gateway,
    request: Request<pb::ReadResourceRequest>,
) -> Result<pb::ReadResourceResponse, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let origin = gateway.origin(&request, tenant, "ReadResource");
    let request = request.into_inner();
    let input = questions::input_fields(
        request.accepts_input.as_ref(),
        &request.request_state,
        &request.input_responses,
    );
    let read = ResourceRead::new(request.server, request.uri, input);
    Ok(gateway.calls.run(origin, read).await?)
}

/// `Complete`.
///
/// # Errors
/// The status the call ends with.
pub(super) async fn complete(
    gateway: &Gateway,
    request: Request<pb::CompleteRequest>,
) -> Result<pb::CompleteResponse, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let origin = gateway.origin(&request, tenant, "Complete");
    let request = request.into_inner();
    let target = match request.r#ref {
        Some(pb::complete_request::Ref::Prompt(name)) => Some(CompletionTarget::Prompt(name)),
        Some(pb::complete_request::Ref::ResourceTemplate(template)) => {
            Some(CompletionTarget::Template {
                server: template.server,
                uri_template: template.uri_template,
            })
        }
        None => None,
    };
    let ask = CompletionAsk {
        target,
        argument: request.argument_name,
        value: request.value,
        context: request.context_arguments,
        unrouted: None,
    };
    Ok(gateway.calls.run(origin, ask).await?)
}
