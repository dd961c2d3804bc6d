//! A tenant's catalog: built from its slots' states and published (with
//! the recent versions kept for pinned plans), read, watched and waited for.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::Tenant;
use crate::catalog::{Catalog, InputState, PromptInput, ServerInput, SharedCatalog, SkillInput};
use crate::registry::slot::{Republish, SlotState};

/// Catalog versions remembered per tenant for pinned plans.
const CATALOG_HISTORY: usize = 16;

impl Tenant {
    /// Builds and publishes a new catalog from the slots' states, if this
    /// tenant object still owns its publication (a tenant replaced by a
    /// reload publishes nothing more).
    pub(in crate::registry) fn rebuild(&self) {
        let owner = self.publication.owner.lock().expect("publication lock");
        if !std::ptr::eq(owner.as_ptr(), self) {
            return;
        }
        self.publish(&owner);
    }

    /// Builds and publishes; the caller holds the publication lock.
    pub(super) fn publish(&self, _owner: &Weak<Tenant>) {
        let states: Vec<SlotState> = self.slots.iter().map(|s| s.state()).collect();
        let approvals = self.spawner.approvals();
        let inputs: Vec<ServerInput<'_>> = self
            .slots
            .iter()
            .zip(&states)
            .map(|(slot, state)| ServerInput {
                name: &slot.config.name,
                transport: slot.config.transport.kind(),
                bare: slot.config.bare,
                filter: &slot.config.filter,
                overrides: &slot.config.overrides,
                state: match state {
                    SlotState::Idle => InputState::Idle,
                    SlotState::Connecting => InputState::Connecting,
                    SlotState::Ready { tools, .. } => InputState::Listed(tools),
                    SlotState::Failed { reason, last_tools } => InputState::Failed {
                        reason,
                        last_tools: last_tools.as_deref().map(Vec::as_slice),
                    },
                    SlotState::AuthorizationRequired { reason } => {
                        InputState::AuthorizationRequired(reason)
                    }
                },
                approved: slot
                    .config
                    .needs_approval()
                    .then(|| approvals.server(&self.name, &slot.config.name)),
            })
            .collect();
        // Each listing's part is built once and kept by its slot: only
        // servers whose listing changed are serialised again.
        let catalog = Catalog::build_with(&inputs, |index, input, listed| {
            let build = || Catalog::server_part(index, input, listed, &self.limits);
            let listing = match &states[index] {
                SlotState::Ready { tools, .. } => Some(tools),
                SlotState::Failed {
                    last_tools: Some(tools),
                    ..
                } => Some(tools),
                _ => None,
            };
            match listing {
                Some(listing) if std::ptr::eq(listing.as_slice(), listed) => {
                    self.slots[index].part(listing, index, &self.limits, build)
                }
                _ => build(),
            }
        });
        // Prompts: from connected servers that offer them.
        let prompts: Vec<PromptInput<'_>> = self
            .slots
            .iter()
            .zip(&states)
            .map(|(slot, state)| PromptInput {
                listed: match state {
                    SlotState::Ready {
                        prompts: Some(prompts),
                        ..
                    } => Some(prompts.as_ref()),
                    _ => None,
                },
                approved: slot
                    .config
                    .needs_approval()
                    .then(|| approvals.server_prompts(&self.name, &slot.config.name)),
            })
            .collect();
        let catalog = catalog.with_prompts(&inputs, &prompts, &self.limits);
        // Skills: from connected servers that offer them.
        let skills: Vec<SkillInput<'_>> = self
            .slots
            .iter()
            .zip(&states)
            .map(|(slot, state)| SkillInput {
                listed: match state {
                    SlotState::Ready {
                        skills: Some(skills),
                        ..
                    } => Some(skills.as_ref()),
                    _ => None,
                },
                approved: slot
                    .config
                    .needs_approval()
                    .then(|| approvals.server_skills(&self.name, &slot.config.name)),
            })
            .collect();
        let catalog = catalog.with_skills(&inputs, &skills, &self.limits);
        let catalog = Arc::new(catalog.with_stamp(self.stamp));
        self.report_withheld(&catalog);
        {
            let mut history = self.history();
            if history
                .back()
                .is_none_or(|c| c.version() != catalog.version())
            {
                if history.len() == CATALOG_HISTORY {
                    history.pop_front();
                }
                history.push_back(catalog.clone());
            }
        }
        self.publication.publish(catalog);
    }

