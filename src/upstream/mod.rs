//! One upstream MCP session per tenant × server: connect (stdio or
//! Streamable HTTP), read the whole tool list, call tools with a timeout
//! and cancellation, and close.

mod bearer;
mod capabilities;
mod completion;
mod error;
mod events;
mod handler;
mod http;
pub mod input;
mod lease;
mod listing;
mod prompts;
mod reach;
mod redact;
mod relist;
mod request;
pub(crate) mod resources;
mod rounds;
pub mod skills;
mod stdio;
mod subscriptions;
pub mod tasks;
mod ties;
mod watchers;

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, Prompt, RequestId, ServerResult, Tool,
};
use rmcp::service::PeerRequestOptions;
use rmcp::service::{RoleClient, RunningService};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use bearer::Bearer;
pub use completion::{
    Completion, CompletionRef, CompletionRequest, MAX_COMPLETION_VALUE_BYTES, MAX_COMPLETION_VALUES,
};
pub use error::{MISSING_REQUIRED_CLIENT_CAPABILITY, UpstreamError};
pub use events::{ListKind, SessionEvents};
pub(crate) use handler::ElicitationAnswerer;
pub(crate) use http::layer as http_layer;
pub use input::{
    Action, Answer, AnswerError, Asked, CallOutcome, CallRequest, InputKinds, InputSink, Question,
    QuestionKind, Round,
};
pub use prompts::{PromptOutcome, PromptRequest};
pub(crate) use reach::webhook_client;
pub use request::Request;
pub use stdio::Label;
pub use watchers::{ResourceWatch, WatchEnd};

use crate::config::{Environment, Lifecycle, ServerConfig, Transport};
use crate::credentials::{Redaction, SharedRedactor};

/// How long closing a session may take before it is abandoned. For stdio,
/// the child's stdin is closed, the leader has 3 s to exit, then its whole
/// process group gets SIGTERM, 2 s, then SIGKILL (`stdio/group.rs`).
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A live MCP client session.
#[derive(Debug)]
pub struct Session {
    /// Its rmcp service: standing, or leased per burst of requests for a
    /// stateless HTTP session ([`lease`]).
    peers: lease::Peers,
    client: handler::GatewayClient,
    label: Label,
    cancel: CancellationToken,
    /// How far the session's end has come: [`End::Ended`] when its
    /// service loop has ended, [`End::Closed`] once it has ended and, for
    /// stdio, no live process is left in the child's process group. (One
    /// channel for both: each costs a few hundred bytes per session.)
    end: watch::Receiver<End>,
    /// A leased session's end, set when it is closed (no task watches a
    /// service loop for it: a leased session has none between requests).
    end_tx: Option<watch::Sender<End>>,
    /// The stdio child's pid (and process group), for log lines.
    pid: Option<u32>,
    /// Removes configured credentials and live OAuth tokens from what the
    /// server sends back.
    redaction: Redaction,
    /// Whether tool results are redacted too (`redact_results`).
    redact_results: bool,
    /// OAuth bearer tokens, when the server takes them.
    bearer: Option<Bearer>,
    /// The server's resource list, as last read ([`resources`]).
    resources: resources::ListingCache,
}

/// How far a session's end has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    /// The service loop runs.
    Running,
    /// The service loop has ended.
    Ended,
    /// Ended, and a stdio server's process group is gone.
    Closed,
}

/// What connecting yields: the session and every tool it listed.
#[derive(Debug)]
pub struct Connected {
    /// The live session.
    pub session: Arc<Session>,
    /// Every tool of the server, all pages.
    pub tools: Vec<Tool>,
    /// Every prompt of the server, all pages, when it declares `prompts`
    /// (`None` when it does not); `Err` says why its prompts are refused
    /// (the listing failed, never ended, or outlasted the connect
    /// timeout): the session and its tools are kept all the same.
    pub prompts: Option<Result<Vec<Prompt>, String>>,
    /// Every skill of the server, all pages, when the session offers
    /// skills ([`skills::offers_skills`]; `None` when it does not); `Err`
    /// says why its skills are refused (its tools and prompts are kept).
    pub skills: Option<Result<Vec<skills::Skill>, String>>,
}

