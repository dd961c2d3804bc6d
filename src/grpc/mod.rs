//! The `toolgate.v1.ToolGateway` service. Handlers stay thin: find the
//! caller's tenant (put there by [`AuthLayer`]), then hand over to
//! [`call`] (one tool call), [`listing`] (filtered catalogs, search) or
//! [`stream`] (progress relay, catalog watch). Every error of the service
//! is a [`CallError`], turned into a status in [`status`] only.

mod auth_layer;
pub mod call_approvals;
mod calls;
mod consent;
pub mod convert;
mod interactive;
mod listing;
pub mod mcp;
mod outcome;
mod prompts;
mod questions;
pub mod reply;
pub(crate) mod resources;
mod skills;
pub mod status;
mod stream;
mod tasks;
mod watch_resource;

pub use auth_layer::{AuthLayer, AuthService};

/// Generated server code for `toolgate.v1` (see `build.rs`): the same
/// service as [`crate::pb`] describes, with `ListTools` and `WatchTools`
/// answering [`reply::ListToolsReply`], the same message on the wire as
/// [`crate::pb::ListToolsResponse`] with its tools encoded ahead.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/server/toolgate.v1.rs"));
}

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::calls::{CallError, Calls, LIST_SETTLE_WAIT, Origin, deadline_margin, rpc_span};
use crate::pb;
use crate::registry::{Busy, Tenant};
use crate::telemetry::trace;

/// The ToolGateway service: the `toolgate.v1` surface of [`Calls`].
#[derive(Debug, Clone)]
pub struct Gateway {
    calls: Calls,
}

impl Gateway {
    /// The service over `calls`. Callers' tenants come from [`AuthLayer`].
    #[must_use]
    pub fn new(calls: Calls) -> Self {
        Self { calls }
    }

    /// The calls it serves (what the CallApprovalsService shares).
    #[must_use]
    pub fn calls(&self) -> &Calls {
        &self.calls
    }

    /// The caller's tenant, marked busy and then used (a lazy tenant
    /// connects now). The guard keeps idle eviction away until it drops.
    fn tenant<T>(&self, request: &Request<T>) -> Result<(Arc<Tenant>, Busy), Status> {
        // Past authentication: the audit refusal layer records no refusal.
        if let Some(reached) = request.extensions().get::<crate::audit::Reached>() {
            reached.mark();
        }
        let tenant = request
            .extensions()
            .get::<Arc<Tenant>>()
            .cloned()
            .ok_or_else(|| Status::from(CallError::Unauthenticated("no credential was checked")))?;
        // Busy before activation: the reaper never closes a tenant with
        // calls in flight, and checks under the same lock as `activate`.
        let busy = tenant.busy();
        tenant.activate();
        Ok((tenant, busy))
    }

    /// The caller's tenant for a catalog RPC (ListTools, SearchTools,
    /// WatchTools): each takes one token from the subject's rate bucket
    /// (`limits.per_subject.rate_per_second`) and the tenant's
    /// (`limits.rate_per_second`), like a call; concurrency limits are for
    /// calls only.
    fn listing_tenant<T>(&self, request: &Request<T>) -> Result<(Arc<Tenant>, Busy), Status> {
        let (tenant, busy) = self.tenant(request)?;
        let (_, subject) = caller_of(request);
        tenant
            .limiter
            .check_rate(&subject)
            .map_err(|shed| Status::from(CallError::Shed(shed, None)))?;
        Ok((tenant, busy))
    }
}

