//! [`StateOAuthStore`]: the OAuth client's [`OAuthStore`] over the state
//! store, so that credentials, client registrations, pending flows and
//! refresh leases are shared by every replica on the same database.
//!
//! Values are the JSON of rmcp's `StoredCredentials`, of
//! [`RegisteredClient`] and of [`PendingFlow`], sealed by the state store.
//! Errors name what failed, never a value (neither a stored one nor a part
//! of a JSON parser's message, which may quote one).

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aes_gcm::aead::OsRng;
use aes_gcm::aead::rand_core::RngCore as _;
use futures::future::BoxFuture;
use rmcp::transport::auth::StoredCredentials;

use super::oauth::{
    CONFIRM_TTL, ConfirmError, HeldGrant, LocalLeases, OAuthStore, PENDING_TTL, PendingFlow,
    RegisteredClient, StoreError,
};
use crate::state::{ClientKey, HeldTaken, HeldUse, Replaced, StateError, StateStore, TokenKey};

/// Most keys whose last-read version is remembered (the least recently read
/// are forgotten first; a forgotten key's next save is unconditional).
const MAX_VERSIONS: usize = 4096;

/// How long a version read is used for the compare-and-swap of the next
/// refresh's save. rmcp reads the credentials right before each refresh, so
/// a version older than this was not read by the refresh that saves now.
/// (New grants never compare: [`OAuthStore::save_grant`].)
const VERSION_TTL: Duration = Duration::from_secs(60);

