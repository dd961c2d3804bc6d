//! What can go wrong with one RPC, in the gateway's own terms. The single
//! mapping to gRPC status lives in [`crate::grpc::status`].

use std::time::Duration;

use crate::callers::CallerError;
pub use crate::callers::{MAX_QUOTED, quoted};
use crate::upstream::UpstreamError;

/// Longest valid exposed tool name (`^[a-zA-Z0-9_-]{1,64}$`).
pub const MAX_TOOL_NAME: usize = 64;

/// A failed ToolGateway call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No or unknown caller credential.
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),
    /// The name is not in the caller's catalog (or filtered out).
    #[error("tool `{name}` is not in this tenant's catalog")]
    ToolNotFound {
        /// The requested name.
        name: String,
    },
    /// The name is a tool of a `definitions: approved` server whose current
    /// definition is not approved (new, or changed since approved): it is
    /// withheld until an operator approves it.
    #[error("{tool} of server `{server}` is withheld: its definition (hash {definition_hash}) {} and awaits approval (`toolgate approve`)", if .approved_hash.is_some() { "changed since it was approved" } else { "was never approved" })]
    DefinitionNotApproved {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// The tool's current definition hash.
        definition_hash: String,
        /// The approved hash, when the tool changed since its approval.
        approved_hash: Option<String>,
    },
    /// The tenant's policy does not let this caller call the tool (nor see
    /// it): the message names the tool, never the rule.
    #[error("this caller may not call tool `{tool}` (the tenant's policy)")]
    ToolNotPermitted {
        /// The exposed tool name.
        tool: String,
    },
    /// The `x-toolgate-subject` metadata is malformed.
    #[error("invalid subject: {0}")]
    InvalidSubject(&'static str),
    /// The caller's JWT is refused (or its issuer's keys cannot be loaded).
    #[error("unauthenticated: {0}")]
    Token(crate::callers::TokenError),
    /// The caller's client certificate is refused, or names another
    /// tenant than its token.
    #[error("unauthenticated: {0}")]
    Certificate(crate::callers::CertError),
    /// The server acts for each end user, and this call's subject has not
    /// authorized it yet: the user consents at `url`.
    #[error("server `{server}` needs the consent of this call's subject{}: open the authorization URL (in the status details) and retry after consenting", if .subject.is_empty() { " (the tenant itself: no x-toolgate-subject was sent)" } else { "" })]
    AuthorizationRequired {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// The subject's key (empty for the tenant itself); never put in the message.
        subject: String,
        /// Where the subject consents.
        url: String,
    },
    /// `CompleteAuthorization`: no held consent has this code (never
    /// issued, already used, or expired).
    #[error(
        "the consent code is unknown, expired or already used: start again from the authorization link"
    )]
    ConsentCodeInvalid,
    /// `CompleteAuthorization`: the caller's tenant or subject is not the
    /// one the authorization link was made for; the held consent is
    /// dropped.
    #[error("{reason}")]
    ConsentNotYours {
        /// The server the consent was for; `None` when the flow was another
        /// tenant's (its server names are not this caller's to learn).
        server: Option<String>,
        /// What did not match, in words (no subject in it).
        reason: String,
    },
    /// `CompleteAuthorization`: the state store holding the consent cannot
    /// be reached; nothing was confirmed.
    #[error("the gateway's state store is unavailable ({0}); the consent code stays valid, retry")]
    ConsentStoreUnavailable(String),
    /// The state store (tokens, consents) cannot be reached; nothing was
    /// sent upstream.
    #[error(
        "the gateway's state store is unavailable ({reason}); calls to server `{server}` need it, retry"
    )]
    StateUnavailable {
        /// The server.
        server: String,
        /// Why, without secrets.
        reason: String,
    },
    /// A call with `accepts_task` became a task at the server, and the
    /// state store could not keep it: the server's task was cancelled, but
    /// the tool may have acted already.
    #[error(
        "server `{server}` made the call a task, but the gateway's state store could not keep it \
         ({reason}); the server's task was cancelled, and the tool may have acted"
    )]
    TaskNotKept {
        /// The server.
        server: String,
        /// Why, without secrets.
        reason: String,
        /// Whether the tool is annotated `idempotentHint: true` (then it
        /// may run again: `UNAVAILABLE`).
        idempotent: bool,
    },
    /// The requested name cannot be a tool name (too long or empty).
    #[error("`{name}` is not a valid tool name: {reason}")]
    InvalidName {
        /// The name as quoted ([`quoted`]).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A configuration reload replaced the caller's tenant while the call
    /// was being routed, again and again; nothing was sent upstream.
    #[error("the tenant's configuration is being reloaded; nothing was sent upstream, retry")]
    Reloading,
    /// The caller's token or tenant is not one the registry has loaded,
    /// and the state store, which holds the tenants written through the
    /// admin API, cannot be asked now (this reason: never a secret).
    #[error("the tenant store cannot be reached to look up the caller's tenant: {0}")]
    TenantStoreUnavailable(String),
    /// The answer is larger than the gateway may send
    /// (`limits.max_message_bytes`).
    #[error(
        "the result of {tool} on server `{server}` is {size} bytes, over limits.max_message_bytes ({limit})"
    )]
    ResponseTooLarge {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// The encoded size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// `arguments_json` is not a JSON object.
    #[error("arguments_json for {tool} {reason}")]
    InvalidArguments {
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// What is wrong with them.
        reason: String,
    },
    /// The tool's server has no live session.
    #[error("server `{server}` is not connected ({reason}); {tool} is unavailable")]
    ServerUnavailable {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// Why the server is not connected.
        reason: String,
    },
    /// The server's circuit breaker is open (a run of breaking failures),
    /// or half-open with its probe call under way: the call failed at once,
    /// nothing was sent.
    #[error("server `{server}` is failing{}: its circuit breaker is open, so {tool} was not sent; retry in {}", if *.per_subject { " for this subject" } else { "" }, humantime::format_duration(Duration::from_millis(u64::try_from(.retry_after.as_millis()).unwrap_or(u64::MAX).max(1))))]
    CircuitOpen {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// Until the breaker lets a probe call through (or, half-open, a
        /// short wait for the probe's outcome).
        retry_after: Duration,
        /// The breaker is the subject's own (a per-user server).
        per_subject: bool,
    },
    /// The upstream request failed.
    #[error("{tool} on server `{server}`: {error}")]
    Upstream {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// What went wrong upstream.
        error: UpstreamError,
        /// The tool is annotated `idempotentHint: true`: a call whose
        /// outcome is unknown may be retried.
        idempotent: bool,
    },
    /// The caller's deadline passed: the upstream request was cancelled,
    /// or not sent at all when no time was left for it.
    #[error("deadline exceeded after {} calling {tool} on server `{server}`; {}", humantime::format_duration(*.after), if *.sent { "the upstream request was cancelled" } else { "nothing was sent upstream" })]
    DeadlineExceeded {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// How long the call ran.
        after: Duration,
        /// Whether the request had been sent upstream.
        sent: bool,
    },
    /// An `InputResponse` is malformed: unknown or repeated id, no action,
    /// or content that does not fit its question. Nothing is sent.
    #[error("invalid input response: {reason}")]
    InputResponseInvalid {
        /// What is wrong, naming the response's id.
        reason: String,
    },
    /// The server asked questions of a kind the call did not opt in to
    /// (`accepts_input`), or that its server's `input` does not allow:
    /// the call ends here, nothing is answered on the worker's behalf.
    #[error("{tool} on server `{server}` asks for input of kind {} that this call does not accept: set accepts_input ({}) to answer it, where the server's `input` allows it", .kinds.join(", "), .kinds.join(", "))]
    InputNotAccepted {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// The kinds asked and not accepted (`form`, `url`, `sampling`,
        /// `roots`).
        kinds: Vec<&'static str>,
    },
    /// A `request_state` was refused; nothing was sent upstream.
    #[error("request_state refused: {detail}")]
    RequestStateRefused {
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// Which check refused it.
        refusal: StateRefusal,
        /// What did not match, in words (no value of the state).
        detail: String,
    },
    /// The call took more rounds of questions than its server's
    /// `input.max_rounds` allows.
    #[error(
        "{tool} on server `{server}` asked more than {limit} rounds of questions (servers[].input.max_rounds)"
    )]
    InputRoundsExceeded {
        /// The server.
        server: String,
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// The configured bound.
        limit: u32,
    },
    /// GetTask/UpdateTask/CancelTask: no task of this caller has this id
    /// (unknown, expired, malformed, or another tenant's or subject's: one
    /// answer for all, so that ids cannot be probed).
    #[error("no such task: unknown, expired, or not this caller's")]
    TaskNotFound,
    /// UpdateTask on a task that has finished.
    #[error("the task has ended ({status}): it takes no more answers")]
    TaskFinished {
        /// How it ended (`completed`, `failed`, `cancelled`).
        status: &'static str,
    },
    /// The task runs in a stdio server's process at another replica of the
    /// gateway, which alone can reach it.
    #[error(
        "the task runs in stdio server `{server}` at another replica of the gateway, which alone can reach it"
    )]
    TaskElsewhere {
        /// The server.
        server: String,
    },
    /// The tenant has as many open tasks as it may.
    #[error(
        "the tenant has {limit} open tasks, the most it may have: wait for some to end or expire"
    )]
    TaskLimit {
        /// The server whose call became a task.
        server: String,
        /// The most open tasks a tenant may have.
        limit: u64,
    },
    /// The first message of an `InvokeToolInteractive` stream is not the
    /// call (or the stream ended before it).
    #[error("the first message of InvokeToolInteractive must carry the call (`call`): {0}")]
    InteractiveFirstMessage(&'static str),
    /// A ListTools/WatchTools/SearchTools filter is malformed.
    #[error("invalid filter: {0}")]
    InvalidFilter(String),
    /// A call limit shed the call.
    #[error("{}", shed_message(.0, .1.as_deref()))]
    Shed(crate::registry::limits::Shed, Option<String>),
    /// `arguments_json` is larger than `limits.max_argument_bytes`.
    #[error("arguments_json for {tool} is {size} bytes, over limits.max_argument_bytes ({limit})")]
    ArgumentsTooLarge {
        /// What the request named (a tool, a prompt, a resource).
        tool: Target,
        /// The size sent.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The caller pinned a catalog version or definition hash and the tool
    /// changed or went away since.
    #[error("{detail}")]
    PlanOutdated {
        /// The exposed tool name.
        tool: String,
        /// What moved.
        pin: Pin,
        /// A sentence saying what changed.
        detail: String,
        /// The tenant's catalog version now.
        current_version: String,
        /// The tool's definition hash now (empty when gone).
        current_hash: String,
    },
    /// The gateway is draining for shutdown and takes no new calls; nothing
    /// was sent upstream, so another replica can take the call.
    #[error("the gateway is shutting down and takes no new calls; retry on another replica")]
    Draining,
    /// `audit.required` is set and the call's audit record cannot be
    /// written: before sending, the call is refused; after, its result is
    /// withheld.
    #[error("{}", if *.sent {
        "the audit trail cannot be written, so the result of this call is withheld (the tool may have acted)"
    } else {
        "the audit trail cannot be written and is required; nothing was sent upstream, retry"
    })]
    AuditUnavailable {
        /// Whether the request had been sent upstream.
        sent: bool,
        /// The tool is annotated `idempotentHint: true`.
        idempotent: bool,
    },
    /// A resource RPC named a server the tenant does not have.
    #[error("server `{server}` is not one of this tenant's servers")]
    ServerNotFound {
        /// The name asked for (as quoted).
        server: String,
    },
    /// The server does not offer what was asked (it did not declare the
    /// capability).
    #[error("server `{server}` does not offer {feature}: it did not declare the capability")]
    Unsupported {
        /// The server.
        server: String,
        /// What it lacks.
        feature: Feature,
    },
    /// The name is not in the caller's prompts (or filtered out).
    #[error("prompt `{name}` is not one of this tenant's prompts")]
    PromptNotFound {
        /// The requested name (as quoted).
        name: String,
    },
    /// The tenant's policy does not let this caller use the prompt or
    /// resource (nor see it): the message names it, never the rule.
    #[error("this caller may not use {target} of server `{server}` (the tenant's policy)")]
    NotPermitted {
        /// The server.
        server: String,
        /// The prompt or resource.
        target: Target,
    },
    /// The server has no such resource (JSON-RPC -32002, or -32602 on
    /// `resources/read` from a 2026-07-28 server).
    #[error("server `{server}` has no resource `{uri}`")]
    ResourceNotFound {
        /// The server.
        server: String,
        /// The URI asked for (cut to [`MAX_TARGET_NAME`]).
        uri: String,
    },
    /// A prompt pinned by `definition_hash` changed since.
    #[error(
        "prompt `{prompt}` changed since it was chosen: its definition hash is now {current_hash}, not {pinned_hash}"
    )]
    PromptDefinitionChanged {
        /// The exposed prompt name.
        prompt: String,
        /// The hash the caller pinned.
        pinned_hash: String,
        /// The prompt's hash now.
        current_hash: String,
    },
    /// The name is not in the caller's skills (or filtered out).
    #[error("skill `{name}` is not one of this tenant's skills")]
    SkillNotFound {
        /// The requested name (as quoted).
        name: String,
    },
    /// A skill is not the definition the caller pinned, or its server now
    /// serves another entry than the one listed (and approved): nothing of
    /// it is read.
    #[error(
        "skill `{skill}` changed since it was {since}: its definition hash is now {current_hash}, not {expected_hash}"
    )]
    SkillDefinitionChanged {
        /// The exposed skill name.
        skill: String,
        /// `chosen` (the caller's pin) or `listed` (the server's entry
        /// now differs from the catalog's).
        since: &'static str,
        /// The hash expected.
        expected_hash: String,
        /// The hash now.
        current_hash: String,
    },
    /// A file of a skill is not what the skill's entry says: its size or
    /// SHA-256 digest differ from the manifest's, or `SKILL.md`'s
    /// frontmatter from the entry's. Nothing of the skill is handed out.
    #[error(
        "skill `{skill}` of server `{server}` failed verification: {reason}; nothing of it is returned"
    )]
    SkillMismatch {
        /// The server.
        server: String,
        /// The exposed skill name.
        skill: String,
        /// The file at fault.
        uri: String,
        /// What differs.
        reason: String,
        /// Whether the frontmatter differs (else the bytes).
        frontmatter: bool,
    },
    /// A requested path is not a file of the skill's manifest.
    #[error(
        "skill `{skill}` lists no file `{path}` (paths are relative to the skill's root, as ListSkills shows its files)"
    )]
    SkillFileNotListed {
        /// The exposed skill name.
        skill: String,
        /// The path asked for (as quoted).
        path: String,
    },
    /// A `page_token` that is malformed or was made for other filters.
    #[error("invalid page_token: {0}")]
    InvalidPageToken(String),
    /// A `page_token` of a listing that has changed since: list again from
    /// the first page.
    #[error(
        "the page_token is from a listing of server `{server}` that has changed since: list again from the first page"
    )]
    PageTokenExpired {
        /// The server whose listing changed.
        server: String,
    },
    /// The tenant has as many resource watches open as it may.
    #[error(
        "the tenant has {limit} resource watches open, the most it may have (limits.max_watches)"
    )]
    WatchLimit {
        /// The limit.
        limit: usize,
    },
    /// A watch ended because a configuration reload removed or changed its
    /// server.
    #[error("server `{server}` was removed or changed by a configuration reload")]
    ServerRemoved {
        /// The server.
        server: String,
    },
    /// A resource URI (or URI template) that has no normal form the
    /// resource rules could match: malformed, or still carrying an encoded
    /// separator, a dot segment or a remote `file` host once normalized.
    #[error("{0}")]
    InvalidUri(#[from] crate::policy::UriError),
    /// A request of MCP's gRPC transport (`model_context_protocol.Mcp`)
    /// that does not map onto the gateway: no tool named, arguments or
    /// `resume_data` that are not this gateway's, a resource URI that
    /// several servers offer without `toolgate/server` naming one, ...
    #[error("invalid request: {0}")]
    McpRequestInvalid(String),
    /// A routing header of MCP's gRPC transport (`mcp_tool`, `mcp_prompt`,
    /// `mcp_resource`) that names something other than the request does.
    #[error("header `{header}` names `{header_value}` but the request names `{request_value}`")]
    RoutingHeaderMismatch {
        /// The header.
        header: &'static str,
        /// What the header says (cut to [`MAX_TARGET_NAME`]).
        header_value: String,
        /// What the request's body names (cut to [`MAX_TARGET_NAME`]).
        request_value: String,
    },
    /// A `Complete` request that names no prompt or resource template, or
    /// no argument.
    #[error("invalid completion request: {0}")]
    InvalidCompletion(&'static str),
    /// The gateway is shutting down and its grace period ran out.
    #[error("{}", if *.sent {
        "the gateway is shutting down; the call was cancelled after it was sent upstream (the tool may have acted)"
    } else {
        "the gateway is shutting down; the call was cancelled before anything was sent upstream"
    })]
    ShuttingDown {
        /// Whether the request had been sent upstream.
        sent: bool,
        /// The tool is annotated `idempotentHint: true`.
        idempotent: bool,
    },
    // Policy on a call's arguments, and call approvals
    // (docs/call-approvals.md).
    /// A policy rule decided on this call's arguments refused it (or its
    /// condition could not be evaluated on them): the message names the
    /// rule, never an argument's value.
    #[error("this caller may not make this call of {target}: policy rule {rule} {}", if *.failed { "could not be evaluated on its arguments, which refuses it" } else { "denies it" })]
    CallNotPermitted {
        /// The tool or prompt.
        target: Target,
        /// The rule (`tenants[0].policy[2]`).
        rule: String,
        /// Its condition failed to evaluate on these arguments.
        failed: bool,
    },
    /// A policy rule holds the call until a person approves it: nothing
    /// was sent.
    #[error("{tool} waits for a person's approval (policy rule {rule}): retry with approval_id {approval_id} once it is approved; undecided, it expires in {}", humantime::format_duration(std::time::Duration::from_secs(u64::try_from((*.expires_at_ms - crate::state::now_ms()).max(0) / 1000).unwrap_or(0))))]
    ApprovalPending {
        /// The tool's exposed name.
        tool: String,
        /// The approval's id.
        approval_id: String,
        /// The rule that asked.
        rule: String,
        /// When it expires undecided (Unix milliseconds).
        expires_at_ms: i64,
    },
    /// The approval the call waits for or names was denied.
    #[error("call approval {approval_id} was denied by {decided_by}{}", if .reason.is_empty() { String::new() } else { format!(": {}", quoted(.reason)) })]
    ApprovalDenied {
        /// The approval's id.
        approval_id: String,
        /// Who denied it.
        decided_by: String,
        /// Their reason (may be empty).
        reason: String,
    },
    /// The approval expired: undecided in time, or not used in time.
    #[error("call approval {approval_id} expired {}: ask again (retry without approval_id)", if *.approved { "before it was used" } else { "before anyone decided it" })]
    ApprovalExpired {
        /// The approval's id.
        approval_id: String,
        /// It had been approved.
        approved: bool,
    },
    /// The approval allowed as many calls as it may, and they were made.
    #[error("call approval {approval_id} is used up: ask again (retry without approval_id)")]
    ApprovalSpent {
        /// The approval's id.
        approval_id: String,
    },
    /// The approval was asked for another call: the same approval never
    /// serves a call that differs in any part it binds.
    #[error(
        "call approval {approval_id} was given for another call ({what} differ): this call needs its own approval (retry without approval_id)"
    )]
    ApprovalMismatch {
        /// The approval's id.
        approval_id: String,
        /// What differs (`the arguments`, `the subjects`, ...).
        what: &'static str,
    },
    /// No call approval of this tenant has this id (or it ended long ago
    /// and was forgotten).
    #[error("there is no call approval {approval_id} in this tenant")]
    ApprovalNotFound {
        /// The id asked for (as quoted).
        approval_id: String,
    },
    /// The subject has as many call approvals pending as it may.
    #[error(
        "this subject has {limit} call approvals pending, the most it may have (call_approvals.max_pending_per_subject): wait for their decisions"
    )]
    ApprovalLimit {
        /// The limit.
        limit: u32,
    },
    /// The caller may not decide this approval.
    #[error("this caller may not decide call approval {approval_id}: {why}")]
    NotApprover {
        /// The approval's id.
        approval_id: String,
        /// Why.
        why: &'static str,
    },
    /// An approver's reason is longer than it may be.
    #[error("reason: at most {limit} characters")]
    ApprovalReasonTooLong {
        /// The most.
        limit: usize,
    },
    /// The approval is no longer pending.
    #[error("call approval {approval_id} is {state}, no longer pending")]
    ApprovalDecided {
        /// The approval's id.
        approval_id: String,
        /// Its state.
        state: String,
    },
    /// Call approvals live in the state store, which cannot be reached
    /// (or none is configured): nothing was sent.
    #[error("call approvals need the state store, which {reason}; nothing was sent, retry")]
    ApprovalStoreUnavailable {
        /// Why (without secrets).
        reason: &'static str,
    },
    /// A call with an idempotency key was not run (`docs/api.md`,
    /// "Retrying safely").
    #[error(transparent)]
    Keyed(super::idempotency::refusal::KeyRefusal),
    /// A call with an idempotency key whose first call failed with a
    /// definite status: that status again, nothing sent.
    #[error("{} (the recorded outcome of call {} with this idempotency key; not sent again)", .0.message, .0.call_id)]
    Replayed(Box<super::idempotency::refusal::RecordedStatus>),
    // Guards (`guards:`, docs/guards.md).
    /// A guard denied the call: in the request phase nothing was sent; in
    /// the response phase the result is withheld.
    #[error("guard `{guard}` denied the {phase} of {tool} on server `{server}`: {reason}")]
    GuardDenied {
        /// The guard's name.
        guard: String,
        /// `request` or `response`.
        phase: &'static str,
        /// What the call named.
        tool: Target,
        /// The server.
        server: String,
        /// The guard's reason, bounded and redacted
        /// ([`crate::guards::deny_reason`]).
        reason: String,
    },
    /// A guard with `failure: closed` failed (down, late, an error, no
    /// verdict, a bad replacement).
    #[error("guard `{guard}` could not check the {phase} of {tool} on server `{server}` ({error}); {}", if *.sent {
        "the result is withheld (the call reached the server)"
    } else {
        "nothing was sent upstream, retry"
    })]
    GuardUnavailable {
        /// The guard's name.
        guard: String,
        /// `request` or `response`.
        phase: &'static str,
        /// What the call named.
        tool: Target,
        /// The server.
        server: String,
        /// What went wrong, in words (never a payload).
        error: String,
        /// Whether the request had been sent upstream (the response phase).
        sent: bool,
        /// Whether a retry is safe after it was sent: the tool is
        /// `idempotentHint: true`, or the call is a read or a prompt.
        idempotent: bool,
    },
}

