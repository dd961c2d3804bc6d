//! The RFC 7523 JWT-bearer grant for a workload's own assertion, which
//! rmcp 3.11 lacks: the request is built here and sent through
//! [`OAuthHttp`](crate::credentials::dpop::OAuthHttp) (the address rule; a DPoP proof when on).

use oauth2::TokenResponse as _;
use rmcp::transport::auth::OAuthTokenResponse;

use super::freshness::obtained;
use super::{OAuthClient, OAuthError, WorkloadAssertion, root_cause, scrubbed};
use crate::config::{Secret, TokenEndpointAuth};
use crate::state::TokenKey;

/// The RFC 7523 section 2.1 grant type.
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

impl OAuthClient {
    /// A token from the JWT-bearer grant (RFC 7523 section 2.1) with the
    /// workload's `assertion`, at the token endpoint discovery finds, for
    /// the configured scopes (else rmcp's selection; `extra` on step-up)
    /// and the server as `resource`. rmcp 3.11 sends this grant only inside
    /// its enterprise flow (for an ID-JAG it obtained itself), and oauth2
    /// has no request for it: the form is built here, sent through
    /// [`OAuthHttp`](crate::credentials::dpop::OAuthHttp) (the address rule; a DPoP proof when on), and the
    /// answer read as oauth2's token or error response. A refusal is final
    /// (no retry, no other grant).
    pub(super) async fn jwt_bearer(
        &self,
        key: &TokenKey,
        challenge: Option<&str>,
        extra: &[String],
        assertion: &WorkloadAssertion,
    ) -> Result<Secret, OAuthError> {
        let (manager, metadata) = self.manager(key, challenge).await?;
        let scopes = self.grant_scopes(&manager, extra);
        let assertion = assertion_value(assertion).await?;
        let secret = self.settings.client_secret.as_ref();
        let secrets = [assertion.expose(), secret.map_or("", Secret::expose)];
        let request = self.jwt_bearer_request(&metadata.token_endpoint, &assertion, &scopes)?;
        let sent = TokenRequest {
            endpoint: &metadata.token_endpoint,
            request,
            secrets: &secrets,
            scopes,
            issuer: metadata.issuer.clone(),
        };
        let access = self.send_token_request(key, sent, token_answer).await?;
        tracing::info!(tenant = %key.tenant, server = %key.server, "OAuth JWT-bearer token obtained");
        self.event(key, "token_issued");
        Ok(access)
    }

    /// Sends a token request built here (JWT-bearer, token exchange)
    /// through [`OAuthHttp`](crate::credentials::dpop::OAuthHttp) (the
    /// address rule; a DPoP proof when on), reads the answer with `answer`,
    /// and keeps the token under `key` (with the scopes granted, else those
    /// asked for, bound to the issuer). Texts are scrubbed of `secrets`.
    ///
    /// # Errors
    /// The endpoint is unreachable ([`OAuthError::Unreachable`]), `answer`'s
    /// refusal, or the store.
    pub(super) async fn send_token_request(
        &self,
        key: &TokenKey,
        sent: TokenRequest<'_>,
        answer: AnswerReader,
    ) -> Result<Secret, OAuthError> {
        let http = self.oauth_http()?;
        http.add_token_endpoint(sent.endpoint);
        let response = http
            .send(sent.request, false)
            .await
            .map_err(|e| OAuthError::Unreachable(scrubbed(root_cause(e.as_ref()), sent.secrets)))?;
        let token = answer(&response, sent.secrets)?;
        let granted = token
            .scopes()
            .map(|s| s.iter().map(|s| s.to_string()).collect())
            .unwrap_or(sent.scopes);
        let access = Secret::new(token.access_token().secret());
        let stored = obtained(
            self.settings.client_id.clone().unwrap_or_default(),
            token,
            granted,
            sent.issuer,
        );
        self.store.save_grant(key, stored).await?;
        Ok(access)
    }

    /// The JWT-bearer token request (RFC 7523 section 2.1): the grant, the
    /// assertion, `scope` when there are scopes, `resource`, and the
    /// client's authentication (its secret, Basic unless `token_endpoint_auth`
    /// says post; else its `client_id`, if any).
    fn jwt_bearer_request(
        &self,
        token_endpoint: &str,
        assertion: &Secret,
        scopes: &[String],
    ) -> Result<http::Request<Vec<u8>>, OAuthError> {
        let mut fields = vec![
            ("grant_type", JWT_BEARER_GRANT.to_owned()),
            ("assertion", assertion.expose().to_owned()),
        ];
        if !scopes.is_empty() {
            fields.push(("scope", scopes.join(" ")));
        }
        fields.push(("resource", self.settings.server_url.to_string()));
        self.token_request(token_endpoint, &fields)
    }

