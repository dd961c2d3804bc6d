//! The configuration of a tenant's policy (`tenants[].policy`): ordered
//! rules, each `allow` or `deny` globs over exposed names (of tools and
//! prompts alike), or `allow_resources` or `deny_resources` globs over
//! resources (`<server>:<uri>`), with an optional CEL `when`. Validation
//! checks every glob and condition and keeps them parsed
//! ([`PolicyRules`]); the policy room builds the evaluating `Policy` from
//! them.

use std::collections::HashMap;
use std::sync::Arc;

use globset::{Glob, GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use serde::Deserialize;

use super::fields::Errors;

/// The variables a `when` may read. `tool`, `prompt` and `resource` are
/// bound only when a tool, a prompt or a resource is decided on: a
/// condition reading another fails, and a failure never grants.
pub const VARIABLES: [&str; 7] = [
    "claims",
    "subject",
    "subject_key",
    "caller",
    "tool",
    "prompt",
    "resource",
];

/// What a rule does to what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The caller may use it (and sees it).
    Allow,
    /// The caller may not use it, and does not see it.
    Deny,
}

/// What a rule's globs are matched against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Targets {
    /// Exposed names of tools and prompts (`allow`, `deny`): `server__name`.
    #[default]
    Names,
    /// Resources and resource templates (`allow_resources`,
    /// `deny_resources`): `<server>:<uri>`, split at the first `:` into a
    /// glob over the server's configured name and a glob over the URI in
    /// which `*` and `?` stay within a `/`-separated segment and `**`
    /// crosses them.
    Resources,
}

impl Targets {
    /// The configuration key of a rule with `effect` over these targets.
    #[must_use]
    pub fn key(self, effect: Effect) -> &'static str {
        match (self, effect) {
            (Targets::Names, Effect::Allow) => "allow",
            (Targets::Names, Effect::Deny) => "deny",
            (Targets::Resources, Effect::Allow) => "allow_resources",
            (Targets::Resources, Effect::Deny) => "deny_resources",
        }
    }
}

/// One rule as configured, before checking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// Allow or deny.
    pub effect: Effect,
    /// What the globs match: exposed names, or resources.
    pub targets: Targets,
    /// Globs over exposed names (`server__tool`, `server__prompt`) or
    /// over resources (`server:uri`); any one matching makes the rule
    /// apply.
    pub globs: Vec<String>,
    /// A CEL expression over [`VARIABLES`]; the rule applies only when it
    /// is true.
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
    /// Globs of tools and prompts the rule allows.
    pub(crate) allow: Option<RawGlobs>,
    /// Globs of tools and prompts the rule denies.
    pub(crate) deny: Option<RawGlobs>,
    /// Globs of resources (`server:uri`) the rule allows.
    pub(crate) allow_resources: Option<RawGlobs>,
    /// Globs of resources (`server:uri`) the rule denies.
    pub(crate) deny_resources: Option<RawGlobs>,
    /// A CEL condition over [`VARIABLES`].
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
        let mut given: Vec<(Effect, Targets, RawGlobs)> = [
            (Effect::Allow, Targets::Names, rule.allow),
            (Effect::Deny, Targets::Names, rule.deny),
            (Effect::Allow, Targets::Resources, rule.allow_resources),
            (Effect::Deny, Targets::Resources, rule.deny_resources),
        ]
        .into_iter()
        .filter_map(|(effect, targets, globs)| globs.map(|g| (effect, targets, g)))
        .collect();
        if given.len() != 1 {
            errors.push(
                format!("{path}[{index}]"),
                if given.is_empty() {
                    "a rule needs `allow` or `deny` (globs over exposed tool and prompt names) or \
                     `allow_resources` or `deny_resources` (globs over `server:uri`)"
                } else {
                    "a rule has exactly one of `allow`, `deny`, `allow_resources` and \
                     `deny_resources`, not both (write two rules; the first that matches decides)"
                },
            );
            continue;
        }
        let (effect, targets, globs) = given.remove(0);
        specs.push(RuleSpec {
            effect,
            targets,
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
    /// Every name rule's globs in one set, so a tool or prompt name is
    /// matched once.
    pub globs: GlobSet,
    /// The rule of each glob in `globs`.
    pub glob_rule: Vec<usize>,
    /// Every resource rule's URI globs in one set, so a URI is matched
    /// once.
    pub resource_uris: GlobSet,
    /// The server glob of each glob in `resource_uris`.
    pub resource_servers: Vec<GlobMatcher>,
    /// The rule of each glob in `resource_uris`.
    pub resource_rule: Vec<usize>,
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
    /// What its globs match.
    pub targets: Targets,
    /// The condition, compiled, and its source.
    pub when: Option<(Arc<cel::Program>, String)>,
}

impl std::fmt::Debug for CheckedRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedRule")
            .field("path", &self.path)
            .field("effect", &self.effect)
            .field("targets", &self.targets)
            .field("when", &self.when.as_ref().map(|(_, source)| source))
            .finish()
    }
}