impl CallError {
    /// The error of a chain that stopped a call to `tool` on `server`;
    /// `idempotent`: a retry is safe even after the request was sent.
    pub fn guard(
        stop: crate::guards::GuardStop,
        tool: Target,
        server: &str,
        idempotent: bool,
    ) -> Self {
        match stop {
            crate::guards::GuardStop::Denied {
                guard,
                phase,
                reason,
            } => CallError::GuardDenied {
                guard,
                phase: phase.as_str(),
                tool,
                server: server.to_owned(),
                reason,
            },
            crate::guards::GuardStop::Failed {
                guard,
                phase,
                error,
            } => CallError::GuardUnavailable {
                guard,
                phase: phase.as_str(),
                tool,
                server: server.to_owned(),
                error,
                sent: phase == crate::guards::Phase::Response,
                idempotent,
            },
        }
    }
}

fn shed_message(shed: &crate::registry::limits::Shed, server: Option<&str>) -> String {
    use crate::registry::limits::Shed;
    match shed {
        Shed::Rate(wait) => format!(
            "tenant rate limit reached (limits.rate_per_second); retry in {} ms",
            wait.as_millis().max(1)
        ),
        Shed::TenantConcurrency(n) => {
            format!("tenant concurrency limit reached (limits.max_concurrent_calls = {n})")
        }
        Shed::ServerConcurrency(n) => format!(
            "server `{}` concurrency limit reached (max_concurrent_calls = {n})",
            server.unwrap_or("?")
        ),
        Shed::SubjectRate(wait) => format!(
            "the caller's subject rate limit reached (limits.per_subject.rate_per_second); retry in {} ms",
            wait.as_millis().max(1)
        ),
        Shed::SubjectConcurrency(n) => format!(
            "the caller's subject concurrency limit reached (limits.per_subject.max_concurrent_calls = {n})"
        ),
    }
}

