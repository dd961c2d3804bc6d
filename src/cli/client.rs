//! Client verbs against a running gateway: `toolgate tools` and
//! `toolgate call`. The token comes from `TOOLGATE_TOKEN` or `--token-file`,
//! never from a flag that would land in shell history. Exit codes follow
//! the gRPC status (`NOT_FOUND` exits 5, `UNAVAILABLE` 14, ...); a tool
//! that ran and reported failure exits [`EXIT_TOOL_ERROR`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tonic::transport::Channel;

use crate::pb;
use crate::pb::tool_gateway_client::ToolGatewayClient;

/// Exit code of a call whose tool reported failure (`is_error`); outside
/// the range of gRPC status codes.
pub const EXIT_TOOL_ERROR: u8 = 17;
/// Exit code when no token is available or the flags are inconsistent.
pub const EXIT_USAGE: u8 = 64;

/// Where the gateway is and who the caller is.
#[derive(Debug, Args)]
pub struct Connection {
    /// The gateway's gRPC address.
    #[arg(long, default_value = "http://127.0.0.1:50051", env = "TOOLGATE_ADDR")]
    addr: String,
    /// A file holding the bearer token (one trailing newline is trimmed).
    /// Without it, the token is read from the TOOLGATE_TOKEN variable.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Deadline of the call.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Print machine-readable JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `toolgate tools` options.
#[derive(Debug, Args)]
pub struct ToolsArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only tools of this server (repeatable).
    #[arg(long = "server")]
    servers: Vec<String>,
    /// Only tools whose exposed name matches this glob (repeatable).
    #[arg(long = "glob")]
    globs: Vec<String>,
}

/// `toolgate call` options.
#[derive(Debug, Args)]
pub struct CallArgs {
    #[command(flatten)]
    connection: Connection,
    /// The exposed tool name, as `toolgate tools` lists it.
    name: String,
    /// The arguments as a JSON object (default `{}`).
    args_json: Option<String>,
    /// Save images and audio of the result into this directory.
    #[arg(long)]
    save_images: Option<PathBuf>,
}

fn token(connection: &Connection) -> Result<String, String> {
    match &connection.token_file {
        Some(path) => {
            let mut text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --token-file {}: {e}", path.display()))?;
            if text.ends_with('\n') {
                text.pop();
            }
            if text.is_empty() {
                return Err(format!("--token-file {} is empty", path.display()));
            }
            Ok(text)
        }
        None => std::env::var("TOOLGATE_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| "no token: set TOOLGATE_TOKEN or pass --token-file".to_owned()),
    }
}

fn request<T>(message: T, token: &str, timeout: Duration) -> Result<tonic::Request<T>, String> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    let value = format!("Bearer {token}")
        .parse()
        .map_err(|_| "the token is not valid in an HTTP header".to_owned())?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}

async fn connect(addr: &str) -> Result<ToolGatewayClient<Channel>, tonic::Status> {
    let addr = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(addr)
        .map_err(|e| tonic::Status::invalid_argument(format!("--addr: {e}")))?
        .connect_timeout(Duration::from_secs(5));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("cannot connect: {e}")))?;
    Ok(ToolGatewayClient::new(channel))
}

/// Prints a failed status and turns it into the exit code.
fn fail(status: &tonic::Status, json: bool) -> ExitCode {
    use tonic_types::StatusExt;
    let reason = status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default();
    if json {
        let value = serde_json::json!({
            "error": { "code": format!("{:?}", status.code()), "reason": reason, "message": status.message() }
        });
        println!("{value}");
    } else {
        eprintln!(
            "toolgate: {:?}{}: {}",
            status.code(),
            if reason.is_empty() {
                String::new()
            } else {
                format!(" ({reason})")
            },
            status.message()
        );
    }
    ExitCode::from(u8::try_from(status.code() as i32).unwrap_or(2))
}

