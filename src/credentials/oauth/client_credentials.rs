//! The client-credentials grant (rmcp's: `client_secret_basic`/`_post` or
//! `private_key_jwt`), or the JWT-bearer grant in its place.

use oauth2::TokenResponse as _;
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, ClientCredentialsConfig, OAuthTokenResponse,
};

use super::{OAuthClient, OAuthError, from_auth};
use crate::config::Secret;
use crate::state::TokenKey;

impl OAuthClient {
    /// A client-credentials token (rmcp: `client_secret_basic`/`_post` or
    /// `private_key_jwt`), with `extra` scopes on step-up.
    pub(super) async fn client_credentials(
        &self,
        key: &TokenKey,
        challenge: Option<&str>,
        extra: &[String],
    ) -> Result<Secret, OAuthError> {
        if let Some(assertion) = &self.settings.jwt_bearer_assertion {
            return self.jwt_bearer(key, challenge, extra, assertion).await;
        }
        let (mut manager, metadata) = self.manager(key, challenge).await?;
        self.keep_grants(&mut manager, key);
        let scopes = self.grant_scopes(&manager, extra);
        let (config, secret) = self.client_credentials_config(&metadata, scopes)?;
        let secrets = [secret.unwrap_or("")];
        manager
            .validate_client_credentials_metadata(&config)
            .map_err(|e| from_auth(e, &secrets))?;
        manager
            .configure_client_credentials(&config)
            .map_err(|e| from_auth(e, &secrets))?;
        let response = exchange(manager, config)
            .await?
            .map_err(|e| from_auth(e, &secrets))?;
        tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth client-credentials token obtained");
        self.event(key, "token_issued");
        Ok(Secret::new(response.access_token().secret()))
    }

    /// The scopes a non-interactive grant asks for: `extra` on step-up,
    /// else the configured ones, else rmcp's selection; never
    /// `offline_access`.
    pub(super) fn grant_scopes(
        &self,
        manager: &AuthorizationManager,
        extra: &[String],
    ) -> Vec<String> {
        let mut scopes = if !extra.is_empty() {
            extra.to_vec()
        } else if !self.settings.scopes.is_empty() {
            self.settings.scopes.clone()
        } else {
            manager.select_scopes(None, &[])
        };
        scopes.retain(|s| s != "offline_access");
        scopes
    }
}

/// rmcp's client-credentials exchange. rmcp 3.11's
/// `exchange_client_credentials` future is not `Send` (its private_key_jwt
/// path holds a `form_urlencoded::Serializer` across an await), so it runs
/// to completion on a blocking thread.
async fn exchange(
    manager: AuthorizationManager,
    config: ClientCredentialsConfig,
) -> Result<Result<OAuthTokenResponse, AuthError>, OAuthError> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        runtime.block_on(async move { manager.exchange_client_credentials(&config).await })
    })
    .await
    .map_err(|e| OAuthError::Refused(format!("the token request was abandoned: {e}")))
}