/// What a server may not offer ([`CallError::Unsupported`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `resources` (ListResources, ReadResource).
    Resources,
    /// `prompts`.
    Prompts,
    /// `completions` (Complete).
    Completions,
    /// `resources.subscribe` (WatchResource).
    Subscriptions,
    /// The skills extension (`io.modelcontextprotocol/skills`) on a
    /// 2026-07-28 session (GetSkill).
    Skills,
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Feature::Resources => "resources",
            Feature::Prompts => "prompts",
            Feature::Completions => "argument completion",
            Feature::Subscriptions => "resource subscriptions",
            Feature::Skills => "skills (the io.modelcontextprotocol/skills extension)",
        })
    }
}

/// Why a `request_state` was refused (each has its own reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateRefusal {
    /// Not a state toolgate made: malformed, or altered.
    Invalid,
    /// Sealed with a key this gateway does not have (rotated out, or
    /// another replica's per-process key).
    KeyRetired,
    /// Another tenant's or another subject's.
    Foreign,
    /// Made for another server, tool or arguments.
    OtherCall,
    /// Past its `input.state_ttl`.
    Expired,
    /// Its round was answered already (a round's answers are used once).
    Used,
}

/// What moved under a caller's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// The tool's definition differs from the pinned one.
    DefinitionChanged,
    /// The tool is no longer in the catalog.
    Gone,
    /// The pinned catalog version cannot be compared (too old, or unknown).
    VersionUnknown,
}

