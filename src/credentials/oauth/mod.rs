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
//! - the address rule (`crate::config::address`, checked ahead in `address`): every OAuth request (discovery, token,
//!   registration, the IdP's) goes through `OAuthHttp`, whose resolver
//!   refuses private and loopback addresses unless `allow_private_addresses`
//!   and reserved ones (link-local, cloud metadata, ...) always, on every
//!   resolved address of every connection;
//! - typed errors ([`OAuthError`]) that never carry a token, code, verifier
//!   or client secret;
//! - the tokens held ([`LiveTokens`]): every access and refresh token the
//!   client loads or obtains, bounded per subject and per server, so that
//!   upstream text is redacted of them;
//! - what rmcp 3.11 lacks, kept to the missing piece: DPoP (RFC 9449, in
//!   [`super::dpop`]: a proof key, proofs on token and resource requests,
//!   nonces) through rmcp's `OAuthHttpClient` seam, and the RFC 7523
//!   JWT-bearer grant for a workload's own assertion
//!   ([`OAuthSettings::jwt_bearer_assertion`]).
//!
//! The rooms: `settings` (what the configuration says, and its checks);
//! `store` (the state kept: [`OAuthStore`], [`MemoryStore`], rmcp's
//! adapters); `discovery` (protected resource and authorization server
//! metadata); `identity` (pre-registered, metadata document, registration,
//! the client-credentials configuration); the grants (`authorization_code`
//! with PKCE and the callback, `client_credentials`, `jwt_bearer`,
//! `enterprise`); the token's life (`freshness`, `lease`: one renewal per
//! key, `renewal`: refresh, consent, step-up); `address` (which endpoints
//! may be called); `dpop_binding` (the DPoP glue); `live` (the tokens
//! held, for redaction); `error`. This file keeps
//! [`OAuthClient`] itself and its token entry point.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::config::{Grant, Secret};
use crate::credentials::dpop::{Dpop, OAuthHttp};
use crate::state::TokenKey;

mod address;
mod authorization_code;
mod bound;
mod client_credentials;
mod confirmation;
mod delegation;
mod discovery;
mod dpop_binding;
mod enterprise;
mod error;
mod freshness;
mod identity;
mod jwt_bearer;
mod lease;
mod live;
mod renewal;
mod settings;
mod store;
mod subject_tokens;
#[cfg(test)]
mod testing;

pub use authorization_code::{Completed, pending_flow};
pub use confirmation::{
    CONFIRM_TTL, ConfirmError, ConsentCode, HeldGrant, NotYours, confirm, hold,
};
pub use delegation::{ACCESS_TOKEN_TYPE, DelegationError, DelegationFailure, TOKEN_EXCHANGE_GRANT};
pub use discovery::Description;
pub use enterprise::EnterpriseIdp;
pub use error::{OAuthError, StoreError};
use error::{from_auth, root_cause, scrubbed};
use freshness::{access_of, fresh_token};
pub use identity::parse_algorithm;
pub use jwt_bearer::JWT_BEARER_GRANT;
pub(crate) use lease::LocalLeases;
pub use lease::REFRESH_LEASE_TTL;
use lease::REFRESH_WAIT;
pub use live::{LIVE_SUBJECTS, LIVE_TOKENS_PER_SUBJECT, LiveTokens};
use renewal::StepUps;
pub use renewal::{DEFAULT_MAX_STEP_UPS, STEP_UP_WINDOW};
pub use settings::{DEFAULT_CLIENT_NAME, OAuthSettings, WorkloadAssertion};
pub use store::{MemoryStore, OAuthStore, PENDING_TTL, PendingFlow, RegisteredClient};
pub use subject_tokens::{MAX_SUBJECT_TOKENS, SubjectTokens};

/// One configured server's OAuth client. Cheap to share (`Arc`); every
/// operation names the [`TokenKey`] it acts for, and one key's credentials
/// never serve another.
#[derive(Debug)]
pub struct OAuthClient {
    settings: OAuthSettings,
    /// The store, seen through [`live::Holding`]: every token read or
    /// written is held in `live`.
    store: Arc<dyn OAuthStore>,
    /// The tokens held, every subject's, for redaction.
    live: Arc<LiveTokens>,
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
    /// The callers' latest JWTs, for the delegation grants.
    subject_tokens: Option<Arc<SubjectTokens>>,
    /// The server (and issuer) the stored tokens are bound to.
    binding: Arc<bound::Binding>,
}

/// Where an [`OAuthClient`] reports its events (`token_refreshed`,
/// `token_issued`, `consent_started`, `consent_completed`), for metrics.
#[derive(Clone)]
pub struct EventSink(Arc<EventFn>);

/// What an [`EventSink`] calls.
type EventFn = dyn Fn(&TokenKey, &'static str, Option<&str>) + Send + Sync;

impl EventSink {
    /// A sink calling `f` with the key, the event's name and, for a
    /// failure, why (the authorization server's OAuth error code when it
    /// gave one).
    pub fn new(f: impl Fn(&TokenKey, &'static str, Option<&str>) + Send + Sync + 'static) -> Self {
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
        let dpop = dpop_binding::dpop_of(&settings)?;
        let live = Arc::new(LiveTokens::new());
        let binding = Arc::new(bound::Binding::new(settings.server_url.as_str()));
        Ok(Self {
            store: Arc::new(live::Holding::new(store, live.clone()).bound(binding.clone())),
            binding,
            settings,
            live,
            step_ups: Mutex::default(),
            refresh_wait: REFRESH_WAIT,
            events: None,
            dpop,
            http: OnceLock::new(),
            subject_tokens: None,
        })
    }

    /// Reports events to `sink`.
    #[must_use]
    pub fn with_events(mut self, sink: EventSink) -> Self {
        self.events = Some(sink);
        self
    }

    /// Reports `event` of `key` to the sink, if any.
    pub(crate) fn event(&self, key: &TokenKey, event: &'static str) {
        self.event_because(key, event, None);
    }

    /// Reports `event` of `key` with why it happened (a failure's reason).
    pub(crate) fn event_because(&self, key: &TokenKey, event: &'static str, reason: Option<&str>) {
        if let Some(sink) = &self.events {
            (sink.0)(key, event, reason);
        }
    }

    /// The settings.
    pub fn settings(&self) -> &OAuthSettings {
        &self.settings
    }

    /// The store (every token read or written through it is held in
    /// [`OAuthClient::live_tokens`]).
    pub fn store(&self) -> &Arc<dyn OAuthStore> {
        &self.store
    }

    /// The access and refresh tokens this client holds, every subject's:
    /// what is redacted from its server's text.
    pub fn live_tokens(&self) -> &Arc<LiveTokens> {
        &self.live
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
            // The subject's latest JWT exchanged, one renewal at a time.
            Grant::TokenExchange | Grant::IdentityAssertion => {
                let stale = stored.as_ref().and_then(access_of);
                self.renew_exclusively(key, stale, |_| self.delegated(key, &[]))
                    .await
            }
        }
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

#[cfg(test)]
mod tests {
    use url::Url;

    use super::*;

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
}
