//! The policy over prompts and resources: prompts under the tenant's name
//! rules (their globs match exposed prompt names as they match tool
//! names; CEL sees `prompt`, and `tool` is unbound), resources under their
//! own rules (`allow_resources` / `deny_resources`, globs over
//! `server:uri`; CEL sees `resource`, and `tool` and `prompt` are
//! unbound). A condition that reads a variable that is unbound for what is
//! decided fails, and a failure never grants: a `deny` applies, an
//! `allow` does not.
//!
//! One decision at a time here; many for one caller (a listing) go through
//! one [`Policy::evaluator`], which converts the caller's variables once
//! and remembers conditions that read nothing of the target. A caller's
//! view of the catalog ([`super::View`]) holds its prompts as it holds
//! its tools.

use super::{Policy, ResourceUri};
use crate::callers::{Caller, Subject};
use crate::catalog::CatalogPrompt;

impl Policy {
    /// Whether `caller`, acting for `subject`, may see and get `prompt`:
    /// the effect of the first name rule whose glob matches the prompt's
    /// exposed name and whose `when` holds; allowed when none does.
    pub fn allows_prompt(
        &self,
        caller: &Caller,
        subject: &Subject,
        prompt: &CatalogPrompt,
    ) -> bool {
        self.evaluator(caller, subject).allows_prompt(prompt)
    }

    /// Whether `caller`, acting for `subject`, may see and fetch `skill`:
    /// the effect of the first name rule whose glob matches the skill's
    /// exposed name and whose `when` holds (a condition reading a target's
    /// variable fails for a skill: a `deny` applies, an `allow` does not);
    /// allowed when none does.
    pub fn allows_skill(
        &self,
        caller: &Caller,
        subject: &Subject,
        skill: &crate::catalog::CatalogSkill,
    ) -> bool {
        self.evaluator(caller, subject).allows_skill(skill)
    }

    /// Whether `caller`, acting for `subject`, may see, read, watch and
    /// complete resource `uri` (or URI template) of `server`: the effect of
    /// the first resource rule whose glob matches `server:uri` and whose
    /// `when` holds; allowed when none does. Only a normalized URI is
    /// matched ([`ResourceUri`]): the form the server is sent.
    pub fn allows_resource(
        &self,
        caller: &Caller,
        subject: &Subject,
        server: &str,
        uri: &ResourceUri,
    ) -> bool {
        self.evaluator(caller, subject).allows_resource(server, uri)
    }

    /// Whether any rule is over resources (without one, every resource is
    /// allowed and a listing need not ask).
    pub fn has_resource_rules(&self) -> bool {
        !self.resource_rule.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Annotations, CatalogTool};
    use crate::policy::{Effect, RuleSpec, Targets};

    fn tool(name: &str) -> CatalogTool {
        let (server, _) = name.split_once("__").unwrap();
        CatalogTool {
            name: name.to_owned(),
            server: server.to_owned(),
            // Servers `a`, `b`, ... at indices 0, 1, ...
            server_index: usize::from(server.as_bytes()[0].saturating_sub(b'a')),
            upstream_name: name.to_owned(),
            description: String::new(),
            title: String::new(),
            input_schema_json: "{}".to_owned(),
            output_schema_json: String::new(),
            annotations: Annotations::default(),
            definition_hash: String::new(),
        }
    }

    pub(crate) fn prompt(name: &str) -> CatalogPrompt {
        let (server, upstream) = name.split_once("__").unwrap();
        CatalogPrompt {
            name: name.to_owned(),
            server: server.to_owned(),
            server_index: 0,
            upstream_name: upstream.to_owned(),
            title: String::new(),
            description: String::new(),
            arguments: Vec::new(),
            definition_hash: format!("hash-of-{name}"),
        }
    }

    fn uri(text: &str) -> ResourceUri {
        ResourceUri::parse(text).unwrap()
    }

    fn names(effect: Effect, globs: &[&str], when: Option<&str>) -> RuleSpec {
        spec(effect, Targets::Names, globs, when)
    }

    fn resources(effect: Effect, globs: &[&str], when: Option<&str>) -> RuleSpec {
        spec(effect, Targets::Resources, globs, when)
    }

    fn spec(effect: Effect, targets: Targets, globs: &[&str], when: Option<&str>) -> RuleSpec {
        RuleSpec {
            effect,
            targets,
            globs: globs.iter().map(|g| (*g).to_owned()).collect(),
            when: when.map(str::to_owned),
            approval: None,
        }
    }

    fn compile(specs: &[RuleSpec]) -> Policy {
        Policy::compile("tenants[0].policy", specs).unwrap()
    }

