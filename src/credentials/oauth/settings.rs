//! What a server's configuration says about its OAuth client
//! ([`OAuthSettings`]) and the checks that it can work; knows nothing of
//! the network.

use std::path::PathBuf;

use rmcp::transport::auth::JwtSigningAlgorithm;
use url::Url;

use super::OAuthError;
use super::renewal::DEFAULT_MAX_STEP_UPS;
use crate::config::{
    Grant, IdentityProvider, OAuthListener, Secret, ServerOAuth, SubjectTokenType,
    TokenEndpointAuth,
};
use crate::credentials::dpop::DpopKey;

/// The `client_name` sent with dynamic registration by default.
pub const DEFAULT_CLIENT_NAME: &str = "toolgate";

/// Where a workload's identity assertion (a JWT its platform issues, whose
/// audience is the authorization server) comes from, for the JWT-bearer
/// grant (RFC 7523 section 2.1; workload identity federation, SEP-1933).
#[derive(Debug, Clone)]
pub enum WorkloadAssertion {
    /// This assertion.
    Value(Secret),
    /// Read from this file at each exchange (platforms rotate it: a
    /// Kubernetes projected service-account token, say).
    File(PathBuf),
}

/// What a server's configuration says about its OAuth client.
#[derive(Debug, Clone)]
pub struct OAuthSettings {
    /// The MCP server's URL: the protected resource, and where discovery
    /// starts.
    pub server_url: Url,
    /// The grant tokens come from.
    pub grant: Grant,
    /// A pre-registered client id (always used when set).
    pub client_id: Option<String>,
    /// The pre-registered client's secret.
    pub client_secret: Option<Secret>,
    /// How the client authenticates at the token endpoint; when unset, the
    /// authorization server's metadata decides (rmcp's choice).
    pub token_endpoint_auth: Option<TokenEndpointAuth>,
    /// The PEM private key for `private_key_jwt`.
    pub private_key: Option<Secret>,
    /// The `private_key_jwt` signing algorithm; when unset, the first of the
    /// server's `token_endpoint_auth_signing_alg_values_supported` that rmcp
    /// signs, else ES256.
    pub signing_algorithm: Option<JwtSigningAlgorithm>,
    /// Scopes to ask for; when empty, those of the challenge or the
    /// resource's `scopes_supported` (rmcp's selection).
    pub scopes: Vec<String>,
    /// The redirect URI (authorization code).
    pub redirect_uri: Option<String>,
    /// The URL of the client ID metadata document the gateway serves
    /// (`oauth.public_url` + a path): the client id where the authorization
    /// server supports such documents.
    pub client_metadata_url: Option<String>,
    /// The `client_name` of dynamic registrations.
    pub client_name: String,
    /// Allow token and registration endpoints (and discovered metadata
    /// hosts) on private and loopback addresses (tests, private deployments).
    pub allow_private_addresses: bool,
    /// Step-ups tried per key within [`STEP_UP_WINDOW`](super::STEP_UP_WINDOW).
    pub max_step_ups: u32,
    /// Ask for DPoP-bound tokens (RFC 9449): every token request carries a
    /// proof of the client's key, and a token the authorization server
    /// binds (`token_type: DPoP`) is sent as `Authorization: DPoP` with a
    /// proof per request ([`OAuthClient::resource_auth`](super::OAuthClient::resource_auth)). Default off.
    pub dpop: bool,
    /// The DPoP key (PKCS#8 PEM, P-256). Default: a key generated when the
    /// client is made, so tokens bound by another process (a replica, or
    /// this one before a restart) are refused and renewed.
    pub dpop_key: Option<Secret>,
    /// Tokens come from the JWT-bearer grant (RFC 7523 section 2.1) with
    /// this assertion instead of the grant's own request (`grant` must be
    /// `client_credentials`: non-interactive, the tenant's own token).
    /// The client authenticates with its secret when it has one, else
    /// names its `client_id` (if any). Default: none.
    pub jwt_bearer_assertion: Option<WorkloadAssertion>,
    /// `token_exchange`: where the caller's JWT is exchanged; the token
    /// endpoint discovered for the server when unset.
    pub token_endpoint: Option<Url>,
    /// `token_exchange`: the `audience` of the exchange.
    pub audience: Option<String>,
    /// `token_exchange`: the `subject_token_type` of the caller's JWT.
    pub subject_token_type: SubjectTokenType,
    /// `token_exchange`: the issuers whose JWTs may be exchanged (empty:
    /// any verified JWT; without `token_endpoint` each only at its own
    /// issuer's token endpoint).
    pub subject_issuers: Vec<String>,
    /// `identity_assertion`: the enterprise IdP.
    pub identity_provider: Option<IdentityProvider>,
}

impl OAuthSettings {
    /// Settings for `server_url` with `grant` and every option at its
    /// default.
    pub fn new(server_url: Url, grant: Grant) -> Self {
        Self {
            server_url,
            grant,
            client_id: None,
            client_secret: None,
            token_endpoint_auth: None,
            private_key: None,
            signing_algorithm: None,
            scopes: Vec::new(),
            redirect_uri: None,
            client_metadata_url: None,
            client_name: DEFAULT_CLIENT_NAME.to_owned(),
            allow_private_addresses: false,
            max_step_ups: DEFAULT_MAX_STEP_UPS,
            dpop: false,
            dpop_key: None,
            jwt_bearer_assertion: None,
            token_endpoint: None,
            audience: None,
            subject_token_type: SubjectTokenType::default(),
            subject_issuers: Vec::new(),
            identity_provider: None,
        }
    }

