//! `model_context_protocol.Mcp`: MCP's own gRPC transport (release 0.2.0
//! of `mcp-grpc-transport-proto`, the 2026-07-28 revision's messages),
//! served beside `toolgate.v1.ToolGateway` on the same listener, behind
//! the same authentication. It is an adapter, like `toolgate.v1`: its
//! listings are the caller's view of the tenant's federated catalog
//! (`server__name`), and `CallTool`, `GetPrompt`, `ReadResource` and
//! `Complete` are the same operations run through the one call pipeline
//! (policy, approvals, limits, guards, idempotency keys, audit, metrics),
//! answered in this transport's messages ([`outcome`]). Input rounds map
//! onto toolgate's rounds of questions ([`rounds`]); the routing headers
//! are checked against the request ([`headers`]). Errors carry the same
//! status codes and `ErrorInfo` reasons as on `toolgate.v1`.
//!
//! What the release does not carry, it does not get: tasks (a call never
//! becomes one), progress, pagination (every listing is whole) and
//! subscriptions are `toolgate.v1`'s.

mod content;
mod headers;
mod listing;
mod outcome;
mod rounds;
mod schema;
mod structs;

use tonic::{Request, Response, Status};

use super::{Gateway, caller_of};
use crate::calls::idempotency;
use crate::calls::{CallError, CompletionAsk, CompletionTarget, PromptGet, ResourceRead, ToolCall};
use crate::pb::mcp;

/// The service's full name (health reports it).
pub const SERVICE_NAME: &str = "model_context_protocol.Mcp";

/// The `Mcp` service: MCP's gRPC transport over the gateway's [`Gateway`]
/// (its calls, tenants and authentication).
#[derive(Debug, Clone)]
pub struct McpGateway {
    gateway: Gateway,
}

impl McpGateway {
    /// The transport over `gateway`'s calls.
    #[must_use]
    pub fn new(gateway: Gateway) -> Self {
        Self { gateway }
    }
}

/// An error as the status it ends the RPC with.
fn status(error: CallError) -> Status {
    Status::from(error)
}

#[tonic::async_trait]
impl mcp::mcp_server::Mcp for McpGateway {
    async fn list_tools(
        &self,
        request: Request<mcp::ListToolsRequest>,
    ) -> Result<Response<mcp::ListToolsResponse>, Status> {
        let (tenant, _busy) = self.gateway.listing_tenant(&request)?;
        let (caller, subject) = caller_of(&request);
        let (catalog, _, view) =
            super::tool_catalog(&tenant, &request, "Mcp/ListTools", (&caller, &subject)).await;
        Ok(Response::new(listing::tools(&catalog, view.as_deref())))
    }

    async fn list_prompts(
        &self,
        request: Request<mcp::ListPromptsRequest>,
    ) -> Result<Response<mcp::ListPromptsResponse>, Status> {
        let (tenant, _busy) = self.gateway.listing_tenant(&request)?;
        let catalog = super::settled_catalog(&tenant, &request, "Mcp/ListPrompts").await;
        let (caller, subject) = caller_of(&request);
        let view = super::caller_view(&tenant, &catalog, &caller, &subject);
        Ok(Response::new(listing::prompts(&catalog, |prompt| {
            view.as_deref()
                .is_none_or(|v| v.allows_prompt_name(&catalog, &prompt.name))
        })))
    }

    async fn list_resources(
        &self,
        request: Request<mcp::ListResourcesRequest>,
    ) -> Result<Response<mcp::ListResourcesResponse>, Status> {
        let (tenant, _busy) = self.gateway.listing_tenant(&request)?;
        super::settled_catalog(&tenant, &request, "Mcp/ListResources").await;
        let (caller, subject) = caller_of(&request);
        let listed = super::resources::everything(&tenant, &caller, &subject)
            .await
            .map_err(status)?;
        Ok(Response::new(listing::resources(listed)))
    }

    async fn list_resource_templates(
        &self,
        request: Request<mcp::ListResourceTemplatesRequest>,
    ) -> Result<Response<mcp::ListResourceTemplatesResponse>, Status> {
        let (tenant, _busy) = self.gateway.listing_tenant(&request)?;
        super::settled_catalog(&tenant, &request, "Mcp/ListResourceTemplates").await;
        let (caller, subject) = caller_of(&request);
        let listed = super::resources::everything(&tenant, &caller, &subject)
            .await
            .map_err(status)?;
        Ok(Response::new(listing::templates(listed)))
    }

    async fn call_tool(
        &self,
        request: Request<mcp::CallToolRequest>,
    ) -> Result<Response<mcp::CallToolResponse>, Status> {
        // What the request itself gets wrong is refused before the tenant
        // is used (the refusal audit layer records it).
        let body = request.get_ref();
        let Some(call) = &body.request else {
            return Err(status(CallError::McpRequestInvalid(
                "`request` is missing: it names the tool and holds its arguments".to_owned(),
            )));
        };
        headers::check(request.metadata(), headers::TOOL, &call.name).map_err(status)?;
        let input = rounds::input_fields(body.common.as_ref()).map_err(status)?;
        let arguments_json = match &call.arguments {
            Some(arguments) => {
                serde_json::Value::Object(structs::to_object(arguments.clone()).map_err(|e| {
                    status(CallError::McpRequestInvalid(format!(
                        "`request.arguments`: {e}"
                    )))
                })?)
                .to_string()
            }
            None => String::new(),
        };
        let key = request
            .metadata()
            .get(idempotency::KEY_METADATA)
            .map(|value| value.as_bytes().to_vec());
        let idempotency_key = idempotency::request_key(String::new(), key.as_deref())
            .map_err(|e| status(CallError::Keyed(e)))?;
        let (tenant, _busy) = self.gateway.tenant(&request)?;
        let origin = self.gateway.origin(&request, tenant, "Mcp/CallTool");
        let name = request
            .into_inner()
            .request
            .map(|r| r.name)
            .unwrap_or_default();
        let call = ToolCall {
            input,
            name,
            arguments_json,
            idempotency_key,
            ..ToolCall::default()
        };
        Ok(Response::new(self.gateway.calls.run(origin, call).await?))
    }

