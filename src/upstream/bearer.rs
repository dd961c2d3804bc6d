//! Bearer tokens for HTTP servers whose credentials are not static headers
//! (OAuth 2.1). A [`TokenSource`] (the credentials layer's, per tenant ×
//! subject × server) hands out the access token; the session keeps the
//! current one where its transport reads it for every request, asks for a
//! fresh one before each call, and, when the server refuses it (401, or 403
//! `insufficient_scope`), asks for a better one once and resends: a refused
//! request did not run. What the server sends back is redacted of the
//! session's token ([`Bearer::redaction`]), and of every other token the
//! source's client holds.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use super::UpstreamError;
use crate::config::Secret;
use crate::credentials::{Redaction, Redactor, SharedRedactor, TokenError, TokenSource};

impl From<TokenError> for UpstreamError {
    fn from(error: TokenError) -> Self {
        match error {
            TokenError::AuthorizationRequired { url } => {
                UpstreamError::AuthorizationRequired { url }
            }
            TokenError::StoreUnavailable(reason) => UpstreamError::StateUnavailable(reason),
            TokenError::Failed(reason) => UpstreamError::TokenFailed(reason),
            TokenError::Refused(reason) => UpstreamError::OAuthFailed(reason),
            TokenError::Delegation(error) => UpstreamError::Delegation(error),
        }
    }
}

/// A session's token source and the token its transport sends now.
#[derive(Debug, Clone)]
pub struct Bearer {
    source: Arc<dyn TokenSource>,
    current: Arc<ArcSwapOption<Secret>>,
    /// The redactor of the current token and the one before it: taken out
    /// of the session's text even when the source no longer holds them.
    own: SharedRedactor,
}

impl Bearer {
    /// Tokens from `source`.
    pub fn new(source: Arc<dyn TokenSource>) -> Self {
        Self {
            source,
            current: Arc::default(),
            own: Redactor::default().shared(),
        }
    }

    /// What to take out of the session's text: what `configured` redacts,
    /// every token the source's client holds, and the session's own.
    pub(super) fn redaction(&self, configured: &SharedRedactor) -> Redaction {
        let mut redaction = Redaction::new(configured.clone());
        if let Some(live) = self.source.live_tokens() {
            redaction = redaction.with(live);
        }
        redaction.with(self.own.clone())
    }

    /// Makes `token` the one sent; its redactor first, so a text answered
    /// to the new token is redacted of it.
    fn set(&self, token: Secret) {
        let previous = self.current.load_full();
        if previous
            .as_deref()
            .is_some_and(|previous| previous.expose() == token.expose())
        {
            return;
        }
        let values = [
            Some(token.expose()),
            previous.as_deref().map(Secret::expose),
        ];
        self.own
            .store(Arc::new(Redactor::new(values.into_iter().flatten())));
        self.current.store(Some(Arc::new(token)));
    }

    /// Gets the token to send and makes it the transport's.
    ///
    /// # Errors
    /// No token can be had ([`TokenError`]).
    pub(super) async fn refresh(&self) -> Result<(), TokenError> {
        let token = self.source.token().await?;
        self.set(token);
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
        self.set(token);
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::future::BoxFuture;

    use super::*;

    /// Hands out `token-0001`, `token-0002`, … and holds no other tokens.
    #[derive(Debug, Default)]
    struct Counting(Mutex<u32>);

    impl Counting {
        fn next(&self) -> Secret {
            let mut n = self.0.lock().unwrap();
            *n += 1;
            Secret::new(format!("token-{n:04}"))
        }
    }

    impl TokenSource for Counting {
        fn token(&self) -> BoxFuture<'_, Result<Secret, TokenError>> {
            Box::pin(async move { Ok(self.next()) })
        }

        fn refused<'a>(
            &'a self,
            _refused: &'a Secret,
            _challenge: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Secret, TokenError>> {
            Box::pin(async move { Ok(self.next()) })
        }
    }

    #[tokio::test]
    async fn the_session_token_is_redacted_without_a_live_set() {
        let bearer = Bearer::new(Arc::new(Counting::default()));
        let redaction = bearer.redaction(&Redactor::default().shared());
        assert!(redaction.is_empty());
        bearer.refresh().await.unwrap();
        assert_eq!(bearer.header().as_deref(), Some("token-0001"));
        assert_eq!(redaction.redact("got token-0001"), "got [redacted]");
        bearer.refused(None).await.unwrap();
        bearer.refresh().await.unwrap();
        // The current token and the one before it.
        assert_eq!(
            redaction.redact("token-0001 token-0002 token-0003"),
            "token-0001 [redacted] [redacted]"
        );
    }
}
