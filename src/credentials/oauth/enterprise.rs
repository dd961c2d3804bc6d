//! The enterprise-managed flow (SEP-990, rmcp's `enterprise` module): an
//! end user's ID token from the enterprise IdP exchanged for the server's
//! access token.

use rmcp::transport::auth::enterprise::{
    EmaAuthorizationServer, EmaClientAuthentication, EmaError, EmaExchangeRequest,
};
use rmcp::transport::auth::{AuthError, OAuthTokenResponse, VendorExtraTokenFields};

use super::address::check_endpoint;
use super::freshness::obtained;
use super::{OAuthClient, OAuthError, from_auth};
use crate::config::{Secret, TokenEndpointAuth};
use crate::state::TokenKey;

/// The identity provider of the enterprise-managed flow (SEP-990): where an
/// end user's ID token is exchanged for an identity assertion grant.
#[derive(Debug, Clone)]
pub struct EnterpriseIdp {
    /// The IdP's issuer identifier.
    pub issuer: String,
    /// The IdP's token endpoint.
    pub token_endpoint: String,
    /// The gateway's client id at the IdP.
    pub client_id: String,
    /// The gateway's client secret at the IdP (`client_secret_basic`); a
    /// public client when unset.
    pub client_secret: Option<Secret>,
}

impl OAuthClient {
    /// The enterprise-managed flow (SEP-990, rmcp's `enterprise` module):
    /// the end user's `id_token` from the enterprise IdP is exchanged there
    /// for an identity assertion grant, which the server's authorization
    /// server (discovered as usual) exchanges for an access token, kept
    /// under `key`. The server's client is the pre-registered one
    /// (`client_secret_basic` unless `token_endpoint_auth` says post).
    ///
    /// # Errors
    /// No pre-registered client, discovery failed, an endpoint is on a
    /// refused address, or either exchange failed.
    pub async fn enterprise_token(
        &self,
        key: &TokenKey,
        idp: &EnterpriseIdp,
        id_token: &Secret,
    ) -> Result<Secret, OAuthError> {
        let client_id = self.settings.client_id.clone().ok_or_else(|| {
            OAuthError::Settings("the enterprise-managed flow needs a client_id".into())
        })?;
        let (_manager, metadata) = self.manager(key, None).await?;
        let issuer = metadata.issuer.clone().ok_or_else(|| {
            OAuthError::Discovery("the authorization server metadata has no issuer".into())
        })?;
        check_endpoint(&idp.token_endpoint, self.settings.allow_private_addresses).await?;
        let post = self.settings.token_endpoint_auth == Some(TokenEndpointAuth::ClientSecretPost);
        let resource_as =
            EmaAuthorizationServer::new(&issuer, &metadata.token_endpoint, &client_id)
                .with_client_authentication(authentication(
                    self.settings.client_secret.as_ref(),
                    post,
                ));
        let idp_server =
            EmaAuthorizationServer::new(&idp.issuer, &idp.token_endpoint, &idp.client_id)
                .with_client_authentication(authentication(idp.client_secret.as_ref(), false));
        // The address rule on every address each request resolves to: the
        // check above is only ahead of the flow (DNS may answer otherwise
        // when the exchange connects).
        let http = self.oauth_http()?;
        let resource = self.settings.server_url.as_str();
        let token = EmaExchangeRequest::new_with_id_token(
            idp_server,
            resource_as,
            resource,
            id_token.expose(),
        )
        .with_scopes(self.settings.scopes.iter().cloned())
        .exchange(http.as_ref(), http.as_ref())
        .await
        .map_err(|e: EmaError| {
            let secrets = [
                id_token.expose(),
                self.settings
                    .client_secret
                    .as_ref()
                    .map_or("", |s| s.expose()),
                idp.client_secret.as_ref().map_or("", |s| s.expose()),
            ];
            from_auth(AuthError::OAuthError(e.to_string()), &secrets)
        })?;
        let mut response = OAuthTokenResponse::new(
            token.access_token.clone(),
            oauth2::basic::BasicTokenType::Bearer,
            VendorExtraTokenFields::default(),
        );
        response.set_expires_in(token.expires_in.as_ref());
        let scopes: Vec<String> = token.scopes.iter().cloned().collect();
        let stored = obtained(client_id, response, scopes, Some(issuer));
        self.store.save_grant(key, stored).await?;
        Ok(Secret::new(token.access_token.secret()))
    }
}

/// How the gateway authenticates at one of the flow's token endpoints:
/// with `secret` (in the form when `post`, else Basic), or not at all.
fn authentication(secret: Option<&Secret>, post: bool) -> EmaClientAuthentication {
    match secret {
        None => EmaClientAuthentication::None,
        Some(secret) if post => EmaClientAuthentication::ClientSecretPost(
            oauth2::ClientSecret::new(secret.expose().to_owned()),
        ),
        Some(secret) => EmaClientAuthentication::ClientSecretBasic(oauth2::ClientSecret::new(
            secret.expose().to_owned(),
        )),
    }
}
