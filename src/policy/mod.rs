//! Per-tool policy: a tenant's ordered `allow`/`deny` rules over exposed
//! tool and prompt names, and `allow_resources`/`deny_resources` rules over
//! resources (`server:uri`), each with an optional CEL condition (`when`)
//! on the caller's claims, how it authenticated, its subject and the tool,
//! prompt or resource decided on. The first rule that matches decides;
//! no match allows. Name rules never match resources, and resource rules
//! never match names. Compiled once per configuration; [`view`] holds the
//! caller's view of a catalog (what ListTools, SearchTools and WatchTools
//! show it), cached per catalog snapshot.
//!
//! A `when` that cannot be evaluated for a call (a missing claim, a type
//! mismatch, a result that is not a boolean) never widens access: it counts
//! as true for a `deny` rule and for a `require_approval` rule, and false
//! for an `allow` rule. The first such failure of each rule is logged at
//! debug level (naming the rule, never a value).
//!
//! Some rules are decided at call time ([`call`]): those whose `when`
//! reads `args` (the call's arguments) and every `require_approval` rule
//! (which holds a tool call for a person's approval, and never matches a
//! prompt or a resource). Such a rule never hides a tool: in a listing a
//! call-time `allow` or `require_approval` shows it (its condition may
//! hold), a call-time `deny` is passed over; the call is then decided with
//! its arguments bound ([`Policy::decide_call`]), and a condition reading
//! `args` that fails to evaluate refuses the call, naming the rule.
//!
//! Here: the compiled policy and its evaluation. What a condition reads of
//! `tool` (so that values are remembered across tools alike) is in `reads`,
//! the CEL values of `tool`, `prompt`, `resource` and `claims` in `values`,
//! the decisions on prompts and resources in `targets`, the one normal
//! form of a resource URI (what is matched, and sent) in `uri`, the
//! decisions on one call (with its arguments) in `call`.

mod call;
mod reads;
mod targets;
mod unlisted;
mod uri;
mod values;

/// A policy of one-glob rules `(effect, glob, when)`, for the rooms' tests.
#[cfg(test)]
pub(crate) fn test_policy(rules: &[(Effect, &str, Option<&str>)]) -> Policy {
    let specs: Vec<RuleSpec> = rules
        .iter()
        .map(|(effect, glob, when)| RuleSpec {
            effect: *effect,
            targets: crate::config::policy::Targets::Names,
            globs: vec![(*glob).to_owned()],
            when: when.map(str::to_owned),
            approval: None,
        })
        .collect();
    Policy::compile("tenants[0].policy", &specs).unwrap()
}
pub mod view;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cel::common::types::CelString;
use globset::{Candidate, GlobSet};

use crate::callers::{Caller, Subject};
use crate::catalog::{CatalogPrompt, CatalogSkill, CatalogTool};
use crate::config::policy::free_variables;
pub use crate::config::policy::{
    APPROVER_VARIABLES, ApprovalSpec, Effect, PolicyError, PolicyRules, RuleSpec, Targets,
    VARIABLES,
};

pub use call::{ApprovalRule, Verdict};
pub use unlisted::Unlisted;
pub use uri::{ResourceUri, UriError};
pub use view::{View, cached_view, caller_view};

use reads::{ToolReads, tool_reads};
use values::{caller_val, json_val, object_val, prompt_val, resource_val, skill_val, tool_val};

/// Identities of compiled policies: keys of cached views, so that a view
/// evaluated under one configuration is never served under another.
static POLICY_IDS: AtomicU64 = AtomicU64::new(1);

