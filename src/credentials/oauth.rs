//! toolgate's OAuth 2.1 client for upstream MCP servers, built on rmcp's
//! `auth` feature: one [`OAuthClient`] per configured server, asked for the
//! access token of one (tenant, subject, server) [`TokenKey`] at a time.
//!
//! rmcp does the OAuth itself: discovery from a `WWW-Authenticate` challenge
//! (RFC 9728 protected resource metadata with well-known fallbacks, RFC 8414
//! and OpenID discovery, issuer checks), PKCE S256, `resource` (RFC 8707),
//! scope selection, dynamic registration (RFC 7591), the code exchange with
//! the RFC 9207 `iss` check, refresh with rotation, client credentials
//! (`client_secret_basic`/`_post`, `private_key_jwt`) and the
//! enterprise-managed token exchange. This module adds what a multi-tenant
//! gateway needs around it:
//! - credentials kept per (tenant, subject, server) in an [`OAuthStore`]
//!   (the state store implements it; [`MemoryStore`] serves tests), bound to
//!   the issuer that minted them (a changed authorization server discards
//!   them), and client registrations kept per (tenant, server, issuer), so a
//!   registration is never presented to another authorization server;
//! - pending flows kept in the store, keyed by `state`, so the callback may
//!   arrive at any replica ([`OAuthClient::complete`]);
//! - client identity in the spec's order: pre-registered, then the client ID
//!   metadata document, then a stored registration, then a new one;
//! - the reaction to a refused token ([`OAuthClient::refused`]): the token
//!   someone else refreshed, a refresh, a new consent, or step-up on
//!   `insufficient_scope`, bounded per key;
//! - one renewal per key at a time across tasks and replicas: the renewing
//!   one holds the key's refresh lease ([`OAuthStore::lock_refresh`]), the
//!   others wait for its token ([`REFRESH_LEASE_TTL`]);
//! - the address rule: token and registration endpoints on private or
//!   loopback addresses are refused unless `allow_private_addresses`
//!   (link-local and other reserved addresses always, by rmcp);
//! - typed errors ([`OAuthError`]) that never carry a token, code, verifier
//!   or client secret;
//! - what rmcp 3.11 lacks, kept to the missing piece: DPoP (RFC 9449, in
//!   [`super::dpop`]: a proof key, proofs on token and resource requests,
//!   nonces) through rmcp's `OAuthHttpClient` seam, and the RFC 7523
//!   JWT-bearer grant for a workload's own assertion
//!   ([`OAuthSettings::jwt_bearer_assertion`]).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use oauth2::TokenResponse as _;
use rmcp::transport::auth::enterprise::{
    EmaAuthorizationServer, EmaClientAuthentication, EmaError, EmaExchangeRequest,
};
use rmcp::transport::auth::{
    AuthError, AuthorizationCallback, AuthorizationManager, AuthorizationMetadata,
    ClientCredentialsConfig, CredentialStore, JwtSigningAlgorithm, OAuthClientConfig,
    OAuthTokenResponse, StateStore, StoredAuthorizationState, StoredCredentials,
    VendorExtraTokenFields, WWWAuthenticateParams, default_oauth_http_client,
};
use serde::{Deserialize, Serialize};
use url::Url;

use super::dpop::{Dpop, DpopKey, OAuthHttp, ResourceAuth};
use crate::config::{Grant, OAuthListener, Secret, ServerOAuth, TokenEndpointAuth};
use crate::state::{ClientKey, TokenKey};

/// Step-ups (`insufficient_scope`) tried for one key within
/// [`STEP_UP_WINDOW`] before the refusal is final.
pub const DEFAULT_MAX_STEP_UPS: u32 = 2;

/// How long step-ups of one key are counted together.
pub const STEP_UP_WINDOW: Duration = Duration::from_secs(300);

/// How long a pending authorization flow waits for its callback.
pub const PENDING_TTL: Duration = Duration::from_secs(600);

/// How long a refresh lease is held at most: a renewal that takes longer
/// lets another task or replica try.
pub const REFRESH_LEASE_TTL: Duration = Duration::from_secs(30);

/// How often a task that found the refresh lease taken looks for the
/// holder's token.
const REFRESH_POLL: Duration = Duration::from_millis(100);

/// How long it looks before trying the lease once more.
const REFRESH_WAIT: Duration = Duration::from_secs(10);

/// A token is renewed once less than this much of its life is left (or half
/// its lifetime, when that is shorter).
const REFRESH_MARGIN: Duration = Duration::from_secs(30);

/// Most keys whose step-ups are counted at once (older windows are dropped).
const MAX_STEP_UP_KEYS: usize = 4096;

/// The `client_name` sent with dynamic registration by default.
pub const DEFAULT_CLIENT_NAME: &str = "toolgate";

/// The RFC 7523 section 2.1 grant type.
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// Where a workload's identity assertion (a JWT its platform issues, whose
/// audience is the authorization server) comes from, for the JWT-bearer
/// grant (RFC 7523 section 2.1; workload identity federation, SEP-1933).
#[derive(Debug, Clone)]
pub enum WorkloadAssertion {
    /// This assertion.
    Value(Secret),
    /// Read from this file at each exchange (platforms rotate it: a
    /// Kubernetes projected service-account token, say).
    File(PathBuf),
}

/// What a server's configuration says about its OAuth client.
#[derive(Debug, Clone)]
pub struct OAuthSettings {
    /// The MCP server's URL: the protected resource, and where discovery
    /// starts.
    pub server_url: Url,
    /// The grant tokens come from.
    pub grant: Grant,
    /// A pre-registered client id (always used when set).
    pub client_id: Option<String>,
    /// The pre-registered client's secret.
    pub client_secret: Option<Secret>,
    /// How the client authenticates at the token endpoint; when unset, the
    /// authorization server's metadata decides (rmcp's choice).
    pub token_endpoint_auth: Option<TokenEndpointAuth>,
    /// The PEM private key for `private_key_jwt`.
    pub private_key: Option<Secret>,
    /// The `private_key_jwt` signing algorithm; when unset, the first of the
    /// server's `token_endpoint_auth_signing_alg_values_supported` that rmcp
    /// signs, else ES256.
    pub signing_algorithm: Option<JwtSigningAlgorithm>,
    /// Scopes to ask for; when empty, those of the challenge or the
    /// resource's `scopes_supported` (rmcp's selection).
    pub scopes: Vec<String>,
    /// The redirect URI (authorization code).
    pub redirect_uri: Option<String>,
    /// The URL of the client ID metadata document the gateway serves
    /// (`oauth.public_url` + a path): the client id where the authorization
    /// server supports such documents.
    pub client_metadata_url: Option<String>,
    /// The `client_name` of dynamic registrations.
    pub client_name: String,
    /// Allow token and registration endpoints (and discovered metadata
    /// hosts) on private and loopback addresses (tests, private deployments).
    pub allow_private_addresses: bool,
    /// Step-ups tried per key within [`STEP_UP_WINDOW`].
    pub max_step_ups: u32,
    /// Ask for DPoP-bound tokens (RFC 9449): every token request carries a
    /// proof of the client's key, and a token the authorization server
    /// binds (`token_type: DPoP`) is sent as `Authorization: DPoP` with a
    /// proof per request ([`OAuthClient::resource_auth`]). Default off.
    pub dpop: bool,
    /// The DPoP key (PKCS#8 PEM, P-256). Default: a key generated when the
    /// client is made, so tokens bound by another process (a replica, or
    /// this one before a restart) are refused and renewed.
    pub dpop_key: Option<Secret>,
    /// Tokens come from the JWT-bearer grant (RFC 7523 section 2.1) with
    /// this assertion instead of the grant's own request (`grant` must be
    /// `client_credentials`: non-interactive, the tenant's own token).
    /// The client authenticates with its secret when it has one, else
    /// names its `client_id` (if any). Default: none.
    pub jwt_bearer_assertion: Option<WorkloadAssertion>,
}

impl OAuthSettings {
    /// Settings for `server_url` with `grant` and every option at its
    /// default.
    pub fn new(server_url: Url, grant: Grant) -> Self {
        Self {
            server_url,
            grant,
            client_id: None,
            client_secret: None,
            token_endpoint_auth: None,
            private_key: None,
            signing_algorithm: None,
            scopes: Vec::new(),
            redirect_uri: None,
            client_metadata_url: None,
            client_name: DEFAULT_CLIENT_NAME.to_owned(),
            allow_private_addresses: false,
            max_step_ups: DEFAULT_MAX_STEP_UPS,
            dpop: false,
            dpop_key: None,
            jwt_bearer_assertion: None,
        }
    }

    /// The settings of a configured server (`servers[].oauth`), with the
    /// redirect URI and client metadata document of the gateway's OAuth
    /// listener when there is one.
    pub fn from_config(
        server_url: Url,
        oauth: &ServerOAuth,
        listener: Option<&OAuthListener>,
    ) -> Self {
        let mut settings = Self::new(server_url, oauth.grant);
        settings.client_id = oauth.client_id.clone();
        settings.client_secret = oauth.client_secret.clone();
        settings.token_endpoint_auth = oauth.token_endpoint_auth;
        settings.private_key = oauth.private_key.clone();
        settings.scopes = oauth.scopes.clone();
        if let Some(listener) = listener {
            settings.redirect_uri = Some(listener.redirect_uri());
            // Client ID metadata documents must be served over https; a
            // plain-http listener (tests, a private network) registers
            // dynamically instead.
            if listener.public_url.scheme() == "https" {
                settings.client_metadata_url = Some(listener.client_metadata_url());
            }
            settings.allow_private_addresses = listener.allow_private_addresses;
        }
        settings
    }

    /// Checks that the settings can work.
    fn validate(&self) -> Result<(), OAuthError> {
        let bad = |reason: &str| Err(OAuthError::Settings(reason.to_owned()));
        match self.grant {
            Grant::ClientCredentials if self.jwt_bearer_assertion.is_some() => {
                if self.token_endpoint_auth == Some(TokenEndpointAuth::PrivateKeyJwt) {
                    return bad(
                        "the JWT-bearer grant authenticates with a client secret or not at all",
                    );
                }
                if self.client_secret.is_some() && self.client_id.is_none() {
                    return bad("a client secret needs its pre-registered client_id");
                }
            }
            _ if self.jwt_bearer_assertion.is_some() => {
                return bad("the JWT-bearer grant replaces client_credentials only");
            }
            Grant::ClientCredentials => {
                if self.client_id.is_none() {
                    return bad("client_credentials needs a pre-registered client_id");
                }
                match self.token_endpoint_auth {
                    Some(TokenEndpointAuth::PrivateKeyJwt) if self.private_key.is_none() => {
                        return bad("private_key_jwt needs a private key");
                    }
                    Some(TokenEndpointAuth::PrivateKeyJwt) => {}
                    Some(TokenEndpointAuth::None) => {
                        return bad("client_credentials needs client authentication");
                    }
                    _ if self.client_secret.is_none() => {
                        return bad("client_credentials needs a client secret or a private key");
                    }
                    _ => {}
                }
            }
            Grant::AuthorizationCode => {
                if self.redirect_uri.is_none() {
                    return bad("authorization_code needs a redirect URI (oauth.public_url)");
                }
                if self.client_secret.is_some() && self.client_id.is_none() {
                    return bad("a client secret needs its pre-registered client_id");
                }
            }
        }
        if let Some(pem) = &self.dpop_key
            && DpopKey::from_pem(pem.expose()).is_err()
        {
            return bad("the DPoP key must be a PKCS#8 PEM P-256 private key");
        }
        if let Some(url) = &self.client_metadata_url {
            let ok = Url::parse(url).is_ok_and(|u| u.scheme() == "https" && u.path() != "/");
            if !ok {
                return bad("the client metadata document URL must be https with a path");
            }
        }
        Ok(())
    }
}

