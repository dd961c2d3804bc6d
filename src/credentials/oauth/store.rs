//! Where OAuth state lives ([`OAuthStore`]): credentials, client
//! registrations and pending flows; [`MemoryStore`] keeps them in one
//! process, and two adapters give rmcp its `CredentialStore` and
//! `StateStore` over any of them.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::transport::auth::{
    AuthError, CredentialStore, StateStore, StoredAuthorizationState, StoredCredentials,
};
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::confirmation::{ConfirmError, HeldGrant};
use super::freshness::now_secs;
use super::lease::LocalLeases;
use crate::state::{ClientKey, TokenKey};

/// How long a pending authorization flow waits for its callback.
pub const PENDING_TTL: Duration = Duration::from_secs(600);

/// A dynamically registered client, kept per (tenant, server, issuer).
#[derive(Clone, Serialize, Deserialize)]
pub struct RegisteredClient {
    /// The client id the authorization server issued.
    pub client_id: String,
    /// The client secret it issued, if any.
    pub client_secret: Option<String>,
}

impl fmt::Debug for RegisteredClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredClient")
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "***"))
            .finish()
    }
}

/// An authorization flow waiting for its callback, keyed by its `state`.
/// `Debug` never shows the PKCE verifier (rmcp's own `Debug` hides it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingFlow {
    /// The tenant.
    pub tenant: String,
    /// The end user (empty: the tenant itself).
    pub subject: String,
    /// The server's name in the tenant's configuration.
    pub server: String,
    /// rmcp's state: PKCE verifier, expected issuer, requested scopes.
    pub authorization: StoredAuthorizationState,
    /// The `WWW-Authenticate` challenge discovery started from, if any.
    pub challenge: Option<String>,
    /// The client id the flow was started with.
    pub client_id: String,
}

impl PendingFlow {
    /// Whose credential the flow is for.
    pub fn key(&self) -> TokenKey {
        TokenKey::new(&self.tenant, &self.subject, &self.server)
    }

    /// Whether the flow has waited longer than [`PENDING_TTL`].
    pub fn is_expired(&self) -> bool {
        now_secs().saturating_sub(self.authorization.created_at) > PENDING_TTL.as_secs()
    }
}

/// Where OAuth state lives: credentials per (tenant, subject, server),
/// client registrations per (tenant, server, issuer), pending flows per
/// `state`. The state store implements it for replicas; [`MemoryStore`]
/// keeps everything in one process.
pub trait OAuthStore: Send + Sync + fmt::Debug {
    /// The credentials of `key` (rmcp's `StoredCredentials`, serialized by
    /// the implementation as it likes).
    fn load_credentials<'a>(
        &'a self,
        key: &'a TokenKey,
    ) -> BoxFuture<'a, Result<Option<StoredCredentials>, StoreError>>;

    /// Keeps the credentials of a new grant for `key` (a consent's code
    /// exchanged, a client-credentials, enterprise-managed or JWT-bearer
    /// token): written whatever the row holds now (deleted by an operator,
    /// rewritten by another replica), never dropped as a lost race. `Ok`
    /// only once they are stored.
    fn save_grant<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Keeps refreshed credentials for `key`. A store shared by replicas
    /// writes them only if the row is still the one read before the
    /// refresh (compare-and-swap): when another replica wrote first, its
    /// token is kept, and a row deleted meanwhile stays deleted.
    fn save_refreshed<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Forgets the credentials of `key`.
    fn clear_credentials<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The client registered at an authorization server.
    fn load_client<'a>(
        &'a self,
        key: &'a ClientKey,
    ) -> BoxFuture<'a, Result<Option<RegisteredClient>, StoreError>>;

    /// Keeps a client registered at an authorization server.
    fn save_client<'a>(
        &'a self,
        key: &'a ClientKey,
        client: RegisteredClient,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Keeps a pending flow under its `state`.
    fn save_pending<'a>(
        &'a self,
        state: &'a str,
        flow: PendingFlow,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The pending flow of `state`, left in place (a callback whose `iss`
    /// is wrong must not consume the flow of the genuine one).
    fn load_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>>;

    /// Takes the pending flow of `state` (before its code is exchanged):
    /// returns it and removes it in one step, so that of two callbacks with
    /// one `state` (on any replicas) exactly one gets it. `None` when no
    /// live flow has this `state`.
    fn take_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>>;

    /// Holds a grant whose code was exchanged under the one-time `code`
    /// until the tenant's application confirms it (at most
    /// [`CONFIRM_TTL`](super::CONFIRM_TTL)). Only a hash of `code` is kept.
    fn hold_grant<'a>(
        &'a self,
        code: &'a str,
        grant: HeldGrant,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Confirms the grant held under `code` for `tenant`'s `subject`
    /// ([`confirm`](super::confirm)): takes it and, when it is theirs
    /// ([`HeldGrant::confirmed_by`]), stores it as their new
    /// grant (as [`OAuthStore::save_grant`]), in one step: a code works
    /// once, on any replica, and a store that fails half-way leaves the
    /// grant held. A grant of another tenant or subject is taken and
    /// dropped.
    fn confirm_held<'a>(
        &'a self,
        code: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<TokenKey, ConfirmError>>;

    /// Takes the refresh lease of `key` for `ttl`: its holder asks the token
    /// endpoint for `key`'s token, everyone else waits for the holder's
    /// token. `false` when another task or replica holds it and its time has
    /// not run out. Not reentrant: a second call while the lease is held
    /// gets `false` too.
    fn lock_refresh<'a>(
        &'a self,
        key: &'a TokenKey,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Gives back the refresh lease of `key` taken with
    /// [`OAuthStore::lock_refresh`] (nothing happens when it is not held).
    fn unlock_refresh<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// An [`OAuthStore`] in this process's memory (tests, the conformance
/// client). Expired pending flows are dropped as new ones arrive.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<MemoryInner>,
    leases: LocalLeases,
}

