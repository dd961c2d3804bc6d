//! The gateway's side of an MCP session: its client info and declared
//! capabilities, progress notifications routed to the call they belong to
//! (their message redacted like every other upstream text), and the
//! server's own requests: `roots/list` answered from `servers[].roots`;
//! `elicitation/create` and `sampling/createMessage` tied to one call
//! ([`Ties`]) and put to its worker, or refused with a JSON-RPC error.
//! toolgate never answers a question on a person's behalf: only
//! `toolgate conformance-client` installs an answerer of its own.

// Roots and sampling are deprecated by SEP-2577 but part of every revision
// toolgate speaks.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, ElicitationCapability, ErrorCode, FormElicitationCapability,
    Implementation, ListRootsResult, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    RootsCapabilities, SamplingCapability, UrlElicitationCapability,
};
use rmcp::service::{InboundStreamOrigin, NotificationContext, RequestContext, RoleClient};
use tokio::sync::mpsc;

use super::Label;
use super::input::{Action, Answer, Asked, Question};
use super::ties::{self, Interrupt, Ties, Unanswered};
use crate::config::InputConfig;
use crate::credentials::Redaction;
use crate::telemetry::Metrics;

/// How long a refusal that ends its call waits for the call to end (and
/// its cancellation to leave) before the server gets its answer.
const END_WAIT: Duration = Duration::from_secs(2);

/// JSON-RPC codes of the refusals.
const INVALID_REQUEST: i32 = -32600;
const METHOD_NOT_FOUND: i32 = -32601;

/// Answers an elicitation without asking anyone (`toolgate
/// conformance-client` only; the gateway never sets one).
pub(crate) type ElicitationAnswerer = fn(&ElicitRequestParams) -> ElicitResult;

/// What the session's questions need: whose session it is, the server's
/// `input` settings and `roots`, where refusals are counted.
#[derive(Debug)]
pub(super) struct Questions {
    pub(super) label: Label,
    pub(super) input: InputConfig,
    pub(super) roots: Vec<rmcp::model::Root>,
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) answerer: Option<ElicitationAnswerer>,
}

/// `servers[].roots` as MCP roots.
pub(super) fn roots(configured: &[crate::config::Root]) -> Vec<rmcp::model::Root> {
    configured
        .iter()
        .map(|root| {
            let listed = rmcp::model::Root::new(root.uri.clone());
            match &root.name {
                Some(name) => listed.with_name(name.clone()),
                None => listed,
            }
        })
        .collect()
}

#[cfg(test)]
impl Questions {
    /// The settings of a session that asks nothing of anyone.
    pub(super) fn new(label: Label) -> Self {
        Self {
            label,
            input: InputConfig::default(),
            roots: Vec::new(),
            metrics: None,
            answerer: None,
        }
    }
}

/// Where progress of one call goes, and progress that arrived before its
/// call was registered (a server may report progress before the request's
/// send has returned).
#[derive(Debug, Default)]
struct Routes {
    sinks: HashMap<ProgressToken, mpsc::Sender<ProgressNotificationParam>>,
    early: std::collections::VecDeque<(std::time::Instant, ProgressNotificationParam)>,
}

/// Early progress kept at most this long, and at most this many.
const EARLY_TTL: std::time::Duration = std::time::Duration::from_secs(2);
const EARLY_MAX: usize = 256;

type ProgressSinks = Arc<Mutex<Routes>>;

/// The client handler of one session.
#[derive(Clone, Debug)]
pub(super) struct GatewayClient {
    info: ClientConfig,
    progress: ProgressSinks,
    /// Takes credentials and live tokens out of progress messages.
    redaction: Redaction,
    /// The calls in flight, for tying the server's questions to one.
    ties: Ties,
    questions: Arc<Questions>,
    /// List changes and resource updates the server announces.
    events: Arc<super::events::SessionEvents>,
}

impl GatewayClient {
    /// The handler of a session that declares what `questions` says: the
    /// `roots` capability when roots are configured; with
    /// `input.declare_on_session`, the kinds of question `input` allows;
    /// form elicitation when an answerer is installed.
    pub(super) fn new(redaction: Redaction, questions: Questions) -> Self {
        let mut capabilities = ClientCapabilities::default();
        if !questions.roots.is_empty() {
            capabilities.roots = Some(RootsCapabilities::default());
        }
        let input = &questions.input;
        if input.declare_on_session {
            if input.form || input.url {
                let mut elicitation = ElicitationCapability::new();
                if input.form {
                    elicitation = elicitation.with_form(FormElicitationCapability::new());
                }
                if input.url {
                    elicitation = elicitation.with_url(UrlElicitationCapability::new());
                }
                capabilities.elicitation = Some(elicitation);
            }
            if input.sampling {
                capabilities.sampling = Some(SamplingCapability::default());
            }
        }
        if questions.answerer.is_some() {
            capabilities.elicitation =
                Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        }
        // The skills extension (SEP-2640): toolgate speaks `skills/list`
        // and `skills/get` to servers that declare it (2026-07-28 sessions).
        capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(
                rmcp::model::SKILLS_EXTENSION_ID.to_owned(),
                Default::default(),
            );
        Self {
            info: ClientConfig::new(
                capabilities,
                Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
            ),
            progress: Arc::default(),
            redaction,
            ties: Ties::default(),
            questions: Arc::new(questions),
            events: Arc::default(),
        }
    }