/// Checks the rules at `path` (`tenants[0].policy`), in order.
///
/// # Errors
/// Every rule with no glob, a glob that does not parse (a resource glob
/// without its `server:`), or a `when` that does not compile or reads a
/// variable other than [`VARIABLES`], each naming its path.
pub fn check(path: &str, specs: &[RuleSpec]) -> Result<PolicyRules, Vec<PolicyError>> {
    let env = cel::Env::stdlib();
    let mut errors = Vec::new();
    let mut rules = Vec::with_capacity(specs.len());
    let mut builder = GlobSetBuilder::new();
    let mut glob_rule = Vec::new();
    let mut uri_builder = GlobSetBuilder::new();
    let mut resource_servers = Vec::new();
    let mut resource_rule = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        let rule_path = format!("{path}[{index}]");
        let key = spec.targets.key(spec.effect);
        if spec.globs.is_empty() {
            errors.push(PolicyError {
                path: format!("{rule_path}.{key}"),
                message: match spec.targets {
                    Targets::Names => {
                        "at least one glob over exposed tool and prompt names is \
                                       required"
                    }
                    Targets::Resources => {
                        "at least one glob over resources (`server:uri`) is \
                                           required"
                    }
                }
                .to_owned(),
            });
        }
        for (g, text) in spec.globs.iter().enumerate() {
            let checked = match spec.targets {
                Targets::Names => Glob::new(text).map_err(GlobError::from).map(|glob| {
                    builder.add(glob);
                    glob_rule.push(index);
                }),
                Targets::Resources => resource_glob(text).map(|(server, uri)| {
                    uri_builder.add(uri);
                    resource_servers.push(server.compile_matcher());
                    resource_rule.push(index);
                }),
            };
            if let Err(message) = checked.map_err(|e| match e {
                GlobError::Shape(message) => message,
                GlobError::Parse(e) => format!("`{text}` is not a valid glob: {}", e.kind()),
            }) {
                errors.push(PolicyError {
                    path: format!("{rule_path}.{key}[{g}]"),
                    message,
                });
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
            targets: spec.targets,
            when,
        });
    }
    let compiled = |builder: GlobSetBuilder| {
        builder.build().map_err(|e| {
            vec![PolicyError {
                path: path.to_owned(),
                message: format!("the globs do not compile: {e}"),
            }]
        })
    };
    let globs = compiled(builder);
    let resource_uris = compiled(uri_builder);
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(PolicyRules {
        rules,
        globs: globs?,
        glob_rule,
        resource_uris: resource_uris?,
        resource_servers,
        resource_rule,
    })
}

/// Why a glob is refused.
enum GlobError {
    /// It does not parse.
    Parse(globset::Error),
    /// It parses, but is not of the shape its key needs.
    Shape(String),
}

impl From<globset::Error> for GlobError {
    fn from(error: globset::Error) -> Self {
        GlobError::Parse(error)
    }
}

/// A resource glob `<server>:<uri>`, split at the first `:` (a server's
/// name has none): a glob over the server's name, and one over the URI in
/// which `*` and `?` do not cross `/` and `**` does.
fn resource_glob(text: &str) -> Result<(Glob, Glob), GlobError> {
    let Some((server, uri)) = text.split_once(':') else {
        return Err(GlobError::Shape(format!(
            "`{text}` is not `<server>:<uri>`: a resource glob names the server first \
             (`docs:file:///public/**`, `*:**` for every resource)"
        )));
    };
    if uri.starts_with("//") {
        // `file:///etc/passwd`: a URI with no server before it.
        return Err(GlobError::Shape(format!(
            "`{text}` reads as server `{server}` and URI `{uri}`: a resource glob names the \
             server first (`<server>:{text}`)"
        )));
    }
    if server.is_empty() || uri.is_empty() {
        return Err(GlobError::Shape(format!(
            "`{text}` has an empty {} glob (`*` for any server, `**` for any URI)",
            if server.is_empty() { "server" } else { "URI" }
        )));
    }
    if let Some(why) = never_normal(uri) {
        return Err(GlobError::Shape(format!(
            "`{text}` can never match: resource URIs are matched in normal form \
             (docs/governance.md, \"Resource URIs in normal form\"), in which {why}"
        )));
    }
    Ok((
        Glob::new(server)?,
        GlobBuilder::new(uri).literal_separator(true).build()?,
    ))
}

/// Why a resource rule's URI glob can never match a URI in normal form
/// (the policy's `ResourceUri`), when something literal in it says so: a
/// rule that silently matches nothing would be a deny that never applies.
fn never_normal(uri: &str) -> Option<&'static str> {
    if let Some((scheme, rest)) = uri.split_once(':') {
        if scheme.bytes().any(|b| b.is_ascii_uppercase()) {
            return Some("the scheme is in lower case");
        }
        if let Some(after) = rest.strip_prefix("//") {
            let authority = after.split('/').next().unwrap_or_default();
            let host = authority.rsplit('@').next().unwrap_or_default();
            if scheme == "file" && host.eq_ignore_ascii_case("localhost") {
                return Some("`file://localhost/` is `file:///`");
            }
            if !host.contains('[') && host.bytes().any(|b| b.is_ascii_uppercase()) {
                return Some("the host is in lower case");
            }
        }
    }
    if uri
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Some("no `.` or `..` segment is left");
    }
    let bytes = uri.as_bytes();
    for (at, _) in uri.match_indices('%') {
        let Some(escape) = bytes.get(at + 1..at + 3) else {
            continue;
        };
        let Ok(byte) = u8::from_str_radix(std::str::from_utf8(escape).unwrap_or("zz"), 16) else {
            continue;
        };
        if matches!(byte, b'/' | b'\\') {
            return Some("an encoded separator (`%2F`, `%5C`) is refused");
        }
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            return Some("escapes of letters, digits, `-`, `.`, `_` and `~` are decoded");
        }
        if escape.iter().any(u8::is_ascii_lowercase) {
            return Some("escapes are in upper case (`%C3%A9`)");
        }
    }
    None
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
             `subject`, `subject_key`, `caller`, `tool`, `prompt` and `resource`)"
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
