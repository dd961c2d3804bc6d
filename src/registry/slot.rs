//! One server slot of a tenant: the server's configuration and the state of
//! its session, kept by a supervisor. A slot outlives configuration
//! reloads that leave its server unchanged; it then moves to the new
//! tenant object and its session is untouched.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::users::UserSessions;
use crate::catalog::ServerPart;
use crate::config::{Limits, ServerConfig};
use crate::credentials::oauth::OAuthClient;
use crate::registry::limits::Concurrency;
use crate::upstream::Session;

/// How long an authorization URL made for a `ListTools` view is shown again
/// before a new one is made (its pending flow lives [`PENDING_TTL`]).
///
/// [`PENDING_TTL`]: crate::credentials::oauth::PENDING_TTL
pub const CONSENT_URL_REUSE: Duration = Duration::from_secs(300);

/// What a slot's state feeds: the tenant object that builds a catalog from
/// its slots, rebuilt at every change of a slot's state. (A trait, so that
/// slots know nothing of tenants: the tenant implements it.)
pub(super) trait Republish: Send + Sync {
    /// Builds and publishes the catalog again from the slots' states.
    fn rebuild(&self);
}

/// The state of a slot's session.
#[derive(Debug, Clone)]
pub(super) enum SlotState {
    /// Not connected and not trying: a lazy tenant not in use.
    Idle,
    Connecting,
    Ready {
        session: Arc<Session>,
        tools: Arc<Vec<rmcp::model::Tool>>,
        /// What `prompts/list` gave, when the server offers prompts.
        prompts: Option<Arc<Result<Vec<rmcp::model::Prompt>, String>>>,
        /// What `skills/list` gave, when the session offers skills.
        skills: Option<Arc<Result<Vec<rmcp::model::Skill>, String>>>,
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
    /// `config`'s fingerprint, computed when a reload first compares it.
    fingerprint: OnceLock<[u8; 32]>,
    pub(super) limit: Option<Concurrency>,
    state: Mutex<SlotState>,
    /// The tenant object whose catalog this slot feeds (replaced on reload).
    owner: Mutex<Option<Weak<dyn Republish>>>,
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
    /// The catalog part built from the server's latest listing (boxed:
    /// idle slots have none).
    part: Mutex<Option<Box<KeptPart>>>,
}

/// A catalog part and what it was built from: the listing (held, so its
/// address is not reused while kept), the server's index and the limits.
#[derive(Debug)]
struct KeptPart {
    listing: Arc<Vec<rmcp::model::Tool>>,
    server_index: usize,
    limits: Limits,
    part: ServerPart,
}

/// Most subjects whose authorization URL a slot remembers.
const MAX_CONSENT_URLS: usize = 4096;

impl Slot {
    /// The fingerprint of the slot's server configuration
    /// ([`ServerConfig::fingerprint`]): a reload keeps the slot (and its
    /// session) when the new configuration's server has the same.
    pub(super) fn fingerprint(&self) -> [u8; 32] {
        *self.fingerprint.get_or_init(|| self.config.fingerprint())
    }

