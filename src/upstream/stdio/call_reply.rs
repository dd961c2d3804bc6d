//! Answers to `tools/call` read straight into a [`CallToolResult`].
//!
//! rmcp reads every server message through serde's buffered `Content`: the
//! whole message is buffered to classify it, then its `result` is offered
//! to the twenty kinds of [`ServerResult`] in turn (an untagged enum, where
//! a tool result is the sixteenth). For the gateway's one hot request that
//! is most of the cost of reading an answer. The transport knows which of
//! its requests are `tools/call` (it wrote them), so an answer to one of
//! them is read as exactly that: one pass over the line into
//! `{jsonrpc, id, result: CallToolResult}`.
//!
//! Anything else takes rmcp's own reading, unchanged: an error answer, an
//! answer with other members, a result rmcp's `CallToolResult` refuses (a
//! task, input required, `{}`), an answer to another request.

use std::collections::HashSet;

use rmcp::model::{
    CallToolResult, ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, JsonRpcResponse,
    JsonRpcVersion2_0, RequestId, ServerJsonRpcMessage, ServerResult,
};
use serde::Deserialize;

/// Ids tracked at most; past this (calls whose answers never came) the set
/// starts over, and the forgotten calls' answers take rmcp's reading.
const MAX_TRACKED: usize = 1024;

/// The ids of this session's `tools/call` requests still unanswered.
#[derive(Debug, Default)]
pub(super) struct CallIds {
    ids: HashSet<RequestId>,
}

impl CallIds {
    /// Notes `message`'s id when it is a `tools/call` request.
    pub(super) fn sent(&mut self, message: &ClientJsonRpcMessage) {
        if let JsonRpcMessage::Request(request) = message
            && matches!(request.request, ClientRequest::CallToolRequest(_))
        {
            if self.ids.len() >= MAX_TRACKED {
                self.ids.clear();
            }
            self.ids.insert(request.id.clone());
        }
    }

    /// `line` as the answer to a tracked `tools/call`, when it is exactly
    /// that; `None` leaves the line to rmcp's reading.
    pub(super) fn read(&mut self, line: &[u8]) -> Option<ServerJsonRpcMessage> {
        if self.ids.is_empty() {
            return None;
        }
        let reply: CallReply = serde_json::from_slice(line).ok()?;
        if !self.ids.remove(&reply.id) {
            return None;
        }
        Some(JsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: reply.jsonrpc,
            id: reply.id,
            result: ServerResult::CallToolResult(reply.result),
        }))
    }

    /// Forgets `message`'s id when it answers a tracked call (an error, or a
    /// result read by rmcp).
    pub(super) fn answered(&mut self, message: &ServerJsonRpcMessage) {
        if self.ids.is_empty() {
            return;
        }
        match message {
            JsonRpcMessage::Response(response) => {
                self.ids.remove(&response.id);
            }
            JsonRpcMessage::Error(error) => {
                if let Some(id) = &error.id {
                    self.ids.remove(id);
                }
            }
            _ => {}
        }
    }
}

/// A JSON-RPC answer carrying a tool result and nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallReply {
    jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    result: CallToolResult,
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolRequest, CallToolRequestParams, ListToolsRequest};

    use super::*;

    fn call(id: i64) -> ClientJsonRpcMessage {
        JsonRpcMessage::request(
            ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParams::new(
                "echo",
            ))),
            RequestId::Number(id),
        )
    }

    fn rmcp_reading(line: &str) -> Option<ServerJsonRpcMessage> {
        serde_json::from_str(line).ok()
    }

    /// The id and tool result of an answer (messages are not `PartialEq`).
    fn tool_result(message: Option<ServerJsonRpcMessage>) -> Option<(RequestId, CallToolResult)> {
        match message? {
            JsonRpcMessage::Response(JsonRpcResponse {
                id,
                result: ServerResult::CallToolResult(result),
                ..
            }) => Some((id, result)),
            _ => None,
        }
    }

    /// Answers servers send to `tools/call`, in the key orders of the
    /// TypeScript and Python SDKs.
    const ANSWERS: &[&str] = &[
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}"#,
        r#"{"result":{"content":[{"type":"text","text":"hi"}],"isError":false},"jsonrpc":"2.0","id":1}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"},{"type":"resource","resource":{"uri":"file:///a","text":"x"}},{"type":"resource_link","uri":"file:///b","name":"b"},{"type":"audio","data":"aGk=","mimeType":"audio/wav"}]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"a":[1,2,{"b":null}]},"_meta":{"k":"v"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"structuredContent":null}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"isError":true,"content":[{"type":"text","text":"no","annotations":{"audience":["user"],"priority":0.5}}]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","content":[{"type":"text","text":"\u00e9\n\"q\""}]}}"#,
    ];

    #[test]
    fn a_tool_result_reads_as_rmcp_reads_it() {
        for line in ANSWERS {
            let mut ids = CallIds::default();
            ids.sent(&call(1));
            let fast = tool_result(ids.read(line.as_bytes())).expect(line);
            let rmcp = tool_result(rmcp_reading(line)).expect(line);
            assert_eq!(fast, rmcp, "{line}");
            assert!(ids.ids.is_empty(), "the id is forgotten once answered");
        }
    }

    /// Lines the direct reading must leave to rmcp: they are not a tool
    /// result, or not only one.
    #[test]
    fn anything_else_is_left_to_rmcp() {
        let others = [
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"t","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":null}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]},"error":{"code":1,"message":"both"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","result":{"content":[]}}"#,
            r#"{"jsonrpc":"1.0","id":1,"result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#,
            "not json",
        ];
        for line in others {
            let mut ids = CallIds::default();
            ids.sent(&call(1));
            assert!(ids.read(line.as_bytes()).is_none(), "{line}");
        }
    }

    #[test]
    fn only_answers_to_tracked_calls_are_read_directly() {
        let mut ids = CallIds::default();
        let line = ANSWERS[0];
        assert!(ids.read(line.as_bytes()).is_none(), "nothing sent");
        ids.sent(&JsonRpcMessage::request(
            ClientRequest::ListToolsRequest(ListToolsRequest::default()),
            RequestId::Number(1),
        ));
        assert!(ids.read(line.as_bytes()).is_none(), "id 1 is a tools/list");
        ids.sent(&call(2));
        assert!(ids.read(line.as_bytes()).is_none(), "id 1 is not a call");
        let answer = ANSWERS[0].replace("\"id\":1", "\"id\":2");
        assert!(ids.read(answer.as_bytes()).is_some());
        assert!(ids.read(answer.as_bytes()).is_none(), "answered once");
    }

    #[test]
    fn errors_and_rmcp_read_answers_forget_their_id() {
        let mut ids = CallIds::default();
        ids.sent(&call(1));
        ids.sent(&call(2));
        let error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad"}}"#;
        ids.answered(&rmcp_reading(error).unwrap());
        let empty = r#"{"jsonrpc":"2.0","id":2,"result":{}}"#;
        ids.answered(&rmcp_reading(empty).unwrap());
        assert!(ids.ids.is_empty());
    }

    #[test]
    fn the_set_is_bounded() {
        let mut ids = CallIds::default();
        for id in 0..(MAX_TRACKED as i64 * 3) {
            ids.sent(&call(id));
        }
        assert!(ids.ids.len() <= MAX_TRACKED);
    }
}
