//! `toolgate demo`: the gateway's main job on an embedded default that needs
//! nothing installed. An MCP server with a few tools runs in process on
//! 127.0.0.1 (Streamable HTTP), a gateway is put in front of it, and a gRPC
//! client lists the tools and invokes them, printing what happened.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock as Content};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use rmcp::{schemars, tool, tool_router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::pb;
use crate::pb::tool_gateway_client::ToolGatewayClient;

/// Prints a line; a closed stdout (`toolgate demo | head`) is not an error.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// The bearer token of the demo tenant (loopback only).
const DEMO_TOKEN: &str = "demo-token";

/// A 1×1 red PNG.
const RED_PIXEL_PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

/// Arguments naming a repository.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct RepoArgs {
    /// The repository name, e.g. "toolgate".
    pub repo: String,
}

/// The demo MCP server: a pretend issue tracker.
#[derive(Debug, Clone)]
pub struct RepoServer {
    issues: Arc<HashMap<&'static str, u32>>,
}

impl Default for RepoServer {
    fn default() -> Self {
        Self {
            issues: Arc::new(HashMap::from([
                ("toolgate", 3),
                ("rmcp", 12),
                ("tonic", 40),
            ])),
        }
    }
}

#[tool_router(server_handler)]
impl RepoServer {
    /// Count the open issues in a repository.
    #[tool(description = "Count the open issues in a repository.")]
    fn count_issues(&self, Parameters(RepoArgs { repo }): Parameters<RepoArgs>) -> CallToolResult {
        match self.issues.get(repo.as_str()) {
            Some(n) => {
                CallToolResult::success(vec![Content::text(format!("{repo} has {n} open issues"))])
            }
            None => CallToolResult::error(vec![Content::text(format!(
                "no repository named {repo}; known: toolgate, rmcp, tonic"
            ))]),
        }
    }

    /// The most recent release tag of a repository.
    #[tool(description = "The most recent release tag of a repository.")]
    fn latest_release(&self, Parameters(RepoArgs { repo }): Parameters<RepoArgs>) -> String {
        format!("{repo}: v0.{}.0", repo.len())
    }

    /// A status badge for a repository, as an image.
    #[tool(description = "A status badge for a repository, as a PNG image.")]
    fn status_badge(&self, Parameters(RepoArgs { repo }): Parameters<RepoArgs>) -> CallToolResult {
        CallToolResult::success(vec![
            Content::text(format!("badge for {repo}:")),
            Content::image(RED_PIXEL_PNG, "image/png"),
        ])
    }
}

/// Serves [`RepoServer`] over Streamable HTTP on 127.0.0.1 (any free port)
/// until `stop` is cancelled. Returns the MCP endpoint URL.
///
/// # Errors
/// No loopback port can be bound.
pub async fn serve_repo_server(stop: CancellationToken) -> std::io::Result<String> {
    let service = StreamableHttpService::new(
        || Ok(RepoServer::default()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token()),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    });
    Ok(format!("http://{addr}/mcp"))
}

fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {DEMO_TOKEN}").parse().expect("ascii"),
    );
    request
}

/// Runs the demo, printing a transcript to stdout.
///
/// # Errors
/// Anything in the demo fails (it should not).
pub async fn run() -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let mcp_url = serve_repo_server(stop.clone()).await?;
    say!("mcp      {mcp_url}  (in-process MCP server)");

    let yaml = format!(
        "listen: \"127.0.0.1:0\"\nshutdown_delay: \"1ms\"\nshutdown_grace: \"2s\"\nreflection: false\ntenants:\n  - name: demo\n    tokens: [\"{DEMO_TOKEN}\"]\n    servers:\n      - name: repo\n        url: \"{mcp_url}\"\n"
    );
    let config = Config::from_yaml(
        &yaml,
        "<demo>",
        std::path::Path::new("."),
        &crate::config::ProcessEnv,
    )?;
    let listener = TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let gateway_stop = crate::app::Shutdown::new();
    let gateway = tokio::spawn(crate::app::run(
        config,
        listener,
        Arc::new(crate::config::ProcessEnv),
        gateway_stop.clone(),
    ));
    say!("gateway  grpc://{addr}  (tenant `demo`)");

    let mut client = ToolGatewayClient::connect(format!("http://{addr}")).await?;

    let listed = client
        .list_tools(authed(pb::ListToolsRequest::default()))
        .await?
        .into_inner();
    say!("\nListTools  catalog_version {}", listed.catalog_version);
    for tool in &listed.tools {
        say!("  tool   {:<22} {}", tool.name, tool.description);
    }

    for (name, args) in [
        ("repo__count_issues", r#"{"repo":"toolgate"}"#),
        ("repo__status_badge", r#"{"repo":"toolgate"}"#),
        ("repo__count_issues", r#"{"repo":"nope"}"#),
        ("repo__delete_everything", "{}"),
    ] {
        say!("\nInvokeTool {name}({args})");
        let started = Instant::now();
        let answer = client
            .invoke_tool(authed(pb::InvokeToolRequest {
                name: name.to_owned(),
                arguments_json: args.to_owned(),
                ..Default::default()
            }))
            .await;
        let elapsed = started.elapsed();
        match answer {
            Ok(response) => {
                let response = response.into_inner();
                let kinds: Vec<&str> = response
                    .content
                    .iter()
                    .map(|c| match &c.kind {
                        Some(pb::content::Kind::Text(_)) => "text",
                        Some(pb::content::Kind::Image(_)) => "image",
                        Some(pb::content::Kind::Audio(_)) => "audio",
                        Some(pb::content::Kind::ResourceLink(_)) => "resource_link",
                        Some(pb::content::Kind::Resource(_)) => "resource",
                        None => "?",
                    })
                    .collect();
                say!(
                    "  ← is_error={} text={:?} content=[{}] ({elapsed:.1?})",
                    response.is_error,
                    response.text,
                    kinds.join(", ")
                );
            }
            Err(status) => say!(
                "  ← {:?}: {} ({elapsed:.1?})",
                status.code(),
                status.message()
            ),
        }
    }

    gateway_stop.drain();
    gateway.await??;
    stop.cancel();
    say!("\ndone: the gateway drained and closed its upstream session");
    Ok(())
}
