//! The tokens an OAuth client holds ([`LiveTokens`]), so that what its
//! server sends back is redacted of them: a server that echoes the bearer
//! token it received (in a failed `tools/list`, an error, a tool result)
//! must not hand one subject's token to another subject, a log line or a
//! span. Every access and refresh token the client loads from its store or
//! obtains (a grant, a refresh, a client-credentials or JWT-bearer token)
//! passes through [`Holding`], its store seen through the set, and is held
//! until newer tokens of its subject, or more recently used subjects, push
//! it out. Bounded: [`LIVE_TOKENS_PER_SUBJECT`] values per subject,
//! [`LIVE_SUBJECTS`] subjects per server.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use hashlink::LruCache;
use oauth2::TokenResponse as _;
use rmcp::transport::auth::StoredCredentials;

use super::StoreError;
use super::bound::Binding;
use super::confirmation::{ConfirmError, HeldGrant};
use super::store::{OAuthStore, PendingFlow, RegisteredClient};
use crate::credentials::{MIN_REDACTED_LEN, Redactor, SharedRedactor};
use crate::state::{ClientKey, TokenKey};

/// Token values held per subject: its access and refresh token, and the
/// pair before them (still echoed by a server that saw them a moment ago).
pub const LIVE_TOKENS_PER_SUBJECT: usize = 4;

/// Subjects whose tokens are held per server; the least recently used one
/// is dropped first. A session's own token is redacted from its text even
/// when its subject was dropped (the session keeps it).
pub const LIVE_SUBJECTS: usize = 256;

/// The access and refresh tokens of one server's OAuth client, per subject,
/// bounded, and the [`Redactor`] of all of them (rebuilt when they change,
/// its automaton on the first text after).
pub struct LiveTokens {
    held: Mutex<LruCache<TokenKey, VecDeque<Box<str>>>>,
    redactor: SharedRedactor,
}

impl fmt::Debug for LiveTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the values.
        f.debug_struct("LiveTokens")
            .field("subjects", &self.lock().len())
            .finish()
    }
}

impl Default for LiveTokens {
    fn default() -> Self {
        Self {
            held: Mutex::new(LruCache::new(LIVE_SUBJECTS)),
            redactor: Redactor::default().shared(),
        }
    }
}

impl LiveTokens {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The redactor of every token held now (swapped when they change).
    pub fn redactor(&self) -> SharedRedactor {
        self.redactor.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<TokenKey, VecDeque<Box<str>>>> {
        // Poisoning cannot leave the set inconsistent (single updates).
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `tokens` of `key` (values too short to redact are skipped):
    /// the newest last, the oldest dropped beyond
    /// [`LIVE_TOKENS_PER_SUBJECT`]; `key` becomes the most recently used
    /// subject. The redactor is rebuilt when the set changed.
    pub fn hold<'a>(&self, key: &TokenKey, tokens: impl IntoIterator<Item = &'a str>) {
        let tokens: Vec<&str> = tokens
            .into_iter()
            .filter(|t| t.chars().count() >= MIN_REDACTED_LEN)
            .collect();
        if tokens.is_empty() {
            return;
        }
        let mut held = self.lock();
        let mut changed = false;
        if held.get_mut(key).is_none() {
            // Drops the least recently used subject when full.
            held.insert(key.clone(), VecDeque::new());
            changed = true;
        }
        let values = held.get_mut(key).expect("just inserted");
        for token in tokens {
            if values.iter().any(|held| &**held == token) {
                continue;
            }
            values.push_back(Box::from(token));
            if values.len() > LIVE_TOKENS_PER_SUBJECT {
                values.pop_front();
            }
            changed = true;
        }
        if changed {
            let all = held
                .iter()
                .flat_map(|(_, values)| values.iter().map(|v| &**v));
            self.redactor.store(Arc::new(Redactor::new(all)));
        }
    }

    /// Holds the access and refresh token of `credentials`.
    fn hold_credentials(&self, key: &TokenKey, credentials: &StoredCredentials) {
        if let Some(response) = &credentials.token_response {
            let access = response.access_token().secret().as_str();
            let refresh = response.refresh_token().map(|t| t.secret().as_str());
            self.hold(key, std::iter::once(access).chain(refresh));
        }
    }
}

/// An [`OAuthStore`] that holds every token it loads or saves in a
/// [`LiveTokens`]: the one store an [`OAuthClient`](super::OAuthClient)
/// uses, so no token it obtains or reads escapes the set.
#[derive(Debug)]
pub(super) struct Holding {
    store: Arc<dyn OAuthStore>,
    live: Arc<LiveTokens>,
    /// Where the tokens may be used: saved ones are stamped, read ones
    /// of another server are not returned.
    binding: Option<Arc<Binding>>,
}

impl Holding {
    /// `store`, its tokens held in `live`.
    pub(super) fn new(store: Arc<dyn OAuthStore>, live: Arc<LiveTokens>) -> Self {
        Self {
            store,
            live,
            binding: None,
        }
    }

    /// Tokens bound as `binding` says.
    pub(super) fn bound(mut self, binding: Arc<Binding>) -> Self {
        self.binding = Some(binding);
        self
    }

