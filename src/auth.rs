//! Caller authentication: `authorization: Bearer <token>` → the caller's
//! [`Tenant`], put into the request extensions.
//!
//! Tokens are kept only as SHA-256 digests. A presented token is hashed and
//! looked up by digest, then the digests are compared in constant time, so
//! neither the lookup nor the comparison leaks how much of a token matched.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::service::Interceptor;

use crate::config::Config;
use crate::error::CallError;
use crate::registry::{Registry, Tenant};

/// Token digests of every tenant, mapped to the tenant's position in the
/// configuration.
#[derive(Clone, Default)]
pub struct TokenTable {
    by_digest: Arc<HashMap<[u8; 32], usize>>,
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

impl TokenTable {
    /// Builds the table from the validated configuration (which guarantees
    /// that no token belongs to two tenants).
    pub fn new(config: &Config) -> Self {
        let mut by_digest = HashMap::new();
        for (index, tenant) in config.tenants.iter().enumerate() {
            for token in &tenant.tokens {
                by_digest.insert(digest(token.expose()), index);
            }
        }
        Self {
            by_digest: Arc::new(by_digest),
        }
    }

    /// The tenant a presented token selects.
    pub fn tenant_for(&self, token: &str) -> Option<usize> {
        let presented = digest(token);
        self.by_digest
            .get_key_value(&presented)
            .filter(|(known, _)| bool::from(known.ct_eq(&presented)))
            .map(|(_, tenant)| *tenant)
    }

    /// Extracts the bearer token from an `authorization` value.
    fn bearer(value: &str) -> Option<&str> {
        let (scheme, token) = value.trim().split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then_some(token.trim())
            .filter(|t| !t.is_empty())
    }
}

/// The gRPC interceptor that authenticates every ToolGateway call and puts
/// the caller's [`Tenant`] into the request extensions. It reads the
/// registry's current tokens, so a configuration reload applies to the
/// next call.
#[derive(Debug, Clone)]
pub struct Authenticate {
    registry: Arc<Registry>,
}

impl Authenticate {
    /// An interceptor over the registry's tenants.
    pub fn new(registry: Arc<Registry>) -> Self {
        Self { registry }
    }
}

impl Interceptor for Authenticate {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(value) = request.metadata().get("authorization") else {
            return Err(CallError::Unauthenticated(
                "missing `authorization: Bearer <token>` metadata",
            )
            .into());
        };
        let token =
            value
                .to_str()
                .ok()
                .and_then(TokenTable::bearer)
                .ok_or(CallError::Unauthenticated(
                    "the `authorization` metadata is not `Bearer <token>`",
                ))?;
        let tenant: Arc<Tenant> = self
            .registry
            .authenticate(token)
            .ok_or(CallError::Unauthenticated("unknown token"))?;
        // The caller's credential goes no further than this layer.
        request.metadata_mut().remove("authorization");
        request.extensions_mut().insert(tenant);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_values() {
        assert_eq!(TokenTable::bearer("Bearer abc"), Some("abc"));
        assert_eq!(TokenTable::bearer("bearer  abc "), Some("abc"));
        assert_eq!(TokenTable::bearer("Basic abc"), None);
        assert_eq!(TokenTable::bearer("Bearer "), None);
        assert_eq!(TokenTable::bearer("abc"), None);
    }
}
