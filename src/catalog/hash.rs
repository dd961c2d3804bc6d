//! Definition hashes (over every field a caller sees) and the catalog's
//! content-derived version.

use sha2::{Digest, Sha256};

use super::CatalogTool;

/// SHA-256 over every field a caller sees, each length-prefixed so that no
/// two different definitions hash alike.
pub(super) fn definition_hash(tool: &CatalogTool) -> String {
    let mut hasher = Sha256::new();
    for field in [
        tool.name.as_str(),
        tool.server.as_str(),
        tool.upstream_name.as_str(),
        tool.description.as_str(),
        tool.title.as_str(),
        tool.input_schema_json.as_str(),
        tool.output_schema_json.as_str(),
    ] {
        hasher.update((field.len() as u64).to_le_bytes());
        hasher.update(field.as_bytes());
    }
    let a = &tool.annotations;
    for hint in [a.read_only, a.destructive, a.idempotent, a.open_world] {
        hasher.update([match hint {
            None => 0u8,
            Some(false) => 1,
            Some(true) => 2,
        }]);
    }
    hex::encode(&hasher.finalize()[..16])
}

/// The version of a snapshot's tools.
pub(super) fn catalog_version(tools: &[CatalogTool]) -> String {
    version_of(tools)
}

/// The catalog version of these tools (in catalog order): a content hash
/// over their definitions, which [`Catalog::version`] is for all of them.
pub fn version_of<'a>(tools: impl IntoIterator<Item = &'a CatalogTool>) -> String {
    let mut hasher = Sha256::new();
    for tool in tools {
        hasher.update(tool.definition_hash.as_bytes());
    }
    hex::encode(&hasher.finalize()[..12])
}

/// SHA-256 over every field of a prompt a caller sees, domain-tagged
/// (`prompt`: never equal to a tool's hash of the same fields) and each
/// field length-prefixed, as for tools: its names, title, description and
/// each argument's name, title, description and whether it is required.
pub(super) fn prompt_hash(prompt: &super::CatalogPrompt) -> String {
    let mut hasher = Sha256::new();
    let mut field = |text: &str| {
        hasher.update((text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    };
    field("prompt");
    for text in [
        prompt.name.as_str(),
        prompt.server.as_str(),
        prompt.upstream_name.as_str(),
        prompt.title.as_str(),
        prompt.description.as_str(),
    ] {
        field(text);
    }
    field(&prompt.arguments.len().to_string());
    for argument in &prompt.arguments {
        field(&argument.name);
        field(&argument.title);
        field(&argument.description);
        field(if argument.required { "1" } else { "0" });
    }
    hex::encode(&hasher.finalize()[..16])
}

/// The version of a snapshot's prompts (in catalog order).
pub(super) fn prompts_version(prompts: &[super::CatalogPrompt]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"prompts");
    for prompt in prompts {
        hasher.update(prompt.definition_hash.as_bytes());
    }
    hex::encode(&hasher.finalize()[..12])
}
