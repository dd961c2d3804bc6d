//! The configuration of a tenant's per-tool policy (`tenants[].policy`):
//! ordered rules, each `allow` or `deny` globs over exposed tool names with
//! an optional CEL `when`. Validation checks every glob and condition and
//! keeps them parsed ([`PolicyRules`]); the policy room builds the
//! evaluating `Policy` from them.

use std::collections::HashMap;
use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;

use super::fields::Errors;

/// The variables a `when` may read.
pub const VARIABLES: [&str; 5] = ["claims", "subject", "subject_key", "caller", "tool"];

/// What a rule does to the tools it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The caller may call the tool (and sees it).
    Allow,
    /// The caller may not call the tool, and does not see it.
    Deny,
}

/// One rule as configured, before checking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// Allow or deny.
    pub effect: Effect,
    /// Globs over exposed tool names (`server__tool`); any one matching
    /// makes the rule apply.
    pub globs: Vec<String>,
    /// A CEL expression over `claims`, `subject`, `subject_key`, `caller`
    /// and `tool`; the rule applies only when it is true.
    pub when: Option<String>,
}

/// A rule that does not check: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct PolicyError {
    /// The path of the field at fault, e.g. `tenants[0].policy[2].when`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// One rule as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    /// Globs of tools the rule allows.
    pub(crate) allow: Option<RawGlobs>,
    /// Globs of tools the rule denies.
    pub(crate) deny: Option<RawGlobs>,
    /// A CEL condition over `claims`, `subject`, `subject_key`, `caller`
    /// and `tool`.
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

/// Validates `tenants[i].policy` (`path`); `None` when there are no rules
/// (the tenant pays nothing for policy).
pub(super) fn policy(
    errors: &mut Errors,
    path: &str,
    raw: Vec<RawRule>,
) -> Option<Arc<PolicyRules>> {
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
    match check(path, &specs) {
        Ok(rules) => Some(Arc::new(rules)),
        Err(found) => {
            for error in found {
                errors.push(error.path, error.message);
            }
            None
        }
    }
}

/// A tenant's rules, checked: every glob parsed into one set and every
/// `when` compiled (CEL), each naming where it was written.
pub struct PolicyRules {
    /// The rules, in order.
    pub rules: Vec<CheckedRule>,
    /// Every rule's globs in one set, so a tool name is matched once.
    pub globs: GlobSet,
    /// The rule of each glob in `globs`.
    pub glob_rule: Vec<usize>,
}

impl std::fmt::Debug for PolicyRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyRules")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

/// One checked rule.
pub struct CheckedRule {
    /// `tenants[i].policy[j]`, for logs.
    pub path: String,
    /// Allow or deny.
    pub effect: Effect,
    /// The condition, compiled, and its source.
    pub when: Option<(Arc<cel::Program>, String)>,
}

impl std::fmt::Debug for CheckedRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedRule")
            .field("path", &self.path)
            .field("effect", &self.effect)
            .field("when", &self.when.as_ref().map(|(_, source)| source))
            .finish()
    }
}

/// Checks the rules at `path` (`tenants[0].policy`), in order.
///
/// # Errors
/// Every rule with no glob, a glob that does not parse, or a `when`
/// that does not compile or reads a variable other than [`VARIABLES`],
/// each naming its path.
pub fn check(path: &str, specs: &[RuleSpec]) -> Result<PolicyRules, Vec<PolicyError>> {
    let env = cel::Env::stdlib();
    let mut errors = Vec::new();
    let mut rules = Vec::with_capacity(specs.len());
    let mut builder = GlobSetBuilder::new();
    let mut glob_rule = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        let rule_path = format!("{path}[{index}]");
        let key = match spec.effect {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
        };
        if spec.globs.is_empty() {
            errors.push(PolicyError {
                path: format!("{rule_path}.{key}"),
                message: "at least one glob over exposed tool names is required".to_owned(),
            });
        }
        for (g, text) in spec.globs.iter().enumerate() {
            match Glob::new(text) {
                Ok(glob) => {
                    builder.add(glob);
                    glob_rule.push(index);
                }
                Err(e) => errors.push(PolicyError {
                    path: format!("{rule_path}.{key}[{g}]"),
                    message: format!("`{text}` is not a valid glob: {}", e.kind()),
                }),
            }
        }
        let when = match &spec.when {
            None => None,
            Some(source) => match compile_condition(&env, source) {
                Ok(program) => Some((Arc::new(program), source.clone())),
                Err(message) => {
                    errors.push(PolicyError {
                        path: format!("{rule_path}.when"),
                        message,
                    });
                    None
                }
            },
        };
        rules.push(CheckedRule {
            path: rule_path,
            effect: spec.effect,
            when,
        });
    }
    let globs = builder.build().map_err(|e| {
        vec![PolicyError {
            path: path.to_owned(),
            message: format!("the globs do not compile: {e}"),
        }]
    });
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(PolicyRules {
        rules,
        globs: globs?,
        glob_rule,
    })
}

