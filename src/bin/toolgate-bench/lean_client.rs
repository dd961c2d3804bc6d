//! A lean MCP client over stdio, for the floor experiment of issue 38:
//! rmcp's model types, but none of its service loop. A call writes its own
//! request to the child's stdin (under a lock) after registering a oneshot
//! waiter by id; one reader task reads stdout's lines and completes the
//! waiter of each answer directly. No channel to a service loop, no task
//! per request sent. `toolgate-bench direct-client --client …` runs it
//! next to rmcp's client on the same fast server, each reading answers
//! either as rmcp does or as the gateway's stdio transport does (a tool
//! result in one pass): [`Client`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    DiscoverRequest, DiscoverRequestParams, GetMeta, JsonRpcMessage, JsonRpcVersion2_0,
    NumberOrString, ProtocolVersion, RequestId, RequestMetaObject, ServerJsonRpcMessage,
    ServerResult,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::oneshot;

use super::measure::CallFn;

/// Which client, and how it reads answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    /// rmcp's client and its stdio transport.
    Rmcp,
    /// rmcp's client over a transport that reads a tool result in one
    /// pass and writes from the send future (as the gateway's does).
    RmcpDirect,
    /// The lean client, reading every message as rmcp does.
    Lean,
    /// The lean client, reading a tool result in one pass.
    LeanDirect,
}

/// How answers are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// rmcp's reading of every message (`ServerJsonRpcMessage`).
    Rmcp,
    /// A tool result read in one pass, anything else by rmcp's reading.
    Direct,
}

/// Waiters of the requests sent, by id.
type Waiters = Mutex<HashMap<i64, oneshot::Sender<ServerJsonRpcMessage>>>;

/// One session: the writer under a lock, the waiters the reader completes.
struct Lean {
    stdin: tokio::sync::Mutex<ChildStdin>,
    waiters: Arc<Waiters>,
    next_id: AtomicI64,
    /// The per-request `_meta` of a 2026-07-28 session (as rmcp sends it).
    meta: RequestMetaObject,
}

impl Lean {
    /// Sends `request` and waits for its answer.
    async fn request(&self, mut request: ClientRequest) -> anyhow::Result<ServerResult> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let meta = request.get_meta_mut();
        meta.extend(self.meta.clone());
        meta.set_progress_token(rmcp::model::ProgressToken(NumberOrString::Number(id)));
        let mut line = serde_json::to_vec(&ClientJsonRpcMessage::request(
            request,
            RequestId::Number(id),
        ))?;
        line.push(b'\n');
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().expect("not poisoned").insert(id, tx);
        {
            let mut stdin = self.stdin.lock().await;
            stdin.write_all(&line).await?;
            stdin.flush().await?;
        }
        match rx.await? {
            JsonRpcMessage::Response(response) => Ok(response.result),
            JsonRpcMessage::Error(error) => anyhow::bail!("error answer: {:?}", error.error),
            other => anyhow::bail!("unexpected answer: {other:?}"),
        }
    }
}

/// A tool result answer, read in one pass.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CallReply {
    #[allow(dead_code)]
    jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    result: CallToolResult,
}

/// A line as a message.
fn parse(line: &[u8], reading: Reading) -> Option<ServerJsonRpcMessage> {
    if reading == Reading::Direct
        && let Ok(reply) = serde_json::from_slice::<CallReply>(line)
    {
        return Some(JsonRpcMessage::Response(rmcp::model::JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id: reply.id,
            result: ServerResult::CallToolResult(reply.result),
        }));
    }
    serde_json::from_slice::<ServerJsonRpcMessage>(line).ok()
}

/// Reads stdout's lines and completes their waiters.
async fn read(stdout: ChildStdout, waiters: Arc<Waiters>, reading: Reading) {
    let mut stdout = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match stdout.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let message = parse(&line, reading);
        let id = match &message {
            Some(JsonRpcMessage::Response(response)) => Some(response.id.clone()),
            Some(JsonRpcMessage::Error(error)) => error.id.clone(),
            _ => None,
        };
        if let (Some(message), Some(RequestId::Number(id))) = (message, id) {
            let waiter = waiters.lock().expect("not poisoned").remove(&id);
            if let Some(waiter) = waiter {
                let _ = waiter.send(message);
            }
        }
    }
}

