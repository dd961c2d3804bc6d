//! The policy over prompts and resources: prompts under the tenant's name
//! rules (their globs match exposed prompt names as they match tool
//! names; CEL sees `prompt`), resources under their own rules
//! (`allow_resources` / `deny_resources`; CEL sees `resource`).

use super::Policy;
use crate::callers::{Caller, Subject};
use crate::catalog::CatalogPrompt;

impl Policy {
    /// Whether `caller`, acting for `subject`, may see and get `prompt`.
    pub fn allows_prompt(
        &self,
        _caller: &Caller,
        _subject: &Subject,
        _prompt: &CatalogPrompt,
    ) -> bool {
        // Being built (issue 20, policy): every prompt is allowed until then.
        true
    }

    /// Whether `caller`, acting for `subject`, may see, read, watch and
    /// complete resource `uri` (or URI template) of `server`.
    pub fn allows_resource(
        &self,
        _caller: &Caller,
        _subject: &Subject,
        _server: &str,
        _uri: &str,
    ) -> bool {
        // Being built (issue 20, policy): every resource is allowed until then.
        true
    }
}
