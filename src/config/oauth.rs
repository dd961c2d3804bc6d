//! The configuration of upstream OAuth 2.1 and of the state store that
//! keeps OAuth clients, tokens and pending consents: domain types and their
//! validation from the raw `state:`, `oauth:` and `servers[].oauth` blocks.

use std::net::SocketAddr;
use std::path::Path;

use super::fields::{Errors, resolve, socket_addr};
use super::raw::{RawOAuth, RawServerOAuth, RawState};
use super::{Environment, Secret};

/// The state store used when `state.url` is not set: a SQLite file in the
/// gateway's working directory.
pub const DEFAULT_STATE_URL: &str = "sqlite://toolgate-state.db?mode=rwc";

/// Where OAuth clients, tokens and pending consents are kept.
#[derive(Debug, Clone, Default)]
pub struct StateConfig {
    /// `sqlite://...` or `postgres://...`; [`DEFAULT_STATE_URL`] when unset.
    /// A secret: a PostgreSQL URL may carry a password.
    pub url: Option<Secret>,
    /// AES-256-GCM keys, each 32 bytes given in base64: the first encrypts,
    /// every one decrypts (so a key can be rotated).
    pub keys: Vec<Secret>,
}

impl StateConfig {
    /// The store's URL, or the default.
    pub fn url(&self) -> &str {
        self.url
            .as_ref()
            .map(Secret::expose)
            .unwrap_or(DEFAULT_STATE_URL)
    }
}

/// The OAuth consent listener: serves the redirect endpoint and the
/// client metadata document.
#[derive(Debug, Clone)]
pub struct OAuthListener {
    /// Where the listener binds.
    pub listen: SocketAddr,
    /// What the outside (browsers, authorization servers) sees of the
    /// listener: the base of the redirect URI and of the client metadata
    /// document's URL.
    pub public_url: url::Url,
    /// Allow metadata and token endpoints on private and link-local
    /// addresses (tests and private deployments only).
    pub allow_private_addresses: bool,
    /// TLS on the consent listener (`oauth.tls`); plaintext when unset
    /// (behind a TLS-terminating ingress).
    pub tls: Option<super::ListenerTls>,
}

impl OAuthListener {
    /// The redirect URI of `tenant`'s server `server`:
    /// `<public_url>/oauth/<tenant>/<server>/callback`. Each (tenant,
    /// server) has its own, so a callback is checked against the flow it
    /// names (an authorization server's code cannot be delivered to
    /// another server's flow: the mix-up defence).
    pub fn redirect_uri(&self, tenant: &str, server: &str) -> String {
        join(
            &self.public_url,
            &format!("oauth/{tenant}/{server}/callback"),
        )
    }

    /// The URL of the client ID metadata document the gateway serves for
    /// `tenant`'s server `server` (its `client_name` names the tenant; its
    /// only redirect URI is [`OAuthListener::redirect_uri`]).
    pub fn client_metadata_url(&self, tenant: &str, server: &str) -> String {
        join(
            &self.public_url,
            &format!("oauth/{tenant}/{server}/client-metadata.json"),
        )
    }
}

/// The `client_name` a tenant's client presents to authorization servers
/// (in its metadata document and dynamic registrations), so the consent
/// screen says whom the user grants access to.
pub fn client_name(tenant: &str) -> String {
    format!("{tenant} (through toolgate)")
}

fn join(base: &url::Url, path: &str) -> String {
    let mut text = base.as_str().trim_end_matches('/').to_owned();
    text.push('/');
    text.push_str(path);
    text
}

/// Which OAuth grant a server's credentials come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Grant {
    /// The tenant acts for itself (no end user).
    ClientCredentials,
    /// Each end user (`x-toolgate-subject`) consents in a browser; tokens
    /// are kept per (tenant, subject, server).
    AuthorizationCode,
    /// OAuth 2.0 Token Exchange (RFC 8693): the JWT a `callers.jwt` caller
    /// presented is exchanged for a token of the server; kept per (tenant,
    /// subject, server) until it expires. No consent screen.
    TokenExchange,
    /// The enterprise-managed flow (SEP-990): the caller's ID token is
    /// exchanged at the enterprise IdP for an identity assertion grant
    /// (ID-JAG), then at the server's authorization server for its token;
    /// kept per (tenant, subject, server) until it expires.
    IdentityAssertion,
}

