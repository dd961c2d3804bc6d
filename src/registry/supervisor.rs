//! Keeps one slot connected: connects, waits for the session to end, and
//! reconnects with exponential backoff and jitter, until the slot is
//! stopped. The tool and prompt lists are read on every connect, and again
//! when the server says they changed (`list_changed`), so a changed list
//! gives a new catalog version. Calls are never replayed.

use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use super::slot::{Slot, SlotState};
use crate::config::Environment;
use crate::state::TokenKey;
use crate::telemetry::Metrics;
use crate::upstream::{self, Label};

/// How long a server's lists must be quiet after a `list_changed` before
/// they are read again (changes come in bursts).
const RELIST_DEBOUNCE: Duration = Duration::from_secs(1);

/// A session that lived at least this long resets the backoff.
const STABLE_SESSION: Duration = Duration::from_secs(30);

/// The supervisor of one slot.
pub(super) struct Supervisor {
    pub(super) env: Arc<dyn Environment>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) max_result_bytes: usize,
    pub(super) redactor: crate::credentials::SharedRedactor,
    pub(super) oauth: Option<super::OAuthContext>,
    /// Who hears of the sessions established (a reconnect closes the
    /// server's circuit breakers).
    pub(super) events: Arc<std::sync::OnceLock<Arc<dyn super::SessionEvents>>>,
    pub(super) tenant: String,
    pub(super) slot: Arc<Slot>,
    /// Ends this supervisor (the slot's activation).
    pub(super) stop: tokio_util::sync::CancellationToken,
}