#[derive(Debug, Default)]
struct MemoryInner {
    credentials: HashMap<TokenKey, StoredCredentials>,
    clients: HashMap<ClientKey, RegisteredClient>,
    pending: HashMap<String, PendingFlow>,
    held: HashMap<String, (HeldGrant, std::time::Instant)>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut MemoryInner) -> T) -> T {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut inner)
    }

    /// Puts `credentials` under `key` (`None`: removes them) at once, as
    /// another replica would.
    #[cfg(test)]
    pub(super) fn set_credentials(&self, key: &TokenKey, credentials: Option<StoredCredentials>) {
        self.with(|i| match credentials {
            Some(credentials) => i.credentials.insert(key.clone(), credentials),
            None => i.credentials.remove(key),
        });
    }
}

impl OAuthStore for MemoryStore {
    fn load_credentials<'a>(
        &'a self,
        key: &'a TokenKey,
    ) -> BoxFuture<'a, Result<Option<StoredCredentials>, StoreError>> {
        done(self.with(|i| i.credentials.get(key).cloned()))
    }

    fn save_grant<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| i.credentials.insert(key.clone(), credentials));
        done(())
    }

    /// One process: no other writer to lose a race to.
    fn save_refreshed<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.save_grant(key, credentials)
    }

    fn clear_credentials<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| i.credentials.remove(key));
        done(())
    }

    fn load_client<'a>(
        &'a self,
        key: &'a ClientKey,
    ) -> BoxFuture<'a, Result<Option<RegisteredClient>, StoreError>> {
        done(self.with(|i| i.clients.get(key).cloned()))
    }

    fn save_client<'a>(
        &'a self,
        key: &'a ClientKey,
        client: RegisteredClient,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| i.clients.insert(key.clone(), client));
        done(())
    }

    fn save_pending<'a>(
        &'a self,
        state: &'a str,
        flow: PendingFlow,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| {
            i.pending.retain(|_, flow| !flow.is_expired());
            i.pending.insert(state.to_owned(), flow);
        });
        done(())
    }

    fn load_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>> {
        done(self.with(|i| i.pending.get(state).cloned()))
    }

    fn take_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>> {
        done(self.with(|i| i.pending.remove(state).filter(|flow| !flow.is_expired())))
    }

    fn hold_grant<'a>(
        &'a self,
        code: &'a str,
        grant: HeldGrant,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| {
            i.held
                .retain(|_, (_, at)| at.elapsed() <= super::CONFIRM_TTL);
            i.held
                .insert(code.to_owned(), (grant, std::time::Instant::now()));
        });
        done(())
    }

    fn confirm_held<'a>(
        &'a self,
        code: &'a str,
        tenant: &'a str,
        subject: &'a str,
    ) -> BoxFuture<'a, Result<TokenKey, ConfirmError>> {
        let confirmed = self.with(|i| {
            let grant = i
                .held
                .remove(code)
                .filter(|(_, at)| at.elapsed() <= super::CONFIRM_TTL)
                .map(|(grant, _)| grant)
                .ok_or(ConfirmError::UnknownCode)?;
            let key = grant
                .confirmed_by(tenant, subject)
                .map_err(ConfirmError::NotYours)?;
            i.credentials.insert(key.clone(), grant.credentials);
            Ok(key)
        });
        Box::pin(std::future::ready(confirmed))
    }

    fn lock_refresh<'a>(
        &'a self,
        key: &'a TokenKey,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        done(self.leases.try_take(key, ttl))
    }

    fn unlock_refresh<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>> {
        self.leases.release(key);
        done(())
    }
}

