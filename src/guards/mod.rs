//! Guards: the gRPC services (`toolgate.guard.v1.GuardService`) a tenant or
//! a server references under `guards:`, asked about a call's request before
//! it goes upstream and about its answer before the worker sees it
//! ([guards.md](../../docs/guards.md)).
//!
//! [`Guards`] holds one client per configured guard, built once per
//! configuration generation; [`Chain`] is the ordered list one (tenant,
//! server) asks (the tenant's guards, then the server's not already
//! listed), run by [`Chain::request`] and [`Chain::response`]. A tenant
//! object keeps its chains, so a call in flight finishes with the chain it
//! started with while a reload builds new ones.

mod chain;
mod client;
mod reason;

use std::collections::HashMap;
use std::sync::Arc;

pub use chain::{Acted, CallInfo, GuardStop, Verdict};
pub use client::Guard;
pub use reason::{MAX_DENY_REASON, deny_reason};

use crate::config::GuardConfig;

/// Which half of a call a guard is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Before the request goes upstream: the arguments.
    Request,
    /// After the upstream answered: the result.
    Response,
}

impl Phase {
    /// `request` or `response` (metric labels, audit, errors).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Request => "request",
            Phase::Response => "response",
        }
    }

    fn wire(self) -> crate::pb::guard::Phase {
        match self {
            Phase::Request => crate::pb::guard::Phase::Request,
            Phase::Response => crate::pb::guard::Phase::Response,
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every configured guard's client, by name: one generation's.
#[derive(Debug, Default)]
pub struct Guards {
    by_name: HashMap<String, Arc<Guard>>,
}

impl Guards {
    /// A client for each of `configs` (nothing connects until a guard is
    /// first asked). A guard whose TLS settings cannot be built is kept,
    /// and every check of it fails (handled by its `failure`), with the
    /// reason logged now.
    #[must_use]
    pub fn new(configs: &[GuardConfig]) -> Self {
        let by_name = configs
            .iter()
            .map(|config| (config.name.clone(), Arc::new(Guard::new(config))))
            .collect();
        Self { by_name }
    }

    /// Whether no guard is configured.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The chain of a server: the guards named by `tenant` in order, then
    /// those of `server` not already listed. Names that are not guards are
    /// skipped (validation refuses them before a configuration is applied).
    #[must_use]
    pub fn chain(&self, tenant: &[String], server: &[String]) -> Chain {
        let mut guards: Vec<Arc<Guard>> = Vec::with_capacity(tenant.len() + server.len());
        for name in tenant.iter().chain(server) {
            if let Some(guard) = self.by_name.get(name)
                && !guards.iter().any(|g| g.name() == name)
            {
                guards.push(guard.clone());
            }
        }
        Chain {
            guards: guards.into(),
        }
    }
}

/// The ordered guards of one (tenant, server). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    guards: Arc<[Arc<Guard>]>,
}

impl Chain {
    /// Whether no guard is asked about `phase`.
    #[must_use]
    pub fn skips(&self, phase: Phase) -> bool {
        !self.guards.iter().any(|g| g.asks(phase))
    }

    /// The names of the guards, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(|g| g.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GuardFailure, GuardPhases};

    fn guard(name: &str, request: bool, response: bool) -> GuardConfig {
        GuardConfig {
            name: name.to_owned(),
            url: url::Url::parse("http://127.0.0.1:1").unwrap(),
            timeout: std::time::Duration::from_secs(1),
            failure: GuardFailure::Closed,
            phases: GuardPhases { request, response },
            token: None,
            tls: None,
        }
    }

    fn names(chain: &Chain) -> Vec<&str> {
        chain.names().collect()
    }

    #[test]
    fn a_chain_is_the_tenants_guards_then_the_servers_not_listed_yet() {
        let guards = Guards::new(&[
            guard("a", true, true),
            guard("b", true, false),
            guard("c", false, true),
        ]);
        let chain = guards.chain(&["b".into(), "a".into()], &["a".into(), "c".into()]);
        assert_eq!(names(&chain), ["b", "a", "c"]);
        assert!(!chain.skips(Phase::Request));
        let only_c = guards.chain(&[], &["c".into()]);
        assert!(only_c.skips(Phase::Request));
        assert!(!only_c.skips(Phase::Response));
        let none = guards.chain(&[], &[]);
        assert!(none.skips(Phase::Request) && none.skips(Phase::Response));
        // Names that are not guards (refused by validation) are skipped.
        assert_eq!(
            names(&guards.chain(&["zz".into()], &[])),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn a_guards_debug_never_shows_its_token() {
        let mut config = guard("a", true, true);
        config.token = Some(crate::config::Secret::new("guard-token-value"));
        let shown = format!("{:?}", Guards::new(&[config]));
        assert!(!shown.contains("guard-token-value"), "{shown}");
    }
}
