//! Where a tool call goes: the catalog snapshot a name resolves in (and
//! the tenant object that built it), a delegated server's first listing,
//! why a name cannot be routed (withheld, its server down, gone since the
//! caller's plan, unknown), plan pins and the policy. The pipeline runs
//! the call's steps ([`super::tool`] its resolve step); this file decides
//! its target.

use std::sync::Arc;
use std::time::Duration;

use super::LIST_SETTLE_WAIT;
use super::viewer::{self as listing, Viewer};
use crate::calls::error::{CallError, MAX_TOOL_NAME, Pin, quoted};
use crate::catalog::{Catalog, CatalogTool, ServerState, ServerStatus};
use crate::registry::{Resolved, Tenant, Unresolved};

/// What a tool call names and what its caller's plan pinned.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plan<'a> {
    /// The exposed name.
    pub(crate) name: &'a str,
    /// The definition hash the plan saw (empty: none pinned).
    pub(crate) definition_hash: &'a str,
    /// The catalog version the plan saw (empty: none pinned).
    pub(crate) catalog_version: &'a str,
}
use crate::upstream::UpstreamError;

/// Who a call acts for, and within what deadline: what routing a name
/// needs of the call.
#[derive(Clone, Copy)]
pub(crate) struct Caller<'a> {
    /// The caller.
    pub(crate) caller: &'a crate::callers::Caller,
    /// The subject it acts for.
    pub(crate) subject: &'a crate::callers::Subject,
    /// The caller's deadline, if it set one.
    pub(crate) deadline: Option<Duration>,
}

/// The tenant's catalog as a task RPC on tool `name` uses it: the tool in
/// it, approved, and permitted to this caller by the tenant's policy,
/// checked as a call is (the same refusals).
///
/// # Errors
/// The tool is not permitted, withheld, its server down, or gone.
pub(crate) async fn task_tool(
    authenticated: &Arc<Tenant>,
    name: &str,
    caller: &crate::callers::Caller,
    subject: &crate::callers::Subject,
) -> Result<Resolved, CallError> {
    let resolved = resolve(authenticated, name, None).await?;
    let viewer = Viewer {
        policy: resolved.tenant.policy().map(AsRef::as_ref),
        caller,
        subject,
    };
    match resolved.catalog.get(name) {
        Some(tool) => permitted(&viewer, &resolved.catalog, tool)?,
        None => {
            let request = Plan {
                name,
                ..Plan::default()
            };
            return Err(not_routable(
                &resolved.tenant,
                &resolved.catalog,
                &request,
                &viewer,
                &mut None,
            )
            .await);
        }
    }
    Ok(resolved)
}

/// Refuses a tool name that is empty or too long.
pub(crate) fn check_name(name: &str) -> Result<(), CallError> {
    if name.len() > MAX_TOOL_NAME {
        return Err(CallError::InvalidName {
            name: quoted(name).into_owned(),
            reason: "longer than 64 characters",
        });
    }
    if name.is_empty() {
        return Err(CallError::InvalidName {
            name: String::new(),
            reason: "empty",
        });
    }
    Ok(())
}

/// The catalog `name` is looked up in (waiting, within the caller's
/// deadline, for servers still connecting when it is not there yet), with
/// the tenant object that built it.
pub(crate) async fn resolve(
    authenticated: &Arc<Tenant>,
    name: &str,
    caller_deadline: Option<Duration>,
) -> Result<Resolved, CallError> {
    resolve_when(authenticated, caller_deadline, |catalog| {
        catalog.get(name).is_some()
    })
    .await
}

/// The tenant's catalog once `found` holds in it, or once no server is
/// still connecting (waiting at most the caller's deadline, at most
/// [`LIST_SETTLE_WAIT`]), with the tenant object that built it: what a
/// call, a prompt or a completion routes by.
///
/// # Errors
/// The tenant was removed by a reload (`UNAUTHENTICATED`), or reloaded
/// again and again while routing (`RELOADING`).
pub(crate) async fn resolve_when(
    authenticated: &Arc<Tenant>,
    caller_deadline: Option<Duration>,
    found: impl Fn(&Catalog) -> bool,
) -> Result<Resolved, CallError> {
    let mut catalog = authenticated.catalog();
    if !found(&catalog) && catalog.is_settling() {
        // A server that is still connecting may provide it.
        let wait = caller_deadline
            .unwrap_or(LIST_SETTLE_WAIT)
            .min(LIST_SETTLE_WAIT);
        catalog = authenticated.settled_catalog(wait).await;
    }
    // The catalog may have been built by a newer generation of the tenant
    // (a reload while the request waited): route through the tenant object
    // that built it, never by its index into another generation's servers.
    authenticated.resolve(catalog).map_err(unresolved)
}

