//! The DPoP glue (RFC 9449, the proofs themselves in
//! [`crate::credentials::dpop`]): the client's proof key, the HTTP client
//! that puts proofs on token requests, and how a resource request carries
//! a bound token.

use std::sync::Arc;

use oauth2::TokenResponse as _;

use super::{OAuthClient, OAuthError, OAuthSettings};
use crate::config::Secret;
use crate::credentials::dpop::{Dpop, DpopKey, OAuthHttp, ResourceAuth};
use crate::state::TokenKey;

/// The DPoP key and nonces of a client with `settings` when
/// [`OAuthSettings::dpop`] is on: the configured key, else a new one.
pub(super) fn dpop_of(settings: &OAuthSettings) -> Result<Option<Arc<Dpop>>, OAuthError> {
    if !settings.dpop {
        return Ok(None);
    }
    let key = match &settings.dpop_key {
        Some(pem) => DpopKey::from_pem(pem.expose()),
        None => DpopKey::generate(),
    }
    .map_err(|e| OAuthError::Settings(e.to_string()))?;
    Ok(Some(Arc::new(Dpop::new(key))))
}

impl OAuthClient {
    /// The DPoP key and nonces, when DPoP is on.
    pub fn dpop(&self) -> Option<&Arc<Dpop>> {
        self.dpop.as_ref()
    }

    /// How a `method` request to the resource at `url` carries `token`
    /// (the key's): `Authorization: DPoP` with a fresh proof (`ath`, and the
    /// nonce the resource server gave last) when DPoP is on and the
    /// authorization server bound the token (`token_type: DPoP`), else
    /// `Authorization: Bearer`.
    ///
    /// # Errors
    /// The store failed, or the proof could not be made.
    pub async fn resource_auth(
        &self,
        key: &TokenKey,
        token: &Secret,
        method: &str,
        url: &str,
    ) -> Result<ResourceAuth, OAuthError> {
        let bearer = || ResourceAuth {
            authorization: Secret::new(format!("Bearer {}", token.expose())),
            dpop: None,
        };
        let Some(dpop) = &self.dpop else {
            return Ok(bearer());
        };
        let bound = self
            .store
            .load_credentials(key)
            .await?
            .and_then(|c| c.token_response)
            .is_some_and(|t| {
                t.access_token().secret() == token.expose()
                    && t.token_type().as_ref().eq_ignore_ascii_case("dpop")
            });
        if !bound {
            return Ok(bearer());
        }
        let proof = dpop
            .proof(method, url, Some(token.expose()))
            .map_err(|e| OAuthError::Settings(e.to_string()))?;
        Ok(ResourceAuth {
            authorization: Secret::new(format!("DPoP {}", token.expose())),
            dpop: Some(proof),
        })
    }

    /// The resource server at `url` gave `nonce` (`DPoP-Nonce`): the next
    /// proofs to it carry it. Nothing happens when DPoP is off.
    pub fn resource_nonce(&self, url: &str, nonce: &str) {
        if let Some(dpop) = &self.dpop {
            dpop.remember_nonce(url, nonce);
        }
    }

    /// The HTTP client of every OAuth request (rmcp's managers, the
    /// JWT-bearer grant, the enterprise-managed flow): the address rule on
    /// every resolved address, proofs when DPoP is on.
    pub(super) fn oauth_http(&self) -> Result<Arc<OAuthHttp>, OAuthError> {
        if let Some(http) = self.http.get() {
            return Ok(http.clone());
        }
        let http = OAuthHttp::new(self.settings.allow_private_addresses, self.dpop.clone())
            .map_err(|e| {
                OAuthError::Settings(format!("cannot build the OAuth HTTP client: {e}"))
            })?;
        Ok(self.http.get_or_init(|| Arc::new(http)).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::oauth::testing::{dpop_credentials, jwt_claims, workload_settings};
    use crate::credentials::oauth::{MemoryStore, OAuthStore};

    #[tokio::test]
    async fn bound_tokens_go_with_a_proof_and_others_as_bearer() {
        let store = Arc::new(MemoryStore::new());
        let key = TokenKey::tenant_wide("t", "s");
        let mut settings = workload_settings();
        settings.dpop = true;
        let client = OAuthClient::new(settings, store.clone()).expect("valid");
        let url = "https://mcp.example/mcp";

        store
            .save_grant(&key, dpop_credentials("at-1", "DPoP"))
            .await
            .expect("saved");
        let token = Secret::new("at-1");
        let auth = client
            .resource_auth(&key, &token, "POST", url)
            .await
            .expect("auth");
        assert_eq!(auth.authorization.expose(), "DPoP at-1");
        let proof = auth.dpop.expect("a proof");
        let claims = jwt_claims(&proof);
        assert_eq!(claims["htm"], "POST");
        assert_eq!(claims["htu"], url);
        assert!(claims["ath"].is_string());
        assert!(claims.get("nonce").is_none());
        client.resource_nonce(url, "rs-nonce");
        let again = client
            .resource_auth(&key, &token, "POST", url)
            .await
            .expect("auth");
        assert_eq!(
            jwt_claims(&again.dpop.expect("a proof"))["nonce"],
            "rs-nonce"
        );

        // A token the authorization server did not bind is a bearer token.
        store
            .save_grant(&key, dpop_credentials("at-2", "Bearer"))
            .await
            .expect("saved");
        let auth = client
            .resource_auth(&key, &Secret::new("at-2"), "POST", url)
            .await
            .expect("auth");
        assert_eq!(auth.authorization.expose(), "Bearer at-2");
        assert!(auth.dpop.is_none());

        // DPoP off: always bearer.
        let plain = OAuthClient::new(workload_settings(), store.clone()).expect("valid");
        let auth = plain
            .resource_auth(&key, &Secret::new("at-2"), "GET", url)
            .await
            .expect("auth");
        assert_eq!(auth.authorization.expose(), "Bearer at-2");
    }
}