    /// Counts the withheld tools of each `definitions: approved` server
    /// (`toolgate_tools_withheld`) and logs, at WARN, each tool withheld
    /// now that the published catalog did not withhold (with this
    /// definition): once per change, not per rebuild.
    fn report_withheld(&self, catalog: &Catalog) {
        let previous = self.publication.current.load_full();
        for (slot, server) in self.slots.iter().zip(catalog.servers()) {
            if !slot.config.needs_approval() {
                continue;
            }
            self.spawner
                .metrics()
                .tools_withheld(&self.name, &server.name, server.withheld.len());
            for withheld in &server.withheld {
                let known = previous
                    .withheld(&withheld.tool.name)
                    .is_some_and(|(s, w)| {
                        s.name == server.name
                            && w.tool.definition_hash == withheld.tool.definition_hash
                    });
                if known {
                    continue;
                }
                tracing::warn!(
                    tenant = %self.name,
                    server = %server.name,
                    tool = %withheld.tool.name,
                    definition_hash = %withheld.tool.definition_hash,
                    approved_hash = withheld.approved_hash.as_deref().unwrap_or("none"),
                    description = %crate::approvals::excerpt(&withheld.tool.description),
                    "tool withheld: its definition is not approved (run `toolgate approve` after review)"
                );
            }
            for withheld in &server.withheld_prompts {
                let known =
                    previous
                        .withheld_prompt(&withheld.prompt.name)
                        .is_some_and(|(s, w)| {
                            s.name == server.name
                                && w.prompt.definition_hash == withheld.prompt.definition_hash
                        });
                if known {
                    continue;
                }
                tracing::warn!(
                    tenant = %self.name,
                    server = %server.name,
                    prompt = %withheld.prompt.name,
                    definition_hash = %withheld.prompt.definition_hash,
                    approved_hash = withheld.approved_hash.as_deref().unwrap_or("none"),
                    description = %crate::approvals::excerpt(&withheld.prompt.description),
                    "prompt withheld: its definition is not approved (run `toolgate approve` after review)"
                );
            }
            for withheld in &server.withheld_skills {
                let known = previous
                    .withheld_skill(&withheld.skill.name)
                    .is_some_and(|(s, w)| {
                        s.name == server.name
                            && w.skill.definition_hash == withheld.skill.definition_hash
                    });
                if known {
                    continue;
                }
                tracing::warn!(
                    tenant = %self.name,
                    server = %server.name,
                    skill = %withheld.skill.name,
                    definition_hash = %withheld.skill.definition_hash,
                    approved_hash = withheld.approved_hash.as_deref().unwrap_or("none"),
                    description = %crate::approvals::excerpt(&withheld.skill.description),
                    "skill withheld: its definition is not approved (run `toolgate approve` after review)"
                );
            }
        }
    }

    /// The current catalog snapshot.
    pub fn catalog(&self) -> SharedCatalog {
        self.publication.current.load_full()
    }

    /// Resolves when a configuration reload removes this tenant.
    pub async fn removed(&self) {
        self.publication.removed.cancelled().await;
    }

    /// A receiver of every new catalog snapshot.
    pub fn subscribe(&self) -> watch::Receiver<SharedCatalog> {
        self.publication.subscribe()
    }

    /// The remembered catalogs, oldest first (locked while held).
    fn history(&self) -> std::sync::MutexGuard<'_, VecDeque<SharedCatalog>> {
        self.publication.history.lock().expect("history lock")
    }

    /// A recent catalog with this version, if remembered.
    pub fn catalog_with_version(&self, version: &str) -> Option<SharedCatalog> {
        self.history()
            .iter()
            .rev()
            .find(|c| c.version() == version)
            .cloned()
    }

    /// The remembered catalogs (for pinned plans), newest first.
    pub fn recent_catalogs(&self) -> Vec<SharedCatalog> {
        self.history().iter().rev().cloned().collect()
    }

    /// Whether a remembered catalog exposed `name` with this definition
    /// hash.
    pub fn served_definition(&self, name: &str, hash: &str) -> bool {
        self.history()
            .iter()
            .any(|c| c.get(name).is_some_and(|t| t.definition_hash == hash))
    }

    /// The catalog once no server is connecting any more, or the current
    /// one when `wait` runs out first.
    pub async fn settled_catalog(&self, wait: Duration) -> SharedCatalog {
        let mut rx = self.subscribe();
        let settled = tokio::time::timeout(wait, rx.wait_for(|c| !c.is_settling())).await;
        match settled {
            Ok(Ok(catalog)) => catalog.clone(),
            _ => self.catalog(),
        }
    }

    /// Whether server `index` is a delegated one (`token_exchange`,
    /// `identity_assertion`) whose tools nobody could list yet (no subject
    /// has had a token): the session of a JWT caller, opened with
    /// [`Tenant::user_session`], exchanges its JWT and wakes the listing.
    pub fn awaits_delegated_listing(&self, index: usize) -> bool {
        self.slots.get(index).is_some_and(|slot| {
            matches!(slot.state(), SlotState::AuthorizationRequired { .. })
                && matches!(&slot.oauth, Ok(Some(client)) if client.is_delegated())
        })
    }

    /// The catalog once server `index` (woken by a subject's session) has
    /// left `AUTHORIZATION_REQUIRED` and nothing is connecting any more, or
    /// the current one when `wait` runs out first.
    pub async fn catalog_after_listing(&self, index: usize, wait: Duration) -> SharedCatalog {
        let Some(name) = self.slots.get(index).map(|s| s.config.name.clone()) else {
            return self.catalog();
        };
        let mut rx = self.subscribe();
        let listed = |catalog: &SharedCatalog| {
            !catalog.is_settling()
                && catalog.servers().iter().any(|s| {
                    s.name == name
                        && !matches!(
                            s.state,
                            crate::catalog::ServerState::AuthorizationRequired(_)
                        )
                })
        };
        match tokio::time::timeout(wait, rx.wait_for(listed)).await {
            Ok(Ok(catalog)) => catalog.clone(),
            _ => self.catalog(),
        }
    }
}

/// A slot's state changed: the tenant object it feeds rebuilds its catalog.
impl Republish for Tenant {
    fn rebuild(&self) {
        Tenant::rebuild(self);
    }
}
