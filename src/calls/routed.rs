//! Where a call resolved to ([`Routed`]) and how far it got
//! ([`Reached`]): what the pipeline's steps after resolving share, and
//! what the call's record, metrics and a shutdown's status say of it.

use std::sync::Arc;

use super::error::{CallError, Target};
use crate::config::ServerConfig;
use crate::registry::Tenant;
use crate::telemetry::metrics::{TenantCalls, ToolCalls};
use crate::upstream::UpstreamError;

/// Where an operation resolved to: what the steps after resolving share.
pub(crate) struct Routed<E> {
    /// The tenant object that built the catalog the call routes by.
    pub(crate) tenant: Arc<Tenant>,
    /// The server's index in that tenant's configuration.
    pub(crate) index: usize,
    /// The server's configured name.
    pub(crate) server: String,
    /// What the server is asked for: the upstream tool or prompt name, the
    /// resource URI or template in normal form.
    pub(crate) upstream_name: String,
    /// What the caller named (for errors and metric labels).
    pub(crate) target: Target,
    /// The definition hash of the tool or prompt (`""`: none).
    pub(crate) definition_hash: String,
    /// Whether a retry is safe: a tool annotated `idempotentHint: true`,
    /// and every read, prompt and completion (they change nothing).
    pub(crate) idempotent: bool,
    /// What the kind keeps besides.
    pub(crate) kind: E,
}

impl<E> Routed<E> {
    /// The server's configuration.
    pub(crate) fn config(&self) -> &ServerConfig {
        self.tenant.server(self.index)
    }

    /// The server's failure of this call.
    pub(crate) fn upstream(&self, error: UpstreamError) -> CallError {
        CallError::Upstream {
            server: self.server.clone(),
            tool: self.target.clone(),
            error,
            idempotent: self.idempotent,
        }
    }
}

/// How far a call got: what its record, its metrics and a shutdown's
/// status say of it.
#[derive(Default)]
pub(crate) struct Reached {
    /// The server the target resolved to (or whose namespace it is in).
    pub(crate) server: Option<String>,
    /// The target's definition hash.
    pub(crate) definition_hash: Option<String>,
    /// Whether a retry is safe.
    pub(crate) idempotent: bool,
    /// Whether the request was handed to the upstream session.
    pub(crate) sent: bool,
    /// What the guards did, in order.
    pub(crate) guards: Vec<crate::guards::Acted>,
    /// The arguments sent upstream when a guard replaced them.
    pub(crate) replaced_arguments: Option<String>,
    /// The call approval the call spent (step 7).
    pub(crate) call_approval: Option<String>,
    /// The call approval a call that became a task asked for (step 7).
    pub(crate) asked_approval: Option<String>,
    /// The idempotency key the call claimed (step 6): its end is
    /// recorded on it.
    pub(crate) key: Option<super::idempotency::Claim>,
    /// What the key keeps of the call's answer (step 22).
    pub(crate) kept: Option<Vec<u8>>,
    /// What the result cache did: `hit` (answered from it, nothing sent)
    /// or `stored` (the server's result was kept).
    pub(crate) cache: Option<&'static str>,
    /// The tenant's call series (tool calls).
    pub(crate) series: Option<Arc<TenantCalls>>,
    /// The series of the tool a call resolved to (only then is the name
    /// a label value).
    pub(crate) tool_series: Option<Arc<ToolCalls>>,
}