fn usage(message: &str) -> ExitCode {
    eprintln!("toolgate: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// `toolgate tools`: the caller's catalog as a table or JSON.
pub async fn tools(args: ToolsArgs) -> ExitCode {
    let c = &args.connection;
    let token = match token(c) {
        Ok(token) => token,
        Err(e) => return usage(&e),
    };
    let message = pb::ListToolsRequest {
        servers: args.servers.clone(),
        name_globs: args.globs.clone(),
        annotations: None,
    };
    let request = match request(message, &token, c.timeout) {
        Ok(r) => r,
        Err(e) => return usage(&e),
    };
    let listing = match connect(&c.addr).await {
        Ok(mut client) => client.list_tools(request).await,
        Err(status) => Err(status),
    };
    let listing = match listing {
        Ok(response) => response.into_inner(),
        Err(status) => return fail(&status, c.json),
    };
    let mut out = std::io::stdout().lock();
    if c.json {
        let tools: Vec<_> = listing
            .tools
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name, "server": t.server, "title": t.title,
                    "description": t.description, "estimated_tokens": t.estimated_tokens,
                    "definition_hash": t.definition_hash,
                    "input_schema": serde_json::from_str::<serde_json::Value>(&t.input_schema_json).unwrap_or_default(),
                })
            })
            .collect();
        let servers: Vec<_> = listing
            .servers
            .iter()
            .map(|s| serde_json::json!({"name": s.name, "connected": s.connected, "error": s.error, "tools": s.tool_count}))
            .collect();
        let value = serde_json::json!({
            "catalog_version": listing.catalog_version,
            "total_estimated_tokens": listing.total_estimated_tokens,
            "tools": tools, "servers": servers,
        });
        let _ = writeln!(out, "{value}");
        return ExitCode::SUCCESS;
    }
    let width = listing
        .tools
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(out, "{:<width$}  {:>6}  DESCRIPTION", "TOOL", "TOKENS");
    for tool in &listing.tools {
        let description = tool.description.lines().next().unwrap_or_default();
        let description: String = if description.chars().count() > 70 {
            description
                .chars()
                .take(69)
                .chain(std::iter::once('…'))
                .collect()
        } else {
            description.to_owned()
        };
        let _ = writeln!(
            out,
            "{:<width$}  {:>6}  {description}",
            tool.name, tool.estimated_tokens
        );
    }
    let _ = writeln!(
        out,
        "\n{} tool(s), ~{} tokens, catalog {}",
        listing.tools.len(),
        listing.total_estimated_tokens,
        listing.catalog_version
    );
    for server in listing.servers.iter().filter(|s| !s.connected) {
        let _ = writeln!(
            out,
            "server {} is not connected: {}",
            server.name, server.error
        );
    }
    ExitCode::SUCCESS
}

/// `toolgate call`: invokes one tool and prints the result.
pub async fn call(args: CallArgs) -> ExitCode {
    let c = &args.connection;
    let token = match token(c) {
        Ok(token) => token,
        Err(e) => return usage(&e),
    };
    let message = pb::InvokeToolRequest {
        name: args.name.clone(),
        arguments_json: args.args_json.clone().unwrap_or_default(),
        ..Default::default()
    };
    let request = match request(message, &token, c.timeout) {
        Ok(r) => r,
        Err(e) => return usage(&e),
    };
    let result = match connect(&c.addr).await {
        Ok(mut client) => client.invoke_tool(request).await,
        Err(status) => Err(status),
    };
    let result = match result {
        Ok(response) => response.into_inner(),
        Err(status) => return fail(&status, c.json),
    };
    let saved = match &args.save_images {
        Some(dir) => match save_media(dir, &args.name, &result) {
            Ok(saved) => saved,
            Err(e) => {
                eprintln!("toolgate: cannot save media into {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        },
        None => Vec::new(),
    };
    let mut out = std::io::stdout().lock();
    if c.json {
        let value = serde_json::json!({
            "is_error": result.is_error,
            "text": result.text,
            "structured_content": serde_json::from_str::<serde_json::Value>(&result.structured_content_json).ok(),
            "content": result.content.iter().map(describe).collect::<Vec<_>>(),
            "saved": saved.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        });
        let _ = writeln!(out, "{value}");
    } else {
        let _ = writeln!(out, "{}", result.text);
        for path in &saved {
            let _ = writeln!(out, "saved {}", path.display());
        }
    }
    if result.is_error {
        ExitCode::from(EXIT_TOOL_ERROR)
    } else {
        ExitCode::SUCCESS
    }
}

fn describe(content: &pb::Content) -> serde_json::Value {
    use pb::content::Kind;
    match &content.kind {
        Some(Kind::Text(t)) => serde_json::json!({"type": "text", "text": t.text}),
        Some(Kind::Image(i)) => {
            serde_json::json!({"type": "image", "mime_type": i.mime_type, "bytes": i.data.len()})
        }
        Some(Kind::Audio(a)) => {
            serde_json::json!({"type": "audio", "mime_type": a.mime_type, "bytes": a.data.len()})
        }
        Some(Kind::ResourceLink(r)) => {
            serde_json::json!({"type": "resource_link", "uri": r.uri, "name": r.name})
        }
        Some(Kind::Resource(r)) => {
            serde_json::json!({"type": "resource", "uri": r.uri, "mime_type": r.mime_type})
        }
        None => serde_json::json!({"type": "unknown"}),
    }
}

/// Writes every image and audio block to `dir` as `<tool>-<n>.<ext>`.
fn save_media(
    dir: &Path,
    tool: &str,
    result: &pb::InvokeToolResponse,
) -> std::io::Result<Vec<PathBuf>> {
    use pb::content::Kind;
    std::fs::create_dir_all(dir)?;
    let mut saved = Vec::new();
    for (n, content) in result.content.iter().enumerate() {
        let (data, mime) = match &content.kind {
            Some(Kind::Image(i)) => (&i.data, i.mime_type.as_str()),
            Some(Kind::Audio(a)) => (&a.data, a.mime_type.as_str()),
            _ => continue,
        };
        let extension = mime
            .split_once('/')
            .map(|(_, sub)| sub.split(['+', ';']).next().unwrap_or("bin"))
            .filter(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric()))
            .unwrap_or("bin");
        let safe_tool: String = tool
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("{safe_tool}-{n}.{extension}"));
        std::fs::write(&path, data)?;
        saved.push(path);
    }
    Ok(saved)
}