impl std::fmt::Display for Grant {
    /// The name as configured (`grant:`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Grant::ClientCredentials => "client_credentials",
            Grant::AuthorizationCode => "authorization_code",
            Grant::TokenExchange => "token_exchange",
            Grant::IdentityAssertion => "identity_assertion",
        })
    }
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenEndpointAuth {
    /// HTTP Basic with the client id and secret.
    ClientSecretBasic,
    /// The client id and secret in the form body.
    ClientSecretPost,
    /// A JWT signed with the client's private key (RFC 7523).
    PrivateKeyJwt,
    /// A public client: no client authentication.
    None,
}

/// An HTTP server's OAuth 2.1 client settings (`servers[].oauth`).
#[derive(Debug, Clone)]
pub struct ServerOAuth {
    /// The grant.
    pub grant: Grant,
    /// A pre-registered client id; without one the gateway uses its client
    /// metadata document, then dynamic registration.
    pub client_id: Option<String>,
    /// The pre-registered client's secret.
    pub client_secret: Option<Secret>,
    /// The PEM private key for `private_key_jwt`.
    pub private_key: Option<Secret>,
    /// How the client authenticates at the token endpoint (the server's
    /// metadata decides when unset).
    pub token_endpoint_auth: Option<TokenEndpointAuth>,
    /// Scopes to ask for; when empty, those of the server's challenge or its
    /// `scopes_supported`.
    pub scopes: Vec<String>,
    /// `token_exchange`: where the caller's JWT is exchanged. When unset,
    /// the token endpoint of the JWT's own issuer, read from that issuer's
    /// metadata, and only when the server names that issuer as its
    /// authorization server: a JWT never goes to an endpoint the server
    /// alone chose.
    pub token_endpoint: Option<url::Url>,
    /// `token_exchange`: the `audience` parameter of the exchange (besides
    /// `resource`, always the server's URL); none when unset.
    pub audience: Option<String>,
    /// `token_exchange`: what the caller's JWT is to the token endpoint.
    pub subject_token_type: SubjectTokenType,
    /// `token_exchange`: the `callers.jwt` issuers whose JWTs may be
    /// exchanged for this server. Empty: with `token_endpoint`, the one
    /// `callers.jwt` issuer (required when there are several); without
    /// it, any, each only at its own issuer's token endpoint.
    pub subject_issuers: Vec<String>,
    /// `identity_assertion`: the enterprise IdP that turns the caller's ID
    /// token into an identity assertion grant.
    pub identity_provider: Option<IdentityProvider>,
}

impl ServerOAuth {
    /// Whether tokens are per end user (subject) rather than per tenant:
    /// `authorization_code` and the delegation grants.
    pub fn per_user(&self) -> bool {
        matches!(
            self.grant,
            Grant::AuthorizationCode | Grant::TokenExchange | Grant::IdentityAssertion
        )
    }

    /// Whether an end user consents in a browser (`authorization_code`),
    /// which needs the consent listener.
    pub fn needs_consent(&self) -> bool {
        self.grant == Grant::AuthorizationCode
    }

    /// Whether the token comes from the caller's own JWT (`token_exchange`,
    /// `identity_assertion`): only `callers.jwt` callers may call the
    /// server.
    pub fn delegated(&self) -> bool {
        matches!(self.grant, Grant::TokenExchange | Grant::IdentityAssertion)
    }
}

/// What the caller's JWT is to a token exchange's token endpoint
/// (`subject_token_type`, RFC 8693 section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SubjectTokenType {
    /// `urn:ietf:params:oauth:token-type:jwt` (the default).
    #[default]
    Jwt,
    /// `urn:ietf:params:oauth:token-type:access_token`.
    AccessToken,
    /// `urn:ietf:params:oauth:token-type:id_token`.
    IdToken,
}