/// A tenant's compiled policy.
pub struct Policy {
    /// Unique per compiled policy (see [`POLICY_IDS`]).
    id: u64,
    rules: Vec<Rule>,
    /// Every name rule's globs in one set, so a tool or prompt name is
    /// matched once.
    globs: GlobSet,
    /// The rule of each glob in `globs`.
    glob_rule: Vec<usize>,
    /// Every resource rule's URI globs in one set.
    resource_uris: GlobSet,
    /// The server glob of each glob in `resource_uris`.
    resource_servers: Vec<globset::GlobMatcher>,
    /// The rule of each glob in `resource_uris`.
    resource_rule: Vec<usize>,
    /// The globs of the rules decided at call time for a tool.
    call_time_tools: GlobSet,
    /// The globs of the rules decided at call time for a prompt.
    call_time_prompts: GlobSet,
    env: Arc<cel::Env>,
    /// Whether any `when` reads `claims`.
    reads_claims: bool,
    /// Whether any `when` reads `subject` or `subject_key`.
    reads_subject: bool,
    /// Whether any `when` reads `caller`.
    reads_caller: bool,
    /// Whether any `when` reads `args`.
    reads_args: bool,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("id", &self.id)
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

struct Rule {
    /// `tenants[i].policy[j]`, for logs.
    path: String,
    effect: Effect,
    when: Option<Condition>,
    /// A `require_approval` rule's options (always set for one).
    approval: Option<Arc<ApprovalRule>>,
}

impl Rule {
    /// Whether its condition reads `args`.
    fn reads_args(&self) -> bool {
        self.when.as_ref().is_some_and(|c| c.reads_args)
    }

    /// Why it is decided at call time, if it is.
    fn call_time(&self) -> Option<&'static str> {
        if self.effect == Effect::RequireApproval {
            Some("require_approval")
        } else if self.reads_args() {
            Some("reads args")
        } else {
            None
        }
    }
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule")
            .field("path", &self.path)
            .field("effect", &self.effect)
            .field("when", &self.when.as_ref().map(|c| &c.source))
            .field("approval", &self.approval)
            .finish()
    }
}

struct Condition {
    program: Arc<cel::Program>,
    source: String,
    /// What it reads of `tool`: nothing (its value is the same for every
    /// tool of one caller, and is evaluated once per caller), or which
    /// fields (its value is the same for tools alike in them).
    reads_tool: ToolReads,
    /// Whether it reads `prompt` (bound only for a prompt).
    reads_prompt: bool,
    /// Whether it reads `resource` (bound only for a resource).
    reads_resource: bool,
    /// Whether it reads `args` (bound only when one call is decided):
    /// never evaluated for a listing, never remembered.
    reads_args: bool,
    /// Set once its first evaluation failure has been logged.
    failure_logged: AtomicBool,
}

impl Policy {
    /// Checks and compiles the rules at `path` (`tenants[0].policy`), in
    /// order (what configuration validation does, then [`Policy::new`]).
    ///
    /// # Errors
    /// What [`crate::config::policy::check`] refuses.
    pub fn compile(path: &str, specs: &[RuleSpec]) -> Result<Policy, Vec<PolicyError>> {
        crate::config::policy::check(path, specs).map(|rules| Policy::new(&rules))
    }

