//! The delegation grants: the caller's own verified JWT (a
//! [`SubjectToken`]) exchanged for the server's access token, without a
//! consent screen.
//!
//! - `token_exchange` (RFC 8693): one POST to the configured token
//!   endpoint, else to the token endpoint of the JWT's own issuer (read
//!   from that issuer's metadata), and only when the server names that
//!   issuer as its authorization server (RFC 9728, then RFC 8414): the
//!   caller's JWT never goes to an endpoint the MCP server alone chose.
//!   `subject_issuers` narrows whose JWTs are exchanged. Through
//!   [`OAuthHttp`](crate::credentials::dpop::OAuthHttp) (the address rule;
//!   DPoP when on). oauth2 has no token-exchange request, so the form is
//!   built here, like the JWT-bearer grant's.
//! - `identity_assertion` (SEP-990): [`OAuthClient::enterprise_token`]
//!   (rmcp's `enterprise` module) with the caller's JWT as the ID token, at
//!   the configured identity provider (its token endpoint discovered from
//!   its issuer when unset).
//!
//! The subject's latest verified JWT is kept in memory ([`SubjectTokens`](super::SubjectTokens),
//! per tenant and subject key, bounded, dropped at its `exp`), so a
//! session's token source can exchange again when the stored token
//! expires. The JWT goes to the token endpoint only; it is held among the
//! client's live tokens, so a server that echoes it is redacted.

use std::sync::Arc;

use rmcp::transport::auth::OAuthTokenResponse;

use super::enterprise::EnterpriseIdp;
use super::jwt_bearer::TokenRequest;
use super::subject_tokens::SubjectTokens;
use super::{OAuthClient, OAuthError, root_cause, scrubbed};
use crate::callers::SubjectToken;
use crate::config::{Grant, Secret};
use crate::state::TokenKey;

/// The RFC 8693 grant type.
pub const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";

/// The token type asked for: an access token (RFC 8693 section 3).
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// Why a delegation grant gave no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelegationFailure {
    /// The caller presented no JWT (a static-token or certificate caller),
    /// or none is left for the subject: nothing was exchanged or sent.
    RequiresJwt,
    /// The caller's JWT is of an issuer the server does not exchange: not
    /// the identity provider (`identity_assertion`), or not among
    /// `subject_issuers` (`token_exchange`). Nothing was sent.
    IssuerMismatch,
    /// `token_exchange` without `token_endpoint`: the server names an
    /// authorization server other than the caller's JWT's issuer, so the
    /// JWT has nowhere it may go. Nothing was sent.
    UntrustedEndpoint,
    /// The token endpoint refused the exchange (`invalid_grant`,
    /// `invalid_target`, `unauthorized_client`, ...).
    Refused,
    /// The token endpoint (or its metadata) could not be reached, or
    /// answered 5xx: retryable.
    Unavailable,
}

/// A delegation grant's failure: its kind and a text naming the server and
/// why (never a token).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct DelegationError {
    /// What failed.
    pub kind: DelegationFailure,
    /// In words, without any token.
    pub reason: String,
    /// The token endpoint's OAuth error code (`invalid_grant`, ...), when
    /// it refused with one.
    pub code: Option<String>,
}

impl DelegationError {
    fn new(kind: DelegationFailure, reason: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
            code: None,
        }
    }

    /// The reason of the failure's audit record: the OAuth error code when
    /// the token endpoint gave one, else what kind of failure it was.
    pub fn audit_reason(&self) -> &str {
        match (&self.code, self.kind) {
            (Some(code), _) => code,
            (None, DelegationFailure::RequiresJwt) => "requires_jwt",
            (None, DelegationFailure::IssuerMismatch) => "issuer_mismatch",
            (None, DelegationFailure::Refused) => "refused",
            (None, DelegationFailure::Unavailable) => "unavailable",
            (None, DelegationFailure::UntrustedEndpoint) => "untrusted_endpoint",
        }
    }
}

