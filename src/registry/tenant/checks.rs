//! What a tenant's calls are held to: its policy, the guards of each
//! server, concurrency and size limits, and the redaction of credentials.

use std::sync::Arc;

use super::Tenant;
use crate::config::Limits;
use crate::registry::limits::Concurrency;

impl Tenant {
    /// The tenant's per-tool policy; `None` when it has no rules (every
    /// caller sees and calls every tool).
    pub fn policy(&self) -> Option<&Arc<crate::policy::Policy>> {
        self.policy.as_ref()
    }

    /// The tenant's call approval settings (`call_approvals`).
    pub fn call_approvals(&self) -> &super::CallApprovalSettings {
        &self.call_approvals
    }

    /// The tenant's idempotency key settings (`idempotency`).
    pub fn idempotency(&self) -> &crate::config::IdempotencyConfig {
        &self.idempotency
    }

    /// The guards asked about calls to server `index` (its chain as this
    /// tenant object was built: a call keeps it for both phases).
    pub fn guards(&self, index: usize) -> crate::guards::Chain {
        self.guards.get(index).cloned().unwrap_or_default()
    }

    /// The concurrency limit of server `index`, if any.
    pub fn server_limit(&self, index: usize) -> Option<&Concurrency> {
        self.slots.get(index).and_then(|s| s.limit.as_ref())
    }

    /// The gateway-wide size limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The tenant's credential redactor: the configuration's, and for a
    /// tenant of `tenants_dir` or the state store its own credentials too.
    pub fn redactor(&self) -> Arc<crate::credentials::Redactor> {
        self.redactor.load_full()
    }

    /// After a reload changed the configuration's redactor: a tenant of
    /// another source takes the new one with its own credentials.
    pub(in crate::registry) fn refresh_redactor(&self) {
        if let Some(own) = &self.own_credentials {
            self.redactor
                .store(Arc::new(self.spawner.redactor().load().merged(own)));
        }
    }
}