    /// The settings of `tenant`'s configured server `server`
    /// (`servers[].oauth`), with that (tenant, server)'s redirect URI and
    /// client metadata document at the gateway's OAuth listener when there
    /// is one, and a client name that names the tenant.
    pub fn from_config(
        server_url: Url,
        oauth: &ServerOAuth,
        listener: Option<&OAuthListener>,
        (tenant, server): (&str, &str),
    ) -> Self {
        let mut settings = Self::new(server_url, oauth.grant);
        settings.client_id = oauth.client_id.clone();
        settings.client_secret = oauth.client_secret.clone();
        settings.token_endpoint_auth = oauth.token_endpoint_auth;
        settings.private_key = oauth.private_key.clone();
        settings.scopes = oauth.scopes.clone();
        settings.token_endpoint = oauth.token_endpoint.clone();
        settings.audience = oauth.audience.clone();
        settings.subject_token_type = oauth.subject_token_type;
        settings.subject_issuers = oauth.subject_issuers.clone();
        settings.identity_provider = oauth.identity_provider.clone();
        settings.client_name = crate::config::client_name(tenant);
        if let Some(listener) = listener {
            settings.redirect_uri = Some(listener.redirect_uri(tenant, server));
            // Client ID metadata documents must be served over https; a
            // plain-http listener (tests, a private network) registers
            // dynamically instead.
            if listener.public_url.scheme() == "https" {
                settings.client_metadata_url = Some(listener.client_metadata_url(tenant, server));
            }
            settings.allow_private_addresses = listener.allow_private_addresses;
        }
        settings
    }

    /// Checks that the settings can work.
    pub(super) fn validate(&self) -> Result<(), OAuthError> {
        let bad = |reason: &str| Err(OAuthError::Settings(reason.to_owned()));
        match self.grant {
            Grant::ClientCredentials if self.jwt_bearer_assertion.is_some() => {
                if self.token_endpoint_auth == Some(TokenEndpointAuth::PrivateKeyJwt) {
                    return bad(
                        "the JWT-bearer grant authenticates with a client secret or not at all",
                    );
                }
                if self.client_secret.is_some() && self.client_id.is_none() {
                    return bad("a client secret needs its pre-registered client_id");
                }
            }
            _ if self.jwt_bearer_assertion.is_some() => {
                return bad("the JWT-bearer grant replaces client_credentials only");
            }
            Grant::ClientCredentials => {
                if self.client_id.is_none() {
                    return bad("client_credentials needs a pre-registered client_id");
                }
                match self.token_endpoint_auth {
                    Some(TokenEndpointAuth::PrivateKeyJwt) if self.private_key.is_none() => {
                        return bad("private_key_jwt needs a private key");
                    }
                    Some(TokenEndpointAuth::PrivateKeyJwt) => {}
                    Some(TokenEndpointAuth::None) => {
                        return bad("client_credentials needs client authentication");
                    }
                    _ if self.client_secret.is_none() => {
                        return bad("client_credentials needs a client secret or a private key");
                    }
                    _ => {}
                }
            }
            Grant::AuthorizationCode => {
                if self.redirect_uri.is_none() {
                    return bad("authorization_code needs a redirect URI (oauth.public_url)");
                }
                if self.client_secret.is_some() && self.client_id.is_none() {
                    return bad("a client secret needs its pre-registered client_id");
                }
            }
            Grant::TokenExchange => {
                if self.client_secret.is_some() && self.client_id.is_none() {
                    return bad("a client secret needs its pre-registered client_id");
                }
            }
            Grant::IdentityAssertion => {
                if self.client_id.is_none() {
                    return bad("identity_assertion needs a pre-registered client_id");
                }
            }
        }
        if let Some(pem) = &self.dpop_key
            && DpopKey::from_pem(pem.expose()).is_err()
        {
            return bad("the DPoP key must be a PKCS#8 PEM P-256 private key");
        }
        if let Some(url) = &self.client_metadata_url {
            let ok = Url::parse(url).is_ok_and(|u| u.scheme() == "https" && u.path() != "/");
            if !ok {
                return bad("the client metadata document URL must be https with a path");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::credentials::oauth::testing::workload_settings;
    use crate::credentials::oauth::{MemoryStore, OAuthClient};

    /// Whether a client with `settings` is refused for them.
    fn refused(settings: OAuthSettings) -> bool {
        matches!(
            OAuthClient::new(settings, Arc::new(MemoryStore::new())),
            Err(OAuthError::Settings(_))
        )
    }

    #[test]
    fn settings_are_checked() {
        let url = Url::parse("https://mcp.example/mcp").expect("url");
        let code = OAuthSettings::new(url.clone(), Grant::AuthorizationCode);
        assert!(refused(code));
        let cc = OAuthSettings::new(url, Grant::ClientCredentials);
        assert!(refused(cc));
    }

    #[test]
    fn jwt_bearer_and_dpop_settings_are_checked() {
        let store = Arc::new(MemoryStore::new());
        // A public workload client: no secret needed.
        assert!(OAuthClient::new(workload_settings(), store.clone()).is_ok());
        let mut code = workload_settings();
        code.grant = Grant::AuthorizationCode;
        code.redirect_uri = Some("https://gw.example/cb".into());
        assert!(refused(code));
        let mut jwt = workload_settings();
        jwt.token_endpoint_auth = Some(TokenEndpointAuth::PrivateKeyJwt);
        jwt.private_key = Some(Secret::new("pem"));
        assert!(refused(jwt));
        let mut bad_key = workload_settings();
        bad_key.dpop = true;
        bad_key.dpop_key = Some(Secret::new("not a key"));
        assert!(refused(bad_key));
        let mut dpop = workload_settings();
        dpop.dpop = true;
        let client = OAuthClient::new(dpop, store).expect("valid settings");
        assert!(client.dpop().is_some());
    }
}
