//! How one caller reads a tenant's catalogs: under the policy of the
//! tenant object that built the snapshot, with its claims and subject
//! (what it sees, what it may call, the version it sees), for calls and
//! listings alike.

use std::borrow::Cow;
use std::sync::Arc;

use crate::callers::{Caller, Subject};
use crate::catalog::{Catalog, CatalogTool, SharedCatalog};
use crate::policy::{Policy, View};
use crate::registry::Tenant;

/// The policy `catalog` is read under: that of the tenant object that
/// built it (a reload may have replaced the caller's since it
/// authenticated).
pub(crate) fn policy_for(tenant: &Arc<Tenant>, catalog: &SharedCatalog) -> Option<Arc<Policy>> {
    if catalog.stamp() == tenant.stamp() {
        return tenant.policy().cloned();
    }
    match tenant.resolve(catalog.clone()) {
        Ok(resolved) => resolved.tenant.policy().cloned(),
        Err(_) => tenant.policy().cloned(),
    }
}

/// How one caller reads catalogs: under a policy (or none), with its
/// claims and subject.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Viewer<'a> {
    pub(crate) policy: Option<&'a Policy>,
    pub(crate) caller: &'a Caller,
    pub(crate) subject: &'a Subject,
}

impl Viewer<'_> {
    /// The caller's view of `catalog`; `None` when it sees every tool (no
    /// policy, or a policy that hides nothing from it).
    pub(crate) fn view(&self, catalog: &Catalog) -> Option<Arc<View>> {
        let view = crate::policy::caller_view(self.policy?, catalog, self.caller, self.subject);
        (!view.is_everything()).then_some(view)
    }

    /// Whether the caller may call `tool` (of `catalog`, or withheld from
    /// it): a lookup in its view when a listing evaluated one for this
    /// snapshot, else the policy's decision for this one tool.
    pub(crate) fn permits(&self, catalog: &Catalog, tool: &CatalogTool) -> bool {
        let Some(policy) = self.policy else {
            return true;
        };
        if let Some(index) = catalog.position(&tool.name)
            && std::ptr::eq(&catalog.tools()[index], tool)
            && let Some(view) =
                crate::policy::cached_view(policy, catalog, self.caller, self.subject)
        {
            return view.allows_index(index);
        }
        policy.allows(self.caller, self.subject, tool)
    }

    /// Whether the caller may call some tool of per-user server `server`
    /// (at `index` in the tenant's configuration), so that offering it an
    /// authorization URL makes sense: one of the server's tools in
    /// `catalog` (listed or withheld) when it has any; before it was ever
    /// listed, a tool of its namespace as far as the policy can tell
    /// without the definitions ([`crate::policy::Policy::may_allow_unlisted`]).
    pub(crate) fn permits_some_tool_of(
        &self,
        catalog: &Catalog,
        server: &crate::config::ServerConfig,
        index: usize,
    ) -> bool {
        let Some(policy) = self.policy else {
            return true;
        };
        let mut listed = catalog
            .tools()
            .iter()
            .filter(|t| t.server == server.name)
            .peekable();
        let withheld = catalog
            .servers()
            .iter()
            .find(|s| s.name == server.name)
            .map_or(&[][..], |s| s.withheld.as_slice());
        if listed.peek().is_some() || !withheld.is_empty() {
            return listed.any(|t| self.permits(catalog, t))
                || withheld.iter().any(|w| self.permits(catalog, &w.tool));
        }
        let namespace = crate::config::names::expose(&server.name, "*", server.bare);
        policy.may_allow_unlisted(
            self.caller,
            self.subject,
            &server.name,
            index,
            crate::policy::Unlisted::Namespace(&namespace),
        )
    }

    /// Whether the caller may call `name`, a tool of per-user server
    /// `server` (at `index`) that was never listed, as far as the policy
    /// can tell without its definition.
    pub(crate) fn may_call_unlisted(&self, name: &str, server: &str, index: usize) -> bool {
        self.policy.is_none_or(|policy| {
            policy.may_allow_unlisted(
                self.caller,
                self.subject,
                server,
                index,
                crate::policy::Unlisted::Name(name),
            )
        })
    }

    /// The catalog version the caller sees for `catalog`.
    pub(crate) fn version<'c>(&self, catalog: &'c Catalog) -> Cow<'c, str> {
        match self.view(catalog) {
            None => Cow::Borrowed(catalog.version()),
            Some(view) => Cow::Owned(view.version().to_owned()),
        }
    }

    /// A remembered catalog whose version, as this caller sees it, is
    /// `version`, with the caller's view of it.
    pub(crate) fn pinned(
        &self,
        tenant: &Tenant,
        version: &str,
    ) -> Option<(SharedCatalog, Option<Arc<View>>)> {
        if self.policy.is_none() {
            return tenant.catalog_with_version(version).map(|c| (c, None));
        }
        tenant.recent_catalogs().into_iter().find_map(|catalog| {
            let view = self.view(&catalog);
            let seen = view.as_ref().map_or(catalog.version(), |v| v.version());
            (seen == version).then(|| (catalog.clone(), view))
        })
    }
}

/// The tool exposed as `name` in `catalog`, if `view` (`None`: everything)
/// lets the caller see it.
pub(crate) fn seen<'c>(
    catalog: &'c Catalog,
    view: Option<&View>,
    name: &str,
) -> Option<&'c CatalogTool> {
    match view {
        Some(view) if !view.allows_name(catalog, name) => None,
        _ => catalog.get(name),
    }
}

/// `ListTools` of a JWT caller: each delegated server (`token_exchange`,
/// `identity_assertion`) whose tools nobody could list yet, and of which
/// the policy may let this caller call some tool, gets the caller's
/// session (its JWT exchanged, which wakes the listing), and the listing
/// waits for its tools (the exchange and the listing each at most `wait`,
/// so an authorization server that does not answer holds no listing
/// longer). The catalog to list: the one given, or a newer one with those
/// tools.
pub(crate) async fn open_delegated(
    tenant: &Arc<Tenant>,
    catalog: SharedCatalog,
    viewer: &Viewer<'_>,
    wait: std::time::Duration,
) -> SharedCatalog {
    let mut catalog = catalog;
    for (index, server) in tenant.servers().enumerate() {
        if !tenant.awaits_delegated_listing(index)
            || !viewer.permits_some_tool_of(&catalog, server, index)
        {
            continue;
        }
        // A failed exchange leaves the server as listed; a call to one of
        // its tools answers the failure (the `DELEGATION_*` reasons).
        let opened = tokio::time::timeout(wait, tenant.user_session(index, viewer.subject)).await;
        if matches!(opened, Ok(Ok(_))) {
            catalog = tenant.catalog_after_listing(index, wait).await;
        }
    }
    catalog
}
