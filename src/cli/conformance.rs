//! `toolgate conformance-client URL` (hidden): drives the gateway's own
//! upstream session code ([`crate::upstream`], as `serve` uses it) through
//! the client scenarios of the official `@modelcontextprotocol/conformance`
//! suite (see `conformance/run.sh`).
//!
//! The suite's contract: the scenario server's URL is the last argument;
//! `MCP_CONFORMANCE_SCENARIO` names the scenario, `MCP_CONFORMANCE_CONTEXT`
//! carries JSON extras (e.g. `toolCalls`), and
//! `MCP_CONFORMANCE_PROTOCOL_VERSION` (0.2.x suites only) selects the
//! revision: a stateful one (the `initialize` lifecycle) or `2026-07-28`
//! (stateless: `server/discover`, per-request `_meta`). Exit 0 when the
//! scenario's flow completed. Logs go to stderr only.
//!
//! The session is the gateway's: its HTTP transport, lifecycle and tool
//! listing ([`crate::upstream::connect_with`]) and [`Session::call`]. The
//! only additions are opt-in: elicitations are answered (accepted with the
//! schema's defaults), and in the stateless revision `input_required`
//! results (SEP-2322) are answered and retried over the session's rmcp peer,
//! which the gateway's own calls refuse.
//!
//! The `auth/*` scenarios go through the gateway's OAuth client
//! ([`crate::credentials::oauth`]): see [`oauth`].

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, GetPromptRequestParams,
    GetPromptResponse, InputRequest, InputRequiredResult, InputResponses, JsonObject,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, Tool,
};
use serde_json::{Value, json};

use crate::config::{Config, Lifecycle, ProcessEnv, ServerConfig};
use crate::upstream::{self, Label, Session, SessionOptions};

/// Protocol revisions with the `initialize` lifecycle.
const STATEFUL_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Bound on each tool call (the suite gives a whole scenario 20 s by default).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Most `input_required` rounds driven for one request.
const MAX_INPUT_ROUNDS: usize = 8;

/// What the suite asks for, from the environment.
#[derive(Debug)]
struct Scenario {
    name: String,
    /// `MCP_CONFORMANCE_PROTOCOL_VERSION`, if set.
    version: Option<String>,
    /// `MCP_CONFORMANCE_CONTEXT`, parsed (`{}` when unset).
    context: Value,
}

impl Scenario {
    fn from_env() -> anyhow::Result<Self> {
        let name = std::env::var("MCP_CONFORMANCE_SCENARIO")
            .context("MCP_CONFORMANCE_SCENARIO is not set")?;
        let version = std::env::var("MCP_CONFORMANCE_PROTOCOL_VERSION")
            .ok()
            .filter(|v| !v.is_empty());
        let context = match std::env::var("MCP_CONFORMANCE_CONTEXT") {
            Ok(text) if !text.trim().is_empty() => {
                serde_json::from_str(&text).context("MCP_CONFORMANCE_CONTEXT is not valid JSON")?
            }
            _ => json!({}),
        };
        Ok(Self {
            name,
            version,
            context,
        })
    }

    /// Whether the revision is stateless (no `initialize`): any version the
    /// suite names that is not one of the stateful ones.
    fn stateless(&self) -> bool {
        self.version
            .as_deref()
            .is_some_and(|v| !STATEFUL_VERSIONS.contains(&v))
    }
}

/// Runs the scenario named in the environment against the server at `url`.
///
/// # Errors
/// The environment is incomplete, the scenario is unknown, or any step of
/// its flow fails.
pub async fn run(url: &str) -> anyhow::Result<()> {
    let scenario = Scenario::from_env()?;
    let stateless = scenario.stateless();
    tracing::info!(
        scenario = %scenario.name,
        version = scenario.version.as_deref().unwrap_or("(unset)"),
        stateless,
        "conformance client"
    );
    if scenario.name.starts_with("auth/") {
        return oauth::run(url, &scenario).await;
    }
    let flow = Flow::for_scenario(&scenario.name)
        .ok_or_else(|| anyhow!("unsupported scenario `{}`", scenario.name))?;

    let (server, max_result_bytes) = server_config(url, stateless)?;
    let label = Label {
        tenant: "conformance".to_owned(),
        server: server.name.clone(),
    };
    let connected = upstream::connect_with(
        &server,
        &label,
        &ProcessEnv,
        max_result_bytes,
        &crate::credentials::Redactor::default().shared(),
        SessionOptions {
            elicitation_defaults: true,
            initialize_version: (!stateless).then(|| initialize_version(&scenario)),
            ..SessionOptions::default()
        },
    )
    .await
    .context("connecting")?;
    tracing::info!(
        tools = ?connected.tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>(),
        "connected"
    );
    let client = Client {
        session: &connected.session,
        stateless,
    };
    let result = flow.run(&client, &connected.tools, &scenario.context).await;
    connected.session.close().await;
    result
}