    /// List changes and resource updates the server announces.
    pub(super) fn events(&self) -> &Arc<super::events::SessionEvents> {
        &self.events
    }

    /// The calls in flight on this session.
    pub(super) fn ties(&self) -> &Ties {
        &self.ties
    }

    /// The session's question settings.
    pub(super) fn questions(&self) -> &Questions {
        &self.questions
    }

    /// Asks `initialize` for `version` rather than rmcp's default.
    pub(super) fn with_initialize_version(mut self, version: ProtocolVersion) -> Self {
        self.info.protocol_version = version;
        self
    }

    /// Hands a progress notification, its message redacted, to its call,
    /// or keeps it a while for a call not registered yet.
    fn route(&self, mut params: ProgressNotificationParam) {
        if let Some(message) = &mut params.message {
            self.redaction.redact_in_place(message);
        }
        let mut routes = self.progress.lock().expect("progress lock");
        match routes.sinks.get(&params.progress_token) {
            // A full buffer means the caller is slow: drop, never block the
            // session's message loop.
            Some(sink) => {
                let _ = sink.try_send(params);
            }
            None => {
                let now = std::time::Instant::now();
                while routes
                    .early
                    .front()
                    .is_some_and(|(at, _)| now.duration_since(*at) > EARLY_TTL)
                    || routes.early.len() >= EARLY_MAX
                {
                    routes.early.pop_front();
                }
                routes.early.push_back((now, params));
            }
        }
    }

    /// Routes progress with `token` to `sink` until the guard is dropped.
    pub(super) fn track(
        &self,
        token: ProgressToken,
        sink: mpsc::Sender<ProgressNotificationParam>,
    ) -> Tracking {
        let mut routes = self.progress.lock().expect("progress lock");
        let early = std::mem::take(&mut routes.early);
        for (at, params) in early {
            if params.progress_token == token {
                let _ = sink.try_send(params);
            } else {
                routes.early.push_back((at, params));
            }
        }
        routes.sinks.insert(token.clone(), sink);
        drop(routes);
        Tracking {
            sinks: self.progress.clone(),
            token,
        }
    }
}

/// Stops routing a call's progress when dropped.
#[derive(Debug)]
pub(super) struct Tracking {
    sinks: ProgressSinks,
    token: ProgressToken,
}

impl Drop for Tracking {
    fn drop(&mut self) {
        self.sinks
            .lock()
            .expect("progress lock")
            .sinks
            .remove(&self.token);
    }
}