impl OAuthClient {
    /// Uses `tokens` as the memory of callers' JWTs.
    #[must_use]
    pub fn with_subject_tokens(mut self, tokens: Arc<SubjectTokens>) -> Self {
        self.subject_tokens = Some(tokens);
        self
    }

    /// Whether tokens come from the caller's JWT (`token_exchange`,
    /// `identity_assertion`).
    pub fn is_delegated(&self) -> bool {
        matches!(
            self.settings.grant,
            Grant::TokenExchange | Grant::IdentityAssertion
        )
    }

    /// The latest verified JWT of `key`'s subject, if one is kept.
    pub fn subject_token(&self, key: &TokenKey) -> Option<SubjectToken> {
        self.subject_tokens
            .as_ref()?
            .latest(&key.tenant, &key.subject)
    }

    /// Whether the caller's JWT `token` may be exchanged by this client:
    /// for `identity_assertion` only a JWT of the identity provider's
    /// issuer; for `token_exchange` one of `subject_issuers` (any when
    /// none is named).
    ///
    /// # Errors
    /// [`DelegationFailure::IssuerMismatch`], naming both issuers.
    pub fn accepts_subject_token(&self, token: &SubjectToken) -> Result<(), DelegationError> {
        let mismatch = |reason: String| {
            Err(DelegationError::new(
                DelegationFailure::IssuerMismatch,
                reason,
            ))
        };
        match (self.settings.grant, &self.settings.identity_provider) {
            (Grant::IdentityAssertion, Some(idp)) if !same_issuer(&idp.issuer, token.issuer()) => {
                mismatch(format!(
                    "the server exchanges ID tokens of {} (identity_assertion) but the caller's \
                     JWT is of {}",
                    idp.issuer,
                    token.issuer()
                ))
            }
            (Grant::TokenExchange, _)
                if !self.settings.subject_issuers.is_empty()
                    && !self
                        .settings
                        .subject_issuers
                        .iter()
                        .any(|issuer| same_issuer(issuer, token.issuer())) =>
            {
                mismatch(format!(
                    "the server exchanges JWTs of {} (subject_issuers) but the caller's JWT is \
                     of {}",
                    self.settings.subject_issuers.join(", "),
                    token.issuer()
                ))
            }
            _ => Ok(()),
        }
    }

    /// A token of `key` from the delegation grant, with the subject's
    /// latest JWT (`extra` scopes on step-up), kept under `key`.
    pub(super) async fn delegated(
        &self,
        key: &TokenKey,
        extra: &[String],
    ) -> Result<Secret, OAuthError> {
        let Some(jwt) = self.subject_token(key) else {
            return Err(OAuthError::Delegation(DelegationError::new(
                DelegationFailure::RequiresJwt,
                format!(
                    "the server exchanges the caller's JWT (grant: {}) and no unexpired JWT of \
                     this subject is at hand: call with a callers.jwt token",
                    self.settings.grant
                ),
            )));
        };
        self.accepts_subject_token(&jwt)
            .map_err(OAuthError::Delegation)?;
        // Redacted from whatever the server sends back, should it ever see it.
        self.live.hold(key, [jwt.token().expose()]);
        let (result, [ok, refused, failed]) = match self.settings.grant {
            Grant::IdentityAssertion => (
                self.identity_assertion(key, &jwt).await,
                [
                    "identity_assertion_obtained",
                    "identity_assertion_refused",
                    "identity_assertion_failed",
                ],
            ),
            _ => (
                self.token_exchange(key, &jwt, extra).await,
                [
                    "token_exchanged",
                    "token_exchange_refused",
                    "token_exchange_failed",
                ],
            ),
        };
        match result {
            Ok(token) => {
                tracing::info!(tenant = %key.tenant, server = %key.server, grant = %self.settings.grant, "delegated token obtained");
                self.event(key, ok);
                Ok(token)
            }
            Err(error) => {
                let error = as_delegation(error);
                tracing::warn!(tenant = %key.tenant, server = %key.server, grant = %self.settings.grant, %error, "delegation failed");
                let refusal = matches!(&error, OAuthError::Delegation(e) if e.kind == DelegationFailure::Refused);
                let reason = match &error {
                    OAuthError::Delegation(e) => e.audit_reason(),
                    _ => "error",
                };
                self.event_because(key, if refusal { refused } else { failed }, Some(reason));
                Err(error)
            }
        }
    }