/// Starts a session to `server` and reads its whole tool list, all within
/// the server's connect timeout.
///
/// # Errors
/// The transport cannot start, the handshake fails, the listing fails or
/// never ends, or the whole takes longer than the connect timeout.
pub async fn connect(
    server: &ServerConfig,
    label: &Label,
    gateway_env: &dyn Environment,
    max_result_bytes: usize,
    redactor: &SharedRedactor,
) -> Result<Connected, UpstreamError> {
    connect_with(
        server,
        label,
        gateway_env,
        max_result_bytes,
        redactor,
        SessionOptions::default(),
    )
    .await
}

/// Opt-in session behaviour beyond the gateway's own, for
/// `toolgate conformance-client`. The default is the gateway's.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionOptions {
    /// Declare form elicitation and answer every elicitation with this
    /// (`toolgate conformance-client` only: the gateway never answers on
    /// anyone's behalf).
    pub(crate) elicitation_answerer: Option<ElicitationAnswerer>,
    /// Where the session counts the server's questions it refuses.
    pub(crate) metrics: Option<Arc<crate::telemetry::Metrics>>,
    /// The `protocolVersion` of `initialize`, instead of rmcp's default
    /// (its newest version, 2026-07-28 in rmcp 3.11, which itself has no
    /// `initialize`).
    pub(crate) initialize_version: Option<rmcp::model::ProtocolVersion>,
    /// OAuth bearer tokens for an HTTP server (sent as `Authorization`,
    /// refreshed before each call, renewed once when refused).
    pub(crate) bearer: Option<Bearer>,
}

/// [`connect`] with [`SessionOptions`].
pub(crate) async fn connect_with(
    server: &ServerConfig,
    label: &Label,
    gateway_env: &dyn Environment,
    max_result_bytes: usize,
    redactor: &SharedRedactor,
    options: SessionOptions,
) -> Result<Connected, UpstreamError> {
    let redaction = match &options.bearer {
        Some(bearer) => bearer.redaction(redactor),
        None => Redaction::new(redactor.clone()),
    };
    let connecting = Connecting {
        server,
        label,
        gateway_env,
        max_result_bytes,
        redactor,
        redaction,
        options,
    };
    let timeout = server.connect_timeout;
    // One deadline covers starting, the handshake and every page.
    let deadline = tokio::time::Instant::now() + timeout;
    let cancel = CancellationToken::new();
    let started = match server.lifecycle {
        Lifecycle::Initialize | Lifecycle::Discover => {
            connecting
                .start_by(deadline, &cancel, server.lifecycle)
                .await?
        }
        Lifecycle::Auto => {
            // Try the 2026 lifecycle briefly; on any failure start over on a
            // fresh connection with `initialize`. rmcp's own automatic mode
            // cannot recover from a server that answers `server/discover`
            // with an empty result, so the fallback is done here.
            let probe_deadline = tokio::time::Instant::now() + (timeout / 3).min(AUTO_PROBE);
            let probe_cancel = CancellationToken::new();
            let probe = tokio::time::timeout_at(
                probe_deadline,
                connecting.start(&probe_cancel, Lifecycle::Discover),
            )
            .await;
            match probe {
                Ok(Ok(started)) => {
                    return connecting.finish(started, deadline, probe_cancel).await;
                }
                // No token: the other lifecycle would not get one either.
                Ok(Err(error)) if error.is_credential_failure() => return Err(error),
                Ok(Err(error)) => {
                    probe_cancel.cancel();
                    tracing::debug!(tenant = %label.tenant, server = %label.server, %error, "server/discover failed; falling back to initialize");
                }
                Err(_) => {
                    probe_cancel.cancel();
                    tracing::debug!(tenant = %label.tenant, server = %label.server, "server/discover timed out; falling back to initialize");
                }
            }
            connecting
                .start_by(deadline, &cancel, Lifecycle::Initialize)
                .await?
        }
    };
    connecting.finish(started?, deadline, cancel).await
}