    /// The policy of checked rules: each condition's reads analysed once,
    /// so that evaluation converts only what the rules read.
    pub fn new(checked: &PolicyRules) -> Policy {
        let (mut reads_claims, mut reads_subject, mut reads_caller) = (false, false, false);
        let env = Arc::new(cel::Env::stdlib());
        let rules: Vec<Rule> = checked
            .rules
            .iter()
            .map(|rule| Rule {
                path: rule.path.clone(),
                effect: rule.effect,
                approval: rule
                    .approval
                    .as_ref()
                    .map(|approval| Arc::new(ApprovalRule::new(&rule.path, approval, &env))),
                when: rule.when.as_ref().map(|(program, source)| {
                    let free = free_variables(program.expression());
                    reads_claims |= free.contains_key("claims");
                    reads_subject |=
                        free.contains_key("subject") || free.contains_key("subject_key");
                    reads_caller |= free.contains_key("caller");
                    Condition {
                        program: program.clone(),
                        source: source.clone(),
                        reads_tool: tool_reads(program.expression()),
                        reads_prompt: free.contains_key("prompt"),
                        reads_resource: free.contains_key("resource"),
                        reads_args: free.contains_key("args"),
                        failure_logged: AtomicBool::new(false),
                    }
                }),
            })
            .collect();
        let reads_args = rules.iter().any(Rule::reads_args);
        Policy {
            id: POLICY_IDS.fetch_add(1, Ordering::Relaxed),
            rules,
            globs: checked.globs.clone(),
            glob_rule: checked.glob_rule.clone(),
            resource_uris: checked.resource_uris.clone(),
            resource_servers: checked.resource_servers.clone(),
            resource_rule: checked.resource_rule.clone(),
            call_time_tools: checked.call_time_tools.clone(),
            call_time_prompts: checked.call_time_prompts.clone(),
            env,
            reads_claims,
            reads_subject,
            reads_caller,
            reads_args,
        }
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there is no rule (everything is allowed).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `caller`, acting for `subject`, may see `tool` and call it
    /// as far as its listing tells: the effect of the first rule whose
    /// glob matches the tool's exposed name and whose `when` holds;
    /// allowed when none does. A rule decided at call time never hides a
    /// tool (see the module documentation): when
    /// [`Policy::decides_at_call`] says so, the call itself is decided by
    /// [`Policy::decide_call`].
    pub fn allows(&self, caller: &Caller, subject: &Subject, tool: &CatalogTool) -> bool {
        self.evaluator(caller, subject).allows(tool)
    }

    /// An evaluator for many tools of one caller: the caller's variables
    /// are converted once, conditions that do not read `tool` are
    /// evaluated once, and those that read only its server or annotations
    /// once per server and set of hints.
    pub(crate) fn evaluator<'a>(
        &'a self,
        caller: &'a Caller,
        subject: &'a Subject,
    ) -> Evaluator<'a> {
        let mut context = cel::Context::with_env(self.env.clone());
        if self.reads_claims {
            context.add_variable_as_val("claims", json_val(caller.claims.as_ref()));
        }
        if self.reads_subject {
            // `subject` is the id as named, `subject_key` says who vouched
            // for it ([`Subject::key`]); both `""` for the tenant itself.
            let id = subject.id().unwrap_or("");
            context.add_variable_as_val("subject", Box::new(CelString::from(id)));
            context.add_variable_as_val("subject_key", Box::new(CelString::from(subject.key())));
        }
        if self.reads_caller {
            context.add_variable_as_val("caller", caller_val(caller));
        }
        Evaluator {
            policy: self,
            context,
            memo: vec![None; self.rules.len()],
            tool_memo: HashMap::new(),
            matched: Vec::new(),
            stage: Stage::Listing,
        }
    }

    /// The identity of this compiled policy (a key of cached views).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Whether any `when` reads `claims` / `subject` (or `subject_key`) /
    /// `caller` (what a cached view must be keyed by).
    pub(crate) fn reads(&self) -> (bool, bool, bool) {
        (self.reads_claims, self.reads_subject, self.reads_caller)
    }
}

/// Evaluates one caller's access to many tools, prompts or resources.
pub(crate) struct Evaluator<'a> {
    policy: &'a Policy,
    context: cel::Context<'a, 'a>,
    /// Per rule, the value of a condition that reads nothing of the target
    /// decided on (nor `args`), once evaluated. One value serves every
    /// kind of target: such a condition sees the caller's variables and
    /// none of `tool`, `prompt` and `resource` bound, whatever is decided.
    memo: Vec<Option<Holds>>,
    /// Values of conditions that read only a tool's server or annotations:
    /// by rule, server index and hints.
    tool_memo: HashMap<(usize, usize, u8), Holds>,
    /// Scratch space: indices of the globs matching a name, then of their
    /// rules.
    matched: Vec<usize>,
    /// Whether it decides listings, or one call with its arguments bound.
    stage: Stage,
}

/// What an evaluator decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// What a caller sees (and may call as far as a listing tells):
    /// conditions reading `args` are not evaluated.
    Listing,
    /// One call, `args` bound.
    Call,
}

