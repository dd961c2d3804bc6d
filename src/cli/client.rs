//! Client verbs against a running gateway: `toolgate tools` and
//! `toolgate call`. The token comes from `TOOLGATE_TOKEN` or `--token-file`,
//! never from a flag that would land in shell history. Exit codes follow
//! the gRPC status (`NOT_FOUND` exits 5, `UNAVAILABLE` 14, ...); a tool
//! that ran and reported failure exits [`EXIT_TOOL_ERROR`].
//!
//! A call whose tool asks questions is answered on the terminal or from
//! `--input FILE` over InvokeToolInteractive ([`super::answerer`]); with
//! `--task`, a call that becomes a task is followed ([`super::follow`]).
//! A call a `require_approval` rule holds waits there for the decision;
//! over InvokeTool it is refused `APPROVAL_PENDING`, and `call` says how
//! to retry it with `--approval-id`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tonic::transport::Channel;

use crate::pb;
use crate::pb::tool_gateway_client::ToolGatewayClient;

use super::answerer::{Answerer, AskError};
use super::follow::{Auth, Ended, FollowError, follow, status_name};

/// Exit code of a call whose tool reported failure (`is_error`); outside
/// the range of gRPC status codes.
pub const EXIT_TOOL_ERROR: u8 = 17;
/// Exit code when no token is available or the flags are inconsistent,
/// and when `--input` does not answer a question the tool asks.
pub const EXIT_USAGE: u8 = 64;
/// Exit code of a task that failed (`TASK_STATUS_FAILED`).
pub const EXIT_TASK_FAILED: u8 = 18;
/// Exit code of a task that was cancelled (`TASK_STATUS_CANCELLED`); the
/// number of gRPC `CANCELLED`.
pub const EXIT_TASK_CANCELLED: u8 = 1;
/// Exit code after Ctrl-C cancelled a followed task.
pub const EXIT_INTERRUPTED: u8 = 130;
/// Rounds of `input_required` answered with a unary retry before giving up.
const MAX_UNARY_ROUNDS: usize = 10;
/// The call's deadline when `--timeout` is not given and the call may ask
/// the person at the terminal (time to read and answer).
const TERMINAL_TIMEOUT: Duration = Duration::from_secs(600);
/// The deadline of every other RPC when `--timeout` is not given.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the gateway is and who the caller is.
#[derive(Debug, Args)]
pub struct Connection {
    /// The gateway's gRPC address: `host:port`, `http://...`, or
    /// `https://...` for a gateway with `grpc.tls`.
    #[arg(long, default_value = "http://127.0.0.1:50051", env = "TOOLGATE_ADDR")]
    pub(super) addr: String,
    /// TLS to the gateway.
    #[command(flatten)]
    pub(super) tls: super::channel::ClientTls,
    /// A file holding the bearer token (one trailing newline is trimmed).
    /// Without it, the token is read from the TOOLGATE_TOKEN variable.
    #[arg(long)]
    pub(super) token_file: Option<PathBuf>,
    /// Deadline of each RPC (default 30s; 10m for a call that may ask
    /// questions on the terminal).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(super) timeout: Option<Duration>,
    /// Print machine-readable JSON instead of text.
    #[arg(long)]
    pub(super) json: bool,
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
    /// Answer the tool's questions from this JSON file (a list or map of
    /// answers; see docs/cli.md) instead of asking on the terminal.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Follow the call as a task when the server makes it one: a progress
    /// line until it ends, questions answered with UpdateTask, Ctrl-C
    /// cancels it.
    #[arg(long)]
    task: bool,
    /// Spend this call approval (`apv_...`): the retry of a call a
    /// `require_approval` rule held (APPROVAL_PENDING), once a person
    /// approved it. Same tool and arguments as the call that was held.
    #[arg(long, value_name = "ID")]
    approval_id: Option<String>,
    /// A key naming this call (1 to 255 visible ASCII characters): run it
    /// again with the same key after any failure, and the gateway answers
    /// with the first run's outcome instead of calling the tool twice.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
}

