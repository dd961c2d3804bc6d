//! The policy's decision on one call, its arguments bound as `args`: what
//! the call pipeline asks after the listing's decision ([`Policy::allows`])
//! when a rule decided at call time matches the tool or prompt (a `when`
//! reading `args`, or `require_approval`), and the options of the
//! `require_approval` rules that hold calls for a person's approval.
//!
//! Argument values never appear in a verdict, an error, a log line or a
//! `Debug` output: a failing condition is named by its rule.

use std::sync::Arc;
use std::time::Duration;

use cel::common::types::CelString;

use super::values::{caller_val, json_val};
use super::{Decision, Effect, Policy, Target};
use crate::callers::{Caller, CallerIdentity, Subject};
use crate::catalog::{CatalogPrompt, CatalogTool};
use crate::config::policy::CheckedApproval;

/// The policy's verdict on one call.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// The call may go on.
    Allow,
    /// Refused by the rule at `rule` (`tenants[0].policy[3]`); `failed`:
    /// its condition failed to evaluate on this call.
    Deny {
        /// The path of the rule that refused.
        rule: String,
        /// Whether its condition failed to evaluate (rather than held).
        failed: bool,
    },
    /// A person must approve this exact call first.
    RequireApproval(Arc<ApprovalRule>),
}

/// A `require_approval` rule: where it is, what it is (its digest), and
/// the options of the approvals it asks for.
pub struct ApprovalRule {
    /// `tenants[0].policy[2]`.
    pub path: String,
    /// Lowercase hex SHA-256 over the rule as configured (path, effect,
    /// globs, `when` source, approval options): it changes when the rule
    /// changes, so an approval given under one rule is not spent under
    /// another.
    pub digest: String,
    /// How long a request waits for a decision.
    pub wait: Duration,
    /// How long an approval holds once given.
    pub valid_for: Duration,
    /// How many calls one approval allows.
    pub uses: u32,
    /// Whether the subject that asked for the call may approve it itself.
    pub self_approval: bool,
    /// `approval.approvers`, compiled (`None`: approver tokens only).
    approvers: Option<Approvers>,
}

/// A compiled `approvers` expression, and what it reads.
struct Approvers {
    program: Arc<cel::Program>,
    source: String,
    env: Arc<cel::Env>,
}

impl std::fmt::Debug for ApprovalRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalRule")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .field("wait", &self.wait)
            .field("valid_for", &self.valid_for)
            .field("uses", &self.uses)
            .field("self_approval", &self.self_approval)
            .field("approvers", &self.approvers.as_ref().map(|a| &a.source))
            .finish()
    }
}

impl ApprovalRule {
    /// The rule at `path` with its checked options.
    pub(super) fn new(path: &str, checked: &CheckedApproval, env: &Arc<cel::Env>) -> Self {
        Self {
            path: path.to_owned(),
            digest: checked.digest.clone(),
            wait: checked.wait,
            valid_for: checked.valid_for,
            uses: checked.uses,
            self_approval: checked.self_approval,
            approvers: checked
                .approvers
                .as_ref()
                .map(|(program, source)| Approvers {
                    program: program.clone(),
                    source: source.clone(),
                    env: env.clone(),
                }),
        }
    }

    /// Whether `caller` acting for `subject` may decide approvals of this
    /// rule (its `approvers`; unset: an approver token). An evaluation
    /// failure or non-bool is false.
    pub fn admits(&self, caller: &Caller, subject: &Subject) -> bool {
        let Some(approvers) = &self.approvers else {
            return matches!(caller.identity, CallerIdentity::ApproverToken { .. });
        };
        let mut context = cel::Context::with_env(approvers.env.clone());
        context.add_variable_as_val("claims", json_val(caller.claims.as_ref()));
        let id = subject.id().unwrap_or("");
        context.add_variable_as_val("subject", Box::new(CelString::from(id)));
        context.add_variable_as_val("subject_key", Box::new(CelString::from(subject.key())));
        context.add_variable_as_val("caller", caller_val(caller));
        matches!(
            approvers.program.execute(&context),
            Ok(cel::Value::Bool(true))
        )
    }
}

impl Policy {
    /// Whether a call to the tool named `name` needs
    /// [`Policy::decide_call`] (some rule whose globs match it is decided
    /// at call time). False: [`Policy::allows`] said it all.
    pub fn decides_at_call(&self, name: &str) -> bool {
        !self.call_time_tools.is_empty() && self.call_time_tools.is_match(name)
    }

