//! Bearer tokens for HTTP servers whose credentials are not static headers
//! (OAuth 2.1). A [`TokenSource`] (the credentials layer's, per tenant ×
//! subject × server) hands out the access token; the session keeps the
//! current one where its transport reads it for every request, asks for a
//! fresh one before each call, and, when the server refuses it (401, or 403
//! `insufficient_scope`), asks for a better one once and resends: a refused
//! request did not run.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use super::UpstreamError;
use crate::config::Secret;
use crate::credentials::{TokenError, TokenSource};

impl From<TokenError> for UpstreamError {
    fn from(error: TokenError) -> Self {
        match error {
            TokenError::AuthorizationRequired { url } => {
                UpstreamError::AuthorizationRequired { url }
            }
            TokenError::StoreUnavailable(reason) => UpstreamError::StateUnavailable(reason),
            TokenError::Failed(reason) => UpstreamError::TokenFailed(reason),
            TokenError::Refused(reason) => UpstreamError::OAuthFailed(reason),
        }
    }
}

/// A session's token source and the token its transport sends now.
#[derive(Debug, Clone)]
pub struct Bearer {
    source: Arc<dyn TokenSource>,
    current: Arc<ArcSwapOption<Secret>>,
}

impl Bearer {
    /// Tokens from `source`.
    pub fn new(source: Arc<dyn TokenSource>) -> Self {
        Self {
            source,
            current: Arc::default(),
        }
    }

    /// Gets the token to send and makes it the transport's.
    ///
    /// # Errors
    /// No token can be had ([`TokenError`]).
    pub(super) async fn refresh(&self) -> Result<(), TokenError> {
        let token = self.source.token().await?;
        self.current.store(Some(Arc::new(token)));
        Ok(())
    }

    /// The server refused the current token: gets a better one.
    ///
    /// # Errors
    /// No better token can be had.
    pub(super) async fn refused(&self, challenge: Option<&str>) -> Result<(), TokenError> {
        let current = self.current.load_full();
        let empty = Secret::new("");
        let refused = current.as_deref().unwrap_or(&empty);
        let token = self.source.refused(refused, challenge).await?;
        self.current.store(Some(Arc::new(token)));
        Ok(())
    }

    /// The token for the next request (what the transport sends).
    pub(super) fn header(&self) -> Option<String> {
        self.current
            .load()
            .as_deref()
            .map(|token| token.expose().to_owned())
    }
}
