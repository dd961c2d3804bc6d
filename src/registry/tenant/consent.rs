//! A tenant's end users and OAuth: whether a subject has authorized a
//! per-user server (and where it consents), delegated servers' admission,
//! the subjects' JWTs kept for them, consents arriving, the OAuth clients
//! and their events.

use std::sync::Arc;

use super::Tenant;

/// Whether a subject has authorized a per-user server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsentState {
    /// The subject holds a token (or the server is not per-user).
    Authorized,
    /// The subject consents at this URL.
    Required(String),
    /// It cannot be told now (the state store is down, or discovery
    /// failed), for this reason.
    Unavailable(String),
    /// A delegated server (`token_exchange`, `identity_assertion`) this
    /// caller cannot use, for this reason (it presented no JWT, or one of
    /// another issuer): there is nothing to consent to.
    Delegation(String),
}

impl Tenant {
    /// Whether `subject` (possibly the tenant itself) has authorized
    /// per-user server `index`, for its `ListTools` view. An authorization
    /// URL is made (a pending flow stored) at most once per subject and
    /// server within [`CONSENT_URL_REUSE`](crate::registry::CONSENT_URL_REUSE).
    pub async fn consent_state(
        &self,
        index: usize,
        subject: &crate::callers::Subject,
    ) -> ConsentState {
        let subject = subject.key();
        let Some(slot) = self.slots.get(index) else {
            return ConsentState::Unavailable("no such server".to_owned());
        };
        let client = match &slot.oauth {
            Ok(Some(client)) => client.clone(),
            Ok(None) => return ConsentState::Authorized,
            Err(reason) => return ConsentState::Unavailable(reason.clone()),
        };
        let key = crate::state::TokenKey::new(&self.name, subject, &slot.config.name);
        if client.is_delegated() {
            // No consent: a JWT caller's token is exchanged on its call.
            return match delegation_admits(&client, &key, &slot.config.name) {
                Ok(()) => ConsentState::Authorized,
                Err(crate::upstream::UpstreamError::Delegation(error)) => {
                    ConsentState::Delegation(error.reason)
                }
                Err(error) => ConsentState::Unavailable(error.to_string()),
            };
        }
        match client.store().load_credentials(&key).await {
            Ok(Some(_)) => return ConsentState::Authorized,
            Ok(None) => {}
            Err(e) => return ConsentState::Unavailable(e.to_string()),
        }
        if let Some(url) = slot.consent_url(subject) {
            return ConsentState::Required(url);
        }
        match client.authorization_url(&key, None).await {
            Ok(url) => {
                slot.remember_consent_url(subject, &url);
                ConsentState::Required(url)
            }
            Err(e) => ConsentState::Unavailable(e.to_string()),
        }
    }

    /// Keeps the verified JWT a caller of this tenant presented as its
    /// subject's latest, when the tenant has a delegated server
    /// (`token_exchange`, `identity_assertion`): what that server's
    /// sessions exchange. The authentication layer calls it for every
    /// JWT caller.
    pub fn remember_subject_token(
        &self,
        subject: &crate::callers::Subject,
        token: &crate::callers::SubjectToken,
    ) {
        let delegated = self
            .slots
            .iter()
            .any(|s| s.config.oauth.as_ref().is_some_and(|o| o.delegated()));
        if let (true, Some(context)) = (delegated, self.oauth_context()) {
            context
                .subject_tokens
                .remember(&self.name, subject.key(), token);
        }
    }

    /// Remembers the authorization URL a call of `subject` on per-user
    /// server `index` was given (its grant ended while its session was
    /// open), so the next calls get the same URL.
    pub fn remember_consent_url(&self, index: usize, subject: &crate::callers::Subject, url: &str) {
        if let Some(slot) = self.slots.get(index) {
            slot.remember_consent_url(subject.key(), url);
        }
    }

    /// The OAuth client of the server named `server`, if it has one.
    pub fn oauth_client(
        &self,
        server: &str,
    ) -> Option<Arc<crate::credentials::oauth::OAuthClient>> {
        self.slots
            .iter()
            .find(|s| s.config.name == server)
            .and_then(|s| s.oauth.clone().ok().flatten())
    }

    /// The state store and consent listener of the gateway's OAuth servers,
    /// if the store is open.
    pub fn oauth_context(&self) -> Option<&crate::registry::OAuthContext> {
        self.spawner.oauth()
    }

    /// Counts an OAuth event of this gateway's `tenant` and `server`
    /// (`toolgate_oauth_events_total`).
    pub fn oauth_event(&self, tenant: &str, server: &str, event: &str) {
        self.spawner.metrics.oauth_event(tenant, server, event);
    }

    /// A consent of the subject keyed `subject` ([`Subject::key`]
    /// (crate::callers::Subject::key), as its pending flow stored it) for
    /// the server named `server` arrived: its tools can be listed now, and
    /// the subject's URL is spent.
    pub fn consented(&self, server: &str, subject: &str) {
        if let Some(slot) = self.slots.iter().find(|s| s.config.name == server) {
            slot.forget_consent_url(subject);
            slot.wake.notify_one();
        }
    }
}

/// Whether the subject of `key` may call delegated server `server`: it has
/// an unexpired JWT at hand (only a `callers.jwt` caller does) of an issuer
/// the grant takes.
///
/// # Errors
/// `DELEGATION_REQUIRES_JWT` or `DELEGATION_ISSUER_MISMATCH`, naming the
/// server and why; nothing was exchanged or sent.
pub(super) fn delegation_admits(
    client: &crate::credentials::oauth::OAuthClient,
    key: &crate::state::TokenKey,
    server: &str,
) -> Result<(), crate::upstream::UpstreamError> {
    use crate::credentials::oauth::{DelegationError, DelegationFailure};
    let refused = |kind, reason: String| {
        crate::upstream::UpstreamError::Delegation(DelegationError {
            kind,
            reason,
            code: None,
        })
    };
    let grant = client.settings().grant;
    let Some(token) = client.subject_token(key) else {
        return Err(refused(
            DelegationFailure::RequiresJwt,
            format!(
                "server `{server}` exchanges the caller's JWT for its token (grant: {grant}); \
                 this caller presented no JWT (a static-token or certificate caller): call \
                 with a callers.jwt token"
            ),
        ));
    };
    client.accepts_subject_token(&token).map_err(|e| {
        refused(
            e.kind,
            format!(
                "server `{server}` cannot take this caller's JWT: {}",
                e.reason
            ),
        )
    })?;
    // Redacted from the server's text, should it ever echo it (it is only
    // ever sent to the token endpoint).
    client.live_tokens().hold(key, [token.token().expose()]);
    Ok(())
}
