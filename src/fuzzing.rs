//! Entry points shared by the fuzz targets in `fuzz/` and the corpus
//! regression test: each takes arbitrary bytes and must never panic.
//!
//! It stands alone at the top of the crate because it belongs to no room:
//! the `fuzz/` crate is another binary that reaches into three layers
//! (configuration parsing, argument parsing and result conversion of the
//! gRPC surface) through this one public door.

use std::collections::HashMap;
use std::path::Path;

use crate::config::Config;

/// Configuration parsing and validation.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env: HashMap<String, String> = HashMap::from([("SET".to_owned(), "value".to_owned())]);
    if let Err(error) = Config::from_yaml(text, "<fuzz>", Path::new("/nonexistent"), &env) {
        // Every error renders, and names something.
        assert!(!error.to_string().is_empty());
    }
}

/// `arguments_json` handling: accepted exactly when it is empty or a JSON
/// object.
pub fn arguments(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = crate::calls::parse_arguments("fuzz", text);
    let is_object = text.trim().is_empty()
        || matches!(
            serde_json::from_str::<serde_json::Value>(text),
            Ok(serde_json::Value::Object(_))
        );
    assert_eq!(parsed.is_ok(), is_object);
}

/// MCP tool result → proto conversion: every block is carried, and the
/// text rendering counts every non-text block.
pub fn convert(data: &[u8]) {
    let Ok(result) = serde_json::from_slice::<rmcp::model::CallToolResult>(data) else {
        return;
    };
    let blocks = result.content.len();
    let non_text = result
        .content
        .iter()
        .filter(|b| !matches!(b, rmcp::model::ContentBlock::Text(_)))
        .count();
    if let Ok(response) = crate::grpc::convert::invoke_response(result, "fuzz") {
        assert_eq!(response.content.len(), blocks);
        assert!(!response.text.is_empty());
        if non_text > 0 {
            assert!(
                response
                    .text
                    .ends_with(&format!("[{non_text} non-text content block(s) omitted]"))
            );
        }
    }
}
