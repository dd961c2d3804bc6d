//! The calls: every request that reaches a server on a caller's behalf
//! (a tool call, a prompt, a resource read, a completion, and the task
//! verbs), taken through one pipeline of named steps below every API
//! surface ([`pipeline::run`]; the steps are listed in
//! `docs/architecture.md`, "The way of one call").
//!
//! A surface (the `toolgate.v1` gRPC service today) turns its request
//! into an [`Origin`] (who asks, within what deadline) and an operation
//! of this layer ([`ToolCall`], [`PromptGet`], [`ResourceRead`],
//! [`CompletionAsk`]), hands both to [`Calls::run`], and turns the
//! [`Outcome`] it gets back into its own messages through [`Reply`].
//! Nothing here knows protobuf; every failure is a [`CallError`], whose
//! code and stable reason [`classify`] gives.

pub mod approval;
pub mod breaker;
pub(crate) mod cache;
mod classify;
mod completion;
pub mod drain;
pub mod error;
mod guards;
pub mod idempotency;
mod operation;
mod pipeline;
mod prompt;
mod read;
mod record;
pub mod rounds;
mod route;
mod routed;
pub(crate) mod session;
mod skill;
pub mod tasks;
mod tool;
pub(crate) mod viewer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

pub use approval::decide::{ApprovalShown, ApprovalView, Approver};
pub use approval::{ApprovalNotice, ApprovalSink, Approving};
pub use classify::{caller_message, classify};
pub use completion::{CompletionAsk, CompletionTarget};
pub use error::CallError;
pub use pipeline::{Outcome, Recorded, Reply, Unencodable};
pub use prompt::PromptGet;
pub use read::ResourceRead;
pub(crate) use record::{AuditedCall, Progress};
pub use rounds::{InputFields, InputResponse, Questions};
pub use skill::{FetchedSkill, SkillGet, relative_path};
pub use tasks::{Task, TaskCall};
pub use tool::parse_arguments;
pub use tool::{ProgressSink, Sinks, ToolCall};

use crate::callers::{Caller, Subject};
use crate::registry::Tenant;
use crate::telemetry::Metrics;

/// How long a request waits for servers that are still connecting when
/// the caller set no deadline.
pub const LIST_SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Answer a little before the caller's deadline, so that the caller gets
/// our DEADLINE_EXCEEDED (with details) rather than its own cut-off: 5 % of
/// the deadline, at least 20 ms and at most 250 ms.
#[must_use]
pub fn deadline_margin(deadline: Duration) -> Duration {
    (deadline / 20).clamp(Duration::from_millis(20), Duration::from_millis(250))
}

