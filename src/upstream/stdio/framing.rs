//! Newline-delimited JSON-RPC over a child's stdin and stdout, with the
//! incoming line length bounded by `limits.max_result_bytes`.
//!
//! rmcp's own stdio transport drops a line over its fixed 16 MiB cap without
//! a word, so the request it answered waits for its deadline. Here a line
//! over the limit is skipped to its newline without being buffered; the
//! JSON-RPC `id` is recovered from its first or last few KiB, and the
//! request gets a synthesized error that maps to
//! [`UpstreamError::TooLarge`](crate::upstream::UpstreamError::TooLarge)
//! at once. The session carries on. When the id cannot be recovered the
//! session ends instead (a reconnect follows), so no call waits in vain.
//!
//! The kept start is read by serde_json's own reader (a visitor that notes
//! each top-level key before its value and skips the rest), stopping with
//! its error where the prefix was cut: no hand-written JSON scanning. Being
//! a validating reader it also stops at the first thing that is not JSON
//! (e.g. `NaN`, a bad escape) and sees escaped keys as what they spell: a
//! line broken before its `result` or `method` key is not recognised (the
//! session ends), where a byte scanner would have read on. The end of an
//! oversized line is read by serde_json too ([`id_from_tail`]).

use std::io;
use std::sync::{Arc, LazyLock};

use rmcp::RoleClient;
use rmcp::model::{
    ClientJsonRpcMessage, ErrorCode, ErrorData, JsonRpcMessage, RequestId, ServerJsonRpcMessage,
};
use rmcp::transport::Transport;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::call_reply::CallIds;

/// What a line may have beyond `max_result_bytes`: the JSON-RPC envelope
/// (`{"jsonrpc":"2.0","id":…,"result":…}`) around the result.
const ENVELOPE_SLACK: usize = 4096;
/// How much of an oversized line's start and end is kept to find its id.
const KEPT: usize = 4096;
/// Read buffer of stdout.
const READ_BUFFER: usize = 64 * 1024;

/// The JSON-RPC error code of a synthesized "result too large" answer. The
/// code alone proves nothing (a server may send it too): only the marker
/// with this process's token does.
const TOO_LARGE_CODE: ErrorCode = ErrorCode(-32_099);
/// The key of the marker in the error's `data`.
const TOO_LARGE_MARKER: &str = "toolgate/resultTooLarge";
/// A random token per gateway process, so a server cannot forge the marker.
static TOO_LARGE_TOKEN: LazyLock<u64> = LazyLock::new(|| fastrand::u64(..));

/// The synthesized error answer for a result over `max` bytes.
fn too_large_error(max: usize) -> ErrorData {
    ErrorData::new(
        TOO_LARGE_CODE,
        format!("the server's answer exceeds {max} bytes"),
        Some(serde_json::json!({
            TOO_LARGE_MARKER: { "token": *TOO_LARGE_TOKEN, "max": max }
        })),
    )
}

/// The limit, when `error` is an answer synthesized by [`too_large_error`]
/// in this process.
pub(in crate::upstream) fn too_large_limit(error: &ErrorData) -> Option<usize> {
    if error.code != TOO_LARGE_CODE {
        return None;
    }
    let marker = error.data.as_ref()?.get(TOO_LARGE_MARKER)?;
    if marker.get("token")?.as_u64()? != *TOO_LARGE_TOKEN {
        return None;
    }
    usize::try_from(marker.get("max")?.as_u64()?).ok()
}

/// The child's stdin, shared by the send futures; `None` once closed.
type Stdin<W> = Arc<Mutex<Option<W>>>;

