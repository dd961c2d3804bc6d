//! Relevance ranking over a catalog snapshot: BM25 (with stemming and stop
//! words, English) over each tool's name, title, description and parameter
//! names and descriptions. The index is built once per snapshot, on the
//! first search.

use bm25::{Document, Language, SearchEngine, SearchEngineBuilder};

use super::CatalogTool;

/// BM25 `b`: tool descriptions are short and similar in length, so length
/// normalisation is kept weak.
const LENGTH_NORMALISATION: f32 = 0.3;
/// BM25 `k1`, the usual value.
const TERM_SATURATION: f32 = 1.2;

/// The search index of one catalog snapshot.
pub(super) struct Index(SearchEngine<usize>);

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Index")
    }
}

impl Index {
    /// Indexes `tools`; a tool's id is its position.
    pub(super) fn new(tools: &[CatalogTool]) -> Self {
        let documents = tools
            .iter()
            .enumerate()
            .map(|(i, tool)| Document::new(i, searchable_text(tool)));
        Self(
            SearchEngineBuilder::<usize>::with_documents(Language::English, documents)
                .b(LENGTH_NORMALISATION)
                .k1(TERM_SATURATION)
                .build(),
        )
    }

    /// Positions and scores of the tools matching `query`, best first.
    pub(super) fn search(&self, query: &str) -> Vec<(usize, f32)> {
        self.0
            .search(query, None)
            .into_iter()
            .map(|r| (r.document.id, r.score))
            .collect()
    }
}

/// What a tool is searched by: its server, name, title, description and
/// parameter names. Names are split into words (`get_issue`, `getIssue`,
/// `get-issue` all give "get issue").
fn searchable_text(tool: &CatalogTool) -> String {
    let name = split_identifier(&tool.upstream_name);
    let mut text = format!(
        "{} {name} {} {}",
        split_identifier(&tool.server),
        tool.title,
        tool.description
    );
    if let Ok(serde_json::Value::Object(schema)) =
        serde_json::from_str::<serde_json::Value>(&tool.input_schema_json)
        && let Some(serde_json::Value::Object(properties)) = schema.get("properties")
    {
        for (param, _spec) in properties {
            text.push(' ');
            text.push_str(&split_identifier(param));
        }
    }
    text
}

/// `getIssue_byID-now` → `get Issue by ID now`.
fn split_identifier(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    let mut previous_lower = false;
    for c in name.chars() {
        if c == '_' || c == '-' || c == '.' {
            out.push(' ');
            previous_lower = false;
            continue;
        }
        if c.is_uppercase() && previous_lower {
            out.push(' ');
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_identifiers() {
        assert_eq!(split_identifier("getIssue_byID-now"), "get Issue by ID now");
    }
}