impl From<CallerError> for CallError {
    fn from(error: CallerError) -> Self {
        match error {
            CallerError::Unauthenticated(message) => CallError::Unauthenticated(message),
            CallerError::InvalidSubject(message) => CallError::InvalidSubject(message),
            CallerError::Token(token) => CallError::Token(token),
            CallerError::Certificate(cert) => CallError::Certificate(cert),
            CallerError::TenantStoreUnavailable(reason) => {
                CallError::TenantStoreUnavailable(reason)
            }
        }
    }
}

/// What a request named: a tool (by exposed name), a prompt (by exposed
/// name), a resource (by URI) or a resource template. Errors name it with
/// its kind ("tool `x`", "resource `file:///a`"), and `ErrorInfo`
/// metadata carries it under its own key ([`Target::metadata_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// What kind of thing it is.
    pub kind: TargetKind,
    /// Its name (exposed name, URI or URI template), as quoted
    /// ([`quoted`]) where it came from a caller.
    pub name: String,
}

/// The kinds of [`Target`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// A tool, by exposed name.
    Tool,
    /// A prompt, by exposed name.
    Prompt,
    /// A resource, by URI.
    Resource,
    /// A resource template, by URI template.
    Template,
    /// A skill, by exposed name.
    Skill,
}

impl Target {
    /// A prompt, by exposed name.
    #[must_use]
    pub fn prompt(name: impl Into<String>) -> Self {
        Self {
            kind: TargetKind::Prompt,
            name: name.into(),
        }
    }