/// The client side of a stdio session: messages to the child's stdin
/// (written by each send future itself), messages from its stdout (bounded
/// lines).
pub(in crate::upstream) struct StdioTransport<R, W> {
    lines: LineReader<R>,
    stdin: Stdin<W>,
    /// Cancelled: stdin is closed.
    close: CancellationToken,
    max_result_bytes: usize,
    /// This session's `tools/call` requests awaiting their answer.
    calls: CallIds,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin + Send + 'static> StdioTransport<R, W> {
    /// A transport over `stdout` and `stdin`; cancelling `close` (or
    /// dropping the transport) closes stdin.
    pub(in crate::upstream) fn new(
        stdout: R,
        stdin: W,
        max_result_bytes: usize,
        close: CancellationToken,
    ) -> Self {
        let stdin = Arc::new(Mutex::new(Some(stdin)));
        tokio::spawn(close_on_cancel(Arc::clone(&stdin), close.clone()));
        Self {
            lines: LineReader::new(stdout, max_result_bytes.saturating_add(ENVELOPE_SLACK)),
            stdin,
            close,
            max_result_bytes,
            calls: CallIds::default(),
        }
    }
}

impl<R, W> Drop for StdioTransport<R, W> {
    fn drop(&mut self) {
        self.close.cancel();
    }
}

/// Closes stdin (drops it) once `close` is cancelled; a write under way
/// gives the lock up as soon as it sees the cancellation.
async fn close_on_cancel<W>(stdin: Stdin<W>, close: CancellationToken) {
    close.cancelled().await;
    stdin.lock().await.take();
}

/// Writes one framed message to stdin, unless it is (or gets) closed.
/// A write that does not finish (it failed, `close` came first, or the
/// future was dropped half-way) closes stdin: the child never sees a
/// later message glued to half a line.
async fn write_frame<W: AsyncWrite + Unpin>(
    stdin: &Mutex<Option<W>>,
    close: &CancellationToken,
    bytes: &[u8],
) -> io::Result<()> {
    let stdin = tokio::select! {
        biased;
        _ = close.cancelled() => return Err(closed()),
        stdin = stdin.lock() => stdin,
    };
    let mut write = Write {
        stdin,
        finished: false,
    };
    let Some(writer) = write.stdin.as_mut() else {
        return Err(closed());
    };
    let written = tokio::select! {
        biased;
        _ = close.cancelled() => Err(closed()),
        written = async {
            writer.write_all(bytes).await?;
            writer.flush().await
        } => written,
    };
    write.finished = written.is_ok();
    written
}

/// A write under way, holding stdin's lock: dropped unfinished, it closes
/// stdin.
struct Write<'a, W> {
    stdin: tokio::sync::MutexGuard<'a, Option<W>>,
    finished: bool,
}

impl<W> Drop for Write<'_, W> {
    fn drop(&mut self) {
        if !self.finished {
            self.stdin.take();
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the server's stdin is closed")
}

impl<R, W> Transport<RoleClient> for StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.calls.sent(&item);
        let stdin = Arc::clone(&self.stdin);
        let close = self.close.clone();
        let framed = serde_json::to_vec(&item).map(|mut bytes| {
            bytes.push(b'\n');
            bytes
        });
        async move {
            let bytes = framed.map_err(io::Error::other)?;
            write_frame(&stdin, &close, &bytes).await
        }
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            match self.lines.next().await {
                Next::Line(line) => {
                    let line = trim(&line);
                    if let Some(message) = self.calls.read(line) {
                        return Some(message);
                    }
                    if let Some(message) = parse(line) {
                        self.calls.answered(&message);
                        return Some(message);
                    }
                }
                Next::Oversized { head, tail, len } => match oversized(&head, &tail) {
                    Oversized::Response(id) => {
                        tracing::warn!(
                            bytes = len,
                            limit = self.max_result_bytes,
                            "the server's answer exceeds limits.max_result_bytes; that request fails"
                        );
                        let message =
                            JsonRpcMessage::error(too_large_error(self.max_result_bytes), Some(id));
                        self.calls.answered(&message);
                        return Some(message);
                    }
                    Oversized::Other => {
                        tracing::warn!(
                            bytes = len,
                            limit = self.max_result_bytes,
                            "a message of the server over limits.max_result_bytes was dropped"
                        );
                    }
                    Oversized::Unknown => {
                        tracing::warn!(
                            bytes = len,
                            limit = self.max_result_bytes,
                            "the server sent a message over limits.max_result_bytes whose id could not be read; ending the session"
                        );
                        return None;
                    }
                },
                Next::Eof => return None,
                Next::Io(error) => {
                    tracing::debug!(%error, "reading the server's stdout failed");
                    return None;
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.close.cancel();
        Ok(())
    }
}

/// A line without its line ending and byte order mark.
fn trim(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
}

/// A trimmed line as a message, read by rmcp; `None` (logged) when it is
/// not one.
fn parse(line: &[u8]) -> Option<ServerJsonRpcMessage> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice(line) {
        Ok(message) => Some(message),
        Err(error) => {
            // Not JSON-RPC, or a notification rmcp does not know: ignored
            // (as rmcp's own transport and the other MCP SDKs do).
            tracing::debug!(%error, bytes = line.len(), "ignoring a line of the server's stdout that is not an MCP message");
            None
        }
    }
}