    fn who(subject: &str) -> (Caller, Subject) {
        let subject = if subject.is_empty() {
            Subject::tenant()
        } else {
            Subject::named(crate::callers::Namespace::Token, subject).unwrap()
        };
        (Caller::static_token(0), subject)
    }

    #[test]
    fn a_name_rule_hides_a_tool_and_a_prompt_of_that_name() {
        let policy = compile(&[names(Effect::Deny, &["b__review"], None)]);
        let (caller, subject) = who("");
        assert!(!policy.allows(&caller, &subject, &tool("b__review")));
        assert!(!policy.allows_prompt(&caller, &subject, &prompt("b__review")));
        assert!(policy.allows_prompt(&caller, &subject, &prompt("b__summary")));
        assert!(policy.allows_prompt(&caller, &subject, &prompt("a__review")));
        // Name rules never match resources, whatever the URI looks like.
        let everything = compile(&[names(Effect::Deny, &["*"], None)]);
        assert!(!everything.allows_prompt(&caller, &subject, &prompt("a__x")));
        assert!(everything.allows_resource(&caller, &subject, "b", &uri("urn:b__review")));
        assert!(everything.allows_resource(&caller, &subject, "b", &uri("file:///x")));
        assert!(!everything.has_resource_rules());
    }

    fn skill(name: &str) -> crate::catalog::CatalogSkill {
        let (server, upstream) = name.split_once("__").unwrap();
        crate::catalog::CatalogSkill {
            name: name.to_owned(),
            server: server.to_owned(),
            server_index: 0,
            uri: format!("skill://{upstream}/SKILL.md"),
            upstream_name: upstream.to_owned(),
            description: String::new(),
            frontmatter_json: "{}".to_owned(),
            files: None,
            definition_hash: format!("hash-of-{name}"),
        }
    }

    #[test]
    fn skills_follow_the_name_rules_and_a_condition_on_another_target_denies() {
        let policy = compile(&[
            names(Effect::Deny, &["b__*"], Some("subject != 'ops'")),
            names(Effect::Allow, &["a__open"], None),
            names(Effect::Deny, &["a__*"], Some("tool.server == 'a'")),
        ]);
        let (caller, dev) = who("dev");
        let (_, ops) = who("ops");
        assert!(!policy.allows_skill(&caller, &dev, &skill("b__refunds")));
        assert!(policy.allows_skill(&caller, &ops, &skill("b__refunds")));
        assert!(policy.allows_skill(&caller, &dev, &skill("a__open")));
        // `tool` is unbound for a skill: the condition fails, and a failing
        // `deny` applies.
        assert!(!policy.allows_skill(&caller, &ops, &skill("a__refunds")));
        assert!(policy.allows_skill(&caller, &ops, &skill("c__refunds")));
    }

    #[test]
    fn conditions_see_the_prompt_beside_the_tool() {
        let policy = compile(&[
            names(
                Effect::Deny,
                &["*"],
                Some("prompt.server == 'b' && subject != 'ops'"),
            ),
            names(
                Effect::Deny,
                &["*__secret"],
                Some("prompt.name == 'a__secret'"),
            ),
        ]);
        let (caller, dev) = who("dev");
        let (_, ops) = who("ops");
        assert!(!policy.allows_prompt(&caller, &dev, &prompt("b__review")));
        assert!(policy.allows_prompt(&caller, &ops, &prompt("b__review")));
        assert!(policy.allows_prompt(&caller, &dev, &prompt("a__review")));
        assert!(!policy.allows_prompt(&caller, &ops, &prompt("a__secret")));
        assert!(policy.allows_prompt(&caller, &ops, &prompt("c__secret")));
    }

