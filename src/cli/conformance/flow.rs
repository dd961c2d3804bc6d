//! Which flow each non-OAuth scenario runs after connecting, and the
//! arguments its calls carry.

use anyhow::Context;
use rmcp::model::{JsonObject, Tool};
use serde_json::{Value, json};

use super::client::Client;

/// A scenario's flow after connecting (which already listed the tools).
#[derive(Debug, Clone, Copy)]
pub(super) enum Flow {
    /// Nothing more: the handshake and the listing are the test.
    ConnectOnly,
    /// Call `add_numbers` (else the first tool) with `{a: 5, b: 3}`.
    AddNumbers,
    /// Call one named tool with `{}`.
    CallNamed(&'static str),
    /// Call every tool with `{}`.
    CallEveryEmpty,
    /// Call every tool with synthetic arguments; stateless: also read every
    /// resource and get every prompt.
    StandardHeaders,
    /// Call every tool with synthetic arguments.
    CallEverySynthetic,
    /// Call the tools of `context.toolCalls` with their arguments.
    ContextToolCalls,
    /// Send `json_schema_2020_12_tool`'s input schema to `json_schema_echo`.
    SchemaEcho,
    /// Load every listed skill as GetSkill does: `SKILL.md` verified
    /// against the listed entry, then (only then) its other files.
    LoadSkills,
}

impl Flow {
    pub(super) fn for_scenario(name: &str) -> Option<Self> {
        Some(match name {
            "initialize" | "request-metadata" | "json-schema-ref-no-deref" => Flow::ConnectOnly,
            // SEP-2640 skills: listed at connect, nothing read ahead of need;
            // a loaded skill's files verified before they are used.
            "sep-2640-client-no-prefetch" => Flow::ConnectOnly,
            n if n.starts_with("sep-2640-client-verify-") => Flow::LoadSkills,
            "tools_call" => Flow::AddNumbers,
            "elicitation-sep1034-client-defaults" => {
                Flow::CallNamed("test_client_elicitation_defaults")
            }
            "sse-retry" => Flow::CallNamed("test_reconnection"),
            "sep-2322-client-request-state" => Flow::CallEveryEmpty,
            "http-standard-headers" => Flow::StandardHeaders,
            "http-invalid-tool-headers" => Flow::CallEverySynthetic,
            "http-custom-headers" => Flow::ContextToolCalls,
            "json-schema-2020-12-preservation" => Flow::SchemaEcho,
            _ => return None,
        })
    }

    pub(super) async fn run(
        self,
        client: &Client<'_>,
        tools: &[Tool],
        context: &Value,
    ) -> anyhow::Result<()> {
        match self {
            Flow::ConnectOnly => {}
            Flow::AddNumbers => {
                let tool = tools
                    .iter()
                    .find(|t| t.name == "add_numbers")
                    .or_else(|| tools.first())
                    .context("the server lists no tools")?;
                client
                    .call(&tool.name, object(json!({"a": 5, "b": 3})))
                    .await?;
            }
            Flow::CallNamed(name) => {
                client.call(name, JsonObject::new()).await?;
            }
            Flow::CallEveryEmpty => {
                for tool in tools {
                    client.call(&tool.name, JsonObject::new()).await?;
                }
            }
            Flow::StandardHeaders | Flow::CallEverySynthetic => {
                for tool in tools {
                    client.call(&tool.name, synthetic_arguments(tool)).await?;
                }
                if matches!(self, Flow::StandardHeaders) && client.stateless {
                    client.read_every_resource().await?;
                    client.get_every_prompt().await?;
                }
            }
            Flow::ContextToolCalls => {
                let calls = context
                    .get("toolCalls")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for call in calls {
                    let name = call
                        .get("name")
                        .and_then(Value::as_str)
                        .context("context.toolCalls[]: no `name`")?;
                    let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
                    client.call(name, object(arguments)).await?;
                }
            }
            Flow::LoadSkills => client.load_every_skill().await?,
            Flow::SchemaEcho => {
                let focal = tools
                    .iter()
                    .find(|t| t.name == "json_schema_2020_12_tool")
                    .context("the server does not list json_schema_2020_12_tool")?;
                let schema = Value::Object(focal.input_schema.as_ref().clone());
                client
                    .call("json_schema_echo", object(json!({ "schema": schema })))
                    .await?;
            }
        }
        Ok(())
    }
}

/// Arguments for a tool nobody described: one value per required property
/// (`1` for numbers, `true` for booleans, else a string).
pub(super) fn synthetic_arguments(tool: &Tool) -> JsonObject {
    let schema = tool.input_schema.as_ref();
    let properties = schema.get("properties").and_then(Value::as_object);
    let mut arguments = JsonObject::new();
    for key in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let kind = properties
            .and_then(|p| p.get(key))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str);
        let value = match kind {
            Some("number" | "integer") => json!(1),
            Some("boolean") => json!(true),
            _ => json!("us-west1"),
        };
        arguments.insert(key.to_owned(), value);
    }
    arguments
}

/// `value` as a JSON object (anything else becomes `{}`).
fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}