impl SubjectTokenType {
    /// The token type URI sent as `subject_token_type`.
    pub fn uri(self) -> &'static str {
        match self {
            SubjectTokenType::Jwt => "urn:ietf:params:oauth:token-type:jwt",
            SubjectTokenType::AccessToken => "urn:ietf:params:oauth:token-type:access_token",
            SubjectTokenType::IdToken => "urn:ietf:params:oauth:token-type:id_token",
        }
    }
}

/// The enterprise IdP of `grant: identity_assertion`
/// (`servers[].oauth.identity_provider`).
#[derive(Debug, Clone)]
pub struct IdentityProvider {
    /// The IdP's issuer identifier; a caller's JWT must be of this issuer.
    pub issuer: String,
    /// The IdP's token endpoint; discovered from the issuer's metadata
    /// (RFC 8414, then OpenID discovery) when unset.
    pub token_endpoint: Option<url::Url>,
    /// The gateway's client id at the IdP.
    pub client_id: String,
    /// The gateway's client secret at the IdP (`client_secret_basic`); a
    /// public client when unset.
    pub client_secret: Option<Secret>,
}

/// Validates `state:`.
pub(super) fn state(
    errors: &mut Errors,
    raw: RawState,
    base: &Path,
    env: &dyn Environment,
) -> StateConfig {
    let url = raw.url.and_then(|value| {
        let url = resolve(errors, "state.url", &value, &super::sources::Sources::file(base, env))?;
        let text = url.expose();
        if !(text.starts_with("sqlite:") || text.starts_with("postgres://") || text.starts_with("postgresql://")) {
            errors.push(
                "state.url",
                "must be a sqlite: or postgres:// URL (the value is not shown: it may hold a password)",
            );
            return None;
        }
        Some(url)
    });
    let mut keys = Vec::with_capacity(raw.keys.len());
    for (index, value) in raw.keys.iter().enumerate() {
        let path = format!("state.keys[{index}]");
        let Some(key) = resolve(
            errors,
            &path,
            value,
            &super::sources::Sources::file(base, env),
        ) else {
            continue;
        };
        use base64::Engine as _;
        match base64::engine::general_purpose::STANDARD.decode(key.expose().trim()) {
            Ok(bytes) if bytes.len() == 32 => {
                let same = keys.iter().position(|k: &Secret| {
                    base64::engine::general_purpose::STANDARD
                        .decode(k.expose().trim())
                        .is_ok_and(|b| b == bytes)
                });
                match same {
                    // The key ring refuses a key given twice (rotation
                    // would be ambiguous): say so here, where `check` sees it.
                    Some(first) => errors.push(
                        path,
                        format!("is the same key as state.keys[{first}]; give each key once"),
                    ),
                    None => keys.push(key),
                }
            }
            Ok(bytes) => errors.push(
                path,
                format!(
                    "must be 32 bytes in base64 (an AES-256 key); it decodes to {} bytes",
                    bytes.len()
                ),
            ),
            Err(_) => errors.push(
                path,
                "is not base64 (make one with `openssl rand -base64 32`)",
            ),
        }
    }
    StateConfig { url, keys }
}

/// Validates `oauth:`.
pub(super) fn listener(
    errors: &mut Errors,
    raw: RawOAuth,
    base: &std::path::Path,
) -> Option<OAuthListener> {
    let before = errors.0.len();
    let listen = match raw.listen.as_deref() {
        None => {
            errors.push(
                "oauth.listen",
                "required: the address of the consent listener, e.g. 0.0.0.0:8090",
            );
            None
        }
        Some(text) => socket_addr(errors, "oauth.listen", text, "0.0.0.0:8090"),
    };
    let public_url = match raw.public_url.as_deref() {
        None => {
            errors.push(
                "oauth.public_url",
                "required: the URL under which browsers reach oauth.listen, e.g. https://toolgate.example.com",
            );
            None
        }
        Some(text) => match url::Url::parse(text) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Some(url),
            _ => {
                errors.push(
                    "oauth.public_url",
                    format!("`{text}` is not an http(s) URL with a host"),
                );
                None
            }
        },
    };
    let tls = raw
        .tls
        .and_then(|tls| super::listener_tls::listener_tls(errors, "oauth", tls, base));
    if errors.0.len() != before {
        return None;
    }
    Some(OAuthListener {
        listen: listen?,
        public_url: public_url?,
        allow_private_addresses: raw.allow_private_addresses,
        tls,
    })
}