pub(super) fn token(connection: &Connection) -> Result<String, String> {
    token_from(connection.token_file.as_deref(), "TOOLGATE_TOKEN")
}

/// A bearer token from `--token-file` (one trailing newline trimmed), else
/// from the environment variable `var`.
pub(super) fn token_from(file: Option<&Path>, var: &str) -> Result<String, String> {
    match file {
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
        None => std::env::var(var)
            .ok()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| format!("no token: set {var} or pass --token-file")),
    }
}

/// `message` with the bearer token and the deadline `timeout`.
pub(super) fn request<T>(
    message: T,
    token: &str,
    timeout: Duration,
) -> Result<tonic::Request<T>, String> {
    let mut request = authorized(message, token)?;
    request.set_timeout(timeout);
    Ok(request)
}

/// `message` with the bearer token and no deadline (a watch that runs
/// until the user ends it).
pub(super) fn authorized<T>(message: T, token: &str) -> Result<tonic::Request<T>, String> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {token}")
        .parse()
        .map_err(|_| "the token is not valid in an HTTP header".to_owned())?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}

pub(super) async fn connect(c: &Connection) -> Result<ToolGatewayClient<Channel>, tonic::Status> {
    open(c).await.map(ToolGatewayClient::new)
}

/// The channel to the gateway: an address or TLS file that is not usable
/// as `INVALID_ARGUMENT`, a gateway that cannot be reached as
/// `UNAVAILABLE`.
pub(super) async fn open(c: &Connection) -> Result<Channel, tonic::Status> {
    use super::channel::ChannelError;
    match super::channel::open(&c.addr, &c.tls, "the gateway").await {
        Ok(channel) => Ok(channel),
        Err(ChannelError::Usage(message)) => Err(tonic::Status::invalid_argument(message)),
        Err(ChannelError::Unavailable(message)) => Err(tonic::Status::unavailable(message)),
    }
}