impl Gateway {
    /// Who asks, for the pipeline: the caller's tenant (authenticated,
    /// marked busy by the caller of this), claims, subject, deadline,
    /// peer and trace context. `rpc` names the RPC.
    fn origin<T>(&self, request: &Request<T>, tenant: Arc<Tenant>, rpc: &'static str) -> Origin {
        let (caller, subject) = caller_of(request);
        Origin {
            tenant,
            caller,
            subject,
            deadline: Origin::deadline_of(caller_timeout(request)),
            started: std::time::Instant::now(),
            rpc,
            peer: request.remote_addr(),
            trace: trace::caller_context(request.metadata()),
        }
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

/// A server-streaming response.
type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl server::tool_gateway_server::ToolGateway for Gateway {
    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<reply::ListToolsReply>, Status> {
        let (tenant, _busy) = self.listing_tenant(&request)?;
        let filter = listing::Filter::new(request.get_ref())?;
        let (caller, subject) = caller_of(&request);
        let (catalog, policy, view) =
            tool_catalog(&tenant, &request, "ListTools", (&caller, &subject)).await;
        let viewer = crate::calls::viewer::Viewer {
            policy: policy.as_deref(),
            caller: &caller,
            subject: &subject,
        };
        let mut response = listing::list_response(&catalog, &filter, view.as_deref());
        listing::show_consent(&tenant, &catalog, &viewer, &mut response).await;
        listing::show_circuits(
            self.calls.breakers(),
            &tenant,
            &subject,
            &mut response.rest.servers,
        );
        Ok(Response::new(response))
    }

    async fn invoke_tool(
        &self,
        request: Request<pb::InvokeToolRequest>,
    ) -> Result<Response<pb::InvokeToolResponse>, Status> {
        calls::invoke(self, request, crate::calls::Sinks::default())
            .await
            .map(Response::new)
    }

    type InvokeToolStreamStream = EventStream<pb::InvokeToolEvent>;

    async fn invoke_tool_stream(
        &self,
        request: Request<pb::InvokeToolRequest>,
    ) -> Result<Response<Self::InvokeToolStreamStream>, Status> {
        // Authenticate before the stream starts.
        self.tenant(&request)?;
        Ok(Response::new(stream::invoke_with_progress(
            self.clone(),
            request,
        )))
    }

    type InvokeToolInteractiveStream = EventStream<pb::InvokeToolEvent>;

    async fn invoke_tool_interactive(
        &self,
        request: Request<tonic::Streaming<pb::InteractiveRequest>>,
    ) -> Result<Response<Self::InvokeToolInteractiveStream>, Status> {
        interactive::start(self.clone(), request)
            .await
            .map(Response::new)
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let (tenant, _busy) = self.listing_tenant(&request)?;
        let origin = self.origin(&request, tenant, "GetTask");
        let rpc = self.calls.task_call(&origin);
        let task = crate::calls::tasks::get(&rpc, &request.get_ref().task_id)
            .instrument(rpc_span("GetTask", &origin.tenant.name))
            .await?;
        tasks::task(task, &origin.tenant)
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn update_task(
        &self,
        request: Request<pb::UpdateTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let (tenant, _busy) = self.listing_tenant(&request)?;
        let origin = self.origin(&request, tenant, "UpdateTask");
        let rpc = self.calls.task_call(&origin);
        let request = request.get_ref();
        let responses = questions::responses(&request.input_responses);
        let task = crate::calls::tasks::update(&rpc, &request.task_id, &responses)
            .instrument(rpc_span("UpdateTask", &origin.tenant.name))
            .await?;
        tasks::task(task, &origin.tenant)
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let (tenant, _busy) = self.listing_tenant(&request)?;
        let origin = self.origin(&request, tenant, "CancelTask");
        let rpc = self.calls.task_call(&origin);
        let task = crate::calls::tasks::cancel(&rpc, &request.get_ref().task_id)
            .instrument(rpc_span("CancelTask", &origin.tenant.name))
            .await?;
        tasks::task(task, &origin.tenant)
            .map(Response::new)
            .map_err(Status::from)
    }

    type WatchToolsStream = EventStream<reply::ListToolsReply>;

    async fn watch_tools(
        &self,
        request: Request<pb::WatchToolsRequest>,
    ) -> Result<Response<Self::WatchToolsStream>, Status> {
        // Busy while the watch starts; an open watch does not keep a lazy
        // tenant's sessions from idle eviction (it then shows them idle).
        let (tenant, _busy) = self.listing_tenant(&request)?;
        let filter = nested_filter(request.get_ref().filter.as_ref())?;
        let (caller, subject) = caller_of(&request);
        let standing = request.extensions().get::<auth_layer::Standing>().cloned();
        Ok(Response::new(stream::watch(
            tenant,
            filter,
            (caller, subject),
            standing,
            self.calls.drain().clone(),
        )))
    }

    async fn complete_authorization(
        &self,
        request: Request<pb::CompleteAuthorizationRequest>,
    ) -> Result<Response<pb::CompleteAuthorizationResponse>, Status> {
        // One token of the tenant's rate, like a listing: codes cannot be
        // guessed (256 bits), but nothing here should be free.
        let (tenant, _busy) = self.listing_tenant(&request)?;
        let (_, subject) = caller_of(&request);
        consent::complete_authorization(&tenant, &subject, &request.get_ref().code)
            .instrument(rpc_span("CompleteAuthorization", &tenant.name))
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn search_tools(
        &self,
        request: Request<pb::SearchToolsRequest>,
    ) -> Result<Response<pb::SearchToolsResponse>, Status> {
        let (tenant, _busy) = self.listing_tenant(&request)?;
        let filter = nested_filter(request.get_ref().filter.as_ref())?;
        let catalog = settled_catalog(&tenant, &request, "SearchTools").await;
        let (caller, subject) = caller_of(&request);
        let view = caller_view(&tenant, &catalog, &caller, &subject);
        Ok(Response::new(listing::search(
            &catalog,
            &filter,
            request.get_ref(),
            view.as_deref(),
        )))
    }
    async fn list_resources(
        &self,
        request: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesResponse>, Status> {
        resources::list(self, request).await.map(Response::new)
    }

    async fn read_resource(
        &self,
        request: Request<pb::ReadResourceRequest>,
    ) -> Result<Response<pb::ReadResourceResponse>, Status> {
        calls::read(self, request).await.map(Response::new)
    }

    type WatchResourceStream = EventStream<pb::ResourceUpdate>;

    async fn watch_resource(
        &self,
        request: Request<pb::WatchResourceRequest>,
    ) -> Result<Response<Self::WatchResourceStream>, Status> {
        watch_resource::start(self, request)
            .await
            .map(Response::new)
    }

    async fn list_prompts(
        &self,
        request: Request<pb::ListPromptsRequest>,
    ) -> Result<Response<pb::ListPromptsResponse>, Status> {
        prompts::list(self, request).await.map(Response::new)
    }

    async fn get_prompt(
        &self,
        request: Request<pb::GetPromptRequest>,
    ) -> Result<Response<pb::GetPromptResponse>, Status> {
        calls::get_prompt(self, request).await.map(Response::new)
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        calls::complete(self, request).await.map(Response::new)
    }

    async fn list_skills(
        &self,
        request: Request<pb::ListSkillsRequest>,
    ) -> Result<Response<pb::ListSkillsResponse>, Status> {
        skills::list(self, request).await.map(Response::new)
    }

    async fn get_skill(
        &self,
        request: Request<pb::GetSkillRequest>,
    ) -> Result<Response<pb::GetSkillResponse>, Status> {
        skills::get(self, request).await.map(Response::new)
    }
}

/// Who is calling (put there by [`AuthLayer`]) and for whom. A request
/// that did not pass authentication has no claims.
fn caller_of<T>(request: &Request<T>) -> (crate::callers::Caller, crate::callers::Subject) {
    let caller = request
        .extensions()
        .get::<crate::callers::Caller>()
        .cloned()
        .unwrap_or_else(|| crate::callers::Caller::static_token(0));
    let subject = request
        .extensions()
        .get::<crate::callers::Subject>()
        .cloned()
        .unwrap_or_default();
    (caller, subject)
}

/// The filter a request carries as its `filter` field (unset: every tool).
fn nested_filter(filter: Option<&pb::ListToolsRequest>) -> Result<listing::Filter, Status> {
    match filter {
        Some(filter) => listing::Filter::new(filter),
        None => listing::Filter::new(&pb::ListToolsRequest::default()),
    }
}

/// The tenant's catalog for a catalog RPC (`method`), once servers still
/// connecting have settled (within the caller's deadline), in the RPC's
/// span, which continues the caller's trace.
async fn settled_catalog<T>(
    tenant: &Tenant,
    request: &Request<T>,
    method: &'static str,
) -> crate::catalog::SharedCatalog {
    let span = rpc_span(method, &tenant.name);
    trace::continue_caller_trace(&span, request.metadata());
    let wait = settle_wait(request);
    tenant.settled_catalog(wait).instrument(span).await
}

/// The catalog a tool listing (`method`) answers from, settled within the
/// caller's deadline, with a delegated subject's per-user servers opened;
/// the policy it is read under, and what of it the caller sees (`None`:
/// everything).
async fn tool_catalog<T>(
    tenant: &Arc<Tenant>,
    request: &Request<T>,
    method: &'static str,
    (caller, subject): (&crate::callers::Caller, &crate::callers::Subject),
) -> (
    crate::catalog::SharedCatalog,
    Option<Arc<crate::policy::Policy>>,
    Option<Arc<crate::policy::View>>,
) {
    let catalog = settled_catalog(tenant, request, method).await;
    let policy = crate::calls::viewer::policy_for(tenant, &catalog);
    let viewer = crate::calls::viewer::Viewer {
        policy: policy.as_deref(),
        caller,
        subject,
    };
    let catalog = if request
        .extensions()
        .get::<crate::callers::SubjectToken>()
        .is_some()
    {
        crate::calls::viewer::open_delegated(tenant, catalog, &viewer, settle_wait(request)).await
    } else {
        catalog
    };
    let view = viewer.view(&catalog);
    (catalog, policy, view)
}

/// What of `catalog` this caller sees under the tenant's policy (`None`:
/// everything).
fn caller_view(
    tenant: &Arc<Tenant>,
    catalog: &crate::catalog::SharedCatalog,
    caller: &crate::callers::Caller,
    subject: &crate::callers::Subject,
) -> Option<Arc<crate::policy::View>> {
    let policy = crate::calls::viewer::policy_for(tenant, catalog);
    let viewer = crate::calls::viewer::Viewer {
        policy: policy.as_deref(),
        caller,
        subject,
    };
    viewer.view(catalog)
}

/// How long a listing waits for servers still connecting.
fn settle_wait<T>(request: &Request<T>) -> Duration {
    caller_timeout(request)
        .map(|t| t.saturating_sub(deadline_margin(t)))
        .unwrap_or(LIST_SETTLE_WAIT)
        .min(LIST_SETTLE_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

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