    /// Where this delegated client exchanges a caller's JWT, with the
    /// endpoints discovery resolves now (`toolgate check`).
    ///
    /// # Errors
    /// Discovery of the server's or the identity provider's metadata failed.
    /// `trusted` are the `callers.jwt` issuers: without `token_endpoint`, a
    /// server whose authorization server is none of them can never be
    /// exchanged for, and that is an error here.
    pub async fn describe_delegation(&self, trusted: &[String]) -> Result<String, OAuthError> {
        let server = self.settings.server_url.as_str();
        let key = TokenKey::tenant_wide("", "");
        if let (Grant::IdentityAssertion, Some(idp)) =
            (self.settings.grant, &self.settings.identity_provider)
        {
            let idp_endpoint = match &idp.token_endpoint {
                Some(url) => url.to_string(),
                None => self.idp_token_endpoint(&idp.issuer).await?,
            };
            let (_, metadata) = self.manager(&key, None).await?;
            return Ok(format!(
                "identity_assertion: ID tokens of {} exchanged for an ID-JAG at {idp_endpoint}, \
                 then at authorization server {} ({})",
                idp.issuer,
                metadata.issuer.as_deref().unwrap_or("(no issuer)"),
                metadata.token_endpoint
            ));
        }
        let whose = if self.settings.subject_issuers.is_empty() {
            String::new()
        } else {
            format!(
                ", JWTs of {} only",
                self.settings.subject_issuers.join(", ")
            )
        };
        match &self.settings.token_endpoint {
            Some(url) => Ok(format!("token_exchange at {url} (configured){whose}")),
            None => {
                let (_, metadata) = self.manager(&key, None).await?;
                let Some(issuer) = metadata.issuer.as_deref() else {
                    return Err(OAuthError::Delegation(untrusted(server, "(no issuer)")));
                };
                if !trusted.iter().any(|t| same_issuer(t, issuer)) {
                    return Err(OAuthError::Delegation(untrusted(server, issuer)));
                }
                let endpoint = self.idp_token_endpoint(issuer).await?;
                Ok(format!(
                    "token_exchange at {endpoint} (the token endpoint of callers.jwt issuer \
                     {issuer}, which {server} names as its authorization server): JWTs of \
                     {issuer}{whose}"
                ))
            }
        }
    }

    /// Where a JWT of `jwt`'s issuer is exchanged: the configured
    /// `token_endpoint`, else its own issuer's token endpoint (from that
    /// issuer's metadata, never the document the server points to) when
    /// the server names that issuer as its authorization server. Returns
    /// the endpoint and the issuer it belongs to, when known.
    async fn exchange_endpoint(
        &self,
        key: &TokenKey,
        jwt: &SubjectToken,
    ) -> Result<(String, Option<String>), OAuthError> {
        if let Some(url) = &self.settings.token_endpoint {
            return Ok((url.to_string(), None));
        }
        let (_, metadata) = self.manager(key, None).await?;
        let named = metadata.issuer.as_deref().unwrap_or("(no issuer)");
        if !same_issuer(named, jwt.issuer()) {
            return Err(OAuthError::Delegation(DelegationError::new(
                DelegationFailure::UntrustedEndpoint,
                format!(
                    "{} names authorization server {named}, and the caller's JWT (issuer {}) \
                     is exchanged only at its own issuer's token endpoint or at a configured \
                     oauth.token_endpoint: nothing was sent",
                    self.settings.server_url,
                    jwt.issuer()
                ),
            )));
        }
        let endpoint = self.idp_token_endpoint(jwt.issuer()).await?;
        Ok((endpoint, Some(jwt.issuer().to_owned())))
    }