    async fn get_prompt(
        &self,
        request: Request<mcp::GetPromptRequest>,
    ) -> Result<Response<mcp::GetPromptResponse>, Status> {
        let body = request.get_ref();
        headers::check(request.metadata(), headers::PROMPT, &body.name).map_err(status)?;
        let input = rounds::input_fields(body.common.as_ref()).map_err(status)?;
        let (tenant, _busy) = self.gateway.tenant(&request)?;
        let origin = self.gateway.origin(&request, tenant, "Mcp/GetPrompt");
        let body = request.into_inner();
        let mut prompt = PromptGet::new(body.name, &body.arguments);
        prompt.input = input;
        Ok(Response::new(self.gateway.calls.run(origin, prompt).await?))
    }

    async fn read_resource(
        &self,
        request: Request<mcp::ReadResourceRequest>,
    ) -> Result<Response<mcp::ReadResourceResponse>, Status> {
        let body = request.get_ref();
        headers::check(request.metadata(), headers::RESOURCE, &body.uri).map_err(status)?;
        let input = rounds::input_fields(body.common.as_ref()).map_err(status)?;
        let named = listing::named_server(body.common.as_ref()).map_err(status)?;
        let (tenant, _busy) = self.gateway.tenant(&request)?;
        let origin = self.gateway.origin(&request, tenant, "Mcp/ReadResource");
        let uri = request.get_ref().uri.clone();
        let lookup = listing::Lookup::Resource(&uri);
        let read = match server_for(&request, &origin, named, lookup).await {
            Ok(server) => ResourceRead::new(server, uri, input),
            Err(listing::Unrouted(why)) => ResourceRead::unrouted(uri, why, input),
        };
        Ok(Response::new(self.gateway.calls.run(origin, read).await?))
    }

    async fn complete(
        &self,
        request: Request<mcp::CompletionRequest>,
    ) -> Result<Response<mcp::CompletionResponse>, Status> {
        let body = request.get_ref();
        let named = match (&body.prompt_reference, &body.resource_reference) {
            (Some(_), Some(_)) => {
                return Err(status(CallError::McpRequestInvalid(
                    "`prompt_reference` and `resource_reference` are both set: a completion is \
                     for one of them"
                        .to_owned(),
                )));
            }
            (Some(prompt), None) => Some(prompt.name.as_str()),
            (None, Some(resource)) => Some(resource.uri.as_str()),
            (None, None) => None,
        };
        if let Some(named) = named {
            headers::check(request.metadata(), headers::RESOURCE, named).map_err(status)?;
        }
        let server = listing::named_server(body.common.as_ref()).map_err(status)?;
        let (tenant, _busy) = self.gateway.tenant(&request)?;
        let origin = self.gateway.origin(&request, tenant, "Mcp/Complete");
        let mut unrouted = None;
        let target = match (&body.prompt_reference, &body.resource_reference) {
            (Some(prompt), _) => Some(CompletionTarget::Prompt(prompt.name.clone())),
            (None, Some(resource)) => {
                let lookup = listing::Lookup::Template(&resource.uri);
                let server = match server_for(&request, &origin, server, lookup).await {
                    Ok(server) => server,
                    Err(listing::Unrouted(why)) => {
                        unrouted = Some(why);
                        String::new()
                    }
                };
                Some(CompletionTarget::Template {
                    server,
                    uri_template: resource.uri.clone(),
                })
            }
            (None, None) => None,
        };
        let body = request.into_inner();
        let argument = body.argument.unwrap_or_default();
        let ask = CompletionAsk {
            target,
            argument: argument.name,
            value: argument.value,
            context: body.context.map(|c| c.arguments).unwrap_or_default(),
            unrouted,
        };
        Ok(Response::new(self.gateway.calls.run(origin, ask).await?))
    }
}

/// The server of a resource URI or template that came without one: the
/// one the request names in `toolgate/server`, else the one the caller's
/// listings show (once servers still connecting have settled, within the
/// caller's deadline).
///
/// # Errors
/// No one server lists it: why, for the refusal on record.
async fn server_for<T>(
    request: &Request<T>,
    origin: &crate::calls::Origin,
    named: Option<String>,
    lookup: listing::Lookup<'_>,
) -> Result<String, listing::Unrouted> {
    if let Some(server) = named {
        return Ok(server);
    }
    super::settled_catalog(&origin.tenant, request, origin.rpc).await;
    listing::route(&origin.tenant, &origin.caller, &origin.subject, lookup).await
}
