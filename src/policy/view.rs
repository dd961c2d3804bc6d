//! A caller's view of a catalog snapshot: which of its tools the caller may
//! see and call, which of its prompts it may see and get, and the versions
//! of that view.
//!
//! A view is evaluated once per catalog snapshot and distinct caller (the
//! parts of it the policy reads: its claims, its subject) and kept with the
//! snapshot, a bounded number per snapshot, so a listing does not evaluate
//! every rule against every tool on every call.
//!
//! The version of a view is the catalog version of the tools it holds
//! (the same content hash over their definitions): the catalog's own
//! version when the caller sees everything, stable while the tools it sees
//! do not change (whatever happens to tools it does not see), and different
//! for views that differ. The prompts of a view have their own version
//! ([`View::prompts_version`]): the catalog's prompts version when the
//! caller sees every prompt, else a hash over the names and definition
//! hashes of those it sees.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::Policy;
use crate::callers::{Caller, Subject};
use crate::catalog::{Catalog, CatalogPrompt, CatalogTool};

/// Views kept per catalog snapshot; the oldest goes first.
pub const MAX_CACHED_VIEWS: usize = 256;

/// What one caller may see of one catalog snapshot.
#[derive(Debug)]
pub struct View {
    /// Bit `i` set: the caller may see and call `catalog.tools()[i]`.
    allowed: Vec<u64>,
    count: usize,
    total: usize,
    /// Allowed tools per server, by the server's index in the catalog.
    per_server: Vec<u32>,
    /// Names of withheld tools (`definitions: approved`) the caller may
    /// not call either, sorted: not shown to it.
    hidden_withheld: Vec<String>,
    version: String,
    /// The same of the catalog's prompts.
    prompts: PromptsSeen,
}

/// What one caller may see of a catalog's prompts.
#[derive(Debug)]
struct PromptsSeen {
    /// Bit `i` set: the caller may see and get `catalog.prompts()[i]`.
    allowed: Vec<u64>,
    count: usize,
    total: usize,
    /// Allowed prompts per server, by the server's index in the catalog.
    per_server: Vec<u32>,
    /// Names of withheld prompts the caller may not get either, sorted.
    hidden_withheld: Vec<String>,
    version: String,
}

impl PromptsSeen {
    fn evaluate<'a>(evaluator: &mut super::Evaluator<'a>, catalog: &'a Catalog) -> PromptsSeen {
        let prompts = catalog.prompts();
        let mut allowed = vec![0u64; prompts.len().div_ceil(64)];
        let mut per_server = vec![0u32; catalog.servers().len()];
        let mut count = 0;
        for (i, prompt) in prompts.iter().enumerate() {
            if evaluator.allows_prompt(prompt) {
                allowed[i / 64] |= 1 << (i % 64);
                count += 1;
                if let Some(n) = per_server.get_mut(prompt.server_index) {
                    *n += 1;
                }
            }
        }
        let mut hidden_withheld: Vec<String> = catalog
            .servers()
            .iter()
            .flat_map(|s| &s.withheld_prompts)
            .filter(|w| !evaluator.allows_prompt(&w.prompt))
            .map(|w| w.prompt.name.clone())
            .collect();
        hidden_withheld.sort_unstable();
        let version = if count == prompts.len() {
            catalog.prompts_version().to_owned()
        } else {
            prompts_version_of(
                prompts
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| allowed[i / 64] & (1 << (i % 64)) != 0)
                    .map(|(_, p)| p),
            )
        };
        PromptsSeen {
            allowed,
            count,
            total: prompts.len(),
            per_server,
            hidden_withheld,
            version,
        }
    }

    fn allows_index(&self, index: usize) -> bool {
        index < self.total && self.allowed[index / 64] & (1 << (index % 64)) != 0
    }
}

/// The version of a view's prompts when it does not see them all: a hash
/// over their exposed names and definition hashes (length-prefixed, under
/// a domain tag of its own), 24 hex characters like catalog versions.
fn prompts_version_of<'a>(prompts: impl Iterator<Item = &'a CatalogPrompt>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"toolgate prompts view v1");
    for prompt in prompts {
        for part in [&prompt.name, &prompt.definition_hash] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
    }
    let digest = hasher.finalize();
    hex::encode(&digest[..12])
}