    /// The verdict on calling `tool` with `arguments`, bound as `args`:
    /// the first matching rule whose `when` holds decides (allow, deny,
    /// require_approval); none: [`Verdict::Allow`]. A condition reading
    /// `args` that fails to evaluate (a missing field, a type mismatch, a
    /// result that is not a boolean) refuses the call, naming its rule,
    /// whatever its effect; any other failing condition counts as it does
    /// for a listing (a `deny` and a `require_approval` apply, an `allow`
    /// does not).
    pub fn decide_call(
        &self,
        caller: &Caller,
        subject: &Subject,
        tool: &CatalogTool,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Verdict {
        let mut evaluator = self.evaluator(caller, subject).for_call(arguments);
        evaluator.match_name(&tool.name);
        self.verdict(evaluator.decide(Target::Tool(tool)))
    }

    /// Whether a GetPrompt of the prompt named `name` needs
    /// [`Policy::decide_prompt`] (some rule whose globs match it reads
    /// `args`).
    pub fn decides_prompt_at_call(&self, name: &str) -> bool {
        !self.call_time_prompts.is_empty() && self.call_time_prompts.is_match(name)
    }

    /// The verdict on getting `prompt` with `arguments` (its arguments, a
    /// JSON object of strings), as [`Policy::decide_call`] for a tool;
    /// never [`Verdict::RequireApproval`] (those rules skip prompts).
    pub fn decide_prompt(
        &self,
        caller: &Caller,
        subject: &Subject,
        prompt: &CatalogPrompt,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Verdict {
        let mut evaluator = self.evaluator(caller, subject).for_call(arguments);
        evaluator.match_name(&prompt.name);
        self.verdict(evaluator.decide(Target::Prompt(prompt)))
    }

    /// The `require_approval` rule at `path`, if the policy has one (what
    /// deciding an approval re-checks: a rule removed or changed since has
    /// another digest, or none).
    pub fn approval_rule(&self, path: &str) -> Option<Arc<ApprovalRule>> {
        self.rules
            .iter()
            .find(|rule| rule.path == path)
            .and_then(|rule| rule.approval.clone())
    }

    /// Every rule decided at call time, in order: its path and why
    /// (`reads args`, `require_approval`), for `toolgate check`.
    pub fn call_time_rules(&self) -> Vec<(String, &'static str)> {
        self.rules
            .iter()
            .filter_map(|rule| Some((rule.path.clone(), rule.call_time()?)))
            .collect()
    }

    /// The verdict of an evaluator's decision.
    fn verdict(&self, decision: Decision) -> Verdict {
        match decision {
            Decision::Allow => Verdict::Allow,
            Decision::Deny { rule, failed } => Verdict::Deny {
                rule: self.rules[rule].path.clone(),
                failed,
            },
            Decision::Approval(index) => {
                let rule = &self.rules[index];
                match (&rule.approval, rule.effect) {
                    (Some(approval), Effect::RequireApproval) => {
                        Verdict::RequireApproval(approval.clone())
                    }
                    // Not reached: every require_approval rule has its
                    // options. Refused rather than let through.
                    _ => Verdict::Deny {
                        rule: rule.path.clone(),
                        failed: false,
                    },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callers::Namespace;
    use crate::catalog::Annotations;
    use crate::policy::{ApprovalSpec, RuleSpec, Targets};

    fn tool(name: &str) -> CatalogTool {
        let (server, upstream) = name.split_once("__").unwrap();
        CatalogTool {
            name: name.to_owned(),
            server: server.to_owned(),
            server_index: 0,
            upstream_name: upstream.to_owned(),
            description: String::new(),
            title: String::new(),
            input_schema_json: "{}".to_owned(),
            output_schema_json: String::new(),
            annotations: Annotations::default(),
            definition_hash: String::new(),
        }
    }

    fn prompt(name: &str) -> CatalogPrompt {
        let (server, upstream) = name.split_once("__").unwrap();
        CatalogPrompt {
            name: name.to_owned(),
            server: server.to_owned(),
            server_index: 0,
            upstream_name: upstream.to_owned(),
            title: String::new(),
            description: String::new(),
            arguments: Vec::new(),
            definition_hash: String::new(),
        }
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

    fn approval(globs: &[&str], when: Option<&str>, options: ApprovalSpec) -> RuleSpec {
        RuleSpec {
            approval: Some(options),
            ..rule(Effect::RequireApproval, globs, when)
        }
    }

    fn compile(specs: &[RuleSpec]) -> Policy {
        Policy::compile("tenants[0].policy", specs).unwrap()
    }

    fn args(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        match value {
            serde_json::Value::Object(map) => map,
            _ => panic!("not an object"),
        }
    }

    fn jwt(claims: serde_json::Value) -> Caller {
        Caller {
            identity: CallerIdentity::Jwt {
                issuer: "https://issuer.example".to_owned(),
                subject: "worker".to_owned(),
            },
            claims: Arc::new(claims),
        }
    }

    /// What a verdict says, as a short string (`allow`, `deny [0]`,
    /// `failed [1]`, `approval [2]`).
    fn said(verdict: &Verdict) -> String {
        let index = |path: &str| path.trim_start_matches("tenants[0].policy").to_owned();
        match verdict {
            Verdict::Allow => "allow".to_owned(),
            Verdict::Deny {
                rule,
                failed: false,
            } => format!("deny {}", index(rule)),
            Verdict::Deny { rule, failed: true } => format!("failed {}", index(rule)),
            Verdict::RequireApproval(rule) => format!("approval {}", index(&rule.path)),
        }
    }

    /// The rules of the governance examples.
    fn example() -> Policy {
        compile(&[
            rule(
                Effect::Deny,
                &["db__query"],
                Some("args.sql.contains('payroll.')"),
            ),
            rule(Effect::Allow, &["admin__*"], Some("args.force == true")),
            rule(Effect::Deny, &["admin__*"], None),
            approval(
                &["pay__refund", "pay__send_*"],
                Some("args.amount > 500"),
                ApprovalSpec::default(),
            ),
            rule(Effect::Deny, &["pay__*"], None),
        ])
    }

    #[test]
    fn call_time_rules_never_hide_a_tool_and_decide_the_call() {
        let policy = example();
        let caller = Caller::static_token(0);
        let subject = Subject::tenant();
        let call = |name: &str, arguments: serde_json::Value| {
            said(&policy.decide_call(&caller, &subject, &tool(name), &args(arguments)))
        };
        // Listings: a call-time deny is passed over, a call-time allow or
        // require_approval shows the tool.
        for visible in ["db__query", "admin__reset", "pay__refund", "pay__send_eur"] {
            assert!(
                policy.allows(&caller, &subject, &tool(visible)),
                "{visible}"
            );
        }
        assert!(!policy.allows(&caller, &subject, &tool("pay__close")));
        // Calls.
        let payroll = serde_json::json!({"sql": "select * from payroll.salaries"});
        assert_eq!(call("db__query", payroll), "deny [0]");
        assert_eq!(
            call("db__query", serde_json::json!({"sql": "select 1"})),
            "allow"
        );
        assert_eq!(
            call("admin__reset", serde_json::json!({"force": true})),
            "allow"
        );
        assert_eq!(
            call("admin__reset", serde_json::json!({"force": false})),
            "deny [2]"
        );
        assert_eq!(
            call("pay__refund", serde_json::json!({"amount": 600})),
            "approval [3]"
        );
        assert_eq!(
            call("pay__send_eur", serde_json::json!({"amount": 501})),
            "approval [3]"
        );
        assert_eq!(
            call("pay__refund", serde_json::json!({"amount": 100})),
            "deny [4]"
        );
        assert_eq!(call("web__fetch", serde_json::json!({})), "allow");
        // What needs a call-time decision.
        for name in ["db__query", "admin__reset", "pay__refund", "pay__send_x"] {
            assert!(policy.decides_at_call(name), "{name}");
        }
        for name in ["db__rows", "pay__close", "web__fetch"] {
            assert!(!policy.decides_at_call(name), "{name}");
        }
        assert!(!compile(&[rule(Effect::Deny, &["*"], None)]).decides_at_call("a__b"));
        assert_eq!(
            policy.call_time_rules(),
            [
                ("tenants[0].policy[0]".to_owned(), "reads args"),
                ("tenants[0].policy[1]".to_owned(), "reads args"),
                ("tenants[0].policy[3]".to_owned(), "require_approval"),
            ]
        );
    }

    #[test]
    fn a_failing_condition_on_the_arguments_refuses_naming_its_rule() {
        let policy = example();
        let caller = Caller::static_token(0);
        let subject = Subject::tenant();
        let call = |name: &str, arguments: serde_json::Value| {
            said(&policy.decide_call(&caller, &subject, &tool(name), &args(arguments)))
        };
        // Whatever the effect: deny, allow, require_approval.
        assert_eq!(call("db__query", serde_json::json!({})), "failed [0]");
        assert_eq!(
            call("db__query", serde_json::json!({"sql": 7})),
            "failed [0]"
        );
        assert_eq!(call("admin__reset", serde_json::json!({})), "failed [1]");
        assert_eq!(
            call("pay__refund", serde_json::json!({"amount": "600"})),
            "failed [3]"
        );
        // A result that is not a boolean.
        let not_bool = compile(&[rule(Effect::Allow, &["*"], Some("args.n"))]);
        let verdict = not_bool.decide_call(
            &caller,
            &subject,
            &tool("a__b"),
            &args(serde_json::json!({"n": 1})),
        );
        assert_eq!(said(&verdict), "failed [0]");
    }

    #[test]
    fn other_conditions_keep_the_listing_semantics_at_call_time() {
        // `claims.level` is missing for a static token: the deny applies,
        // the allow does not, the require_approval applies (the listing
        // shows its tool: an approval will be needed).
        let policy = compile(&[
            rule(Effect::Allow, &["a__*"], Some("claims.level > 3")),
            rule(Effect::Deny, &["a__*"], Some("claims.level > 3")),
            approval(&["b__*"], Some("claims.level > 3"), ApprovalSpec::default()),
            approval(
                &["c__*"],
                Some("subject == 'alice'"),
                ApprovalSpec::default(),
            ),
            rule(Effect::Deny, &["c__*"], None),
        ]);
        let caller = Caller::static_token(0);
        let subject = Subject::tenant();
        let no_args = args(serde_json::json!({}));
        let call = |name: &str, subject: &Subject| {
            said(&policy.decide_call(&caller, subject, &tool(name), &no_args))
        };
        assert!(!policy.allows(&caller, &subject, &tool("a__x")));
        assert_eq!(call("a__x", &subject), "failed [1]");
        assert!(policy.allows(&caller, &subject, &tool("b__x")));
        assert_eq!(call("b__x", &subject), "approval [2]");
        // A require_approval whose condition is false does not apply.
        let alice = Subject::named(Namespace::Token, "alice").unwrap();
        assert!(!policy.allows(&caller, &subject, &tool("c__x")));
        assert_eq!(call("c__x", &subject), "deny [4]");
        assert!(policy.allows(&caller, &alice, &tool("c__x")));
        assert_eq!(call("c__x", &alice), "approval [3]");
        assert!(!policy.decides_at_call("a__x"));
        assert!(policy.decides_at_call("b__x"));
    }

    #[test]
    fn the_order_of_argument_keys_does_not_matter_and_nothing_is_remembered_across_calls() {
        let policy = compile(&[
            approval(
                &["pay__*"],
                Some("args.amount > 500 && args.currency == 'EUR'"),
                ApprovalSpec::default(),
            ),
            rule(Effect::Deny, &["*"], Some("args.dry_run == true")),
        ]);
        let caller = Caller::static_token(0);
        let subject = Subject::tenant();
        let one: serde_json::Map<_, _> = [
            ("amount".to_owned(), serde_json::json!(600)),
            ("currency".to_owned(), serde_json::json!("EUR")),
            ("dry_run".to_owned(), serde_json::json!(false)),
        ]
        .into_iter()
        .collect();
        // Inserted the other way round (a map that keeps insertion order,
        // with serde_json's `preserve_order`, would iterate so).
        let other: serde_json::Map<_, _> = one.clone().into_iter().rev().collect();
        let refund = tool("pay__refund");
        for arguments in [&one, &other] {
            assert_eq!(
                said(&policy.decide_call(&caller, &subject, &refund, arguments)),
                "approval [0]"
            );
        }
        // Alternating calls: each sees its own arguments.
        let small = args(serde_json::json!({"amount": 5, "currency": "EUR", "dry_run": true}));
        for _ in 0..2 {
            assert_eq!(
                said(&policy.decide_call(&caller, &subject, &refund, &small)),
                "deny [1]"
            );
            assert_eq!(
                said(&policy.decide_call(&caller, &subject, &refund, &one)),
                "approval [0]"
            );
        }
        // One evaluator deciding two tools with arguments bound remembers
        // no value of a condition reading them, and a listing after the
        // calls is what it was.
        let fetch = tool("web__fetch");
        let mut evaluator = policy.evaluator(&caller, &subject).for_call(&small);
        evaluator.match_name(&fetch.name);
        assert_eq!(
            evaluator.decide(Target::Tool(&fetch)),
            Decision::Deny {
                rule: 1,
                failed: false
            }
        );
        assert!(evaluator.memo.iter().all(Option::is_none));
        assert!(evaluator.tool_memo.is_empty());
        drop(evaluator);
        assert!(policy.allows(&caller, &subject, &fetch));
        assert!(policy.allows(&caller, &subject, &refund));
    }

    #[test]
    fn prompts_skip_require_approval_and_see_their_arguments() {
        let policy = compile(&[
            approval(&["*"], None, ApprovalSpec::default()),
            rule(Effect::Deny, &["b__*"], Some("args.topic == 'salaries'")),
            rule(Effect::Deny, &["c__*"], None),
        ]);
        let caller = Caller::static_token(0);
        let subject = Subject::tenant();
        let get = |name: &str, topic: &str| {
            said(&policy.decide_prompt(
                &caller,
                &subject,
                &prompt(name),
                &args(serde_json::json!({"topic": topic})),
            ))
        };
        assert!(policy.allows_prompt(&caller, &subject, &prompt("a__review")));
        assert!(policy.allows_prompt(&caller, &subject, &prompt("b__review")));
        assert!(!policy.allows_prompt(&caller, &subject, &prompt("c__review")));
        assert_eq!(get("a__review", "x"), "allow");
        assert_eq!(get("b__review", "salaries"), "deny [1]");
        assert_eq!(get("b__review", "holidays"), "allow");
        assert_eq!(get("c__review", "x"), "deny [2]");
        assert!(!policy.decides_prompt_at_call("a__review"));
        assert!(policy.decides_prompt_at_call("b__review"));
        // The tool of the same name is held for approval.
        assert!(policy.decides_at_call("c__review"));
        assert_eq!(
            said(&policy.decide_call(
                &caller,
                &subject,
                &tool("c__review"),
                &args(serde_json::json!({}))
            )),
            "approval [0]"
        );
        // An unlisted server's prompts are not refused by a
        // require_approval rule, nor by a call-time deny.
        assert!(policy.may_allow_unlisted_prompts(&caller, &subject, "b__*"));
        assert!(policy.may_allow_unlisted(
            &caller,
            &subject,
            "b",
            0,
            crate::policy::Unlisted::Namespace("b__*")
        ));
    }

    #[test]
    fn the_digest_changes_with_every_part_of_the_rule_and_only_then() {
        let base = || {
            approval(
                &["pay__*"],
                Some("args.amount > 500"),
                ApprovalSpec {
                    approvers: Some("'finance' in claims.groups".to_owned()),
                    ..ApprovalSpec::default()
                },
            )
        };
        let digest = |specs: &[RuleSpec], path: &str| {
            compile(specs).approval_rule(path).unwrap().digest.clone()
        };
        let at0 = "tenants[0].policy[0]";
        let original = digest(&[base()], at0);
        assert_eq!(original.len(), 64);
        assert!(
            original
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(digest(&[base()], at0), original, "stable");
        // Defaults written out change nothing.
        let mut written = base();
        written.approval.as_mut().unwrap().wait = Some("1h".to_owned());
        written.approval.as_mut().unwrap().uses = Some(1);
        assert_eq!(digest(&[written], at0), original);
        type Change = Box<dyn Fn(&mut RuleSpec)>;
        let changes: Vec<Change> = vec![
            Box::new(|r| r.globs.push("refund__*".to_owned())),
            Box::new(|r| r.globs[0] = "pay__send".to_owned()),
            Box::new(|r| r.when = Some("args.amount > 400".to_owned())),
            Box::new(|r| r.when = None),
            Box::new(|r| r.approval.as_mut().unwrap().approvers = None),
            Box::new(|r| r.approval.as_mut().unwrap().wait = Some("2h".to_owned())),
            Box::new(|r| r.approval.as_mut().unwrap().valid_for = Some("1m".to_owned())),
            Box::new(|r| r.approval.as_mut().unwrap().uses = Some(2)),
            Box::new(|r| r.approval.as_mut().unwrap().self_approval = Some(true)),
        ];
        let mut seen = std::collections::HashSet::from([original.clone()]);
        for change in changes {
            let mut changed = base();
            change(&mut changed);
            assert!(
                seen.insert(digest(&[changed], at0)),
                "a change kept the digest"
            );
        }
        // The same rule at another path is another rule.
        let moved = digest(
            &[rule(Effect::Deny, &["x__*"], None), base()],
            "tenants[0].policy[1]",
        );
        assert!(seen.insert(moved));
    }

    #[test]
    fn approvers_admit_approver_tokens_by_default_or_whom_the_expression_says() {
        let policy = compile(&[
            approval(&["a__*"], None, ApprovalSpec::default()),
            approval(
                &["b__*"],
                None,
                ApprovalSpec {
                    approvers: Some("'finance' in claims.groups".to_owned()),
                    wait: Some("2h".to_owned()),
                    valid_for: Some("30s".to_owned()),
                    uses: Some(5),
                    self_approval: Some(true),
                },
            ),
            approval(
                &["c__*"],
                None,
                ApprovalSpec {
                    approvers: Some(
                        "caller.kind == 'approver_token' || subject_key == 'token:boss'".to_owned(),
                    ),
                    ..ApprovalSpec::default()
                },
            ),
            rule(Effect::Allow, &["d__*"], None),
        ]);
        let subject = Subject::tenant();
        let token = Caller::static_token(0);
        let approver = Caller::approver_token("finance-desk");
        let finance = jwt(serde_json::json!({"groups": ["finance"]}));
        let dev = jwt(serde_json::json!({"groups": ["dev"]}));
        let plain = policy.approval_rule("tenants[0].policy[0]").unwrap();
        assert!(plain.admits(&approver, &subject));
        assert!(!plain.admits(&token, &subject));
        assert!(!plain.admits(&finance, &subject));
        assert_eq!(plain.wait, Duration::from_secs(3600));
        assert_eq!(plain.valid_for, Duration::from_secs(900));
        assert_eq!((plain.uses, plain.self_approval), (1, false));
        let by_group = policy.approval_rule("tenants[0].policy[1]").unwrap();
        assert!(by_group.admits(&finance, &subject));
        assert!(!by_group.admits(&dev, &subject));
        // Empty claims: the expression fails, which is a refusal.
        assert!(!by_group.admits(&approver, &subject));
        assert_eq!(by_group.wait, Duration::from_secs(7200));
        assert_eq!(by_group.valid_for, Duration::from_secs(30));
        assert_eq!((by_group.uses, by_group.self_approval), (5, true));
        let by_kind = policy.approval_rule("tenants[0].policy[2]").unwrap();
        assert!(by_kind.admits(&approver, &subject));
        let boss = Subject::named(Namespace::Token, "boss").unwrap();
        assert!(by_kind.admits(&token, &boss));
        assert!(!by_kind.admits(&token, &subject));
        assert!(policy.approval_rule("tenants[0].policy[3]").is_none());
        assert!(policy.approval_rule("tenants[0].policy[9]").is_none());
        // Debug shows the options, not the compiled program.
        let shown = format!("{by_group:?}");
        assert!(shown.contains("'finance' in claims.groups") && shown.contains("digest"));
        assert!(!shown.contains("Program"), "{shown}");
    }

    use crate::policy::tests::Capture;

    #[test]
    fn a_failure_on_the_arguments_is_logged_without_them() {
        let policy = compile(&[approval(
            &["pay__*"],
            Some("args.amount > 500"),
            ApprovalSpec::default(),
        )]);
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let verdict = tracing::subscriber::with_default(subscriber, || {
            policy.decide_call(
                &Caller::static_token(0),
                &Subject::tenant(),
                &tool("pay__refund"),
                &args(serde_json::json!({"amount": "SECRET-VALUE"})),
            )
        });
        assert_eq!(said(&verdict), "failed [0]");
        assert!(!format!("{verdict:?}").contains("SECRET"));
        let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("tenants[0].policy[0]"), "{text}");
        assert!(text.contains("failed to evaluate"), "{text}");
        assert!(!text.contains("SECRET"), "{text}");
    }
}