/// Validates a server's `oauth:` block.
pub(super) fn server(
    errors: &mut Errors,
    path: &str,
    raw: RawServerOAuth,
    src: &super::sources::Sources<'_>,
) -> Option<ServerOAuth> {
    let before = errors.0.len();
    let path = format!("{path}.oauth");
    let grant = match raw.grant.as_str() {
        "client_credentials" => Some(Grant::ClientCredentials),
        "authorization_code" => Some(Grant::AuthorizationCode),
        "token_exchange" => Some(Grant::TokenExchange),
        "identity_assertion" => Some(Grant::IdentityAssertion),
        other => {
            errors.push(
                format!("{path}.grant"),
                format!(
                    "`{other}` is not a grant: client_credentials, authorization_code, \
                     token_exchange or identity_assertion"
                ),
            );
            None
        }
    };
    let delegation = delegation(errors, &path, grant, &raw_delegation(&raw), src);
    let token_endpoint_auth = match raw.token_endpoint_auth.as_deref() {
        None => None,
        Some("client_secret_basic") => Some(TokenEndpointAuth::ClientSecretBasic),
        Some("client_secret_post") => Some(TokenEndpointAuth::ClientSecretPost),
        Some("private_key_jwt") => Some(TokenEndpointAuth::PrivateKeyJwt),
        Some("none") => Some(TokenEndpointAuth::None),
        Some(other) => {
            errors.push(
                format!("{path}.token_endpoint_auth"),
                format!(
                    "`{other}` is not one of client_secret_basic, client_secret_post, private_key_jwt, none"
                ),
            );
            None
        }
    };
    let client_id = raw
        .client_id
        .and_then(|v| resolve(errors, &format!("{path}.client_id"), &v, src))
        .map(|s| s.expose().to_owned());
    let client_secret = raw
        .client_secret
        .and_then(|v| resolve(errors, &format!("{path}.client_secret"), &v, src));
    let private_key = raw
        .private_key
        .and_then(|v| resolve(errors, &format!("{path}.private_key"), &v, src));
    if grant == Some(Grant::ClientCredentials) && client_id.is_none() {
        errors.push(
            format!("{path}.client_id"),
            "required for client_credentials (the client the tenant acts as)",
        );
    }
    match token_endpoint_auth {
        Some(TokenEndpointAuth::PrivateKeyJwt) if private_key.is_none() => errors.push(
            format!("{path}.private_key"),
            "required for token_endpoint_auth: private_key_jwt (a PEM key, best from {file: ...})",
        ),
        Some(TokenEndpointAuth::ClientSecretBasic | TokenEndpointAuth::ClientSecretPost)
            if client_secret.is_none() && client_id.is_some() =>
        {
            errors.push(
                format!("{path}.client_secret"),
                "required for a pre-registered client with client_secret_basic or client_secret_post",
            );
        }
        _ => {}
    }
    if private_key.is_some() && token_endpoint_auth != Some(TokenEndpointAuth::PrivateKeyJwt) {
        errors.push(
            format!("{path}.private_key"),
            "only used with token_endpoint_auth: private_key_jwt",
        );
    }
    for (index, scope) in raw.scopes.iter().enumerate() {
        if scope.is_empty() || scope.contains(char::is_whitespace) {
            errors.push(
                format!("{path}.scopes[{index}]"),
                "a scope is one non-empty word without spaces",
            );
        }
    }
    if grant == Some(Grant::IdentityAssertion) && client_id.is_none() {
        errors.push(
            format!("{path}.client_id"),
            "required for identity_assertion (the gateway's client at the server's authorization server)",
        );
    }
    if errors.0.len() != before {
        return None;
    }
    let delegation = delegation?;
    Some(ServerOAuth {
        grant: grant?,
        client_id,
        client_secret,
        private_key,
        token_endpoint_auth,
        scopes: raw.scopes,
        token_endpoint: delegation.token_endpoint,
        audience: delegation.audience,
        subject_token_type: delegation.subject_token_type,
        subject_issuers: delegation.subject_issuers,
        identity_provider: delegation.identity_provider,
    })
}