/// How long `lifecycle: auto` tries `server/discover` at most.
const AUTO_PROBE: Duration = Duration::from_secs(5);

type Service = RunningService<RoleClient, handler::GatewayClient>;

/// A started session, and a stdio server's process group.
type Started = (Service, Option<stdio::Group>);

/// The context of one connect, passed from [`connect_with`] to each start
/// and to listing the tools.
struct Connecting<'a> {
    server: &'a ServerConfig,
    label: &'a Label,
    gateway_env: &'a dyn Environment,
    max_result_bytes: usize,
    redactor: &'a SharedRedactor,
    /// `redactor`, and for an OAuth server the live tokens of its client
    /// and the session's own.
    redaction: Redaction,
    options: SessionOptions,
}

impl Connecting<'_> {
    /// [`Self::start`] with `lifecycle`, bounded by the connect `deadline`.
    ///
    /// # Errors
    /// [`UpstreamError::ConnectTimeout`] when the deadline passes first (the
    /// start's own result, `Ok` or `Err`, otherwise).
    async fn start_by(
        &self,
        deadline: tokio::time::Instant,
        cancel: &CancellationToken,
        lifecycle: Lifecycle,
    ) -> Result<Result<Started, UpstreamError>, UpstreamError> {
        tokio::time::timeout_at(deadline, self.start(cancel, lifecycle))
            .await
            .map_err(|_| UpstreamError::ConnectTimeout(self.server.connect_timeout))
    }

    /// Lists the tools of a started session and hands the session out.
    async fn finish(
        self,
        (service, group): Started,
        deadline: tokio::time::Instant,
        cancel: CancellationToken,
    ) -> Result<Connected, UpstreamError> {
        let leased = self.leased(&service, &group);
        let transports = leased.then(|| self.transports()).flatten();
        let Self {
            server,
            label,
            redaction,
            options: SessionOptions { bearer, .. },
            ..
        } = self;
        let timeout = server.connect_timeout;
        // rmcp's per-session response cache would answer lists and reads
        // from memory (and, on an error, silently with a stale copy): the
        // gateway makes every caching decision itself.
        service
            .peer()
            .set_response_cache_config(rmcp::service::ClientCacheConfig::disabled())
            .await;
        let listed = tokio::time::timeout_at(
            deadline,
            listing::list_all_tools(service.peer(), server.max_list_pages, &redaction),
        )
        .await
        .map_err(|_| UpstreamError::ConnectTimeout(timeout));
        let tools = match listed {
            Ok(Ok(tools)) => tools,
            Ok(Err(e)) | Err(e) => {
                let mut service = service;
                let _ = service.close_with_timeout(CLOSE_TIMEOUT).await;
                // The child of a failed connect is stopped too, in the
                // background: the connect fails at once.
                if let Some(group) = group {
                    tokio::spawn(group.stop());
                }
                return Err(e);
            }
        };
        // Prompts, after the tools and within the same deadline, from a
        // server that offers them. A failure refuses its prompts only.
        let offers_prompts = service
            .peer()
            .peer_info()
            .is_some_and(|info| info.capabilities.prompts.is_some());
        let prompts = if offers_prompts {
            let listed = tokio::time::timeout_at(
                deadline,
                listing::list_all_prompts(service.peer(), server.max_list_pages, &redaction),
            )
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "prompts/list did not end within the connect timeout ({})",
                    humantime::format_duration(timeout)
                ))
            });
            if let Err(reason) = &listed {
                tracing::warn!(tenant = %label.tenant, server = %label.server, %reason, "the server's prompts are refused; its tools are kept");
            }
            Some(listed)
        } else {
            None
        };
        // Skills likewise (a 2026-07-28 session whose server declares the
        // extension). A failure refuses its skills only.
        let skills = skills::list_at_connect(
            service.peer(),
            server.max_list_pages,
            &redaction,
            (deadline, timeout),
            label,
        )
        .await;
        let client = service.service().clone();
        let pid = group.as_ref().map(stdio::Group::pid);
        let (end_tx, end) = watch::channel(End::Running);
        let info = service.peer().peer_info();
        let (peers, end_tx) = match (transports, info) {
            // Stateless over HTTP: the connect's service is the first
            // lease; the session ends only when closed.
            (Some(transports), Some(info)) => {
                let leases =
                    lease::Leases::start(service, info, transports, cancel.clone(), lease::LINGER);
                (lease::Peers::Leased(leases), Some(end_tx))
            }
            _ => {
                let peer = service.peer().clone();
                // Every end of the session passes here (closed, evicted,
                // replaced, dropped, the server exited or crashed): once
                // the service loop is over, the session is reported ended
                // at once (calls in flight fail now, the supervisor may
                // reconnect), then a stdio server's whole process group is
                // stopped, and only then is the session closed.
                tokio::spawn(async move {
                    let _ = service.waiting().await;
                    let _ = end_tx.send(End::Ended);
                    if let Some(group) = group {
                        group.stop().await;
                    }
                    let _ = end_tx.send(End::Closed);
                });
                (lease::Peers::Standing(peer), None)
            }
        };
        Ok(Connected {
            session: Arc::new(Session {
                peers,
                client,
                label: label.clone(),
                cancel,
                end,
                end_tx,
                pid,
                redaction,
                redact_results: server.redact_results,
                bearer,
                resources: resources::ListingCache::default(),
            }),
            tools,
            prompts,
            skills,
        })
    }

    /// Starts the transport and runs the lifecycle.
    async fn start(
        &self,
        cancel: &CancellationToken,
        lifecycle: Lifecycle,
    ) -> Result<Started, UpstreamError> {
        let Self {
            server,
            label,
            gateway_env,
            max_result_bytes,
            redactor,
            ref redaction,
            ref options,
        } = *self;
        let url = match &server.transport {
            Transport::Http { url, .. } => Some(url.as_str()),
            Transport::Stdio { .. } => None,
        };
        let handshake = |e: rmcp::service::ClientInitializeError| {
            UpstreamError::Handshake(describe_init_error(&e, url, redaction))
        };
        let client = || self.client();
        match &server.transport {
            Transport::Stdio { command, cwd, env } => {
                let (transport, group) = stdio::spawn(
                    command,
                    cwd.as_deref(),
                    env,
                    gateway_env,
                    label,
                    max_result_bytes,
                    redactor,
                )?;
                match serve(transport, lifecycle, cancel, options, client()).await {
                    Ok(service) => Ok((service, Some(group))),
                    Err(e) => {
                        // The child of a failed handshake is stopped in the
                        // background (an abandoned start drops its group,
                        // which does the same).
                        tokio::spawn(group.stop());
                        Err(handshake(e))
                    }
                }
            }
            Transport::Http {
                url,
                headers,
                tls,
                reach,
            } => {
                // Before anything is sent, a token request included.
                reach::check(url, reach, &label.server).await?;
                let transport = |bearer| {
                    http::transport(
                        url,
                        headers,
                        tls.as_ref(),
                        reach,
                        max_result_bytes,
                        redaction,
                        bearer,
                    )
                };
                let Some(bearer) = &options.bearer else {
                    let transport = transport(None)?;
                    let service = serve(transport, lifecycle, cancel, options, client())
                        .await
                        .map_err(handshake)?;
                    return Ok((service, None));
                };
                // With OAuth: a token first; a refused one is renewed once (a
                // refresh, or step-up to the scopes the challenge names).
                bearer.refresh().await?;
                let mut renewed = false;
                loop {
                    let transport = transport(Some(bearer.clone()))?;
                    match serve(transport, lifecycle, cancel, options, client()).await {
                        Ok(service) => return Ok((service, None)),
                        Err(e) if e.auth_challenge().is_some() || e.is_authorization_required() => {
                            let challenge = e.auth_challenge().map(str::to_owned);
                            if renewed {
                                return Err(UpstreamError::AuthRejected {
                                    challenge: challenge.map(|c| redaction.upstream_text(&c)),
                                });
                            }
                            renewed = true;
                            bearer.refused(challenge.as_deref()).await?;
                        }
                        Err(e) => return Err(handshake(e)),
                    }
                }
            }
        }
    }
}