    /// `credentials` stamped with the binding, if any.
    fn stamped(&self, mut credentials: StoredCredentials) -> StoredCredentials {
        if let Some(binding) = &self.binding {
            binding.stamp(&mut credentials);
        }
        credentials
    }
}

impl OAuthStore for Holding {
    fn load_credentials<'a>(
        &'a self,
        key: &'a TokenKey,
    ) -> BoxFuture<'a, Result<Option<StoredCredentials>, StoreError>> {
        Box::pin(async move {
            let loaded = self.store.load_credentials(key).await?;
            if let Some(credentials) = &loaded {
                self.live.hold_credentials(key, credentials);
                if let Some(binding) = &self.binding
                    && !binding.admits(key, credentials)
                {
                    return Ok(None);
                }
            }
            Ok(loaded)
        })
    }

    fn save_grant<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.live.hold_credentials(key, &credentials);
        self.store.save_grant(key, self.stamped(credentials))
    }

    fn save_refreshed<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.live.hold_credentials(key, &credentials);
        self.store.save_refreshed(key, self.stamped(credentials))
    }

    fn clear_credentials<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>> {
        // A revoked token stays held: a server may still quote it.
        self.store.clear_credentials(key)
    }

    fn load_client<'a>(
        &'a self,
        key: &'a ClientKey,
    ) -> BoxFuture<'a, Result<Option<RegisteredClient>, StoreError>> {
        self.store.load_client(key)
    }

    fn save_client<'a>(
        &'a self,
        key: &'a ClientKey,
        client: RegisteredClient,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.store.save_client(key, client)
    }

    fn save_pending<'a>(
        &'a self,
        state: &'a str,
        flow: PendingFlow,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.store.save_pending(state, flow)
    }

    fn load_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>> {
        self.store.load_pending(state)
    }

    fn take_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>> {
        self.store.take_pending(state)
    }

    fn hold_grant<'a>(
        &'a self,
        code: &'a str,
        grant: HeldGrant,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        // Not usable until confirmed, but live at the authorization server.
        self.live.hold_credentials(&grant.key(), &grant.credentials);
        let mut grant = grant;
        grant.credentials = self.stamped(grant.credentials);
        self.store.hold_grant(code, grant)
    }

    /// The held grant was stamped and its tokens held when it was held.
    fn confirm_held<'a>(
        &'a self,
        code: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<TokenKey, ConfirmError>> {
        self.store.confirm_held(code, tenant, subject)
    }

    fn lock_refresh<'a>(
        &'a self,
        key: &'a TokenKey,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.store.lock_refresh(key, ttl)
    }

    fn unlock_refresh<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>> {
        self.store.unlock_refresh(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Grant;
    use crate::credentials::oauth::MemoryStore;
    use crate::credentials::oauth::testing::{alice_with, live};

    fn key(subject: &str) -> TokenKey {
        TokenKey::new("t", subject, "s")
    }

    fn redacts(tokens: &LiveTokens, value: &str) -> bool {
        tokens.redactor().load().redact(value) != value
    }

    #[test]
    fn a_subject_keeps_its_newest_tokens_only() {
        let tokens = LiveTokens::new();
        for n in 0..10 {
            tokens.hold(&key("alice"), [format!("access-token-{n}").as_str()]);
        }
        for n in 0..6 {
            assert!(!redacts(&tokens, &format!("access-token-{n}")), "{n}");
        }
        for n in 6..10 {
            assert!(redacts(&tokens, &format!("access-token-{n}")), "{n}");
        }
        // Holding a value again changes nothing (no rebuild).
        let before = tokens.redactor().load_full();
        tokens.hold(&key("alice"), ["access-token-9"]);
        assert!(Arc::ptr_eq(&before, &tokens.redactor().load_full()));
        // Too short to redact: not held.
        tokens.hold(&key("bob"), ["short"]);
        assert_eq!(tokens.lock().len(), 1);
    }

    #[test]
    fn the_least_recently_used_subject_goes_first() {
        let tokens = LiveTokens::new();
        for n in 0..LIVE_SUBJECTS {
            tokens.hold(
                &key(&format!("user-{n}")),
                [format!("token-of-user-{n}").as_str()],
            );
        }
        // user-0 is used again; one more subject pushes out user-1.
        tokens.hold(&key("user-0"), ["token-of-user-0"]);
        tokens.hold(&key("newcomer"), ["token-of-newcomer"]);
        assert_eq!(tokens.lock().len(), LIVE_SUBJECTS);
        assert!(redacts(&tokens, "token-of-user-0"));
        assert!(!redacts(&tokens, "token-of-user-1"));
        assert!(redacts(&tokens, "token-of-user-2"));
        assert!(redacts(&tokens, "token-of-newcomer"));
    }

    #[tokio::test]
    async fn tokens_loaded_or_saved_through_the_store_are_held() {
        let store = Arc::new(MemoryStore::new());
        let tokens = Arc::new(LiveTokens::new());
        let holding = Holding::new(store.clone(), tokens.clone());
        let alice = key("alice");
        store.set_credentials(&alice, Some(live("alice-access-1")));
        holding.load_credentials(&alice).await.unwrap();
        assert!(redacts(&tokens, "alice-access-1"));
        // The refresh token of the fixture too.
        assert!(redacts(&tokens, "refresh-1"));
        holding
            .save_refreshed(&key("bob"), live("bob-access-1"))
            .await
            .unwrap();
        holding
            .save_grant(&key("carol"), live("carol-access-1"))
            .await
            .unwrap();
        holding.clear_credentials(&alice).await.unwrap();
        for held in ["alice-access-1", "bob-access-1", "carol-access-1"] {
            assert!(redacts(&tokens, held), "{held}");
        }
        assert!(!format!("{tokens:?}").contains("access"));
    }

    #[tokio::test]
    async fn a_client_holds_the_tokens_it_hands_out() {
        let (_, client, key) = alice_with(Grant::AuthorizationCode, live("alice-access-token"));
        let token = client
            .access_token(&key)
            .await
            .expect("a stored live token");
        assert_eq!(token.expose(), "alice-access-token");
        assert!(redacts(client.live_tokens(), "alice-access-token"));
    }
}
