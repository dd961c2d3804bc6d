//! The configuration of a tenant's per-tool policy (`tenants[].policy`):
//! ordered rules, each `allow` or `deny` globs over exposed tool names with
//! an optional CEL `when`. Validation compiles them (once per
//! configuration) into a [`crate::policy::Policy`].

use std::sync::Arc;

use serde::Deserialize;

use super::validate::Errors;
use crate::policy::{Effect, Policy, RuleSpec};

/// One rule as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    /// Globs of tools the rule allows.
    pub(crate) allow: Option<RawGlobs>,
    /// Globs of tools the rule denies.
    pub(crate) deny: Option<RawGlobs>,
    /// A CEL condition over `claims`, `subject` and `tool`.
    pub(crate) when: Option<String>,
}

/// One glob, or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawGlobs {
    /// `allow: "github__*"`.
    One(String),
    /// `allow: ["github__*", "jira__get_*"]`.
    Many(Vec<String>),
}

/// Validates and compiles `tenants[i].policy` (`path`); `None` when there
/// are no rules (the tenant pays nothing for policy).
pub(super) fn policy(errors: &mut Errors, path: &str, raw: Vec<RawRule>) -> Option<Arc<Policy>> {
    if raw.is_empty() {
        return None;
    }
    let before = errors.0.len();
    let mut specs = Vec::with_capacity(raw.len());
    for (index, rule) in raw.into_iter().enumerate() {
        let (effect, globs) = match (rule.allow, rule.deny) {
            (Some(globs), None) => (Effect::Allow, globs),
            (None, Some(globs)) => (Effect::Deny, globs),
            (Some(_), Some(_)) => {
                errors.push(
                    format!("{path}[{index}]"),
                    "a rule has `allow` or `deny`, not both (write two rules; the first that \
                     matches decides)",
                );
                continue;
            }
            (None, None) => {
                errors.push(
                    format!("{path}[{index}]"),
                    "a rule needs `allow` or `deny`: globs over exposed tool names",
                );
                continue;
            }
        };
        specs.push(RuleSpec {
            effect,
            globs: match globs {
                RawGlobs::One(glob) => vec![glob],
                RawGlobs::Many(globs) => globs,
            },
            when: rule.when,
        });
    }
    if errors.0.len() != before {
        return None;
    }
    match Policy::compile(path, &specs) {
        Ok(policy) => Some(Arc::new(policy)),
        Err(found) => {
            for error in found {
                errors.push(error.path, error.message);
            }
            None
        }
    }
}