impl Connecting<'_> {
    /// The client side of a new session: progress redacted with the
    /// session's redaction; the server's `input` and `roots` (and, with
    /// `input.declare_on_session`, the kinds of question it may ask
    /// declared at `initialize`).
    fn client(&self) -> handler::GatewayClient {
        let questions = handler::Questions {
            label: self.label.clone(),
            input: self.server.input.clone(),
            roots: handler::roots(&self.server.roots),
            metrics: self.options.metrics.clone(),
            answerer: self.options.elicitation_answerer,
        };
        handler::GatewayClient::new(self.redaction.clone(), questions)
    }

    /// Whether a started session is leased ([`lease`]): stateless (no
    /// `initialize` in its revision), over HTTP, and not driven through
    /// its peer by `toolgate conformance-client` (which answers
    /// elicitations itself and keeps one service).
    fn leased(&self, service: &Service, group: &Option<stdio::Group>) -> bool {
        let stateless = service
            .peer()
            .peer_info()
            .is_some_and(|info| !info.protocol_version.has_initialize());
        stateless
            && group.is_none()
            && matches!(self.server.transport, Transport::Http { .. })
            && self.options.elicitation_answerer.is_none()
    }

    /// Fresh transports to an HTTP server, as the connect's (for leases);
    /// `None` for a stdio server.
    fn transports(&self) -> Option<lease::Transports> {
        let Transport::Http {
            url,
            headers,
            tls,
            reach,
        } = &self.server.transport
        else {
            return None;
        };
        let (url, headers, tls, reach) = (url.clone(), headers.clone(), tls.clone(), reach.clone());
        let max_result_bytes = self.max_result_bytes;
        let redaction = self.redaction.clone();
        let bearer = self.options.bearer.clone();
        Some(Box::new(move || {
            http::transport(
                &url,
                &headers,
                tls.as_ref(),
                &reach,
                max_result_bytes,
                &redaction,
                bearer.clone(),
            )
        }))
    }
}