    /// A form POST to `token_endpoint` with `fields` and the client's
    /// authentication (its secret, Basic unless `token_endpoint_auth` says
    /// post; else its `client_id`, if any): what the grants oauth2 has no
    /// request for (JWT bearer, token exchange) send.
    pub(super) fn token_request(
        &self,
        token_endpoint: &str,
        fields: &[(&str, String)],
    ) -> Result<http::Request<Vec<u8>>, OAuthError> {
        let secret = self.settings.client_secret.as_ref();
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in fields {
            form.append_pair(name, value);
        }
        let mut request = http::Request::builder()
            .method(http::Method::POST)
            .uri(token_endpoint)
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(http::header::ACCEPT, "application/json");
        match (&self.settings.client_id, secret) {
            (Some(id), Some(secret))
                if self.settings.token_endpoint_auth
                    == Some(TokenEndpointAuth::ClientSecretPost) =>
            {
                form.append_pair("client_id", id)
                    .append_pair("client_secret", secret.expose());
            }
            (Some(id), Some(secret)) => {
                request = request.header(http::header::AUTHORIZATION, basic(id, secret)?);
            }
            (Some(id), None) => {
                form.append_pair("client_id", id);
            }
            (None, _) => {}
        }
        request
            .body(form.finish().into_bytes())
            .map_err(|_| OAuthError::Discovery("the token endpoint is not a valid URI".into()))
    }
}

/// The workload's assertion: the configured value, or the file's content
/// now (trimmed).
async fn assertion_value(assertion: &WorkloadAssertion) -> Result<Secret, OAuthError> {
    Ok(match assertion {
        WorkloadAssertion::Value(value) => value.clone(),
        WorkloadAssertion::File(path) => Secret::new(
            tokio::fs::read_to_string(path)
                .await
                .map_err(|e| {
                    OAuthError::Settings(format!(
                        "the workload assertion {} cannot be read: {e}",
                        path.display()
                    ))
                })?
                .trim(),
        ),
    })
}

/// The token endpoint's answer read as oauth2's token response, or its
/// error response (else the status) as a refusal scrubbed of `secrets`.
/// A token request built here, about to be sent.
pub(super) struct TokenRequest<'a> {
    /// The token endpoint it goes to.
    pub(super) endpoint: &'a str,
    /// The request.
    pub(super) request: http::Request<Vec<u8>>,
    /// What its texts are scrubbed of (the assertion or subject token, the
    /// client secret).
    pub(super) secrets: &'a [&'a str],
    /// The scopes asked for (kept when the answer names none).
    pub(super) scopes: Vec<String>,
    /// The issuer the token is bound to, when known.
    pub(super) issuer: Option<String>,
}

/// Reads a token endpoint's answer into a token response, or the grant's
/// own error.
pub(super) type AnswerReader =
    fn(&http::Response<Vec<u8>>, &[&str]) -> Result<OAuthTokenResponse, OAuthError>;

fn token_answer(
    response: &http::Response<Vec<u8>>,
    secrets: &[&str],
) -> Result<OAuthTokenResponse, OAuthError> {
    if !response.status().is_success() {
        let reason = serde_json::from_slice::<
            oauth2::StandardErrorResponse<oauth2::basic::BasicErrorResponseType>,
        >(response.body())
        .map_or_else(
            |_| format!("HTTP {}", response.status().as_u16()),
            |e| e.to_string(),
        );
        return Err(OAuthError::Refused(scrubbed(reason, secrets)));
    }
    serde_json::from_slice(response.body())
        .map_err(|_| OAuthError::Refused("the token response is malformed".into()))
}

