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
//! listing ([`crate::upstream::connect_with`]) and
//! [`Session::call`](crate::upstream::Session::call). The only additions
//! are opt-in: elicitations are answered (accepted with the
//! schema's defaults), and in the stateless revision `input_required`
//! results (SEP-2322) are answered and retried over the session's rmcp peer,
//! which the gateway's own calls refuse.
//!
//! The `auth/*` scenarios go through the gateway's OAuth client
//! ([`crate::credentials::oauth`]): see [`oauth`].

mod client;
mod defaults;
mod flow;
mod oauth;

use std::path::Path;

use anyhow::{Context, anyhow};
use rmcp::model::ProtocolVersion;
use serde_json::{Value, json};

use self::client::Client;
use self::flow::Flow;
use crate::config::{Config, Lifecycle, ProcessEnv, ServerConfig};
use crate::upstream::{self, Label, SessionOptions};

/// Protocol revisions with the `initialize` lifecycle.
const STATEFUL_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

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
    // The skills extension (SEP-2640) is specified against 2026-07-28: its
    // scenarios (which name no revision) run on a stateless session, the
    // only kind the gateway lists skills on.
    let stateless = scenario.stateless() || scenario.name.starts_with("sep-2640-client-");
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
            elicitation_answerer: Some(defaults::accept_with_defaults),
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
