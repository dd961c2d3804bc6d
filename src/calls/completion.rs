//! `Complete` as an operation of the pipeline: argument completion for a
//! prompt (as a call finds it: policy, approvals) or a resource template
//! of a server (its `server:uri` rule, the template in normal form),
//! `completion/complete` on the server's session, its values redacted and
//! bounded. A completion changes nothing upstream: a retry is safe. It has
//! no guard phases (guards are asked about tools, prompts and resources)
//! and no rounds of questions.

use std::collections::HashMap;

use rmcp::model::JsonObject;

use super::Origin;
use super::error::{CallError, Feature, Target, quoted};
use super::pipeline::{Operation, Reached, Routed, Sending, Upstream};
use super::rounds::Method;
use super::route::resolve_when;
use crate::pb::guard::TargetKind;
use crate::policy::ResourceUri;
use crate::registry::Resolved;
use crate::upstream::{Completion, CompletionRef, CompletionRequest, UpstreamError};

/// What a completion is about.
#[derive(Debug, Clone)]
pub enum CompletionTarget {
    /// A prompt of the caller's catalog, by its exposed name.
    Prompt(String),
    /// A resource template of a server.
    Template {
        /// The server's configured name.
        server: String,
        /// The URI template as asked.
        uri_template: String,
    },
}

/// One completion to ask for.
#[derive(Debug, Clone)]
pub struct CompletionAsk {
    /// What it is about (`None`: the request named nothing).
    pub target: Option<CompletionTarget>,
    /// The argument being completed.
    pub argument: String,
    /// What the caller typed so far.
    pub value: String,
    /// The values of the other arguments.
    pub context: HashMap<String, String>,
    /// Why no server could be found for a template that came without one
    /// (MCP's gRPC transport): the completion is refused
    /// (`MCP_REQUEST_INVALID`), on record, with it.
    pub unrouted: Option<String>,
}

/// The upstream reference of a routed completion.
pub(crate) struct Reference(CompletionRef);

impl Operation for CompletionAsk {
    type Output = Completion;
    type Extra = Reference;

    const FEATURE: Option<Feature> = Some(Feature::Completions);
    const GUARDED: Option<TargetKind> = None;
    const ROUNDS: Option<Method> = None;
    const IDEMPOTENT: bool = true;

    fn span(&self, tenant: &str) -> tracing::Span {
        super::rpc_span("Complete", tenant)
    }

    fn describe(&self, record: &mut crate::audit::Record, _tenant: &crate::registry::Tenant) {
        match &self.target {
            Some(CompletionTarget::Prompt(name)) => {
                record.prompt = Some(quoted(name).into_owned());
            }
            Some(CompletionTarget::Template { uri_template, .. }) => {
                // In its normal form, as the policy matched it (as asked,
                // when it has none).
                let normal = ResourceUri::template(uri_template)
                    .map_or_else(|_| uri_template.clone(), ResourceUri::into_string);
                record.uri_template = Some(Target::template(normal).name);
            }
            None => {}
        }
    }

    fn audited_arguments(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(
            serde_json::json!({
                "argument": self.argument,
                "value": self.value,
                "context": self.context,
            })
            .to_string()
            .into(),
        )
    }

    /// Refuses a request that names nothing to complete.
    fn check(&self) -> Result<(), CallError> {
        if let Some(why) = &self.unrouted {
            return Err(CallError::McpRequestInvalid(why.clone()));
        }
        match &self.target {
            None => Err(CallError::InvalidCompletion(
                "name a `prompt` or a `resource_template`",
            )),
            Some(CompletionTarget::Prompt(name)) if name.is_empty() => {
                Err(CallError::InvalidCompletion("`prompt` is empty"))
            }
            Some(CompletionTarget::Template {
                server,
                uri_template,
            }) if server.is_empty() || uri_template.is_empty() => {
                Err(CallError::InvalidCompletion(
                    "`resource_template` needs its `server` and `uri_template`",
                ))
            }
            _ if self.argument.is_empty() => {
                Err(CallError::InvalidCompletion("`argument_name` is empty"))
            }
            _ => Ok(()),
        }
    }