/// The `Authorization: Basic` value of client `id` with `secret` (RFC 6749
/// section 2.3.1: both form-encoded, then Basic), marked sensitive.
fn basic(id: &str, secret: &Secret) -> Result<http::HeaderValue, OAuthError> {
    use base64::Engine as _;

    let encode = |v: &str| url::form_urlencoded::byte_serialize(v.as_bytes()).collect();
    let (id, secret): (String, String) = (encode(id), encode(secret.expose()));
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"));
    let mut value = http::HeaderValue::from_str(&format!("Basic {basic}"))
        .map_err(|_| OAuthError::Settings("the client credentials are not ASCII".into()))?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use url::Url;

    use super::*;
    use crate::credentials::oauth::testing::{jwt_claims, workload_settings};
    use crate::credentials::oauth::{MemoryStore, OAuthStore};

    fn form(request: &http::Request<Vec<u8>>) -> HashMap<String, String> {
        url::form_urlencoded::parse(request.body())
            .into_owned()
            .collect()
    }

    #[test]
    fn the_jwt_bearer_request_carries_the_assertion_and_the_client() {
        let store: Arc<dyn OAuthStore> = Arc::new(MemoryStore::new());
        let assertion = Secret::new("eyJhbGciOiJFUzI1NiJ9.e30.sig");
        let token = "https://as.example/token";
        let public = OAuthClient::new(workload_settings(), store.clone()).expect("valid");
        let request = public
            .jwt_bearer_request(token, &assertion, &["files.read".into()])
            .expect("a request");
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(request.uri(), token);
        let fields = form(&request);
        assert_eq!(fields["grant_type"], JWT_BEARER_GRANT);
        assert_eq!(fields["assertion"], assertion.expose());
        assert_eq!(fields["scope"], "files.read");
        assert_eq!(fields["resource"], "https://mcp.example/mcp");
        assert_eq!(fields["client_id"], "workload");
        assert!(request.headers().get(http::header::AUTHORIZATION).is_none());

        let mut settings = workload_settings();
        settings.client_secret = Some(Secret::new("s3cr:et"));
        let basic = OAuthClient::new(settings.clone(), store.clone()).expect("valid");
        let request = basic
            .jwt_bearer_request(token, &assertion, &[])
            .expect("a request");
        let fields = form(&request);
        assert!(!fields.contains_key("scope") && !fields.contains_key("client_id"));
        assert_eq!(
            request.headers()[http::header::AUTHORIZATION],
            "Basic d29ya2xvYWQ6czNjciUzQWV0"
        );

        settings.token_endpoint_auth = Some(TokenEndpointAuth::ClientSecretPost);
        let post = OAuthClient::new(settings, store).expect("valid");
        let request = post
            .jwt_bearer_request(token, &assertion, &[])
            .expect("a request");
        let fields = form(&request);
        assert_eq!(fields["client_id"], "workload");
        assert_eq!(fields["client_secret"], "s3cr:et");
    }

    /// What the test authorization server saw at its token endpoint: the
    /// form and the DPoP proof of each request.
    type Seen = Arc<Mutex<Vec<(HashMap<String, String>, Option<String>)>>>;

    /// An MCP server's protected resource metadata and an authorization
    /// server in one process, whose token endpoint asks for a DPoP nonce
    /// once, then answers `token` (JSON) with status `status`.
    async fn test_authorization_server(status: u16, token: serde_json::Value) -> (Url, Seen) {
        use axum::routing::{get, post};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let base = format!("http://{}", listener.local_addr().expect("an address"));
        let seen: Seen = Arc::default();
        let json = |value: serde_json::Value| {
            (
                [(http::header::CONTENT_TYPE, "application/json")],
                value.to_string(),
            )
        };
        let prm = serde_json::json!({
            "resource": format!("{base}/mcp"),
            "authorization_servers": [base.clone()],
        });
        let metadata = serde_json::json!({
            "issuer": base.clone(),
            "authorization_endpoint": format!("{base}/authorize"),
            "token_endpoint": format!("{base}/token"),
            "response_types_supported": ["code"],
            "grant_types_supported": [JWT_BEARER_GRANT],
            "token_endpoint_auth_methods_supported": ["none"],
            "dpop_signing_alg_values_supported": ["ES256"],
        });
        let recorded = seen.clone();
        let router = axum::Router::new()
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(move || async move { json(prm) }),
            )
            .route(
                "/.well-known/oauth-authorization-server",
                get(move || async move { json(metadata) }),
            )
            .route(
                "/token",
                post(move |headers: http::HeaderMap, body: String| async move {
                    let form = url::form_urlencoded::parse(body.as_bytes())
                        .into_owned()
                        .collect();
                    let proof = headers
                        .get("dpop")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let first = {
                        let mut seen = recorded.lock().expect("lock");
                        seen.push((form, proof));
                        seen.len() == 1
                    };
                    let (status, nonce, body) = if first {
                        let error = serde_json::json!({"error": "use_dpop_nonce"});
                        (400, "as-nonce", error)
                    } else {
                        (status, "as-nonce-2", token)
                    };
                    (
                        http::StatusCode::from_u16(status).expect("a status"),
                        [
                            (http::header::CONTENT_TYPE, "application/json"),
                            (http::HeaderName::from_static("dpop-nonce"), nonce),
                        ],
                        body.to_string(),
                    )
                }),
            );
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        (Url::parse(&format!("{base}/mcp")).expect("url"), seen)
    }

    /// A DPoP workload client of the MCP server at `url` (on a loopback
    /// address: allowed or not), over a store of its own.
    fn dpop_workload_client(url: &Url, allow_private_addresses: bool) -> OAuthClient {
        let mut settings = workload_settings();
        settings.server_url = url.clone();
        settings.allow_private_addresses = allow_private_addresses;
        settings.dpop = true;
        OAuthClient::new(settings, Arc::new(MemoryStore::new())).expect("valid settings")
    }

    #[tokio::test]
    async fn a_workload_assertion_buys_a_dpop_bound_token() {
        let (url, seen) = test_authorization_server(
            200,
            serde_json::json!({
                "access_token": "at-wif",
                "token_type": "DPoP",
                "expires_in": 3600,
            }),
        )
        .await;
        let client = dpop_workload_client(&url, true);
        let key = TokenKey::tenant_wide("t", "s");
        let token = client.access_token(&key).await.expect("a token");
        assert_eq!(token.expose(), "at-wif");

        let seen = seen.lock().expect("lock").clone();
        assert_eq!(seen.len(), 2, "one retry for the nonce");
        let token_endpoint = url.join("/token").expect("url").to_string();
        for (i, (fields, proof)) in seen.iter().enumerate() {
            assert_eq!(fields["grant_type"], JWT_BEARER_GRANT);
            assert_eq!(fields["assertion"], "eyJhbGciOiJFUzI1NiJ9.e30.sig");
            assert_eq!(fields["client_id"], "workload");
            assert_eq!(fields["resource"], url.as_str());
            let claims = jwt_claims(proof.as_deref().expect("a proof"));
            assert_eq!(claims["htm"], "POST");
            assert_eq!(claims["htu"], token_endpoint.as_str());
            assert!(claims.get("ath").is_none());
            if i == 0 {
                assert!(claims.get("nonce").is_none());
            } else {
                assert_eq!(claims["nonce"], "as-nonce");
            }
        }
        // Kept for the next token request, and the token goes as DPoP.
        let dpop = client.dpop().expect("DPoP on");
        assert_eq!(dpop.nonce(&token_endpoint).as_deref(), Some("as-nonce-2"));
        let auth = client
            .resource_auth(&key, &token, "POST", url.as_str())
            .await
            .expect("auth");
        assert_eq!(auth.authorization.expose(), "DPoP at-wif");
        // Still fresh: no further request.
        assert_eq!(
            client.access_token(&key).await.expect("a token").expose(),
            "at-wif"
        );
    }

    #[tokio::test]
    async fn a_refused_assertion_is_final_and_scrubbed() {
        let (url, seen) = test_authorization_server(
            400,
            serde_json::json!({
                "error": "invalid_grant",
                "error_description": "assertion eyJhbGciOiJFUzI1NiJ9.e30.sig expired",
            }),
        )
        .await;
        let client = dpop_workload_client(&url, true);
        let key = TokenKey::tenant_wide("t", "s");
        let error = client.access_token(&key).await.expect_err("refused");
        let OAuthError::Refused(text) = &error else {
            panic!("not a refusal: {error:?}");
        };
        assert!(text.contains("invalid_grant"), "{text}");
        assert!(!text.contains("e30.sig"), "{text}");
        assert_eq!(seen.lock().expect("lock").len(), 2);
    }

    #[tokio::test]
    async fn the_address_rule_holds_for_dpop_clients() {
        let (url, _seen) = test_authorization_server(200, serde_json::json!({})).await;
        let client = dpop_workload_client(&url, false);
        let key = TokenKey::tenant_wide("t", "s");
        let error = client.access_token(&key).await.expect_err("refused");
        assert!(
            error.to_string().contains("private or reserved address"),
            "{error}"
        );
    }
}
