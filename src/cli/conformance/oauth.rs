//! The `auth/*` scenarios: every token comes from the gateway's OAuth client
//! ([`OAuthClient`]), consent is given headlessly (the authorization URL is
//! fetched the way a browser would, without following the final redirect,
//! and the `Location` callback handed to [`OAuthClient::complete`]), and the
//! MCP session sends the token with every request as
//! [`OAuthClient::resource_auth`] says (`Authorization: Bearer`, or
//! `Authorization: DPoP` with a proof for a DPoP-bound token): a request
//! refused with a challenge (401, or 403 `insufficient_scope`) is answered
//! by [`OAuthClient::refused`] (refresh, new consent or bounded step-up) and
//! resent once; one refused with `use_dpop_nonce` is resent once with the
//! resource server's nonce ([`learn_resource_nonce`]).
//!
//! The `auth/dpop*` scenarios turn on [`OAuthSettings::dpop`];
//! `auth/wif-jwt-bearer` uses the context's `valid_jwt` as the workload's
//! assertion ([`OAuthSettings::jwt_bearer_assertion`]).

use std::borrow::Cow;
use std::sync::Arc;

use anyhow::{Context, bail};
use http::{HeaderName, HeaderValue};
use rmcp::model::ProtocolVersion;
use rmcp::service::{ClientLifecycleMode, RoleClient};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use serde_json::Value;
use url::Url;

use super::flow::synthetic_arguments;
use super::{Scenario, initialize_version};
use crate::config::{Grant, Secret, TokenEndpointAuth};
use crate::credentials::dpop::{is_use_dpop_nonce, learn_resource_nonce};
use crate::credentials::oauth::{
    EnterpriseIdp, MemoryStore, OAuthClient, OAuthError, OAuthSettings, WorkloadAssertion,
    parse_algorithm,
};
use crate::state::TokenKey;
use crate::upstream::http_layer::{Attempt, Body, Headers, HttpError, HttpLayer, Layered, Request};

/// The redirect URI registered by the conformance client (never served:
/// the callback is read from the `Location` header).
const REDIRECT_URI: &str = "http://localhost:3000/callback";

/// The client ID metadata document URL the suite expects.
const CLIENT_METADATA_URL: &str = "https://conformance-test.local/client-metadata.json";