/// The value of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    Yes,
    No,
    /// It failed to evaluate, or is not a boolean.
    Failed,
}

/// What the rules decided for one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// No rule refuses.
    Allow,
    /// Refused by the rule at this index; `failed`: its condition failed
    /// to evaluate.
    Deny { rule: usize, failed: bool },
    /// The `require_approval` rule at this index holds it (a listing
    /// shows the tool).
    Approval(usize),
}

impl Decision {
    /// Whether a listing shows it.
    fn visible(self) -> bool {
        !matches!(self, Decision::Deny { .. })
    }
}

/// What one decision is about: the variable a condition sees it as.
#[derive(Clone, Copy)]
enum Target<'a> {
    /// `tool`.
    Tool(&'a CatalogTool),
    /// `prompt`.
    Prompt(&'a CatalogPrompt),
    /// `resource`.
    Resource { server: &'a str, uri: &'a str },
    /// A skill: no variable of its own (a condition sees the caller's).
    Skill(&'a CatalogSkill),
}

impl<'a> Evaluator<'a> {
    /// This evaluator deciding one call, `arguments` bound as `args`.
    fn for_call(mut self, arguments: &'a serde_json::Map<String, serde_json::Value>) -> Self {
        if self.policy.reads_args {
            self.context
                .add_variable_as_val("args", object_val(arguments));
        }
        self.stage = Stage::Call;
        self
    }

    /// Whether the caller may see `tool` (and call it, as far as a
    /// listing tells).
    pub(crate) fn allows(&mut self, tool: &'a CatalogTool) -> bool {
        self.match_name(&tool.name);
        self.decide(Target::Tool(tool)).visible()
    }

    /// Whether the caller may see and get `prompt` (the name rules, as for
    /// a tool of the same name, `require_approval` rules aside).
    pub(crate) fn allows_prompt(&mut self, prompt: &'a CatalogPrompt) -> bool {
        self.match_name(&prompt.name);
        self.decide(Target::Prompt(prompt)).visible()
    }

    /// Whether the caller may see and fetch `skill`: the name rules, as
    /// for a prompt of the same name (`require_approval` rules aside), as
    /// a listing decides (a skill has no arguments: a rule reading `args`
    /// is decided as for a listing, at list and fetch time alike); a
    /// condition reading `tool`, `prompt` or `resource` fails for a skill,
    /// and a failure never grants (a `deny` applies).
    pub(crate) fn allows_skill(&mut self, skill: &'a CatalogSkill) -> bool {
        self.match_name(&skill.name);
        self.decide(Target::Skill(skill)).visible()
    }

    /// Whether the caller may see, read, watch or complete resource (or
    /// resource template) `uri` of server `server` (the resource rules),
    /// matched in its normal form.
    pub(crate) fn allows_resource(&mut self, server: &'a str, uri: &'a ResourceUri) -> bool {
        let uri = uri.as_str();
        let policy = self.policy;
        let matched = &mut self.matched;
        policy
            .resource_uris
            .matches_candidate_into(&Candidate::new(uri), matched);
        matched.retain(|&glob| policy.resource_servers[glob].is_match(server));
        for glob in matched.iter_mut() {
            *glob = policy.resource_rule[*glob];
        }
        matched.sort_unstable();
        matched.dedup();
        self.decide(Target::Resource { server, uri }).visible()
    }

    /// Leaves in `matched` the rules (in order) whose name globs match
    /// `name`.
    fn match_name(&mut self, name: &str) {
        let policy = self.policy;
        let matched = &mut self.matched;
        policy
            .globs
            .matches_candidate_into(&Candidate::new(name), matched);
        // Glob indices to rule indices, in rule order.
        for glob in matched.iter_mut() {
            *glob = policy.glob_rule[*glob];
        }
        matched.sort_unstable();
        matched.dedup();
    }

    /// The effect of the first of the `matched` rules whose condition
    /// holds for `target`; allowed when none does. `require_approval`
    /// rules match tools only. For a listing, a condition reading `args`
    /// may hold: such an `allow` or `require_approval` rule shows the
    /// tool, such a `deny` is passed over. For a call, such a condition
    /// that fails refuses the call; any other failing condition applies
    /// for a `deny` or `require_approval` rule and not for an `allow`.
    fn decide(&mut self, target: Target<'a>) -> Decision {
        let Evaluator {
            policy,
            context,
            memo,
            tool_memo,
            matched,
            stage,
        } = self;
        // The scope with the target's variable, made when a condition
        // first needs it.
        let mut scope: Option<cel::Context<'_, 'a>> = None;
        for &index in matched.iter() {
            let rule = &policy.rules[index];
            if rule.effect == Effect::RequireApproval && !matches!(target, Target::Tool(_)) {
                continue;
            }
            let value = match &rule.when {
                None => Holds::Yes,
                Some(condition) if condition.reads_args && *stage == Stage::Listing => {
                    if rule.effect == Effect::Deny {
                        continue;
                    }
                    Holds::Yes
                }
                Some(condition) => {
                    // Whether it reads the target's variable, and where
                    // its value may be remembered (a value that depends on
                    // the arguments nowhere).
                    let (reads_target, key) = match target {
                        Target::Tool(tool) => (
                            condition.reads_tool.any(),
                            condition.reads_tool.memo_key(index, tool),
                        ),
                        Target::Prompt(_) => {
                            let reads = condition.reads_prompt;
                            (reads, (!reads).then_some(None))
                        }
                        Target::Resource { .. } => {
                            let reads = condition.reads_resource;
                            (reads, (!reads).then_some(None))
                        }
                        Target::Skill(_) => (false, Some(None)),
                    };
                    let key = key.filter(|_| !condition.reads_args);
                    let known = match key {
                        Some(None) => memo[index],
                        Some(Some(key)) => tool_memo.get(&key).copied(),
                        None => None,
                    };
                    match known {
                        Some(value) => value,
                        None => {
                            let value = if reads_target {
                                let scope = scope.get_or_insert_with(|| {
                                    let mut scope = context.new_inner_scope();
                                    let (name, value) = match target {
                                        Target::Tool(tool) => ("tool", tool_val(tool)),
                                        Target::Prompt(prompt) => ("prompt", prompt_val(prompt)),
                                        Target::Resource { server, uri } => {
                                            ("resource", resource_val(server, uri))
                                        }
                                        Target::Skill(skill) => ("skill", skill_val(skill)),
                                    };
                                    scope.add_variable_as_val(name, value);
                                    scope
                                });
                                evaluate(rule, condition, scope)
                            } else {
                                evaluate(rule, condition, context)
                            };
                            match key {
                                Some(None) => memo[index] = Some(value),
                                Some(Some(key)) => {
                                    tool_memo.insert(key, value);
                                }
                                None => {}
                            }
                            value
                        }
                    }
                }
            };
            let failed = value == Holds::Failed;
            match (value, rule.effect) {
                (Holds::No, _) => {}
                (Holds::Failed, _) if rule.reads_args() => {
                    return Decision::Deny {
                        rule: index,
                        failed,
                    };
                }
                (Holds::Failed, Effect::Allow) => {}
                (_, Effect::Allow) => return Decision::Allow,
                (_, Effect::Deny) => {
                    return Decision::Deny {
                        rule: index,
                        failed,
                    };
                }
                (_, Effect::RequireApproval) => return Decision::Approval(index),
            }
        }
        Decision::Allow
    }
}

/// Whether `rule` applies as far as a listing tells, its condition having
/// given `value`: a failure applies for a `deny` or `require_approval`
/// rule and not for an `allow` (it never grants).
fn applies(rule: &Rule, value: Holds) -> bool {
    match value {
        Holds::Yes => true,
        Holds::No => false,
        Holds::Failed => rule.effect != Effect::Allow,
    }
}

/// The value of `rule`'s condition. The first failure of each rule is
/// logged at debug level, naming the rule; what failed is logged only for
/// a condition that does not read `args` (a CEL error may quote the
/// values it failed on).
fn evaluate(rule: &Rule, condition: &Condition, context: &cel::Context<'_, '_>) -> Holds {
    let failure = match condition.program.execute(context) {
        Ok(cel::Value::Bool(true)) => return Holds::Yes,
        Ok(cel::Value::Bool(false)) => return Holds::No,
        Ok(other) => format!("the result is {:?}, not a boolean", other.type_of()),
        Err(_) if condition.reads_args => {
            "an evaluation error (not logged: it may quote the call's arguments)".to_owned()
        }
        Err(error) => error.to_string(),
    };
    if !condition.failure_logged.swap(true, Ordering::Relaxed) {
        tracing::debug!(
            rule = %rule.path,
            %failure,
            "a policy condition failed to evaluate (logged once per rule); {}",
            match rule.effect {
                _ if condition.reads_args => "a call it decides is refused",
                Effect::Deny => "it counts as true (deny)",
                Effect::Allow => "it counts as false (no allow)",
                Effect::RequireApproval => "it counts as true (approval required)",
            }
        );
    }
    Holds::Failed
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::catalog::Annotations;

    fn tool(name: &str, annotations: Annotations) -> CatalogTool {
        let (server, _) = name.split_once("__").unwrap_or(("s", name));
        CatalogTool {
            name: name.to_owned(),
            server: server.to_owned(),
            server_index: 0,
            upstream_name: name.to_owned(),
            description: String::new(),
            title: String::new(),
            input_schema_json: "{}".to_owned(),
            output_schema_json: String::new(),
            annotations,
            definition_hash: String::new(),
        }
    }

    fn plain(name: &str) -> CatalogTool {
        tool(name, Annotations::default())
    }

    fn rule(effect: Effect, globs: &[&str], when: Option<&str>) -> RuleSpec {
        RuleSpec {
            effect,
            targets: Targets::Names,
            globs: globs.iter().map(|g| (*g).to_owned()).collect(),
            when: when.map(str::to_owned),
            approval: None,
        }
    }

    fn jwt(claims: serde_json::Value) -> Caller {
        Caller {
            identity: crate::callers::CallerIdentity::Jwt {
                issuer: "https://issuer.example".to_owned(),
                subject: "worker".to_owned(),
            },
            claims: Arc::new(claims),
        }
    }

    fn compile(specs: &[RuleSpec]) -> Policy {
        Policy::compile("tenants[0].policy", specs).unwrap()
    }

    #[test]
    fn first_match_wins_and_default_allows() {
        let policy = compile(&[
            rule(Effect::Allow, &["db__read_*"], None),
            rule(Effect::Deny, &["db__*"], None),
        ]);
        let caller = Caller::static_token(0);
        let subject = Subject::tenant();
        assert!(policy.allows(&caller, &subject, &plain("db__read_rows")));
        assert!(!policy.allows(&caller, &subject, &plain("db__drop_table")));
        assert!(policy.allows(&caller, &subject, &plain("web__fetch")));

        // The same rules the other way round: the deny comes first.
        let reversed = compile(&[
            rule(Effect::Deny, &["db__*"], None),
            rule(Effect::Allow, &["db__read_*"], None),
        ]);
        assert!(!reversed.allows(&caller, &subject, &plain("db__read_rows")));
    }

    #[test]
    fn conditions_read_claims_with_explicit_json() {
        let policy = compile(&[
            rule(
                Effect::Allow,
                &["admin__*"],
                Some("'admins' in claims.groups"),
            ),
            rule(Effect::Deny, &["admin__*"], None),
            rule(
                Effect::Deny,
                &["*"],
                Some("claims.tier == 'free' && tool.annotations.open_world"),
            ),
        ]);
        let subject = Subject::tenant();
        let admin = jwt(serde_json::json!({"groups": ["admins", "dev"], "tier": "paid"}));
        let dev = jwt(serde_json::json!({"groups": ["dev"], "tier": "free"}));
        let closed = tool(
            "admin__reset",
            Annotations {
                open_world: Some(false),
                ..Annotations::default()
            },
        );
        assert!(policy.allows(&admin, &subject, &closed));
        assert!(!policy.allows(&dev, &subject, &closed));
        // Unset open_world takes the MCP default (true).
        assert!(policy.allows(&admin, &subject, &plain("web__fetch")));
        assert!(!policy.allows(&dev, &subject, &plain("web__fetch")));
        let local = tool(
            "web__fetch",
            Annotations {
                open_world: Some(false),
                ..Annotations::default()
            },
        );
        assert!(policy.allows(&dev, &subject, &local));
    }

    #[test]
    fn conditions_read_the_subject_and_annotations() {
        let policy = compile(&[
            rule(
                Effect::Deny,
                &["*"],
                Some("!tool.annotations.read_only && !subject.startsWith('ops-')"),
            ),
            rule(Effect::Deny, &["*__secret"], Some("subject == ''")),
        ]);
        let caller = Caller::static_token(0);
        let read_only = tool(
            "db__rows",
            Annotations {
                read_only: Some(true),
                ..Annotations::default()
            },
        );
        let alice = Subject::named(crate::callers::Namespace::Token, "alice").unwrap();
        let ops = Subject::named(crate::callers::Namespace::Token, "ops-bob").unwrap();
        assert!(policy.allows(&caller, &alice, &read_only));
        assert!(!policy.allows(&caller, &alice, &plain("db__write")));
        assert!(policy.allows(&caller, &ops, &plain("db__write")));
        let secret = tool(
            "db__secret",
            Annotations {
                read_only: Some(true),
                ..Annotations::default()
            },
        );
        assert!(!policy.allows(&caller, &Subject::tenant(), &secret));
        assert!(policy.allows(&caller, &alice, &secret));
    }

    #[test]
    fn a_header_does_not_escape_a_rule_on_who_vouched_for_the_subject() {
        use crate::callers::Namespace;
        // The documented form of "the tenant itself may not open issues":
        // a static token names any subject it likes, so only a subject a
        // JWT names counts as someone else.
        let policy = compile(&[rule(
            Effect::Deny,
            &["github__create_issue"],
            Some("caller.kind == 'token' || subject == ''"),
        )]);
        let token = Caller::static_token(0);
        let issue = plain("github__create_issue");
        let header = Subject::named(token.namespace(), "alice").unwrap();
        assert!(!policy.allows(&token, &Subject::tenant(), &issue));
        assert!(
            !policy.allows(&token, &header, &issue),
            "a header escaped the rule"
        );
        let worker = jwt(serde_json::json!({"sub": "worker"}));
        let proven = Subject::named(worker.namespace(), "alice").unwrap();
        assert!(policy.allows(&worker, &proven, &issue));
        assert!(!policy.allows(&worker, &Subject::tenant(), &issue));

        // `subject_key` names one principal: the same id named by a static
        // token is another.
        let pinned = compile(&[
            rule(
                Effect::Allow,
                &["admin__*"],
                Some("subject_key == 'jwt:https://issuer.example worker'"),
            ),
            rule(Effect::Deny, &["admin__*"], None),
        ]);
        let by_jwt = Subject::named(Namespace::Jwt("https://issuer.example"), "worker").unwrap();
        let by_token = Subject::named(Namespace::Token, "worker").unwrap();
        assert!(pinned.allows(&worker, &by_jwt, &plain("admin__reset")));
        assert!(!pinned.allows(&token, &by_token, &plain("admin__reset")));
        // `subject` stays the id as named, whoever vouched for it.
        let by_id = compile(&[rule(Effect::Deny, &["*"], Some("subject == 'worker'"))]);
        assert!(!by_id.allows(&token, &by_token, &issue));
        assert!(!by_id.allows(&worker, &by_jwt, &issue));
        assert_eq!(by_id.reads(), (false, true, false));
        assert_eq!(policy.reads(), (false, true, true));
        assert_eq!(
            compile(&[rule(Effect::Deny, &["*"], Some("caller.issuer == ''"))]).reads(),
            (false, false, true)
        );
    }

    #[test]
    fn a_failing_condition_never_grants() {
        // `claims.groups` is missing for this caller: the deny holds and
        // the allow does not.
        let deny = compile(&[rule(
            Effect::Deny,
            &["admin__*"],
            Some("!('admins' in claims.groups)"),
        )]);
        let allow = compile(&[
            rule(Effect::Allow, &["admin__*"], Some("claims.level > 3")),
            rule(Effect::Deny, &["admin__*"], None),
        ]);
        let not_bool = compile(&[rule(Effect::Deny, &["*"], Some("claims.level"))]);
        let caller = jwt(serde_json::json!({"sub": "x"}));
        let subject = Subject::tenant();
        assert!(!deny.allows(&caller, &subject, &plain("admin__reset")));
        assert!(!allow.allows(&caller, &subject, &plain("admin__reset")));
        let leveled = jwt(serde_json::json!({"level": 5}));
        assert!(allow.allows(&leveled, &subject, &plain("admin__reset")));
        assert!(!not_bool.allows(&leveled, &subject, &plain("x__y")));
        // Static tokens have empty claims: the same.
        let token = Caller::static_token(0);
        assert!(!deny.allows(&token, &subject, &plain("admin__reset")));
        // `has()` guards an optional claim.
        let guarded = compile(&[rule(
            Effect::Deny,
            &["admin__*"],
            Some("has(claims.groups) && 'banned' in claims.groups"),
        )]);
        assert!(guarded.allows(&token, &subject, &plain("admin__reset")));
    }

    /// Collects what a subscriber writes (the policy's log tests).
    #[derive(Clone, Default)]
    pub(crate) struct Capture(pub(crate) Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_condition_is_logged_at_debug_once_per_rule() {
        let policy = compile(&[
            rule(Effect::Deny, &["a__*"], Some("claims.level > 3")),
            rule(Effect::Deny, &["b__*"], Some("claims.tier == 'x'")),
        ]);
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let caller = Caller::static_token(0);
            for _ in 0..3 {
                assert!(!policy.allows(&caller, &Subject::tenant(), &plain("a__x")));
                assert!(!policy.allows(&caller, &Subject::tenant(), &plain("b__x")));
            }
        });
        let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("failed to evaluate").count(), 2, "{text}");
        assert!(text.contains("DEBUG"), "{text}");
        assert!(text.contains("tenants[0].policy[0]") && text.contains("tenants[0].policy[1]"));
    }

    #[test]
    fn bad_rules_name_their_path() {
        let errors = Policy::compile(
            "tenants[0].policy",
            &[
                rule(Effect::Allow, &["ok__*"], None),
                rule(Effect::Deny, &["[unclosed"], None),
                rule(Effect::Deny, &["*"], Some("claims.groups.exists(g, g ==")),
                rule(Effect::Deny, &["*"], Some("claim.role == 'x'")),
                rule(Effect::Allow, &[], None),
                rule(Effect::Deny, &["*"], Some("  ")),
            ],
        )
        .unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "tenants[0].policy[1].deny[0]",
                "tenants[0].policy[2].when",
                "tenants[0].policy[3].when",
                "tenants[0].policy[4].allow",
                "tenants[0].policy[5].when",
            ]
        );
        assert!(errors[2].message.contains("`claim`"), "{}", errors[2]);
    }

    #[test]
    fn comprehension_variables_and_type_names_are_not_unknown() {
        let policy = compile(&[rule(
            Effect::Allow,
            &["*"],
            Some(
                "claims.groups.exists(g, g.startsWith('team-')) && \
                 claims.groups.all(g, type(g) == string) && \
                 claims.roles.map(r, r + '!').size() >= 0",
            ),
        )]);
        let caller = jwt(serde_json::json!({"groups": ["team-a"], "roles": []}));
        assert!(policy.allows(&caller, &Subject::tenant(), &plain("a__b")));
        assert_eq!(policy.reads(), (true, false, false));
    }
}
