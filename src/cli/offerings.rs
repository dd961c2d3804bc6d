//! Client verbs for what servers offer besides tools:
//! `toolgate resources`, `toolgate read SERVER URI [--out FILE]`,
//! `toolgate prompts` and `toolgate prompt NAME key=value...`. Tokens,
//! addresses, `--json` and exit codes as for `toolgate tools` and `call`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::client::{Connection, DEFAULT_TIMEOUT, connect, fail, request, token, usage};
use crate::pb;

/// `toolgate resources` options.
#[derive(Debug, Args)]
pub(super) struct ResourcesArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only resources of this server (repeatable).
    #[arg(long = "server")]
    servers: Vec<String>,
    /// Only resources whose URI matches this glob (repeatable).
    #[arg(long = "glob")]
    globs: Vec<String>,
}

/// `toolgate read` options.
#[derive(Debug, Args)]
pub(super) struct ReadArgs {
    #[command(flatten)]
    connection: Connection,
    /// The server (its configured name, as `toolgate resources` lists it).
    server: String,
    /// The resource's URI.
    uri: String,
    /// Write the contents to this file instead of standard output (needed
    /// for binary contents).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `toolgate prompts` options.
#[derive(Debug, Args)]
pub(super) struct PromptsArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only prompts of this server (repeatable).
    #[arg(long = "server")]
    servers: Vec<String>,
    /// Only prompts whose exposed name matches this glob (repeatable).
    #[arg(long = "glob")]
    globs: Vec<String>,
}

/// `toolgate prompt` options.
#[derive(Debug, Args)]
pub(super) struct PromptArgs {
    #[command(flatten)]
    connection: Connection,
    /// The exposed prompt name, as `toolgate prompts` lists it.
    name: String,
    /// The prompt's arguments, each `key=value`.
    arguments: Vec<String>,
}

/// Connects and runs one unary RPC with the connection's token and
/// deadline; the status of a failure as the exit code.
macro_rules! rpc {
    ($c:expr, $message:expr, $method:ident) => {{
        let c: &Connection = $c;
        let token = match token(c) {
            Ok(token) => token,
            Err(e) => return Err(usage(&e)),
        };
        let request = match request($message, &token, c.timeout.unwrap_or(DEFAULT_TIMEOUT)) {
            Ok(r) => r,
            Err(e) => return Err(usage(&e)),
        };
        let answer = match connect(c).await {
            Ok(mut client) => client.$method(request).await,
            Err(status) => Err(status),
        };
        match answer {
            Ok(response) => response.into_inner(),
            Err(status) => return Err(fail(&status, c.json)),
        }
    }};
}

/// `toolgate resources`: every page of the caller's resources, then the
/// templates, as a table or one JSON object.
pub(super) async fn resources(args: ResourcesArgs) -> ExitCode {
    list_resources(&args).await.unwrap_or_else(|code| code)
}