    /// The server and upstream reference of the prompt or template, once
    /// the caller is known to be permitted it.
    async fn resolve(
        &self,
        origin: &Origin,
        reached: &mut Reached,
    ) -> Result<Routed<Reference>, CallError> {
        let (caller, subject) = (&origin.caller, &origin.subject);
        match &self.target {
            Some(CompletionTarget::Prompt(name)) => {
                let Resolved { tenant, catalog } =
                    resolve_when(&origin.tenant, origin.deadline, |catalog| {
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
                    reached.server = Some(prompt.server.clone());
                    reached.definition_hash = Some(prompt.definition_hash.clone());
                    if !permitted(prompt) {
                        return Err(not_permitted(&prompt.server));
                    }
                    return Ok(Routed {
                        index: prompt.server_index,
                        server: prompt.server.clone(),
                        upstream_name: prompt.upstream_name.clone(),
                        target: Target::prompt(name.clone()),
                        definition_hash: prompt.definition_hash.clone(),
                        idempotent: true,
                        kind: Reference(CompletionRef::Prompt(prompt.upstream_name.clone())),
                        tenant: tenant.clone(),
                    });
                }
                // A prompt withheld for want of approval is named as such
                // (to a caller the policy permits it).
                if let Some((server, withheld)) = catalog.withheld_prompt(name) {
                    reached.server = Some(server.name.clone());
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
            Some(CompletionTarget::Template {
                server,
                uri_template,
            }) => {
                // A server still connecting may be the one named: wait for
                // it (within the caller's deadline), as a call does.
                let Resolved { tenant, .. } =
                    resolve_when(&origin.tenant, origin.deadline, |_| false).await?;
                let Some(index) = tenant.servers().position(|s| &s.name == server) else {
                    return Err(CallError::ServerNotFound {
                        server: quoted(server).into_owned(),
                    });
                };
                reached.server = Some(server.clone());
                // Matched and sent in its normal form.
                let uri_template = ResourceUri::template(uri_template)?;
                let target = Target::template(uri_template.as_str());
                let permitted = tenant
                    .policy()
                    .is_none_or(|p| p.allows_resource(caller, subject, server, &uri_template));
                if !permitted {
                    return Err(CallError::NotPermitted {
                        server: server.clone(),
                        target,
                    });
                }
                Ok(Routed {
                    index,
                    server: server.clone(),
                    upstream_name: uri_template.as_str().to_owned(),
                    target,
                    definition_hash: String::new(),
                    idempotent: true,
                    kind: Reference(CompletionRef::Template(uri_template.into_string())),
                    tenant: tenant.clone(),
                })
            }
            None => Err(CallError::InvalidCompletion(
                "name a `prompt` or a `resource_template`",
            )),
        }
    }

    fn arguments(&self, routed: &Routed<Reference>, limit: usize) -> Result<JsonObject, CallError> {
        let size = self.value.len()
            + self
                .context
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        if size > limit {
            return Err(CallError::ArgumentsTooLarge {
                tool: routed.target.clone(),
                size,
                limit,
            });
        }
        // What is sent is the completion request itself.
        Ok(JsonObject::new())
    }

    async fn send(
        &self,
        sending: Sending<'_, Reference>,
    ) -> Result<Result<Upstream<Completion>, UpstreamError>, CallError> {
        let completion = CompletionRequest {
            reference: sending.routed.kind.0.clone(),
            argument: self.argument.clone(),
            value: self.value.clone(),
            context: self
                .context
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        Ok(sending
            .session
            .complete(completion, sending.timeout, sending.origin.trace.clone())
            .await
            .map(Upstream::Complete))
    }
}
