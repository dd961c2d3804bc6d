//! Upstream credentials and what keeps them in: OAuth 2.1 clients
//! ([`oauth`]) and their tokens ([`OAuthTokens`], a [`TokenSource`] for
//! upstream sessions) kept in the state store ([`StateOAuthStore`]), DPoP
//! proofs ([`dpop`]); and every configured credential value and every live
//! OAuth token removed from upstream text ([`Redaction`]) before that text
//! reaches a caller, a log line or a span. Knows configuration and the
//! state store, nothing of sessions or gRPC.

pub mod dpop;
pub mod oauth;
mod redact;
mod source;
mod store;
mod tokens;

pub use redact::{
    ANCHOR_LEN, MAX_STATUS_MESSAGE, MAX_UPSTREAM_TEXT, MIN_REDACTED_LEN, REDACTED, Redaction,
    Redactor, SharedRedactor, bounded,
};
pub use source::{TokenError, TokenSource};
pub use store::StateOAuthStore;
pub use tokens::OAuthTokens;
