//! `GetPrompt` as an operation of the pipeline: a prompt of the caller's
//! catalog, with policy, approvals and its pin as for a tool, rendered by
//! its server (`prompts/get`, with the 2026-07-28 rounds of questions).

use rmcp::model::{GetPromptResult, JsonObject};

use super::Origin;
use super::error::{CallError, Feature, Target, quoted};
use super::pipeline::{Operation, Reached, Routed, Sending, Upstream};
use super::rounds::{InputFields, Method};
use super::route;
use super::viewer::Viewer;
use crate::catalog::{Catalog, CatalogPrompt, ServerState};
use crate::pb::guard::TargetKind;
use crate::registry::{Resolved, Tenant};
use crate::upstream::{PromptRequest, UpstreamError};

/// One prompt to render.
#[derive(Debug, Default)]
pub struct PromptGet {
    /// The exposed name.
    pub name: String,
    /// The arguments (strings), sorted by name: the digest and the sealed
    /// state do not depend on map order.
    pub arguments: JsonObject,
    /// The definition hash the caller's plan saw (empty: none pinned).
    pub definition_hash: String,
    /// Rounds of questions.
    pub input: InputFields,
}

impl PromptGet {
    /// A prompt `name` with `arguments` (any order).
    #[must_use]
    pub fn new<'a>(
        name: String,
        arguments: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Self {
        let mut sorted: Vec<_> = arguments.into_iter().collect();
        sorted.sort();
        Self {
            name,
            arguments: sorted
                .into_iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
            ..Self::default()
        }
    }

    fn changed(&self, prompt: &CatalogPrompt, pinned: &str) -> CallError {
        CallError::PromptDefinitionChanged {
            prompt: prompt.name.clone(),
            pinned_hash: pinned.to_owned(),
            current_hash: prompt.definition_hash.clone(),
        }
    }
}

/// Whether the policy lets the caller render `prompt`.
fn permitted(viewer: &Viewer<'_>, prompt: &CatalogPrompt) -> Result<(), CallError> {
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
}

impl Operation for PromptGet {
    type Output = GetPromptResult;
    type Extra = ();

    const FEATURE: Option<Feature> = Some(Feature::Prompts);
    const GUARDED: Option<TargetKind> = Some(TargetKind::Prompt);
    const ROUNDS: Option<Method> = Some(Method::GetPrompt);
    const IDEMPOTENT: bool = true;

    fn span(&self, tenant: &str) -> tracing::Span {
        super::rpc_span("GetPrompt", tenant)
    }

    fn describe(&self, record: &mut crate::audit::Record, _tenant: &crate::registry::Tenant) {
        record.prompt = Some(quoted(&self.name).into_owned());
    }

    fn audited_arguments(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(
            serde_json::to_string(&self.arguments)
                .unwrap_or_default()
                .into(),
        )
    }

    fn check(&self) -> Result<(), CallError> {
        if self.name.is_empty() || self.name.len() > super::error::MAX_TOOL_NAME {
            return Err(CallError::PromptNotFound {
                name: quoted(&self.name).into_owned(),
            });
        }
        Ok(())
    }

    async fn resolve(
        &self,
        origin: &Origin,
        reached: &mut Reached,
    ) -> Result<Routed<()>, CallError> {
        let name = self.name.as_str();
        let Resolved { tenant, catalog } =
            route::resolve_when(&origin.tenant, origin.deadline, |catalog| {
                catalog.prompt(name).is_some()
            })
            .await?;
        let viewer = Viewer {
            policy: tenant.policy().map(AsRef::as_ref),
            caller: &origin.caller,
            subject: &origin.subject,
        };
        let Some(prompt) = catalog.prompt(name) else {
            return Err(not_listed(&tenant, &catalog, name, &viewer, reached).await);
        };
        reached.server = Some(prompt.server.clone());
        reached.definition_hash = Some(prompt.definition_hash.clone());
        permitted(&viewer, prompt)?;
        if !self.definition_hash.is_empty() && self.definition_hash != prompt.definition_hash {
            return Err(self.changed(prompt, &quoted(&self.definition_hash)));
        }
        Ok(Routed {
            index: prompt.server_index,
            server: prompt.server.clone(),
            upstream_name: prompt.upstream_name.clone(),
            target: Target::prompt(name),
            definition_hash: prompt.definition_hash.clone(),
            // A prompt acts on nothing: a retry is safe.
            idempotent: true,
            tenant: tenant.clone(),
            kind: (),
        })
    }

    fn arguments(&self, routed: &Routed<()>, limit: usize) -> Result<JsonObject, CallError> {
        let size = serde_json::Value::Object(self.arguments.clone())
            .to_string()
            .len();
        if size > limit {
            return Err(CallError::ArgumentsTooLarge {
                tool: routed.target.clone(),
                size,
                limit,
            });
        }
        Ok(self.arguments.clone())
    }

    fn verdict(
        &self,
        routed: &Routed<()>,
        origin: &Origin,
        arguments: &JsonObject,
    ) -> crate::policy::Verdict {
        let Some(policy) = routed.tenant.policy() else {
            return crate::policy::Verdict::Allow;
        };
        if !policy.decides_prompt_at_call(&self.name) {
            return crate::policy::Verdict::Allow;
        }
        let catalog = routed.tenant.catalog();
        match catalog.prompt(&self.name) {
            Some(prompt) => {
                policy.decide_prompt(&origin.caller, &origin.subject, prompt, arguments)
            }
            // Gone since it resolved (a reload): nothing to decide on.
            None => crate::policy::Verdict::Deny {
                rule: "(the prompt is gone from the catalog)".to_owned(),
                failed: true,
            },
        }
    }

    fn input(&self) -> Option<&InputFields> {
        Some(&self.input)
    }

    fn definition_changed(&self, routed: &Routed<()>, _origin: &Origin) -> CallError {
        CallError::PromptDefinitionChanged {
            prompt: routed.target.name.clone(),
            pinned_hash: "the one its request_state was handed out for".to_owned(),
            current_hash: routed.definition_hash.clone(),
        }
    }

    async fn send(
        &self,
        sending: Sending<'_, ()>,
    ) -> Result<Result<Upstream<GetPromptResult>, UpstreamError>, CallError> {
        let mut sending = sending;
        let (input_responses, request_state) = sending.take_answers();
        let get = PromptRequest {
            name: sending.routed.upstream_name.clone(),
            arguments: sending.arguments,
            timeout: sending.timeout,
            accepts: sending.accepts,
            input_responses,
            request_state,
            inherited_trace: sending.origin.trace.clone(),
        };
        Ok(sending.session.get_prompt(&get).await.map(Upstream::from))
    }
}

/// Why `name`, not among the catalog's prompts, cannot be rendered:
/// withheld for want of approval, its server down, or unknown.
async fn not_listed(
    tenant: &Tenant,
    catalog: &Catalog,
    name: &str,
    viewer: &Viewer<'_>,
    reached: &mut Reached,
) -> CallError {
    if let Some((server, withheld)) = catalog.withheld_prompt(name) {
        if let Err(refused) = permitted(viewer, &withheld.prompt) {
            return refused;
        }
        reached.server = Some(server.name.clone());
        return CallError::DefinitionNotApproved {
            server: server.name.clone(),
            tool: Target::prompt(name),
            definition_hash: withheld.prompt.definition_hash.clone(),
            approved_hash: withheld.approved_hash.clone(),
        };
    }
    // A name in the namespace of a server that is down is unavailable.
    if let Some(server) = catalog.down_server_for(name) {
        reached.server = Some(server.name.clone());
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
                super::session::session(tenant, index, viewer.subject, &target, true).await
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