/// Runs the MCP lifecycle of `lifecycle` over `transport` with `client`.
async fn serve<T, E, A>(
    transport: T,
    lifecycle: Lifecycle,
    cancel: &CancellationToken,
    options: &SessionOptions,
    client: handler::GatewayClient,
) -> Result<Service, rmcp::service::ClientInitializeError>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let mode = match lifecycle {
        Lifecycle::Discover => rmcp::service::ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        },
        Lifecycle::Initialize | Lifecycle::Auto => rmcp::service::ClientLifecycleMode::Initialize,
    };
    // `initialize` asks for the newest version that still has it (rmcp's
    // default is its newest version, 2026-07-28, which has no `initialize`,
    // and strict servers refuse it).
    let version = options
        .initialize_version
        .clone()
        .unwrap_or(rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE);
    let client = client.with_initialize_version(version);
    // A child token: dropping the service (a leased session's first)
    // must not end the session.
    rmcp::service::serve_client_with_lifecycle_and_ct(client, transport, mode, cancel.child_token())
        .await
}

/// Describes a handshake failure: the server's text with the configured
/// URL, every credential and every live token taken out, cut to
/// [`MAX_UPSTREAM_TEXT`](crate::credentials::MAX_UPSTREAM_TEXT).
fn describe_init_error(
    error: &rmcp::service::ClientInitializeError,
    url: Option<&str>,
    redaction: &Redaction,
) -> String {
    use rmcp::service::ClientInitializeError as E;
    if error.is_authorization_required() || error.auth_challenge().is_some() {
        return "the server refused the gateway's credentials (HTTP 401/403)".to_owned();
    }
    let text = match error {
        E::ConnectionClosed(_) => "the connection closed during the handshake".to_owned(),
        E::JsonRpcError(data) => format!(
            "the server answered error {}: {}",
            data.code.0, data.message
        ),
        E::ExpectedInitResponse(_) | E::ExpectedInitResult(_) => {
            "the server did not answer `initialize` correctly".to_owned()
        }
        E::TransportError { error, .. } => format!("transport error: {}", error::root_cause(error)),
        other => other.to_string(),
    };
    redaction.upstream_text(&redact(&text, url))
}

