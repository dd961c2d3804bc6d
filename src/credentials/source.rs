//! The seam between credentials and upstream sessions: a [`TokenSource`]
//! hands a session its access tokens (the OAuth client's, per tenant ×
//! subject × server), and [`TokenError`] says why it has none. The trait
//! lives here, with its implementor ([`super::OAuthTokens`]), so that the
//! upstream layer uses it without the credentials layer knowing sessions.

use std::fmt;

use futures::future::BoxFuture;

use super::SharedRedactor;
use crate::config::Secret;

/// Why no token could be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// The subject has not authorized the server yet (or its grant was
    /// revoked): the end user consents at `url`.
    #[error("the subject must authorize the server first")]
    AuthorizationRequired {
        /// Where the end user consents.
        url: String,
    },
    /// The state store holding the tokens cannot be reached.
    #[error("the state store is unavailable: {0}")]
    StoreUnavailable(String),
    /// Getting or refreshing the token failed (the authorization server
    /// refused, or could not be reached). Never contains a token or secret.
    #[error("{0}")]
    Failed(String),
    /// The OAuth setup cannot give a token and retrying will not help
    /// (settings, discovery, a refused client, step-ups spent).
    #[error("{0}")]
    Refused(String),
    /// A delegation grant gave no token (no caller JWT, another issuer's,
    /// the exchange refused or unavailable). Never contains a token.
    #[error("{0}")]
    Delegation(super::oauth::DelegationError),
}

/// Where a session's access tokens come from.
pub trait TokenSource: Send + Sync + fmt::Debug {
    /// The access token to send now: cached, refreshed when it has expired
    /// (a refresh token rotated as the server says).
    fn token(&self) -> BoxFuture<'_, Result<Secret, TokenError>>;

    /// The server refused `refused` with this `WWW-Authenticate` challenge
    /// (when it sent one): a refreshed token, or one with the scopes the
    /// challenge asks for (step-up, bounded by the source).
    fn refused<'a>(
        &'a self,
        refused: &'a Secret,
        challenge: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Secret, TokenError>>;

    /// The redactor of every token the source's client holds now (every
    /// subject's, for the same server): a session takes them out of what
    /// its server sends back. `None`: the source holds no other tokens.
    fn live_tokens(&self) -> Option<SharedRedactor> {
        None
    }
}
