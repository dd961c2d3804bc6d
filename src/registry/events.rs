//! What hears of the servers' sessions: a session established (a
//! reconnect after a failure included, and a per-user session of a
//! subject), a server retired. A trait, so that the registry knows nothing
//! of who listens (the calls' circuit breakers, which a reconnect closes).

use std::sync::Arc;

use super::{Registry, Spawner};

/// Hears of the servers' sessions ([`Registry::observe_sessions`]).
pub trait SessionEvents: Send + Sync + std::fmt::Debug {
    /// A session of `tenant`'s `server` was established: the server's own
    /// (`subject` `None`: its supervisor connected, a reconnect included),
    /// or the per-user session of the subject whose key is `subject`.
    fn connected(&self, tenant: &str, server: &str, subject: Option<&str>);

    /// `tenant`'s `server` was retired: removed or changed by a reload, or
    /// its tenant removed (its sessions close once their calls end).
    fn retired(&self, tenant: &str, server: &str);
}

impl Registry {
    /// Tells `events` of every session established and every server
    /// retired from now on (set once: a second observer is ignored, and
    /// said in the log).
    pub fn observe_sessions(&self, events: Arc<dyn SessionEvents>) {
        if self.spawner.events.set(events).is_err() {
            tracing::error!("session events already observed: a second observer is ignored");
        }
    }
}

impl Spawner {
    /// Who hears of sessions, if anyone does.
    pub(crate) fn events(&self) -> Option<&Arc<dyn SessionEvents>> {
        self.events.get()
    }
}
