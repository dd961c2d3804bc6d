//! The policy's decision for tools whose definitions are not known: those
//! of a per-user server that nobody has authorized yet, so it was never
//! listed. Asked before a caller is handed an authorization URL (which
//! starts a pending consent flow): a link is offered unless the policy
//! certainly denies the caller every such tool.

use globset::Candidate;

use super::values::tool_val;
use super::{Effect, Policy, applies, evaluate};
use crate::callers::{Caller, Subject};
use crate::catalog::CatalogTool;

/// Which tools of a server that was never listed are asked about.
#[derive(Debug, Clone, Copy)]
pub enum Unlisted<'a> {
    /// The tool exposed as this name (a call names it).
    Name(&'a str),
    /// Any tool of the server: the tool named by this pattern of its
    /// namespace (`server__*`, or `*` for a bare server). Rules are matched
    /// against the pattern itself: a glob that matches it (`*`,
    /// `server__*`) covers the whole namespace; a narrower one
    /// (`server__read_*`) is not consulted.
    Namespace(&'a str),
}

impl Policy {
    /// Whether `caller`, acting for `subject`, may be allowed `tools` of
    /// server `server` (index `server_index` in the tenant's
    /// configuration), whose definitions are not known. Rules are taken in
    /// order, as for a listed tool, but a `when` whose value the unknown
    /// definition decides (it reads `tool.annotations`, `tool` as a whole,
    /// or, for a namespace, `tool.name`) may hold or not: such an `allow`
    /// rule allows (the tool may turn out to be one it allows), such a
    /// `deny` rule is passed over. So only a certain denial refuses. A rule
    /// decided at call time never refuses here: a `when` reading `args`
    /// may hold or not, and a `require_approval` rule that applies allows
    /// (the call will need an approval).
    pub fn may_allow_unlisted(
        &self,
        caller: &Caller,
        subject: &Subject,
        server: &str,
        server_index: usize,
        tools: Unlisted<'_>,
    ) -> bool {
        let (name, name_known) = match tools {
            Unlisted::Name(name) => (name, true),
            Unlisted::Namespace(pattern) => (pattern, false),
        };
        let mut matched = Vec::new();
        self.globs
            .matches_candidate_into(&Candidate::new(name), &mut matched);
        let mut rules: Vec<usize> = matched.iter().map(|&g| self.glob_rule[g]).collect();
        rules.sort_unstable();
        rules.dedup();
        let tool = stand_in(name, server, server_index);
        let evaluator = self.evaluator(caller, subject);
        let context = &evaluator.context;
        for index in rules {
            let rule = &self.rules[index];
            let applies = match &rule.when {
                None => Some(true),
                Some(condition) => {
                    let reads = condition.reads_tool;
                    if condition.reads_args || reads.definition() || (reads.name() && !name_known) {
                        None
                    } else if reads.any() {
                        let mut scope = context.new_inner_scope();
                        scope.add_variable_as_val("tool", tool_val(&tool));
                        Some(applies(rule, evaluate(rule, condition, &scope)))
                    } else {
                        Some(applies(rule, evaluate(rule, condition, context)))
                    }
                }
            };
            match (rule.effect, applies) {
                (Effect::Allow | Effect::RequireApproval, Some(true) | None) => return true,
                (Effect::Deny, Some(true)) => return false,
                _ => {}
            }
        }
        true
    }
}

impl Policy {
    /// Whether `caller`, acting for `subject`, may be allowed some prompt
    /// of a server that was never listed, its namespace being `pattern`
    /// (`server__*`, or `*` for a bare server): asked before a consent
    /// link is offered in a prompt listing. As for tools
    /// ([`Policy::may_allow_unlisted`]), only a certain denial refuses: a
    /// name rule whose glob matches the pattern itself applies, and a
    /// `when` reading `prompt` (which the unknown prompt decides) may hold
    /// or not, as does one reading `args`. A `when` reading `tool` fails
    /// for a prompt, as it does for a listed one; `require_approval` rules
    /// never match prompts.
    pub fn may_allow_unlisted_prompts(
        &self,
        caller: &Caller,
        subject: &Subject,
        pattern: &str,
    ) -> bool {
        let mut matched = Vec::new();
        self.globs
            .matches_candidate_into(&Candidate::new(pattern), &mut matched);
        let mut rules: Vec<usize> = matched.iter().map(|&g| self.glob_rule[g]).collect();
        rules.sort_unstable();
        rules.dedup();
        let evaluator = self.evaluator(caller, subject);
        for index in rules {
            let rule = &self.rules[index];
            if rule.effect == Effect::RequireApproval {
                continue;
            }
            let applies = match &rule.when {
                None => Some(true),
                Some(condition) if condition.reads_prompt || condition.reads_args => None,
                Some(condition) => {
                    Some(applies(rule, evaluate(rule, condition, &evaluator.context)))
                }
            };
            match (rule.effect, applies) {
                (Effect::Allow, Some(true) | None) => return true,
                (Effect::Deny, Some(true)) => return false,
                _ => {}
            }
        }
        true
    }
}

/// A tool named `name` of `server`, of which nothing else is known.
fn stand_in(name: &str, server: &str, server_index: usize) -> CatalogTool {
    CatalogTool {
        name: name.to_owned(),
        server: server.to_owned(),
        server_index,
        upstream_name: String::new(),
        description: String::new(),
        title: String::new(),
        input_schema_json: String::new(),
        output_schema_json: String::new(),
        annotations: crate::catalog::Annotations::default(),
        definition_hash: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::RuleSpec;
    use crate::policy::test_policy as policy;

    fn may(policy: &Policy, subject: &str, tools: Unlisted<'_>) -> bool {
        let caller = Caller {
            identity: crate::callers::CallerIdentity::Token { index: 0 },
            claims: std::sync::Arc::new(serde_json::json!({})),
        };
        let subject = Subject::named(crate::callers::Namespace::Token, subject).unwrap();
        policy.may_allow_unlisted(&caller, &subject, "docs", 0, tools)
    }

    #[test]
    fn only_a_certain_denial_refuses() {
        let namespace = Unlisted::Namespace("docs__*");
        let whoami = Unlisted::Name("docs__whoami");
        // Denied the whole namespace: by name and as a namespace.
        let denied = policy(&[(Effect::Deny, "docs__*", Some("subject == 'mallory'"))]);
        assert!(!may(&denied, "mallory", namespace));
        assert!(!may(&denied, "mallory", whoami));
        assert!(may(&denied, "alice", namespace));
        let everything = policy(&[(Effect::Deny, "*", Some("subject == 'mallory'"))]);
        assert!(!may(&everything, "mallory", namespace));
        // Denied one tool: the namespace may still hold one she may call.
        let one = policy(&[(Effect::Deny, "docs__drop", None)]);
        assert!(may(&one, "mallory", namespace));
        assert!(!may(&one, "mallory", Unlisted::Name("docs__drop")));
        // A condition the definition decides may hold or not.
        let read_only = policy(&[
            (Effect::Allow, "docs__*", Some("tool.annotations.read_only")),
            (Effect::Deny, "*", None),
        ]);
        assert!(may(&read_only, "mallory", namespace));
        let not_read_only =
            policy(&[(Effect::Deny, "docs__*", Some("!tool.annotations.read_only"))]);
        assert!(may(&not_read_only, "mallory", whoami));
        // The server is known; a name is known only for a call.
        let by_server = policy(&[(Effect::Deny, "*", Some("tool.server == 'docs'"))]);
        assert!(!may(&by_server, "mallory", namespace));
        let by_name = policy(&[(Effect::Deny, "*", Some("tool.name.startsWith('docs__who')"))]);
        assert!(!may(&by_name, "mallory", whoami));
        assert!(may(&by_name, "mallory", namespace));
    }

    #[test]
    fn prompts_of_an_unlisted_server_are_refused_only_when_certainly_denied() {
        let caller = Caller::static_token(0);
        let who = |name: &str| Subject::named(crate::callers::Namespace::Token, name).unwrap();
        let may = |policy: &Policy, subject: &str| {
            policy.may_allow_unlisted_prompts(&caller, &who(subject), "docs__*")
        };
        let denied = policy(&[(Effect::Deny, "docs__*", Some("subject == 'mallory'"))]);
        assert!(!may(&denied, "mallory"));
        assert!(may(&denied, "alice"));
        // One prompt denied: the namespace may hold another.
        assert!(may(
            &policy(&[(Effect::Deny, "docs__review", None)]),
            "mallory"
        ));
        // What the unknown prompt decides may hold or not.
        let by_prompt = policy(&[(Effect::Deny, "*", Some("prompt.name != ''"))]);
        assert!(may(&by_prompt, "mallory"));
        // `tool` is unbound for a prompt: a deny reading it applies, as for
        // a listed prompt; an allow reading it does not.
        let on_tools = policy(&[(Effect::Deny, "docs__*", Some("tool.annotations.read_only"))]);
        assert!(!may(&on_tools, "alice"));
        let allow_tools = policy(&[
            (Effect::Allow, "docs__*", Some("tool.server == 'docs'")),
            (Effect::Deny, "docs__*", None),
        ]);
        assert!(!may(&allow_tools, "alice"));
        // Resource rules are never consulted.
        let resources = Policy::compile(
            "tenants[0].policy",
            &[RuleSpec {
                effect: Effect::Deny,
                targets: crate::policy::Targets::Resources,
                globs: vec!["*:**".to_owned()],
                when: None,
                approval: None,
            }],
        )
        .unwrap();
        assert!(may(&resources, "mallory"));
    }
}
