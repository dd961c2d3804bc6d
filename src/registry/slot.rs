//! One server slot of a tenant: the server's configuration and the state of
//! its session, kept by a supervisor. A slot outlives configuration
//! reloads that leave its server unchanged; it then moves to the new
//! tenant object and its session is untouched.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Tenant;
use super::users::UserSessions;
use crate::config::ServerConfig;
use crate::credentials::oauth::OAuthClient;
use crate::limits::Concurrency;
use crate::upstream::Session;

/// The state of a slot's session.
#[derive(Debug, Clone)]
pub(super) enum SlotState {
    /// Not connected and not trying: a lazy tenant not in use.
    Idle,
    Connecting,
    Ready {
        session: Arc<Session>,
        tools: Arc<Vec<rmcp::model::Tool>>,
    },
    Failed {
        reason: String,
        /// What the server listed when it was last connected.
        last_tools: Option<Arc<Vec<rmcp::model::Tool>>>,
    },
    /// A per-user OAuth server nobody has authorized yet.
    AuthorizationRequired {
        reason: String,
    },
}

/// A server of a tenant and its session.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(super) config: ServerConfig,
    pub(super) fingerprint: [u8; 32],
    pub(super) limit: Option<Concurrency>,
    state: Mutex<SlotState>,
    /// The tenant object whose catalog this slot feeds (replaced on reload).
    owner: Mutex<Weak<Tenant>>,
    /// Stops the slot for good (shutdown, or the server was removed or
    /// changed by a reload).
    pub(super) stop: CancellationToken,
    /// Stops the current supervisor: set while the slot is active.
    activation: Mutex<Option<CancellationToken>>,
    /// The server's OAuth client (`oauth:`), or why it cannot be built.
    pub(super) oauth: Result<Option<Arc<OAuthClient>>, String>,
    /// Per-user sessions (`authorization_code` servers).
    pub(super) users: UserSessions,
    /// Wakes a supervisor waiting for a first consent, or backing off.
    pub(super) wake: Notify,
    /// Authorization URLs recently made per subject, shown again for a
    /// while rather than starting a flow per listing.
    consent_urls: Mutex<HashMap<String, (String, Instant)>>,
}

/// Most subjects whose authorization URL a slot remembers.
const MAX_CONSENT_URLS: usize = 4096;

impl Slot {
    pub(super) fn new(
        config: ServerConfig,
        fingerprint: [u8; 32],
        stop: CancellationToken,
        oauth: Result<Option<Arc<OAuthClient>>, String>,
    ) -> Self {
        Self {
            oauth,
            users: UserSessions::default(),
            wake: Notify::new(),
            consent_urls: Mutex::default(),
            limit: config.max_concurrent_calls.map(Concurrency::new),
            config,
            fingerprint,
            state: Mutex::new(SlotState::Idle),
            owner: Mutex::new(Weak::new()),
            stop,
            activation: Mutex::new(None),
        }
    }

    /// Starts a supervisor unless one runs; returns its stop token when a
    /// new one is to be spawned. Concurrent callers share one connect.
    pub(super) fn activate(&self) -> Option<CancellationToken> {
        let mut activation = self.activation.lock().expect("slot lock");
        if activation.is_some() || self.stop.is_cancelled() {
            return None;
        }
        let token = self.stop.child_token();
        *activation = Some(token.clone());
        *self.state.lock().expect("slot lock") = SlotState::Connecting;
        Some(token)
    }

    /// Whether a supervisor runs for this slot.
    pub(super) fn is_active(&self) -> bool {
        self.activation.lock().expect("slot lock").is_some()
    }

    /// Stops the supervisor, closes the session and goes idle.
    pub(super) fn deactivate(&self) {
        let Some(token) = self.activation.lock().expect("slot lock").take() else {
            return;
        };
        token.cancel();
        let previous =
            std::mem::replace(&mut *self.state.lock().expect("slot lock"), SlotState::Idle);
        if let SlotState::Ready { session, .. } = previous {
            tokio::spawn(async move { session.close().await });
        }
        for session in self.users.take_all() {
            tokio::spawn(async move { session.close().await });
        }
        if let Some(tenant) = self.owner.lock().expect("slot lock").upgrade() {
            tenant.rebuild();
        }
    }

    pub(super) fn state(&self) -> SlotState {
        self.state.lock().expect("slot lock").clone()
    }

    pub(super) fn set_owner(&self, tenant: &Arc<Tenant>) {
        *self.owner.lock().expect("slot lock") = Arc::downgrade(tenant);
    }

    /// Records a new state from the supervisor holding `supervisor` (its
    /// activation token) and republishes the owner's catalog. The token is
    /// checked under the state lock: a supervisor that was stopped (the
    /// slot deactivated or retired) writes nothing, and a session it is
    /// handed is closed at once, so no session is ever left in a slot that
    /// a newer supervisor owns.
    pub(super) fn set_state(&self, supervisor: &CancellationToken, state: SlotState) {
        {
            let mut current = self.state.lock().expect("slot lock");
            if supervisor.is_cancelled() || self.stop.is_cancelled() {
                drop(current);
                if let SlotState::Ready { session, .. } = state {
                    tokio::spawn(async move { session.close().await });
                }
                return;
            }
            *current = state;
        }
        let owner = self.owner.lock().expect("slot lock").upgrade();
        if let Some(tenant) = owner {
            tenant.rebuild();
        }
    }

    /// Whether calls run on per-user sessions (an `authorization_code`
    /// OAuth server).
    pub(super) fn per_user(&self) -> bool {
        self.config.oauth.as_ref().is_some_and(|o| o.per_user())
    }

    /// A recent authorization URL for `subject`.
    pub(super) fn consent_url(&self, subject: &str) -> Option<String> {
        let urls = self.consent_urls.lock().expect("slot lock");
        urls.get(subject)
            .filter(|(_, made)| made.elapsed() < super::tenant::CONSENT_URL_REUSE)
            .map(|(url, _)| url.clone())
    }

    /// Remembers the authorization URL made for `subject`.
    pub(super) fn remember_consent_url(&self, subject: &str, url: &str) {
        let mut urls = self.consent_urls.lock().expect("slot lock");
        if urls.len() >= MAX_CONSENT_URLS {
            urls.retain(|_, (_, made)| made.elapsed() < super::tenant::CONSENT_URL_REUSE);
            if urls.len() >= MAX_CONSENT_URLS {
                urls.clear();
            }
        }
        urls.insert(subject.to_owned(), (url.to_owned(), Instant::now()));
    }

    /// Forgets `subject`'s authorization URL (it consented).
    pub(super) fn forget_consent_url(&self, subject: &str) {
        self.consent_urls.lock().expect("slot lock").remove(subject);
    }

    /// The live session, if any.
    pub(super) fn session(&self) -> Option<Arc<Session>> {
        match &*self.state.lock().expect("slot lock") {
            SlotState::Ready { session, .. } => Some(session.clone()),
            _ => None,
        }
    }

    /// Takes the session out of a stopped slot (it is being closed), so
    /// the slot no longer holds it.
    pub(super) fn take_session(&self) -> Option<Arc<Session>> {
        let mut state = self.state.lock().expect("slot lock");
        match std::mem::replace(&mut *state, SlotState::Idle) {
            SlotState::Ready { session, .. } => Some(session),
            _ => None,
        }
    }
}
