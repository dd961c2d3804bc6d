//! Filtered views of a catalog: ListTools/WatchTools filters, SearchTools
//! ranking, and the caller's view under the tenant's policy.

use globset::{Glob, GlobSet, GlobSetBuilder};
use tonic::Status;

use super::convert;
use super::reply::{self, EncodedTools, ListToolsReply};
use crate::calls::error::CallError;
use crate::calls::viewer::Viewer;
use crate::catalog::{Catalog, CatalogTool};
use crate::pb;
use crate::policy::View;

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

/// The glob set of a filter's `field` (`None` when it has no globs).
///
/// # Errors
/// INVALID_ARGUMENT (`INVALID_FILTER`) naming the glob that does not parse
/// and its place in `field`.
pub(super) fn glob_set(field: &str, globs: &[String]) -> Result<Option<GlobSet>, Status> {
    if globs.is_empty() {
        return Ok(None);
    }
    let mut builder = GlobSetBuilder::new();
    for (i, glob) in globs.iter().enumerate() {
        let parsed = Glob::new(glob).map_err(|e| {
            Status::from(CallError::InvalidFilter(format!(
                "{field}[{i}] `{}` is not a valid glob: {e}",
                crate::calls::error::quoted(glob)
            )))
        })?;
        builder.add(parsed);
    }
    builder
        .build()
        .map(Some)
        .map_err(|e| Status::from(CallError::InvalidFilter(format!("{field}: {e}"))))
}