/// What an oversized line was.
#[derive(Debug, PartialEq)]
enum Oversized {
    /// An answer to the request with this id.
    Response(RequestId),
    /// A request or notification of the server.
    Other,
    /// Nothing recognisable.
    Unknown,
}

/// Classifies an oversized line from its first and last bytes.
fn oversized(head: &[u8], tail: &[u8]) -> Oversized {
    let scan = scan_head(head);
    if scan.method {
        return Oversized::Other;
    }
    if !scan.response {
        return Oversized::Unknown;
    }
    match scan.id.or_else(|| id_from_tail(tail)) {
        Some(id) => Oversized::Response(id),
        None => Oversized::Unknown,
    }
}

/// What the start of a JSON object shows of its top-level members.
#[derive(Debug, Default)]
struct HeadScan {
    id: Option<RequestId>,
    /// A `result` or `error` member was seen.
    response: bool,
    /// A `method` member was seen.
    method: bool,
}

/// Reads the top-level keys of a JSON object's beginning (possibly cut
/// anywhere) with serde_json's own reader: every member's key is noted
/// before its value is read, and values not wanted are skipped whole
/// ([`IgnoredAny`]). Where the prefix ends (or anything that is not JSON
/// comes) the reader fails, which only ends the scan: what was seen stays.
fn scan_head(head: &[u8]) -> HeadScan {
    let head = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
    let mut scan = HeadScan::default();
    let mut reader = serde_json::Deserializer::from_slice(head);
    // The error is where the prefix was cut: expected.
    let _ = serde::Deserializer::deserialize_map(&mut reader, HeadVisitor(&mut scan));
    scan
}

/// Notes in its [`HeadScan`] the top-level members of an object as they
/// are read.
struct HeadVisitor<'a>(&'a mut HeadScan);

impl<'de> Visitor<'de> for HeadVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<(), A::Error> {
        while let Some(key) = members.next_key::<String>()? {
            match key.as_str() {
                // A number or a string; anything else is no id.
                "id" => {
                    let value = members.next_value::<serde_json::Value>()?;
                    self.0.id = serde_json::from_value(value).ok();
                    continue;
                }
                "result" | "error" => self.0.response = true,
                "method" => self.0.method = true,
                _ => {}
            }
            members.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

/// The top-level `id` of a JSON object from its last bytes: the members
/// from an `"id"` key to the end must parse as an object on their own,
/// which an `"id"` of a nested object (more closing brackets) or inside a
/// string (its quotes escaped) never does.
fn id_from_tail(tail: &[u8]) -> Option<RequestId> {
    let tail = tail.trim_ascii_end();
    let mut candidate = Vec::with_capacity(tail.len() + 1);
    let starts: Vec<usize> = tail
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"\"id\"")
        .map(|(i, _)| i)
        .collect();
    for &start in starts.iter().rev() {
        let before = tail[..start].trim_ascii_end().last();
        if !matches!(before, Some(b',') | Some(b'{')) {
            continue;
        }
        candidate.clear();
        candidate.push(b'{');
        candidate.extend_from_slice(&tail[start..]);
        if let Ok(serde_json::Value::Object(members)) =
            serde_json::from_slice::<serde_json::Value>(&candidate)
            && let Some(id) = members.get("id")
        {
            return serde_json::from_value(id.clone()).ok();
        }
    }
    None
}

/// The outcome of reading one line.
enum Next {
    Line(Vec<u8>),
    Oversized {
        head: Vec<u8>,
        tail: Vec<u8>,
        len: usize,
    },
    Eof,
    Io(io::Error),
}

/// Reads `\n`-terminated lines of at most `max` bytes; a longer line is
/// skipped without being buffered (its first and last [`KEPT`] bytes are
/// kept). Cancel-safe: a read dropped half-way resumes where it stopped.
struct LineReader<R> {
    read: BufReader<R>,
    /// The line so far; for an oversized one, its first bytes.
    line: Vec<u8>,
    /// The last bytes of an oversized line so far.
    tail: Vec<u8>,
    /// Bytes of the current line when it is oversized.
    oversized: Option<usize>,
    max: usize,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(read: R, max: usize) -> Self {
        Self {
            read: BufReader::with_capacity(READ_BUFFER, read),
            line: Vec::new(),
            tail: Vec::new(),
            oversized: None,
            max,
        }
    }