    #[test]
    fn an_unbound_variable_fails_closed() {
        let (caller, subject) = who("dev");
        // `tool` is unbound for a prompt: a deny reading it applies, an
        // allow reading it does not.
        let deny = compile(&[names(
            Effect::Deny,
            &["b__*"],
            Some("!tool.annotations.read_only"),
        )]);
        assert!(!deny.allows_prompt(&caller, &subject, &prompt("b__review")));
        assert!(deny.allows_prompt(&caller, &subject, &prompt("c__review")));
        let allow = compile(&[
            names(Effect::Allow, &["b__*"], Some("tool.server == 'b'")),
            names(Effect::Deny, &["b__*"], None),
        ]);
        assert!(allow.allows(&caller, &subject, &tool("b__review")));
        assert!(!allow.allows_prompt(&caller, &subject, &prompt("b__review")));
        // And `prompt` for a tool.
        let on_prompts = compile(&[names(Effect::Deny, &["*"], Some("prompt.server == 'z'"))]);
        assert!(!on_prompts.allows(&caller, &subject, &tool("b__review")));
        assert!(on_prompts.allows_prompt(&caller, &subject, &prompt("b__review")));
        // `tool` and `prompt` for a resource; `resource` for the others.
        let on_tools = compile(&[resources(
            Effect::Deny,
            &["*:**"],
            Some("tool.server == 'z' || prompt.server == 'z'"),
        )]);
        assert!(!on_tools.allows_resource(&caller, &subject, "b", &uri("file:///a")));
        let on_resources = compile(&[
            resources(Effect::Allow, &["*:**"], Some("resource.server == 'b'")),
            resources(Effect::Deny, &["*:**"], None),
            names(Effect::Deny, &["*"], Some("resource.uri == ''")),
        ]);
        assert!(on_resources.allows_resource(&caller, &subject, "b", &uri("file:///a")));
        assert!(!on_resources.allows_resource(&caller, &subject, "c", &uri("file:///a")));
        assert!(!on_resources.allows(&caller, &subject, &tool("b__review")));
        assert!(!on_resources.allows_prompt(&caller, &subject, &prompt("b__review")));
    }

    #[test]
    fn resource_globs_name_the_server_then_the_uri_by_segments() {
        let policy = compile(&[
            resources(Effect::Allow, &["docs:file:///public/**"], None),
            resources(Effect::Deny, &["docs:**"], None),
            resources(Effect::Deny, &["*:file:///tmp/*"], None),
            resources(
                Effect::Deny,
                &["{a,b}:demo://resource/dynamic/text/*"],
                None,
            ),
        ]);
        let (caller, subject) = who("");
        let allows = |server: &str, text: &str| {
            policy.allows_resource(&caller, &subject, server, &uri(text))
        };
        // First match decides: public docs pass, the rest of docs does not.
        assert!(allows("docs", "file:///public/a/b.md"));
        assert!(!allows("docs", "file:///private/a.md"));
        assert!(!allows("docs", "memo://insights"));
        // `*` stays within a segment; `**` crosses them.
        assert!(!allows("files", "file:///tmp/a"));
        assert!(allows("files", "file:///tmp/a/b"));
        // The server glob matches the server's name only.
        assert!(!allows("a", "demo://resource/dynamic/text/{index}"));
        assert!(!allows("b", "demo://resource/dynamic/text/1"));
        assert!(allows("c", "demo://resource/dynamic/text/1"));
        assert!(allows("docsx", "file:///private/a.md"));
        // Resource rules never match names.
        assert!(policy.allows(&caller, &subject, &tool("docs__read")));
        assert!(policy.allows_prompt(&caller, &subject, &prompt("docs__read")));
        assert!(policy.has_resource_rules());
    }

    #[test]
    fn the_governance_example_holds_against_every_spelling_of_a_uri() {
        // docs/governance.md, "Prompts and resources": its resource rules.
        let policy = compile(&[
            resources(Effect::Allow, &["*:file:///srv/public/**"], None),
            resources(Effect::Deny, &["*:file:///**"], None),
            resources(Effect::Allow, &["wiki:wiki://public/**"], None),
            resources(
                Effect::Allow,
                &["wiki:**"],
                Some("has(claims.groups) && 'ops' in claims.groups"),
            ),
            resources(Effect::Deny, &["wiki:**"], None),
        ]);
        let (caller, subject) = who("dev");
        // What a spelling comes to: denied, allowed, or refused before any
        // rule is asked.
        let decide = |server: &str, spelled: &str| match ResourceUri::parse(spelled) {
            Ok(uri) => Some(policy.allows_resource(&caller, &subject, server, &uri)),
            Err(_) => None,
        };
        for spelled in [
            "file:///srv/public/readme.txt",
            "file://localhost/srv/public/readme.txt",
            "FILE:///srv/public/%72eadme.txt",
            "file:///srv/public/a/../readme.txt",
        ] {
            assert_eq!(decide("files", spelled), Some(true), "{spelled}");
        }
        for spelled in [
            "file:///srv/secret/key",
            "file:///srv/public/../secret/key",
            "file:///srv/public/%2e%2e/secret/key",
            "file:///srv/public/%2E%2E/secret/key",
            "file:///srv/public/.%2e/secret/key",
            "file://localhost/srv/secret/key",
            "FILE:///srv/secret/key",
            "File://LocalHost/srv/public/../secret/key",
            "file:///srv/public\\..\\secret\\key",
            "file:///srv/%70ublic/../secret/key",
        ] {
            assert_eq!(decide("files", spelled), Some(false), "{spelled}");
        }
        for spelled in [
            "file:///srv/public/..%2fsecret/key",
            "file:///srv/public/..%2Fsecret/key",
            "file:///srv/public/..%5Csecret/key",
            "file://evil/srv/secret/key",
        ] {
            assert_eq!(decide("files", spelled), None, "{spelled}");
        }
        // The wiki: only its public space for a caller outside `ops`,
        // however the rest is spelled.
        assert_eq!(decide("wiki", "wiki://public/page"), Some(true));
        for spelled in [
            "wiki://private/page",
            "WIKI://PRIVATE/page",
            "wiki://public@private/page",
            "wiki://private:80/page",
        ] {
            let decided = decide("wiki", spelled);
            assert_ne!(decided, Some(true), "{spelled}");
        }
        // A dot segment never climbs out of the host.
        assert_eq!(decide("wiki", "wiki://public/../private/x"), Some(true));
    }

