//! The configuration of a tenant's policy (`tenants[].policy`): ordered
//! rules, each `allow` or `deny` globs over exposed names (of tools and
//! prompts alike), `require_approval` globs over exposed tool names (with
//! an optional `approval:` block), or `allow_resources` or
//! `deny_resources` globs over resources (`<server>:<uri>`), with an
//! optional CEL `when`. Validation checks every glob, condition and
//! approval option and keeps them parsed ([`PolicyRules`]); the policy
//! room builds the evaluating `Policy` from them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use globset::{Glob, GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use serde::Deserialize;

use super::fields::Errors;

/// The variables a `when` may read. `tool`, `prompt` and `resource` are
/// bound only when a tool, a prompt or a resource is decided on: a
/// condition reading another fails, and a failure never grants. `args`
/// (the arguments of a tool call or of a prompt) is bound only when a
/// call is decided: a rule whose `when` reads it is decided at call time.
pub const VARIABLES: [&str; 8] = [
    "claims",
    "subject",
    "subject_key",
    "caller",
    "tool",
    "prompt",
    "resource",
    "args",
];

/// The variables an `approval.approvers` expression may read: who would
/// decide, never what is decided.
pub const APPROVER_VARIABLES: [&str; 4] = ["claims", "subject", "subject_key", "caller"];

/// How long a call waits for a decision unless `approval.wait` says.
pub const DEFAULT_APPROVAL_WAIT: Duration = Duration::from_secs(3600);
/// How long an approval holds once given unless `approval.valid_for` says.
pub const DEFAULT_APPROVAL_VALID_FOR: Duration = Duration::from_secs(15 * 60);
/// How many calls one approval allows unless `approval.uses` says.
pub const DEFAULT_APPROVAL_USES: u32 = 1;

/// The bounds of `approval.wait`.
const WAIT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(7 * 86400));
/// The bounds of `approval.valid_for`.
const VALID_FOR_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(7 * 86400));
/// The bounds of `approval.uses`.
const USES_RANGE: (i64, i64) = (1, 100);

/// What a rule does to what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The caller may use it (and sees it).
    Allow,
    /// The caller may not use it, and does not see it.
    Deny,
    /// The caller sees the tool, and a person must approve each call it
    /// matches first (tools only: never prompts nor resources).
    RequireApproval,
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
            // Only over names; a spec over resources is refused by `check`.
            (_, Effect::RequireApproval) => "require_approval",
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
    /// The `approval:` block as written (only a `require_approval` rule
    /// takes one; unset, the defaults).
    pub approval: Option<ApprovalSpec>,
}

/// A `require_approval` rule's `approval:` block as written, before
/// checking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApprovalSpec {
    /// A CEL expression over [`APPROVER_VARIABLES`]: who may decide.
    /// Unset: only the tenant's approver tokens.
    pub approvers: Option<String>,
    /// How long a request waits for a decision (a duration such as
    /// `"1h"`, 1s to 7d; default [`DEFAULT_APPROVAL_WAIT`]).
    pub wait: Option<String>,
    /// How long an approval holds once given (1s to 7d; default
    /// [`DEFAULT_APPROVAL_VALID_FOR`]).
    pub valid_for: Option<String>,
    /// How many calls one approval allows (1 to 100; default
    /// [`DEFAULT_APPROVAL_USES`]).
    pub uses: Option<i64>,
    /// Whether the subject that asked for the call may approve it itself
    /// (default false).
    pub self_approval: Option<bool>,
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
    /// Globs of tools whose calls the rule holds for a person's approval.
    pub(crate) require_approval: Option<RawGlobs>,
    /// A CEL condition over [`VARIABLES`].
    pub(crate) when: Option<String>,
    /// The options of a `require_approval` rule.
    pub(crate) approval: Option<RawApproval>,
}