/// The identity provider of the enterprise-managed flow (SEP-990): where an
/// end user's ID token is exchanged for an identity assertion grant.
#[derive(Debug, Clone)]
pub struct EnterpriseIdp {
    /// The IdP's issuer identifier.
    pub issuer: String,
    /// The IdP's token endpoint.
    pub token_endpoint: String,
    /// The gateway's client id at the IdP.
    pub client_id: String,
    /// The gateway's client secret at the IdP (`client_secret_basic`); a
    /// public client when unset.
    pub client_secret: Option<Secret>,
}

/// A server's OAuth as `toolgate check` shows it.
#[derive(Debug)]
pub struct Description {
    /// The grant.
    pub grant: Grant,
    /// The client identity presented to the authorization server.
    pub identity: String,
    /// The discovered authorization server's issuer, or why discovery
    /// failed.
    pub issuer: Result<String, OAuthError>,
}

/// Why the state store failed (it is unavailable, or a value is unreadable).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the OAuth state store failed: {0}")]
pub struct StoreError(pub String);

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

    /// Replaces the credentials of `key`.
    fn save_credentials<'a>(
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

    /// Removes the pending flow of `state` (once its code is exchanged).
    fn delete_pending<'a>(&'a self, state: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

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

/// Refresh leases held in this process, per key, each until its time runs
/// out. [`MemoryStore`] uses it alone; the state store's adapter in front of
/// its shared lease, so tasks of one process also exclude each other.
#[derive(Debug, Default)]
pub(crate) struct LocalLeases {
    held: Mutex<HashMap<TokenKey, Instant>>,
}

impl LocalLeases {
    /// Takes the lease of `key` for `ttl` unless it is held and live.
    pub(crate) fn try_take(&self, key: &TokenKey, ttl: Duration) -> bool {
        let now = Instant::now();
        let until = now
            .checked_add(ttl)
            .unwrap_or(now + Duration::from_secs(86_400));
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.retain(|_, until| *until > now);
        if held.contains_key(key) {
            return false;
        }
        held.insert(key.clone(), until);
        true
    }

    /// Gives the lease of `key` back.
    pub(crate) fn release(&self, key: &TokenKey) {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }
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
}

impl OAuthStore for MemoryStore {
    fn load_credentials<'a>(
        &'a self,
        key: &'a TokenKey,
    ) -> BoxFuture<'a, Result<Option<StoredCredentials>, StoreError>> {
        let found = self.with(|i| i.credentials.get(key).cloned());
        Box::pin(async move { Ok(found) })
    }

    fn save_credentials<'a>(
        &'a self,
        key: &'a TokenKey,
        credentials: StoredCredentials,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| i.credentials.insert(key.clone(), credentials));
        Box::pin(async { Ok(()) })
    }

    fn clear_credentials<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| i.credentials.remove(key));
        Box::pin(async { Ok(()) })
    }

    fn load_client<'a>(
        &'a self,
        key: &'a ClientKey,
    ) -> BoxFuture<'a, Result<Option<RegisteredClient>, StoreError>> {
        let found = self.with(|i| i.clients.get(key).cloned());
        Box::pin(async move { Ok(found) })
    }

    fn save_client<'a>(
        &'a self,
        key: &'a ClientKey,
        client: RegisteredClient,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| i.clients.insert(key.clone(), client));
        Box::pin(async { Ok(()) })
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
        Box::pin(async { Ok(()) })
    }

    fn load_pending<'a>(
        &'a self,
        state: &'a str,
    ) -> BoxFuture<'a, Result<Option<PendingFlow>, StoreError>> {
        let found = self.with(|i| i.pending.get(state).cloned());
        Box::pin(async move { Ok(found) })
    }

    fn delete_pending<'a>(&'a self, state: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.with(|i| i.pending.remove(state));
        Box::pin(async { Ok(()) })
    }

    fn lock_refresh<'a>(
        &'a self,
        key: &'a TokenKey,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let taken = self.leases.try_take(key, ttl);
        Box::pin(async move { Ok(taken) })
    }

    fn unlock_refresh<'a>(&'a self, key: &'a TokenKey) -> BoxFuture<'a, Result<(), StoreError>> {
        self.leases.release(key);
        Box::pin(async { Ok(()) })
    }
}

/// Why no token could be had. No variant carries a token, code, verifier
/// or client secret; texts from authorization servers are scrubbed of the
/// values in play and bounded.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OAuthError {
    /// The subject has not authorized the server (or its grant ended): the
    /// end user consents at `url`.
    #[error("the end user must authorize the server first")]
    AuthorizationRequired {
        /// The authorization URL (carries `state` and the PKCE challenge,
        /// never the verifier).
        url: String,
    },
    /// The server still refuses for lack of scope after the bounded step-ups.
    #[error("the server requires scope `{scope}`; {attempts} step-ups did not obtain it")]
    InsufficientScope {
        /// The scope the last challenge asked for.
        scope: String,
        /// Step-ups tried.
        attempts: u32,
    },
    /// The state store failed (retryable).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The authorization server or its metadata could not be reached
    /// (retryable).
    #[error("the authorization server is unreachable: {0}")]
    Unreachable(String),
    /// Discovery found no usable metadata (or metadata that fails its
    /// checks: issuer, resource, PKCE).
    #[error("OAuth discovery failed: {0}")]
    Discovery(String),
    /// An endpoint is on an address the gateway does not call.
    #[error("OAuth endpoint {0} is on a private or reserved address")]
    ForbiddenAddress(String),
    /// The authorization response's issuer is wrong or missing (RFC 9207).
    #[error("the authorization response failed the issuer check: {0}")]
    Issuer(String),
    /// The callback names no pending flow (unknown, used or expired).
    #[error("no pending authorization for this callback")]
    UnknownState,
    /// The end user or the authorization server declined (`error=` on the
    /// callback).
    #[error("the authorization was declined: {0}")]
    Declined(String),
    /// The callback URL lacks `code` or `state`.
    #[error("the callback is malformed: {0}")]
    Callback(String),
    /// The authorization server refused a token request.
    #[error("the authorization server refused: {0}")]
    Refused(String),
    /// The settings cannot work (a missing client id, key or redirect URI).
    #[error("OAuth settings: {0}")]
    Settings(String),
    /// Another task or replica holds the key's refresh lease and its token
    /// did not appear in time (retryable).
    #[error("another replica is renewing this token and has not finished")]
    RefreshInProgress,
}

impl OAuthError {
    /// Whether trying again later may succeed without anyone acting.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            OAuthError::Store(_) | OAuthError::Unreachable(_) | OAuthError::RefreshInProgress
        )
    }
}

/// rmcp's error, described without secrets: `secrets` (the values in play)
/// are cut out of any text an authorization server sent.
fn from_auth(error: AuthError, secrets: &[&str]) -> OAuthError {
    let scrub = |text: String| scrubbed(text, secrets);
    match error {
        AuthError::CredentialStoreError(reason) => OAuthError::Store(StoreError(reason)),
        AuthError::HttpError(e) => OAuthError::Unreachable(scrub(e.without_url().to_string())),
        AuthError::DiscoveryRequestFailed { url, source } => {
            OAuthError::Unreachable(scrub(format!("{url}: {}", root_cause(source.as_ref()))))
        }
        e @ (AuthError::AuthorizationServerMismatch { .. }
        | AuthError::AuthorizationServerMissingIssuer { .. }
        | AuthError::ProtectedResourceMetadataInvalid { .. }
        | AuthError::AuthorizationServersUnavailable { .. }
        | AuthError::MetadataError(_)
        | AuthError::NoAuthorizationSupport
        | AuthError::PkceUnsupported
        | AuthError::UrlError(_)) => OAuthError::Discovery(scrub(e.to_string())),
        AuthError::AuthorizationRequired => {
            OAuthError::Refused("the authorization server requires a new authorization".into())
        }
        AuthError::TokenRefreshRejected(_) => {
            OAuthError::Refused("the refresh token was rejected".into())
        }
        other => OAuthError::Refused(scrub(other.to_string())),
    }
}

/// `text` from an authorization server with `secrets` (the values in play)
/// cut out, bounded.
fn scrubbed(mut text: String, secrets: &[&str]) -> String {
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        text = text.replace(secret, crate::credentials::REDACTED);
    }
    crate::credentials::bounded(&text, crate::credentials::MAX_UPSTREAM_TEXT)
}

/// The innermost cause's text (reqwest puts the useful part there).
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The access token of `credentials` if it has life left (a token without
/// an expiry is taken as valid until a server refuses it).
fn fresh_token(credentials: &StoredCredentials) -> Option<Secret> {
    let token = credentials.token_response.as_ref()?;
    if let (Some(expires_in), Some(received)) = (token.expires_in(), credentials.token_received_at)
    {
        let left = expires_in
            .as_secs()
            .saturating_sub(now_secs().saturating_sub(received));
        let margin = REFRESH_MARGIN
            .as_secs()
            .min(expires_in.as_secs() / 2)
            .max(1);
        if left < margin {
            return None;
        }
    }
    Some(Secret::new(token.access_token().secret()))
}

fn access_of(credentials: &StoredCredentials) -> Option<&str> {
    credentials
        .token_response
        .as_ref()
        .map(|t| t.access_token().secret().as_str())
}

/// The access token of `credentials` when it is not `stale` (when given)
/// and has life left: a token someone else renewed.
fn renewed(credentials: &StoredCredentials, stale: Option<&str>) -> Option<Secret> {
    if stale.is_some() && access_of(credentials) == stale {
        return None;
    }
    fresh_token(credentials)
}

/// A refresh lease taken with [`OAuthStore::lock_refresh`]: given back by
/// [`RefreshLease::release`], or, when the renewal is abandoned (its future
/// dropped), by a task spawned on drop.
struct RefreshLease {
    store: Arc<dyn OAuthStore>,
    key: TokenKey,
    held: bool,
}

impl RefreshLease {
    async fn release(mut self) {
        if let Err(e) = self.store.unlock_refresh(&self.key).await {
            tracing::warn!(tenant = %self.key.tenant, server = %self.key.server, error = %e, "the refresh lease could not be given back; it runs out by itself");
        }
        self.held = false;
    }
}

impl Drop for RefreshLease {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
            let key = self.key.clone();
            runtime.spawn(async move {
                let _ = store.unlock_refresh(&key).await;
            });
        }
    }
}

/// rmcp's `CredentialStore` over an [`OAuthStore`], for one key.
struct CredentialAdapter {
    store: Arc<dyn OAuthStore>,
    key: TokenKey,
}

#[async_trait::async_trait]
impl CredentialStore for CredentialAdapter {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.store
            .load_credentials(&self.key)
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.0))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.store
            .save_credentials(&self.key, credentials)
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.0))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.store
            .clear_credentials(&self.key)
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.0))
    }
}

/// rmcp's `StateStore` over an [`OAuthStore`]: a flow saved by rmcp is kept
/// with whose it is and how it started.
struct StateAdapter {
    store: Arc<dyn OAuthStore>,
    key: TokenKey,
    challenge: Option<String>,
    client_id: String,
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
            .map_err(|e| AuthError::CredentialStoreError(e.0))
    }

    async fn load(&self, csrf_token: &str) -> Result<Option<StoredAuthorizationState>, AuthError> {
        let flow = self
            .store
            .load_pending(csrf_token)
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.0))?;
        // A flow of another key is not this one's.
        Ok(flow
            .filter(|flow| flow.key() == self.key && !flow.is_expired())
            .map(|flow| flow.authorization))
    }

    async fn delete(&self, csrf_token: &str) -> Result<(), AuthError> {
        self.store
            .delete_pending(csrf_token)
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.0))
    }
}

