//! How a token is renewed: a refresh of an authorization-code grant, a
//! new consent when that cannot work, and the reaction to a refused token
//! (the token someone else renewed, or a bounded step-up on
//! `insufficient_scope`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use oauth2::TokenResponse as _;
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, OAuthClientConfig, StoredCredentials, WWWAuthenticateParams,
};

use super::authorization_code::with_offline_access;
use super::freshness::{access_of, fresh_token};
use super::{OAuthClient, OAuthError, from_auth};
use crate::config::{Grant, Secret};
use crate::state::TokenKey;

/// Step-ups (`insufficient_scope`) tried for one key within
/// [`STEP_UP_WINDOW`] before the refusal is final.
pub const DEFAULT_MAX_STEP_UPS: u32 = 2;

/// How long step-ups of one key are counted together.
pub const STEP_UP_WINDOW: Duration = Duration::from_secs(300);

/// Most keys whose step-ups are counted at once (older windows are dropped).
const MAX_STEP_UP_KEYS: usize = 4096;

/// Step-ups counted per key.
#[derive(Debug, Default)]
pub(super) struct StepUps {
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

impl OAuthClient {
    /// An authorization-code subject's renewal: a refresh when a grant is
    /// stored, else a consent (the URL to give the end user).
    pub(super) async fn renew_grant(
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
            return self.step_up(key, required, challenge).await;
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
            // The server refused the exchanged token: dropped, and one new
            // exchange (the session asks once per refusal).
            Grant::TokenExchange | Grant::IdentityAssertion => {
                self.renew_exclusively(key, Some(refused.expose()), |_| async move {
                    self.store.clear_credentials(key).await?;
                    self.delegated(key, &[]).await
                })
                .await
            }
        }
    }

    /// A step-up of `key` (counted against `max_step_ups`) to the granted
    /// scopes plus the space-separated `required` ones the challenge asked
    /// for: a new token for client credentials, a new consent for
    /// authorization code.
    async fn step_up(
        &self,
        key: &TokenKey,
        required: String,
        challenge: Option<&str>,
    ) -> Result<Secret, OAuthError> {
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
        match self.settings.grant {
            Grant::ClientCredentials => self.client_credentials(key, challenge, &wanted).await,
            Grant::AuthorizationCode => {
                let (manager, metadata) = self.manager(key, challenge).await?;
                let scopes = with_offline_access(wanted, &metadata);
                Err(self
                    .consent_required(manager, &metadata, key, challenge, &scopes)
                    .await)
            }
            // One exchange asking for the added scopes.
            Grant::TokenExchange | Grant::IdentityAssertion => self.delegated(key, &wanted).await,
        }
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
        if let Some(config) = identity
            && let Some(token) = self.refresh_as(key, &mut manager, config, stale).await?
        {
            return Ok(token);
        }
        if !same_issuer {
            tracing::warn!(tenant = %key.tenant, server = %key.server, "the authorization server changed; stored credentials dropped");
        }
        self.store.clear_credentials(key).await?;
        let scopes = self.consent_scopes(&manager, &metadata);
        Err(self
            .consent_required(manager, &metadata, key, challenge, &scopes)
            .await)
    }

    /// Asks `manager` to refresh `stale` as the client `config`: the new
    /// token; `None` when the refresh token was rejected and no other
    /// replica has stored a fresh token meanwhile.
    async fn refresh_as(
        &self,
        key: &TokenKey,
        manager: &mut AuthorizationManager,
        config: OAuthClientConfig,
        stale: &StoredCredentials,
    ) -> Result<Option<Secret>, OAuthError> {
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
                Ok(Some(Secret::new(response.access_token().secret())))
            }
            Err(AuthError::TokenRefreshRejected(_) | AuthError::AuthorizationRequired) => {
                // Another replica may have rotated the refresh token first.
                Ok(self
                    .store
                    .load_credentials(key)
                    .await?
                    .filter(|now| access_of(now) != access_of(stale))
                    .as_ref()
                    .and_then(fresh_token))
            }
            Err(e) => {
                let secrets = [refresh.as_str(), secret.as_deref().unwrap_or("")];
                Err(from_auth(e, &secrets))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