/// Removes the configured URL (which may carry a token in its query) from
/// a message.
fn redact(text: &str, url: Option<&str>) -> String {
    match url {
        Some(url) if !url.is_empty() => text.replace(url, "<server url>"),
        _ => text.to_owned(),
    }
}

/// Cuts `text` to at most `max` characters.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max).collect();
    cut.push('…');
    cut
}

impl Session {
    /// Calls `request.tool` with its arguments, waiting at most its
    /// `timeout`; the trace context of the call's span goes upstream (or
    /// `inherited_trace`, the caller's own, when trace export is off). On
    /// timeout or when the returned future is dropped (the caller went
    /// away), the server is sent `notifications/cancelled` for the request.
    ///
    /// # Errors
    /// The session is closed, the transport fails, the server answers a
    /// JSON-RPC error or something unsupported, or the timeout passes.
    ///
    /// Tasks (SEP-2663): a call whose worker follows tasks itself
    /// (`accepts_task`) declares the tasks extension and may end in
    /// [`CallOutcome::Task`]. Any other call that the server refuses for
    /// want of the extension (`-32021`: the tool did not run) is sent once
    /// more with it declared when `tasks_allowed`, and a task it becomes is
    /// followed here to its end within `timeout` ([`Session::follow`]).
    pub async fn call(&self, request: &CallRequest) -> Result<CallOutcome, UpstreamError> {
        let deadline = tokio::time::Instant::now() + request.timeout;
        let outcome = match rounds::drive(self, request).await {
            // The tool did not run: send it once more, declaring the
            // extension, and follow the task it becomes.
            Err(UpstreamError::TasksRequired)
                if !request.accepts_task && !request.declare_tasks && request.tasks_allowed =>
            {
                let mut retry = request.clone();
                retry.declare_tasks = true;
                retry.timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
                if retry.timeout.is_zero() {
                    return Err(UpstreamError::Timeout(request.timeout));
                }
                rounds::drive(self, &retry).await
            }
            other => other,
        }?;
        match outcome {
            CallOutcome::Task(created) if !request.accepts_task => self
                .follow(created, request, deadline)
                .await
                .map(CallOutcome::Complete),
            other => Ok(other),
        }
    }

    /// One call with the current credentials: a fresh token before the
    /// call; a refused one (the request did not run) is renewed once and
    /// the call resent.
    async fn call_authorized(&self, request: &CallRequest) -> Result<CallOutcome, UpstreamError> {
        let Some(bearer) = &self.bearer else {
            return self.call_once(request).await;
        };
        bearer.refresh().await?;
        match self.call_once(request).await {
            Err(UpstreamError::AuthRejected { challenge }) => {
                bearer.refused(challenge.as_deref()).await?;
                self.call_once(request).await
            }
            other => other,
        }
    }