/// A `require_approval` rule's `approval:` block as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApproval {
    /// A CEL condition over [`APPROVER_VARIABLES`]: who may decide.
    pub(crate) approvers: Option<String>,
    /// How long a request waits for a decision.
    pub(crate) wait: Option<String>,
    /// How long an approval holds once given.
    pub(crate) valid_for: Option<String>,
    /// How many calls one approval allows.
    pub(crate) uses: Option<i64>,
    /// Whether the subject that asked may approve its own call.
    pub(crate) self_approval: Option<bool>,
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
            (
                Effect::RequireApproval,
                Targets::Names,
                rule.require_approval,
            ),
        ]
        .into_iter()
        .filter_map(|(effect, targets, globs)| globs.map(|g| (effect, targets, g)))
        .collect();
        if given.len() != 1 {
            errors.push(
                format!("{path}[{index}]"),
                if given.is_empty() {
                    "a rule needs `allow` or `deny` (globs over exposed tool and prompt names), \
                     `require_approval` (globs over exposed tool names) or `allow_resources` or \
                     `deny_resources` (globs over `server:uri`)"
                } else {
                    "a rule has exactly one of `allow`, `deny`, `require_approval`, \
                     `allow_resources` and `deny_resources`, not both (write two rules; the first \
                     that matches decides)"
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
            approval: rule.approval.map(|a| ApprovalSpec {
                approvers: a.approvers,
                wait: a.wait,
                valid_for: a.valid_for,
                uses: a.uses,
                self_approval: a.self_approval,
            }),
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
    /// The globs of the rules decided at call time for a tool (a `when`
    /// reading `args`, or `require_approval`).
    pub call_time_tools: GlobSet,
    /// The globs of the rules decided at call time for a prompt (a `when`
    /// reading `args`; `require_approval` never matches prompts).
    pub call_time_prompts: GlobSet,
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
    /// Whether the condition reads `args` (the rule is decided at call
    /// time).
    pub reads_args: bool,
    /// The approval options of a `require_approval` rule (the defaults
    /// when it has no `approval:` block); `None` for any other rule.
    pub approval: Option<CheckedApproval>,
}

impl std::fmt::Debug for CheckedRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedRule")
            .field("path", &self.path)
            .field("effect", &self.effect)
            .field("targets", &self.targets)
            .field("when", &self.when.as_ref().map(|(_, source)| source))
            .field("approval", &self.approval)
            .finish()
    }
}

/// A `require_approval` rule's approval options, checked.
pub struct CheckedApproval {
    /// Who may decide: the compiled expression and its source; `None`,
    /// only the tenant's approver tokens.
    pub approvers: Option<(Arc<cel::Program>, String)>,
    /// How long a request waits for a decision.
    pub wait: Duration,
    /// How long an approval holds once given.
    pub valid_for: Duration,
    /// How many calls one approval allows.
    pub uses: u32,
    /// Whether the subject that asked may approve its own call.
    pub self_approval: bool,
    /// Lowercase hex SHA-256 over the rule as configured (its path,
    /// effect, globs, `when` and these options): it changes when the rule
    /// does.
    pub digest: String,
}

impl std::fmt::Debug for CheckedApproval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedApproval")
            .field(
                "approvers",
                &self.approvers.as_ref().map(|(_, source)| source),
            )
            .field("wait", &self.wait)
            .field("valid_for", &self.valid_for)
            .field("uses", &self.uses)
            .field("self_approval", &self.self_approval)
            .field("digest", &self.digest)
            .finish()
    }
}