/// A refresh-lease holder id: 16 random bytes, hex.
fn random_holder() -> String {
    let mut bytes = [0u8; 16];
    OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The OAuth client's state in the [`StateStore`] (SQLite for one process,
/// PostgreSQL for replicas).
///
/// - A new grant's credentials (a consent, a client-credentials,
///   enterprise-managed or JWT-bearer token) are written unconditionally,
///   whatever the row holds now (deleted by an operator, rewritten by
///   another replica).
/// - Refreshed credentials are saved with a compare-and-swap on the version
///   this adapter last read for the key (within the last minute): when
///   another replica wrote first, its row is kept and this save is dropped
///   (both tokens are valid; the stored one is the one everyone uses next);
///   a row deleted meanwhile stays deleted. With no such read, the save is
///   unconditional.
/// - Pending flows live for [`PENDING_TTL`]; reading one leaves it in place,
///   taking it (`DELETE ... RETURNING`, one statement) gives it to one
///   caller only.
/// - The refresh lease of a key is taken in this adapter first (tasks of
///   this process) and then in the store (`toolgate_leases`, other
///   replicas), as this adapter's holder id: random, generated once per
///   adapter, so that two adapters (two gateways in one process, as in
///   tests) exclude each other like two replicas. Share one adapter among
///   a process's OAuth clients.
pub struct StateOAuthStore {
    state: StateStore,
    holder: String,
    versions: Mutex<Versions>,
    leases: LocalLeases,
}

impl fmt::Debug for StateOAuthStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateOAuthStore")
            .field("state", &self.state)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

impl StateOAuthStore {
    /// An adapter over `state`, holding refresh leases under a random id
    /// generated for it (16 random bytes, hex).
    pub fn new(state: StateStore) -> Self {
        Self::with_holder(state, random_holder())
    }

    /// An adapter over `state` holding refresh leases as `holder` (tests
    /// that name their replicas). `holder` must be unique among the
    /// adapters sharing the database: adapters with one holder id do not
    /// exclude each other there.
    pub fn with_holder(state: StateStore, holder: impl Into<String>) -> Self {
        Self {
            state,
            holder: holder.into(),
            versions: Mutex::default(),
            leases: LocalLeases::default(),
        }
    }

    /// The refresh-lease holder id this adapter uses.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The state store underneath.
    pub fn state(&self) -> &StateStore {
        &self.state
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, Versions> {
        self.versions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The JSON of `credentials`.
fn serialized(credentials: &StoredCredentials) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(credentials)
        .map_err(|_| StoreError("the OAuth credentials cannot be serialized".into()))
}

/// "`what` failed: `why`", where `why` is the state store's message (which
/// never holds a value).
fn failed(what: &str, error: &StateError) -> StoreError {
    StoreError(format!("{what}: {error}"))
}

/// The version last read per key, and when.
#[derive(Debug, Default)]
struct Versions {
    read: HashMap<TokenKey, (i64, Instant)>,
}

impl Versions {
    /// Remembers `version` as read now, forgetting the least recently read
    /// key when full.
    fn remember(&mut self, key: &TokenKey, version: i64) {
        let now = Instant::now();
        if !self.read.contains_key(key) && self.read.len() >= MAX_VERSIONS {
            self.read
                .retain(|_, (_, at)| now.duration_since(*at) < VERSION_TTL);
            if self.read.len() >= MAX_VERSIONS
                && let Some(oldest) = self
                    .read
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone())
            {
                self.read.remove(&oldest);
            }
        }
        self.read.insert(key.clone(), (version, now));
    }

    /// The version read for `key` within [`VERSION_TTL`].
    fn recall(&self, key: &TokenKey) -> Option<i64> {
        self.read
            .get(key)
            .filter(|(_, at)| at.elapsed() < VERSION_TTL)
            .map(|(version, _)| *version)
    }

    fn forget(&mut self, key: &TokenKey) {
        self.read.remove(key);
    }
}

impl OAuthStore for StateOAuthStore {
    fn load_credentials<'a>(
        &'a self,
        key: &'a TokenKey,
    ) -> BoxFuture<'a, Result<Option<StoredCredentials>, StoreError>> {
        Box::pin(async move {
            let found = self
                .state
                .get_token(key)
                .await
                .map_err(|e| failed("loading the OAuth credentials", &e))?;
            let Some(found) = found else {
                self.versions().forget(key);
                return Ok(None);
            };
            let credentials = serde_json::from_slice(&found.value)
                .map_err(|_| StoreError("the stored OAuth credentials cannot be parsed".into()))?;
            self.versions().remember(key, found.version);
            Ok(Some(credentials))
        })
    }

    fn save_grant<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let value = serialized(&credentials)?;
            let version = self
                .state
                .put_token(key, &value)
                .await
                .map_err(|e| failed("saving the OAuth credentials", &e))?;
            self.versions().remember(key, version);
            Ok(())
        })
    }

    fn save_refreshed<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let Some(expected) = self.versions().recall(key) else {
                return self.save_grant(key, credentials).await;
            };
            let value = serialized(&credentials)?;
            let outcome = self
                .state
                .replace_token(key, expected, &value)
                .await
                .map_err(|e| failed("saving the OAuth credentials", &e))?;
            match outcome {
                Replaced::Won(version) => self.versions().remember(key, version),
                Replaced::Lost(Some(winner)) => {
                    tracing::debug!(tenant = %key.tenant, server = %key.server, "OAuth credentials were saved by another replica first; its token is kept");
                    self.versions().remember(key, winner.version);
                }
                Replaced::Lost(None) => {
                    tracing::debug!(tenant = %key.tenant, server = %key.server, "OAuth credentials were deleted meanwhile; they stay deleted");
                    self.versions().forget(key);
                }
            }
            Ok(())
        })
    }

    fn clear_credentials<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.versions().forget(key);
            self.state
                .delete_token(key)
                .await
                .map_err(|e| failed("deleting the OAuth credentials", &e))?;
            Ok(())
        })
    }

    fn load_client<'a>(
        &'a self,
        key: &'a ClientKey,
    ) -> BoxFuture<'a, Result<Option<RegisteredClient>, StoreError>> {
        Box::pin(async move {
            let found = self
                .state
                .get_client(key)
                .await
                .map_err(|e| failed("loading the OAuth client registration", &e))?;
            found
                .map(|value| {
                    serde_json::from_slice(&value).map_err(|_| {
                        StoreError("the stored OAuth client registration cannot be parsed".into())
                    })
                })
                .transpose()
        })
    }

    fn save_client<'a>(
        &'a self,
        key: &'a ClientKey,
        client: RegisteredClient,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let value = serde_json::to_vec(&client).map_err(|_| {
                StoreError("the OAuth client registration cannot be serialized".into())
            })?;
            self.state
                .put_client(key, &value)
                .await
                .map_err(|e| failed("saving the OAuth client registration", &e))
        })
    }

    fn save_pending<'a>(
        &'a self,
        state: &'a str,
        flow: PendingFlow,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let value = serde_json::to_vec(&flow)
                .map_err(|_| StoreError("the pending authorization cannot be serialized".into()))?;
            self.state
                .put_pending(state, &value, PENDING_TTL)
                .await
                .map_err(|e| failed("saving the pending authorization", &e))
        })
    }

    fn hold_grant<'a>(
        &'a self,
        code: &'a str,
        grant: HeldGrant,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let value = serde_json::to_vec(&grant)
                .map_err(|_| StoreError("the held consent cannot be serialized".into()))?;
            self.state
                .put_held(code, &value, CONFIRM_TTL)
                .await
                .map_err(|e| failed("holding the consent", &e))
        })
    }

    fn confirm_held<'a>(
        &'a self,
        code: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<TokenKey, ConfirmError>> {
        Box::pin(async move {
            // What was decided about the grant, once it was taken.
            let mut verdict = None;
            let taken = self
                .state
                .take_held_with(code, |value| {
                    let Ok(grant) = serde_json::from_slice::<HeldGrant>(&value) else {
                        verdict = Some(Err(ConfirmError::Store(StoreError(
                            "the held consent cannot be parsed".into(),
                        ))));
                        return HeldUse::Keep;
                    };
                    let key = match grant.confirmed_by(tenant, subject) {
                        Ok(key) => key,
                        Err(refused) => {
                            verdict = Some(Err(ConfirmError::NotYours(refused)));
                            return HeldUse::Drop;
                        }
                    };
                    match serialized(&grant.credentials) {
                        Ok(token) => {
                            verdict = Some(Ok(key.clone()));
                            HeldUse::Save(key, token)
                        }
                        Err(error) => {
                            verdict = Some(Err(ConfirmError::Store(error)));
                            HeldUse::Keep
                        }
                    }
                })
                .await
                .map_err(|e| failed("confirming the held consent", &e))?;
            match (taken, verdict) {
                (HeldTaken::Saved(version), Some(Ok(key))) => {
                    self.versions().remember(&key, version);
                    Ok(key)
                }
                (HeldTaken::Dropped | HeldTaken::Kept, Some(Err(error))) => Err(error),
                _ => Err(ConfirmError::UnknownCode),
            }
        })
    }

    fn load_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>> {
        Box::pin(async move {
            let found = self
                .state
                .get_pending(state)
                .await
                .map_err(|e| failed("loading the pending authorization", &e))?;
            found
                .map(|value| {
                    serde_json::from_slice(&value).map_err(|_| {
                        StoreError("the stored pending authorization cannot be parsed".into())
                    })
                })
                .transpose()
        })
    }

    fn take_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>> {
        Box::pin(async move {
            let taken = self
                .state
                .take_pending(state)
                .await
                .map_err(|e| failed("taking the pending authorization", &e))?;
            taken
                .map(|value| {
                    serde_json::from_slice(&value).map_err(|_| {
                        StoreError("the stored pending authorization cannot be parsed".into())
                    })
                })
                .transpose()
        })
    }

    fn lock_refresh<'a>(
        &'a self,
        key: &'a TokenKey,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            if !self.leases.try_take(key, ttl) {
                return Ok(false);
            }
            match self
                .state
                .try_lease(&key.lease_name(), &self.holder, ttl)
                .await
            {
                Ok(true) => Ok(true),
                Ok(false) => {
                    self.leases.release(key);
                    Ok(false)
                }
                Err(e) => {
                    self.leases.release(key);
                    Err(failed("taking the refresh lease", &e))
                }
            }
        })
    }

    fn unlock_refresh<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let released = self
                .state
                .release_lease(&key.lease_name(), &self.holder)
                .await
                .map_err(|e| failed("giving back the refresh lease", &e));
            self.leases.release(key);
            released.map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::KeyRing;
    use oauth2::TokenResponse as _;
    use rmcp::transport::auth::{OAuthTokenResponse, VendorExtraTokenFields};

    async fn sqlite() -> (tempfile::TempDir, StateStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let keys = KeyRing::new(vec![[7u8; 32]]).expect("keys");
        let state = StateStore::connect(&url, keys).await.expect("connect");
        (dir, state)
    }

    fn credentials(access: &str) -> StoredCredentials {
        let response = OAuthTokenResponse::new(
            oauth2::AccessToken::new(access.to_owned()),
            oauth2::basic::BasicTokenType::Bearer,
            VendorExtraTokenFields::default(),
        );
        StoredCredentials::new("client".into(), Some(response), vec!["mcp".into()], Some(1))
    }

    fn access(credentials: &StoredCredentials) -> String {
        credentials
            .token_response
            .as_ref()
            .expect("a token")
            .access_token()
            .secret()
            .clone()
    }

    #[test]
    fn versions_are_bounded_and_expire() {
        let mut versions = Versions::default();
        for n in 0..MAX_VERSIONS + 10 {
            versions.remember(&TokenKey::new("t", n.to_string(), "s"), 1);
        }
        assert_eq!(versions.read.len(), MAX_VERSIONS);
        // The least recently read went first; the latest are kept.
        assert_eq!(versions.recall(&TokenKey::new("t", "0", "s")), None);
        let last = TokenKey::new("t", (MAX_VERSIONS + 9).to_string(), "s");
        assert_eq!(versions.recall(&last), Some(1));
        // A version read too long ago is not used.
        let old = Instant::now()
            .checked_sub(VERSION_TTL + Duration::from_secs(1))
            .expect("a past instant");
        versions.read.insert(last.clone(), (5, old));
        assert_eq!(versions.recall(&last), None);
        versions.remember(&last, 6);
        assert_eq!(versions.recall(&last), Some(6));
        versions.forget(&last);
        assert_eq!(versions.recall(&last), None);
    }

    /// A held consent is confirmed once, by its flow's tenant and subject
    /// only, and becomes their grant (replacing one stored before); one
    /// confirmed by anyone else is dropped.
    #[tokio::test]
    async fn a_held_consent_is_confirmed_once_into_the_subjects_grant() {
        let (_dir, state) = sqlite().await;
        let store = StateOAuthStore::new(state);
        let key = TokenKey::new("acme", "alice", "docs");
        store.save_grant(&key, credentials("before")).await.unwrap();
        let held = |access: &str| HeldGrant {
            tenant: "acme".into(),
            subject: "alice".into(),
            server: "docs".into(),
            credentials: credentials(access),
        };
        store.hold_grant("code-1", held("after")).await.unwrap();
        let refused = store.confirm_held("code-1", "acme", "mallory").await;
        assert!(
            matches!(refused, Err(ConfirmError::NotYours(_))),
            "{refused:?}"
        );
        let gone = store.confirm_held("code-1", "acme", "alice").await;
        assert!(matches!(gone, Err(ConfirmError::UnknownCode)), "{gone:?}");
        let kept = store.load_credentials(&key).await.unwrap().unwrap();
        assert_eq!(access(&kept), "before");

        store.hold_grant("code-2", held("after")).await.unwrap();
        assert_eq!(
            store.confirm_held("code-2", "acme", "alice").await.unwrap(),
            key
        );
        let saved = store.load_credentials(&key).await.unwrap().unwrap();
        assert_eq!(access(&saved), "after");
        let again = store.confirm_held("code-2", "acme", "alice").await;
        assert!(matches!(again, Err(ConfirmError::UnknownCode)), "{again:?}");
    }

    #[tokio::test]
    async fn holders_are_random_per_adapter() {
        let (_dir, state) = sqlite().await;
        let one = StateOAuthStore::new(state.clone());
        let two = StateOAuthStore::new(state.clone());
        for holder in [one.holder(), two.holder()] {
            assert_eq!(holder.len(), 32, "{holder}");
            assert!(holder.bytes().all(|b| b.is_ascii_hexdigit()), "{holder}");
        }
        assert_ne!(one.holder(), two.holder());
        // Two adapters in one process exclude each other like replicas.
        let key = TokenKey::new("t", "alice", "s");
        let ttl = Duration::from_secs(30);
        assert!(one.lock_refresh(&key, ttl).await.unwrap());
        assert!(!two.lock_refresh(&key, ttl).await.unwrap());
        one.unlock_refresh(&key).await.unwrap();
        assert!(two.lock_refresh(&key, ttl).await.unwrap());
    }

    #[tokio::test]
    async fn values_round_trip() {
        let (_dir, state) = sqlite().await;
        let store = StateOAuthStore::new(state.clone());
        let key = TokenKey::new("t", "alice", "s");
        assert!(store.load_credentials(&key).await.unwrap().is_none());
        store.save_grant(&key, credentials("a1")).await.unwrap();
        let loaded = store.load_credentials(&key).await.unwrap().unwrap();
        assert_eq!(access(&loaded), "a1");
        assert_eq!(loaded.granted_scopes, ["mcp"]);
        // Read, then saved: a compare-and-swap that wins.
        store.save_refreshed(&key, credentials("a2")).await.unwrap();
        assert_eq!(state.get_token(&key).await.unwrap().unwrap().version, 2);
        store.clear_credentials(&key).await.unwrap();
        assert!(store.load_credentials(&key).await.unwrap().is_none());

        let client_key = ClientKey::new("t", "s", "https://as.example");
        assert!(store.load_client(&client_key).await.unwrap().is_none());
        store
            .save_client(
                &client_key,
                RegisteredClient {
                    client_id: "id".into(),
                    client_secret: Some("sec".into()),
                },
            )
            .await
            .unwrap();
        let client = store.load_client(&client_key).await.unwrap().unwrap();
        assert_eq!(
            (client.client_id.as_str(), client.client_secret.as_deref()),
            ("id", Some("sec"))
        );
    }

    #[tokio::test]
    async fn a_save_after_a_lost_race_keeps_the_winner() {
        let (_dir, state) = sqlite().await;
        let key = TokenKey::new("t", "alice", "s");
        let ours = StateOAuthStore::with_holder(state.clone(), "ours");
        ours.save_grant(&key, credentials("first")).await.unwrap();
        ours.load_credentials(&key).await.unwrap();
        // Another replica writes after our read.
        state
            .put_token(&key, b"{\"client_id\":\"c\",\"token_response\":null}")
            .await
            .unwrap();
        ours.save_refreshed(&key, credentials("ours"))
            .await
            .unwrap();
        let stored = state.get_token(&key).await.unwrap().unwrap();
        assert_eq!(stored.version, 2, "our save was not written");
        let now = ours.load_credentials(&key).await.unwrap().unwrap();
        assert!(now.token_response.is_none());
        // The winner's version is remembered: the next save wins.
        ours.save_refreshed(&key, credentials("next"))
            .await
            .unwrap();
        let now = ours.load_credentials(&key).await.unwrap().unwrap();
        assert_eq!(access(&now), "next");
        // Deleted meanwhile: stays deleted.
        state.delete_token(&key).await.unwrap();
        ours.save_refreshed(&key, credentials("late"))
            .await
            .unwrap();
        assert!(state.get_token(&key).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_new_grant_is_stored_whatever_the_row_became_since_it_was_read() {
        let (_dir, state) = sqlite().await;
        let key = TokenKey::new("t", "alice", "s");
        let ours = StateOAuthStore::with_holder(state.clone(), "ours");
        ours.save_grant(&key, credentials("first")).await.unwrap();
        ours.load_credentials(&key).await.unwrap();
        // An operator forgets the token after our read; the user consents
        // again: the consent is stored.
        state.delete_token(&key).await.unwrap();
        ours.save_grant(&key, credentials("consented"))
            .await
            .unwrap();
        let now = ours.load_credentials(&key).await.unwrap().unwrap();
        assert_eq!(access(&now), "consented");
        // Another replica rewrites the row after our read: the new grant
        // replaces it.
        state
            .put_token(&key, b"{\"client_id\":\"c\",\"token_response\":null}")
            .await
            .unwrap();
        ours.save_grant(&key, credentials("consented-again"))
            .await
            .unwrap();
        let stored = state.get_token(&key).await.unwrap().unwrap();
        let stored: StoredCredentials = serde_json::from_slice(&stored.value).unwrap();
        assert_eq!(access(&stored), "consented-again");
    }

    #[tokio::test]
    async fn errors_carry_no_value() {
        let (_dir, state) = sqlite().await;
        let store = StateOAuthStore::new(state.clone());
        let key = TokenKey::new("t", "alice", "s");
        state
            .put_token(&key, b"{\"client_id\": 42, \"secret-xyz-123\": true")
            .await
            .unwrap();
        let error = store.load_credentials(&key).await.unwrap_err();
        assert!(!error.0.contains("secret-xyz-123"), "{error}");
        assert!(error.0.contains("credentials"), "{error}");
        state.close().await;
        let error = store.load_credentials(&key).await.unwrap_err();
        assert!(
            error.0.starts_with("loading the OAuth credentials: "),
            "{error}"
        );
    }

    #[tokio::test]
    async fn refresh_leases_exclude_tasks_and_replicas() {
        let (_dir, state) = sqlite().await;
        let key = TokenKey::new("t", "alice", "s");
        let ttl = Duration::from_secs(30);
        let a = StateOAuthStore::with_holder(state.clone(), "replica-a");
        let b = StateOAuthStore::with_holder(state.clone(), "replica-b");
        assert!(a.lock_refresh(&key, ttl).await.unwrap());
        // Another task of the same replica, and another replica.
        assert!(!a.lock_refresh(&key, ttl).await.unwrap());
        assert!(!b.lock_refresh(&key, ttl).await.unwrap());
        // Another key is free.
        assert!(
            b.lock_refresh(&TokenKey::new("t", "bob", "s"), ttl)
                .await
                .unwrap()
        );
        // b's refused attempt left nothing behind in b.
        a.unlock_refresh(&key).await.unwrap();
        assert!(b.lock_refresh(&key, ttl).await.unwrap());
        assert!(!a.lock_refresh(&key, ttl).await.unwrap());
        // Giving back a lease one does not hold changes nothing.
        a.unlock_refresh(&key).await.unwrap();
        assert!(!a.lock_refresh(&key, ttl).await.unwrap());
        b.unlock_refresh(&key).await.unwrap();
        assert!(a.lock_refresh(&key, ttl).await.unwrap());
    }

    #[tokio::test]
    async fn pending_flows_are_read_in_place_and_taken_by_delete() {
        let (_dir, state) = sqlite().await;
        let store = StateOAuthStore::new(state);
        let flow = PendingFlow {
            tenant: "t".into(),
            subject: "alice".into(),
            server: "s".into(),
            authorization: rmcp::transport::auth::StoredAuthorizationState::new(
                &oauth2::PkceCodeVerifier::new("verifier-0123456789".into()),
                &oauth2::CsrfToken::new("state-1".into()),
            ),
            challenge: None,
            client_id: "id".into(),
        };
        store.save_pending("state-1", flow).await.unwrap();
        for _ in 0..2 {
            let found = store.load_pending("state-1").await.unwrap().unwrap();
            assert_eq!(found.key(), TokenKey::new("t", "alice", "s"));
            assert_eq!(found.authorization.pkce_verifier, "verifier-0123456789");
        }
        let taken = store.take_pending("state-1").await.unwrap().unwrap();
        assert_eq!(taken.key(), TokenKey::new("t", "alice", "s"));
        assert!(store.take_pending("state-1").await.unwrap().is_none());
        assert!(store.load_pending("state-1").await.unwrap().is_none());
        assert!(store.load_pending("other").await.unwrap().is_none());
    }
}
