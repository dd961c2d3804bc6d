//! Access tokens for one session: the [`TokenSource`] of the upstream layer
//! over toolgate's OAuth client, for one (tenant, subject, server) key. A
//! session asks it for a token before every request and once more when the
//! server refuses one.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::oauth::{OAuthClient, OAuthError};
use super::{SharedRedactor, TokenError, TokenSource};
use crate::config::Secret;
use crate::state::TokenKey;

/// The tokens of one key from one server's OAuth client.
#[derive(Debug, Clone)]
pub struct OAuthTokens {
    client: Arc<OAuthClient>,
    key: TokenKey,
}

impl OAuthTokens {
    /// The tokens of `key` from `client`.
    pub fn new(client: Arc<OAuthClient>, key: TokenKey) -> Self {
        Self { client, key }
    }
}

impl OAuthTokens {
    /// Counts and maps a failure.
    fn failed(&self, error: OAuthError) -> TokenError {
        let error = token_error(&self.key, error);
        self.client.event(
            &self.key,
            match &error {
                TokenError::AuthorizationRequired { .. } => "authorization_required",
                TokenError::StoreUnavailable(_) => "store_unavailable",
                TokenError::Failed(_) => "token_failed",
                TokenError::Refused(_) => "oauth_refused",
                TokenError::Delegation(_) => "delegation_failed",
            },
        );
        error
    }
}

impl TokenSource for OAuthTokens {
    fn token(&self) -> BoxFuture<'_, Result<Secret, TokenError>> {
        Box::pin(async move {
            self.client
                .access_token(&self.key)
                .await
                .map_err(|e| self.failed(e))
        })
    }

    fn refused<'a>(
        &'a self,
        refused: &'a Secret,
        challenge: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Secret, TokenError>> {
        Box::pin(async move {
            self.client
                .refused(&self.key, refused, challenge)
                .await
                .map_err(|e| self.failed(e))
        })
    }

    fn live_tokens(&self) -> Option<SharedRedactor> {
        Some(self.client.live_tokens().redactor())
    }
}

/// The upstream layer's view of an OAuth failure (texts carry no secret:
/// [`OAuthError`] never does). Failures are logged here, once, with the
/// tenant and server they concern (never the subject).
pub(crate) fn token_error(key: &TokenKey, error: OAuthError) -> TokenError {
    match error {
        OAuthError::AuthorizationRequired { url } => TokenError::AuthorizationRequired { url },
        OAuthError::Delegation(e) => TokenError::Delegation(e),
        OAuthError::Store(e) => {
            tracing::warn!(tenant = %key.tenant, server = %key.server, error = %e, "OAuth state store unavailable");
            TokenError::StoreUnavailable(e.0)
        }
        other if other.is_retryable() => {
            tracing::warn!(tenant = %key.tenant, server = %key.server, error = %other, "OAuth token unavailable");
            TokenError::Failed(other.to_string())
        }
        other => {
            tracing::warn!(tenant = %key.tenant, server = %key.server, error = %other, "OAuth cannot give a token");
            TokenError::Refused(other.to_string())
        }
    }
}