/// The delegation keys of a server's `oauth:`, validated.
struct Delegation {
    token_endpoint: Option<url::Url>,
    audience: Option<String>,
    subject_token_type: SubjectTokenType,
    subject_issuers: Vec<String>,
    identity_provider: Option<IdentityProvider>,
}

/// The delegation keys as written, taken out of the raw block.
struct RawDelegation<'a> {
    token_endpoint: Option<&'a str>,
    audience: Option<&'a str>,
    subject_token_type: Option<&'a str>,
    subject_issuers: Option<&'a [String]>,
    identity_provider: Option<&'a super::raw::RawIdentityProvider>,
}

fn raw_delegation(raw: &RawServerOAuth) -> RawDelegation<'_> {
    RawDelegation {
        token_endpoint: raw.token_endpoint.as_deref(),
        audience: raw.audience.as_deref(),
        subject_token_type: raw.subject_token_type.as_deref(),
        subject_issuers: raw.subject_issuers.as_deref(),
        identity_provider: raw.identity_provider.as_ref(),
    }
}

/// Validates `token_endpoint`, `audience`, `subject_token_type` (only with
/// `token_exchange`) and `identity_provider` (required with, and only
/// with, `identity_assertion`).
fn delegation(
    errors: &mut Errors,
    path: &str,
    grant: Option<Grant>,
    raw: &RawDelegation<'_>,
    src: &super::sources::Sources<'_>,
) -> Option<Delegation> {
    let before = errors.0.len();
    let exchange = grant == Some(Grant::TokenExchange);
    let only_exchange = |errors: &mut Errors, key: &str, set: bool| {
        if set && !exchange && grant.is_some() {
            errors.push(
                format!("{path}.{key}"),
                "only used with grant: token_exchange",
            );
        }
    };
    only_exchange(errors, "token_endpoint", raw.token_endpoint.is_some());
    only_exchange(errors, "audience", raw.audience.is_some());
    only_exchange(
        errors,
        "subject_token_type",
        raw.subject_token_type.is_some(),
    );
    only_exchange(errors, "subject_issuers", raw.subject_issuers.is_some());
    let subject_issuers: Vec<String> = raw.subject_issuers.unwrap_or_default().to_vec();
    for (i, issuer) in subject_issuers.iter().enumerate() {
        http_url(errors, &format!("{path}.subject_issuers[{i}]"), issuer);
    }
    if raw.subject_issuers.is_some_and(<[String]>::is_empty) {
        errors.push(
            format!("{path}.subject_issuers"),
            "is empty: leave it out, or name the callers.jwt issuers whose JWTs may be exchanged",
        );
    }
    let token_endpoint = raw
        .token_endpoint
        .and_then(|text| http_url(errors, &format!("{path}.token_endpoint"), text));
    if raw.audience.is_some_and(|a| a.trim().is_empty()) {
        errors.push(
            format!("{path}.audience"),
            "is empty: leave it out, or name the audience",
        );
    }
    let subject_token_type = match raw.subject_token_type {
        None | Some("jwt") => SubjectTokenType::Jwt,
        Some("access_token") => SubjectTokenType::AccessToken,
        Some("id_token") => SubjectTokenType::IdToken,
        Some(other) => {
            errors.push(
                format!("{path}.subject_token_type"),
                format!("`{other}` is not jwt, access_token or id_token"),
            );
            SubjectTokenType::Jwt
        }
    };
    let assertion = grant == Some(Grant::IdentityAssertion);
    let identity_provider = match (raw.identity_provider, assertion) {
        (None, true) => {
            errors.push(
                format!("{path}.identity_provider"),
                "required for identity_assertion: the enterprise IdP's issuer and the gateway's \
                 client_id there",
            );
            None
        }
        (Some(_), false) if grant.is_some() => {
            errors.push(
                format!("{path}.identity_provider"),
                "only used with grant: identity_assertion",
            );
            None
        }
        (Some(idp), _) => identity_provider(errors, &format!("{path}.identity_provider"), idp, src),
        (None, false) => None,
    };
    if errors.0.len() != before {
        return None;
    }
    Some(Delegation {
        token_endpoint,
        audience: raw.audience.map(str::to_owned),
        subject_token_type,
        subject_issuers,
        identity_provider,
    })
}