impl View {
    /// Evaluates `policy` for one caller against every tool of `catalog`.
    pub fn evaluate(
        policy: &Policy,
        catalog: &Catalog,
        caller: &Caller,
        subject: &Subject,
    ) -> View {
        let tools = catalog.tools();
        let mut allowed = vec![0u64; tools.len().div_ceil(64)];
        let mut per_server = vec![0u32; catalog.servers().len()];
        let mut evaluator = policy.evaluator(caller, subject);
        let mut count = 0;
        for (i, tool) in tools.iter().enumerate() {
            if evaluator.allows(tool) {
                allowed[i / 64] |= 1 << (i % 64);
                count += 1;
                if let Some(n) = per_server.get_mut(tool.server_index) {
                    *n += 1;
                }
            }
        }
        let mut hidden_withheld: Vec<String> = catalog
            .servers()
            .iter()
            .flat_map(|s| &s.withheld)
            .filter(|w| !evaluator.allows(&w.tool))
            .map(|w| w.tool.name.clone())
            .collect();
        hidden_withheld.sort_unstable();
        let prompts = PromptsSeen::evaluate(&mut evaluator, catalog);
        let version = if count == tools.len() {
            catalog.version().to_owned()
        } else {
            crate::catalog::version_of(
                tools
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| allowed[i / 64] & (1 << (i % 64)) != 0)
                    .map(|(_, t)| t),
            )
        };
        View {
            allowed,
            count,
            total: tools.len(),
            per_server,
            hidden_withheld,
            version,
            prompts,
        }
    }

    /// Whether the caller may see and call the catalog's tool at `index`.
    pub fn allows_index(&self, index: usize) -> bool {
        index < self.total && self.allowed[index / 64] & (1 << (index % 64)) != 0
    }

    /// Whether the caller may see and call the tool exposed as `name` in
    /// `catalog` (the snapshot this view was evaluated on).
    pub fn allows_name(&self, catalog: &Catalog, name: &str) -> bool {
        catalog
            .position(name)
            .is_some_and(|index| self.allows_index(index))
    }

    /// The tools the caller may see, in catalog order.
    pub fn tools<'c>(&'c self, catalog: &'c Catalog) -> impl Iterator<Item = &'c CatalogTool> {
        catalog
            .tools()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.allows_index(*i))
            .map(|(_, tool)| tool)
    }

    /// Whether the caller sees every tool and every prompt, withheld ones
    /// included (its view is the catalog, and a listing may skip it).
    pub fn is_everything(&self) -> bool {
        self.count == self.total && self.hidden_withheld.is_empty() && self.sees_every_prompt()
    }

    /// Whether the withheld tool `name` is hidden from the caller (it may
    /// not call it, approved or not).
    pub fn hides_withheld(&self, name: &str) -> bool {
        self.hidden_withheld
            .binary_search_by(|n| n.as_str().cmp(name))
            .is_ok()
    }

    /// How many tools the caller sees.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the caller sees no tool.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How many tools of the server at `server_index` the caller sees.
    pub fn server_tool_count(&self, server_index: usize) -> u32 {
        self.per_server.get(server_index).copied().unwrap_or(0)
    }

    /// The version of this view (see the module documentation).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Whether the caller may see and get the catalog's prompt at `index`
    /// (of [`Catalog::prompts`]).
    pub fn allows_prompt_index(&self, index: usize) -> bool {
        self.prompts.allows_index(index)
    }

    /// Whether the caller may see and get the prompt exposed as `name` in
    /// `catalog` (the snapshot this view was evaluated on).
    pub fn allows_prompt_name(&self, catalog: &Catalog, name: &str) -> bool {
        catalog
            .prompt_position(name)
            .is_some_and(|index| self.prompts.allows_index(index))
    }

    /// The prompts the caller may see, in catalog order.
    pub fn prompts<'c>(&'c self, catalog: &'c Catalog) -> impl Iterator<Item = &'c CatalogPrompt> {
        catalog
            .prompts()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.prompts.allows_index(*i))
            .map(|(_, prompt)| prompt)
    }

    /// Whether the caller sees every prompt, withheld ones included.
    pub fn sees_every_prompt(&self) -> bool {
        self.prompts.count == self.prompts.total && self.prompts.hidden_withheld.is_empty()
    }

    /// Whether the withheld prompt `name` is hidden from the caller.
    pub fn hides_withheld_prompt(&self, name: &str) -> bool {
        self.prompts
            .hidden_withheld
            .binary_search_by(|n| n.as_str().cmp(name))
            .is_ok()
    }

    /// How many prompts the caller sees.
    pub fn prompt_count(&self) -> usize {
        self.prompts.count
    }

    /// How many prompts of the server at `server_index` the caller sees.
    pub fn server_prompt_count(&self, server_index: usize) -> u32 {
        self.prompts
            .per_server
            .get(server_index)
            .copied()
            .unwrap_or(0)
    }

    /// The version of the prompts of this view (see the module
    /// documentation).
    pub fn prompts_version(&self) -> &str {
        &self.prompts.version
    }
}