/// The status of a catalog no tenant object could route by.
fn unresolved(error: Unresolved) -> CallError {
    match error {
        Unresolved::Removed => {
            CallError::Unauthenticated("the tenant was removed by a configuration reload")
        }
        Unresolved::Unsettled => CallError::Reloading,
    }
}

/// A call to a delegated server (`token_exchange`, `identity_assertion`)
/// whose tools nobody could list yet: the caller's session exchanges its
/// JWT, which wakes the listing, and the call waits for the tools (within
/// its deadline, at most [`LIST_SETTLE_WAIT`]) rather than answering
/// `UNAVAILABLE` to be retried. The policy is asked first: a caller it
/// denies the tool exchanges nothing. Anything else: `resolved` as it was.
///
/// # Errors
/// The exchange failed or was refused (the `DELEGATION_*` reasons), or
/// the tenant was reloaded away meanwhile.
pub(crate) async fn first_delegated_listing(
    resolved: Resolved,
    name: &str,
    who: &Caller<'_>,
) -> Result<Resolved, CallError> {
    let Resolved { tenant, catalog } = &resolved;
    if catalog.get(name).is_some() {
        return Ok(resolved);
    }
    let Some(server) = catalog.down_server_for(name) else {
        return Ok(resolved);
    };
    let Some(index) = tenant.servers().position(|s| s.name == server.name) else {
        return Ok(resolved);
    };
    let viewer = Viewer {
        policy: tenant.policy().map(AsRef::as_ref),
        caller: who.caller,
        subject: who.subject,
    };
    if !tenant.awaits_delegated_listing(index)
        || !viewer.may_call_unlisted(name, &server.name, index)
    {
        return Ok(resolved);
    }
    if let Err(error) = tenant.user_session(index, who.subject).await {
        return Err(token_failure(&server.name, name, who.subject, error));
    }
    let wait = who
        .deadline
        .unwrap_or(LIST_SETTLE_WAIT)
        .min(LIST_SETTLE_WAIT);
    let listed = tenant.catalog_after_listing(index, wait).await;
    tenant.resolve(listed).map_err(unresolved)
}

/// Why a name that is not in the catalog cannot be called: withheld for
/// want of approval, its server down, gone since the caller's plan, or
/// unknown.
pub(crate) async fn not_routable(
    tenant: &Tenant,
    catalog: &Catalog,
    request: &Plan<'_>,
    viewer: &Viewer<'_>,
    server_name: &mut Option<String>,
) -> CallError {
    let name = request.name;
    // A tool withheld for want of approval is named as such.
    if let Some((server, withheld)) = catalog.withheld(name) {
        if let Err(refused) = permitted(viewer, catalog, &withheld.tool) {
            return refused;
        }
        *server_name = Some(server.name.clone());
        return CallError::DefinitionNotApproved {
            server: server.name.clone(),
            tool: (name.to_owned()).into(),
            definition_hash: withheld.tool.definition_hash.clone(),
            approved_hash: withheld.approved_hash.clone(),
        };
    }
    // A tool of a server that is down is unavailable, not unknown.
    if let Some(server) = catalog.down_server_for(name) {
        *server_name = Some(server.name.clone());
        return server_down(tenant, server, name, viewer).await;
    }
    if let Some(gone) = gone_since_pin(tenant, request, viewer) {
        return gone;
    }
    CallError::ToolNotFound {
        name: name.to_owned(),
    }
}

/// The status of a call to `name` of `server`, which is down.
async fn server_down(
    tenant: &Tenant,
    server: &ServerStatus,
    name: &str,
    viewer: &Viewer<'_>,
) -> CallError {
    if let ServerState::AuthorizationRequired(_) = &server.state
        && let Some(index) = tenant.servers().position(|s| s.name == server.name)
    {
        // Policy before consent: a caller the policy denies this tool
        // (as far as it can tell without its definition) gets its
        // refusal, never an authorization URL (nor a consent flow).
        if !viewer.may_call_unlisted(name, &server.name, index) {
            return CallError::ToolNotPermitted {
                tool: name.to_owned(),
            };
        }
        // Nobody could list the server's tools yet: this subject
        // gets its authorization URL, or, having consented (perhaps
        // at another replica), wakes the listing; retry shortly.
        let subject = viewer.subject;
        return match tenant.user_session(index, subject).await {
            Err(error) => token_failure(&server.name, name, subject, error),
            Ok(_) => CallError::ServerUnavailable {
                server: server.name.clone(),
                tool: (name.to_owned()).into(),
                reason: "the server's tools are being listed after a first authorization"
                    .to_owned(),
            },
        };
    }
    CallError::ServerUnavailable {
        server: server.name.clone(),
        tool: (name.to_owned()).into(),
        reason: match &server.state {
            ServerState::Failed(reason) => reason.clone(),
            _ => "still connecting".to_owned(),
        },
    }
}