/// Validates `identity_provider`.
fn identity_provider(
    errors: &mut Errors,
    path: &str,
    raw: &super::raw::RawIdentityProvider,
    src: &super::sources::Sources<'_>,
) -> Option<IdentityProvider> {
    let before = errors.0.len();
    http_url(errors, &format!("{path}.issuer"), &raw.issuer)?;
    let token_endpoint = raw
        .token_endpoint
        .as_deref()
        .and_then(|text| http_url(errors, &format!("{path}.token_endpoint"), text));
    let client_id = resolve(errors, &format!("{path}.client_id"), &raw.client_id, src)
        .map(|s| s.expose().to_owned());
    if client_id.as_deref() == Some("") {
        errors.push(format!("{path}.client_id"), "is empty");
    }
    let client_secret = raw
        .client_secret
        .as_ref()
        .and_then(|v| resolve(errors, &format!("{path}.client_secret"), v, src));
    if errors.0.len() != before {
        return None;
    }
    Some(IdentityProvider {
        issuer: raw.issuer.clone(),
        token_endpoint,
        client_id: client_id?,
        client_secret,
    })
}

/// An http(s) URL with a host, or an error at `path`.
fn http_url(errors: &mut Errors, path: &str, text: &str) -> Option<url::Url> {
    match url::Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Some(url),
        _ => {
            errors.push(path, format!("`{text}` is not an http(s) URL with a host"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use super::super::Config;
    use super::*;

    const KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

    fn load(yaml: &str) -> Result<Config, super::super::ConfigError> {
        let env: HashMap<String, String> = [
            ("STATE_KEY".to_owned(), KEY.to_owned()),
            (
                "CRM_SECRET".to_owned(),
                "crm-client-secret-value".to_owned(),
            ),
        ]
        .into();
        Config::from_yaml(yaml, "test.yaml", Path::new("."), &env)
    }

    fn server(oauth: &str) -> String {
        format!(
            "tenants:\n  - name: acme\n    tokens: [tok]\n    consent_return_url: https://app.example.com/consent\n    servers:\n      - name: crm\n        url: \"https://crm.example.com/mcp\"\n        oauth: {oauth}\n"
        )
    }

    fn messages(yaml: &str) -> Vec<String> {
        load(yaml)
            .expect_err("invalid")
            .field_errors()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_per_user_server_with_keys_and_a_listener_is_valid() {
        let yaml = format!(
            "state:\n  keys: [{{ env: STATE_KEY }}]\noauth:\n  listen: \"127.0.0.1:8090\"\n  public_url: \"https://toolgate.example.com/\"\n{}",
            server("{ grant: authorization_code, scopes: [read, write] }")
        );
        let config = load(&yaml).unwrap();
        let oauth = config.tenants[0].servers[0].oauth.as_ref().unwrap();
        assert!(oauth.per_user());
        assert_eq!(oauth.scopes, ["read", "write"]);
        let listener = config.oauth.unwrap();
        assert_eq!(
            listener.redirect_uri("acme", "drive"),
            "https://toolgate.example.com/oauth/acme/drive/callback"
        );
        assert_eq!(config.state.url(), DEFAULT_STATE_URL);
        assert_eq!(config.state.keys.len(), 1);
    }

    /// Issue 37: a configured token endpoint with several JWT issuers must
    /// say whose JWTs go there; `subject_issuers` names `callers.jwt`
    /// issuers only, and only with `token_exchange`.
    #[test]
    fn subject_issuers_say_whose_jwts_reach_a_configured_token_endpoint() {
        let callers = "callers:\n  jwt:\n    - { issuer: \"https://a.example\", audiences: [gw], jwks: { url: \"https://a.example/keys\" }, tenant: claims.team }\n    - { issuer: \"https://b.example\", audiences: [gw], jwks: { url: \"https://b.example/keys\" }, tenant: claims.team }\n";
        let yaml = |oauth: &str| {
            format!(
                "state:\n  keys: [{{ env: STATE_KEY }}]\n{callers}{}",
                server(oauth)
            )
        };
        let errors = messages(&yaml(
            "{ grant: token_exchange, token_endpoint: \"https://a.example/token\" }",
        ));
        assert!(
            errors.iter().any(|e| e.starts_with(
                "tenants[0].servers[0].oauth.subject_issuers: required with token_endpoint when callers.jwt has 2 issuers"
            )),
            "{errors:?}"
        );
        let errors = messages(&yaml(
            "{ grant: token_exchange, subject_issuers: [\"https://c.example\"] }",
        ));
        assert!(
            errors.iter().any(|e| e.starts_with(
                "tenants[0].servers[0].oauth.subject_issuers[0]: `https://c.example` is not a callers.jwt issuer"
            )),
            "{errors:?}"
        );
        let errors = messages(&yaml(
            "{ grant: client_credentials, client_id: x, subject_issuers: [\"https://a.example\"] }",
        ));
        assert!(
            errors.iter().any(|e| e
                == "tenants[0].servers[0].oauth.subject_issuers: only used with grant: token_exchange"),
            "{errors:?}"
        );
        let config = load(&yaml(
            "{ grant: token_exchange, token_endpoint: \"https://a.example/token\", subject_issuers: [\"https://a.example/\"] }",
        ))
        .unwrap();
        let oauth = config.tenants[0].servers[0].oauth.as_ref().unwrap();
        assert_eq!(oauth.subject_issuers, ["https://a.example/"]);
        // Without a token endpoint each JWT goes to its own issuer only:
        // nothing to name.
        load(&yaml("{ grant: token_exchange }")).unwrap();
    }

    #[test]
    fn oauth_needs_keys_and_per_user_consent_needs_a_listener() {
        let errors = messages(&server("{ grant: authorization_code }"));
        assert!(
            errors.iter().any(|e| e.starts_with("state.keys: required")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e
                    .starts_with("tenants[0].servers[0].oauth.grant: authorization_code needs")),
            "{errors:?}"
        );
    }

    #[test]
    fn per_user_consents_are_confirmed_at_a_return_url_unless_the_tenant_opts_out() {
        let with = |consent: &str| {
            format!(
                "state:\n  keys: [{{ env: STATE_KEY }}]\noauth:\n  listen: \"127.0.0.1:8090\"\n  public_url: \"https://toolgate.example.com/\"\n{}",
                server("{ grant: authorization_code }").replace(
                    "    consent_return_url: https://app.example.com/consent\n",
                    consent
                )
            )
        };
        let config = load(&with(
            "    consent_return_url: https://app.example.com/consent?x=1\n",
        ))
        .unwrap();
        assert!(matches!(
            &config.tenants[0].consent,
            super::super::TenantConsent::Confirmed(Some(url)) if url.as_str() == "https://app.example.com/consent?x=1"
        ));
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
        load(&with(
            "    consent_return_url: http://localhost:3000/consent\n",
        ))
        .unwrap();

        let refused = [
            (
                "",
                "tenants[0].consent_return_url: is required: server `crm` is per-user",
            ),
            (
                "    consent_return_url: http://app.example.com/consent\n",
                "tenants[0].consent_return_url: must be https",
            ),
            (
                "    consent_return_url: https://app.example.com/consent#here\n",
                "tenants[0].consent_return_url: must not have a #fragment",
            ),
            (
                "    consent_return_url: /consent\n",
                "tenants[0].consent_return_url: is not an absolute URL",
            ),
            (
                "    confirm_consent: false\n    consent_return_url: https://app.example.com/c\n",
                "tenants[0].consent_return_url: is not used with confirm_consent: false",
            ),
        ];
        for (consent, error) in refused {
            let errors = messages(&with(consent));
            assert!(
                errors.iter().any(|e| e.starts_with(error)),
                "{consent:?}: {errors:?}"
            );
        }

        let config = load(&with("    confirm_consent: false\n")).unwrap();
        assert_eq!(
            config.tenants[0].consent,
            super::super::TenantConsent::Unconfirmed
        );
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].path, "tenants[0].confirm_consent");
        assert!(
            warnings[0]
                .message
                .contains("whoever opens an authorization link")
        );

        // A tenant without per-user servers needs neither.
        let plain = "state:\n  keys: [{ env: STATE_KEY }]\ntenants:\n  - name: acme\n    tokens: [tok]\n    servers:\n      - name: crm\n        url: \"https://crm.example.com/mcp\"\n";
        assert_eq!(
            load(plain).unwrap().tenants[0].consent,
            super::super::TenantConsent::Confirmed(None)
        );
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_both() {
        let key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let yaml = format!(
            "state:\n  keys: [\"{key}\", \" {key}\"]\n{}",
            server("{ grant: client_credentials, client_id: c, client_secret: s }")
        );
        let errors = messages(&yaml);
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("state.keys[1]: is the same key as state.keys[0]")),
            "{errors:?}"
        );
        assert!(!errors.join("\n").contains(key), "{errors:?}");
    }

    #[test]
    fn bad_settings_name_their_path_and_never_the_secret() {
        let yaml = format!(
            "state:\n  keys: [\"c2hvcnQ=\", \"not base64!\"]\n  url: \"mysql://user:hunter2hunter2@db/x\"\n{}",
            server(
                "{ grant: implicit, token_endpoint_auth: magic, client_secret: { env: CRM_SECRET }, scopes: [\"a b\"] }"
            )
        );
        let errors = messages(&yaml);
        for expected in [
            "state.keys[0]: must be 32 bytes",
            "state.keys[1]: is not base64",
            "state.url: must be a sqlite: or postgres:// URL",
            "tenants[0].servers[0].oauth.grant: `implicit` is not a grant",
            "tenants[0].servers[0].oauth.token_endpoint_auth: `magic`",
            "tenants[0].servers[0].oauth.scopes[0]",
        ] {
            assert!(
                errors.iter().any(|e| e.starts_with(expected)),
                "{expected} in {errors:?}"
            );
        }
        let all = errors.join("\n");
        assert!(!all.contains("hunter2"), "{all}");
        assert!(!all.contains("crm-client-secret-value"), "{all}");
    }

    #[test]
    fn client_credentials_needs_a_client_and_stdio_servers_take_no_oauth() {
        let errors = messages(&format!(
            "state:\n  keys: [{{ env: STATE_KEY }}]\n{}",
            server("{ grant: client_credentials, token_endpoint_auth: private_key_jwt }")
        ));
        assert!(
            errors
                .iter()
                .any(|e| e.contains("oauth.client_id: required")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("oauth.private_key: required")),
            "{errors:?}"
        );
        let errors = messages(
            "tenants:\n  - name: acme\n    tokens: [tok]\n    servers:\n      - name: s\n        command: [\"/bin/true\"]\n        oauth: { grant: client_credentials, client_id: x }\n",
        );
        assert!(
            errors.iter().any(|e| e
                .starts_with("tenants[0].servers[0].oauth: `oauth` applies to `url` servers only")),
            "{errors:?}"
        );
    }
}
