//! `ListToolsResponse` as the server writes it: the tools encoded ahead of
//! time, once per catalog snapshot (and per distinct policy view), and the
//! small rest encoded per call.
//!
//! A protobuf message is the concatenation of its fields' encodings, so the
//! bytes of `repeated Tool tools = 1` kept from an earlier encoding followed
//! by the encoding of the other fields are exactly the encoding of the whole
//! message. The generated server (see `build.rs`) answers `ListTools` and
//! `WatchTools` with [`ListToolsReply`]; clients decode it as the
//! `ListToolsResponse` it is.

use std::fmt;

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};

use crate::pb;

/// The encoded `tools` field of one listing, kept with the catalog
/// snapshot it lists.
#[derive(Clone, Default)]
pub struct EncodedTools {
    /// The encoding of `repeated Tool tools = 1` (every entry with its tag).
    bytes: Bytes,
    /// How many tools `bytes` holds.
    count: usize,
    /// The sum of their `estimated_tokens`.
    total_estimated_tokens: u32,
}

impl EncodedTools {
    /// Encodes `tools` once.
    #[must_use]
    pub fn encode(tools: Vec<pb::Tool>) -> Self {
        let count = tools.len();
        let total_estimated_tokens = total_tokens(&tools);
        // A message with only its first field set encodes as that field.
        let bytes = prost::Message::encode_to_vec(&pb::ListToolsResponse {
            tools,
            ..Default::default()
        });
        Self {
            bytes: Bytes::from(bytes),
            count,
            total_estimated_tokens,
        }
    }
}

impl fmt::Debug for EncodedTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodedTools")
            .field("count", &self.count)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// The sum of the tools' token estimates.
#[must_use]
pub fn total_tokens(tools: &[pb::Tool]) -> u32 {
    tools
        .iter()
        .fold(0u32, |sum, t| sum.saturating_add(t.estimated_tokens))
}

/// A `ListToolsResponse` on its way out: `rest` holds every field but
/// the tools that were encoded ahead (its own `tools` are empty then).
#[derive(Clone, Default)]
pub struct ListToolsReply {
    tools: EncodedTools,
    /// Every other field, encoded per call (statuses change per caller:
    /// consent states of per-user servers).
    pub rest: pb::ListToolsResponse,
}

impl ListToolsReply {
    /// A reply of the pre-encoded `tools` and the other fields of `rest`
    /// (whose own tools are dropped; `total_estimated_tokens` is that of
    /// `tools`).
    #[must_use]
    pub fn encoded(tools: EncodedTools, mut rest: pb::ListToolsResponse) -> Self {
        rest.tools = Vec::new();
        rest.total_estimated_tokens = tools.total_estimated_tokens;
        Self { tools, rest }
    }

    /// A reply encoded as a whole, per call.
    #[must_use]
    pub fn built(message: pb::ListToolsResponse) -> Self {
        Self {
            tools: EncodedTools::default(),
            rest: message,
        }
    }
}

impl fmt::Debug for ListToolsReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListToolsReply")
            .field("tools", &self.tools)
            .field("catalog_version", &self.rest.catalog_version)
            .field("servers", &self.rest.servers.len())
            .finish_non_exhaustive()
    }
}

impl prost::Message for ListToolsReply {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        // Field 1 first, as a plain encoder would write it.
        buf.put_slice(&self.tools.bytes);
        self.rest.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Decoded replies (nothing in the server decodes one) are plain.
        self.rest.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.tools.bytes.len() + self.rest.encoded_len()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// What a client reads.
    fn decode(reply: &ListToolsReply) -> pb::ListToolsResponse {
        pb::ListToolsResponse::decode(reply.encode_to_vec().as_slice()).unwrap()
    }

    fn tool(name: &str, tokens: u32) -> pb::Tool {
        pb::Tool {
            name: name.to_owned(),
            description: format!("{name} does things"),
            input_schema_json: r#"{"type":"object"}"#.to_owned(),
            estimated_tokens: tokens,
            ..Default::default()
        }
    }

    fn rest() -> pb::ListToolsResponse {
        pb::ListToolsResponse {
            catalog_version: "v1".to_owned(),
            servers: vec![pb::ServerStatus {
                name: "a".to_owned(),
                connected: true,
                tool_count: 2,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn an_encoded_reply_is_byte_for_byte_the_plain_message() {
        let tools = vec![tool("a__one", 7), tool("a__two", 5)];
        let plain = pb::ListToolsResponse {
            tools: tools.clone(),
            total_estimated_tokens: 12,
            ..rest()
        };
        let reply = ListToolsReply::encoded(EncodedTools::encode(tools), rest());
        assert_eq!(reply.encode_to_vec(), plain.encode_to_vec());
        assert_eq!(reply.encoded_len(), plain.encoded_len());
        assert_eq!(decode(&reply), plain);
        let built = ListToolsReply::built(plain.clone());
        assert_eq!(built.encode_to_vec(), plain.encode_to_vec());
    }

    #[test]
    fn the_rest_changes_per_call_without_touching_the_tools() {
        let encoded = EncodedTools::encode(vec![tool("a__one", 7)]);
        let mut reply = ListToolsReply::encoded(encoded.clone(), rest());
        reply.rest.servers[0].error = "consent needed".to_owned();
        let decoded = decode(&reply);
        assert_eq!(decoded.tools.len(), 1);
        assert_eq!(decoded.servers[0].error, "consent needed");
        assert_eq!(decoded.total_estimated_tokens, 7);
        // The rest's own tools never go out twice.
        let mut with_tools = rest();
        with_tools.tools.push(tool("a__stale", 1));
        let reply = ListToolsReply::encoded(encoded, with_tools);
        let decoded = decode(&reply);
        assert_eq!(decoded.tools.len(), 1);
        assert_eq!(decoded.tools[0].name, "a__one");
    }

    #[test]
    fn debug_shows_sizes_not_contents() {
        let reply = ListToolsReply::encoded(EncodedTools::encode(vec![tool("a__x", 1)]), rest());
        let text = format!("{reply:?}");
        assert!(text.contains("count: 1"), "{text}");
        assert!(!text.contains("does things"), "{text}");
    }
}