/// Checks the rules at `path` (`tenants[0].policy`), in order.
///
/// # Errors
/// Every rule with no glob, a glob that does not parse (a resource glob
/// without its `server:`), a `when` that does not compile or reads a
/// variable other than [`VARIABLES`] (or, over resources, `args`), an
/// `approval:` block on a rule other than `require_approval`, or an
/// approval option out of its bounds, each naming its path.
pub fn check(path: &str, specs: &[RuleSpec]) -> Result<PolicyRules, Vec<PolicyError>> {
    let env = cel::Env::stdlib();
    let mut errors = Vec::new();
    let mut rules = Vec::with_capacity(specs.len());
    let mut builder = GlobSetBuilder::new();
    let mut glob_rule = Vec::new();
    let mut uri_builder = GlobSetBuilder::new();
    let mut resource_servers = Vec::new();
    let mut resource_rule = Vec::new();
    let mut call_time_tools = GlobSetBuilder::new();
    let mut call_time_prompts = GlobSetBuilder::new();
    for (index, spec) in specs.iter().enumerate() {
        let rule_path = format!("{path}[{index}]");
        let key = spec.targets.key(spec.effect);
        if spec.effect == Effect::RequireApproval && spec.targets == Targets::Resources {
            errors.push(PolicyError {
                path: rule_path.clone(),
                message: "`require_approval` is over exposed tool names, never resources"
                    .to_owned(),
            });
        }
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
            Some(source) => match compile_condition(&env, source, &VARIABLES) {
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
        let reads_args = when
            .as_ref()
            .is_some_and(|(program, _)| free_variables(program.expression()).contains_key("args"));
        if reads_args && spec.targets == Targets::Resources {
            errors.push(PolicyError {
                path: format!("{rule_path}.when"),
                message: "reads `args`, which only a tool call or a prompt has: a resource rule \
                          cannot read it"
                    .to_owned(),
            });
        }
        let approval = match (spec.effect, &spec.approval) {
            (Effect::RequireApproval, given) => {
                let default = ApprovalSpec::default();
                Some(check_approval(
                    &env,
                    &rule_path,
                    spec,
                    given.as_ref().unwrap_or(&default),
                    &mut errors,
                ))
            }
            (_, Some(_)) => {
                errors.push(PolicyError {
                    path: format!("{rule_path}.approval"),
                    message: "only a `require_approval` rule takes `approval:`".to_owned(),
                });
                None
            }
            (_, None) => None,
        };
        if spec.targets == Targets::Names && (reads_args || spec.effect == Effect::RequireApproval)
        {
            for glob in spec.globs.iter().filter_map(|text| Glob::new(text).ok()) {
                if spec.effect != Effect::RequireApproval {
                    call_time_prompts.add(glob.clone());
                }
                call_time_tools.add(glob);
            }
        }
        rules.push(CheckedRule {
            path: rule_path,
            effect: spec.effect,
            targets: spec.targets,
            when,
            reads_args,
            approval,
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
    let call_time_tools = compiled(call_time_tools);
    let call_time_prompts = compiled(call_time_prompts);
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
        call_time_tools: call_time_tools?,
        call_time_prompts: call_time_prompts?,
    })
}

/// Checks the `approval:` options of the `require_approval` rule at
/// `rule_path` (`given`, the defaults when it has none), recording each
/// bad field under `{rule_path}.approval.<field>`.
fn check_approval(
    env: &cel::Env,
    rule_path: &str,
    spec: &RuleSpec,
    given: &ApprovalSpec,
    errors: &mut Vec<PolicyError>,
) -> CheckedApproval {
    let at = |field: &str| format!("{rule_path}.approval.{field}");
    let approvers = given.approvers.as_ref().and_then(|source| {
        match compile_condition(env, source, &APPROVER_VARIABLES) {
            Ok(program) => Some((Arc::new(program), source.clone())),
            Err(message) => {
                errors.push(PolicyError {
                    path: at("approvers"),
                    message,
                });
                None
            }
        }
    });
    let mut duration = |field: &str, text: Option<&str>, default, (min, max)| {
        let Some(text) = text else {
            return default;
        };
        let message = match humantime::parse_duration(text) {
            Ok(value) if (min..=max).contains(&value) => return value,
            Ok(_) => format!(
                "must be between {} and {}",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
            Err(e) => format!("`{text}` is not a duration such as \"1h\" or \"15m\": {e}"),
        };
        errors.push(PolicyError {
            path: at(field),
            message,
        });
        default
    };
    let wait = duration(
        "wait",
        given.wait.as_deref(),
        DEFAULT_APPROVAL_WAIT,
        WAIT_RANGE,
    );
    let valid_for = duration(
        "valid_for",
        given.valid_for.as_deref(),
        DEFAULT_APPROVAL_VALID_FOR,
        VALID_FOR_RANGE,
    );
    let uses = match given.uses {
        None => DEFAULT_APPROVAL_USES,
        Some(uses) => match u32::try_from(uses) {
            Ok(value) if (USES_RANGE.0..=USES_RANGE.1).contains(&uses) => value,
            _ => {
                errors.push(PolicyError {
                    path: at("uses"),
                    message: format!(
                        "must be between {} and {} (calls one approval allows)",
                        USES_RANGE.0, USES_RANGE.1
                    ),
                });
                DEFAULT_APPROVAL_USES
            }
        },
    };
    let self_approval = given.self_approval.unwrap_or(false);
    let digest = rule_digest(
        rule_path,
        spec,
        approvers.as_ref().map(|(_, source)| source.as_str()),
        [
            wait.as_millis().to_le_bytes().as_slice(),
            valid_for.as_millis().to_le_bytes().as_slice(),
            uses.to_le_bytes().as_slice(),
            &[u8::from(self_approval)],
        ],
    );
    CheckedApproval {
        approvers,
        wait,
        valid_for,
        uses,
        self_approval,
        digest,
    }
}

/// Lowercase hex SHA-256 over a rule as configured: its path, effect,
/// globs, `when`, `approvers` and the other approval options (as they
/// take effect, so that writing a default out changes nothing), each
/// length-prefixed under a domain tag.
fn rule_digest(
    rule_path: &str,
    spec: &RuleSpec,
    approvers: Option<&str>,
    options: [&[u8]; 4],
) -> String {
    let mut hasher = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    field(b"toolgate policy rule v1");
    field(rule_path.as_bytes());
    field(spec.targets.key(spec.effect).as_bytes());
    field(&(spec.globs.len() as u64).to_le_bytes());
    for glob in &spec.globs {
        field(glob.as_bytes());
    }
    for optional in [spec.when.as_deref(), approvers] {
        match optional {
            None => field(b"-"),
            Some(source) => {
                field(b"+");
                field(source.as_bytes());
            }
        }
    }
    for option in options {
        field(option);
    }
    hex::encode(hasher.finalize())
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

/// Compiles a condition (a `when`, or `approvers`), refusing variables
/// other than `variables`.
fn compile_condition(
    env: &cel::Env,
    source: &str,
    variables: &[&str],
) -> Result<cel::Program, String> {
    if source.trim().is_empty() {
        return Err("an empty condition (leave it out to match always)".to_owned());
    }
    let program = env
        .compile(source)
        .map_err(|e| format!("does not compile: {}", one_line(&e.to_string())))?;
    let free = free_variables(program.expression());
    if let Some(unknown) = free.keys().find(|name| !variables.contains(&name.as_str())) {
        let named: Vec<String> = variables.iter().map(|v| format!("`{v}`")).collect();
        let list = match named.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => named.concat(),
        };
        return Err(format!(
            "reads `{unknown}`, which is not a variable here (a condition reads {list})"
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::validate::testing::{load, messages};

    /// A tenant whose policy is `rules` (YAML list items, indented by six).
    fn with_policy(rules: &str) -> String {
        format!("tenants:\n  - name: acme\n    tokens: [t]\n    policy:\n{rules}")
    }

    #[test]
    fn require_approval_rules_load_with_their_options_and_defaults() {
        let config = load(&with_policy(
            r#"      - deny: "db__*"
        when: "args.sql.contains('payroll.')"
      - require_approval: ["payments__send_*", "payments__refund"]
        when: "args.amount > 500"
        approval:
          approvers: "'finance' in claims.groups"
          wait: 2h
          valid_for: 10m
          uses: 3
          self_approval: true
      - require_approval: payments__close
"#,
        ))
        .unwrap();
        let rules = config.tenants[0].policy.as_ref().unwrap();
        assert!(rules.rules[0].reads_args && rules.rules[0].approval.is_none());
        let given = rules.rules[1].approval.as_ref().unwrap();
        assert_eq!(given.wait, Duration::from_secs(7200));
        assert_eq!(given.valid_for, Duration::from_secs(600));
        assert_eq!(given.uses, 3);
        assert!(given.self_approval);
        assert_eq!(
            given.approvers.as_ref().map(|(_, s)| s.as_str()),
            Some("'finance' in claims.groups")
        );
        let defaults = rules.rules[2].approval.as_ref().unwrap();
        assert_eq!(defaults.wait, super::DEFAULT_APPROVAL_WAIT);
        assert_eq!(defaults.valid_for, super::DEFAULT_APPROVAL_VALID_FOR);
        assert_eq!(defaults.uses, 1);
        assert!(!defaults.self_approval && defaults.approvers.is_none());
        assert!(!rules.rules[2].reads_args);
        assert_eq!(defaults.digest.len(), 64);
        assert!(rules.call_time_tools.is_match("payments__send_eur"));
        assert!(rules.call_time_tools.is_match("db__query"));
        assert!(!rules.call_time_tools.is_match("web__fetch"));
        // require_approval never matches prompts.
        assert!(!rules.call_time_prompts.is_match("payments__refund"));
        assert!(rules.call_time_prompts.is_match("db__query"));
    }

    #[test]
    fn every_bad_approval_field_names_its_path() {
        let errors = messages(&with_policy(
            r#"      - allow: "a__*"
        approval: {uses: 2}
      - require_approval: "b__*"
        approval:
          approvers: "tool.name == 'x'"
          wait: 500ms
          valid_for: soon
          uses: 0
      - require_approval: "c__*"
        approval: {wait: 8d, valid_for: 10ms, uses: 101, approvers: "claims.groups.exists(g,"}
      - deny_resources: "docs:**"
        when: "args.x == 1"
"#,
        ));
        let paths: Vec<&str> = errors
            .iter()
            .map(|e| e.split_once(": ").unwrap().0)
            .collect();
        assert_eq!(
            paths,
            [
                "tenants[0].policy[0].approval",
                "tenants[0].policy[1].approval.approvers",
                "tenants[0].policy[1].approval.wait",
                "tenants[0].policy[1].approval.valid_for",
                "tenants[0].policy[1].approval.uses",
                "tenants[0].policy[2].approval.approvers",
                "tenants[0].policy[2].approval.wait",
                "tenants[0].policy[2].approval.valid_for",
                "tenants[0].policy[2].approval.uses",
                "tenants[0].policy[3].when",
            ],
            "{errors:#?}"
        );
        let text = errors.join("\n");
        assert!(
            text.contains("only a `require_approval` rule takes `approval:`"),
            "{text}"
        );
        assert!(
            text.contains("reads `tool`, which is not a variable here (a condition reads `claims`, `subject`, `subject_key` and `caller`)"),
            "{text}"
        );
        assert!(text.contains("must be between 1s and 7days"), "{text}");
        assert!(text.contains("`soon` is not a duration"), "{text}");
        assert!(text.contains("must be between 1 and 100"), "{text}");
        assert!(text.contains("a resource rule cannot read it"), "{text}");
        // A rule of two effects, or of none (an `approval:` alone).
        let errors = messages(&with_policy(
            "      - require_approval: \"d__*\"\n        deny: \"d__*\"\n      - approval: {}\n",
        ));
        assert!(
            errors[0].starts_with("tenants[0].policy[0]: a rule has exactly one of `allow`, `deny`, `require_approval`"),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("tenants[0].policy[1]: a rule needs"),
            "{errors:?}"
        );
    }

    #[test]
    fn approval_keys_are_refused_when_unknown_and_args_is_a_variable() {
        let error = load(&with_policy(
            "      - require_approval: \"b__*\"\n        approval: {approver: x}\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(error.contains("approver"), "{error}");
        let errors = messages(&with_policy(
            "      - deny: \"b__*\"\n        when: \"argz.x == 1\"\n",
        ));
        assert!(errors[0].contains("`resource` and `args`)"), "{errors:?}");
    }
}