/// Runs an `auth/*` scenario against `url`.
pub(super) async fn run(url: &str, scenario: &Scenario) -> anyhow::Result<()> {
    let context = &scenario.context;
    let text = |name: &str| context.get(name).and_then(Value::as_str).map(str::to_owned);
    let server_url = Url::parse(url).context("the scenario URL")?;
    let name = scenario.name.as_str();
    let enterprise = matches!(
        name,
        "auth/enterprise-managed-authorization" | "auth/cross-app-access-complete-flow"
    );
    let workload = name == "auth/wif-jwt-bearer";
    let grant = if name.starts_with("auth/client-credentials-") || workload {
        Grant::ClientCredentials
    } else {
        Grant::AuthorizationCode
    };
    let mut settings = OAuthSettings::new(server_url, grant);
    settings.allow_private_addresses = true;
    settings.redirect_uri = Some(REDIRECT_URI.to_owned());
    settings.client_metadata_url = Some(CLIENT_METADATA_URL.to_owned());
    settings.client_name = "toolgate-conformance".to_owned();
    settings.client_id = text("client_id");
    settings.client_secret = text("client_secret").map(Secret::new);
    if let Some(pem) = text("private_key_pem") {
        settings.private_key = Some(Secret::new(pem));
        settings.token_endpoint_auth = Some(TokenEndpointAuth::PrivateKeyJwt);
        settings.signing_algorithm = text("signing_algorithm")
            .as_deref()
            .and_then(parse_algorithm);
    } else if (grant == Grant::ClientCredentials && !workload) || enterprise {
        settings.token_endpoint_auth = Some(TokenEndpointAuth::ClientSecretBasic);
    }
    settings.dpop = name.starts_with("auth/dpop");
    if workload {
        let assertion = text("valid_jwt").context("context.valid_jwt")?;
        settings.jwt_bearer_assertion = Some(WorkloadAssertion::Value(Secret::new(assertion)));
    }
    let oauth = Arc::new(OAuthClient::new(settings, Arc::new(MemoryStore::new()))?);
    let key = TokenKey::tenant_wide("conformance", "conformance");

    if enterprise {
        let idp = EnterpriseIdp {
            issuer: text("idp_issuer").context("context.idp_issuer")?,
            token_endpoint: text("idp_token_endpoint").context("context.idp_token_endpoint")?,
            client_id: text("idp_client_id").context("context.idp_client_id")?,
            client_secret: None,
        };
        let id_token = Secret::new(text("idp_id_token").context("context.idp_id_token")?);
        oauth.enterprise_token(&key, &idp, &id_token).await?;
        tracing::info!("enterprise-managed token obtained");
    }

    let http = OAuthHttp {
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?,
        oauth,
        key,
    };
    let transport = StreamableHttpClientTransport::with_client(
        Layered::new(Arc::new(http.client.clone()), http),
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    let mode = if scenario.stateless() {
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        }
    } else {
        ClientLifecycleMode::Initialize
    };
    let mut info = rmcp::model::ClientConfig::default();
    info.protocol_version = initialize_version(scenario);
    let service = rmcp::service::serve_client_with_lifecycle_and_ct(
        info,
        transport,
        mode,
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .context("connecting")?;
    let result = exercise(service.peer()).await;
    let _ = service.cancel().await;
    result
}

/// Lists the tools and calls each (a refused call is logged: the
/// scenarios judge the authorization, not the tools).
async fn exercise(peer: &rmcp::service::Peer<RoleClient>) -> anyhow::Result<()> {
    let tools = peer.list_all_tools().await.context("tools/list")?;
    tracing::info!(tools = tools.len(), "listed");
    for tool in &tools {
        let params = rmcp::model::CallToolRequestParams::new(tool.name.clone())
            .with_arguments(synthetic_arguments(tool));
        match peer.call_tool(params).await {
            Ok(_) => tracing::info!(tool = %tool.name, "called"),
            Err(error) => tracing::warn!(tool = %tool.name, %error, "call failed"),
        }
    }
    Ok(())
}

/// The session's HTTP client: the OAuth client's token on every request.
#[derive(Clone, Debug)]
struct OAuthHttp {
    client: reqwest::Client,
    oauth: Arc<OAuthClient>,
    key: TokenKey,
}

impl OAuthHttp {
    /// The token to send: none before any grant (the server's 401
    /// challenge then drives discovery), else the client's.
    async fn token(&self) -> Result<Option<Secret>, OAuthError> {
        if self
            .oauth
            .store()
            .load_credentials(&self.key)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        match self.oauth.access_token(&self.key).await {
            Err(OAuthError::AuthorizationRequired { url }) => self.consent(&url).await.map(Some),
            other => other.map(Some),
        }
    }

    /// A better token after `refused` drew `challenge`.
    async fn refused(
        &self,
        refused: Option<&Secret>,
        challenge: &str,
    ) -> Result<Secret, OAuthError> {
        let none = Secret::new("");
        match self
            .oauth
            .refused(&self.key, refused.unwrap_or(&none), Some(challenge))
            .await
        {
            Err(OAuthError::AuthorizationRequired { url }) => self.consent(&url).await,
            other => other,
        }
    }

    /// Consents headlessly at `url` and returns the token it yields.
    async fn consent(&self, url: &str) -> Result<Secret, OAuthError> {
        let callback = headless_authorize(&self.client, url)
            .await
            .map_err(|e| OAuthError::Callback(format!("{e:#}")))?;
        self.oauth.complete(&callback, false).await?;
        self.oauth.access_token(&self.key).await
    }

    /// The bearer token for rmcp to send, or (a DPoP-bound token) none
    /// and the `Authorization` and `DPoP` headers added to `headers`.
    async fn present(
        &self,
        token: Option<&Secret>,
        method: &http::Method,
        uri: &str,
        headers: &Headers,
    ) -> Result<(Option<String>, Headers), OAuthError> {
        let mut headers = headers.clone();
        let Some(token) = token else {
            return Ok((None, headers));
        };
        let auth = self
            .oauth
            .resource_auth(&self.key, token, method.as_str(), uri)
            .await?;
        if auth.dpop.is_none() {
            return Ok((Some(token.expose().to_owned()), headers));
        }
        headers.extend(auth.headers());
        Ok((None, headers))
    }

    /// Reads the nonce the server asked for (rmcp's client drops the
    /// 401's `DPoP-Nonce`) and keeps it for the next proofs.
    async fn learn_nonce(
        &self,
        uri: &str,
        token: &Secret,
        session_id: Option<&str>,
        headers: &Headers,
    ) {
        let auth = match self
            .oauth
            .resource_auth(&self.key, token, "POST", uri)
            .await
        {
            Ok(auth) => auth,
            Err(error) => {
                tracing::warn!(%error, "DPoP proof");
                return;
            }
        };
        let mut extra: Vec<(HeaderName, HeaderValue)> = headers
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        if let Some(id) = session_id.and_then(|id| HeaderValue::from_str(id).ok()) {
            extra.push((HeaderName::from_static("mcp-session-id"), id));
        }
        match learn_resource_nonce(&self.client, uri, &auth, &extra).await {
            Some(nonce) => self.oauth.resource_nonce(uri, &nonce),
            None => tracing::warn!("the server asked for a DPoP nonce and sent none"),
        }
    }
}

impl HttpLayer for OAuthHttp {
    /// Sends with the token; on a challenge, once more with a better
    /// one; on `use_dpop_nonce`, once more with the server's nonce.
    async fn send<M: Body, T: Send>(
        &self,
        request: Request<'_, M>,
        attempt: impl Attempt<M, T>,
    ) -> Result<T, HttpError> {
        let Request {
            method,
            uri,
            session_id,
            message,
            headers,
            ..
        } = request;
        let headers = &headers;
        let mut token = self.token().await.map_err(refusal)?;
        let (mut nonce_asked, mut refused) = (false, false);
        loop {
            let (bearer, sent) = self
                .present(token.as_ref(), &method, uri, headers)
                .await
                .map_err(refusal)?;
            let result = attempt(message.clone(), bearer, sent).await;
            let challenge = match &result {
                Err(StreamableHttpError::AuthRequired(e)) => e.www_authenticate_header.clone(),
                Err(StreamableHttpError::InsufficientScope(e)) => e.www_authenticate_header.clone(),
                _ => return result,
            };
            if let Some(current) = &token
                && !nonce_asked
                && self.oauth.dpop().is_some()
                && is_use_dpop_nonce(&challenge)
            {
                nonce_asked = true;
                self.learn_nonce(uri, current, session_id, headers).await;
                continue;
            }
            if refused {
                return result;
            }
            refused = true;
            token = Some(
                self.refused(token.as_ref(), &challenge)
                    .await
                    .map_err(refusal)?,
            );
        }
    }
}

fn refusal(error: OAuthError) -> HttpError {
    tracing::warn!(%error, "OAuth");
    StreamableHttpError::UnexpectedServerResponse(Cow::Owned(error.to_string()))
}

/// Follows the authorization URL like a browser whose user consents,
/// stopping at the redirect to the client: its `Location` is the
/// callback URL.
async fn headless_authorize(client: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let response = client
        .get(url)
        .send()
        .await
        .context("the authorization request")?;
    let Some(location) = response.headers().get(http::header::LOCATION) else {
        bail!(
            "the authorization endpoint answered {} without a redirect",
            response.status()
        );
    };
    let location = location.to_str().context("the redirect location")?;
    Ok(Url::parse(url)?.join(location)?.to_string())
}
