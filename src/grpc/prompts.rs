//! `ListPrompts`: a tenant's prompts under exposed names, with policy and
//! approvals as for tools (`GetPrompt` is a call: [`super::calls`]).

use globset::GlobSet;
use tonic::{Request, Status};

use super::{Gateway, convert, listing};
use crate::calls::viewer::{self, Viewer};
use crate::catalog::CatalogPrompt;
use crate::pb;

/// `ListPrompts`.
pub(super) async fn list(
    gateway: &Gateway,
    request: Request<pb::ListPromptsRequest>,
) -> Result<pb::ListPromptsResponse, Status> {
    let (tenant, _busy) = gateway.listing_tenant(&request)?;
    let filter = Filter::new(request.get_ref())?;
    let catalog = super::settled_catalog(&tenant, &request, "ListPrompts").await;
    let (caller, subject) = super::caller_of(&request);
    let policy = viewer::policy_for(&tenant, &catalog);
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
    listing::show_circuits(gateway.calls().breakers(), &tenant, &subject, &mut servers);
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