    /// A skill, by exposed name.
    #[must_use]
    pub fn skill(name: impl Into<String>) -> Self {
        Self {
            kind: TargetKind::Skill,
            name: name.into(),
        }
    }

    /// A resource, by URI.
    #[must_use]
    pub fn resource(uri: impl Into<String>) -> Self {
        Self {
            kind: TargetKind::Resource,
            name: name_of(uri.into()),
        }
    }

    /// A resource template, by URI template.
    #[must_use]
    pub fn template(uri_template: impl Into<String>) -> Self {
        Self {
            kind: TargetKind::Template,
            name: name_of(uri_template.into()),
        }
    }

    /// The `ErrorInfo` metadata key it goes under: `tool`, `prompt`, `uri`
    /// or `uri_template`.
    #[must_use]
    pub fn metadata_key(&self) -> &'static str {
        match self.kind {
            TargetKind::Tool => "tool",
            TargetKind::Prompt => "prompt",
            TargetKind::Resource => "uri",
            TargetKind::Template => "uri_template",
            TargetKind::Skill => "skill",
        }
    }
}

/// A URI cut to [`MAX_TARGET_NAME`] characters.
fn name_of(uri: String) -> String {
    if uri.chars().count() <= MAX_TARGET_NAME {
        uri
    } else {
        crate::upstream::truncate(&uri, MAX_TARGET_NAME)
    }
}

/// The longest URI an error repeats.
pub const MAX_TARGET_NAME: usize = 1024;

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let noun = match self.kind {
            TargetKind::Tool => "tool",
            TargetKind::Prompt => "prompt",
            TargetKind::Resource => "resource",
            TargetKind::Template => "resource template",
            TargetKind::Skill => "skill",
        };
        write!(f, "{noun} `{}`", self.name)
    }
}

/// A tool, by exposed name.
impl From<String> for Target {
    fn from(name: String) -> Self {
        Self {
            kind: TargetKind::Tool,
            name,
        }
    }
}

/// A tool, by exposed name.
impl From<&str> for Target {
    fn from(name: &str) -> Self {
        name.to_owned().into()
    }
}

/// A tool, by exposed name.
impl From<&String> for Target {
    fn from(name: &String) -> Self {
        name.clone().into()
    }
}

impl PartialEq<&str> for Target {
    fn eq(&self, other: &&str) -> bool {
        self.name == *other
    }
}