    async fn next(&mut self) -> Next {
        loop {
            let available = match self.read.fill_buf().await {
                Ok(available) => available,
                Err(error) => return Next::Io(error),
            };
            if available.is_empty() {
                // A last line without its newline is incomplete: dropped.
                return Next::Eof;
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let piece = &available[..take];
            match self.oversized.as_mut() {
                Some(len) => {
                    *len += take;
                    keep_tail(&mut self.tail, piece);
                }
                None if self.line.len() + take > self.max => {
                    self.oversized = Some(self.line.len() + take);
                    self.tail.clear();
                    keep_tail(&mut self.tail, &self.line);
                    keep_tail(&mut self.tail, piece);
                    if self.line.len() < KEPT {
                        let more = (KEPT - self.line.len()).min(take);
                        self.line.extend_from_slice(&piece[..more]);
                    } else {
                        self.line.truncate(KEPT);
                    }
                }
                None => self.line.extend_from_slice(piece),
            }
            self.read.consume(take);
            if newline.is_some() {
                let line = std::mem::take(&mut self.line);
                return match self.oversized.take() {
                    None => Next::Line(line),
                    Some(len) => {
                        let mut tail = std::mem::take(&mut self.tail);
                        if tail.len() > KEPT {
                            tail.drain(..tail.len() - KEPT);
                        }
                        Next::Oversized {
                            head: line,
                            tail,
                            len,
                        }
                    }
                };
            }
        }
    }
}

/// Appends `bytes` to `tail`, keeping (at least) the last [`KEPT`] bytes
/// and at most twice that.
fn keep_tail(tail: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.len() >= KEPT {
        tail.clear();
        tail.extend_from_slice(&bytes[bytes.len() - KEPT..]);
        return;
    }
    tail.extend_from_slice(bytes);
    if tail.len() > 2 * KEPT {
        tail.drain(..tail.len() - KEPT);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn id(n: i64) -> RequestId {
        RequestId::Number(n)
    }

    #[test]
    fn the_id_is_found_at_the_start() {
        let head = br#"{"jsonrpc":"2.0","id":17,"result":{"content":[{"type":"text","text":"xxxx"#;
        assert_eq!(oversized(head, b""), Oversized::Response(id(17)));
        let head = br#" {"id" : "a\"b", "result": {"#;
        assert_eq!(
            oversized(head, b""),
            Oversized::Response(RequestId::String("a\"b".into()))
        );
    }

    #[test]
    fn a_nested_id_is_not_the_id() {
        let head =
            br#"{"jsonrpc":"2.0","result":{"structuredContent":{"id":99},"text":"{\"id\":5,"#;
        let tail = br#"xx","id":98}},"jsonrpc":"2.0","id":4}"#;
        assert_eq!(oversized(head, tail), Oversized::Response(id(4)));
    }

    #[test]
    fn the_id_is_found_at_the_end() {
        // The TypeScript SDK writes `{result, jsonrpc, id}`.
        let head = br#"{"result":{"content":[{"type":"text","text":"xxxx"#;
        let tail = b"xxxx\"}]},\"jsonrpc\":\"2.0\",\"id\":42}\r\n";
        assert_eq!(oversized(head, tail), Oversized::Response(id(42)));
        let tail = br#"xx \",\"id\":7}"}]},"id":"req-1" }"#;
        assert_eq!(
            oversized(head, tail),
            Oversized::Response(RequestId::String("req-1".into()))
        );
    }

    #[test]
    fn a_start_cut_anywhere_keeps_what_was_read() {
        // Cut inside a key: that key was not seen.
        let head = br#"{"jsonrpc":"2.0","id":5,"res"#;
        assert_eq!(oversized(head, b""), Oversized::Unknown);
        // Cut right after the key: a response, its id already read.
        let head = br#"{"jsonrpc":"2.0","id":5,"result":"#;
        assert_eq!(oversized(head, b""), Oversized::Response(id(5)));
        // Brackets and quotes inside a top-level string, an escaped key,
        // and an id that is no id (null) followed by the real one.
        let head = br#"{"x":"}]{\"","id":null,"\u0069d":6,"error":{"code":"#;
        assert_eq!(oversized(head, b""), Oversized::Response(id(6)));
        // Not JSON before the `result` key: the reading stops there.
        let head = br#"{"id":3,"x":NaN,"result":{"#;
        assert_eq!(oversized(head, b"xxxx"), Oversized::Unknown);
    }

    #[test]
    fn requests_and_unknown_lines_are_told_apart() {
        let head = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"xx"#;
        assert_eq!(oversized(head, b"xx\"}}"), Oversized::Other);
        assert_eq!(oversized(b"xxxxxxxx", b"xxxx"), Oversized::Unknown);
        let head = br#"{"jsonrpc":"2.0","result":{"x":"xx"#;
        assert_eq!(oversized(head, b"xxxx"), Oversized::Unknown);
    }

    #[test]
    fn the_marker_is_recognised_only_with_this_process_token() {
        let error = too_large_error(1024);
        assert_eq!(too_large_limit(&error), Some(1024));
        let forged = ErrorData::new(
            TOO_LARGE_CODE,
            "x",
            Some(
                serde_json::json!({ TOO_LARGE_MARKER: { "token": TOO_LARGE_TOKEN.wrapping_add(1), "max": 1 } }),
            ),
        );
        assert_eq!(too_large_limit(&forged), None);
    }

    fn call(n: i64, text: &str) -> ClientJsonRpcMessage {
        use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
        let mut arguments = serde_json::Map::new();
        arguments.insert("message".into(), text.into());
        JsonRpcMessage::request(
            ClientRequest::CallToolRequest(CallToolRequest::new(
                CallToolRequestParams::new("echo").with_arguments(arguments),
            )),
            id(n),
        )
    }

    /// A transport whose child ends are returned: what it wrote to the
    /// child's stdin, and where the child's stdout is written.
    fn transport(
        pipe: usize,
    ) -> (
        StdioTransport<tokio::io::DuplexStream, tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        tokio::io::DuplexStream,
        CancellationToken,
    ) {
        let (stdin, child_stdin) = tokio::io::duplex(pipe);
        let (child_stdout, stdout) = tokio::io::duplex(pipe);
        let close = CancellationToken::new();
        let transport = StdioTransport::new(stdout, stdin, 1 << 20, close.clone());
        (transport, child_stdin, child_stdout, close)
    }

    /// What the child reads from its stdin until the gateway closes it
    /// (within 5 s, or the test fails).
    async fn until_closed(mut stdin: impl AsyncRead + Unpin) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stdin.read_to_end(&mut rest))
            .await
            .expect("stdin reaches its end")
            .unwrap();
        rest
    }