    pub(super) fn new(
        config: ServerConfig,
        stop: CancellationToken,
        oauth: Result<Option<Arc<OAuthClient>>, String>,
    ) -> Self {
        Self {
            oauth,
            users: UserSessions::default(),
            wake: Notify::new(),
            consent_urls: Mutex::default(),
            part: Mutex::default(),
            limit: config.max_concurrent_calls.map(Concurrency::new),
            config,
            fingerprint: OnceLock::new(),
            state: Mutex::new(SlotState::Idle),
            owner: Mutex::new(None),
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

    /// Marks a slot that is about to be activated as connecting (not
    /// idle), before the catalog that first shows it is published.
    pub(super) fn expect_connect(&self) {
        if self.activation.lock().expect("slot lock").is_none() {
            let mut state = self.state.lock().expect("slot lock");
            if matches!(*state, SlotState::Idle) {
                *state = SlotState::Connecting;
            }
        }
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
        if let Some(owner) = self.owner() {
            owner.rebuild();
        }
    }

    pub(super) fn state(&self) -> SlotState {
        self.state.lock().expect("slot lock").clone()
    }

    /// Makes `owner` the one this slot's state changes rebuild.
    pub(super) fn set_owner<T: Republish + 'static>(&self, owner: &Arc<T>) {
        let owner: Weak<T> = Arc::downgrade(owner);
        let owner: Weak<dyn Republish> = owner;
        *self.owner.lock().expect("slot lock") = Some(owner);
    }

    /// The owner, while it lives.
    fn owner(&self) -> Option<Arc<dyn Republish>> {
        self.owner
            .lock()
            .expect("slot lock")
            .as_ref()
            .and_then(Weak::upgrade)
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
        if let Some(owner) = self.owner() {
            owner.rebuild();
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
            .filter(|(_, made)| made.elapsed() < CONSENT_URL_REUSE)
            .map(|(url, _)| url.clone())
    }

    /// Remembers the authorization URL made for `subject`.
    pub(super) fn remember_consent_url(&self, subject: &str, url: &str) {
        let mut urls = self.consent_urls.lock().expect("slot lock");
        if urls.len() >= MAX_CONSENT_URLS {
            urls.retain(|_, (_, made)| made.elapsed() < CONSENT_URL_REUSE);
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

    /// The catalog part of `listing` (this slot's current or last listing)
    /// as server `server_index` under `limits`: the one kept from the
    /// previous build when all three are the same, else built by `build`
    /// and kept instead (one part per slot: the newest listing's).
    pub(super) fn part(
        &self,
        listing: &Arc<Vec<rmcp::model::Tool>>,
        server_index: usize,
        limits: &Limits,
        build: impl FnOnce() -> ServerPart,
    ) -> ServerPart {
        let mut kept = self.part.lock().expect("slot lock");
        if let Some(kept) = kept.as_ref()
            && Arc::ptr_eq(&kept.listing, listing)
            && kept.server_index == server_index
            && kept.limits == *limits
        {
            return kept.part.clone();
        }
        let part = build();
        *kept = Some(Box::new(KeptPart {
            listing: listing.clone(),
            server_index,
            limits: limits.clone(),
            part: part.clone(),
        }));
        part
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::path::Path;

    use super::*;
    use crate::catalog::{Catalog, InputState, ServerInput};

    fn slot_and_limits() -> (Slot, Limits) {
        let yaml = "listen: \"127.0.0.1:0\"\ntenants:\n  - name: t\n    tokens: [token-for-the-slot-tests]\n    servers:\n      - name: s\n        url: \"http://127.0.0.1:9/mcp\"\n";
        let mut config = crate::config::Config::from_yaml(
            yaml,
            "test.yaml",
            Path::new("."),
            &HashMap::<String, String>::new(),
        )
        .expect("a valid configuration");
        let server = config.tenants.remove(0).servers.remove(0);
        let slot = Slot::new(server, CancellationToken::new(), Ok(None));
        (slot, config.limits)
    }

    fn listing(names: &[&str]) -> Arc<Vec<rmcp::model::Tool>> {
        Arc::new(
            names
                .iter()
                .map(|name| {
                    rmcp::model::Tool::new(
                        (*name).to_owned(),
                        format!("does {name}"),
                        Arc::new(serde_json::Map::new()),
                    )
                })
                .collect(),
        )
    }

    fn input<'a>(slot: &'a Slot, tools: &'a [rmcp::model::Tool]) -> ServerInput<'a> {
        ServerInput {
            name: &slot.config.name,
            transport: slot.config.transport.kind(),
            bare: slot.config.bare,
            filter: &slot.config.filter,
            overrides: &slot.config.overrides,
            state: InputState::Listed(tools),
            approved: None,
        }
    }

    #[test]
    fn a_part_is_built_once_per_listing_index_and_limits() {
        let (slot, limits) = slot_and_limits();
        let builds = Cell::new(0);
        let part = |listing: &Arc<Vec<rmcp::model::Tool>>, index: usize, limits: &Limits| {
            slot.part(listing, index, limits, || {
                builds.set(builds.get() + 1);
                Catalog::server_part(index, &input(&slot, listing), listing, limits)
            })
        };
        let first = listing(&["a", "b"]);
        let built = part(&first, 0, &limits);
        assert!(Arc::ptr_eq(&built, &part(&first, 0, &limits)));
        assert_eq!(builds.get(), 1, "the same listing is not built again");

        // An equal listing read again (a reconnect) is a new listing.
        let second = listing(&["a", "b"]);
        let rebuilt = part(&second, 0, &limits);
        assert_eq!(builds.get(), 2);
        assert!(!Arc::ptr_eq(&built, &rebuilt));

        // A reload that moves the server or changes the limits rebuilds it.
        let moved = part(&second, 1, &limits);
        assert_eq!(builds.get(), 3);
        assert_eq!(moved.as_ref().as_ref().unwrap()[0].server_index, 1);
        let mut tight = limits.clone();
        tight.max_tools_per_server = 1;
        let refused = part(&second, 1, &tight);
        assert_eq!(builds.get(), 4);
        assert!(
            refused
                .as_ref()
                .as_ref()
                .unwrap_err()
                .contains("max_tools_per_server")
        );
    }

    #[test]
    fn a_catalog_from_kept_parts_equals_one_built_afresh() {
        let (slot, limits) = slot_and_limits();
        let tools = listing(&["b", "a"]);
        let inputs = [input(&slot, &tools)];
        let fresh = Catalog::build(&inputs, &limits);
        let kept = |_: ()| {
            Catalog::build_with(&inputs, |index, input, listed| {
                slot.part(&tools, index, &limits, || {
                    Catalog::server_part(index, input, listed, &limits)
                })
            })
        };
        let (first, second) = (kept(()), kept(()));
        for catalog in [&first, &second] {
            assert_eq!(catalog.version(), fresh.version());
            let names: Vec<_> = catalog.tools().iter().map(|t| &t.name).collect();
            assert_eq!(names, ["s__a", "s__b"]);
            let hashes: Vec<_> = catalog.tools().iter().map(|t| &t.definition_hash).collect();
            let fresh_hashes: Vec<_> = fresh.tools().iter().map(|t| &t.definition_hash).collect();
            assert_eq!(hashes, fresh_hashes);
        }
    }
}