async fn list_resources(args: &ResourcesArgs) -> Result<ExitCode, ExitCode> {
    let c = &args.connection;
    let mut resources = Vec::new();
    let mut templates = Vec::new();
    let mut servers = Vec::new();
    let mut page_token = String::new();
    // Bounded: a gateway that kept handing out pages would be a bug, not
    // a reason to loop forever.
    for _ in 0..10_000 {
        let message = pb::ListResourcesRequest {
            servers: args.servers.clone(),
            uri_globs: args.globs.clone(),
            page_size: 1000,
            page_token: page_token.clone(),
        };
        let page = rpc!(c, message, list_resources);
        resources.extend(page.resources);
        templates.extend(page.resource_templates);
        servers.extend(page.servers);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let mut out = std::io::stdout().lock();
    if c.json {
        let value = serde_json::json!({
            "resources": resources.iter().map(|r| serde_json::json!({
                "server": r.server, "uri": r.uri, "name": r.name, "title": r.title,
                "description": r.description, "mime_type": r.mime_type, "size": r.size,
            })).collect::<Vec<_>>(),
            "resource_templates": templates.iter().map(|t| serde_json::json!({
                "server": t.server, "uri_template": t.uri_template, "name": t.name,
                "title": t.title, "description": t.description, "mime_type": t.mime_type,
            })).collect::<Vec<_>>(),
            "servers": servers.iter().map(|s| serde_json::json!({
                "name": s.name, "error": s.error, "resources": s.resource_count,
                "authorization_url": s.authorization_url,
            })).collect::<Vec<_>>(),
        });
        let _ = writeln!(out, "{value}");
        return Ok(ExitCode::SUCCESS);
    }
    let server_width = resources
        .iter()
        .map(|r| r.server.len())
        .chain(templates.iter().map(|t| t.server.len()))
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(out, "{:<server_width$}  {:<10}  URI", "SERVER", "MIME");
    for r in &resources {
        let _ = writeln!(
            out,
            "{:<server_width$}  {:<10}  {}",
            r.server,
            short(&r.mime_type, 10),
            r.uri
        );
    }
    for t in &templates {
        let _ = writeln!(
            out,
            "{:<server_width$}  {:<10}  {} (template)",
            t.server,
            short(&t.mime_type, 10),
            t.uri_template
        );
    }
    let _ = writeln!(
        out,
        "\n{} resource(s), {} template(s)",
        resources.len(),
        templates.len()
    );
    for s in servers.iter().filter(|s| !s.error.is_empty()) {
        let _ = writeln!(out, "server {}: {}", s.name, s.error);
    }
    Ok(ExitCode::SUCCESS)
}

/// `toolgate read`: one resource's contents on standard output (text), or
/// in `--out FILE` (every part, in order).
pub(super) async fn read(args: ReadArgs) -> ExitCode {
    read_resource(&args).await.unwrap_or_else(|code| code)
}

async fn read_resource(args: &ReadArgs) -> Result<ExitCode, ExitCode> {
    use pb::resource_contents::Data;
    let c = &args.connection;
    let message = pb::ReadResourceRequest {
        server: args.server.clone(),
        uri: args.uri.clone(),
        ..Default::default()
    };
    let read = rpc!(c, message, read_resource);
    if read.input_required.is_some() {
        return Err(usage(
            "the server asks questions before it hands out this resource; answer them with \
             a worker (ReadResourceRequest.input_responses)",
        ));
    }
    if c.json {
        use base64::Engine as _;
        let parts: Vec<_> = read
            .contents
            .iter()
            .map(|part| match &part.data {
                Some(Data::Text(text)) => {
                    serde_json::json!({"uri": part.uri, "mime_type": part.mime_type, "text": text})
                }
                Some(Data::Blob(bytes)) => serde_json::json!({
                    "uri": part.uri, "mime_type": part.mime_type,
                    "blob_base64": base64::engine::general_purpose::STANDARD.encode(bytes),
                }),
                None => serde_json::json!({"uri": part.uri, "mime_type": part.mime_type}),
            })
            .collect();
        println!("{}", serde_json::json!({ "contents": parts }));
        return Ok(ExitCode::SUCCESS);
    }
    let bytes: Vec<u8> = read
        .contents
        .iter()
        .flat_map(|part| match &part.data {
            Some(Data::Text(text)) => text.as_bytes().to_vec(),
            Some(Data::Blob(bytes)) => bytes.clone(),
            None => Vec::new(),
        })
        .collect();
    match &args.out {
        Some(path) => {
            if let Err(e) = std::fs::write(path, &bytes) {
                eprintln!("toolgate: cannot write {}: {e}", path.display());
                return Err(ExitCode::FAILURE);
            }
            eprintln!("wrote {} bytes to {}", bytes.len(), path.display());
        }
        None => {
            let binary = read
                .contents
                .iter()
                .any(|part| matches!(part.data, Some(Data::Blob(_))));
            if binary {
                return Err(usage(
                    "the resource has binary contents: pass --out FILE (or --json for base64)",
                ));
            }
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&bytes);
            if !bytes.ends_with(b"\n") && !bytes.is_empty() {
                let _ = writeln!(out);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `toolgate prompts`: the caller's prompts and their arguments.
pub(super) async fn prompts(args: PromptsArgs) -> ExitCode {
    list_prompts(&args).await.unwrap_or_else(|code| code)
}

async fn list_prompts(args: &PromptsArgs) -> Result<ExitCode, ExitCode> {
    let c = &args.connection;
    let message = pb::ListPromptsRequest {
        servers: args.servers.clone(),
        name_globs: args.globs.clone(),
    };
    let listing = rpc!(c, message, list_prompts);
    let mut out = std::io::stdout().lock();
    if c.json {
        let prompts: Vec<_> = listing
            .prompts
            .iter()
            .map(|p| {
                serde_json::json!({
                    "name": p.name, "server": p.server, "title": p.title,
                    "description": p.description, "definition_hash": p.definition_hash,
                    "arguments": p.arguments.iter().map(|a| serde_json::json!({
                        "name": a.name, "description": a.description, "required": a.required,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let value = serde_json::json!({
            "prompts_version": listing.prompts_version, "prompts": prompts,
        });
        let _ = writeln!(out, "{value}");
        return Ok(ExitCode::SUCCESS);
    }
    let width = listing
        .prompts
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(out, "{:<width$}  ARGUMENTS / DESCRIPTION", "PROMPT");
    for prompt in &listing.prompts {
        let arguments: Vec<String> = prompt
            .arguments
            .iter()
            .map(|a| {
                if a.required {
                    a.name.clone()
                } else {
                    format!("[{}]", a.name)
                }
            })
            .collect();
        let description = prompt.description.lines().next().unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<width$}  {} {}",
            prompt.name,
            arguments.join(" "),
            short(description, 60)
        );
    }
    let _ = writeln!(out, "\n{} prompt(s)", listing.prompts.len());
    for s in &listing.servers {
        if !s.prompts_error.is_empty() {
            let _ = writeln!(out, "server {}: {}", s.name, s.prompts_error);
        }
        for withheld in &s.withheld_prompts {
            let _ = writeln!(out, "prompt {withheld} is withheld: awaiting approval");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `toolgate prompt`: renders one prompt and prints its messages.
pub(super) async fn prompt(args: PromptArgs) -> ExitCode {
    get_prompt(&args).await.unwrap_or_else(|code| code)
}

async fn get_prompt(args: &PromptArgs) -> Result<ExitCode, ExitCode> {
    use pb::content::Kind;
    let c = &args.connection;
    let mut arguments = std::collections::HashMap::new();
    for pair in &args.arguments {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(usage(&format!(
                "argument `{pair}` is not key=value (e.g. city=Paris)"
            )));
        };
        if arguments.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(usage(&format!("argument `{key}` is given twice")));
        }
    }
    let message = pb::GetPromptRequest {
        name: args.name.clone(),
        arguments,
        ..Default::default()
    };
    let rendered = rpc!(c, message, get_prompt);
    let mut out = std::io::stdout().lock();
    let role = |r: i32| match pb::Role::try_from(r) {
        Ok(pb::Role::Assistant) => "assistant",
        _ => "user",
    };
    if c.json {
        let messages: Vec<_> = rendered
            .messages
            .iter()
            .map(|m| {
                let content = match m.content.as_ref().and_then(|c| c.kind.as_ref()) {
                    Some(Kind::Text(t)) => serde_json::json!({"type": "text", "text": t.text}),
                    Some(Kind::Resource(r)) => serde_json::json!({
                        "type": "resource", "server": r.server, "uri": r.uri, "mime_type": r.mime_type,
                        "text": match &r.contents { Some(pb::embedded_resource::Contents::Text(t)) => Some(t), _ => None },
                    }),
                    Some(Kind::ResourceLink(l)) => serde_json::json!({
                        "type": "resource_link", "server": l.server, "uri": l.uri, "name": l.name,
                    }),
                    Some(Kind::Image(i)) => serde_json::json!({"type": "image", "mime_type": i.mime_type, "bytes": i.data.len()}),
                    Some(Kind::Audio(a)) => serde_json::json!({"type": "audio", "mime_type": a.mime_type, "bytes": a.data.len()}),
                    None => serde_json::json!({"type": "unknown"}),
                };
                serde_json::json!({"role": role(m.role), "content": content})
            })
            .collect();
        let value = serde_json::json!({"description": rendered.description, "messages": messages});
        let _ = writeln!(out, "{value}");
        return Ok(ExitCode::SUCCESS);
    }
    if !rendered.description.is_empty() {
        let _ = writeln!(out, "# {}", rendered.description);
    }
    for m in &rendered.messages {
        let text = match m.content.as_ref().and_then(|c| c.kind.as_ref()) {
            Some(Kind::Text(t)) => t.text.clone(),
            Some(Kind::Resource(r)) => match &r.contents {
                Some(pb::embedded_resource::Contents::Text(t)) => {
                    format!("[resource {} of server {}]\n{t}", r.uri, r.server)
                }
                _ => format!("[resource {} of server {}: binary]", r.uri, r.server),
            },
            Some(Kind::ResourceLink(l)) => {
                format!(
                    "[resource link {} of server {}: toolgate read {} '{}']",
                    l.uri, l.server, l.server, l.uri
                )
            }
            Some(Kind::Image(i)) => format!("[image {}, {} bytes]", i.mime_type, i.data.len()),
            Some(Kind::Audio(a)) => format!("[audio {}, {} bytes]", a.mime_type, a.data.len()),
            None => "[empty]".to_owned(),
        };
        let _ = writeln!(out, "[{}] {text}", role(m.role));
    }
    Ok(ExitCode::SUCCESS)
}

/// `text` cut to `max` characters (an ellipsis marks the cut).
fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        text.chars()
            .take(max - 1)
            .chain(std::iter::once('…'))
            .collect()
    }
}
