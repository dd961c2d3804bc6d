//! Keeps one slot connected: connects, waits for the session to end, and
//! reconnects with exponential backoff and jitter, until the slot is
//! stopped. The tool list is re-read on every connect, so a changed list
//! gives a new catalog version. Calls are never replayed.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use super::slot::{Slot, SlotState};
use crate::config::Environment;
use crate::telemetry::Metrics;
use crate::upstream::{self, Label};

/// A session that lived at least this long resets the backoff.
const STABLE_SESSION: Duration = Duration::from_secs(30);

/// The supervisor of one slot.
pub(super) struct Supervisor {
    pub(super) env: Arc<dyn Environment>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) max_result_bytes: usize,
    pub(super) redactor: crate::credentials::SharedRedactor,
    pub(super) tenant: String,
    pub(super) slot: Arc<Slot>,
    /// Ends this supervisor (the slot's activation).
    pub(super) stop: tokio_util::sync::CancellationToken,
}

impl Supervisor {
    pub(super) async fn run(self) {
        let server = &self.slot.config;
        let tenant = &self.tenant;
        let stop = self.stop.clone();
        let label = Label {
            tenant: tenant.clone(),
            server: server.name.clone(),
        };
        let mut attempt: u32 = 0;
        let mut first_attempt_done = false;
        let mut last_tools: Option<Arc<Vec<rmcp::model::Tool>>> = None;
        loop {
            // A panic while connecting (a bug, or a misbehaving library)
            // must fail this attempt, not leave the slot "connecting".
            let connect = AssertUnwindSafe(upstream::connect(
                server,
                &label,
                self.env.as_ref(),
                self.max_result_bytes,
                &self.redactor,
            ))
            .catch_unwind();
            let result = tokio::select! {
                result = connect => result.unwrap_or_else(|_| {
                    Err(upstream::UpstreamError::Handshake(
                        "the connection attempt panicked (a bug: see the gateway log)".to_owned(),
                    ))
                }),
                () = stop.cancelled() => return,
            };
            // Any attempt after the first is a reconnect, whatever the backoff.
            let retry = std::mem::replace(&mut first_attempt_done, true);
            let reason = match result {
                Ok(connected) => {
                    tracing::info!(
                        tenant = %tenant,
                        server = %server.name,
                        tools = connected.tools.len(),
                        reconnect = retry,
                        "upstream connected"
                    );
                    self.metrics
                        .connect_result(tenant, &server.name, true, retry);
                    let session = connected.session.clone();
                    let tools = Arc::new(connected.tools);
                    last_tools = Some(tools.clone());
                    self.slot.set_state(
                        &stop,
                        SlotState::Ready {
                            session: connected.session,
                            tools,
                        },
                    );
                    let up_since = tokio::time::Instant::now();
                    tokio::select! {
                        () = session.wait_ended() => {}
                        () = stop.cancelled() => return,
                    }
                    tracing::warn!(tenant = %tenant, server = %server.name, "upstream session ended");
                    self.metrics.session_lost(tenant, &server.name);
                    if up_since.elapsed() >= STABLE_SESSION {
                        attempt = 0;
                    }
                    "the session ended (server exited or closed the connection)".to_owned()
                }
                Err(error) => {
                    tracing::warn!(tenant = %tenant, server = %server.name, %error, "upstream connect failed");
                    self.metrics
                        .connect_result(tenant, &server.name, false, retry);
                    error.to_string()
                }
            };
            let delay = backoff(server.reconnect, attempt);
            attempt = attempt.saturating_add(1);
            self.slot.set_state(
                &stop,
                SlotState::Failed {
                    reason: format!(
                        "{reason}; reconnect attempt {attempt} scheduled {} after the failure",
                        humantime::format_duration(Duration::from_millis(delay.as_millis() as u64))
                    ),
                    last_tools: last_tools.clone(),
                },
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

/// The delay before reconnect attempt `attempt` (0-based): `initial × 2^n`
/// capped at `max`, with "equal jitter" (half fixed, half random) so that
/// many sessions lost together do not reconnect in step.
pub(super) fn backoff(policy: crate::config::Reconnect, attempt: u32) -> Duration {
    let exp = policy
        .initial
        .saturating_mul(2u32.saturating_pow(attempt.min(20)))
        .min(policy.max);
    let half = exp / 2;
    half + half.mul_f64(fastrand::f64())
}
