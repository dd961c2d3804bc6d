//! A tenant's prompts in its catalog snapshot: exposed under the same
//! names, checks and collision rules as tools (`server__prompt`, or bare),
//! hashed for approvals. A prompt list is a definition set, like a tool
//! list: read at connect, not on every request.

/// One exposed prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogPrompt {
    /// The exposed name, unique among the tenant's prompts.
    pub name: String,
    /// The configured name of the server providing it.
    pub server: String,
    /// Index of that server in the tenant's configuration.
    pub server_index: usize,
    /// The prompt's name on its server.
    pub upstream_name: String,
    /// Its title, empty when none.
    pub title: String,
    /// Its description, empty when none.
    pub description: String,
    /// Its arguments, in the server's order.
    pub arguments: Vec<PromptArgument>,
    /// Stable hash of the definition (hex): what approvals record.
    pub definition_hash: String,
}

/// One argument of a [`CatalogPrompt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptArgument {
    /// Its name.
    pub name: String,
    /// Its title, empty when none.
    pub title: String,
    /// Its description, empty when none.
    pub description: String,
    /// Whether the prompt needs it.
    pub required: bool,
}

/// A prompt withheld because its definition is not approved.
#[derive(Debug, Clone)]
pub struct WithheldPrompt {
    /// The prompt as it would be exposed (current hash).
    pub prompt: CatalogPrompt,
    /// The approved hash, when the prompt changed since its approval.
    pub approved_hash: Option<String>,
}

#[cfg(test)]
impl super::Catalog {
    /// This catalog with `prompts` (sorted by name) as its prompts, for
    /// the tests of other rooms (policy views) until catalogs are built
    /// with prompts.
    pub(crate) fn with_test_prompts(mut self, mut prompts: Vec<CatalogPrompt>) -> Self {
        prompts.sort_by(|a, b| a.name.cmp(&b.name));
        self.prompt_index = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        self.prompts_version = format!("all-{}", prompts.len());
        self.prompts = prompts;
        self
    }
}
