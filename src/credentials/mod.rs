//! Upstream credentials and what keeps them in: every configured
//! credential value is removed from upstream text ([`Redactor`]) before
//! that text reaches a caller, a log line or a span.

pub mod dpop;
pub mod oauth;
mod redact;
mod store;
mod tokens;

pub use redact::{
    MAX_STATUS_MESSAGE, MAX_UPSTREAM_TEXT, MIN_REDACTED_LEN, REDACTED, Redactor, SharedRedactor,
    bounded,
};
pub use store::StateOAuthStore;
pub use tokens::OAuthTokens;