/// The `protocolVersion` `initialize` asks for: the one the suite names,
/// else the newest revision that has `initialize` (rmcp 3.11 would ask for
/// its newest, 2026-07-28, which has none; the 0.1.x suite rejects that).
fn initialize_version(scenario: &Scenario) -> ProtocolVersion {
    ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .find(|known| Some(known.as_str()) == scenario.version.as_deref())
        .cloned()
        .unwrap_or(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// The server's configuration, as the gateway would read it from its file:
/// one HTTP server, `initialize` or `discover` by the revision.
fn server_config(url: &str, stateless: bool) -> anyhow::Result<(ServerConfig, usize)> {
    let lifecycle = if stateless { "discover" } else { "initialize" };
    // JSON strings are YAML strings: the URL needs no further escaping.
    let yaml = format!(
        "tenants:\n  - name: conformance\n    tokens: [\"conformance-client\"]\n    servers:\n      \
         - name: conformance\n        url: {url}\n        lifecycle: {lifecycle}\n        \
         connect_timeout: 15s\n        call_timeout: 15s\n",
        url = serde_json::to_string(url)?,
    );
    let mut config = Config::from_yaml(&yaml, "<conformance-client>", Path::new("."), &ProcessEnv)
        .map_err(|e| anyhow!("{e}"))?;
    let max_result_bytes = config.limits.max_result_bytes;
    let server = config
        .tenants
        .pop()
        .and_then(|mut t| t.servers.pop())
        .context("the generated configuration has no server")?;
    debug_assert_eq!(
        server.lifecycle,
        if stateless {
            Lifecycle::Discover
        } else {
            Lifecycle::Initialize
        }
    );
    Ok((server, max_result_bytes))
}

/// A scenario's flow after connecting (which already listed the tools).
#[derive(Debug, Clone, Copy)]
enum Flow {
    /// Nothing more: the handshake and the listing are the test.
    ConnectOnly,
    /// Call `add_numbers` (else the first tool) with `{a: 5, b: 3}`.
    AddNumbers,
    /// Call one named tool with `{}`.
    CallNamed(&'static str),
    /// Call every tool with `{}`.
    CallEveryEmpty,
    /// Call every tool with synthetic arguments; stateless: also read every
    /// resource and get every prompt.
    StandardHeaders,
    /// Call every tool with synthetic arguments.
    CallEverySynthetic,
    /// Call the tools of `context.toolCalls` with their arguments.
    ContextToolCalls,
    /// Send `json_schema_2020_12_tool`'s input schema to `json_schema_echo`.
    SchemaEcho,
}

impl Flow {
    fn for_scenario(name: &str) -> Option<Self> {
        Some(match name {
            "initialize" | "request-metadata" | "json-schema-ref-no-deref" => Flow::ConnectOnly,
            // SEP-2640 skills extension: unsupported, so never `skills/list`.
            n if n.starts_with("sep-2640-client-") => Flow::ConnectOnly,
            "tools_call" => Flow::AddNumbers,
            "elicitation-sep1034-client-defaults" => {
                Flow::CallNamed("test_client_elicitation_defaults")
            }
            "sse-retry" => Flow::CallNamed("test_reconnection"),
            "sep-2322-client-request-state" => Flow::CallEveryEmpty,
            "http-standard-headers" => Flow::StandardHeaders,
            "http-invalid-tool-headers" => Flow::CallEverySynthetic,
            "http-custom-headers" => Flow::ContextToolCalls,
            "json-schema-2020-12-preservation" => Flow::SchemaEcho,
            _ => return None,
        })
    }

    async fn run(self, client: &Client<'_>, tools: &[Tool], context: &Value) -> anyhow::Result<()> {
        match self {
            Flow::ConnectOnly => {}
            Flow::AddNumbers => {
                let tool = tools
                    .iter()
                    .find(|t| t.name == "add_numbers")
                    .or_else(|| tools.first())
                    .context("the server lists no tools")?;
                client
                    .call(&tool.name, object(json!({"a": 5, "b": 3})))
                    .await?;
            }
            Flow::CallNamed(name) => {
                client.call(name, JsonObject::new()).await?;
            }
            Flow::CallEveryEmpty => {
                for tool in tools {
                    client.call(&tool.name, JsonObject::new()).await?;
                }
            }
            Flow::StandardHeaders | Flow::CallEverySynthetic => {
                for tool in tools {
                    client.call(&tool.name, synthetic_arguments(tool)).await?;
                }
                if matches!(self, Flow::StandardHeaders) && client.stateless {
                    client.read_every_resource().await?;
                    client.get_every_prompt().await?;
                }
            }
            Flow::ContextToolCalls => {
                let calls = context
                    .get("toolCalls")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for call in calls {
                    let name = call
                        .get("name")
                        .and_then(Value::as_str)
                        .context("context.toolCalls[]: no `name`")?;
                    let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
                    client.call(name, object(arguments)).await?;
                }
            }
            Flow::SchemaEcho => {
                let focal = tools
                    .iter()
                    .find(|t| t.name == "json_schema_2020_12_tool")
                    .context("the server does not list json_schema_2020_12_tool")?;
                let schema = Value::Object(focal.input_schema.as_ref().clone());
                client
                    .call("json_schema_echo", object(json!({ "schema": schema })))
                    .await?;
            }
        }
        Ok(())
    }
}

/// The connected session, and how to call through it.
struct Client<'a> {
    session: &'a Session,
    stateless: bool,
}

impl Client<'_> {
    /// Calls `tool`: stateful, through the gateway's [`Session::call`];
    /// stateless, over the session's peer, answering `input_required`
    /// rounds (which the gateway's calls refuse).
    async fn call(&self, tool: &str, arguments: JsonObject) -> anyhow::Result<CallToolResult> {
        let shown = Value::Object(arguments.clone());
        tracing::info!(tool, arguments = %shown, "tools/call");
        let result = if self.stateless {
            self.call_answering(tool, arguments).await?
        } else {
            self.session
                .call(tool, arguments, CALL_TIMEOUT, Vec::new(), None)
                .await
                .with_context(|| format!("tools/call {tool}"))?
        };
        tracing::info!(
            tool,
            result = %serde_json::to_string(&result).unwrap_or_default(),
            "tools/call result"
        );
        Ok(result)
    }

    async fn call_answering(
        &self,
        tool: &str,
        arguments: JsonObject,
    ) -> anyhow::Result<CallToolResult> {
        let peer = self.session.peer();
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        for _ in 0..=MAX_INPUT_ROUNDS {
            let response = tokio::time::timeout(CALL_TIMEOUT, peer.call_tool_once(params.clone()))
                .await
                .with_context(|| format!("tools/call {tool}: no answer in time"))?
                .with_context(|| format!("tools/call {tool}"))?;
            match response {
                CallToolResponse::Complete(result) => return Ok(result),
                CallToolResponse::InputRequired(input) => {
                    (params.input_responses, params.request_state) = answer(input)?;
                }
                _ => bail!("tools/call {tool}: unsupported result (a task)"),
            }
        }
        bail!("tools/call {tool}: more than {MAX_INPUT_ROUNDS} input_required rounds")
    }

    /// `resources/list`, then `resources/read` of each (stateless only).
    async fn read_every_resource(&self) -> anyhow::Result<()> {
        let peer = self.session.peer();
        let resources = peer.list_all_resources().await.context("resources/list")?;
        for resource in resources {
            let uri = resource.uri.clone();
            tracing::info!(%uri, "resources/read");
            let mut params = ReadResourceRequestParams::new(uri.clone());
            let mut rounds = 0;
            loop {
                match peer.read_resource_once(params.clone()).await {
                    Ok(ReadResourceResponse::Complete(_)) => break,
                    Ok(ReadResourceResponse::InputRequired(input)) if rounds < MAX_INPUT_ROUNDS => {
                        rounds += 1;
                        (params.input_responses, params.request_state) = answer(input)?;
                    }
                    Ok(_) => bail!("resources/read {uri}: too many input_required rounds"),
                    Err(e) => return Err(e).context(format!("resources/read {uri}")),
                }
            }
        }
        Ok(())
    }

    /// `prompts/list`, then `prompts/get` of each (stateless only).
    async fn get_every_prompt(&self) -> anyhow::Result<()> {
        let peer = self.session.peer();
        let prompts = peer.list_all_prompts().await.context("prompts/list")?;
        for prompt in prompts {
            let name = prompt.name.clone();
            tracing::info!(%name, "prompts/get");
            let mut params = GetPromptRequestParams::new(name.clone());
            params.arguments = Some(JsonObject::new());
            let mut rounds = 0;
            loop {
                match peer.get_prompt_once(params.clone()).await {
                    Ok(GetPromptResponse::Complete(_)) => break,
                    Ok(GetPromptResponse::InputRequired(input)) if rounds < MAX_INPUT_ROUNDS => {
                        rounds += 1;
                        (params.input_responses, params.request_state) = answer(input)?;
                    }
                    Ok(_) => bail!("prompts/get {name}: too many input_required rounds"),
                    Err(e) => return Err(e).context(format!("prompts/get {name}")),
                }
            }
        }
        Ok(())
    }
}

/// Answers every input request of an `input_required` result (SEP-2322) and
/// returns what the retry carries: the responses (none when nothing was
/// asked) and the server's `requestState`, echoed untouched (absent when the
/// server sent none).
fn answer(input: InputRequiredResult) -> anyhow::Result<(Option<InputResponses>, Option<String>)> {
    let requests = input.input_requests.unwrap_or_default();
    if requests.is_empty() && input.request_state.is_none() {
        bail!("an input_required result with neither inputRequests nor requestState");
    }
    let mut responses = InputResponses::new();
    for (key, request) in requests {
        let response = match request {
            InputRequest::Elicitation(request) => {
                serde_json::to_value(upstream::accept_with_defaults(&request.params))?
            }
            InputRequest::ListRoots(_) => json!({ "roots": [] }),
            InputRequest::CreateMessage(_) => {
                bail!("input request `{key}`: sampling is not supported")
            }
            _ => bail!("input request `{key}`: unsupported kind"),
        };
        tracing::info!(%key, %response, "answering input request");
        responses.insert(key, response);
    }
    Ok((
        (!responses.is_empty()).then_some(responses),
        input.request_state,
    ))
}

/// Arguments for a tool nobody described: one value per required property
/// (`1` for numbers, `true` for booleans, else a string).
fn synthetic_arguments(tool: &Tool) -> JsonObject {
    let schema = tool.input_schema.as_ref();
    let properties = schema.get("properties").and_then(Value::as_object);
    let mut arguments = JsonObject::new();
    for key in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let kind = properties
            .and_then(|p| p.get(key))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str);
        let value = match kind {
            Some("number" | "integer") => json!(1),
            Some("boolean") => json!(true),
            _ => json!("us-west1"),
        };
        arguments.insert(key.to_owned(), value);
    }
    arguments
}

