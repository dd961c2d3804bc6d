//! Per-user sessions of a per-user (OAuth `authorization_code`) server: one
//! session per subject, connected on the subject's first call with that
//! subject's token, closed after the tenant's `idle_timeout` without use,
//! and counted in `sessions.max_live` like every other session.
//!
//! A subject's session only ever carries that subject's token: the token
//! source of a session is fixed when it connects, and sessions are keyed by
//! subject.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::upstream::{Session, UpstreamError};

/// One subject's session and when it was last used.
#[derive(Debug, Default)]
struct UserEntry {
    /// Serialises connects: concurrent first calls of a subject share one.
    connecting: tokio::sync::Mutex<()>,
    session: Mutex<Option<Arc<Session>>>,
    /// When the subject last used the session, in the registry's ms.
    last_used: AtomicU64,
}

/// The per-user sessions of one server slot.
#[derive(Debug, Default)]
pub(super) struct UserSessions {
    entries: Mutex<HashMap<String, Arc<UserEntry>>>,
}

impl UserSessions {
    /// The live session of `subject`, or a new one from `connect`.
    ///
    /// # Errors
    /// What `connect` failed with (no token for the subject, the state
    /// store down, the server unreachable).
    pub(super) async fn get<F>(
        &self,
        subject: &str,
        now_ms: u64,
        connect: F,
    ) -> Result<Arc<Session>, UpstreamError>
    where
        F: Future<Output = Result<Arc<Session>, UpstreamError>>,
    {
        let entry = self
            .entries
            .lock()
            .expect("user sessions lock")
            .entry(subject.to_owned())
            .or_default()
            .clone();
        entry.last_used.store(now_ms, Ordering::Relaxed);
        if let Some(session) = entry.live() {
            return Ok(session);
        }
        let _connecting = entry.connecting.lock().await;
        if let Some(session) = entry.live() {
            return Ok(session);
        }
        let session = connect.await?;
        let previous = entry
            .session
            .lock()
            .expect("user session lock")
            .replace(session.clone());
        if let Some(previous) = previous {
            tokio::spawn(async move { previous.close().await });
        }
        Ok(session)
    }

    /// Sessions open now.
    pub(super) fn live(&self) -> usize {
        self.entries
            .lock()
            .expect("user sessions lock")
            .values()
            .filter(|e| e.live().is_some())
            .count()
    }

    /// Closes the sessions not used since `before` (registry ms) that no
    /// call holds; returns how many.
    pub(super) fn close_idle(&self, before: u64) -> usize {
        let mut closed = 0;
        self.entries
            .lock()
            .expect("user sessions lock")
            .retain(|_, entry| {
                if entry.last_used.load(Ordering::Relaxed) >= before {
                    return true;
                }
                let mut session = entry.session.lock().expect("user session lock");
                // A call in flight holds its own reference: keep the session.
                if session.as_ref().is_some_and(|s| Arc::strong_count(s) > 1) {
                    return true;
                }
                if entry.connecting.try_lock().is_err() {
                    return true;
                }
                if let Some(session) = session.take() {
                    closed += 1;
                    tokio::spawn(async move { session.close().await });
                }
                false
            });
        closed
    }

    /// Takes every session out (the slot stops); the caller closes them.
    pub(super) fn take_all(&self) -> Vec<Arc<Session>> {
        self.entries
            .lock()
            .expect("user sessions lock")
            .drain()
            .filter_map(|(_, entry)| entry.session.lock().expect("user session lock").take())
            .collect()
    }
}

impl UserEntry {
    fn live(&self) -> Option<Arc<Session>> {
        self.session
            .lock()
            .expect("user session lock")
            .clone()
            .filter(|s| !s.is_ended())
    }
}
