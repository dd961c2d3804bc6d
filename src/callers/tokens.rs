//! The tenants' static tokens: [`TokenTable`], and reading a bearer
//! token from `authorization`.
//!
//! Tokens are kept only as SHA-256 digests. A presented token is hashed and
//! looked up by digest, then the digests are compared in constant time, so
//! neither the lookup nor the comparison leaks how much of a token matched.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Config;

/// Token digests of every tenant, mapped to the tenant's position in the
/// configuration and the token's position in the tenant's `tokens`.
#[derive(Clone, Default)]
pub struct TokenTable {
    by_digest: Arc<HashMap<[u8; 32], (usize, usize)>>,
}

impl std::fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenTable")
            .field("tokens", &self.by_digest.len())
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The SHA-256 digest of a presented static token: what a later
/// configuration is asked whether the token is still one of its tenant's
/// (a long-lived stream re-checks its caller without keeping the token).
#[derive(Clone, PartialEq, Eq)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// The digest of `token`.
    pub fn of(token: &str) -> Self {
        Self(digest(token))
    }

    /// The digest's bytes (what the state store's token index is keyed
    /// by; never the token).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A digest read back from the state store's token index.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(***)")
    }
}

impl TokenTable {
    /// Builds the table from the validated configuration (which guarantees
    /// that no token belongs to two tenants).
    pub fn new(config: &Config) -> Self {
        let mut by_digest = HashMap::new();
        for (index, tenant) in config.tenants.iter().enumerate() {
            for (token_index, token) in tenant.tokens.iter().enumerate() {
                by_digest.insert(digest(token.expose()), (index, token_index));
            }
        }
        Self {
            by_digest: Arc::new(by_digest),
        }
    }

    /// The tenant a presented token selects, and the token's index in the
    /// tenant's `tokens`.
    pub fn tenant_for(&self, token: &str) -> Option<(usize, usize)> {
        self.tenant_for_digest(&TokenDigest::of(token))
    }

    /// The tenant a token with this digest selects, and the token's index
    /// in the tenant's `tokens`.
    pub fn tenant_for_digest(&self, digest: &TokenDigest) -> Option<(usize, usize)> {
        let presented = digest.0;
        self.by_digest
            .get_key_value(&presented)
            .filter(|(known, _)| bool::from(known.ct_eq(&presented)))
            .map(|(_, tenant)| *tenant)
    }
}

/// Extracts the bearer token from an `authorization` value.
pub(crate) fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_values() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("abc"), None);
    }
}