/// Finds the pending flow a callback belongs to, so the gateway can hand
/// the callback to that server's [`OAuthClient::complete`].
///
/// # Errors
/// The callback is malformed or declined, no pending flow has its `state`,
/// or the store failed.
pub async fn pending_flow(
    store: &dyn OAuthStore,
    callback_url: &str,
) -> Result<PendingFlow, OAuthError> {
    let callback = parse_callback(callback_url)?;
    match store.load_pending(&callback.csrf_token).await? {
        Some(flow) if !flow.is_expired() => Ok(flow),
        _ => Err(OAuthError::UnknownState),
    }
}

/// The callback's `code`, `state` and `iss`, or the authorization server's
/// `error`.
fn parse_callback(callback_url: &str) -> Result<AuthorizationCallback, OAuthError> {
    if let Ok(url) = Url::parse(callback_url)
        && let Some((_, error)) = url.query_pairs().find(|(k, _)| k == "error")
    {
        return Err(OAuthError::Declined(crate::credentials::bounded(
            &error, 64,
        )));
    }
    AuthorizationCallback::from_redirect_url(callback_url).map_err(|e| match e {
        AuthError::UrlError(_) => OAuthError::Callback("not a URL".into()),
        other => OAuthError::Callback(other.to_string()),
    })
}

/// Step-ups counted per key.
#[derive(Debug, Default)]
struct StepUps {
    counts: HashMap<TokenKey, (u32, Instant)>,
}

impl StepUps {
    /// Counts one more step-up of `key`; `false` when over `max`.
    fn admit(&mut self, key: &TokenKey, max: u32) -> (bool, u32) {
        let now = Instant::now();
        if self.counts.len() >= MAX_STEP_UP_KEYS {
            self.counts
                .retain(|_, (_, since)| now.duration_since(*since) < STEP_UP_WINDOW);
        }
        let entry = self.counts.entry(key.clone()).or_insert((0, now));
        if now.duration_since(entry.1) >= STEP_UP_WINDOW {
            *entry = (0, now);
        }
        if entry.0 >= max {
            return (false, entry.0);
        }
        entry.0 += 1;
        (true, entry.0)
    }
}

/// One configured server's OAuth client. Cheap to share (`Arc`); every
/// operation names the [`TokenKey`] it acts for, and one key's credentials
/// never serve another.
#[derive(Debug)]
pub struct OAuthClient {
    settings: OAuthSettings,
    store: Arc<dyn OAuthStore>,
    step_ups: Mutex<StepUps>,
    /// How long a task that found the refresh lease taken waits for the
    /// holder's token ([`REFRESH_WAIT`]; shorter in tests).
    refresh_wait: Duration,
    /// Told of each token obtained and each flow started or completed.
    events: Option<EventSink>,
    /// The DPoP key and nonces, when [`OAuthSettings::dpop`] is on.
    dpop: Option<Arc<Dpop>>,
    /// The HTTP client of DPoP managers and of the JWT-bearer grant, built
    /// on first use.
    http: OnceLock<Arc<OAuthHttp>>,
}

/// Where an [`OAuthClient`] reports its events (`token_refreshed`,
/// `token_issued`, `consent_started`, `consent_completed`), for metrics.
#[derive(Clone)]
pub struct EventSink(Arc<EventFn>);

