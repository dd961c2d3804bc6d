//! What the gateway takes out of what a server sends back before anyone
//! else sees it: configured credentials and live tokens in tool results,
//! content blocks (of results and prompt messages) and resource contents.
//! Binary data is never touched.

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};

use crate::credentials::Redaction;

/// Replaces every configured credential and live token in a tool result:
/// each block ([`redact_block`]), structured content, and the result's
/// `_meta`.
pub(super) fn redact_result(result: &mut CallToolResult, redaction: &Redaction) {
    if redaction.is_empty() {
        return;
    }
    for block in &mut result.content {
        redact_block(block, redaction);
    }
    if let Some(structured) = &mut result.structured_content {
        redaction.redact_json(structured);
    }
    redact_meta(&mut result.meta, redaction);
}

/// Replaces every configured credential and live token in one content
/// block (of a tool result or a prompt message): its text, the text of
/// an embedded resource, the text fields of a resource link, and every
/// `_meta`. Binary data (base64) is left alone.
pub(super) fn redact_block(block: &mut ContentBlock, redaction: &Redaction) {
    match block {
        ContentBlock::Text(text) => {
            redaction.redact_in_place(&mut text.text);
            redact_meta(&mut text.meta, redaction);
        }
        ContentBlock::Image(image) => redact_meta(&mut image.meta, redaction),
        ContentBlock::Audio(audio) => redact_meta(&mut audio.meta, redaction),
        ContentBlock::Resource(embedded) => {
            redact_meta(&mut embedded.meta, redaction);
            redact_contents(&mut embedded.resource, redaction);
        }
        ContentBlock::ResourceLink(link) => {
            redaction.redact_in_place(&mut link.uri);
            redaction.redact_in_place(&mut link.name);
            for text in [&mut link.title, &mut link.description]
                .into_iter()
                .flatten()
            {
                redaction.redact_in_place(text);
            }
            redact_meta(&mut link.meta, redaction);
        }
        _ => {}
    }
}

/// Replaces every configured credential and live token in resource
/// contents (a read's, an embedded resource's): the URI, the text and the
/// `_meta`. Blobs are left alone.
pub(super) fn redact_contents(contents: &mut ResourceContents, redaction: &Redaction) {
    match contents {
        ResourceContents::TextResourceContents {
            uri, text, meta, ..
        } => {
            redaction.redact_in_place(uri);
            redaction.redact_in_place(text);
            redact_meta(meta, redaction);
        }
        ResourceContents::BlobResourceContents { uri, meta, .. } => {
            redaction.redact_in_place(uri);
            redact_meta(meta, redaction);
        }
        _ => {}
    }
}

/// Redacts a `_meta` object as JSON.
fn redact_meta(meta: &mut Option<rmcp::model::MetaObject>, redaction: &Redaction) {
    if let Some(meta) = meta {
        let mut value = serde_json::Value::Object(std::mem::take(&mut meta.0));
        redaction.redact_json(&mut value);
        if let serde_json::Value::Object(object) = value {
            meta.0 = object;
        }
    }
}