    /// A send of a line longer than the pipe, started and left waiting for
    /// the child to read.
    async fn blocked_send(
        transport: &mut StdioTransport<tokio::io::DuplexStream, tokio::io::DuplexStream>,
    ) -> tokio::task::JoinHandle<io::Result<()>> {
        let sending = tokio::spawn(transport.send(call(1, &"x".repeat(10_000))));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!sending.is_finished(), "the pipe is full: the write waits");
        sending
    }

    #[tokio::test]
    async fn calls_go_out_as_lines_and_their_answers_come_back() {
        let (mut transport, child_stdin, mut child_stdout, _close) = transport(64 * 1024);
        transport.send(call(7, "hello")).await.unwrap();
        transport.send(call(8, "again")).await.unwrap();
        let mut lines = BufReader::new(child_stdin).lines();
        for (n, text) in [(7, "hello"), (8, "again")] {
            let line = lines.next_line().await.unwrap().unwrap();
            let sent: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(sent["id"], n);
            assert_eq!(sent["method"], "tools/call");
            assert_eq!(sent["params"]["arguments"]["message"], text);
        }
        child_stdout
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"again\"}]}}\n")
            .await
            .unwrap();
        match transport.receive().await {
            Some(JsonRpcMessage::Response(response)) => {
                assert_eq!(response.id, id(8));
                let rmcp::model::ServerResult::CallToolResult(result) = response.result else {
                    panic!("not a tool result: {:?}", response.result);
                };
                assert_eq!(result.content.len(), 1);
            }
            other => panic!("expected the answer, got {other:?}"),
        }
        // Dropping the transport closes the child's stdin.
        drop(transport);
        assert!(until_closed(lines.into_inner()).await.is_empty());
        let _ = child_stdout.shutdown().await;
    }

    #[tokio::test]
    async fn a_write_to_a_child_that_does_not_read_ends_at_close() {
        let (mut transport, child_stdin, _child_stdout, _close) = transport(64);
        let sending = blocked_send(&mut transport).await;
        transport.close().await.unwrap();
        let written = tokio::time::timeout(Duration::from_secs(5), sending)
            .await
            .expect("the write gives up at close")
            .unwrap();
        assert_eq!(written.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        // A send after close fails at once, and stdin is closed.
        assert!(transport.send(call(2, "late")).await.is_err());
        until_closed(child_stdin).await;
    }

    #[tokio::test]
    async fn a_write_dropped_half_way_closes_stdin() {
        let (mut transport, child_stdin, _child_stdout, _close) = transport(64);
        let sending = blocked_send(&mut transport).await;
        sending.abort();
        let _ = sending.await;
        // The child got part of a line, then the end of its stdin: never
        // a later message glued to it.
        let got = until_closed(child_stdin).await;
        assert!(
            !got.is_empty() && !got.ends_with(b"\n"),
            "{} bytes",
            got.len()
        );
        assert!(transport.send(call(2, "next")).await.is_err());
    }

    #[tokio::test]
    async fn long_lines_are_skipped_and_short_ones_kept() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{{\"text\":\"{}\"}}}}\n",
            "y".repeat(100_000)
        );
        let input = format!("{{\"a\":1}}\n{big}{{\"b\":2}}\npartial");
        // A small read buffer makes lines span many reads.
        let reader = tokio::io::BufReader::with_capacity(7, input.as_bytes());
        let mut lines = LineReader::new(reader, 1000);
        assert!(matches!(lines.next().await, Next::Line(l) if l == b"{\"a\":1}\n"));
        match lines.next().await {
            Next::Oversized { head, tail, len } => {
                assert_eq!(len, big.len());
                assert_eq!(head.len(), KEPT);
                assert!(tail.len() <= KEPT);
                assert_eq!(oversized(&head, &tail), Oversized::Response(id(3)));
            }
            _ => panic!("expected an oversized line"),
        }
        assert!(matches!(lines.next().await, Next::Line(l) if l == b"{\"b\":2}\n"));
        assert!(matches!(lines.next().await, Next::Eof));
    }
}
