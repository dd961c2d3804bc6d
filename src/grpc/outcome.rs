//! The calls' outcomes as `toolgate.v1` messages: each response is the
//! [`Reply`] of its operation's output (a result converted, a round of
//! questions, a task).

use rmcp::model::{CallToolResult, GetPromptResult, ReadResourceResult, ResourceContents};

use super::{convert, questions, tasks};
use crate::calls::{Outcome, Recorded, Reply, Unencodable};
use crate::pb;
use crate::upstream::Completion;

impl Reply<CallToolResult> for pb::InvokeToolResponse {
    fn encode(outcome: Outcome<CallToolResult>, server: &str) -> Result<Self, Unencodable> {
        match outcome {
            Outcome::Done(result) => {
                convert::invoke_response(result, server).map_err(|e| Unencodable(e.to_string()))
            }
            Outcome::Questions(asked) => Ok(Self {
                input_required: Some(questions::questions(asked)),
                ..Self::default()
            }),
            Outcome::Task(task) => Ok(Self {
                task: Some(Box::new(tasks::message(*task, None))),
                ..Self::default()
            }),
        }
    }

    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }

    fn asks(&self) -> bool {
        self.input_required.is_some()
    }

    fn replayed(&mut self) {
        self.replayed = true;
    }
}

impl Recorded for pb::InvokeToolResponse {
    fn is_error(&self) -> bool {
        self.is_error
    }

    fn recorded_bytes(&self, guarded: bool) -> Option<u64> {
        guarded.then(|| prost::Message::encoded_len(self) as u64)
    }
}

impl Reply<GetPromptResult> for pb::GetPromptResponse {
    fn encode(outcome: Outcome<GetPromptResult>, server: &str) -> Result<Self, Unencodable> {
        match outcome {
            Outcome::Done(result) => rendered(result, server).map_err(Unencodable),
            Outcome::Questions(asked) => Ok(Self {
                input_required: Some(questions::questions(asked)),
                ..Self::default()
            }),
            Outcome::Task(_) => Err(Unencodable("a prompt became a task".to_owned())),
        }
    }

    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }

    fn asks(&self) -> bool {
        self.input_required.is_some()
    }
}

impl Recorded for pb::GetPromptResponse {
    fn recorded_bytes(&self, _guarded: bool) -> Option<u64> {
        Some(prost::Message::encoded_len(self) as u64)
    }
}

impl Reply<ReadResourceResult> for pb::ReadResourceResponse {
    fn encode(outcome: Outcome<ReadResourceResult>, _server: &str) -> Result<Self, Unencodable> {
        match outcome {
            Outcome::Done(result) => Ok(Self {
                contents: result
                    .contents
                    .into_iter()
                    .map(resource_contents)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Unencodable(e.to_string()))?,
                input_required: None,
            }),
            Outcome::Questions(asked) => Ok(Self {
                contents: Vec::new(),
                input_required: Some(questions::questions(asked)),
            }),
            Outcome::Task(_) => Err(Unencodable("a read became a task".to_owned())),
        }
    }

    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }

    fn asks(&self) -> bool {
        self.input_required.is_some()
    }
}

impl Recorded for pb::ReadResourceResponse {
    fn recorded_bytes(&self, _guarded: bool) -> Option<u64> {
        Some(prost::Message::encoded_len(self) as u64)
    }
}

impl Reply<Completion> for pb::CompleteResponse {
    fn encode(outcome: Outcome<Completion>, _server: &str) -> Result<Self, Unencodable> {
        match outcome {
            Outcome::Done(Completion {
                values,
                total,
                has_more,
            }) => Ok(Self {
                values,
                total,
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

impl Recorded for pb::CompleteResponse {}

/// A rendered prompt as a GetPromptResponse: each message's content as
/// a tool result's would be (links and embedded resources name `server`).
///
/// # Errors
/// A message whose content cannot be carried (invalid base64), in words.
fn rendered(
    result: rmcp::model::GetPromptResult,
    server: &str,
) -> Result<pb::GetPromptResponse, String> {
    let messages = result
        .messages
        .into_iter()
        .map(|message| {
            let role = match message.role {
                rmcp::model::Role::User => pb::Role::User,
                rmcp::model::Role::Assistant => pb::Role::Assistant,
            };
            let content = convert::content(message.content, server).map_err(|e| e.to_string())?;
            Ok(pb::PromptMessage {
                role: role.into(),
                content: Some(content),
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(pb::GetPromptResponse {
        description: result.description.unwrap_or_default(),
        messages,
        input_required: None,
    })
}
/// One part of a resource's contents: text as it came, a blob decoded.
///
/// # Errors
/// A blob that is not valid base64.
fn resource_contents(
    contents: ResourceContents,
) -> Result<pb::ResourceContents, convert::InvalidContent> {
    use pb::resource_contents::Data;
    Ok(match contents {
        ResourceContents::TextResourceContents {
            uri,
            mime_type,
            text,
            ..
        } => pb::ResourceContents {
            uri,
            mime_type: mime_type.unwrap_or_default(),
            data: Some(Data::Text(text)),
        },
        ResourceContents::BlobResourceContents {
            uri,
            mime_type,
            blob,
            ..
        } => pb::ResourceContents {
            uri,
            mime_type: mime_type.unwrap_or_default(),
            data: Some(Data::Blob(convert::decode(&blob, "a resource blob")?)),
        },
        // Kinds of contents added to MCP after this gateway was built are
        // carried as their JSON text.
        #[allow(unreachable_patterns)]
        other => pb::ResourceContents {
            uri: String::new(),
            mime_type: "application/json".to_owned(),
            data: Some(Data::Text(
                serde_json::to_string(&other).unwrap_or_default(),
            )),
        },
    })
}
