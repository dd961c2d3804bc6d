//! Filtered views of a catalog: ListTools/WatchTools filters and
//! SearchTools ranking.

use globset::{Glob, GlobSet, GlobSetBuilder};
use tonic::Status;

use super::convert;
use crate::catalog::{Catalog, CatalogTool};
use crate::error::CallError;
use crate::pb;

/// Most results SearchTools returns.
const MAX_SEARCH_RESULTS: usize = 100;
/// Results when the request sets no limit.
const DEFAULT_SEARCH_RESULTS: usize = 10;

/// A validated ListToolsRequest filter.
#[derive(Debug, Default, Clone)]
pub(super) struct Filter {
    servers: Vec<String>,
    names: Option<GlobSet>,
    annotations: pb::AnnotationFilter,
}

impl Filter {
    /// Validates the request's filters.
    ///
    /// # Errors
    /// INVALID_ARGUMENT naming a glob that does not parse.
    pub(super) fn new(request: &pb::ListToolsRequest) -> Result<Self, Status> {
        let names =
            if request.name_globs.is_empty() {
                None
            } else {
                let mut builder = GlobSetBuilder::new();
                for (i, glob) in request.name_globs.iter().enumerate() {
                    let glob = Glob::new(glob).map_err(|e| {
                        Status::from(CallError::InvalidFilter(format!(
                            "name_globs[{i}] `{glob}` is not a valid glob: {e}"
                        )))
                    })?;
                    builder.add(glob);
                }
                Some(builder.build().map_err(|e| {
                    Status::from(CallError::InvalidFilter(format!("name_globs: {e}")))
                })?)
            };
        Ok(Self {
            servers: request.servers.clone(),
            names,
            annotations: request.annotations.unwrap_or_default(),
        })
    }

    /// Whether the filter lets everything through.
    fn is_empty(&self) -> bool {
        self.servers.is_empty()
            && self.names.is_none()
            && self.annotations == pb::AnnotationFilter::default()
    }

    /// Whether `tool` passes every filter.
    pub(super) fn allows(&self, tool: &CatalogTool) -> bool {
        if !self.servers.is_empty() && !self.servers.contains(&tool.server) {
            return false;
        }
        if let Some(names) = &self.names
            && !names.is_match(&tool.name)
        {
            return false;
        }
        // Unset hints take the MCP defaults.
        let a = &tool.annotations;
        let want = &self.annotations;
        let matches = |want: Option<bool>, have: Option<bool>, default: bool| {
            want.is_none_or(|w| w == have.unwrap_or(default))
        };
        matches(want.read_only, a.read_only, false)
            && matches(want.destructive, a.destructive, true)
            && matches(want.idempotent, a.idempotent, false)
            && matches(want.open_world, a.open_world, true)
    }
}

/// The filtered catalog as a ListToolsResponse. Without filters the
/// response is built once per catalog snapshot and cloned per call.
pub(super) fn list_response(catalog: &Catalog, filter: &Filter) -> pb::ListToolsResponse {
    if filter.is_empty() {
        return (*catalog.derived(|c| build_list_response(c, filter))).clone();
    }
    build_list_response(catalog, filter)
}

fn build_list_response(catalog: &Catalog, filter: &Filter) -> pb::ListToolsResponse {
    let tools: Vec<pb::Tool> = catalog
        .tools()
        .iter()
        .filter(|t| filter.allows(t))
        .map(convert::tool)
        .collect();
    let total_estimated_tokens = tools.iter().map(|t| t.estimated_tokens).sum();
    pb::ListToolsResponse {
        tools,
        catalog_version: catalog.version().to_owned(),
        servers: convert::server_statuses(catalog),
        total_estimated_tokens,
    }
}

/// Shows, for each per-user server, whether the caller's subject has
/// authorized it: `AUTHORIZATION_REQUIRED` with the URL to consent at when
/// it has not. The rest of the listing is the tenant's.
pub(super) async fn show_consent(
    tenant: &crate::registry::Tenant,
    subject: &str,
    response: &mut pb::ListToolsResponse,
) {
    use crate::registry::ConsentState;
    for (index, server) in tenant.servers().enumerate() {
        if !tenant.is_per_user(index) {
            continue;
        }
        let Some(status) = response.servers.iter_mut().find(|s| s.name == server.name) else {
            continue;
        };
        match tenant.consent_state(index, subject).await {
            ConsentState::Authorized => {}
            ConsentState::Required(url) => {
                status.state = pb::ServerState::AuthorizationRequired.into();
                status.connected = false;
                status.error = if subject.is_empty() {
                    "the tenant itself (no x-toolgate-subject) has not authorized this server: \
                     open authorization_url"
                        .to_owned()
                } else {
                    "this subject has not authorized this server: open authorization_url".to_owned()
                };
                status.authorization_url = url;
            }
            ConsentState::Unavailable(reason) => {
                status.error =
                    format!("whether this subject has authorized the server is unknown: {reason}");
            }
        }
    }
}

/// Ranks the filtered catalog against the request's query.
pub(super) fn search(
    catalog: &Catalog,
    filter: &Filter,
    request: &pb::SearchToolsRequest,
) -> pb::SearchToolsResponse {
    let limit = match request.limit {
        0 => DEFAULT_SEARCH_RESULTS,
        n => (n as usize).min(MAX_SEARCH_RESULTS),
    };
    let results = catalog
        .search(&request.query)
        .into_iter()
        .filter(|(tool, _)| filter.allows(tool))
        .take(limit)
        .map(|(tool, score)| pb::ScoredTool {
            tool: Some(convert::tool(tool)),
            score: f64::from(score),
        })
        .collect();
    pb::SearchToolsResponse {
        results,
        catalog_version: catalog.version().to_owned(),
    }
}