/// `value` as a JSON object (anything else becomes `{}`).
fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// The `auth/*` scenarios: every token comes from the gateway's OAuth client
/// ([`OAuthClient`]), consent is given headlessly (the authorization URL is
/// fetched the way a browser would, without following the final redirect,
/// and the `Location` callback handed to [`OAuthClient::complete`]), and the
/// MCP session sends the token with every request as
/// [`OAuthClient::resource_auth`] says (`Authorization: Bearer`, or
/// `Authorization: DPoP` with a proof for a DPoP-bound token): a request
/// refused with a challenge (401, or 403 `insufficient_scope`) is answered
/// by [`OAuthClient::refused`] (refresh, new consent or bounded step-up) and
/// resent once; one refused with `use_dpop_nonce` is resent once with the
/// resource server's nonce ([`learn_resource_nonce`]).
///
/// The `auth/dpop*` scenarios turn on [`OAuthSettings::dpop`];
/// `auth/wif-jwt-bearer` uses the context's `valid_jwt` as the workload's
/// assertion ([`OAuthSettings::jwt_bearer_assertion`]).
mod oauth {
    use std::borrow::Cow;
    use std::collections::HashMap;
    use std::sync::Arc;

    use anyhow::{Context, bail};
    use futures::stream::BoxStream;
    use http::{HeaderName, HeaderValue};
    use rmcp::model::{ClientJsonRpcMessage, ProtocolVersion};
    use rmcp::service::{ClientLifecycleMode, RoleClient};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
        StreamableHttpPostResponse,
    };
    use serde_json::Value;
    use sse_stream::Sse;
    use url::Url;

    use super::{Scenario, initialize_version, synthetic_arguments};
    use crate::config::{Grant, Secret, TokenEndpointAuth};
    use crate::credentials::dpop::{is_use_dpop_nonce, learn_resource_nonce};
    use crate::credentials::oauth::{
        EnterpriseIdp, MemoryStore, OAuthClient, OAuthError, OAuthSettings, WorkloadAssertion,
        parse_algorithm,
    };
    use crate::state::TokenKey;

    /// The redirect URI registered by the conformance client (never served:
    /// the callback is read from the `Location` header).
    const REDIRECT_URI: &str = "http://localhost:3000/callback";

    /// The client ID metadata document URL the suite expects.
    const CLIENT_METADATA_URL: &str = "https://conformance-test.local/client-metadata.json";

    type HttpError = StreamableHttpError<reqwest::Error>;

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
            http,
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
                Err(OAuthError::AuthorizationRequired { url }) => {
                    self.consent(&url).await.map(Some)
                }
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
            self.oauth.complete(&callback).await?;
            self.oauth.access_token(&self.key).await
        }

        /// Sends with the token; on a challenge, once more with a better
        /// one; on `use_dpop_nonce`, once more with the server's nonce.
        async fn send<T, F, Fut>(
            &self,
            method: http::Method,
            uri: &str,
            session_id: Option<&str>,
            headers: &HashMap<HeaderName, HeaderValue>,
            call: F,
        ) -> Result<T, HttpError>
        where
            F: Fn(Option<String>, HashMap<HeaderName, HeaderValue>) -> Fut,
            Fut: Future<Output = Result<T, HttpError>>,
        {
            let mut token = self.token().await.map_err(refusal)?;
            let (mut nonce_asked, mut refused) = (false, false);
            loop {
                let (bearer, sent) = self
                    .present(token.as_ref(), &method, uri, headers)
                    .await
                    .map_err(refusal)?;
                let result = call(bearer, sent).await;
                let challenge = match &result {
                    Err(StreamableHttpError::AuthRequired(e)) => e.www_authenticate_header.clone(),
                    Err(StreamableHttpError::InsufficientScope(e)) => {
                        e.www_authenticate_header.clone()
                    }
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

        /// The bearer token for rmcp to send, or (a DPoP-bound token) none
        /// and the `Authorization` and `DPoP` headers added to `headers`.
        async fn present(
            &self,
            token: Option<&Secret>,
            method: &http::Method,
            uri: &str,
            headers: &HashMap<HeaderName, HeaderValue>,
        ) -> Result<(Option<String>, HashMap<HeaderName, HeaderValue>), OAuthError> {
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
            headers: &HashMap<HeaderName, HeaderValue>,
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

    impl StreamableHttpClient for OAuthHttp {
        type Error = reqwest::Error;

        async fn post_message(
            &self,
            uri: Arc<str>,
            message: ClientJsonRpcMessage,
            session_id: Option<Arc<str>>,
            _auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<StreamableHttpPostResponse, HttpError> {
            self.send(
                http::Method::POST,
                &uri,
                session_id.as_deref(),
                &custom_headers,
                |token, headers| {
                    self.client.post_message(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        token,
                        headers,
                    )
                },
            )
            .await
        }

        async fn delete_session(
            &self,
            uri: Arc<str>,
            session_id: Arc<str>,
            _auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<(), HttpError> {
            self.send(
                http::Method::DELETE,
                &uri,
                Some(&session_id),
                &custom_headers,
                |token, headers| {
                    self.client
                        .delete_session(uri.clone(), session_id.clone(), token, headers)
                },
            )
            .await
        }

        async fn get_stream(
            &self,
            uri: Arc<str>,
            session_id: Option<Arc<str>>,
            last_event_id: Option<String>,
            _auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
            self.send(
                http::Method::GET,
                &uri,
                session_id.as_deref(),
                &custom_headers,
                |token, headers| {
                    self.client.get_stream(
                        uri.clone(),
                        session_id.clone(),
                        last_event_id.clone(),
                        token,
                        headers,
                    )
                },
            )
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input_required(value: Value) -> InputRequiredResult {
        serde_json::from_value(value).expect("an input_required result")
    }

    #[test]
    fn elicitations_are_accepted_with_defaults_and_state_is_echoed() {
        let input = input_required(json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {
                "mode": "form",
                "message": "?",
                "requestedSchema": {"type": "object", "properties": {
                    "name": {"type": "string", "default": "Ada"},
                    "age": {"type": "integer", "default": 36},
                    "ok": {"type": "boolean"},
                    "note": {"type": "string"}
                }}
            }}},
            "requestState": "opaque-state"
        }));
        let (responses, state) = answer(input).expect("answered");
        assert_eq!(state.as_deref(), Some("opaque-state"));
        assert_eq!(
            responses.expect("responses")["confirm"],
            json!({"action": "accept", "content": {
                "name": "Ada", "age": 36, "ok": true, "note": "conformance"
            }})
        );
    }

    #[test]
    fn no_request_state_is_invented() {
        let input = input_required(json!({
            "resultType": "input_required",
            "inputRequests": {"c": {"method": "elicitation/create", "params": {
                "message": "?",
                "requestedSchema": {"type": "object", "properties": {}}
            }}}
        }));
        let (responses, state) = answer(input).expect("answered");
        assert!(state.is_none());
        assert!(responses.is_some());
    }
}
