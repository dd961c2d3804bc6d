//! The gateway's side of an MCP session: its client info, and progress
//! notifications routed to the call they belong to, their message redacted
//! like every other upstream text. Sessions of
//! `toolgate conformance-client` may also opt in to answering elicitations
//! (accept, with the schema's defaults); the gateway's own never do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, FormElicitationCapability, Implementation, ProgressNotificationParam,
    ProgressToken, ProtocolVersion,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};
use tokio::sync::mpsc;

use crate::credentials::Redaction;

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
    /// Accept elicitations with the schema's defaults (and declare the
    /// capability). Off for the gateway's sessions.
    elicitation_defaults: bool,
    /// Takes credentials and live tokens out of progress messages.
    redaction: Redaction,
}

impl GatewayClient {
    pub(super) fn new(redaction: Redaction) -> Self {
        Self {
            info: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
            ),
            progress: Arc::default(),
            elicitation_defaults: false,
            redaction,
        }
    }

    /// Declares form elicitation and accepts every elicitation with the
    /// defaults of its schema ([`accept_with_defaults`]).
    pub(super) fn with_elicitation_defaults(mut self) -> Self {
        self.info.capabilities.elicitation =
            Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        self.elicitation_defaults = true;
        self
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

/// Accepts an elicitation, giving every property of a form's schema its
/// `default`, or else a placeholder of its type (`true`, the first enum
/// value, `0`, `"conformance"`). A URL elicitation is declined.
pub(crate) fn accept_with_defaults(params: &ElicitRequestParams) -> ElicitResult {
    let ElicitRequestParams::FormElicitationParams {
        requested_schema, ..
    } = params
    else {
        return ElicitResult::new(ElicitationAction::Decline);
    };
    let schema = serde_json::to_value(requested_schema).unwrap_or_default();
    let mut content = serde_json::Map::new();
    if let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) {
        for (name, property) in properties {
            let value = property.get("default").cloned().or_else(|| {
                let first_enum = property
                    .get("enum")
                    .or_else(|| property.get("oneOf"))
                    .and_then(|e| e.as_array())
                    .and_then(|e| e.first())
                    .map(|first| first.get("const").unwrap_or(first).clone());
                match property.get("type").and_then(|t| t.as_str()) {
                    Some("boolean") => Some(serde_json::Value::Bool(true)),
                    _ if first_enum.is_some() => first_enum,
                    Some("number" | "integer") => Some(0.into()),
                    Some("string") => Some("conformance".into()),
                    _ => None,
                }
            });
            if let Some(value) = value {
                content.insert(name.clone(), value);
            }
        }
    }
    ElicitResult::new(ElicitationAction::Accept).with_content(serde_json::Value::Object(content))
}

impl rmcp::ClientHandler for GatewayClient {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        if self.elicitation_defaults {
            Ok(accept_with_defaults(&request))
        } else {
            // rmcp's default: decline.
            Ok(ElicitResult::new(ElicitationAction::Decline))
        }
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.route(params);
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
        let client = GatewayClient::new(Redaction::new(secret));
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