    /// RFC 8693: the caller's JWT exchanged at the configured or
    /// discovered token endpoint.
    async fn token_exchange(
        &self,
        key: &TokenKey,
        jwt: &SubjectToken,
        extra: &[String],
    ) -> Result<Secret, OAuthError> {
        let (endpoint, issuer) = self.exchange_endpoint(key, jwt).await?;
        let scopes: Vec<String> = if extra.is_empty() {
            self.settings.scopes.clone()
        } else {
            extra.to_vec()
        };
        let request = self.token_exchange_request(&endpoint, jwt.token(), &scopes)?;
        let secret = self.settings.client_secret.as_ref();
        let secrets = [jwt.token().expose(), secret.map_or("", Secret::expose)];
        let sent = TokenRequest {
            endpoint: &endpoint,
            request,
            secrets: &secrets,
            scopes,
            issuer,
        };
        self.send_token_request(key, sent, exchange_answer).await
    }

    /// The token-exchange request (RFC 8693 section 2.1).
    fn token_exchange_request(
        &self,
        endpoint: &str,
        subject_token: &Secret,
        scopes: &[String],
    ) -> Result<http::Request<Vec<u8>>, OAuthError> {
        let mut fields = vec![
            ("grant_type", TOKEN_EXCHANGE_GRANT.to_owned()),
            ("subject_token", subject_token.expose().to_owned()),
            (
                "subject_token_type",
                self.settings.subject_token_type.uri().to_owned(),
            ),
            ("requested_token_type", ACCESS_TOKEN_TYPE.to_owned()),
            ("resource", self.settings.server_url.to_string()),
        ];
        if let Some(audience) = &self.settings.audience {
            fields.push(("audience", audience.clone()));
        }
        if !scopes.is_empty() {
            fields.push(("scope", scopes.join(" ")));
        }
        self.token_request(endpoint, &fields)
    }

    /// SEP-990: the caller's JWT (an ID token of the identity provider)
    /// exchanged there for an ID-JAG, then at the server's authorization
    /// server for its token.
    async fn identity_assertion(
        &self,
        key: &TokenKey,
        jwt: &SubjectToken,
    ) -> Result<Secret, OAuthError> {
        let Some(idp) = &self.settings.identity_provider else {
            return Err(OAuthError::Settings(
                "identity_assertion needs an identity_provider".into(),
            ));
        };
        let token_endpoint = match &idp.token_endpoint {
            Some(url) => url.to_string(),
            None => self.idp_token_endpoint(&idp.issuer).await?,
        };
        let enterprise = EnterpriseIdp {
            issuer: idp.issuer.clone(),
            token_endpoint,
            client_id: idp.client_id.clone(),
            client_secret: idp.client_secret.clone(),
        };
        self.enterprise_token(key, &enterprise, jwt.token()).await
    }

    /// The identity provider's token endpoint, from its metadata (RFC
    /// 8414, then OpenID discovery), through the address rule.
    async fn idp_token_endpoint(&self, issuer: &str) -> Result<String, OAuthError> {
        let http = self.oauth_http()?;
        let base = issuer.trim_end_matches('/');
        let mut last = String::new();
        for path in [
            "/.well-known/oauth-authorization-server",
            "/.well-known/openid-configuration",
        ] {
            let url = format!("{base}{path}");
            let request = http::Request::builder()
                .method(http::Method::GET)
                .uri(&url)
                .header(http::header::ACCEPT, "application/json")
                .body(Vec::new())
                .map_err(|_| OAuthError::Discovery(format!("{url} is not a valid URI")))?;
            let response = http.send(request, false).await.map_err(|e| {
                OAuthError::Unreachable(format!("{url}: {}", root_cause(e.as_ref())))
            })?;
            if !response.status().is_success() {
                last = format!("{url} answered HTTP {}", response.status().as_u16());
                continue;
            }
            let metadata: serde_json::Value = serde_json::from_slice(response.body())
                .map_err(|_| OAuthError::Discovery(format!("{url} is not JSON")))?;
            if let Some(endpoint) = metadata.get("token_endpoint").and_then(|v| v.as_str()) {
                return Ok(endpoint.to_owned());
            }
            last = format!("{url} names no token_endpoint");
        }
        Err(OAuthError::Discovery(format!(
            "the identity provider's token endpoint: {last}"
        )))
    }
}