/// A failure to connect or to get a credential for `server`, before
/// anything was sent: a subject that must consent first gets the URL, a
/// state store that is down is retryable, anything else is the server's
/// failure (nothing sent).
pub(crate) fn token_failure(
    server: &str,
    tool: &str,
    subject: &crate::callers::Subject,
    error: UpstreamError,
) -> CallError {
    super::session::unsent_failure(server, &tool.into(), subject, error, false)
}

/// Refuses the call when the caller pinned a definition or catalog version
/// and this tool changed since.
///
/// Catalog versions are the caller's: the versions of its views under the
/// tenant's policy (the catalog's own when it has none).
pub(crate) fn check_pins(
    tenant: &Tenant,
    current: &Catalog,
    tool: &CatalogTool,
    request: &Plan<'_>,
    viewer: &Viewer<'_>,
) -> Result<(), CallError> {
    let current_version = || viewer.version(current);
    let refuse = |pin: Pin, detail: String| CallError::PlanOutdated {
        tool: tool.name.clone(),
        pin,
        detail,
        current_version: current_version().into_owned(),
        current_hash: tool.definition_hash.clone(),
    };
    if !request.definition_hash.is_empty() && request.definition_hash != tool.definition_hash {
        return Err(refuse(
            Pin::DefinitionChanged,
            format!(
                "the definition of `{}` changed since the plan (definition_hash {} is now {})",
                tool.name,
                quoted(request.definition_hash),
                tool.definition_hash
            ),
        ));
    }
    // A matching definition hash answers the question on its own: the
    // catalog version may be from before a restart or another replica.
    let hash_confirms =
        !request.definition_hash.is_empty() && request.definition_hash == tool.definition_hash;
    if !hash_confirms
        && !request.catalog_version.is_empty()
        && request.catalog_version != current_version()
    {
        let Some((pinned, view)) = viewer.pinned(tenant, request.catalog_version) else {
            return Err(refuse(
                Pin::VersionUnknown,
                format!(
                    "catalog_version {} is not known to this gateway (too old, or never served); \
                     the catalog is now {}",
                    quoted(request.catalog_version),
                    current_version()
                ),
            ));
        };
        match listing::seen(&pinned, view.as_deref(), &tool.name) {
            Some(then) if then.definition_hash == tool.definition_hash => {}
            Some(_) => {
                return Err(refuse(
                    Pin::DefinitionChanged,
                    format!(
                        "the definition of `{}` changed since catalog_version {}",
                        tool.name,
                        quoted(request.catalog_version)
                    ),
                ));
            }
            None => {
                return Err(refuse(
                    Pin::DefinitionChanged,
                    format!(
                        "`{}` was not in catalog_version {}: the plan cannot have used it",
                        tool.name,
                        quoted(request.catalog_version)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// For a name not in the catalog: TOOL_GONE when the caller's pins show
/// the tool existed when the plan was made.
fn gone_since_pin(tenant: &Tenant, request: &Plan<'_>, viewer: &Viewer<'_>) -> Option<CallError> {
    let current = tenant.catalog();
    let existed = if !request.catalog_version.is_empty() {
        viewer
            .pinned(tenant, request.catalog_version)
            .is_some_and(|(c, view)| listing::seen(&c, view.as_deref(), request.name).is_some())
    } else {
        // Only a hash this gateway has served for this name counts.
        !request.definition_hash.is_empty()
            && tenant.served_definition(request.name, request.definition_hash)
    };
    existed.then(|| CallError::PlanOutdated {
        tool: request.name.to_owned(),
        pin: Pin::Gone,
        detail: format!(
            "`{}` is gone from the catalog since the plan was made",
            request.name
        ),
        current_version: viewer.version(&current).into_owned(),
        current_hash: String::new(),
    })
}

/// Refuses a tool the tenant's policy does not let this caller call.
pub(crate) fn permitted(
    viewer: &Viewer<'_>,
    catalog: &Catalog,
    tool: &CatalogTool,
) -> Result<(), CallError> {
    if viewer.permits(catalog, tool) {
        Ok(())
    } else {
        Err(CallError::ToolNotPermitted {
            tool: tool.name.clone(),
        })
    }
}