    #[test]
    fn one_evaluator_decides_many_kinds_as_fresh_ones_do() {
        // Conditions remembered per caller must not leak from one kind of
        // target to another.
        let policy = compile(&[
            names(Effect::Allow, &["*"], Some("prompt.server == 'a'")),
            names(Effect::Allow, &["*"], Some("tool.server == 'a'")),
            names(Effect::Deny, &["*"], Some("subject == 'dev'")),
            resources(Effect::Allow, &["*:**"], Some("resource.uri.endsWith('y')")),
            resources(Effect::Deny, &["*:**"], Some("subject == 'dev'")),
        ]);
        let (caller, dev) = who("dev");
        let (tools, prompts) = (
            [tool("a__t"), tool("b__t")],
            [prompt("a__p"), prompt("b__p")],
        );
        let resources = [("a", uri("file:///x")), ("a", uri("file:///y"))];
        let fresh: Vec<bool> = tools
            .iter()
            .map(|t| policy.allows(&caller, &dev, t))
            .chain(
                prompts
                    .iter()
                    .map(|p| policy.allows_prompt(&caller, &dev, p)),
            )
            .chain(
                resources
                    .iter()
                    .map(|(s, u)| policy.allows_resource(&caller, &dev, s, u)),
            )
            .collect();
        assert_eq!(fresh, [true, false, true, false, false, true]);
        let mut one = policy.evaluator(&caller, &dev);
        let mut shared = Vec::new();
        for round in 0..2 {
            let mut got: Vec<bool> = Vec::new();
            if round == 0 {
                // Resources and prompts first, tools last.
                let r: Vec<bool> = resources
                    .iter()
                    .map(|(s, u)| one.allows_resource(s, u))
                    .collect();
                let p: Vec<bool> = prompts.iter().map(|p| one.allows_prompt(p)).collect();
                got.extend(tools.iter().map(|t| one.allows(t)));
                got.extend(p);
                got.extend(r);
            } else {
                got.extend(tools.iter().map(|t| one.allows(t)));
                got.extend(prompts.iter().map(|p| one.allows_prompt(p)));
                got.extend(resources.iter().map(|(s, u)| one.allows_resource(s, u)));
            }
            shared.push(got);
        }
        assert_eq!(shared[0], fresh);
        assert_eq!(shared[1], fresh);
    }

