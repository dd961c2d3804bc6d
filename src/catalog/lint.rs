//! Definitions that would mislead a model: a model has only the name,
//! description and schema to go on. Warnings, never refusals; each names
//! the server and the tool. Used by `toolgate check`.

use std::collections::HashSet;

use super::{Catalog, CatalogTool};

/// Descriptions shorter than this are called out.
const SHORT_DESCRIPTION: usize = 40;
/// Word-set similarity (Jaccard) at which two descriptions count as near
/// duplicates.
const NEAR_DUPLICATE: f64 = 0.8;

/// One warning about one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The configured server name.
    pub server: String,
    /// The tool's name on its server.
    pub tool: String,
    /// What would mislead a model.
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "server `{}` tool `{}`: {}",
            self.server, self.tool, self.message
        )
    }
}

/// Every warning about the catalog's tools.
pub fn lint(catalog: &Catalog) -> Vec<Warning> {
    let mut warnings = Vec::new();
    for tool in catalog.tools() {
        let mut warn = |message: String| {
            warnings.push(Warning {
                server: tool.server.clone(),
                tool: tool.upstream_name.clone(),
                message,
            });
        };
        let description = tool.description.trim();
        if description.is_empty() {
            warn("has no description; a model has only the description to go on".to_owned());
        } else if description.chars().count() < SHORT_DESCRIPTION {
            warn(format!(
                "has a very short description ({} characters): say what it does and when to use it",
                description.chars().count()
            ));
        }
        match serde_json::from_str::<serde_json::Value>(&tool.input_schema_json) {
            Ok(schema) if schema.get("type").and_then(|t| t.as_str()) == Some("object") => {
                let undocumented: Vec<&String> = schema
                    .get("properties")
                    .and_then(|p| p.as_object())
                    .map(|p| {
                        p.iter()
                            .filter(|(_, spec)| {
                                spec.get("description")
                                    .and_then(|d| d.as_str())
                                    .is_none_or(|d| d.trim().is_empty())
                            })
                            .map(|(name, _)| name)
                            .collect()
                    })
                    .unwrap_or_default();
                if !undocumented.is_empty() {
                    let names: Vec<&str> = undocumented.iter().map(|s| s.as_str()).collect();
                    warn(format!(
                        "parameters without descriptions: {}",
                        names.join(", ")
                    ));
                }
            }
            _ => warn("input schema is not an object schema (`\"type\": \"object\"`)".to_owned()),
        }
    }
    near_duplicates(catalog.tools(), &mut warnings);
    warnings
}

fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Tools of different servers whose descriptions are nearly the same: a
/// model cannot tell them apart.
fn near_duplicates(tools: &[CatalogTool], warnings: &mut Vec<Warning>) {
    let sets: Vec<HashSet<String>> = tools.iter().map(|t| words(&t.description)).collect();
    for (i, a) in tools.iter().enumerate() {
        for (j, b) in tools.iter().enumerate().skip(i + 1) {
            if a.server == b.server || sets[i].len() < 3 || sets[j].len() < 3 {
                continue;
            }
            let shared = sets[i].intersection(&sets[j]).count() as f64;
            let all = sets[i].union(&sets[j]).count() as f64;
            if shared / all >= NEAR_DUPLICATE {
                warnings.push(Warning {
                    server: a.server.clone(),
                    tool: a.upstream_name.clone(),
                    message: format!(
                        "description nearly duplicates that of `{}` (server `{}`): a model cannot tell them apart",
                        b.name, b.server
                    ),
                });
            }
        }
    }
}