    /// One `tools/call` request with the current credentials.
    async fn call_once(&self, call: &CallRequest) -> Result<CallOutcome, UpstreamError> {
        let tool = call.tool.as_str();
        let timeout = call.timeout;
        if self.is_ended() {
            return Err(UpstreamError::Closed);
        }
        let span = tracing::info_span!(
            "mcp.request",
            otel.name = "tools/call",
            otel.kind = "client",
            mcp.method.name = "tools/call",
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = tool,
            tenant = %self.label.tenant,
            server = %self.label.server,
        );
        let mut params =
            CallToolRequestParams::new(tool.to_owned()).with_arguments(call.arguments.clone());
        if let Some(responses) = &call.input_responses {
            params = params.with_input_responses(responses.clone());
        }
        if let Some(state) = &call.request_state {
            params = params.with_request_state(state.clone());
        }
        // The trace context travels in `_meta` for every transport (and
        // is lifted into the `traceparent` header for HTTP servers).
        let mut fields = crate::telemetry::trace::context_fields(&span);
        if fields.is_empty() {
            fields.clone_from(&call.inherited_trace);
        }
        if !fields.is_empty() {
            let mut meta = rmcp::model::RequestMetaObject::new();
            for (key, value) in fields {
                meta.0.insert(key, serde_json::Value::String(value));
            }
            params.meta = Some(meta);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let options = match self.call_meta(call) {
            Some(meta) => PeerRequestOptions::no_options().with_meta(meta),
            None => PeerRequestOptions::no_options(),
        };
        let mut ended = self.end.clone();
        let response = async {
            // In flight from before the send, for tying the server's
            // questions to this call (`ties.rs`).
            let mut tie = self
                .client
                .ties()
                .register(call.accepts, call.asker.clone());
            let live = self.hold().await?;
            let handle = live
                .send_request_with_option(request, options)
                .await
                .map_err(|e| self.classify(e, false))?;
            tie.keyed(handle.id.clone());
            let waited = tie.waited();
            // From here on, leaving early (timeout, caller gone, session
            // lost) tells the server with `notifications/cancelled`.
            let mut cancel = CancelOnDrop {
                peer: live.clone(),
                id: Some(handle.id.clone()),
            };
            let _tracking = call
                .progress
                .clone()
                .map(|sink| self.client.track(handle.progress_token.clone(), sink));
            let result = tokio::select! {
                result = ties::within(timeout, &waited, handle.await_response()) => match result {
                    Ok(result) => result.map_err(|e| self.classify(e, true)),
                    Err(_) => Err(UpstreamError::Timeout(timeout)),
                },
                _ = ended.wait_for(|end| *end >= End::Ended) => Err(UpstreamError::Lost),
                interrupt = tie.interrupted() => Err(interrupt.into()),
            };
            if !matches!(
                result,
                Err(UpstreamError::Timeout(_)
                    | UpstreamError::Lost
                    | UpstreamError::InputRequiresInteractive(_)
                    | UpstreamError::InputAnswerTimeout(_)
                    | UpstreamError::InputRoundsExceeded(_))
            ) {
                cancel.id = None;
            }
            result
        }
        .instrument(span)
        .await?;
        match response {
            ServerResult::CallToolResult(mut result) => {
                if self.redact_results {
                    redact::redact_result(&mut result, &self.redaction);
                }
                Ok(CallOutcome::Complete(result))
            }
            ServerResult::InputRequiredResult(mut asked) => {
                // Questions reach workers: no credential in them.
                if let Some(requests) = &mut asked.input_requests {
                    input::redact_requests(requests, &self.redaction);
                }
                Ok(CallOutcome::InputRequired(asked))
            }
            ServerResult::CreateTaskResult(task) => Ok(CallOutcome::Task(task)),
            // A result without content (some servers answer `{}`).
            ServerResult::EmptyResult(_) => Ok(CallOutcome::Complete(CallToolResult::default())),
            _ => Err(UpstreamError::Protocol(
                "an unknown kind of tools/call result".to_owned(),
            )),
        }
    }

    /// The per-request `_meta` of `call` beyond what rmcp puts in every
    /// request: on a session of protocol 2026-07-28 or later, the client
    /// capabilities the call declares ([`capabilities::capabilities_meta`]);
    /// nothing on older sessions, which declared theirs at `initialize`.
    fn call_meta(&self, call: &CallRequest) -> Option<rmcp::model::RequestMetaObject> {
        if !self.is_stateless() {
            return None;
        }
        let session = rmcp::ClientHandler::get_info(&self.client).capabilities;
        capabilities::capabilities_meta(call, &session)
    }

    /// Maps a request error (its upstream text redacted and bounded). A
    /// transport that failed (the connection lost, the HTTP session
    /// forgotten) ends the session so the supervisor reconnects it; an HTTP
    /// error status answered to this one request fails only this call.
    fn classify(&self, error: rmcp::ServiceError, sent: bool) -> UpstreamError {
        match UpstreamError::from_service(error, &self.redaction) {
            UpstreamError::Closed if sent => UpstreamError::Lost,
            error if error.ends_session() => {
                tracing::warn!(
                    tenant = %self.label.tenant,
                    server = %self.label.server,
                    %error,
                    "transport failed; the session will be reconnected"
                );
                self.stop();
                error
            }
            error @ UpstreamError::HttpStatus { .. } => {
                tracing::warn!(
                    tenant = %self.label.tenant,
                    server = %self.label.server,
                    %error,
                    "the server refused one request; the session is kept"
                );
                error
            }
            other => other,
        }
    }

    /// Whether the session's service loop has ended (child gone,
    /// connection closed).
    pub fn is_ended(&self) -> bool {
        *self.end.borrow() >= End::Ended
    }

    /// Resolves when the session ends.
    pub async fn wait_ended(&self) {
        let mut ended = self.end.clone();
        let _ = ended.wait_for(|end| *end >= End::Ended).await;
    }

    /// List changes and resource updates the server announces.
    pub fn events(&self) -> &SessionEvents {
        self.client.events()
    }

    /// A peer to send on, held (a leased session's service stays open
    /// while it is, and is opened now if none is). Besides the session's
    /// own requests, for `toolgate conformance-client`, which drives
    /// requests the gateway does not make.
    ///
    /// # Errors
    /// A leased session is closed, or opening its service failed (the
    /// transport, or `server/discover`).
    pub(crate) async fn hold(&self) -> Result<lease::Live, UpstreamError> {
        self.peers.hold().await.map_err(|error| match error {
            lease::OpenError::Upstream(error) => error,
            lease::OpenError::Service(error) => self.classify(error, false),
        })
    }

    /// Whether a leased session's service is open now (`false` for a
    /// standing session), for tests of what an idle session holds.
    #[doc(hidden)]
    pub fn holds_service(&self) -> bool {
        self.peers.leases().is_some_and(|leases| leases.is_open())
    }

    /// Ends the session now: its service loop is cancelled; a leased
    /// session is closed at once (nothing of it is left to wait for).
    fn stop(&self) {
        self.cancel.cancel();
        if let Some(leases) = self.peers.leases() {
            leases.close();
        }
        if let Some(end) = &self.end_tx {
            end.send_replace(End::Closed);
        }
    }

    /// Closes the session: for stdio, stdin closed, the grace, then
    /// SIGTERM and SIGKILL of the child's whole process group; the HTTP
    /// session deleted for HTTP. Returns once that is done (for stdio: no
    /// live process left in the group), bounded by [`CLOSE_TIMEOUT`].
    pub async fn close(&self) {
        self.stop();
        let mut closed = self.end.clone();
        if tokio::time::timeout(CLOSE_TIMEOUT, closed.wait_for(|end| *end == End::Closed))
            .await
            .is_err()
        {
            tracing::warn!(
                tenant = %self.label.tenant,
                server = %self.label.server,
                pid = ?self.pid,
                "session did not close in time"
            );
        }
    }
}

/// A session dropped anywhere still closes: its service loop ends and the
/// task that watches it stops the child's process group.
impl Drop for Session {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends `notifications/cancelled` for a request abandoned before its
/// answer arrived.
struct CancelOnDrop {
    /// Held: a stateless session's service stays open to send it.
    peer: lease::Live,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let peer = self.peer.clone();
            tokio::spawn(async move {
                let _ = peer
                    .notify_cancelled(CancelledNotificationParam::new(
                        Some(id),
                        Some("cancelled by the gateway's caller".to_owned()),
                    ))
                    .await;
            });
        }
    }
}