impl Supervisor {
    /// While `session` lives: reads its tool and prompt lists again
    /// when the server says they changed (after [`RELIST_DEBOUNCE`] of
    /// quiet, with the connect's bounds and timeout) and republishes the
    /// slot's state, keeping `last_tools` current. `Break` when the
    /// supervisor is stopped, `Continue` once the session has ended.
    async fn follow_lists(
        &self,
        session: &Arc<upstream::Session>,
        stop: &tokio_util::sync::CancellationToken,
        last_tools: &mut Option<Arc<Vec<rmcp::model::Tool>>>,
    ) -> ControlFlow<()> {
        use upstream::ListKind;
        let server = &self.slot.config;
        let mut tools_generation = session.events().list_generation(ListKind::Tools);
        let mut prompts_generation = session.events().list_generation(ListKind::Prompts);
        // Skills, of a session that offers them: their own generation, and
        // the resources' (a skill's files are resources: a changed resource
        // list may be a changed skill).
        let offers_skills =
            upstream::skills::offers_skills(&session.server_capabilities(), session.is_stateless());
        let mut skills_generation = session.events().list_generation(ListKind::Skills);
        let mut resources_generation = session.events().list_generation(ListKind::Resources);
        let skills_seen =
            |skills: &mut tokio::sync::watch::Receiver<u64>,
             resources: &mut tokio::sync::watch::Receiver<u64>| {
                *skills.borrow_and_update() + *resources.borrow_and_update()
            };
        let mut seen = (
            *tools_generation.borrow_and_update(),
            *prompts_generation.borrow_and_update(),
            skills_seen(&mut skills_generation, &mut resources_generation),
        );
        // Boxed, and dropped once done (at once for a server that announces
        // no list changes): inline, its service opening and stream would
        // size this task, which lives as long as the slot, for every idle
        // pair.
        let mut follow = Some(Box::pin(session.follow_list_changes()));
        let ended = || async {
            tokio::select! {
                () = session.wait_ended() => ControlFlow::Continue(()),
                () = stop.cancelled() => ControlFlow::Break(()),
            }
        };
        loop {
            let woken = tokio::select! {
                flow = ended() => return flow,
                () = async { follow.as_mut().expect("guarded").await }, if follow.is_some() => {
                    follow = None;
                    continue;
                }
                changed = tools_generation.changed() => changed.is_ok(),
                changed = prompts_generation.changed() => changed.is_ok(),
                changed = skills_generation.changed(), if offers_skills => changed.is_ok(),
                changed = resources_generation.changed(), if offers_skills => changed.is_ok(),
            };
            if !woken {
                // The session's events are gone with it.
                return ended().await;
            }
            // Changes come in bursts: one re-listing after a quiet moment.
            tokio::select! {
                flow = ended() => return flow,
                () = tokio::time::sleep(RELIST_DEBOUNCE) => {}
            }
            let now = (
                *tools_generation.borrow_and_update(),
                *prompts_generation.borrow_and_update(),
                skills_seen(&mut skills_generation, &mut resources_generation),
            );
            let (tools_changed, prompts_changed, skills_changed) =
                (now.0 != seen.0, now.1 != seen.1, now.2 != seen.2);
            seen = now;
            let SlotState::Ready {
                tools,
                prompts,
                skills,
                ..
            } = self.slot.state()
            else {
                continue;
            };
            // The listings are boxed: they would size the task too.
            let tools = if tools_changed {
                match Box::pin(session.list_tools(server.max_list_pages, server.connect_timeout))
                    .await
                {
                    Ok(listed) => Arc::new(listed),
                    Err(error) => {
                        tracing::warn!(tenant = %self.tenant, server = %server.name, %error, "re-listing the tools after list_changed failed; the previous list is kept");
                        tools
                    }
                }
            } else {
                tools
            };
            let prompts = if prompts_changed {
                Box::pin(session.list_prompts(server.max_list_pages, server.connect_timeout))
                    .await
                    .map(Arc::new)
            } else {
                prompts
            };
            let skills = if skills_changed {
                Box::pin(session.list_skills(server.max_list_pages, server.connect_timeout))
                    .await
                    .map(Arc::new)
            } else {
                skills
            };
            tracing::info!(
                tenant = %self.tenant,
                server = %server.name,
                tools = tools.len(),
                tools_changed,
                prompts_changed,
                skills_changed,
                "lists read again after list_changed"
            );
            *last_tools = Some(tools.clone());
            self.slot.set_state(
                stop,
                SlotState::Ready {
                    session: session.clone(),
                    tools,
                    prompts,
                    skills,
                },
            );
        }
    }

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
            // The connect future (several KiB: rmcp's handshake and the
            // tool listing) is boxed, so it is freed once connected instead
            // of sizing this task for as long as the session lives.
            let connect = AssertUnwindSafe(Box::pin(self.connect(&label))).catch_unwind();
            let result = tokio::select! {
                result = connect => result.unwrap_or_else(|_| {
                    Err(Attempt::Failed(upstream::UpstreamError::Handshake(
                        "the connection attempt panicked (a bug: see the gateway log)".to_owned(),
                    )))
                }),
                () = stop.cancelled() => return,
            };
            let result = match result {
                Ok(connected) => Ok(connected),
                Err(Attempt::Failed(error)) => Err(error),
                Err(Attempt::Unauthorized(reason)) => {
                    // Nothing to list with until someone consents: wait for
                    // a consent here (the wake) or elsewhere (a replica's,
                    // seen at the next look).
                    tracing::debug!(tenant = %tenant, server = %server.name, "waiting for a first authorization to list the server's tools");
                    self.slot
                        .set_state(&stop, SlotState::AuthorizationRequired { reason });
                    tokio::select! {
                        () = tokio::time::sleep(server.reconnect.max) => {}
                        () = self.slot.wake.notified() => {}
                        () = stop.cancelled() => return,
                    }
                    continue;
                }
            };
            // Any attempt after the first is a reconnect, whatever the backoff.
            let retry = std::mem::replace(&mut first_attempt_done, true);
            let reason = match result {
                Ok(connected) => {
                    tracing::info!(
                        tenant = %tenant,
                        server = %server.name,
                        tools = connected.tools.len(),
                        prompts = connected.prompts.as_ref().and_then(|p| p.as_ref().ok()).map_or(0, Vec::len),
                        reconnect = retry,
                        "upstream connected"
                    );
                    self.metrics
                        .connect_result(tenant, &server.name, true, retry);
                    if let Some(events) = self.events.get() {
                        events.connected(tenant, &server.name, None);
                    }
                    let session = connected.session.clone();
                    let tools = Arc::new(connected.tools);
                    last_tools = Some(tools.clone());
                    self.slot.set_state(
                        &stop,
                        SlotState::Ready {
                            session: connected.session,
                            tools,
                            prompts: connected.prompts.map(Arc::new),
                            skills: connected.skills.map(Arc::new),
                        },
                    );
                    let up_since = tokio::time::Instant::now();
                    if self
                        .follow_lists(&session, &stop, &mut last_tools)
                        .await
                        .is_break()
                    {
                        return;
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
                () = self.slot.wake.notified() => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// One connect: with the server's own credentials, or, for an OAuth
    /// server, with the token [`super::oauth`] says lists its tools.
    async fn connect(&self, label: &Label) -> Result<upstream::Connected, Attempt> {
        let server = &self.slot.config;
        let connect = |options: upstream::SessionOptions| {
            // The session counts the questions of its server it refuses.
            let options = upstream::SessionOptions {
                metrics: Some(self.metrics.clone()),
                ..options
            };
            upstream::connect_with(
                server,
                label,
                self.env.as_ref(),
                self.max_result_bytes,
                &self.redactor,
                options,
            )
        };
        let client = match &self.slot.oauth {
            Ok(None) => {
                return connect(upstream::SessionOptions::default())
                    .await
                    .map_err(Attempt::Failed);
            }
            Ok(Some(client)) => client,
            Err(reason) => {
                return Err(Attempt::Failed(upstream::UpstreamError::OAuthFailed(
                    reason.clone(),
                )));
            }
        };
        if !self.slot.per_user() {
            let key = TokenKey::tenant_wide(&self.tenant, &server.name);
            return connect(super::oauth::options_for(client, key))
                .await
                .map_err(Attempt::Failed);
        }
        let Some(context) = &self.oauth else {
            return Err(Attempt::Failed(upstream::UpstreamError::StateUnavailable(
                "no state store is open".to_owned(),
            )));
        };
        let candidates = super::oauth::listing_candidates(context, &self.tenant, &server.name)
            .await
            .map_err(|e| Attempt::Failed(upstream::UpstreamError::StateUnavailable(e)))?;
        for key in candidates {
            match connect(super::oauth::options_for(client, key)).await {
                // That grant has ended (or, delegated, no JWT of that
                // subject is left to exchange): the next subject's may list.
                Err(
                    upstream::UpstreamError::AuthorizationRequired { .. }
                    | upstream::UpstreamError::Delegation(_),
                ) => {}
                other => return other.map_err(Attempt::Failed),
            }
        }
        if client.is_delegated() {
            return Err(Attempt::Unauthorized(format!(
                "no JWT caller has called this server yet (grant: {}): its tools are listed \
                 with the first caller's exchanged token",
                client.settings().grant
            )));
        }
        Err(Attempt::Unauthorized(
            "no end user has authorized this server yet; a call gets the authorization URL \
             for its subject (x-toolgate-subject), and the tools are listed after the first \
             consent"
                .to_owned(),
        ))
    }
}

/// Why a connect attempt gave no session.
enum Attempt {
    /// It failed (counted, backed off, reconnected).
    Failed(upstream::UpstreamError),
    /// A per-user server that nobody has authorized: nothing to list with.
    Unauthorized(String),
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