/// Compiles a `when`, refusing variables other than [`VARIABLES`].
fn compile_condition(env: &cel::Env, source: &str) -> Result<cel::Program, String> {
    if source.trim().is_empty() {
        return Err("an empty condition (leave `when` out to match always)".to_owned());
    }
    let program = env
        .compile(source)
        .map_err(|e| format!("does not compile: {}", one_line(&e.to_string())))?;
    let free = free_variables(program.expression());
    if let Some(unknown) = free.keys().find(|name| !VARIABLES.contains(&name.as_str())) {
        return Err(format!(
            "reads `{unknown}`, which is not a variable here (a condition reads `claims`, \
             `subject`, `subject_key`, `caller` and `tool`)"
        ));
    }
    Ok(program)
}

/// Parser errors on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// CEL type names, which parse as identifiers (`type(x) == int`).
const TYPE_NAMES: [&str; 12] = [
    "bool",
    "bytes",
    "double",
    "dyn",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "type",
    "uint",
    "optional_type",
];

/// The identifiers an expression reads that no comprehension binds, with
/// how often (type names excluded).
pub fn free_variables(expression: &cel::IdedExpr) -> HashMap<String, usize> {
    fn walk<'e>(
        expression: &'e cel::IdedExpr,
        bound: &mut Vec<&'e str>,
        free: &mut HashMap<String, usize>,
    ) {
        use cel::common::ast::{EntryExpr, Expr};
        match &expression.expr {
            Expr::Unspecified | Expr::Literal(_) => {}
            Expr::Ident(name) => {
                if !name.starts_with('@')
                    && !bound.contains(&name.as_str())
                    && !TYPE_NAMES.contains(&name.as_str())
                {
                    *free.entry(name.clone()).or_default() += 1;
                }
            }
            Expr::Call(call) => {
                if let Some(target) = &call.target {
                    walk(target, bound, free);
                }
                for arg in &call.args {
                    walk(arg, bound, free);
                }
            }
            Expr::Comprehension(comprehension) => {
                walk(&comprehension.iter_range, bound, free);
                walk(&comprehension.accu_init, bound, free);
                let depth = bound.len();
                bound.push(&comprehension.iter_var);
                if let Some(second) = &comprehension.iter_var2 {
                    bound.push(second);
                }
                bound.push(&comprehension.accu_var);
                walk(&comprehension.loop_cond, bound, free);
                walk(&comprehension.loop_step, bound, free);
                walk(&comprehension.result, bound, free);
                bound.truncate(depth);
            }
            Expr::List(list) => {
                for element in &list.elements {
                    walk(element, bound, free);
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::StructField(field) => walk(&field.value, bound, free),
                        EntryExpr::MapEntry(entry) => {
                            walk(&entry.key, bound, free);
                            walk(&entry.value, bound, free);
                        }
                    }
                }
            }
            Expr::Select(select) => walk(&select.operand, bound, free),
            Expr::Struct(structure) => {
                for entry in &structure.entries {
                    match &entry.expr {
                        EntryExpr::StructField(field) => walk(&field.value, bound, free),
                        EntryExpr::MapEntry(entry) => {
                            walk(&entry.key, bound, free);
                            walk(&entry.value, bound, free);
                        }
                    }
                }
            }
        }
    }
    let mut free = HashMap::new();
    walk(expression, &mut Vec::new(), &mut free);
    free
}