/// The views evaluated on one catalog snapshot, by caller key.
#[derive(Debug, Default)]
struct ViewCache {
    views: Mutex<Views>,
}

/// Views by caller key, and the keys oldest first.
#[derive(Debug, Default)]
struct Views {
    by_key: HashMap<[u8; 32], Arc<View>>,
    order: VecDeque<[u8; 32]>,
}

/// The key of a caller's view: the policy, and what of the caller it
/// reads. A policy that reads neither claims, subject nor caller has one
/// view per snapshot for every caller.
fn cache_key(policy: &Policy, caller: &Caller, subject: &Subject) -> [u8; 32] {
    let (claims, reads_subject, reads_caller) = policy.reads();
    let mut hasher = Sha256::new();
    hasher.update(policy.id().to_le_bytes());
    if reads_subject {
        let subject = subject.key().as_bytes();
        hasher.update([1]);
        hasher.update((subject.len() as u64).to_le_bytes());
        hasher.update(subject);
    }
    if reads_caller {
        let (kind, issuer) = match &caller.identity {
            crate::callers::CallerIdentity::Token { .. } => (1u8, ""),
            crate::callers::CallerIdentity::Jwt { issuer, .. } => (2u8, issuer.as_str()),
            crate::callers::CallerIdentity::Certificate { trust_domain, .. } => {
                (3u8, trust_domain.as_str())
            }
            crate::callers::CallerIdentity::ApproverToken { .. } => (4u8, ""),
        };
        hasher.update([3, kind]);
        hasher.update((issuer.len() as u64).to_le_bytes());
        hasher.update(issuer.as_bytes());
    }
    if claims {
        hasher.update([2]);
        // serde_json writes the same value the same way.
        let _ = serde_json::to_writer(HashWriter(&mut hasher), caller.claims.as_ref());
    }
    hasher.finalize().into()
}

/// Feeds written bytes to a hasher.
struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The caller's view of `catalog` under `policy` if one was evaluated
/// already (by a listing), without evaluating one: a call's decision is
/// then a lookup.
pub fn cached_view(
    policy: &Policy,
    catalog: &Catalog,
    caller: &Caller,
    subject: &Subject,
) -> Option<Arc<View>> {
    let cache = catalog.derived(|_| ViewCache::default());
    let key = cache_key(policy, caller, subject);
    cache
        .views
        .lock()
        .expect("view cache lock")
        .by_key
        .get(&key)
        .cloned()
}