/// Prints a failed status and turns it into the exit code.
pub(super) fn fail(status: &tonic::Status, json: bool) -> ExitCode {
    use tonic_types::StatusExt;
    let (reason, metadata) = status
        .get_details_error_info()
        .map(|i| (i.reason, i.metadata))
        .unwrap_or_default();
    // A status made of a transport failure says only "transport error":
    // its sources say why (a TLS alert: the certificate required, unknown).
    let message = super::channel::with_sources(status.message(), std::error::Error::source(status));
    if json {
        let value = serde_json::json!({
            "error": {
                "code": format!("{:?}", status.code()), "reason": reason, "message": message,
                "metadata": metadata,
            }
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
            message
        );
    }
    ExitCode::from(u8::try_from(status.code() as i32).unwrap_or(2))
}

pub(super) fn usage(message: &str) -> ExitCode {
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
    let request = match request(message, &token, c.timeout.unwrap_or(DEFAULT_TIMEOUT)) {
        Ok(r) => r,
        Err(e) => return usage(&e),
    };
    let listing = match connect(c).await {
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

/// Why a call ended without a result to print.
enum Failure {
    /// The RPC failed.
    Status(tonic::Status),
    /// Something here: the message and the exit code.
    Local(String, u8),
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Self {
        Self::Status(status)
    }
}

impl From<AskError> for Failure {
    fn from(e: AskError) -> Self {
        let code = match e {
            AskError::File(_) => EXIT_USAGE,
            AskError::Prompt(_) | AskError::Stopped => 1,
        };
        Self::Local(e.to_string(), code)
    }
}

/// `toolgate call`: invokes one tool and prints the result. With someone
/// to answer questions (a terminal, `--input`), over InvokeToolInteractive
/// with `accepts_input` set; else InvokeTool as before questions existed.
pub async fn call(args: CallArgs) -> ExitCode {
    let c = &args.connection;
    let token = match token(c) {
        Ok(token) => token,
        Err(e) => return usage(&e),
    };
    let mut answerer = match Answerer::choose(args.input.as_deref()) {
        Ok(answerer) => answerer,
        Err(e) => return usage(&e.to_string()),
    };
    let timeout = c.timeout.unwrap_or(match answerer {
        Some(Answerer::Terminal) => TERMINAL_TIMEOUT,
        _ => DEFAULT_TIMEOUT,
    });
    let auth = match format!("Bearer {token}").parse() {
        Ok(authorization) => Auth {
            authorization,
            timeout,
        },
        Err(_) => return usage("the token is not valid in an HTTP header"),
    };
    let message = pb::InvokeToolRequest {
        name: args.name.clone(),
        arguments_json: args.args_json.clone().unwrap_or_default(),
        accepts_input: answerer.as_ref().map(Answerer::accepts),
        accepts_task: args.task,
        approval_id: args.approval_id.clone().unwrap_or_default(),
        idempotency_key: args.idempotency_key.clone().unwrap_or_default(),
        ..Default::default()
    };
    let mut client = match connect(c).await {
        Ok(client) => client,
        Err(status) => return fail(&status, c.json),
    };
    let outcome = invoke(&mut client, &auth, message, answerer.as_mut()).await;
    let result = match outcome {
        Ok(result) => result,
        Err(Failure::Status(status)) => {
            let code = fail(&status, c.json);
            if !c.json
                && let Some(hint) = approval_pending_hint(&args, &status, super::when::now_ms())
            {
                eprintln!("toolgate: {hint}");
            }
            return code;
        }
        Err(Failure::Local(message, code)) => {
            eprintln!("toolgate: {message}");
            return ExitCode::from(code);
        }
    };
    let result = match result.task.clone() {
        Some(task) => match follow(&mut client, &auth, *task, answerer.as_mut()).await {
            Ok(Ended::Completed(result)) => result,
            Ok(Ended::Stopped { task, interrupted }) => return stopped(&task, interrupted, c.json),
            Err(FollowError::Status(status)) => return fail(&status, c.json),
            Err(FollowError::Ask(e)) => {
                let Failure::Local(message, code) = Failure::from(e) else {
                    unreachable!("an AskError is local")
                };
                eprintln!("toolgate: {message}");
                return ExitCode::from(code);
            }
            Err(e @ FollowError::Unanswerable { .. }) => return usage(&e.to_string()),
        },
        None => result,
    };
    print_result(&args, &result)
}

/// The call, with its questions answered: over InvokeToolInteractive when
/// someone answers (falling back to InvokeTool on a gateway that does not
/// serve it), then unary retries while the response asks
/// (`input_required` with a `request_state`).
async fn invoke(
    client: &mut ToolGatewayClient<Channel>,
    auth: &Auth,
    message: pb::InvokeToolRequest,
    mut answerer: Option<&mut Answerer>,
) -> Result<pb::InvokeToolResponse, Failure> {
    let mut result = match answerer.as_deref_mut() {
        Some(answerer) => match interactive(client, auth, message.clone(), answerer).await {
            Err(Failure::Status(status)) if unserved(&status) => client
                .invoke_tool(auth.request(message.clone()))
                .await?
                .into_inner(),
            other => other?,
        },
        None => client
            .invoke_tool(auth.request(message.clone()))
            .await?
            .into_inner(),
    };
    for _ in 0..MAX_UNARY_ROUNDS {
        let Some(asked) = result.input_required.take() else {
            return Ok(result);
        };
        let Some(answerer) = answerer.as_deref_mut() else {
            return Err(Failure::Local(
                "the tool asks questions: run toolgate call on a terminal or pass --input FILE"
                    .to_owned(),
                EXIT_USAGE,
            ));
        };
        let retry = pb::InvokeToolRequest {
            input_responses: answerer.answer(&asked).await?,
            request_state: asked.request_state,
            ..message.clone()
        };
        result = client.invoke_tool(auth.request(retry)).await?.into_inner();
    }
    Err(Failure::Local(
        format!("the tool asked more than {MAX_UNARY_ROUNDS} rounds of questions"),
        1,
    ))
}

/// UNIMPLEMENTED without a reason: the gateway does not know the method
/// (an older release), so nothing ran.
fn unserved(status: &tonic::Status) -> bool {
    use tonic_types::StatusExt;
    status.code() == tonic::Code::Unimplemented && status.get_details_error_info().is_none()
}

/// One call over InvokeToolInteractive: the call, then the answers to each
/// `input_required` event, until the result.
async fn interactive(
    client: &mut ToolGatewayClient<Channel>,
    auth: &Auth,
    call: pb::InvokeToolRequest,
    answerer: &mut Answerer,
) -> Result<pb::InvokeToolResponse, Failure> {
    use pb::interactive_request::Message;
    use pb::invoke_tool_event::Event;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let first = pb::InteractiveRequest {
        message: Some(Message::Call(call)),
    };
    tx.send(first)
        .await
        .map_err(|_| Failure::Local("the call's stream closed".to_owned(), 1))?;
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut events = client
        .invoke_tool_interactive(auth.request(stream))
        .await?
        .into_inner();
    while let Some(event) = events.message().await? {
        match event.event {
            Some(Event::InputRequired(asked)) => {
                for answer in answerer.answer(&asked).await? {
                    let message = pb::InteractiveRequest {
                        message: Some(Message::InputResponse(answer)),
                    };
                    if tx.send(message).await.is_err() {
                        break;
                    }
                }
            }
            Some(Event::Result(result)) => return Ok(result),
            Some(Event::ApprovalPending(pending)) => eprintln!(
                "toolgate: the call waits for approval {} (rule {}, expires {}); it goes on \
                 once a person approves it (`toolgate call-approvals approve {}`)",
                pending.approval_id,
                pending.rule,
                super::when::at(pending.expires_at_unix_ms, super::when::now_ms()),
                pending.approval_id
            ),
            Some(Event::Progress(_)) | None => {}
        }
    }
    Err(Failure::Status(tonic::Status::unknown(
        "the gateway ended the call's stream without a result",
    )))
}

/// For a call held for approval (unary: `FAILED_PRECONDITION`, reason
/// `APPROVAL_PENDING`), what to do: the approval's id, until when it may
/// be decided, how an approver approves it, and the command that retries
/// the call with it. `None` for any other status.
fn approval_pending_hint(args: &CallArgs, status: &tonic::Status, now_ms: i64) -> Option<String> {
    use tonic_types::StatusExt;
    let info = status.get_details_error_info()?;
    if info.reason != "APPROVAL_PENDING" {
        return None;
    }
    let id = info.metadata.get("approval_id")?;
    let mut about = Vec::new();
    if let Some(rule) = info.metadata.get("rule") {
        about.push(format!("rule {rule}"));
    }
    if let Some(expires) = info
        .metadata
        .get("expires_at_unix_ms")
        .and_then(|ms| ms.parse::<i64>().ok())
    {
        about.push(format!("expires {}", super::when::at(expires, now_ms)));
    }
    let about = if about.is_empty() {
        String::new()
    } else {
        format!(" ({})", about.join(", "))
    };
    let mut retry = format!("toolgate call {}", shell_word(&args.name));
    if let Some(arguments) = &args.args_json {
        retry.push(' ');
        retry.push_str(&shell_word(arguments));
    }
    retry.push_str(&format!(" --approval-id {}", shell_word(id)));
    Some(format!(
        "the call waits for approval {id}{about}. Once a person approves it \
         (`toolgate call-approvals approve {id}`), run it again with the approval: {retry}"
    ))
}

/// `word` as one word of a POSIX shell command: as it is when nothing in
/// it is special, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Reports a task that failed or was cancelled.
fn stopped(task: &pb::Task, interrupted: bool, json: bool) -> ExitCode {
    let status = status_name(task.status());
    if json {
        let value = serde_json::json!({
            "task": {"task_id": task.task_id, "status": status, "status_message": task.status_message}
        });
        println!("{value}");
    } else if task.status_message.is_empty() {
        eprintln!("toolgate: task {} {status}", task.task_id);
    } else {
        eprintln!(
            "toolgate: task {} {status}: {}",
            task.task_id, task.status_message
        );
    }
    if interrupted {
        ExitCode::from(EXIT_INTERRUPTED)
    } else if task.status() == pb::TaskStatus::Failed {
        ExitCode::from(EXIT_TASK_FAILED)
    } else {
        ExitCode::from(EXIT_TASK_CANCELLED)
    }
}

/// Prints a call's result (saving its media when asked) and turns it into
/// the exit code.
fn print_result(args: &CallArgs, result: &pb::InvokeToolResponse) -> ExitCode {
    let c = &args.connection;
    let saved = match &args.save_images {
        Some(dir) => match save_media(dir, &args.name, result) {
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
            "replayed": result.replayed,
        });
        let _ = writeln!(out, "{value}");
    } else {
        if result.replayed {
            eprintln!(
                "toolgate: the recorded response of an earlier call with this idempotency key (the tool did not run again)"
            );
        }
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use clap::Parser;
    use tonic_types::{ErrorDetails, StatusExt};

    use super::*;
    use crate::cli::{Cli, Command};

    fn call_args(args: &[&str]) -> CallArgs {
        let mut argv = vec!["toolgate", "call"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Call(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    fn held(metadata: &[(&str, &str)]) -> tonic::Status {
        let metadata: HashMap<String, String> = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        tonic::Status::with_error_details(
            tonic::Code::FailedPrecondition,
            "the call waits for approval",
            ErrorDetails::with_error_info("APPROVAL_PENDING", "toolgate.dev", metadata),
        )
    }

    #[test]
    fn call_takes_an_approval_id() {
        let args = call_args(&["everything__echo", "{}", "--approval-id", "apv_1"]);
        assert_eq!(args.approval_id.as_deref(), Some("apv_1"));
        assert_eq!(call_args(&["everything__echo"]).approval_id, None);
        assert!(Cli::try_parse_from(["toolgate", "call", "x", "--approval-id"]).is_err());
    }

    #[test]
    fn a_held_call_says_how_to_retry_it() {
        let now = 1_777_636_800_000;
        let args = call_args(&["everything__echo", r#"{"message": "it's me"}"#]);
        let status = held(&[
            ("approval_id", "apv_0123456789abcdefghijkl"),
            ("rule", "tenants[0].policy[0]"),
            ("expires_at_unix_ms", "1777637640000"),
            ("tool", "everything__echo"),
        ]);
        assert_eq!(
            approval_pending_hint(&args, &status, now).unwrap(),
            "the call waits for approval apv_0123456789abcdefghijkl (rule tenants[0].policy[0], \
             expires 2026-05-01T12:14:00Z (in 14m)). Once a person approves it \
             (`toolgate call-approvals approve apv_0123456789abcdefghijkl`), run it again with \
             the approval: toolgate call everything__echo '{\"message\": \"it'\\''s me\"}' \
             --approval-id apv_0123456789abcdefghijkl"
        );
        let bare = held(&[("approval_id", "apv_2")]);
        let no_arguments = call_args(&["everything__echo"]);
        assert!(
            approval_pending_hint(&no_arguments, &bare, now)
                .unwrap()
                .ends_with("approval: toolgate call everything__echo --approval-id apv_2")
        );
        let other = tonic::Status::with_error_details(
            tonic::Code::FailedPrecondition,
            "stale",
            ErrorDetails::with_error_info(
                "TOOL_DEFINITION_CHANGED",
                "toolgate.dev",
                HashMap::new(),
            ),
        );
        assert_eq!(approval_pending_hint(&args, &other, now), None);
        assert_eq!(
            approval_pending_hint(&args, &tonic::Status::unavailable("down"), now),
            None
        );
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("py__add"), "py__add");
    }
}