impl GatewayClient {
    /// Puts `question` (of server request `method`) to the worker of the
    /// call it is tied to, and returns the worker's answer; or the
    /// JSON-RPC error the server gets instead.
    async fn ask(
        &self,
        method: &'static str,
        question: Question,
        context: &RequestContext<RoleClient>,
    ) -> Result<Answer, rmcp::ErrorData> {
        let Questions { label, input, .. } = &*self.questions;
        let kind = question.kind();
        let refuse = |reason: &str, code: i32, message: String| {
            if let Some(metrics) = &self.questions.metrics {
                metrics.input_refused(&label.tenant, &label.server, reason);
            }
            rmcp::ErrorData::new(ErrorCode(code), message, None)
        };
        let size = ties::question_bytes(&question);
        if size > ties::MAX_QUESTION_BYTES {
            tracing::warn!(tenant = %label.tenant, server = %label.server, method, size, "a question of the server is over 64 KiB; refused");
            return Err(refuse(
                "too_large",
                INVALID_REQUEST,
                format!("toolgate: the question is {size} bytes, over 65536"),
            ));
        }
        let origin = context.extensions.get::<InboundStreamOrigin>();
        let tied = match self.ties.tie(origin).await {
            Ok(tied) => tied,
            Err(untied) => {
                tracing::warn!(
                    tenant = %label.tenant,
                    server = %label.server,
                    method,
                    calls_in_flight = untied.in_flight,
                    "a request of the server cannot be tied to one call; refused"
                );
                return Err(refuse(
                    "untied",
                    INVALID_REQUEST,
                    "toolgate: cannot tie this request to one call".to_owned(),
                ));
            }
        };
        if !tied.accepts.accepts(&question) {
            tracing::info!(tenant = %label.tenant, server = %label.server, method, kind = kind.as_str(), "the call's worker does not answer this kind of question; refused");
            return Err(refuse(
                "not_opted_in",
                METHOD_NOT_FOUND,
                format!(
                    "toolgate: this call's worker does not answer {}",
                    kind.as_str()
                ),
            ));
        }
        if tied.number > input.max_rounds {
            tracing::warn!(tenant = %label.tenant, server = %label.server, method, max_rounds = input.max_rounds, "the server asked one call more questions than input.max_rounds; the call is cancelled");
            self.ties
                .interrupt(tied.key, Interrupt::RoundsExceeded(input.max_rounds));
            let _ = tokio::time::timeout(END_WAIT, self.ties.ended(tied.key)).await;
            return Err(refuse(
                "rounds_exceeded",
                INVALID_REQUEST,
                format!(
                    "toolgate: more than {} questions for one call",
                    input.max_rounds
                ),
            ));
        }
        let Some(asker) = tied.asker else {
            // Opted in, but only InvokeToolInteractive can carry the
            // question: the call ends (cancelled upstream) first.
            tracing::info!(tenant = %label.tenant, server = %label.server, method, kind = kind.as_str(), "a question for a call that is not interactive; the call is cancelled");
            self.ties
                .interrupt(tied.key, Interrupt::NeedsInteractive(kind));
            let _ = tokio::time::timeout(END_WAIT, self.ties.ended(tied.key)).await;
            return Err(refuse(
                "needs_interactive",
                METHOD_NOT_FOUND,
                "toolgate: this call's worker answers questions only over InvokeToolInteractive"
                    .to_owned(),
            ));
        };
        let asked = vec![Asked {
            id: tied.id.clone(),
            question,
        }];
        // The call's upstream timeout stands still while the worker thinks.
        let waiting = self.ties.waiting(tied.key);
        let answered = tokio::select! {
            answered = ties::ask(&asker, asked, input.answer_timeout) => answered,
            () = self.ties.ended(tied.key) => Err(Unanswered::Gone),
            () = context.ct.cancelled() => Err(Unanswered::Gone),
        };
        drop(waiting);
        let unanswered =
            |why: &str| refuse("unanswered", INVALID_REQUEST, format!("toolgate: {why}"));
        match answered {
            Ok(answers) => answers
                .into_iter()
                .find(|a| a.id == tied.id)
                .ok_or_else(|| unanswered("the worker gave no answer")),
            Err(Unanswered::Gone) => Err(unanswered("the call ended before the worker answered")),
            Err(Unanswered::Timeout) => {
                self.ties
                    .interrupt(tied.key, Interrupt::AnswerTimeout(input.answer_timeout));
                let _ = tokio::time::timeout(END_WAIT, self.ties.ended(tied.key)).await;
                Err(unanswered("the worker did not answer in time"))
            }
        }
    }
}

impl rmcp::ClientHandler for GatewayClient {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        if let Some(answerer) = self.questions.answerer {
            return Ok(answerer(&request));
        }
        let Some(mut question) = Question::from_elicitation(&request) else {
            return Err(rmcp::ErrorData::invalid_params(
                "toolgate: an elicitation mode it does not know",
                None,
            ));
        };
        // Questions reach workers: no credential in them.
        question.redact(&self.redaction);
        let answer = self
            .ask("elicitation/create", question.clone(), &context)
            .await?;
        answer
            .to_elicit_result(&question)
            .map_err(|e| rmcp::ErrorData::internal_error(format!("toolgate: {e}"), None))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, rmcp::ErrorData> {
        let mut question = Question::from_sampling(&params);
        question.redact(&self.redaction);
        let answer = self
            .ask("sampling/createMessage", question, &context)
            .await?;
        if answer.action != Action::Accept {
            return Err(rmcp::ErrorData::new(
                ErrorCode(-1),
                "user rejected sampling",
                None,
            ));
        }
        answer
            .to_sampling_result()
            .map_err(|e| rmcp::ErrorData::internal_error(format!("toolgate: {e}"), None))
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, rmcp::ErrorData> {
        Ok(ListRootsResult::new(self.questions.roots.clone()))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.route(params);
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.events.resource_updated(params.uri);
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.events.list_changed(super::events::ListKind::Resources);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.events.list_changed(super::events::ListKind::Prompts);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.events.list_changed(super::events::ListKind::Tools);
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::NumberOrString;

    use super::*;
    use crate::credentials::Redactor;

    #[tokio::test]
    async fn progress_messages_are_redacted_early_or_not() {
        let secret = Redactor::new(["tok-4f1b2c3d4e5f"]).shared();
        let label = Label {
            tenant: "t".into(),
            server: "s".into(),
        };
        let client = GatewayClient::new(Redaction::new(secret), Questions::new(label));
        let token = ProgressToken(NumberOrString::Number(7));
        let said = |progress: f64| {
            ProgressNotificationParam::new(token.clone(), progress)
                .with_message("sent tok-4f1b2c3d4e5f")
        };
        // Before the call is registered, then after.
        client.route(said(1.0));
        let (sink, mut received) = mpsc::channel(4);
        let _tracking = client.track(token.clone(), sink);
        client.route(said(2.0));
        for progress in [1.0, 2.0] {
            let params = received.recv().await.expect("relayed");
            assert_eq!(params.progress, progress);
            assert_eq!(params.message.as_deref(), Some("sent [redacted]"));
        }
    }
}
