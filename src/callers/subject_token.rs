//! The caller's own JWT, as verified: what the delegation grants
//! (`grant: token_exchange`, `grant: identity_assertion`) exchange for an
//! upstream token. Only a `callers.jwt` caller has one; a static-token or
//! certificate caller has none. Kept apart from [`super::Caller`], which
//! carries no credential.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::Secret;

/// A verified caller JWT: the token itself (never shown by `Debug`), the
/// issuer that verified it and when it expires (its `exp`).
#[derive(Clone)]
pub struct SubjectToken {
    token: Secret,
    issuer: String,
    expires_at: SystemTime,
}

impl SubjectToken {
    /// The verified `token` of `issuer`, with its `claims` (`exp`; a token
    /// without a numeric `exp` is taken to expire now, so it is never kept).
    pub fn new(token: &str, issuer: &str, claims: &serde_json::Value) -> Self {
        let expires_at = claims
            .get("exp")
            .and_then(serde_json::Value::as_u64)
            .and_then(|exp| UNIX_EPOCH.checked_add(Duration::from_secs(exp)))
            .unwrap_or_else(SystemTime::now);
        Self {
            token: Secret::new(token),
            issuer: issuer.to_owned(),
            expires_at,
        }
    }

    /// The JWT itself: only ever sent to a token endpoint.
    pub fn token(&self) -> &Secret {
        &self.token
    }

    /// The issuer (`iss`) that verified it.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// When it expires (its `exp`).
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }

    /// Whether it has expired at `now`.
    pub fn expired(&self, now: SystemTime) -> bool {
        self.expires_at <= now
    }
}

impl fmt::Debug for SubjectToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubjectToken")
            .field("issuer", &self.issuer)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_token_and_exp_is_read() {
        let claims = serde_json::json!({"exp": 2_000_000_000u64});
        let token = SubjectToken::new("eyJhbGciOi.secret-part.sig", "https://idp.example", &claims);
        let shown = format!("{token:?}");
        assert!(!shown.contains("secret-part"), "{shown}");
        assert!(shown.contains("https://idp.example"), "{shown}");
        assert_eq!(
            token.expires_at(),
            UNIX_EPOCH + Duration::from_secs(2_000_000_000)
        );
        assert!(!token.expired(UNIX_EPOCH + Duration::from_secs(1_999_999_999)));
        assert!(token.expired(UNIX_EPOCH + Duration::from_secs(2_000_000_000)));
        let no_exp = SubjectToken::new("a.b.c", "i", &serde_json::json!({}));
        assert!(no_exp.expired(SystemTime::now() + Duration::from_secs(1)));
    }
}