/// A store answer ready at once.
fn done<'a, T: Send + 'a>(value: T) -> BoxFuture<'a, Result<T, StoreError>> {
    Box::pin(async move { Ok(value) })
}

/// What rmcp's saves through a [`CredentialAdapter`] are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Saves {
    /// Refreshed credentials: [`OAuthStore::save_refreshed`].
    Refreshed,
    /// A new grant's: [`OAuthStore::save_grant`].
    Grant,
}

/// rmcp's `CredentialStore` over an [`OAuthStore`], for one key.
pub(super) struct CredentialAdapter {
    store: Arc<dyn OAuthStore>,
    key: TokenKey,
    saves: Saves,
}

impl CredentialAdapter {
    /// The credentials of `key` in `store`, rmcp's saves kept as `saves`
    /// says.
    pub(super) fn new(store: Arc<dyn OAuthStore>, key: TokenKey, saves: Saves) -> Self {
        Self { store, key, saves }
    }
}

/// A store failure as rmcp's error.
fn rmcp_error(error: StoreError) -> AuthError {
    AuthError::CredentialStoreError(error.0)
}

#[async_trait::async_trait]
impl CredentialStore for CredentialAdapter {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.store
            .load_credentials(&self.key)
            .await
            .map_err(rmcp_error)
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let saved = match self.saves {
            Saves::Grant => self.store.save_grant(&self.key, credentials).await,
            Saves::Refreshed => self.store.save_refreshed(&self.key, credentials).await,
        };
        saved.map_err(rmcp_error)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.store
            .clear_credentials(&self.key)
            .await
            .map_err(rmcp_error)
    }
}

/// rmcp's `StateStore` over an [`OAuthStore`]: a flow saved by rmcp is kept
/// with whose it is and how it started; rmcp's delete (after the `iss`
/// check, before the code exchange) takes the flow, and fails when another
/// callback took it first ([`FlowTaken::by_another`]).
pub(super) struct StateAdapter {
    store: Arc<dyn OAuthStore>,
    key: TokenKey,
    challenge: Option<String>,
    client_id: String,
    lost: Arc<AtomicBool>,
}

/// Whether rmcp's read or take of a pending flow through a [`StateAdapter`]
/// found it gone (taken by another callback, or expired).
#[derive(Debug, Clone, Default)]
pub(super) struct FlowTaken(Arc<AtomicBool>);

impl FlowTaken {
    /// Another callback took the flow first (or it expired): this one is
    /// for an unknown `state`.
    pub(super) fn by_another(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl StateAdapter {
    /// The flows of `key` in `store`, started from `challenge` with
    /// `client_id`.
    pub(super) fn new(
        store: Arc<dyn OAuthStore>,
        key: TokenKey,
        challenge: Option<&str>,
        client_id: &str,
    ) -> Self {
        Self {
            store,
            key,
            challenge: challenge.map(str::to_owned),
            client_id: client_id.to_owned(),
            lost: Arc::default(),
        }
    }

    /// What this adapter's take of a flow found.
    pub(super) fn taken(&self) -> FlowTaken {
        FlowTaken(self.lost.clone())
    }
}

#[async_trait::async_trait]
impl StateStore for StateAdapter {
    async fn save(
        &self,
        csrf_token: &str,
        state: StoredAuthorizationState,
    ) -> Result<(), AuthError> {
        let flow = PendingFlow {
            tenant: self.key.tenant.clone(),
            subject: self.key.subject.clone(),
            server: self.key.server.clone(),
            authorization: state,
            challenge: self.challenge.clone(),
            client_id: self.client_id.clone(),
        };
        self.store
            .save_pending(csrf_token, flow)
            .await
            .map_err(rmcp_error)
    }

    async fn load(&self, csrf_token: &str) -> Result<Option<StoredAuthorizationState>, AuthError> {
        let flow = self
            .store
            .load_pending(csrf_token)
            .await
            .map_err(rmcp_error)?;
        // A flow of another key is not this one's; a flow gone (taken by
        // another callback, or expired) is an unknown state.
        let flow = flow.filter(|flow| flow.key() == self.key && !flow.is_expired());
        if flow.is_none() {
            self.lost.store(true, Ordering::SeqCst);
        }
        Ok(flow.map(|flow| flow.authorization))
    }

    async fn delete(&self, csrf_token: &str) -> Result<(), AuthError> {
        let taken = self
            .store
            .take_pending(csrf_token)
            .await
            .map_err(rmcp_error)?;
        match taken {
            Some(flow) if flow.key() == self.key => Ok(()),
            _ => {
                self.lost.store(true, Ordering::SeqCst);
                Err(AuthError::InternalError(
                    "the pending authorization was taken by another callback".into(),
                ))
            }
        }
    }
}