/// The caller's view of `catalog` under `policy`: evaluated on first use
/// and kept with the snapshot (at most [`MAX_CACHED_VIEWS`] per snapshot).
pub fn caller_view(
    policy: &Policy,
    catalog: &Catalog,
    caller: &Caller,
    subject: &Subject,
) -> Arc<View> {
    let cache = catalog.derived(|_| ViewCache::default());
    let key = cache_key(policy, caller, subject);
    if let Some(view) = cache
        .views
        .lock()
        .expect("view cache lock")
        .by_key
        .get(&key)
    {
        return view.clone();
    }
    // Evaluated outside the lock: two callers racing for one key both
    // evaluate, and both results are the same.
    let view = Arc::new(View::evaluate(policy, catalog, caller, subject));
    let mut guard = cache.views.lock().expect("view cache lock");
    let Views {
        by_key: views,
        order,
    } = &mut *guard;
    if let Some(existing) = views.get(&key) {
        return existing.clone();
    }
    if views.len() >= MAX_CACHED_VIEWS
        && let Some(oldest) = order.pop_front()
    {
        views.remove(&oldest);
    }
    views.insert(key, view.clone());
    order.push_back(key);
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{InputState, ServerInput};
    use crate::config::ToolFilter;
    use crate::policy::Effect;

    fn catalog(names: &[&str]) -> Catalog {
        let tools: Vec<rmcp::model::Tool> = names
            .iter()
            .map(|n| {
                rmcp::model::Tool::new(
                    (*n).to_owned(),
                    format!("does {n}"),
                    Arc::new(serde_json::Map::new()),
                )
            })
            .collect();
        let filter = ToolFilter::default();
        let overrides = std::collections::HashMap::new();
        Catalog::build(
            &[ServerInput {
                name: "s",
                transport: "stdio",
                bare: false,
                filter: &filter,
                overrides: &overrides,
                state: InputState::Listed(&tools),
                approved: None,
            }],
            &Default::default(),
        )
    }

    use crate::policy::test_policy as policy;

    #[test]
    fn versions_are_stable_per_view_and_differ_across_views() {
        let policy = policy(&[(Effect::Deny, "s__secret*", Some("subject != 'ops'"))]);
        let token = Caller::static_token(0);
        let ops = Subject::named(crate::callers::Namespace::Token, "ops").unwrap();
        let dev = Subject::named(crate::callers::Namespace::Token, "dev").unwrap();
        let one = catalog(&["read", "secret_a", "write"]);
        let full = caller_view(&policy, &one, &token, &ops);
        assert!(full.is_everything());
        assert_eq!(full.version(), one.version());
        let partial = caller_view(&policy, &one, &token, &dev);
        assert_eq!(partial.len(), 2);
        assert_ne!(partial.version(), one.version());
        // The same view again (cached) and on an equal snapshot.
        assert!(Arc::ptr_eq(
            &partial,
            &caller_view(&policy, &one, &token, &dev)
        ));
        let again = catalog(&["read", "secret_a", "write"]);
        assert_eq!(
            caller_view(&policy, &again, &token, &dev).version(),
            partial.version()
        );
        // A change to a tool the caller does not see leaves its view's
        // version alone; everyone else's changes.
        let hidden_change = catalog(&["read", "secret_a", "secret_b", "write"]);
        assert_eq!(
            caller_view(&policy, &hidden_change, &token, &dev).version(),
            partial.version()
        );
        assert_ne!(
            caller_view(&policy, &hidden_change, &token, &ops).version(),
            full.version()
        );
        // The view's version is the version a catalog of just its tools has.
        assert_eq!(partial.version(), catalog(&["read", "write"]).version());
        let names: Vec<&str> = partial.tools(&one).map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["s__read", "s__write"]);
        assert!(partial.allows_name(&one, "s__read"));
        assert!(!partial.allows_name(&one, "s__secret_a"));
        assert!(!partial.allows_name(&one, "s__nothing"));
        assert_eq!(partial.server_tool_count(0), 2);
    }

    #[test]
    fn remembered_condition_values_follow_what_they_read() {
        // Conditions on the server or hints are remembered per server and
        // hints; one on the name is evaluated per tool.
        let one = catalog(&["a_secret", "b", "c_secret", "d"]);
        let by_name = policy(&[(Effect::Deny, "*", Some("tool.name.endsWith('secret')"))]);
        let view = caller_view(&by_name, &one, &Caller::static_token(0), &Subject::tenant());
        let names: Vec<&str> = view.tools(&one).map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["s__b", "s__d"]);
        let by_server = policy(&[(
            Effect::Deny,
            "*",
            Some("tool.server == 's' && tool.annotations.destructive"),
        )]);
        let view = caller_view(
            &by_server,
            &one,
            &Caller::static_token(0),
            &Subject::tenant(),
        );
        assert!(view.is_empty());
        let whole = policy(&[(Effect::Deny, "*", Some("tool['name'] == 's__b'"))]);
        let view = caller_view(&whole, &one, &Caller::static_token(0), &Subject::tenant());
        assert_eq!(view.len(), 3);
        assert!(!view.allows_name(&one, "s__b"));
    }

    #[test]
    fn the_cache_is_keyed_by_what_the_policy_reads_and_bounded() {
        let one = catalog(&["a", "b"]);
        // Reads nothing of the caller: one view for everyone.
        let static_rules = policy(&[(Effect::Deny, "s__a", None)]);
        let x = caller_view(
            &static_rules,
            &one,
            &Caller::static_token(0),
            &Subject::named(crate::callers::Namespace::Token, "x").unwrap(),
        );
        let y = caller_view(
            &static_rules,
            &one,
            &Caller::static_token(1),
            &Subject::tenant(),
        );
        assert!(Arc::ptr_eq(&x, &y));
        // Another compiled policy never reuses the first one's views.
        let other = policy(&[(Effect::Deny, "s__b", None)]);
        let z = caller_view(&other, &one, &Caller::static_token(0), &Subject::tenant());
        assert!(!Arc::ptr_eq(&x, &z));
        assert!(z.allows_name(&one, "s__a") && !z.allows_name(&one, "s__b"));
        // Claims are part of the key when read.
        let by_claims = policy(&[(Effect::Deny, "s__a", Some("claims.tier == 'free'"))]);
        let jwt = |tier: &str| Caller {
            identity: crate::callers::CallerIdentity::Jwt {
                issuer: "i".to_owned(),
                subject: "s".to_owned(),
            },
            claims: Arc::new(serde_json::json!({ "tier": tier })),
        };
        let free = caller_view(&by_claims, &one, &jwt("free"), &Subject::tenant());
        let paid = caller_view(&by_claims, &one, &jwt("paid"), &Subject::tenant());
        assert_eq!((free.len(), paid.len()), (1, 2));
        // How the caller authenticated is part of the key when read, and
        // the subject's key (not its bare id) when the subject is.
        let by_kind = policy(&[(Effect::Deny, "s__a", Some("caller.kind == 'token'"))]);
        let token_view = caller_view(&by_kind, &one, &Caller::static_token(0), &Subject::tenant());
        let jwt_view = caller_view(&by_kind, &one, &jwt("free"), &Subject::tenant());
        assert_eq!((token_view.len(), jwt_view.len()), (1, 2));
        let by_key = policy(&[(
            Effect::Deny,
            "s__a",
            Some("subject_key.startsWith('token:')"),
        )]);
        let named = |caller: &Caller| {
            let subject = Subject::named(caller.namespace(), "x").unwrap();
            caller_view(&by_key, &one, caller, &subject)
        };
        assert_eq!(
            (
                named(&Caller::static_token(0)).len(),
                named(&jwt("free")).len()
            ),
            (1, 2)
        );
        // Bounded: the oldest view goes first.
        let by_subject = policy(&[(Effect::Deny, "s__a", Some("subject == 'x'"))]);
        for i in 0..MAX_CACHED_VIEWS + 10 {
            let subject =
                Subject::named(crate::callers::Namespace::Token, &format!("user-{i}")).unwrap();
            caller_view(&by_subject, &one, &Caller::static_token(0), &subject);
        }
        let cache = one.derived(|_| ViewCache::default());
        assert!(cache.views.lock().unwrap().by_key.len() <= MAX_CACHED_VIEWS);
    }
}
