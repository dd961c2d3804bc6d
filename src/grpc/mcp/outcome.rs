//! The calls' outcomes as the transport's messages: each response is the
//! [`Reply`] of its operation's output, with `common.result_type` saying
//! whether it is complete or hands the client a round of questions
//! ([`super::rounds`]). A response replayed for an idempotency key says
//! so in `common.metadata` (`"toolgate/replayed": true`).

use rmcp::model::{CallToolResult, GetPromptResult, ReadResourceResult};

use super::{content, rounds, structs};
use crate::calls::{Outcome, Recorded, Reply, Unencodable};
use crate::pb::mcp;
use crate::upstream::Completion;

/// The `common.metadata` key of a replayed response.
const REPLAYED_KEY: &str = "toolgate/replayed";

/// Whether `common` hands out questions.
fn asks(common: Option<&mcp::ResponseFields>) -> bool {
    common.is_some_and(|c| c.result_type == i32::from(mcp::ResultType::InputRequired))
}

/// Marks `common` as replayed.
fn mark_replayed(common: &mut Option<mcp::ResponseFields>) {
    let common = common.get_or_insert_with(rounds::complete);
    let metadata = common.metadata.get_or_insert_with(Default::default);
    metadata.fields.insert(
        REPLAYED_KEY.to_owned(),
        structs::to_value(serde_json::Value::Bool(true)),
    );
}

/// The complete `common` fields carrying a result's `_meta`.
fn complete(meta: Option<rmcp::model::MetaObject>) -> mcp::ResponseFields {
    mcp::ResponseFields {
        metadata: content::metadata(meta, None),
        ..rounds::complete()
    }
}

impl Reply<CallToolResult> for mcp::CallToolResponse {
    fn encode(outcome: Outcome<CallToolResult>, server: &str) -> Result<Self, Unencodable> {
        match outcome {
            Outcome::Done(result) => Ok(Self {
                content: result
                    .content
                    .into_iter()
                    .map(|block| content::block(block, server).map(content::tool_content))
                    .collect::<Result<_, _>>()
                    .map_err(|e| Unencodable(e.to_string()))?,
                // The transport carries structured content as an object;
                // any other JSON value is left to the text content.
                structured_content: match result.structured_content {
                    Some(serde_json::Value::Object(object)) => Some(structs::to_struct(object)),
                    _ => None,
                },
                is_error: result.is_error.unwrap_or(false),
                common: Some(complete(result.meta)),
            }),
            Outcome::Questions(asked) => Ok(Self {
                common: Some(rounds::asking(asked)),
                ..Self::default()
            }),
            // Calls on this transport never accept a task.
            Outcome::Task(_) => Err(Unencodable(
                "the call became a task, which the transport cannot carry".to_owned(),
            )),
        }
    }

    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }

    fn asks(&self) -> bool {
        asks(self.common.as_ref())
    }

    fn replayed(&mut self) {
        mark_replayed(&mut self.common);
    }
}

impl Recorded for mcp::CallToolResponse {
    fn is_error(&self) -> bool {
        self.is_error
    }

    fn recorded_bytes(&self, guarded: bool) -> Option<u64> {
        guarded.then(|| prost::Message::encoded_len(self) as u64)
    }
}

impl Reply<GetPromptResult> for mcp::GetPromptResponse {
    fn encode(outcome: Outcome<GetPromptResult>, server: &str) -> Result<Self, Unencodable> {
        match outcome {
            Outcome::Done(result) => Ok(Self {
                description: result.description.unwrap_or_default(),
                messages: result
                    .messages
                    .into_iter()
                    .map(|message| {
                        content::block(message.content, server)
                            .map(|block| content::prompt_message(&message.role, block))
                    })
                    .collect::<Result<_, _>>()
                    .map_err(|e| Unencodable(e.to_string()))?,
                common: Some(complete(result.meta)),
            }),
            Outcome::Questions(asked) => Ok(Self {
                common: Some(rounds::asking(asked)),
                ..Self::default()
            }),
            Outcome::Task(_) => Err(Unencodable("a prompt became a task".to_owned())),
        }
    }

    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }

    fn asks(&self) -> bool {
        asks(self.common.as_ref())
    }
}

impl Recorded for mcp::GetPromptResponse {
    fn recorded_bytes(&self, _guarded: bool) -> Option<u64> {
        Some(prost::Message::encoded_len(self) as u64)
    }
}

impl Reply<ReadResourceResult> for mcp::ReadResourceResponse {
    fn encode(outcome: Outcome<ReadResourceResult>, _server: &str) -> Result<Self, Unencodable> {
        match outcome {
            Outcome::Done(result) => Ok(Self {
                resource: result
                    .contents
                    .into_iter()
                    .map(content::contents)
                    .collect::<Result<_, _>>()
                    .map_err(|e| Unencodable(e.to_string()))?,
                ttl: result.ttl_ms.map(|ms| prost_types::Duration {
                    seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
                    nanos: i32::try_from(ms % 1000).unwrap_or_default() * 1_000_000,
                }),
                cache_scope: match result.cache_scope {
                    Some(rmcp::model::CacheScope::Public) => mcp::CacheScope::Public.into(),
                    Some(rmcp::model::CacheScope::Private) => mcp::CacheScope::Private.into(),
                    _ => mcp::CacheScope::Unspecified.into(),
                },
                common: Some(complete(result.meta)),
            }),
            Outcome::Questions(asked) => Ok(Self {
                common: Some(rounds::asking(asked)),
                ..Self::default()
            }),
            Outcome::Task(_) => Err(Unencodable("a read became a task".to_owned())),
        }
    }

    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }

    fn asks(&self) -> bool {
        asks(self.common.as_ref())
    }
}

impl Recorded for mcp::ReadResourceResponse {
    fn recorded_bytes(&self, _guarded: bool) -> Option<u64> {
        Some(prost::Message::encoded_len(self) as u64)
    }
}

impl Reply<Completion> for mcp::CompletionResponse {
    fn encode(outcome: Outcome<Completion>, _server: &str) -> Result<Self, Unencodable> {
        match outcome {
            Outcome::Done(Completion {
                values,
                total,
                has_more,
            }) => Ok(Self {
                common: Some(rounds::complete()),
                values,
                total_matches: total.map(i64::from),
                has_more,
            }),
            Outcome::Questions(_) | Outcome::Task(_) => {
                Err(Unencodable("a completion asked questions".to_owned()))
            }
        }
    }

    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }
}

impl Recorded for mcp::CompletionResponse {}