impl Filter {
    /// Validates the request's filters.
    ///
    /// # Errors
    /// INVALID_ARGUMENT naming a glob that does not parse.
    pub(super) fn new(request: &pb::ListToolsRequest) -> Result<Self, Status> {
        let names = glob_set("name_globs", &request.name_globs)?;
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

/// The filtered catalog as a ListToolsResponse, as much of it as `view`
/// (the caller's view under the tenant's policy; `None`: everything) lets
/// the caller see. Without filters, the tools are encoded once per catalog
/// snapshot (once per distinct view under a policy) and written as they
/// are; only the small rest (version, server statuses) is encoded per
/// call. A filtered listing is built and encoded per call.
pub(super) fn list_response(
    catalog: &Catalog,
    filter: &Filter,
    view: Option<&View>,
) -> ListToolsReply {
    if !filter.is_empty() {
        let tools = listed_tools(catalog, filter, view);
        let mut message = rest_of_listing(catalog, view);
        message.total_estimated_tokens = reply::total_tokens(&tools);
        message.tools = tools;
        return ListToolsReply::built(message);
    }
    let tools = match view {
        None => catalog
            .derived(|c| Unfiltered(EncodedTools::encode(listed_tools(c, filter, None))))
            .0
            .clone(),
        Some(view) => catalog
            .derived(|_| ViewListings::default())
            .get_or_encode(view.version(), || {
                EncodedTools::encode(listed_tools(catalog, filter, Some(view)))
            }),
    };
    ListToolsReply::encoded(tools, rest_of_listing(catalog, view))
}

/// The encoded tools of a snapshot's unfiltered listing.
struct Unfiltered(EncodedTools);

/// Most distinct policy views whose encoded listing a snapshot keeps.
const MAX_ENCODED_VIEWS: usize = 16;

/// The encoded tools of a snapshot's distinct policy views, by view
/// version (callers with the same view share one), oldest evicted first.
#[derive(Default)]
struct ViewListings {
    encoded: std::sync::Mutex<std::collections::VecDeque<(String, EncodedTools)>>,
}

impl ViewListings {
    /// The view's encoded tools, encoded now (outside the lock) when not
    /// kept yet.
    fn get_or_encode(&self, version: &str, encode: impl FnOnce() -> EncodedTools) -> EncodedTools {
        let find = |kept: &std::collections::VecDeque<(String, EncodedTools)>| {
            kept.iter()
                .find(|(v, _)| v == version)
                .map(|(_, e)| e.clone())
        };
        if let Some(found) = find(&self.encoded.lock().expect("view listings lock")) {
            return found;
        }
        let encoded = encode();
        let mut kept = self.encoded.lock().expect("view listings lock");
        if let Some(found) = find(&kept) {
            return found;
        }
        if kept.len() >= MAX_ENCODED_VIEWS {
            kept.pop_front();
        }
        kept.push_back((version.to_owned(), encoded.clone()));
        encoded
    }
}

/// The tools `view` (`None`: everything) lets the caller see that pass
/// `filter`, in catalog order.
fn listed_tools(catalog: &Catalog, filter: &Filter, view: Option<&View>) -> Vec<pb::Tool> {
    match view {
        None => catalog
            .tools()
            .iter()
            .filter(|t| filter.allows(t))
            .map(convert::tool)
            .collect(),
        Some(view) => view
            .tools(catalog)
            .filter(|t| filter.allows(t))
            .map(convert::tool)
            .collect(),
    }
}

/// A listing's fields but its tools: the version the caller sees and each
/// server's status, with the count of the tools the caller sees.
fn rest_of_listing(catalog: &Catalog, view: Option<&View>) -> pb::ListToolsResponse {
    let mut servers = convert::server_statuses(catalog);
    if let Some(view) = view {
        for (index, status) in servers.iter_mut().enumerate() {
            status.tool_count = view.server_tool_count(index);
            status
                .withheld_tools
                .retain(|name| !view.hides_withheld(name));
        }
    }
    pb::ListToolsResponse {
        catalog_version: view.map_or(catalog.version(), View::version).to_owned(),
        servers,
        ..Default::default()
    }
}

/// Shows each server's circuit breaker (a per-user server's: `subject`'s)
/// in `servers`, the statuses of a listing of `tenant`.
pub(super) fn show_circuits(
    breakers: &crate::calls::breaker::Breakers,
    tenant: &crate::registry::Tenant,
    subject: &crate::callers::Subject,
    servers: &mut [pb::ServerStatus],
) {
    use crate::calls::breaker::Circuit;
    for (index, server) in tenant.servers().enumerate() {
        let Some(status) = servers.iter_mut().find(|s| s.name == server.name) else {
            continue;
        };
        let per_user = tenant.is_per_user(index).then(|| subject.key());
        let circuit = breakers.circuit(
            &tenant.name,
            &server.name,
            per_user,
            server.circuit_breaker.as_ref(),
        );
        let (state, retry_after) = match circuit {
            Circuit::Off => (pb::CircuitState::Disabled, None),
            Circuit::Closed => (pb::CircuitState::Closed, None),
            Circuit::Open { retry_after } => (pb::CircuitState::Open, Some(retry_after)),
            Circuit::HalfOpen => (pb::CircuitState::HalfOpen, None),
        };
        status.circuit = state.into();
        status.circuit_retry_after_ms =
            retry_after.map_or(0, |r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX));
    }
}

/// Shows, for each per-user server, whether the caller's subject has
/// authorized it: `AUTHORIZATION_REQUIRED` with the URL to consent at when
/// it has not. A server the tenant's policy permits the caller no tool of
/// gets no URL (none is made: no consent flow starts for it). The rest of
/// the listing is the tenant's.
pub(super) async fn show_consent(
    tenant: &crate::registry::Tenant,
    catalog: &Catalog,
    viewer: &Viewer<'_>,
    response: &mut ListToolsReply,
) {
    show_consent_in(tenant, catalog, viewer, &mut response.rest.servers).await;
}

/// [`show_consent`] in the server statuses of any listing (ListTools,
/// ListPrompts).
pub(super) async fn show_consent_in(
    tenant: &crate::registry::Tenant,
    catalog: &Catalog,
    viewer: &Viewer<'_>,
    servers: &mut [pb::ServerStatus],
) {
    use crate::registry::ConsentState;
    let subject = viewer.subject;
    for (index, server) in tenant.servers().enumerate() {
        if !tenant.is_per_user(index) {
            continue;
        }
        let Some(status) = servers.iter_mut().find(|s| s.name == server.name) else {
            continue;
        };
        if !viewer.permits_some_tool_of(catalog, server, index) {
            if status.state == i32::from(pb::ServerState::AuthorizationRequired) {
                status.error =
                    "the tenant's policy permits this caller no tool of this server: no \
                     authorization is offered"
                        .to_owned();
            }
            continue;
        }
        match tenant.consent_state(index, subject).await {
            ConsentState::Authorized => {}
            ConsentState::Required(url) => {
                status.state = pb::ServerState::AuthorizationRequired.into();
                status.connected = false;
                status.error = if subject.id().is_none() {
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
            // Issue 23: a delegated server this caller cannot use (no JWT).
            ConsentState::Delegation(reason) => {
                status.state = pb::ServerState::AuthorizationRequired.into();
                status.connected = false;
                status.error = reason;
            }
        }
    }
}

/// Ranks the filtered catalog (as much of it as `view` lets the caller
/// see) against the request's query.
pub(super) fn search(
    catalog: &Catalog,
    filter: &Filter,
    request: &pb::SearchToolsRequest,
    view: Option<&View>,
) -> pb::SearchToolsResponse {
    let limit = match request.limit {
        0 => DEFAULT_SEARCH_RESULTS,
        n => (n as usize).min(MAX_SEARCH_RESULTS),
    };
    let results = catalog
        .search(&request.query)
        .into_iter()
        .filter(|(tool, _)| filter.allows(tool))
        .filter(|(tool, _)| view.is_none_or(|v| v.allows_name(catalog, &tool.name)))
        .take(limit)
        .map(|(tool, score)| pb::ScoredTool {
            tool: Some(convert::tool(tool)),
            score: f64::from(score),
        })
        .collect();
    pb::SearchToolsResponse {
        results,
        catalog_version: view.map_or(catalog.version(), View::version).to_owned(),
    }
}