/// The refusal of a server whose authorization server `issuer` is no
/// `callers.jwt` issuer (`toolgate check`).
fn untrusted(server: &str, issuer: &str) -> DelegationError {
    DelegationError::new(
        DelegationFailure::UntrustedEndpoint,
        format!(
            "{server} names authorization server {issuer}, which is not a callers.jwt issuer: no \
             caller's JWT may be sent there; set oauth.token_endpoint (and subject_issuers) to \
             exchange elsewhere"
        ),
    )
}

/// Whether two issuer identifiers are the same (a trailing `/` aside).
fn same_issuer(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The answer of a token exchange: the token, or a refusal with the OAuth
/// error code (a 4xx), or unavailable (a 5xx), scrubbed of `secrets`.
fn exchange_answer(
    response: &http::Response<Vec<u8>>,
    secrets: &[&str],
) -> Result<OAuthTokenResponse, OAuthError> {
    let status = response.status();
    if status.is_server_error() {
        return Err(OAuthError::Delegation(DelegationError::new(
            DelegationFailure::Unavailable,
            format!("the token endpoint answered HTTP {}", status.as_u16()),
        )));
    }
    if !status.is_success() {
        let answer = serde_json::from_slice::<
            oauth2::StandardErrorResponse<oauth2::basic::BasicErrorResponseType>,
        >(response.body())
        .ok();
        let reason = answer
            .as_ref()
            .map_or_else(|| format!("HTTP {}", status.as_u16()), ToString::to_string);
        let mut error = DelegationError::new(
            DelegationFailure::Refused,
            format!(
                "the token endpoint refused the exchange: {}",
                scrubbed(reason, secrets)
            ),
        );
        error.code = answer.map(|a| oauth_code(a.error().as_ref()));
        return Err(OAuthError::Delegation(error));
    }
    serde_json::from_slice(response.body()).map_err(|_| {
        OAuthError::Delegation(DelegationError::new(
            DelegationFailure::Refused,
            "the token endpoint's answer is not a token response",
        ))
    })
}

/// An OAuth error code as the audit records it: the code when it is one
/// (RFC 6749 section 5.2: printable ASCII but `"` and `\`), at most 64
/// characters; else `invalid_error_code` (the server's text is not kept).
fn oauth_code(code: &str) -> String {
    let valid = !code.is_empty()
        && code.len() <= 64
        && code
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\');
    if valid {
        code.to_owned()
    } else {
        "invalid_error_code".to_owned()
    }
}

/// A delegation's failure as a [`DelegationError`] where it is one: the
/// authorization server unreachable is [`DelegationFailure::Unavailable`],
/// a refusal [`DelegationFailure::Refused`]; the store, the settings and
/// discovery keep their own errors.
fn as_delegation(error: OAuthError) -> OAuthError {
    match error {
        OAuthError::Unreachable(reason) => OAuthError::Delegation(DelegationError::new(
            DelegationFailure::Unavailable,
            format!("the token endpoint is unreachable: {reason}"),
        )),
        OAuthError::Refused(reason) => OAuthError::Delegation(DelegationError::new(
            DelegationFailure::Refused,
            format!("the exchange was refused: {reason}"),
        )),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use url::Url;

    use super::*;
    use crate::config::TokenEndpointAuth;
    use crate::credentials::oauth::testing::jwt;
    use crate::credentials::oauth::{MemoryStore, OAuthSettings};

    #[test]
    fn the_request_carries_rfc_8693_fields_and_the_client() {
        let mut settings = OAuthSettings::new(
            Url::parse("https://mcp.example/mcp").expect("url"),
            Grant::TokenExchange,
        );
        settings.audience = Some("crm".into());
        settings.scopes = vec!["tools".into()];
        settings.client_id = Some("gw".into());
        settings.client_secret = Some(Secret::new("s3cret"));
        settings.token_endpoint_auth = Some(TokenEndpointAuth::ClientSecretPost);
        let client = OAuthClient::new(settings, Arc::new(MemoryStore::new())).expect("valid");
        let subject = Secret::new("eyJh.caller.sig");
        let request = client
            .token_exchange_request("https://as.example/token", &subject, &["tools".into()])
            .expect("a request");
        let fields: HashMap<String, String> = url::form_urlencoded::parse(request.body())
            .into_owned()
            .collect();
        assert_eq!(fields["grant_type"], TOKEN_EXCHANGE_GRANT);
        assert_eq!(fields["subject_token"], "eyJh.caller.sig");
        assert_eq!(
            fields["subject_token_type"],
            "urn:ietf:params:oauth:token-type:jwt"
        );
        assert_eq!(fields["requested_token_type"], ACCESS_TOKEN_TYPE);
        assert_eq!(fields["resource"], "https://mcp.example/mcp");
        assert_eq!(fields["audience"], "crm");
        assert_eq!(fields["scope"], "tools");
        assert_eq!(fields["client_id"], "gw");
        assert_eq!(fields["client_secret"], "s3cret");
    }

    #[test]
    fn a_refusal_names_the_code_and_never_the_jwt() {
        let response = http::Response::builder()
            .status(400)
            .body(
                serde_json::json!({"error": "invalid_grant", "error_description": "bad eyJh.caller.sig"})
                    .to_string()
                    .into_bytes(),
            )
            .expect("a response");
        let Err(OAuthError::Delegation(error)) = exchange_answer(&response, &["eyJh.caller.sig"])
        else {
            panic!("not a refusal");
        };
        assert_eq!(error.kind, DelegationFailure::Refused);
        assert_eq!(error.code.as_deref(), Some("invalid_grant"));
        assert_eq!(error.audit_reason(), "invalid_grant");
        assert!(error.reason.contains("invalid_grant"), "{}", error.reason);
        assert!(!error.reason.contains("caller.sig"), "{}", error.reason);
        let down = http::Response::builder()
            .status(503)
            .body(Vec::new())
            .expect("a response");
        let Err(OAuthError::Delegation(error)) = exchange_answer(&down, &[]) else {
            panic!("not unavailable");
        };
        assert_eq!(error.kind, DelegationFailure::Unavailable);
    }

    #[test]
    fn identity_assertion_takes_only_its_idp_tokens() {
        let mut settings = OAuthSettings::new(
            Url::parse("https://mcp.example/mcp").expect("url"),
            Grant::IdentityAssertion,
        );
        settings.client_id = Some("gw".into());
        settings.identity_provider = Some(crate::config::IdentityProvider {
            issuer: "https://idp.example".into(),
            token_endpoint: None,
            client_id: "gw-at-idp".into(),
            client_secret: None,
        });
        let client = OAuthClient::new(settings, Arc::new(MemoryStore::new())).expect("valid");
        assert!(
            client
                .accepts_subject_token(&jwt(60, "https://idp.example/"))
                .is_ok()
        );
        let error = client
            .accepts_subject_token(&jwt(60, "https://other.example"))
            .expect_err("another issuer");
        assert_eq!(error.kind, DelegationFailure::IssuerMismatch);
        assert!(error.reason.contains("https://other.example"));
    }
}
