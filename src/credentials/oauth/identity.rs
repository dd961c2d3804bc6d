//! The client identity presented to the authorization server: the
//! pre-registered client, the client ID metadata document, a stored or a
//! new dynamic registration; and the client-credentials configuration
//! (`client_secret_basic`/`_post`, `private_key_jwt`).

use rmcp::transport::auth::{
    AuthorizationManager, AuthorizationMetadata, ClientCredentialsConfig, JwtSigningAlgorithm,
    OAuthClientConfig,
};

use super::discovery::supports_cimd;
use super::{OAuthClient, OAuthError, RegisteredClient, from_auth};
use crate::config::TokenEndpointAuth;
use crate::state::{ClientKey, TokenKey};

impl OAuthClient {
    /// The client identity for a new flow, in the spec's order:
    /// pre-registered, the client ID metadata document (where the server
    /// supports it), the registration stored for this issuer, a new
    /// registration (kept for the issuer).
    pub(super) async fn identity(
        &self,
        key: &TokenKey,
        manager: &mut AuthorizationManager,
        metadata: &AuthorizationMetadata,
        scopes: &[String],
    ) -> Result<OAuthClientConfig, OAuthError> {
        let redirect = self.redirect_uri()?;
        if let Some(id) = &self.settings.client_id {
            return Ok(self.pre_registered(id, redirect));
        }
        if let Some(url) = &self.settings.client_metadata_url
            && supports_cimd(metadata)
        {
            return Ok(OAuthClientConfig::new(url.clone(), redirect));
        }
        let client_key = client_key(key, metadata);
        if let Some(client) = self.store.load_client(&client_key).await? {
            return Ok(registered_config(client, redirect));
        }
        let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
        let config = manager
            .register_client(&self.settings.client_name, &redirect, &scope_refs)
            .await
            .map_err(|e| from_auth(e, &[]))?;
        self.store
            .save_client(
                &client_key,
                RegisteredClient {
                    client_id: config.client_id.clone(),
                    client_secret: config.client_secret.clone(),
                },
            )
            .await?;
        Ok(config)
    }

    /// The identity a flow or stored credentials were made with, when it is
    /// still this server's: the pre-registered client, the metadata
    /// document, or the registration stored for this issuer.
    pub(super) async fn known_identity(
        &self,
        key: &TokenKey,
        metadata: &AuthorizationMetadata,
        client_id: &str,
    ) -> Result<Option<OAuthClientConfig>, OAuthError> {
        let redirect = self.redirect_uri()?;
        if self.settings.client_id.as_deref() == Some(client_id) {
            return Ok(Some(self.pre_registered(client_id, redirect)));
        }
        if self.settings.client_metadata_url.as_deref() == Some(client_id) {
            return Ok(Some(OAuthClientConfig::new(client_id, redirect)));
        }
        Ok(self
            .store
            .load_client(&client_key(key, metadata))
            .await?
            .filter(|client| client.client_id == client_id)
            .map(|client| registered_config(client, redirect)))
    }

    /// The pre-registered client `client_id`, with its secret if any.
    fn pre_registered(&self, client_id: &str, redirect: String) -> OAuthClientConfig {
        let config = OAuthClientConfig::new(client_id, redirect);
        match &self.settings.client_secret {
            Some(secret) => config.with_client_secret(secret.expose()),
            None => config,
        }
    }

    fn redirect_uri(&self) -> Result<String, OAuthError> {
        configured(&self.settings.redirect_uri, "no redirect URI").cloned()
    }

    /// The pre-registered client's client-credentials configuration for
    /// `scopes` and the server as `resource`: `private_key_jwt` when
    /// configured, else its secret (which it returns too, to be scrubbed
    /// from errors).
    pub(super) fn client_credentials_config(
        &self,
        metadata: &AuthorizationMetadata,
        scopes: Vec<String>,
    ) -> Result<(ClientCredentialsConfig, Option<&str>), OAuthError> {
        let client_id = configured(&self.settings.client_id, "no client_id")?.clone();
        let resource = Some(self.settings.server_url.to_string());
        if self.settings.token_endpoint_auth == Some(TokenEndpointAuth::PrivateKeyJwt) {
            let key_pem = configured(&self.settings.private_key, "no private key")?;
            let config = ClientCredentialsConfig::PrivateKeyJwt {
                client_id,
                signing_key: key_pem.expose().as_bytes().to_vec(),
                signing_algorithm: self.signing_algorithm(metadata),
                token_endpoint_audience: None,
                scopes,
                resource,
            };
            return Ok((config, None));
        }
        let secret = configured(&self.settings.client_secret, "no client secret")?;
        let config = ClientCredentialsConfig::ClientSecret {
            client_id,
            client_secret: secret.expose().to_owned(),
            scopes,
            resource,
        };
        Ok((config, Some(secret.expose())))
    }

    /// The configured algorithm, else the first the server lists that rmcp
    /// signs, else ES256.
    fn signing_algorithm(&self, metadata: &AuthorizationMetadata) -> JwtSigningAlgorithm {
        if let Some(algorithm) = self.settings.signing_algorithm {
            return algorithm;
        }
        metadata
            .additional_fields
            .get("token_endpoint_auth_signing_alg_values_supported")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .find_map(parse_algorithm)
            .unwrap_or(JwtSigningAlgorithm::ES256)
    }
}

/// `value`, or the settings error that it is `missing`.
fn configured<'a, T>(value: &'a Option<T>, missing: &str) -> Result<&'a T, OAuthError> {
    value
        .as_ref()
        .ok_or_else(|| OAuthError::Settings(missing.to_owned()))
}

/// A JWS algorithm name rmcp signs `private_key_jwt` assertions with.
pub fn parse_algorithm(name: &str) -> Option<JwtSigningAlgorithm> {
    Some(match name {
        "RS256" => JwtSigningAlgorithm::RS256,
        "RS384" => JwtSigningAlgorithm::RS384,
        "RS512" => JwtSigningAlgorithm::RS512,
        "ES256" => JwtSigningAlgorithm::ES256,
        "ES384" => JwtSigningAlgorithm::ES384,
        _ => return None,
    })
}

/// Where a registration at this authorization server is kept: by issuer
/// (the token endpoint when the metadata names none).
fn client_key(key: &TokenKey, metadata: &AuthorizationMetadata) -> ClientKey {
    let issuer = metadata
        .issuer
        .clone()
        .unwrap_or_else(|| metadata.token_endpoint.clone());
    ClientKey::new(&key.tenant, &key.server, issuer)
}

fn registered_config(client: RegisteredClient, redirect: String) -> OAuthClientConfig {
    let mut config = OAuthClientConfig::new(client.client_id, redirect);
    if let Some(secret) = client.client_secret.filter(|s| !s.is_empty()) {
        config = config.with_client_secret(secret);
    }
    config
}
