//! A server's questions in the transport's typed shapes: a form's JSON
//! Schema (flat, primitive properties, as elicitation allows) as
//! `PrimitiveSchemaDefinition`s, and `sampling/createMessage` params as a
//! `SamplingCreateMessageRequest`. What the transport has no field for is
//! left out: a property of another type is offered as a string, and of
//! sampling params only messages of text, image or audio, the model
//! preferences, system prompt, context, temperature, token limit and stop
//! sequences are carried (not the 2025-11-25 `tools` or `metadata`).

use base64::Engine;
use serde_json::Value;

use crate::pb::mcp;
use mcp::primitive_schema_definition as defs;

/// A form question.
pub(super) fn form(message: &str, schema: &Value) -> mcp::ElicitRequest {
    let properties = schema.get("properties").and_then(Value::as_object);
    mcp::ElicitRequest {
        message: message.to_owned(),
        requested_schema: properties
            .into_iter()
            .flatten()
            .map(|(name, property)| (name.clone(), primitive(property)))
            .collect(),
        required_fields: schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        url_mode: None,
    }
}

fn text(property: &Value, key: &str) -> String {
    property
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// The choices of an enum property: `enum` (with the legacy `enumNames`),
/// or `oneOf`/`anyOf` of `{const, title}`.
fn choices(property: &Value) -> Option<(Vec<String>, Vec<String>)> {
    if let Some(values) = property.get("enum") {
        return Some((strings(Some(values)), strings(property.get("enumNames"))));
    }
    let options = property
        .get("oneOf")
        .or_else(|| property.get("anyOf"))?
        .as_array()?;
    let values = options.iter().filter_map(|o| o.get("const")?.as_str());
    let titles = options.iter().map(|o| text(o, "title"));
    Some((values.map(str::to_owned).collect(), titles.collect()))
}

/// One property of a form.
fn primitive(property: &Value) -> mcp::PrimitiveSchemaDefinition {
    let title = text(property, "title");
    let description = text(property, "description");
    let mut definition = mcp::PrimitiveSchemaDefinition::default();
    match property.get("type").and_then(Value::as_str) {
        Some("boolean") => {
            definition.boolean_schema = Some(defs::BooleanSchema {
                title,
                description,
                default: property
                    .get("default")
                    .and_then(Value::as_bool)
                    .unwrap_or_default(),
            });
        }
        Some(kind @ ("number" | "integer")) => {
            let number = |key| property.get(key).and_then(Value::as_f64);
            let integer = |key| property.get(key).and_then(Value::as_i64);
            let mut schema = defs::NumberSchema {
                title,
                description,
                ..Default::default()
            };
            if kind == "integer" {
                schema.integer_range = Some(defs::number_schema::IntegerRange {
                    minimum: integer("minimum"),
                    maximum: integer("maximum"),
                });
                schema.default_integer = integer("default");
            } else {
                schema.double_range = Some(defs::number_schema::DoubleRange {
                    minimum: number("minimum"),
                    maximum: number("maximum"),
                });
                schema.default_number = number("default");
            }
            definition.number_schema = Some(schema);
        }
        Some("array") => {
            let items = property.get("items").unwrap_or(&Value::Null);
            let (values, names) = choices(items).unwrap_or_default();
            let count = |key| {
                property
                    .get(key)
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
            };
            definition.enum_schema = Some(defs::EnumSchema {
                title,
                description,
                enum_list: values,
                enum_names: names,
                single_select: None,
                multi_select: Some(defs::enum_schema::MultiSelect {
                    default_items: strings(property.get("default")),
                    min_items: count("minItems"),
                    max_items: count("maxItems"),
                }),
            });
        }
        _ => {
            if let Some((values, names)) = choices(property) {
                definition.enum_schema = Some(defs::EnumSchema {
                    title,
                    description,
                    enum_list: values,
                    enum_names: names,
                    single_select: Some(defs::enum_schema::SingleSelect {
                        default_item: property
                            .get("default")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    }),
                    multi_select: None,
                });
            } else {
                definition.string_schema = Some(string(property, title, description));
            }
        }
    }
    definition
}

fn string(property: &Value, title: String, description: String) -> defs::StringSchema {
    use defs::string_schema::Format;
    let format = match property.get("format").and_then(Value::as_str) {
        Some("email") => Format::Email,
        Some("uri") => Format::Uri,
        Some("date") => Format::Date,
        Some("date-time") => Format::DateTime,
        _ => Format::Unknown,
    };
    defs::StringSchema {
        title,
        description,
        min_length: property.get("minLength").and_then(Value::as_u64),
        max_length: property.get("maxLength").and_then(Value::as_u64),
        format: format.into(),
        default_value: property
            .get("default")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

/// `sampling/createMessage` params.
pub(super) fn sampling(params: &Value) -> mcp::SamplingCreateMessageRequest {
    use mcp::sampling_create_message_request::{
        IncludeContext, ModelPreferences, model_preferences,
    };
    let preferences = params.get("modelPreferences");
    let priority = |key| {
        preferences
            .and_then(|p| p.get(key))
            .and_then(Value::as_f64)
            .map(|n| n as f32)
    };
    let include_context = match params.get("includeContext").and_then(Value::as_str) {
        Some("thisServer") => IncludeContext::ThisServer,
        Some("allServers") => IncludeContext::AllServers,
        _ => IncludeContext::None,
    };
    mcp::SamplingCreateMessageRequest {
        messages: params
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .flat_map(message)
            .collect(),
        model_preferences: preferences.map(|p| ModelPreferences {
            hints: p
                .get("hints")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|hint| model_preferences::ModelHint {
                    name: text(hint, "name"),
                })
                .collect(),
            intelligence_priority: priority("intelligencePriority"),
            speed_priority: priority("speedPriority"),
            cost_priority: priority("costPriority"),
        }),
        system_prompt: text(params, "systemPrompt"),
        include_context: include_context.into(),
        temperature: params
            .get("temperature")
            .and_then(Value::as_f64)
            .map(|n| n as f32),
        max_tokens: params
            .get("maxTokens")
            .and_then(Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
            .unwrap_or_default(),
        stop_sequence: strings(params.get("stopSequences")),
    }
}

/// A sampling message: one per content block (a message's `content` may
/// be one block or, since 2025-11-25, a list of them).
fn message(message: &Value) -> Vec<mcp::SamplingMessage> {
    let role = match message.get("role").and_then(Value::as_str) {
        Some("assistant") => mcp::Role::Assistant,
        _ => mcp::Role::User,
    };
    let blocks = match message.get("content") {
        Some(Value::Array(blocks)) => blocks.iter().collect(),
        Some(block) => vec![block],
        None => Vec::new(),
    };
    blocks
        .into_iter()
        .map(|block| {
            let mut message = mcp::SamplingMessage {
                role: role.into(),
                ..Default::default()
            };
            let data = || {
                base64::engine::general_purpose::STANDARD
                    .decode(text(block, "data"))
                    .unwrap_or_default()
            };
            match block.get("type").and_then(Value::as_str) {
                Some("image") => {
                    message.image = Some(mcp::ImageContent {
                        data: data(),
                        mime_type: text(block, "mimeType"),
                        ..Default::default()
                    });
                }
                Some("audio") => {
                    message.audio = Some(mcp::AudioContent {
                        data: data(),
                        mime_type: text(block, "mimeType"),
                        ..Default::default()
                    });
                }
                Some("text") => {
                    message.text = Some(mcp::TextContent {
                        text: text(block, "text"),
                        ..Default::default()
                    });
                }
                // Another kind (tool use, tool results) as its JSON text.
                _ => {
                    message.text = Some(mcp::TextContent {
                        text: block.to_string(),
                        ..Default::default()
                    });
                }
            }
            message
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn forms_keep_types_bounds_choices_and_required_fields() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "title": "Name", "maxLength": 20, "format": "email"},
                "age": {"type": "integer", "minimum": 0, "default": 30},
                "ok": {"type": "boolean", "default": true},
                "size": {"type": "string", "enum": ["s", "m"], "enumNames": ["Small", "Medium"]},
                "tags": {"type": "array", "items": {"anyOf": [{"const": "a", "title": "A"}]}}
            },
            "required": ["name"]
        });
        let form = form("Who?", &schema);
        assert_eq!(form.required_fields, ["name"]);
        let name = form.requested_schema["name"].string_schema.clone().unwrap();
        assert_eq!((name.title.as_str(), name.max_length), ("Name", Some(20)));
        assert_eq!(name.format, i32::from(defs::string_schema::Format::Email));
        let age = form.requested_schema["age"].number_schema.clone().unwrap();
        assert_eq!(age.integer_range.unwrap().minimum, Some(0));
        assert_eq!(age.default_integer, Some(30));
        assert!(
            form.requested_schema["ok"]
                .boolean_schema
                .as_ref()
                .unwrap()
                .default
        );
        let size = form.requested_schema["size"].enum_schema.clone().unwrap();
        assert_eq!(size.enum_names, ["Small", "Medium"]);
        assert!(size.single_select.is_some());
        let tags = form.requested_schema["tags"].enum_schema.clone().unwrap();
        assert_eq!(
            (tags.enum_list, tags.enum_names),
            (vec!["a".to_owned()], vec!["A".to_owned()])
        );
    }

    #[test]
    fn sampling_params_become_messages_and_preferences() {
        let params = json!({
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
            "modelPreferences": {"hints": [{"name": "claude"}], "speedPriority": 0.5},
            "systemPrompt": "be brief",
            "includeContext": "thisServer",
            "maxTokens": 100,
            "stopSequences": ["\n"]
        });
        let request = sampling(&params);
        assert_eq!(request.messages[0].text.as_ref().unwrap().text, "hi");
        let preferences = request.model_preferences.unwrap();
        assert_eq!(preferences.hints[0].name, "claude");
        assert_eq!(preferences.speed_priority, Some(0.5));
        assert_eq!(
            (request.max_tokens, request.system_prompt.as_str()),
            (100, "be brief")
        );
        assert_eq!(request.stop_sequence, ["\n"]);
    }
}
