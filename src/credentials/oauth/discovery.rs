//! Discovery: the protected resource and authorization server metadata
//! rmcp finds (from a challenge or the well-known fallbacks), checked
//! against the address rule and narrowed to the configured client
//! authentication; and what `toolgate check` shows of it.

use rmcp::transport::auth::{AuthorizationManager, AuthorizationMetadata};

use super::address::check_endpoint;
use super::store::{CredentialAdapter, Saves};
use super::{OAuthClient, OAuthError, from_auth};
use crate::config::{Grant, TokenEndpointAuth};
use crate::state::TokenKey;

/// A server's OAuth as `toolgate check` shows it.
#[derive(Debug)]
pub struct Description {
    /// The grant.
    pub grant: Grant,
    /// The client identity presented to the authorization server.
    pub identity: String,
    /// The discovered authorization server's issuer, or why discovery
    /// failed.
    pub issuer: Result<String, OAuthError>,
}

impl OAuthClient {
    /// What `toolgate check` shows of the server's OAuth: its grant, the
    /// client identity the gateway presents, and the authorization server
    /// discovery finds (from the server's metadata, without a challenge).
    pub async fn describe(&self) -> Description {
        let discovered = self
            .manager(&TokenKey::tenant_wide("", ""), None)
            .await
            .map(|(_, metadata)| metadata);
        let identity = match (&self.settings.client_id, &discovered) {
            (Some(id), _) => format!("pre-registered client `{id}`"),
            (None, Ok(metadata))
                if self.settings.client_metadata_url.is_some() && supports_cimd(metadata) =>
            {
                format!(
                    "client ID metadata document {}",
                    self.settings.client_metadata_url.as_deref().unwrap_or("")
                )
            }
            (None, Ok(metadata)) if metadata.registration_endpoint.is_some() => {
                "dynamic registration (RFC 7591)".to_owned()
            }
            (None, Ok(_)) => "none available (no client_id, no metadata document support, no \
                              registration endpoint)"
                .to_owned(),
            (None, Err(_)) => "unknown until discovery succeeds".to_owned(),
        };
        Description {
            grant: self.settings.grant,
            identity,
            issuer: discovered.map(|m| m.issuer.unwrap_or_else(|| "(no issuer)".to_owned())),
        }
    }

    /// An rmcp manager for `key` with metadata discovered (from
    /// `challenge` when given) and checked against the address rule. Its
    /// saves are refreshes (compare-and-swap); one that obtains a new grant
    /// is switched with [`OAuthClient::keep_grants`].
    pub(super) async fn manager(
        &self,
        key: &TokenKey,
        challenge: Option<&str>,
    ) -> Result<(AuthorizationManager, AuthorizationMetadata), OAuthError> {
        let url = self.settings.server_url.as_str();
        // toolgate's client (the address rule on every resolved address of
        // every request, proofs on token requests with DPoP) replaces
        // rmcp's own.
        let http = self.oauth_http()?;
        let mut manager = AuthorizationManager::new_with_oauth_http_client(url, http.clone())
            .await
            .map_err(|e| from_auth(e, &[]))?;
        manager.set_credential_store(CredentialAdapter::new(
            self.store.clone(),
            key.clone(),
            Saves::Refreshed,
        ));
        let resolution = manager
            .resolve_metadata_from_challenge(challenge)
            .await
            .map_err(|e| from_auth(e, &[]))?;
        let allow = self.settings.allow_private_addresses;
        check_endpoint(&resolution.metadata.token_endpoint, allow).await?;
        if let Some(registration) = &resolution.metadata.registration_endpoint {
            check_endpoint(registration, allow).await?;
        }
        let metadata = self.restrict_auth_method(resolution.metadata)?;
        self.binding.note_issuer(metadata.issuer.as_deref());
        http.add_token_endpoint(&metadata.token_endpoint);
        manager.set_metadata(metadata.clone());
        Ok((manager, metadata))
    }

    /// Makes `manager`'s saves for `key` those of a new grant (a consent,
    /// a client-credentials token): written unconditionally, never dropped
    /// because the row changed since it was last read.
    pub(super) fn keep_grants(&self, manager: &mut AuthorizationManager, key: &TokenKey) {
        manager.set_credential_store(CredentialAdapter::new(
            self.store.clone(),
            key.clone(),
            Saves::Grant,
        ));
    }

    /// Narrows the metadata's `token_endpoint_auth_methods_supported` to the
    /// configured method, so rmcp (which picks from that list) uses it.
    fn restrict_auth_method(
        &self,
        mut metadata: AuthorizationMetadata,
    ) -> Result<AuthorizationMetadata, OAuthError> {
        let Some(method) = self.settings.token_endpoint_auth else {
            return Ok(metadata);
        };
        let name = match method {
            TokenEndpointAuth::ClientSecretBasic => "client_secret_basic",
            TokenEndpointAuth::ClientSecretPost => "client_secret_post",
            TokenEndpointAuth::PrivateKeyJwt => "private_key_jwt",
            TokenEndpointAuth::None => "none",
        };
        const FIELD: &str = "token_endpoint_auth_methods_supported";
        if let Some(listed) = metadata
            .additional_fields
            .get(FIELD)
            .and_then(|v| v.as_array())
            && !listed.iter().any(|m| m.as_str() == Some(name))
        {
            return Err(OAuthError::Discovery(format!(
                "the authorization server does not support {name}"
            )));
        }
        metadata
            .additional_fields
            .insert(FIELD.to_owned(), serde_json::json!([name]));
        Ok(metadata)
    }
}

pub(super) fn supports_cimd(metadata: &AuthorizationMetadata) -> bool {
    metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false)
}