/// What an [`EventSink`] calls.
type EventFn = dyn Fn(&TokenKey, &'static str) + Send + Sync;

impl EventSink {
    /// A sink calling `f` with the key and the event's name.
    pub fn new(f: impl Fn(&TokenKey, &'static str) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EventSink")
    }
}

impl OAuthClient {
    /// A client with `settings`, keeping its state in `store`.
    ///
    /// # Errors
    /// The settings cannot work ([`OAuthError::Settings`]).
    pub fn new(settings: OAuthSettings, store: Arc<dyn OAuthStore>) -> Result<Self, OAuthError> {
        settings.validate()?;
        ensure_crypto_provider();
        let dpop = if settings.dpop {
            let key = match &settings.dpop_key {
                Some(pem) => DpopKey::from_pem(pem.expose()),
                None => DpopKey::generate(),
            }
            .map_err(|e| OAuthError::Settings(e.to_string()))?;
            Some(Arc::new(Dpop::new(key)))
        } else {
            None
        };
        Ok(Self {
            settings,
            store,
            step_ups: Mutex::default(),
            refresh_wait: REFRESH_WAIT,
            events: None,
            dpop,
            http: OnceLock::new(),
        })
    }

    /// The DPoP key and nonces, when DPoP is on.
    pub fn dpop(&self) -> Option<&Arc<Dpop>> {
        self.dpop.as_ref()
    }

    /// How a `method` request to the resource at `url` carries `token`
    /// (the key's): `Authorization: DPoP` with a fresh proof (`ath`, and the
    /// nonce the resource server gave last) when DPoP is on and the
    /// authorization server bound the token (`token_type: DPoP`), else
    /// `Authorization: Bearer`.
    ///
    /// # Errors
    /// The store failed, or the proof could not be made.
    pub async fn resource_auth(
        &self,
        key: &TokenKey,
        token: &Secret,
        method: &str,
        url: &str,
    ) -> Result<ResourceAuth, OAuthError> {
        let bearer = || ResourceAuth {
            authorization: Secret::new(format!("Bearer {}", token.expose())),
            dpop: None,
        };
        let Some(dpop) = &self.dpop else {
            return Ok(bearer());
        };
        let bound = self
            .store
            .load_credentials(key)
            .await?
            .and_then(|c| c.token_response)
            .is_some_and(|t| {
                t.access_token().secret() == token.expose()
                    && t.token_type().as_ref().eq_ignore_ascii_case("dpop")
            });
        if !bound {
            return Ok(bearer());
        }
        let proof = dpop
            .proof(method, url, Some(token.expose()))
            .map_err(|e| OAuthError::Settings(e.to_string()))?;
        Ok(ResourceAuth {
            authorization: Secret::new(format!("DPoP {}", token.expose())),
            dpop: Some(proof),
        })
    }

    /// The resource server at `url` gave `nonce` (`DPoP-Nonce`): the next
    /// proofs to it carry it. Nothing happens when DPoP is off.
    pub fn resource_nonce(&self, url: &str, nonce: &str) {
        if let Some(dpop) = &self.dpop {
            dpop.remember_nonce(url, nonce);
        }
    }

    /// The HTTP client of DPoP managers and of the JWT-bearer grant.
    fn oauth_http(&self) -> Result<Arc<OAuthHttp>, OAuthError> {
        if let Some(http) = self.http.get() {
            return Ok(http.clone());
        }
        let http = OAuthHttp::new(self.settings.allow_private_addresses, self.dpop.clone())
            .map_err(|e| {
                OAuthError::Settings(format!("cannot build the OAuth HTTP client: {e}"))
            })?;
        Ok(self.http.get_or_init(|| Arc::new(http)).clone())
    }

    /// Reports events to `sink`.
    #[must_use]
    pub fn with_events(mut self, sink: EventSink) -> Self {
        self.events = Some(sink);
        self
    }

    /// Reports `event` of `key` to the sink, if any.
    pub(crate) fn event(&self, key: &TokenKey, event: &'static str) {
        if let Some(sink) = &self.events {
            (sink.0)(key, event);
        }
    }

    /// The settings.
    pub fn settings(&self) -> &OAuthSettings {
        &self.settings
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn OAuthStore> {
        &self.store
    }

    /// The access token to send for `key` now: the stored one while it has
    /// life left; else refreshed (authorization code, the refresh token
    /// rotated as the server says) or obtained anew (client credentials),
    /// under the key's refresh lease: when another task or replica is
    /// renewing it, its token.
    ///
    /// # Errors
    /// [`OAuthError::AuthorizationRequired`] with the URL to consent at when
    /// the subject has no usable grant; the store, discovery or the token
    /// endpoint failed.
    pub async fn access_token(&self, key: &TokenKey) -> Result<Secret, OAuthError> {
        let stored = self.store.load_credentials(key).await?;
        if let Some(token) = stored.as_ref().and_then(fresh_token) {
            return Ok(token);
        }
        match self.settings.grant {
            Grant::ClientCredentials => {
                let stale = stored.as_ref().and_then(access_of);
                self.renew_exclusively(key, stale, |_| self.client_credentials(key, None, &[]))
                    .await
            }
            Grant::AuthorizationCode => self.renew_grant(key, stored, None).await,
        }
    }

    /// An authorization-code subject's renewal: a refresh when a grant is
    /// stored, else a consent (the URL to give the end user).
    async fn renew_grant(
        &self,
        key: &TokenKey,
        stored: Option<StoredCredentials>,
        challenge: Option<&str>,
    ) -> Result<Secret, OAuthError> {
        match stored {
            Some(stale) if stale.token_response.is_some() => {
                self.refresh(key, &stale, challenge).await
            }
            _ => Err(OAuthError::AuthorizationRequired {
                url: self.authorization_url(key, challenge).await?,
            }),
        }
    }

    /// Starts an authorization-code flow for `key` and returns the URL the
    /// end user consents at: discovery (from `challenge`, the server's 401
    /// `WWW-Authenticate`, when there is one), the client identity, scopes
    /// (configured, else the challenge's or `scopes_supported`), PKCE S256
    /// and `resource`. The pending flow is kept in the store.
    ///
    /// # Errors
    /// Not an authorization-code server, discovery or registration failed,
    /// or the store failed.
    pub async fn authorization_url(
        &self,
        key: &TokenKey,
        challenge: Option<&str>,
    ) -> Result<String, OAuthError> {
        if self.settings.grant != Grant::AuthorizationCode {
            return Err(OAuthError::Settings(
                "only authorization_code servers have an authorization URL".into(),
            ));
        }
        let (manager, metadata) = self.manager(key, challenge).await?;
        let scopes = if self.settings.scopes.is_empty() {
            manager.select_scopes(None, &[])
        } else {
            with_offline_access(self.settings.scopes.clone(), &metadata)
        };
        self.start_flow(manager, &metadata, key, challenge, &scopes)
            .await
    }

    /// Completes a flow with the authorization server's redirect to the
    /// gateway (`code`, `state`, `iss`): the `iss` check (RFC 9207) and the
    /// code exchange are rmcp's; the credentials are kept under the key the
    /// pending flow names (never one the callback could choose).
    ///
    /// # Errors
    /// The callback is malformed, declined or unknown, the issuer check
    /// failed, or the exchange failed.
    pub async fn complete(&self, callback_url: &str) -> Result<TokenKey, OAuthError> {
        let callback = parse_callback(callback_url)?;
        let flow = pending_flow(self.store.as_ref(), callback_url).await?;
        let key = flow.key();
        let (mut manager, metadata) = self.manager(&key, flow.challenge.as_deref()).await?;
        if metadata.issuer != flow.authorization.expected_issuer {
            return Err(OAuthError::Issuer(
                "the authorization server changed during the flow".into(),
            ));
        }
        let config = self
            .known_identity(&key, &metadata, &flow.client_id)
            .await?
            .ok_or_else(|| OAuthError::Refused("the flow's client is no longer known".into()))?;
        let secret = config.client_secret.clone();
        manager
            .configure_client(config)
            .map_err(|e| from_auth(e, &[]))?;
        manager.set_state_store(StateAdapter {
            store: self.store.clone(),
            key: key.clone(),
            challenge: flow.challenge.clone(),
            client_id: flow.client_id.clone(),
        });
        let secrets = [
            callback.code.as_str(),
            flow.authorization.pkce_verifier.as_str(),
            secret.as_deref().unwrap_or(""),
        ];
        manager
            .exchange_code_for_token_with_issuer(
                &callback.code,
                &callback.csrf_token,
                callback.issuer.as_deref(),
            )
            .await
            .map_err(|e| match e {
                e @ (AuthError::AuthorizationServerMismatch { .. }
                | AuthError::AuthorizationServerMissingIssuer { .. }) => {
                    OAuthError::Issuer(e.to_string())
                }
                AuthError::AuthorizationFailed(reason) => OAuthError::Issuer(reason),
                e => from_auth(e, &secrets),
            })?;
        tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth authorization completed");
        self.event(&key, "consent_completed");
        Ok(key)
    }

    /// The server refused `refused` (401, or 403 `insufficient_scope`) with
    /// `challenge`: a better token. On `insufficient_scope`, a step-up to
    /// the granted scopes plus the challenged ones (a new consent for
    /// authorization code, a new token for client credentials), at most
    /// `max_step_ups` per key within [`STEP_UP_WINDOW`]. Otherwise the token
    /// another replica stored meanwhile, a refresh, or a new grant; an
    /// authorization server that changed (another issuer) voids the stored
    /// credentials.
    ///
    /// # Errors
    /// As [`OAuthClient::access_token`]; [`OAuthError::InsufficientScope`]
    /// once the step-ups are spent.
    pub async fn refused(
        &self,
        key: &TokenKey,
        refused: &Secret,
        challenge: Option<&str>,
    ) -> Result<Secret, OAuthError> {
        let params = challenge.map(|c| WWWAuthenticateParams::parse(c, &self.settings.server_url));
        if let Some(params) = params.as_ref().filter(|p| p.is_insufficient_scope()) {
            let required = params.scope.clone().unwrap_or_default();
            let (admitted, attempts) = self
                .step_ups
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .admit(key, self.settings.max_step_ups);
            if !admitted {
                return Err(OAuthError::InsufficientScope {
                    scope: required,
                    attempts,
                });
            }
            tracing::info!(tenant = %key.tenant, server = %key.server, attempt = attempts, "OAuth step-up");
            let granted = self
                .store
                .load_credentials(key)
                .await?
                .map(|c| c.granted_scopes)
                .unwrap_or_default();
            let wanted = union(&granted, &required);
            return match self.settings.grant {
                Grant::ClientCredentials => self.client_credentials(key, challenge, &wanted).await,
                Grant::AuthorizationCode => {
                    let (manager, metadata) = self.manager(key, challenge).await?;
                    let scopes = with_offline_access(wanted, &metadata);
                    Err(OAuthError::AuthorizationRequired {
                        url: self
                            .start_flow(manager, &metadata, key, challenge, &scopes)
                            .await?,
                    })
                }
            };
        }
        let stored = self.store.load_credentials(key).await?;
        // Another session (or replica) may have renewed it meanwhile.
        if let Some(stored) = &stored
            && access_of(stored).is_some_and(|t| t != refused.expose())
            && let Some(token) = fresh_token(stored)
        {
            return Ok(token);
        }
        match self.settings.grant {
            Grant::ClientCredentials => {
                self.renew_exclusively(key, Some(refused.expose()), |_| async move {
                    self.store.clear_credentials(key).await?;
                    self.client_credentials(key, challenge, &[]).await
                })
                .await
            }
            Grant::AuthorizationCode => self.renew_grant(key, stored, challenge).await,
        }
    }

    /// The enterprise-managed flow (SEP-990, rmcp's `enterprise` module):
    /// the end user's `id_token` from the enterprise IdP is exchanged there
    /// for an identity assertion grant, which the server's authorization
    /// server (discovered as usual) exchanges for an access token, kept
    /// under `key`. The server's client is the pre-registered one
    /// (`client_secret_basic` unless `token_endpoint_auth` says post).
    ///
    /// # Errors
    /// No pre-registered client, discovery failed, an endpoint is on a
    /// refused address, or either exchange failed.
    pub async fn enterprise_token(
        &self,
        key: &TokenKey,
        idp: &EnterpriseIdp,
        id_token: &Secret,
    ) -> Result<Secret, OAuthError> {
        let client_id = self.settings.client_id.clone().ok_or_else(|| {
            OAuthError::Settings("the enterprise-managed flow needs a client_id".into())
        })?;
        let (_manager, metadata) = self.manager(key, None).await?;
        let issuer = metadata.issuer.clone().ok_or_else(|| {
            OAuthError::Discovery("the authorization server metadata has no issuer".into())
        })?;
        check_endpoint(&idp.token_endpoint, self.settings.allow_private_addresses).await?;
        let authentication = |secret: Option<&Secret>, post: bool| match secret {
            None => EmaClientAuthentication::None,
            Some(secret) if post => EmaClientAuthentication::ClientSecretPost(
                oauth2::ClientSecret::new(secret.expose().to_owned()),
            ),
            Some(secret) => EmaClientAuthentication::ClientSecretBasic(oauth2::ClientSecret::new(
                secret.expose().to_owned(),
            )),
        };
        let post = self.settings.token_endpoint_auth == Some(TokenEndpointAuth::ClientSecretPost);
        let resource_as =
            EmaAuthorizationServer::new(&issuer, &metadata.token_endpoint, &client_id)
                .with_client_authentication(authentication(
                    self.settings.client_secret.as_ref(),
                    post,
                ));
        let idp_server =
            EmaAuthorizationServer::new(&idp.issuer, &idp.token_endpoint, &idp.client_id)
                .with_client_authentication(authentication(idp.client_secret.as_ref(), false));
        let http = default_oauth_http_client().map_err(|e| from_auth(e, &[]))?;
        let resource = self.settings.server_url.as_str();
        let token = EmaExchangeRequest::new_with_id_token(
            idp_server,
            resource_as,
            resource,
            id_token.expose(),
        )
        .with_scopes(self.settings.scopes.iter().cloned())
        .exchange(&http, &http)
        .await
        .map_err(|e: EmaError| {
            let secrets = [
                id_token.expose(),
                self.settings
                    .client_secret
                    .as_ref()
                    .map_or("", |s| s.expose()),
                idp.client_secret.as_ref().map_or("", |s| s.expose()),
            ];
            from_auth(AuthError::OAuthError(e.to_string()), &secrets)
        })?;
        let mut response = OAuthTokenResponse::new(
            token.access_token.clone(),
            oauth2::basic::BasicTokenType::Bearer,
            VendorExtraTokenFields::default(),
        );
        response.set_expires_in(token.expires_in.as_ref());
        let scopes: Vec<String> = token.scopes.iter().cloned().collect();
        let stored = StoredCredentials::new(client_id, Some(response), scopes, Some(now_secs()))
            .with_issuer(Some(issuer));
        self.store.save_credentials(key, stored).await?;
        Ok(Secret::new(token.access_token.secret()))
    }

    /// What `toolgate check` shows of the server's OAuth: its grant, the
    /// client identity the gateway presents, and the authorization server
    /// discovery finds (from the server's metadata, without a challenge).
    pub async fn describe(&self) -> Description {
        let discovered = self
            .manager(&TokenKey::tenant_wide("", ""), None)
            .await
            .map(|(_, metadata)| metadata);
        let identity = match (&self.settings.client_id, &discovered) {
            (Some(id), _) => format!("pre-registered client `{id}`"),
            (None, Ok(metadata))
                if self.settings.client_metadata_url.is_some() && supports_cimd(metadata) =>
            {
                format!(
                    "client ID metadata document {}",
                    self.settings.client_metadata_url.as_deref().unwrap_or("")
                )
            }
            (None, Ok(metadata)) if metadata.registration_endpoint.is_some() => {
                "dynamic registration (RFC 7591)".to_owned()
            }
            (None, Ok(_)) => "none available (no client_id, no metadata document support, no \
                              registration endpoint)"
                .to_owned(),
            (None, Err(_)) => "unknown until discovery succeeds".to_owned(),
        };
        Description {
            grant: self.settings.grant,
            identity,
            issuer: discovered.map(|m| m.issuer.unwrap_or_else(|| "(no issuer)".to_owned())),
        }
    }

    /// An rmcp manager for `key` with metadata discovered (from
    /// `challenge` when given) and checked against the address rule.
    async fn manager(
        &self,
        key: &TokenKey,
        challenge: Option<&str>,
    ) -> Result<(AuthorizationManager, AuthorizationMetadata), OAuthError> {
        let url = self.settings.server_url.as_str();
        // With DPoP, toolgate's client (proofs on token requests, the
        // address rule on every resolved address) replaces rmcp's own.
        let dpop_http = match self.dpop {
            Some(_) => Some(self.oauth_http()?),
            None => None,
        };
        let created = if let Some(http) = &dpop_http {
            AuthorizationManager::new_with_oauth_http_client(url, http.clone()).await
        } else if self.settings.allow_private_addresses {
            AuthorizationManager::new_allowing_private_addresses(url).await
        } else {
            AuthorizationManager::new(url).await
        };
        let mut manager = created.map_err(|e| from_auth(e, &[]))?;
        manager.set_credential_store(CredentialAdapter {
            store: self.store.clone(),
            key: key.clone(),
        });
        let resolution = manager
            .resolve_metadata_from_challenge(challenge)
            .await
            .map_err(|e| from_auth(e, &[]))?;
        let allow = self.settings.allow_private_addresses;
        check_endpoint(&resolution.metadata.token_endpoint, allow).await?;
        if let Some(registration) = &resolution.metadata.registration_endpoint {
            check_endpoint(registration, allow).await?;
        }
        let metadata = self.restrict_auth_method(resolution.metadata)?;
        if let Some(http) = &dpop_http {
            http.add_token_endpoint(&metadata.token_endpoint);
        }
        manager.set_metadata(metadata.clone());
        Ok((manager, metadata))
    }

    /// Narrows the metadata's `token_endpoint_auth_methods_supported` to the
    /// configured method, so rmcp (which picks from that list) uses it.
    fn restrict_auth_method(
        &self,
        mut metadata: AuthorizationMetadata,
    ) -> Result<AuthorizationMetadata, OAuthError> {
        let Some(method) = self.settings.token_endpoint_auth else {
            return Ok(metadata);
        };
        let name = match method {
            TokenEndpointAuth::ClientSecretBasic => "client_secret_basic",
            TokenEndpointAuth::ClientSecretPost => "client_secret_post",
            TokenEndpointAuth::PrivateKeyJwt => "private_key_jwt",
            TokenEndpointAuth::None => "none",
        };
        const FIELD: &str = "token_endpoint_auth_methods_supported";
        if let Some(listed) = metadata
            .additional_fields
            .get(FIELD)
            .and_then(|v| v.as_array())
            && !listed.iter().any(|m| m.as_str() == Some(name))
        {
            return Err(OAuthError::Discovery(format!(
                "the authorization server does not support {name}"
            )));
        }
        metadata
            .additional_fields
            .insert(FIELD.to_owned(), serde_json::json!([name]));
        Ok(metadata)
    }

    /// The client identity for a new flow, in the spec's order:
    /// pre-registered, the client ID metadata document (where the server
    /// supports it), the registration stored for this issuer, a new
    /// registration (kept for the issuer).
    async fn identity(
        &self,
        key: &TokenKey,
        manager: &mut AuthorizationManager,
        metadata: &AuthorizationMetadata,
        scopes: &[String],
    ) -> Result<OAuthClientConfig, OAuthError> {
        let redirect = self.redirect_uri()?;
        if let Some(id) = &self.settings.client_id {
            let mut config = OAuthClientConfig::new(id.clone(), redirect);
            if let Some(secret) = &self.settings.client_secret {
                config = config.with_client_secret(secret.expose());
            }
            return Ok(config);
        }
        if let Some(url) = &self.settings.client_metadata_url
            && supports_cimd(metadata)
        {
            return Ok(OAuthClientConfig::new(url.clone(), redirect));
        }
        let client_key = client_key(key, metadata);
        if let Some(client) = self.store.load_client(&client_key).await? {
            return Ok(registered_config(client, redirect));
        }
        let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
        let config = manager
            .register_client(&self.settings.client_name, &redirect, &scope_refs)
            .await
            .map_err(|e| from_auth(e, &[]))?;
        self.store
            .save_client(
                &client_key,
                RegisteredClient {
                    client_id: config.client_id.clone(),
                    client_secret: config.client_secret.clone(),
                },
            )
            .await?;
        Ok(config)
    }

    /// The identity a flow or stored credentials were made with, when it is
    /// still this server's: the pre-registered client, the metadata
    /// document, or the registration stored for this issuer.
    async fn known_identity(
        &self,
        key: &TokenKey,
        metadata: &AuthorizationMetadata,
        client_id: &str,
    ) -> Result<Option<OAuthClientConfig>, OAuthError> {
        let redirect = self.redirect_uri()?;
        if self.settings.client_id.as_deref() == Some(client_id) {
            let mut config = OAuthClientConfig::new(client_id, redirect);
            if let Some(secret) = &self.settings.client_secret {
                config = config.with_client_secret(secret.expose());
            }
            return Ok(Some(config));
        }
        if self.settings.client_metadata_url.as_deref() == Some(client_id) {
            return Ok(Some(OAuthClientConfig::new(client_id, redirect)));
        }
        Ok(self
            .store
            .load_client(&client_key(key, metadata))
            .await?
            .filter(|client| client.client_id == client_id)
            .map(|client| registered_config(client, redirect)))
    }

    fn redirect_uri(&self) -> Result<String, OAuthError> {
        self.settings
            .redirect_uri
            .clone()
            .ok_or_else(|| OAuthError::Settings("no redirect URI".into()))
    }

    /// Configures the client identity and asks rmcp for the authorization
    /// URL (the pending flow goes to the store through [`StateAdapter`]).
    async fn start_flow(
        &self,
        mut manager: AuthorizationManager,
        metadata: &AuthorizationMetadata,
        key: &TokenKey,
        challenge: Option<&str>,
        scopes: &[String],
    ) -> Result<String, OAuthError> {
        let config = self.identity(key, &mut manager, metadata, scopes).await?;
        manager.set_state_store(StateAdapter {
            store: self.store.clone(),
            key: key.clone(),
            challenge: challenge.map(str::to_owned),
            client_id: config.client_id.clone(),
        });
        manager
            .configure_client(config)
            .map_err(|e| from_auth(e, &[]))?;
        let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
        let url = manager
            .get_authorization_url(&scope_refs)
            .await
            .map_err(|e| from_auth(e, &[]))?;
        tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth authorization started");
        self.event(key, "consent_started");
        Ok(url)
    }

    /// Refreshes `stale` under the key's refresh lease
    /// ([`OAuthClient::renew_exclusively`]): the token another task or
    /// replica renewed meanwhile, else [`OAuthClient::refresh_unlocked`] of
    /// the credentials stored now.
    async fn refresh(
        &self,
        key: &TokenKey,
        stale: &StoredCredentials,
        challenge: Option<&str>,
    ) -> Result<Secret, OAuthError> {
        self.renew_exclusively(key, access_of(stale), |current| async move {
            let current = current.filter(|c| c.token_response.is_some());
            self.refresh_unlocked(key, current.as_ref().unwrap_or(stale), challenge)
                .await
        })
        .await
    }

    /// Runs `renew` (which asks the token endpoint and stores the result)
    /// for `key` while holding its refresh lease ([`REFRESH_LEASE_TTL`]),
    /// and gives the lease back afterwards, whatever the outcome. `stale` is
    /// the access token being replaced, if any.
    ///
    /// When another task or replica holds the lease, its token is awaited:
    /// the stored credentials are read every [`REFRESH_POLL`] until a fresh
    /// token other than `stale` appears, for at most [`REFRESH_WAIT`] (less
    /// when the credentials disappear: the holder gave up). Then the lease
    /// is tried once more; still taken, the renewal fails with
    /// [`OAuthError::RefreshInProgress`]. Once the lease is held, the stored
    /// credentials are read again (the previous holder may have just
    /// finished) and handed to `renew`.
    async fn renew_exclusively<F, Fut>(
        &self,
        key: &TokenKey,
        stale: Option<&str>,
        renew: F,
    ) -> Result<Secret, OAuthError>
    where
        F: FnOnce(Option<StoredCredentials>) -> Fut,
        Fut: Future<Output = Result<Secret, OAuthError>>,
    {
        if !self.store.lock_refresh(key, REFRESH_LEASE_TTL).await? {
            tracing::debug!(tenant = %key.tenant, server = %key.server, "another holder is renewing this token; waiting for its token");
            if let Some(token) = self.await_renewed(key, stale).await? {
                return Ok(token);
            }
            if !self.store.lock_refresh(key, REFRESH_LEASE_TTL).await? {
                return Err(OAuthError::RefreshInProgress);
            }
        }
        let lease = RefreshLease {
            store: self.store.clone(),
            key: key.clone(),
            held: true,
        };
        let outcome = async {
            let current = self.store.load_credentials(key).await?;
            if let Some(token) = current.as_ref().and_then(|c| renewed(c, stale)) {
                return Ok(token);
            }
            renew(current).await
        }
        .await;
        lease.release().await;
        outcome
    }

    /// Reads the credentials of `key` every [`REFRESH_POLL`] until a fresh
    /// token other than `stale` appears (`Some`), the credentials disappear
    /// after having been seen, or `refresh_wait` passes (`None`).
    async fn await_renewed(
        &self,
        key: &TokenKey,
        stale: Option<&str>,
    ) -> Result<Option<Secret>, OAuthError> {
        let deadline = Instant::now() + self.refresh_wait;
        let mut seen = false;
        loop {
            tokio::time::sleep(REFRESH_POLL).await;
            match self.store.load_credentials(key).await? {
                Some(now) => {
                    if let Some(token) = renewed(&now, stale) {
                        return Ok(Some(token));
                    }
                    seen = true;
                }
                None if seen => return Ok(None),
                None => {}
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// Refreshes `stale` (rmcp: `resource`, rotation, the guard); when that
    /// cannot work (another issuer now, no refresh token, the refresh token
    /// rejected, the client gone), the credentials are dropped and a new
    /// consent is required. A rejection after another replica refreshed
    /// yields that replica's token. The caller holds the refresh lease.
    async fn refresh_unlocked(
        &self,
        key: &TokenKey,
        stale: &StoredCredentials,
        challenge: Option<&str>,
    ) -> Result<Secret, OAuthError> {
        let (mut manager, metadata) = self.manager(key, challenge).await?;
        let same_issuer = stale.issuer.is_none() || stale.issuer == metadata.issuer;
        let has_refresh = stale
            .token_response
            .as_ref()
            .is_some_and(|t| t.refresh_token().is_some());
        let identity = if same_issuer && has_refresh {
            self.known_identity(key, &metadata, &stale.client_id)
                .await?
        } else {
            None
        };
        if let Some(config) = identity {
            let secret = config.client_secret.clone();
            manager
                .configure_client(config)
                .map_err(|e| from_auth(e, &[]))?;
            let refresh = stale
                .token_response
                .as_ref()
                .and_then(|t| t.refresh_token())
                .map(|t| t.secret().clone())
                .unwrap_or_default();
            match manager.refresh_token().await {
                Ok(response) => {
                    tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth token refreshed");
                    self.event(key, "token_refreshed");
                    return Ok(Secret::new(response.access_token().secret()));
                }
                Err(AuthError::TokenRefreshRejected(_) | AuthError::AuthorizationRequired) => {
                    // Another replica may have rotated the refresh token first.
                    if let Some(now) = self.store.load_credentials(key).await?
                        && access_of(&now) != access_of(stale)
                        && let Some(token) = fresh_token(&now)
                    {
                        return Ok(token);
                    }
                }
                Err(e) => {
                    let secrets = [refresh.as_str(), secret.as_deref().unwrap_or("")];
                    return Err(from_auth(e, &secrets));
                }
            }
        }
        if !same_issuer {
            tracing::warn!(tenant = %key.tenant, server = %key.server, "the authorization server changed; stored credentials dropped");
        }
        self.store.clear_credentials(key).await?;
        let scopes = if self.settings.scopes.is_empty() {
            manager.select_scopes(None, &[])
        } else {
            with_offline_access(self.settings.scopes.clone(), &metadata)
        };
        Err(OAuthError::AuthorizationRequired {
            url: self
                .start_flow(manager, &metadata, key, challenge, &scopes)
                .await?,
        })
    }

    /// A client-credentials token (rmcp: `client_secret_basic`/`_post` or
    /// `private_key_jwt`), with `extra` scopes on step-up.
    async fn client_credentials(
        &self,
        key: &TokenKey,
        challenge: Option<&str>,
        extra: &[String],
    ) -> Result<Secret, OAuthError> {
        if let Some(assertion) = &self.settings.jwt_bearer_assertion {
            return self.jwt_bearer(key, challenge, extra, assertion).await;
        }
        let (mut manager, metadata) = self.manager(key, challenge).await?;
        let client_id = self
            .settings
            .client_id
            .clone()
            .ok_or_else(|| OAuthError::Settings("no client_id".into()))?;
        let mut scopes = if !extra.is_empty() {
            extra.to_vec()
        } else if !self.settings.scopes.is_empty() {
            self.settings.scopes.clone()
        } else {
            manager.select_scopes(None, &[])
        };
        scopes.retain(|s| s != "offline_access");
        let resource = Some(self.settings.server_url.to_string());
        let (config, secret) = match self.settings.token_endpoint_auth {
            Some(TokenEndpointAuth::PrivateKeyJwt) => {
                let key_pem = self
                    .settings
                    .private_key
                    .as_ref()
                    .ok_or_else(|| OAuthError::Settings("no private key".into()))?;
                let config = ClientCredentialsConfig::PrivateKeyJwt {
                    client_id,
                    signing_key: key_pem.expose().as_bytes().to_vec(),
                    signing_algorithm: self.signing_algorithm(&metadata),
                    token_endpoint_audience: None,
                    scopes,
                    resource,
                };
                (config, None)
            }
            _ => {
                let secret = self
                    .settings
                    .client_secret
                    .as_ref()
                    .ok_or_else(|| OAuthError::Settings("no client secret".into()))?;
                let config = ClientCredentialsConfig::ClientSecret {
                    client_id,
                    client_secret: secret.expose().to_owned(),
                    scopes,
                    resource,
                };
                (config, Some(secret.expose()))
            }
        };
        let secrets = [secret.unwrap_or("")];
        manager
            .validate_client_credentials_metadata(&config)
            .map_err(|e| from_auth(e, &secrets))?;
        manager
            .configure_client_credentials(&config)
            .map_err(|e| from_auth(e, &secrets))?;
        // rmcp 3.11's `exchange_client_credentials` future is not `Send`
        // (its private_key_jwt path holds a `form_urlencoded::Serializer`
        // across an await), so it runs to completion on a blocking thread.
        let runtime = tokio::runtime::Handle::current();
        let response = tokio::task::spawn_blocking(move || {
            runtime.block_on(async move { manager.exchange_client_credentials(&config).await })
        })
        .await
        .map_err(|e| OAuthError::Refused(format!("the token request was abandoned: {e}")))?
        .map_err(|e| from_auth(e, &secrets))?;
        tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth client-credentials token obtained");
        self.event(key, "token_issued");
        Ok(Secret::new(response.access_token().secret()))
    }

    /// A token from the JWT-bearer grant (RFC 7523 section 2.1) with the
    /// workload's `assertion`, at the token endpoint discovery finds, for
    /// the configured scopes (else rmcp's selection; `extra` on step-up)
    /// and the server as `resource`. rmcp 3.11 sends this grant only inside
    /// its enterprise flow (for an ID-JAG it obtained itself), and oauth2
    /// has no request for it: the form is built here, sent through
    /// [`OAuthHttp`] (the address rule; a DPoP proof when on), and the
    /// answer read as oauth2's token or error response. A refusal is final
    /// (no retry, no other grant).
    async fn jwt_bearer(
        &self,
        key: &TokenKey,
        challenge: Option<&str>,
        extra: &[String],
        assertion: &WorkloadAssertion,
    ) -> Result<Secret, OAuthError> {
        let (manager, metadata) = self.manager(key, challenge).await?;
        let mut scopes = if !extra.is_empty() {
            extra.to_vec()
        } else if !self.settings.scopes.is_empty() {
            self.settings.scopes.clone()
        } else {
            manager.select_scopes(None, &[])
        };
        scopes.retain(|s| s != "offline_access");
        let assertion = match assertion {
            WorkloadAssertion::Value(value) => value.clone(),
            WorkloadAssertion::File(path) => Secret::new(
                tokio::fs::read_to_string(path)
                    .await
                    .map_err(|e| {
                        OAuthError::Settings(format!(
                            "the workload assertion {} cannot be read: {e}",
                            path.display()
                        ))
                    })?
                    .trim(),
            ),
        };
        let secret = self.settings.client_secret.as_ref();
        let secrets = [assertion.expose(), secret.map_or("", Secret::expose)];
        let request = self.jwt_bearer_request(&metadata.token_endpoint, &assertion, &scopes)?;
        let http = self.oauth_http()?;
        http.add_token_endpoint(&metadata.token_endpoint);
        let response = http
            .send(request, false)
            .await
            .map_err(|e| OAuthError::Unreachable(scrubbed(root_cause(e.as_ref()), &secrets)))?;
        if !response.status().is_success() {
            let reason = serde_json::from_slice::<
                oauth2::StandardErrorResponse<oauth2::basic::BasicErrorResponseType>,
            >(response.body())
            .map_or_else(
                |_| format!("HTTP {}", response.status().as_u16()),
                |e| e.to_string(),
            );
            return Err(OAuthError::Refused(scrubbed(reason, &secrets)));
        }
        let token: OAuthTokenResponse = serde_json::from_slice(response.body())
            .map_err(|_| OAuthError::Refused("the token response is malformed".into()))?;
        let granted = token
            .scopes()
            .map(|s| s.iter().map(|s| s.to_string()).collect())
            .unwrap_or(scopes);
        let access = Secret::new(token.access_token().secret());
        let stored = StoredCredentials::new(
            self.settings.client_id.clone().unwrap_or_default(),
            Some(token),
            granted,
            Some(now_secs()),
        )
        .with_issuer(metadata.issuer.clone());
        self.store.save_credentials(key, stored).await?;
        tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth JWT-bearer token obtained");
        self.event(key, "token_issued");
        Ok(access)
    }

    /// The JWT-bearer token request (RFC 7523 section 2.1): the grant, the
    /// assertion, `scope` when there are scopes, `resource`, and the
    /// client's authentication (its secret, Basic unless `token_endpoint_auth`
    /// says post; else its `client_id`, if any).
    fn jwt_bearer_request(
        &self,
        token_endpoint: &str,
        assertion: &Secret,
        scopes: &[String],
    ) -> Result<http::Request<Vec<u8>>, OAuthError> {
        use base64::Engine as _;

        let secret = self.settings.client_secret.as_ref();
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", JWT_BEARER_GRANT)
            .append_pair("assertion", assertion.expose());
        if !scopes.is_empty() {
            form.append_pair("scope", &scopes.join(" "));
        }
        form.append_pair("resource", self.settings.server_url.as_str());
        let mut request = http::Request::builder()
            .method(http::Method::POST)
            .uri(token_endpoint)
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(http::header::ACCEPT, "application/json");
        match (&self.settings.client_id, secret) {
            (Some(id), Some(secret))
                if self.settings.token_endpoint_auth
                    == Some(TokenEndpointAuth::ClientSecretPost) =>
            {
                form.append_pair("client_id", id)
                    .append_pair("client_secret", secret.expose());
            }
            (Some(id), Some(secret)) => {
                // RFC 6749 section 2.3.1: both form-encoded, then Basic.
                let encode = |v: &str| url::form_urlencoded::byte_serialize(v.as_bytes()).collect();
                let (id, secret): (String, String) = (encode(id), encode(secret.expose()));
                let basic =
                    base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"));
                let mut value =
                    http::HeaderValue::from_str(&format!("Basic {basic}")).map_err(|_| {
                        OAuthError::Settings("the client credentials are not ASCII".into())
                    })?;
                value.set_sensitive(true);
                request = request.header(http::header::AUTHORIZATION, value);
            }
            (Some(id), None) => {
                form.append_pair("client_id", id);
            }
            (None, _) => {}
        }
        request
            .body(form.finish().into_bytes())
            .map_err(|_| OAuthError::Discovery("the token endpoint is not a valid URI".into()))
    }

    /// The configured algorithm, else the first the server lists that rmcp
    /// signs, else ES256.
    fn signing_algorithm(&self, metadata: &AuthorizationMetadata) -> JwtSigningAlgorithm {
        if let Some(algorithm) = self.settings.signing_algorithm {
            return algorithm;
        }
        metadata
            .additional_fields
            .get("token_endpoint_auth_signing_alg_values_supported")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .find_map(parse_algorithm)
            .unwrap_or(JwtSigningAlgorithm::ES256)
    }
}

/// Installs the process-wide TLS crypto provider (ring) once: rmcp builds
/// its own HTTP clients for OAuth, and reqwest is built without a provider.
fn ensure_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Fails only if another provider is installed already: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A JWS algorithm name rmcp signs `private_key_jwt` assertions with.
pub fn parse_algorithm(name: &str) -> Option<JwtSigningAlgorithm> {
    Some(match name {
        "RS256" => JwtSigningAlgorithm::RS256,
        "RS384" => JwtSigningAlgorithm::RS384,
        "RS512" => JwtSigningAlgorithm::RS512,
        "ES256" => JwtSigningAlgorithm::ES256,
        "ES384" => JwtSigningAlgorithm::ES384,
        _ => return None,
    })
}

fn supports_cimd(metadata: &AuthorizationMetadata) -> bool {
    metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false)
}

/// Where a registration at this authorization server is kept: by issuer
/// (the token endpoint when the metadata names none).
fn client_key(key: &TokenKey, metadata: &AuthorizationMetadata) -> ClientKey {
    let issuer = metadata
        .issuer
        .clone()
        .unwrap_or_else(|| metadata.token_endpoint.clone());
    ClientKey::new(&key.tenant, &key.server, issuer)
}

fn registered_config(client: RegisteredClient, redirect: String) -> OAuthClientConfig {
    let mut config = OAuthClientConfig::new(client.client_id, redirect);
    if let Some(secret) = client.client_secret.filter(|s| !s.is_empty()) {
        config = config.with_client_secret(secret);
    }
    config
}

/// `granted` plus the space-separated `required`, each once, in order.
fn union(granted: &[String], required: &str) -> Vec<String> {
    let mut scopes: Vec<String> = Vec::new();
    for scope in granted
        .iter()
        .map(String::as_str)
        .chain(required.split_whitespace())
    {
        if !scopes.iter().any(|s| s == scope) {
            scopes.push(scope.to_owned());
        }
    }
    scopes
}

/// `scopes` plus `offline_access` when the authorization server lists it
/// (SEP-2207: so that it issues a refresh token).
fn with_offline_access(mut scopes: Vec<String>, metadata: &AuthorizationMetadata) -> Vec<String> {
    let listed = metadata
        .scopes_supported
        .as_ref()
        .is_some_and(|s| s.iter().any(|s| s == "offline_access"));
    if listed && !scopes.is_empty() && !scopes.iter().any(|s| s == "offline_access") {
        scopes.push("offline_access".to_owned());
    }
    scopes
}

/// Refuses an endpoint the gateway would call (token, registration, the
/// IdP's) that resolves to a private or loopback address, unless
/// `allow_private`; link-local, unspecified, multicast and broadcast
/// addresses always. A name that does not resolve is left to the request
/// itself to fail.
async fn check_endpoint(endpoint: &str, allow_private: bool) -> Result<(), OAuthError> {
    let url = Url::parse(endpoint)
        .map_err(|_| OAuthError::Discovery("an endpoint is not a URL".into()))?;
    let shown = || {
        let mut shown = url.clone();
        shown.set_query(None);
        shown.to_string()
    };
    if !matches!(url.scheme(), "http" | "https") {
        return Err(OAuthError::Discovery(format!(
            "endpoint {} is not http(s)",
            shown()
        )));
    }
    let addresses: Vec<IpAddr> = match url.host() {
        Some(url::Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
        Some(url::Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
        Some(url::Host::Domain(name)) => {
            let port = url.port_or_known_default().unwrap_or(443);
            match tokio::net::lookup_host((name, port)).await {
                Ok(found) => found.map(|a| a.ip()).collect(),
                Err(_) => return Ok(()),
            }
        }
        None => return Err(OAuthError::Discovery("an endpoint has no host".into())),
    };
    for ip in addresses {
        match classify(ip) {
            AddressClass::Public => {}
            AddressClass::Private if allow_private => {}
            AddressClass::Private | AddressClass::Reserved => {
                return Err(OAuthError::ForbiddenAddress(shown()));
            }
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum AddressClass {
    Public,
    /// Private, loopback, shared (CGNAT) or unique-local.
    Private,
    /// Link-local, unspecified, multicast, broadcast, documentation.
    Reserved,
}

pub(super) fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
            {
                AddressClass::Reserved
            } else if v4.is_private() || v4.is_loopback() || (a == 100 && (64..128).contains(&b)) {
                AddressClass::Private
            } else {
                AddressClass::Public
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return classify(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            if v6.is_unspecified() || v6.is_multicast() || (first & 0xffc0) == 0xfe80 {
                AddressClass::Reserved
            } else if v6.is_loopback() || (first & 0xfe00) == 0xfc00 {
                AddressClass::Private
            } else {
                AddressClass::Public
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_classified() {
        let class = |s: &str| classify(s.parse().expect("an address"));
        assert_eq!(class("8.8.8.8"), AddressClass::Public);
        assert_eq!(class("10.1.2.3"), AddressClass::Private);
        assert_eq!(class("127.0.0.1"), AddressClass::Private);
        assert_eq!(class("100.64.0.1"), AddressClass::Private);
        assert_eq!(class("169.254.169.254"), AddressClass::Reserved);
        assert_eq!(class("0.0.0.0"), AddressClass::Reserved);
        assert_eq!(class("::1"), AddressClass::Private);
        assert_eq!(class("fd00::1"), AddressClass::Private);
        assert_eq!(class("fe80::1"), AddressClass::Reserved);
        assert_eq!(class("::ffff:169.254.1.1"), AddressClass::Reserved);
        assert_eq!(class("2001:4860::8888"), AddressClass::Public);
    }

    #[tokio::test]
    async fn private_endpoints_need_the_setting() {
        let token = "http://127.0.0.1:9/token";
        assert!(matches!(
            check_endpoint(token, false).await,
            Err(OAuthError::ForbiddenAddress(_))
        ));
        assert!(check_endpoint(token, true).await.is_ok());
        assert!(matches!(
            check_endpoint("http://169.254.169.254/token", true).await,
            Err(OAuthError::ForbiddenAddress(_))
        ));
    }

    #[test]
    fn step_ups_are_bounded_per_key() {
        let mut step_ups = StepUps::default();
        let alice = TokenKey::new("t", "alice", "s");
        let bob = TokenKey::new("t", "bob", "s");
        assert_eq!(step_ups.admit(&alice, 2), (true, 1));
        assert_eq!(step_ups.admit(&alice, 2), (true, 2));
        assert_eq!(step_ups.admit(&alice, 2), (false, 2));
        assert_eq!(step_ups.admit(&bob, 2), (true, 1));
    }

    #[test]
    fn scope_union_keeps_order_and_drops_repeats() {
        let granted = vec!["mcp:basic".to_owned(), "offline_access".to_owned()];
        assert_eq!(
            union(&granted, "mcp:basic mcp:write"),
            ["mcp:basic", "offline_access", "mcp:write"]
        );
    }

    #[test]
    fn errors_never_carry_the_values_in_play() {
        let error = from_auth(
            AuthError::TokenExchangeFailed("invalid_grant: code c0de-1234 is used".into()),
            &["c0de-1234"],
        );
        let text = error.to_string();
        assert!(!text.contains("c0de-1234"), "{text}");
        assert!(matches!(error, OAuthError::Refused(_)));
    }

    #[test]
    fn debug_hides_secrets() {
        let mut settings = OAuthSettings::new(
            Url::parse("https://mcp.example/mcp").expect("url"),
            Grant::ClientCredentials,
        );
        settings.client_id = Some("id".into());
        settings.client_secret = Some(Secret::new("s3cr3t-value"));
        settings.private_key = Some(Secret::new("-----BEGIN PRIVATE KEY-----"));
        let client = OAuthClient::new(settings, Arc::new(MemoryStore::new())).expect("valid");
        let shown = format!("{client:?}");
        assert!(
            !shown.contains("s3cr3t-value") && !shown.contains("BEGIN"),
            "{shown}"
        );
        let registered = RegisteredClient {
            client_id: "id".into(),
            client_secret: Some("s3cr3t-value".into()),
        };
        assert!(!format!("{registered:?}").contains("s3cr3t-value"));
    }

    #[test]
    fn settings_are_checked() {
        let url = Url::parse("https://mcp.example/mcp").expect("url");
        let store: Arc<dyn OAuthStore> = Arc::new(MemoryStore::new());
        let code = OAuthSettings::new(url.clone(), Grant::AuthorizationCode);
        assert!(matches!(
            OAuthClient::new(code, store.clone()),
            Err(OAuthError::Settings(_))
        ));
        let cc = OAuthSettings::new(url, Grant::ClientCredentials);
        assert!(matches!(
            OAuthClient::new(cc, store),
            Err(OAuthError::Settings(_))
        ));
    }

    fn token_credentials(access: &str, expires_in: u64, received: u64) -> StoredCredentials {
        let mut response = OAuthTokenResponse::new(
            oauth2::AccessToken::new(access.to_owned()),
            oauth2::basic::BasicTokenType::Bearer,
            VendorExtraTokenFields::default(),
        );
        response.set_expires_in(Some(&Duration::from_secs(expires_in)));
        response.set_refresh_token(Some(oauth2::RefreshToken::new("refresh-1".into())));
        StoredCredentials::new("client".into(), Some(response), Vec::new(), Some(received))
    }

    fn expired(access: &str) -> StoredCredentials {
        token_credentials(access, 60, now_secs() - 3600)
    }

    fn live(access: &str) -> StoredCredentials {
        token_credentials(access, 3600, now_secs())
    }

    /// A client whose server and authorization server cannot be reached
    /// (a discard port): any network request fails at once.
    fn unreachable_client(grant: Grant, store: Arc<MemoryStore>) -> OAuthClient {
        let url = Url::parse("http://127.0.0.1:9/mcp").expect("url");
        let mut settings = OAuthSettings::new(url, grant);
        settings.client_id = Some("client".into());
        settings.client_secret = Some(Secret::new("client-secret"));
        settings.redirect_uri = Some("https://gw.example/callback".into());
        settings.allow_private_addresses = true;
        OAuthClient::new(settings, store).expect("valid settings")
    }

    #[tokio::test]
    async fn memory_refresh_leases_exclude_until_given_back_or_run_out() {
        let store = MemoryStore::new();
        let alice = TokenKey::new("t", "alice", "s");
        let bob = TokenKey::new("t", "bob", "s");
        let ttl = Duration::from_secs(30);
        assert!(store.lock_refresh(&alice, ttl).await.unwrap());
        assert!(!store.lock_refresh(&alice, ttl).await.unwrap());
        assert!(store.lock_refresh(&bob, ttl).await.unwrap());
        store.unlock_refresh(&alice).await.unwrap();
        assert!(
            store
                .lock_refresh(&alice, Duration::from_millis(20))
                .await
                .unwrap()
        );
        assert!(!store.lock_refresh(&alice, ttl).await.unwrap());
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(store.lock_refresh(&alice, ttl).await.unwrap(), "ran out");
        assert!(!store.lock_refresh(&bob, ttl).await.unwrap());
    }

    #[tokio::test]
    async fn concurrent_renewals_ask_once_and_share_the_token() {
        let store = Arc::new(MemoryStore::new());
        let client = unreachable_client(Grant::AuthorizationCode, store.clone());
        let key = TokenKey::new("t", "alice", "s");
        store.with(|i| i.credentials.insert(key.clone(), expired("old")));
        let asked = std::sync::atomic::AtomicU32::new(0);
        let renew = |_current: Option<StoredCredentials>| async {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            store.with(|i| i.credentials.insert(key.clone(), live("new")));
            Ok(Secret::new("new"))
        };
        let (a, b, c) = tokio::join!(
            client.renew_exclusively(&key, Some("old"), renew),
            client.renew_exclusively(&key, Some("old"), renew),
            client.renew_exclusively(&key, Some("old"), renew),
        );
        for token in [a, b, c] {
            assert_eq!(token.expect("a token").expose(), "new");
        }
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(
            store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap(),
            "the lease was given back"
        );
    }

    #[tokio::test]
    async fn a_lease_loser_reads_the_holders_token_through_access_token() {
        for grant in [Grant::AuthorizationCode, Grant::ClientCredentials] {
            let store = Arc::new(MemoryStore::new());
            let client = unreachable_client(grant, store.clone());
            let key = TokenKey::new("t", "alice", "s");
            store.with(|i| i.credentials.insert(key.clone(), expired("old")));
            // Another replica holds the lease and stores its token later.
            assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
            let writer = {
                let store = store.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(350)).await;
                    store.with(|i| i.credentials.insert(key, live("renewed")));
                })
            };
            let token = client.access_token(&key).await.expect("the holder's token");
            assert_eq!(token.expose(), "renewed", "{grant:?}");
            writer.await.unwrap();
            // The loser never held the lease, so it did not give it back.
            assert!(!store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        }
    }

    #[tokio::test]
    async fn a_refused_token_is_renewed_under_the_lease() {
        let store = Arc::new(MemoryStore::new());
        let client = unreachable_client(Grant::ClientCredentials, store.clone());
        let key = TokenKey::new("t", "alice", "s");
        store.with(|i| i.credentials.insert(key.clone(), live("refused")));
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        let writer = {
            let store = store.clone();
            let key = key.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(250)).await;
                store.with(|i| i.credentials.insert(key, live("replacement")));
            })
        };
        let token = client
            .refused(&key, &Secret::new("refused"), None)
            .await
            .expect("the holder's token");
        assert_eq!(token.expose(), "replacement");
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_lease_never_given_back_fails_retryably() {
        let store = Arc::new(MemoryStore::new());
        let mut client = unreachable_client(Grant::AuthorizationCode, store.clone());
        client.refresh_wait = Duration::from_millis(300);
        let key = TokenKey::new("t", "alice", "s");
        store.with(|i| i.credentials.insert(key.clone(), expired("old")));
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        let started = Instant::now();
        let error = client.access_token(&key).await.expect_err("still held");
        assert!(matches!(error, OAuthError::RefreshInProgress), "{error:?}");
        assert!(error.is_retryable());
        assert!(started.elapsed() >= Duration::from_millis(300));
        // The holder's lease is untouched.
        assert!(!store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
    }

    #[tokio::test]
    async fn credentials_cleared_by_the_holder_end_the_wait() {
        let store = Arc::new(MemoryStore::new());
        let client = unreachable_client(Grant::AuthorizationCode, store.clone());
        let key = TokenKey::new("t", "alice", "s");
        store.with(|i| i.credentials.insert(key.clone(), expired("old")));
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        let holder = {
            let store = store.clone();
            let key = key.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(250)).await;
                store.with(|i| i.credentials.remove(&key));
                store.unlock_refresh(&key).await.unwrap();
            })
        };
        let started = Instant::now();
        let found = client.await_renewed(&key, Some("old")).await.unwrap();
        assert!(found.is_none());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        holder.await.unwrap();
    }

    #[tokio::test]
    async fn the_lease_is_given_back_after_a_failed_renewal() {
        let store = Arc::new(MemoryStore::new());
        let key = TokenKey::new("t", "alice", "s");
        // Through the real refresh: discovery fails at the discard port.
        let client = unreachable_client(Grant::AuthorizationCode, store.clone());
        store.with(|i| i.credentials.insert(key.clone(), expired("old")));
        let error = client.access_token(&key).await.expect_err("unreachable");
        assert!(!matches!(error, OAuthError::RefreshInProgress), "{error:?}");
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        store.unlock_refresh(&key).await.unwrap();
        // A renewal that fails.
        let outcome = client
            .renew_exclusively(&key, Some("old"), |_| async {
                Err(OAuthError::Unreachable("down".into()))
            })
            .await;
        assert!(matches!(outcome, Err(OAuthError::Unreachable(_))));
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        store.unlock_refresh(&key).await.unwrap();
        // A renewal abandoned midway (its caller went away).
        let abandoned = tokio::time::timeout(
            Duration::from_millis(100),
            client.renew_exclusively(&key, Some("old"), |_| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(Secret::new("never"))
            }),
        )
        .await;
        assert!(abandoned.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
    }

    #[tokio::test]
    async fn the_lease_winner_uses_a_token_renewed_just_before() {
        let store = Arc::new(MemoryStore::new());
        let client = unreachable_client(Grant::AuthorizationCode, store.clone());
        let key = TokenKey::new("t", "alice", "s");
        // Read as stale, then renewed by someone who has given the lease back.
        store.with(|i| i.credentials.insert(key.clone(), live("renewed")));
        let token = client
            .renew_exclusively(&key, Some("old"), |_| async {
                Err(OAuthError::Refused(
                    "must not ask the token endpoint".into(),
                ))
            })
            .await
            .expect("the stored token");
        assert_eq!(token.expose(), "renewed");
        // The same token as the stale one is not taken for a renewed one.
        let outcome = client
            .renew_exclusively(&key, Some("renewed"), |current| async move {
                assert_eq!(current.as_ref().and_then(access_of), Some("renewed"));
                Ok(Secret::new("fresh"))
            })
            .await
            .expect("renewed");
        assert_eq!(outcome.expose(), "fresh");
    }

    #[tokio::test]
    async fn callbacks_are_parsed_and_unknown_states_refused() {
        let store = MemoryStore::new();
        assert!(matches!(
            pending_flow(&store, "https://gw.example/cb?error=access_denied&state=x").await,
            Err(OAuthError::Declined(_))
        ));
        assert!(matches!(
            pending_flow(&store, "https://gw.example/cb?state=x").await,
            Err(OAuthError::Callback(_))
        ));
        assert!(matches!(
            pending_flow(&store, "https://gw.example/cb?code=c&state=x").await,
            Err(OAuthError::UnknownState)
        ));
    }

    fn workload_settings() -> OAuthSettings {
        let url = Url::parse("https://mcp.example/mcp").expect("url");
        let mut settings = OAuthSettings::new(url, Grant::ClientCredentials);
        settings.client_id = Some("workload".into());
        settings.jwt_bearer_assertion = Some(WorkloadAssertion::Value(Secret::new(
            "eyJhbGciOiJFUzI1NiJ9.e30.sig",
        )));
        settings
    }

    #[test]
    fn jwt_bearer_and_dpop_settings_are_checked() {
        let store: Arc<dyn OAuthStore> = Arc::new(MemoryStore::new());
        // A public workload client: no secret needed.
        assert!(OAuthClient::new(workload_settings(), store.clone()).is_ok());
        let mut code = workload_settings();
        code.grant = Grant::AuthorizationCode;
        code.redirect_uri = Some("https://gw.example/cb".into());
        assert!(matches!(
            OAuthClient::new(code, store.clone()),
            Err(OAuthError::Settings(_))
        ));
        let mut jwt = workload_settings();
        jwt.token_endpoint_auth = Some(TokenEndpointAuth::PrivateKeyJwt);
        jwt.private_key = Some(Secret::new("pem"));
        assert!(matches!(
            OAuthClient::new(jwt, store.clone()),
            Err(OAuthError::Settings(_))
        ));
        let mut bad_key = workload_settings();
        bad_key.dpop = true;
        bad_key.dpop_key = Some(Secret::new("not a key"));
        assert!(matches!(
            OAuthClient::new(bad_key, store.clone()),
            Err(OAuthError::Settings(_))
        ));
        let mut dpop = workload_settings();
        dpop.dpop = true;
        let client = OAuthClient::new(dpop, store).expect("valid settings");
        assert!(client.dpop().is_some());
    }

    fn form(request: &http::Request<Vec<u8>>) -> HashMap<String, String> {
        url::form_urlencoded::parse(request.body())
            .into_owned()
            .collect()
    }

    #[test]
    fn the_jwt_bearer_request_carries_the_assertion_and_the_client() {
        let store: Arc<dyn OAuthStore> = Arc::new(MemoryStore::new());
        let assertion = Secret::new("eyJhbGciOiJFUzI1NiJ9.e30.sig");
        let token = "https://as.example/token";
        let public = OAuthClient::new(workload_settings(), store.clone()).expect("valid");
        let request = public
            .jwt_bearer_request(token, &assertion, &["files.read".into()])
            .expect("a request");
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(request.uri(), token);
        let fields = form(&request);
        assert_eq!(fields["grant_type"], JWT_BEARER_GRANT);
        assert_eq!(fields["assertion"], assertion.expose());
        assert_eq!(fields["scope"], "files.read");
        assert_eq!(fields["resource"], "https://mcp.example/mcp");
        assert_eq!(fields["client_id"], "workload");
        assert!(request.headers().get(http::header::AUTHORIZATION).is_none());

        let mut settings = workload_settings();
        settings.client_secret = Some(Secret::new("s3cr:et"));
        let basic = OAuthClient::new(settings.clone(), store.clone()).expect("valid");
        let request = basic
            .jwt_bearer_request(token, &assertion, &[])
            .expect("a request");
        let fields = form(&request);
        assert!(!fields.contains_key("scope") && !fields.contains_key("client_id"));
        assert_eq!(
            request.headers()[http::header::AUTHORIZATION],
            "Basic d29ya2xvYWQ6czNjciUzQWV0"
        );

        settings.token_endpoint_auth = Some(TokenEndpointAuth::ClientSecretPost);
        let post = OAuthClient::new(settings, store).expect("valid");
        let request = post
            .jwt_bearer_request(token, &assertion, &[])
            .expect("a request");
        let fields = form(&request);
        assert_eq!(fields["client_id"], "workload");
        assert_eq!(fields["client_secret"], "s3cr:et");
    }

    fn dpop_credentials(access: &str, token_type: &str) -> StoredCredentials {
        let response: OAuthTokenResponse = serde_json::from_value(serde_json::json!({
            "access_token": access,
            "token_type": token_type,
            "expires_in": 3600,
        }))
        .expect("a token response");
        StoredCredentials::new(
            "client".into(),
            Some(response),
            Vec::new(),
            Some(now_secs()),
        )
    }

    /// The claims of a JWT, unverified.
    fn jwt_claims(jwt: &str) -> serde_json::Value {
        use base64::Engine as _;
        let payload = jwt.split('.').nth(1).expect("a payload");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .expect("base64url");
        serde_json::from_slice(&bytes).expect("JSON")
    }

    #[tokio::test]
    async fn bound_tokens_go_with_a_proof_and_others_as_bearer() {
        let store = Arc::new(MemoryStore::new());
        let key = TokenKey::tenant_wide("t", "s");
        let mut settings = workload_settings();
        settings.dpop = true;
        let client = OAuthClient::new(settings, store.clone()).expect("valid");
        let url = "https://mcp.example/mcp";

        store
            .save_credentials(&key, dpop_credentials("at-1", "DPoP"))
            .await
            .expect("saved");
        let token = Secret::new("at-1");
        let auth = client
            .resource_auth(&key, &token, "POST", url)
            .await
            .expect("auth");
        assert_eq!(auth.authorization.expose(), "DPoP at-1");
        let proof = auth.dpop.expect("a proof");
        let claims = jwt_claims(&proof);
        assert_eq!(claims["htm"], "POST");
        assert_eq!(claims["htu"], url);
        assert!(claims["ath"].is_string());
        assert!(claims.get("nonce").is_none());
        client.resource_nonce(url, "rs-nonce");
        let again = client
            .resource_auth(&key, &token, "POST", url)
            .await
            .expect("auth");
        assert_eq!(
            jwt_claims(&again.dpop.expect("a proof"))["nonce"],
            "rs-nonce"
        );

        // A token the authorization server did not bind is a bearer token.
        store
            .save_credentials(&key, dpop_credentials("at-2", "Bearer"))
            .await
            .expect("saved");
        let auth = client
            .resource_auth(&key, &Secret::new("at-2"), "POST", url)
            .await
            .expect("auth");
        assert_eq!(auth.authorization.expose(), "Bearer at-2");
        assert!(auth.dpop.is_none());

        // DPoP off: always bearer.
        let plain = OAuthClient::new(workload_settings(), store.clone()).expect("valid");
        let auth = plain
            .resource_auth(&key, &Secret::new("at-2"), "GET", url)
            .await
            .expect("auth");
        assert_eq!(auth.authorization.expose(), "Bearer at-2");
    }

    /// What the test authorization server saw at its token endpoint: the
    /// form and the DPoP proof of each request.
    type Seen = Arc<Mutex<Vec<(HashMap<String, String>, Option<String>)>>>;

    /// An MCP server's protected resource metadata and an authorization
    /// server in one process, whose token endpoint asks for a DPoP nonce
    /// once, then answers `token` (JSON) with status `status`.
    async fn test_authorization_server(status: u16, token: serde_json::Value) -> (Url, Seen) {
        use axum::routing::{get, post};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let base = format!("http://{}", listener.local_addr().expect("an address"));
        let seen: Seen = Arc::default();
        let json = |value: serde_json::Value| {
            (
                [(http::header::CONTENT_TYPE, "application/json")],
                value.to_string(),
            )
        };
        let prm = serde_json::json!({
            "resource": format!("{base}/mcp"),
            "authorization_servers": [base.clone()],
        });
        let metadata = serde_json::json!({
            "issuer": base.clone(),
            "authorization_endpoint": format!("{base}/authorize"),
            "token_endpoint": format!("{base}/token"),
            "response_types_supported": ["code"],
            "grant_types_supported": [JWT_BEARER_GRANT],
            "token_endpoint_auth_methods_supported": ["none"],
            "dpop_signing_alg_values_supported": ["ES256"],
        });
        let recorded = seen.clone();
        let router = axum::Router::new()
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(move || async move { json(prm) }),
            )
            .route(
                "/.well-known/oauth-authorization-server",
                get(move || async move { json(metadata) }),
            )
            .route(
                "/token",
                post(move |headers: http::HeaderMap, body: String| async move {
                    let form = url::form_urlencoded::parse(body.as_bytes())
                        .into_owned()
                        .collect();
                    let proof = headers
                        .get("dpop")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let first = {
                        let mut seen = recorded.lock().expect("lock");
                        seen.push((form, proof));
                        seen.len() == 1
                    };
                    let (status, nonce, body) = if first {
                        let error = serde_json::json!({"error": "use_dpop_nonce"});
                        (400, "as-nonce", error)
                    } else {
                        (status, "as-nonce-2", token)
                    };
                    (
                        http::StatusCode::from_u16(status).expect("a status"),
                        [
                            (http::header::CONTENT_TYPE, "application/json"),
                            (http::HeaderName::from_static("dpop-nonce"), nonce),
                        ],
                        body.to_string(),
                    )
                }),
            );
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        (Url::parse(&format!("{base}/mcp")).expect("url"), seen)
    }

    #[tokio::test]
    async fn a_workload_assertion_buys_a_dpop_bound_token() {
        let (url, seen) = test_authorization_server(
            200,
            serde_json::json!({
                "access_token": "at-wif",
                "token_type": "DPoP",
                "expires_in": 3600,
            }),
        )
        .await;
        let store = Arc::new(MemoryStore::new());
        let mut settings = workload_settings();
        settings.server_url = url.clone();
        settings.allow_private_addresses = true;
        settings.dpop = true;
        let client = OAuthClient::new(settings, store.clone()).expect("valid");
        let key = TokenKey::tenant_wide("t", "s");
        let token = client.access_token(&key).await.expect("a token");
        assert_eq!(token.expose(), "at-wif");

        let seen = seen.lock().expect("lock").clone();
        assert_eq!(seen.len(), 2, "one retry for the nonce");
        let token_endpoint = url.join("/token").expect("url").to_string();
        for (i, (fields, proof)) in seen.iter().enumerate() {
            assert_eq!(fields["grant_type"], JWT_BEARER_GRANT);
            assert_eq!(fields["assertion"], "eyJhbGciOiJFUzI1NiJ9.e30.sig");
            assert_eq!(fields["client_id"], "workload");
            assert_eq!(fields["resource"], url.as_str());
            let claims = jwt_claims(proof.as_deref().expect("a proof"));
            assert_eq!(claims["htm"], "POST");
            assert_eq!(claims["htu"], token_endpoint.as_str());
            assert!(claims.get("ath").is_none());
            if i == 0 {
                assert!(claims.get("nonce").is_none());
            } else {
                assert_eq!(claims["nonce"], "as-nonce");
            }
        }
        // Kept for the next token request, and the token goes as DPoP.
        let dpop = client.dpop().expect("DPoP on");
        assert_eq!(dpop.nonce(&token_endpoint).as_deref(), Some("as-nonce-2"));
        let auth = client
            .resource_auth(&key, &token, "POST", url.as_str())
            .await
            .expect("auth");
        assert_eq!(auth.authorization.expose(), "DPoP at-wif");
        // Still fresh: no further request.
        assert_eq!(
            client.access_token(&key).await.expect("a token").expose(),
            "at-wif"
        );
    }

    #[tokio::test]
    async fn a_refused_assertion_is_final_and_scrubbed() {
        let (url, seen) = test_authorization_server(
            400,
            serde_json::json!({
                "error": "invalid_grant",
                "error_description": "assertion eyJhbGciOiJFUzI1NiJ9.e30.sig expired",
            }),
        )
        .await;
        let mut settings = workload_settings();
        settings.server_url = url;
        settings.allow_private_addresses = true;
        settings.dpop = true;
        let client =
            OAuthClient::new(settings, Arc::new(MemoryStore::new())).expect("valid settings");
        let key = TokenKey::tenant_wide("t", "s");
        let error = client.access_token(&key).await.expect_err("refused");
        let OAuthError::Refused(text) = &error else {
            panic!("not a refusal: {error:?}");
        };
        assert!(text.contains("invalid_grant"), "{text}");
        assert!(!text.contains("e30.sig"), "{text}");
        assert_eq!(seen.lock().expect("lock").len(), 2);
    }

    #[tokio::test]
    async fn the_address_rule_holds_for_dpop_clients() {
        let (url, _seen) = test_authorization_server(200, serde_json::json!({})).await;
        let mut settings = workload_settings();
        settings.server_url = url;
        settings.dpop = true;
        let client =
            OAuthClient::new(settings, Arc::new(MemoryStore::new())).expect("valid settings");
        let key = TokenKey::tenant_wide("t", "s");
        let error = client.access_token(&key).await.expect_err("refused");
        assert!(
            error.to_string().contains("private or reserved address"),
            "{error}"
        );
    }
}
