//! The authorization-code grant with PKCE: the consent URL, the pending
//! flow kept in the store, and the callback that completes it (at any
//! replica).

use rmcp::transport::auth::{
    AuthError, AuthorizationCallback, AuthorizationManager, AuthorizationMetadata,
};
use url::Url;

use super::confirmation::{Captured, ConsentCode, HeldGrant};
use super::store::{FlowTaken, StateAdapter};
use super::{OAuthClient, OAuthError, OAuthStore, PendingFlow, from_auth};
use crate::config::Grant;
use crate::state::TokenKey;

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

/// What a completed callback did with the grant.
#[derive(Debug)]
pub enum Completed {
    /// Stored for the flow's key: usable now.
    Stored(TokenKey),
    /// Held under a one-time code until the tenant's application confirms
    /// it for the flow's subject.
    Held(TokenKey, ConsentCode),
}

impl Completed {
    /// Whose grant it is (the flow's key).
    pub fn key(&self) -> &TokenKey {
        match self {
            Completed::Stored(key) | Completed::Held(key, _) => key,
        }
    }
}

impl OAuthClient {
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
        let scopes = self.consent_scopes(&manager, &metadata);
        self.start_flow(manager, &metadata, key, challenge, &scopes)
            .await
    }

    /// Completes a flow with the authorization server's redirect to the
    /// gateway (`code`, `state`, `iss`): the `iss` check (RFC 9207) and the
    /// code exchange are rmcp's. The callback must have arrived at this
    /// client's own redirect URI (each tenant × server has its own), else
    /// the flow is dropped unexchanged ([`OAuthError::RedirectMismatch`]).
    /// After the `iss` check the pending flow is taken from the store (one
    /// step: of two callbacks with one `state`, the one that does not get
    /// it is [`OAuthError::UnknownState`] and exchanges nothing).
    ///
    /// The credentials belong to the key the pending flow names (never one
    /// the callback could choose). With `hold`, they are held under a
    /// one-time code until the tenant's application confirms them for that
    /// subject ([`Completed::Held`], see [`super::confirm`]); without it
    /// they are stored as a new grant whatever that row holds now
    /// ([`Completed::Stored`]). `Ok` only once they are kept.
    ///
    /// # Errors
    /// The callback is malformed, declined, unknown (or its flow taken by
    /// another callback) or at another server's redirect URI, the issuer
    /// check failed, the exchange failed, or the store failed.
    pub async fn complete(&self, callback_url: &str, hold: bool) -> Result<Completed, OAuthError> {
        let callback = parse_callback(callback_url)?;
        let flow = pending_flow(self.store.as_ref(), callback_url).await?;
        if !self.is_own_redirect(callback_url) {
            // Dropped: a code of another authorization server may be on its
            // way to this flow's token endpoint.
            self.store.take_pending(&callback.csrf_token).await?;
            return Err(OAuthError::RedirectMismatch);
        }
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
        let taken = self.keep_flows(
            &mut manager,
            &key,
            flow.challenge.as_deref(),
            &flow.client_id,
        );
        let captured = Captured::default();
        if hold {
            manager.set_credential_store(captured.clone());
        } else {
            // A consent is a new grant: kept whatever the row holds now.
            self.keep_grants(&mut manager, &key);
        }
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
                // Another callback with this `state` took the flow first.
                _ if taken.by_another() => OAuthError::UnknownState,
                e @ (AuthError::AuthorizationServerMismatch { .. }
                | AuthError::AuthorizationServerMissingIssuer { .. }) => {
                    OAuthError::Issuer(e.to_string())
                }
                AuthError::AuthorizationFailed(reason) => OAuthError::Issuer(reason),
                e => from_auth(e, &secrets),
            })?;
        if !hold {
            tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth authorization completed");
            self.event(&key, "consent_completed");
            return Ok(Completed::Stored(key));
        }
        let credentials = captured.take().ok_or_else(|| {
            OAuthError::Refused("the authorization server issued no token".into())
        })?;
        let grant = HeldGrant {
            tenant: key.tenant.clone(),
            subject: key.subject.clone(),
            server: key.server.clone(),
            credentials,
        };
        let code = super::hold(self.store.as_ref(), grant).await?;
        tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth authorization held for the application's confirmation");
        self.event(&key, "consent_held");
        Ok(Completed::Held(key, code))
    }

    /// Whether `callback_url` is at this client's redirect URI (its query
    /// aside).
    fn is_own_redirect(&self, callback_url: &str) -> bool {
        let Some(own) = &self.settings.redirect_uri else {
            return false;
        };
        let at = callback_url.split(['?', '#']).next().unwrap_or("");
        at == own.as_str()
    }

    /// Configures the client identity and asks rmcp for the authorization
    /// URL (the pending flow goes to the store through [`StateAdapter`]).
    pub(super) async fn start_flow(
        &self,
        mut manager: AuthorizationManager,
        metadata: &AuthorizationMetadata,
        key: &TokenKey,
        challenge: Option<&str>,
        scopes: &[String],
    ) -> Result<String, OAuthError> {
        let config = self.identity(key, &mut manager, metadata, scopes).await?;
        self.keep_flows(&mut manager, key, challenge, &config.client_id);
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

    /// A new consent for `scopes` is needed: the error that says so with
    /// the URL of a flow just started ([`OAuthClient::start_flow`]), or why
    /// none could be started.
    pub(super) async fn consent_required(
        &self,
        manager: AuthorizationManager,
        metadata: &AuthorizationMetadata,
        key: &TokenKey,
        challenge: Option<&str>,
        scopes: &[String],
    ) -> OAuthError {
        match self
            .start_flow(manager, metadata, key, challenge, scopes)
            .await
        {
            Ok(url) => OAuthError::AuthorizationRequired { url },
            Err(e) => e,
        }
    }

    /// The scopes a consent asks for: the configured ones (with
    /// `offline_access` where listed), else rmcp's selection.
    pub(super) fn consent_scopes(
        &self,
        manager: &AuthorizationManager,
        metadata: &AuthorizationMetadata,
    ) -> Vec<String> {
        if self.settings.scopes.is_empty() {
            manager.select_scopes(None, &[])
        } else {
            with_offline_access(self.settings.scopes.clone(), metadata)
        }
    }

    /// Keeps the flows `manager` starts for `key` (from `challenge`, with
    /// `client_id`) in the store, through [`StateAdapter`]; returns what its
    /// take of a flow finds.
    fn keep_flows(
        &self,
        manager: &mut AuthorizationManager,
        key: &TokenKey,
        challenge: Option<&str>,
        client_id: &str,
    ) -> FlowTaken {
        let adapter = StateAdapter::new(self.store.clone(), key.clone(), challenge, client_id);
        let taken = adapter.taken();
        manager.set_state_store(adapter);
        taken
    }
}

/// `scopes` plus `offline_access` when the authorization server lists it
/// (SEP-2207: so that it issues a refresh token).
pub(super) fn with_offline_access(
    mut scopes: Vec<String>,
    metadata: &AuthorizationMetadata,
) -> Vec<String> {
    let listed = metadata
        .scopes_supported
        .as_ref()
        .is_some_and(|s| s.iter().any(|s| s == "offline_access"));
    if listed && !scopes.is_empty() && !scopes.iter().any(|s| s == "offline_access") {
        scopes.push("offline_access".to_owned());
    }
    scopes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::oauth::MemoryStore;

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
}