/// The span of one RPC (`method`) of `tenant`'s: its server and outcome
/// are recorded as they become known.
#[must_use]
pub fn rpc_span(method: &'static str, tenant: &str) -> tracing::Span {
    tracing::info_span!(
        "rpc",
        otel.name = format!("toolgate.v1.ToolGateway/{method}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = "toolgate.v1.ToolGateway",
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
        tenant = %tenant,
        server = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// Who asks, and within what: what a surface hands the pipeline with the
/// operation.
#[derive(Debug, Clone)]
pub struct Origin {
    /// The caller's tenant (as authenticated; the pipeline routes through
    /// the tenant object that built the catalog it resolves in).
    pub tenant: Arc<Tenant>,
    /// Who is calling: the policy reads its claims.
    pub caller: Caller,
    /// Whom the call acts for (a per-user server's credential is its).
    pub subject: Subject,
    /// The caller's deadline less the margin to answer in
    /// ([`deadline_margin`]), if it set one.
    pub deadline: Option<Duration>,
    /// When the request arrived.
    pub started: Instant,
    /// The RPC as spans, metrics and audit records name it
    /// (`InvokeTool`, `GetPrompt`, ...).
    pub rpc: &'static str,
    /// The caller's address, for the audit record.
    pub peer: Option<std::net::SocketAddr>,
    /// The caller's W3C trace context (`traceparent`, `tracestate`).
    pub trace: Vec<(String, String)>,
}

impl Origin {
    /// A slot of the subject's and the tenant's rate and concurrency
    /// limits (a bounded wait, never an unbounded queue).
    ///
    /// # Errors
    /// The call is shed (`RESOURCE_EXHAUSTED`).
    pub(crate) async fn admit(&self) -> Result<crate::registry::limits::Admission, CallError> {
        self.tenant
            .limiter
            .admit(&self.subject)
            .await
            .map_err(|shed| CallError::Shed(shed, None))
    }

    /// The caller's deadline for a request of the caller's whose own
    /// timeout is `timeout`: less the margin to answer in.
    #[must_use]
    pub fn deadline_of(timeout: Option<Duration>) -> Option<Duration> {
        timeout.map(|t| t.saturating_sub(deadline_margin(t)))
    }
}

/// The calls of one gateway: what every call's steps share (the audit
/// trail, the keys of sealed state, the store of answered rounds and
/// tasks, the metrics, the drain and the abort of a shutdown).
#[derive(Debug, Clone)]
pub struct Calls {
    /// Cancelled when the shutdown grace period runs out: calls still in
    /// flight are cancelled upstream and answered UNAVAILABLE.
    abort: CancellationToken,
    metrics: Arc<Metrics>,
    drain: Arc<drain::Drain>,
    /// Where each call's record goes (disabled unless `audit:` is set).
    audit: crate::audit::Audit,
    /// Seal and open the `request_state` of rounds of questions: the
    /// state store's keys, or one random key of this process.
    request_keys: crate::state::KeyRing,
    /// Where each answered round's nonce is claimed: the state store when
    /// one is open, else this process's memory.
    answered_rounds: crate::state::FirstUse,
    /// Where tasks handed to workers are kept (`None`: no state store is
    /// open, and no call may become a task of a worker's).
    task_store: Option<crate::state::StateStore>,
    /// Tool calls held for a person's approval (`require_approval`).
    approvals: approval::CallApprovals,
    /// Where idempotency keys are recorded (`None`: no state store is
    /// open, and a call with a key is refused with nothing sent).
    idempotency: Option<crate::state::StateStore>,
    /// The servers' circuit breakers (step 9).
    breakers: Arc<breaker::Breakers>,
    /// Results servers marked reusable, per tenant ([`cache`]).
    cache: Arc<cache::ResultCache>,
}

impl Calls {
    /// The calls of a gateway; `abort` ends calls still running when the
    /// shutdown grace period is over, `drain` refuses new ones once
    /// shutdown has reached its drain stage.
    #[must_use]
    pub fn new(abort: CancellationToken, metrics: Arc<Metrics>, drain: Arc<drain::Drain>) -> Self {
        Self {
            abort,
            drain,
            audit: crate::audit::Audit::disabled(),
            request_keys: crate::state::KeyRing::ephemeral(),
            answered_rounds: crate::state::FirstUse::default(),
            task_store: None,
            idempotency: None,
            approvals: approval::CallApprovals::new(
                None,
                crate::audit::Audit::disabled(),
                metrics.clone(),
                approval::notify::Notifier::new(Arc::default()),
            ),
            breakers: Arc::new(breaker::Breakers::new(metrics.clone())),
            cache: Arc::new(cache::ResultCache::new(metrics.clone())),
            metrics,
        }
    }

    /// Keeping tasks handed to workers in `store`.
    #[must_use]
    pub fn with_task_store(mut self, store: crate::state::StateStore) -> Self {
        self.task_store = Some(store);
        self
    }

    /// Recording answered rounds of questions in `store` (shared by
    /// replicas) instead of this process's memory.
    #[must_use]
    pub fn with_answered_rounds(mut self, store: crate::state::StateStore) -> Self {
        self.answered_rounds = crate::state::FirstUse::Store(store);
        self
    }

    /// Sealing `request_state` with `keys` (the state store's
    /// `state.keys`, shared by replicas) instead of a key of its own.
    #[must_use]
    pub fn with_request_keys(mut self, keys: crate::state::KeyRing) -> Self {
        self.request_keys = keys;
        self
    }

    /// Recording the idempotency keys of tool calls in `store` (shared
    /// by replicas).
    #[must_use]
    pub fn with_idempotency_keys(mut self, store: crate::state::StateStore) -> Self {
        self.idempotency = Some(store);
        self
    }

    /// Writing a record of each call to `audit`.
    #[must_use]
    pub fn with_audit(mut self, audit: crate::audit::Audit) -> Self {
        self.approvals.audit = audit.clone();
        self.audit = audit;
        self
    }

    /// Keeping call approvals (tool calls held for a person's decision)
    /// in `store`, shared by replicas; without one, a call a
    /// `require_approval` rule holds is refused (`STATE_UNAVAILABLE`).
    #[must_use]
    pub fn with_call_approvals(mut self, store: crate::state::StateStore) -> Self {
        self.approvals.store = Some(store);
        self
    }

    /// Announcing call approvals to the tenants' webhooks from addresses
    /// `upstream_allow` lets the gateway reach (as for upstream servers).
    #[must_use]
    pub fn with_webhooks(
        mut self,
        upstream_allow: Arc<crate::config::address::UpstreamAllow>,
    ) -> Self {
        self.approvals.notifier = approval::notify::Notifier::new(upstream_allow);
        self
    }

    /// What approvers do ([`approval::decide`]).
    #[must_use]
    pub fn call_approvals(&self) -> &approval::CallApprovals {
        &self.approvals
    }

    /// The servers' circuit breakers: the registry tells them of sessions
    /// established and servers retired
    /// ([`crate::registry::Registry::observe_sessions`]), listings show
    /// their state.
    #[must_use]
    pub fn breakers(&self) -> &Arc<breaker::Breakers> {
        &self.breakers
    }

    /// The audit trail.
    pub(crate) fn audit(&self) -> &crate::audit::Audit {
        &self.audit
    }

    /// The drain every call enters.
    #[must_use]
    pub fn drain(&self) -> &Arc<drain::Drain> {
        &self.drain
    }

    /// Runs `operation` for `origin` through the pipeline and answers it
    /// as `R` (the surface's reply).
    ///
    /// # Errors
    /// The error the call ends with.
    pub(crate) async fn run<
        O: pipeline::Operation + 'static,
        R: Reply<O::Output> + Sync + 'static,
    >(
        &self,
        origin: Origin,
        operation: O,
    ) -> Result<R, CallError> {
        if operation.idempotency_key().is_none() {
            return pipeline::run(self, origin, operation).await;
        }
        // A call with an idempotency key runs to its end even when its
        // caller goes away or its deadline passes: its outcome is what the
        // caller's retry gets.
        let left = origin
            .deadline
            .map(|d| d.saturating_sub(origin.started.elapsed()));
        let calls = self.clone();
        let call = tokio::spawn(
            async move { pipeline::run(&calls, origin, operation).await }.in_current_span(),
        );
        let ended = match left {
            Some(left) => tokio::time::timeout(left, call).await,
            None => Ok(call.await),
        };
        match ended {
            Ok(Ok(result)) => result,
            Ok(Err(error)) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Ok(Err(_)) => Err(CallError::ShuttingDown {
                sent: false,
                idempotent: false,
            }),
            // The call goes on (and is counted by what its key did).
            Err(_) => Err(CallError::Keyed(idempotency::KeyRefusal::InProgress {
                call_id: String::new(),
            })),
        }
    }

    /// A task RPC of `origin`'s ([`tasks`]).
    #[must_use]
    pub fn task_call(&self, origin: &Origin) -> TaskCall {
        TaskCall {
            tenant: origin.tenant.clone(),
            caller: origin.caller.clone(),
            subject: origin.subject.clone(),
            deadline: origin.deadline,
            events: tasks::Events::of(self),
            calls: self.clone(),
        }
    }
}