/// Starts `command` (the fast server) with `client`, which discovers it
/// (2026-07-28); returns a call of its `echo`, and what keeps the session
/// alive.
///
/// # Errors
/// The server does not start or answer.
pub async fn start(
    mut command: tokio::process::Command,
    client: Client,
) -> anyhow::Result<(CallFn, Box<dyn std::any::Any>)> {
    let reading = match client {
        Client::Rmcp => {
            use rmcp::ServiceExt;
            let client = ().serve(rmcp::transport::TokioChildProcess::new(command)?).await?;
            return Ok((
                super::paths::rmcp_fn(client.peer().clone()),
                Box::new(client),
            ));
        }
        Client::RmcpDirect => return rmcp_direct(command).await,
        Client::Lean => Reading::Rmcp,
        Client::LeanDirect => Reading::Direct,
    };
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let waiters = Arc::new(Waiters::default());
    let reader = tokio::spawn(read(stdout, Arc::clone(&waiters), reading));
    let info = rmcp::model::ClientConfig::default();
    let lean = Arc::new(Lean {
        stdin: tokio::sync::Mutex::new(stdin),
        waiters,
        next_id: AtomicI64::new(0),
        meta: RequestMetaObject::with_client_context(
            ProtocolVersion::V_2026_07_28,
            info.client_info,
            info.capabilities,
        ),
    });
    match lean
        .request(ClientRequest::DiscoverRequest(DiscoverRequest::new(
            DiscoverRequestParams {},
        )))
        .await?
    {
        ServerResult::DiscoverResult(_) => {}
        other => anyhow::bail!("not a discover result: {other:?}"),
    }
    let session = Arc::clone(&lean);
    let call: CallFn = Arc::new(move || {
        let lean = Arc::clone(&session);
        Box::pin(async move {
            let args = serde_json::json!({"message": "hello"});
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(
                CallToolRequestParams::new("echo")
                    .with_arguments(args.as_object().cloned().unwrap_or_default()),
            ));
            match lean.request(request).await? {
                ServerResult::CallToolResult(_) => Ok(()),
                other => anyhow::bail!("not a tool result: {other:?}"),
            }
        })
    });
    Ok((call, Box::new((child, reader, lean))))
}

/// rmcp's client over [`DirectStdio`].
async fn rmcp_direct(
    mut command: tokio::process::Command,
) -> anyhow::Result<(CallFn, Box<dyn std::any::Any>)> {
    use rmcp::ServiceExt;
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let transport = DirectStdio {
        stdin: Arc::new(tokio::sync::Mutex::new(child.stdin.take().expect("piped"))),
        stdout: BufReader::with_capacity(64 * 1024, child.stdout.take().expect("piped")),
        line: Vec::new(),
    };
    let client = ().serve(transport).await?;
    let call = super::paths::rmcp_fn(client.peer().clone());
    Ok((call, Box::new((child, client))))
}

/// A stdio transport for rmcp's client shaped as the gateway's: each send
/// future writes its line under a lock; a tool result is read in one pass.
struct DirectStdio {
    stdin: Arc<tokio::sync::Mutex<ChildStdin>>,
    stdout: BufReader<ChildStdout>,
    line: Vec<u8>,
}

impl rmcp::transport::Transport<rmcp::RoleClient> for DirectStdio {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let stdin = Arc::clone(&self.stdin);
        let line = serde_json::to_vec(&item).map(|mut line| {
            line.push(b'\n');
            line
        });
        async move {
            let line = line.map_err(std::io::Error::other)?;
            let mut stdin = stdin.lock().await;
            stdin.write_all(&line).await?;
            stdin.flush().await
        }
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            self.line.clear();
            match self.stdout.read_until(b'\n', &mut self.line).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            if let Some(message) = parse(&self.line, Reading::Direct) {
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}