    #[test]
    fn bad_resource_rules_name_their_field() {
        let errors = Policy::compile(
            "tenants[0].policy",
            &[
                resources(Effect::Allow, &["docs:file:///a/**"], None),
                resources(
                    Effect::Deny,
                    &["file:///secret/**".trim_start_matches("file:")],
                    None,
                ),
                resources(Effect::Deny, &["docs:ok", ":file:///x", "docs:"], None),
                resources(
                    Effect::Allow,
                    &["docs:[unclosed", "file:///etc/passwd"],
                    None,
                ),
                resources(Effect::Deny, &[], None),
                resources(Effect::Deny, &["*:**"], Some("resources.uri == ''")),
            ],
        )
        .unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "tenants[0].policy[1].deny_resources[0]",
                "tenants[0].policy[2].deny_resources[1]",
                "tenants[0].policy[2].deny_resources[2]",
                "tenants[0].policy[3].allow_resources[0]",
                "tenants[0].policy[3].allow_resources[1]",
                "tenants[0].policy[4].deny_resources",
                "tenants[0].policy[5].when",
            ]
        );
        assert!(
            errors[0].message.contains("<server>:<uri>"),
            "{}",
            errors[0]
        );
        assert!(errors[1].message.contains("empty server"), "{}", errors[1]);
        assert!(errors[2].message.contains("empty URI"), "{}", errors[2]);
        assert!(
            errors[3].message.contains("not a valid glob"),
            "{}",
            errors[3]
        );
        assert!(errors[4].message.contains("server first"), "{}", errors[4]);
        assert!(errors[6].message.contains("`resources`"), "{}", errors[6]);
    }

    #[test]
    fn resource_globs_that_no_normal_uri_matches_are_refused() {
        for (glob, why) in [
            ("files:FILE:///srv/**", "scheme"),
            ("files:file://localhost/srv/**", "file://localhost/"),
            ("wiki:wiki://Private/**", "host"),
            ("wiki:wiki://me@PRIVATE/**", "host"),
            ("files:file:///srv/public/../secret/**", "segment"),
            ("files:file:///srv/./secret/**", "segment"),
            ("files:file:///srv/public/..%2Fsecret/**", "separator"),
            ("files:file:///srv/%73ecret/**", "decoded"),
            ("files:file:///a%c3%a9", "upper case"),
        ] {
            let errors = Policy::compile(
                "tenants[0].policy",
                &[resources(Effect::Deny, &[glob], None)],
            )
            .expect_err(glob);
            assert_eq!(errors[0].path, "tenants[0].policy[0].deny_resources[0]");
            assert!(
                errors[0].message.contains("can never match"),
                "{}",
                errors[0]
            );
            assert!(errors[0].message.contains(why), "{glob}: {}", errors[0]);
        }
        // Globs over normal forms, metacharacters included, load.
        compile(&[resources(
            Effect::Deny,
            &[
                "*:**",
                "files:file:///srv/secret/**",
                "{a,b}:demo://resource/dynamic/text/*",
                "wiki:wiki://[Pp]rivate/**",
                "files:file:///a%C3%A9/*",
                "s:mailto:Bob@Example.COM",
                "s:urn:isbn:*",
            ],
            None,
        )]);
    }

    #[test]
    fn a_view_holds_the_prompts_a_caller_may_see() {
        use crate::catalog::Catalog;
        let policy = compile(&[
            names(Effect::Deny, &["b__review"], Some("subject != 'ops'")),
            names(Effect::Deny, &["*"], Some("prompt.name == 'c__draft'")),
        ]);
        let catalog = Catalog::build(&[], &Default::default()).with_test_prompts(vec![
            prompt("b__review"),
            prompt("b__summary"),
            prompt("c__draft"),
        ]);
        let (caller, dev) = who("dev");
        let (_, ops) = who("ops");
        let view = crate::policy::caller_view(&policy, &catalog, &caller, &dev);
        let seen: Vec<&str> = view.prompts(&catalog).map(|p| p.name.as_str()).collect();
        assert_eq!(seen, ["b__summary"]);
        assert_eq!(view.prompt_count(), 1);
        assert!(view.allows_prompt_name(&catalog, "b__summary"));
        assert!(!view.allows_prompt_name(&catalog, "b__review"));
        assert!(!view.allows_prompt_name(&catalog, "b__nothing"));
        assert!(!view.sees_every_prompt());
        // A view that hides a prompt is not "everything", though it hides
        // no tool: a listing that skips views would show the prompt.
        assert!(view.is_empty(), "the catalog has no tool");
        assert!(!view.is_everything());
        let ops_view = crate::policy::caller_view(&policy, &catalog, &caller, &ops);
        assert_eq!(ops_view.prompt_count(), 2);
        assert_ne!(ops_view.prompts_version(), view.prompts_version());
        // A caller seeing every prompt has the catalog's prompts version.
        let open = compile(&[names(Effect::Deny, &["nothing__*"], None)]);
        let all = crate::policy::caller_view(&open, &catalog, &caller, &dev);
        assert!(all.sees_every_prompt());
        assert_eq!(all.prompts_version(), catalog.prompts_version());
        // Equal views share a version; each view agrees with the policy.
        let again = Catalog::build(&[], &Default::default()).with_test_prompts(vec![
            prompt("b__review"),
            prompt("b__summary"),
            prompt("c__draft"),
        ]);
        let view_again = crate::policy::caller_view(&policy, &again, &caller, &dev);
        assert_eq!(view_again.prompts_version(), view.prompts_version());
        for (i, p) in catalog.prompts().iter().enumerate() {
            assert_eq!(
                view.allows_prompt_index(i),
                policy.allows_prompt(&caller, &dev, p)
            );
        }
    }
}
