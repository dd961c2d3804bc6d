//! The conformance client's answer to an elicitation: accept, with the
//! schema's defaults. Only `toolgate conformance-client` answers on
//! nobody's behalf like this (its `elicitation-sep1034-client-defaults`
//! scenario checks the defaults); the gateway never does.

use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};

/// Accepts an elicitation, giving every property of a form's schema its
/// `default`, or else a placeholder of its type (`true`, the first enum
/// value, `0`, `"conformance"`). A URL elicitation is declined.
pub(crate) fn accept_with_defaults(params: &ElicitRequestParams) -> ElicitResult {
    let ElicitRequestParams::FormElicitationParams {
        requested_schema, ..
    } = params
    else {
        return ElicitResult::new(ElicitationAction::Decline);
    };
    let schema = serde_json::to_value(requested_schema).unwrap_or_default();
    let mut content = serde_json::Map::new();
    if let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) {
        for (name, property) in properties {
            let value = property.get("default").cloned().or_else(|| {
                let first_enum = property
                    .get("enum")
                    .or_else(|| property.get("oneOf"))
                    .and_then(|e| e.as_array())
                    .and_then(|e| e.first())
                    .map(|first| first.get("const").unwrap_or(first).clone());
                match property.get("type").and_then(|t| t.as_str()) {
                    Some("boolean") => Some(serde_json::Value::Bool(true)),
                    _ if first_enum.is_some() => first_enum,
                    Some("number" | "integer") => Some(0.into()),
                    Some("string") => Some("conformance".into()),
                    _ => None,
                }
            });
            if let Some(value) = value {
                content.insert(name.clone(), value);
            }
        }
    }
    ElicitResult::new(ElicitationAction::Accept).with_content(serde_json::Value::Object(content))
}
