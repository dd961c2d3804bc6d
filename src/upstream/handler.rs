//! The gateway's side of an MCP session: its client info, and progress
//! notifications routed to the call they belong to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{NotificationContext, RoleClient};
use tokio::sync::mpsc;

/// Where progress of one call goes.
type ProgressSinks = Arc<Mutex<HashMap<ProgressToken, mpsc::Sender<ProgressNotificationParam>>>>;

/// The client handler of one session.
#[derive(Clone, Debug)]
pub(super) struct GatewayClient {
    info: ClientConfig,
    progress: ProgressSinks,
}

impl GatewayClient {
    pub(super) fn new() -> Self {
        Self {
            info: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
            ),
            progress: Arc::default(),
        }
    }

    /// Routes progress with `token` to `sink` until the guard is dropped.
    pub(super) fn track(
        &self,
        token: ProgressToken,
        sink: mpsc::Sender<ProgressNotificationParam>,
    ) -> Tracking {
        self.progress
            .lock()
            .expect("progress lock")
            .insert(token.clone(), sink);
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
            .remove(&self.token);
    }
}

impl rmcp::ClientHandler for GatewayClient {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let sink = self
            .progress
            .lock()
            .expect("progress lock")
            .get(&params.progress_token)
            .cloned();
        if let Some(sink) = sink {
            // A full buffer means the caller is slow: drop, never block the
            // session's message loop.
            let _ = sink.try_send(params);
        }
    }
}
