//! The sweep of call approvals, run by every replica that has a state
//! store: approvals past their expiry are marked expired (each by exactly
//! one replica, which records it), rows that ended a week ago are
//! deleted, and the pending gauge is refreshed.

use std::time::Duration;

use super::{CallApprovals, Details};
use crate::audit::CallApprovalEvent;
use crate::state::now_ms;

/// How often the sweep runs.
pub const EVERY: Duration = Duration::from_secs(15);

/// How long an approval that ended is kept (for approvers' listings and a
/// worker's late retry, which then learns how it ended).
pub const KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

impl CallApprovals {
    /// One sweep; returns how many approvals it marked expired.
    pub(crate) async fn sweep(&self) -> usize {
        let Some(store) = &self.store else { return 0 };
        let forget_before = now_ms().saturating_sub(super::hold::millis(KEPT));
        let expired = match store.expire_call_approvals(forget_before).await {
            Ok(expired) => expired,
            Err(error) => {
                tracing::debug!(%error, "call approvals: the sweep could not reach the state store");
                return 0;
            }
        };
        for row in &expired {
            let Ok(details) = Details::from_bytes(&row.value) else {
                continue;
            };
            self.audit.call_approval(&CallApprovalEvent {
                event: "call_approval_expired",
                tenant: &row.tenant,
                subject: &row.subject,
                caller: None,
                approval_id: &row.id,
                tool: &details.tool,
                server: &details.server,
                definition_hash: &details.definition_hash,
                rule: &details.rule,
                note: None,
                reason: Some(if row.decided_at_ms > 0 {
                    "approved, not used in time"
                } else {
                    "not decided in time"
                }),
                trace_id: None,
            });
            self.metrics.call_approvals().event(&row.tenant, "expired");
        }
        if !expired.is_empty() {
            // Calls waiting here learn it at once.
            self.decided.notify_waiters();
        }
        if let Ok(pending) = store.pending_call_approvals().await {
            self.metrics.call_approvals().set_pending(&pending);
        }
        expired.len()
    }

    /// Wakes the calls and watches of this replica at every request or
    /// decision another replica announces (PostgreSQL), listening again
    /// after a lost connection, until `stop` is cancelled.
    pub(crate) async fn follow_until(self, stop: tokio_util::sync::CancellationToken) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let listening = &self.listening;
        let follow = async {
            loop {
                match store.listen_call_approvals().await {
                    Ok(None) => return,
                    Ok(Some(mut notices)) => {
                        listening.store(true, std::sync::atomic::Ordering::Relaxed);
                        // What was announced before listening began.
                        self.decided.notify_waiters();
                        while notices.next().await.is_ok() {
                            self.decided.notify_waiters();
                        }
                        listening.store(false, std::sync::atomic::Ordering::Relaxed);
                        tracing::debug!(
                            "call approvals: the listener's connection was lost; listening again"
                        );
                    }
                    Err(error) => {
                        tracing::debug!(%error, "call approvals: cannot listen to the other replicas yet");
                    }
                }
                tokio::time::sleep(EVERY.min(Duration::from_secs(1))).await;
            }
        };
        tokio::select! {
            () = stop.cancelled() => {}
            () = follow => {}
        }
        self.listening
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sweeps every [`EVERY`] until `stop` is cancelled.
    pub(crate) async fn sweep_until(self, stop: tokio_util::sync::CancellationToken) {
        if self.store.is_none() {
            return;
        }
        let mut ticks = tokio::time::interval(EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {
                    self.sweep().await;
                }
            }
        }
    }
}
