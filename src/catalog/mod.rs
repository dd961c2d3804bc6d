//! A tenant's tool catalog: an immutable snapshot built from what each
//! upstream server listed, with namespacing, name validation, collision
//! refusal, allow/deny filtering and a content-derived version.
//!
//! A new snapshot is built whenever a server's state changes; readers hold an
//! `Arc<Catalog>` and never see a half-built catalog.
//!
//! Here: the snapshot's types and its lookups. Building a snapshot from the
//! servers' listings is in `build`, definition hashes and the version in
//! `hash`.

mod build;
mod hash;
pub mod lint;
mod prompt_build;
pub mod prompts;
mod search;
pub mod skills;

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::ToolFilter;
use crate::config::names;

pub use hash::version_of;
pub use prompt_build::PromptInput;
pub use prompts::{CatalogPrompt, PromptArgument, WithheldPrompt};
pub use skills::{CatalogSkill, SkillFileEntry, SkillInput, WithheldSkill};

/// What one server contributes to a catalog build.
#[derive(Debug)]
pub struct ServerInput<'a> {
    /// The configured server name.
    pub name: &'a str,
    /// `"stdio"` or `"http"`.
    pub transport: &'static str,
    /// Expose the server's own names unprefixed.
    pub bare: bool,
    /// Which of the server's tools are exposed.
    pub filter: &'a ToolFilter,
    /// Operator overrides by the server's tool name.
    pub overrides: &'a std::collections::HashMap<String, crate::config::ToolOverride>,
    /// The server's current state.
    pub state: InputState<'a>,
    /// `Some` for a server with `definitions: approved`: only the tools
    /// whose definition hash these approvals record are exposed; the rest
    /// are withheld. `None` (`definitions: any`): every tool.
    pub approved: Option<&'a crate::approvals::ServerApprovals>,
}

/// The state of a server as seen by the catalog.
#[derive(Debug)]
pub enum InputState<'a> {
    /// Not connected and not trying (a lazy tenant not in use).
    Idle,
    /// Not connected yet (or reconnecting).
    Connecting,
    /// Connected; these are every tool it listed.
    Listed(&'a [rmcp::model::Tool]),
    /// Connecting failed or the session ended, for this reason. The tools
    /// it listed when it was last connected, if ever, still route to it so
    /// that calls get UNAVAILABLE rather than NOT_FOUND.
    Failed {
        /// Why it is down.
        reason: &'a str,
        /// What it listed when last connected.
        last_tools: Option<&'a [rmcp::model::Tool]>,
    },
    /// A per-user OAuth server that no end user (nor the tenant itself)
    /// has authorized yet, so nothing can list its tools; why, in words.
    AuthorizationRequired(&'a str),
}

/// How a server stands in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Not connected and not trying: the tenant connects lazily and is not
    /// in use.
    Idle,
    /// The session is being established.
    Connecting,
    /// Connected; its tools are in the catalog.
    Connected,
    /// Not connected, for this reason.
    Failed(String),
    /// Connected, but its tools were refused for this reason (an invalid
    /// exposed name, or a name another server also claims).
    Refused(String),
    /// A per-user OAuth server nobody has authorized yet: its tools are
    /// listed once an end user (or the tenant) consents.
    AuthorizationRequired(String),
}

/// One server's line in a catalog.
#[derive(Debug, Clone)]
pub struct ServerStatus {
    /// The configured server name.
    pub name: String,
    /// `"stdio"` or `"http"`.
    pub transport: &'static str,
    /// Its state.
    pub state: ServerState,
    /// How many tools it contributes.
    pub tool_count: u32,
    /// Tools it lists whose definitions are not approved (`definitions:
    /// approved`): not exposed, sorted by name.
    pub withheld: Vec<WithheldTool>,
    /// How many prompts it contributes.
    pub prompt_count: u32,
    /// Prompts it lists whose definitions are not approved, sorted by name.
    pub withheld_prompts: Vec<prompts::WithheldPrompt>,
    /// Why its prompts are refused while its tools are not (a failed or
    /// oversized `prompts/list`, a name another server claims).
    pub prompts_error: Option<String>,
    /// How many skills it contributes.
    pub skill_count: u32,
    /// Skills it lists whose definitions are not approved, sorted by name.
    pub withheld_skills: Vec<skills::WithheldSkill>,
    /// Why its skills are refused (a failed or invalid `skills/list`, a
    /// name another server claims), or which were left out (two sharing a
    /// name), while its tools are not.
    pub skills_error: Option<String>,
}

/// A tool withheld because its definition is not approved: new, or
/// changed since it was approved.
#[derive(Debug, Clone)]
pub struct WithheldTool {
    /// The tool as it would be exposed (its `definition_hash` is the
    /// current one).
    pub tool: CatalogTool,
    /// The hash approved for this name, when the tool changed since; `None`
    /// for a tool never approved.
    pub approved_hash: Option<String>,
}

/// MCP tool annotations (hints).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotations {
    /// The tool does not modify its environment.
    pub read_only: Option<bool>,
    /// The tool may perform destructive updates.
    pub destructive: Option<bool>,
    /// Calling again with the same arguments has no additional effect.
    pub idempotent: Option<bool>,
    /// The tool interacts with an open world of external entities.
    pub open_world: Option<bool>,
}

/// One exposed tool.
#[derive(Debug, Clone)]
pub struct CatalogTool {
    /// The exposed name, unique within the tenant.
    pub name: String,
    /// The configured name of the server providing it.
    pub server: String,
    /// Index of that server in the tenant's configuration.
    pub server_index: usize,
    /// The tool's name on its server.
    pub upstream_name: String,
    /// The server's description, empty when none.
    pub description: String,
    /// `title`, else `annotations.title`, else empty.
    pub title: String,
    /// Input JSON Schema as JSON text.
    pub input_schema_json: String,
    /// Output JSON Schema as JSON text, empty when none.
    pub output_schema_json: String,
    /// Behaviour hints.
    pub annotations: Annotations,
    /// Stable hash of the definition (hex).
    pub definition_hash: String,
}

impl CatalogTool {
    /// Rough model tokens of the whole definition: one per four bytes of
    /// name, title, description and schemas (the usual rule of thumb for
    /// English text and JSON with BPE tokenizers).
    pub fn estimated_tokens(&self) -> u32 {
        let bytes = self.name.len()
            + self.title.len()
            + self.description.len()
            + self.input_schema_json.len()
            + self.output_schema_json.len();
        u32::try_from(bytes.div_ceil(4)).unwrap_or(u32::MAX)
    }
}

/// An immutable snapshot of one tenant's catalog.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Built on the first search of this snapshot (boxed: most snapshots
    /// are never searched).
    search_index: std::sync::OnceLock<Box<search::Index>>,
    /// Values derived from this snapshot by other layers (the API layer's
    /// wire form, callers' policy views), one per type, each built once per
    /// snapshot rather than per call.
    derived: std::sync::RwLock<Vec<(std::any::TypeId, Arc<DerivedSlot>)>>,
    tools: Vec<CatalogTool>,
    index: HashMap<String, usize>,
    servers: Vec<ServerStatus>,
    /// Exposed names of servers that are down, from their last listing.
    down_routes: HashMap<String, usize>,
    /// Whether each server (by index) namespaces its tools (`server__tool`:
    /// not `bare`).
    namespaced: Box<[bool]>,
    version: String,
    /// Every exposed prompt, sorted by name.
    prompts: Vec<prompts::CatalogPrompt>,
    /// Exposed prompt name → position in `prompts`.
    prompt_index: HashMap<String, usize>,
    /// The content-derived version of the prompts.
    prompts_version: String,
    /// Every exposed skill, sorted by name.
    skills: Vec<skills::CatalogSkill>,
    /// Exposed skill name → position in `skills`.
    skill_index: HashMap<String, usize>,
    /// The content-derived version of the skills.
    skills_version: String,
    /// Which tenant object built the snapshot (its server indices index
    /// that object's servers); 0 for none.
    stamp: u64,
}

/// The exposed tools one listing of a server gives (schemas serialised,
/// definitions hashed and checked against the limits), or why the server
/// is refused on its own account. A catalog is assembled from these parts;
/// the registry keeps each server's part with its listing, so a rebuild
/// (another server connects, fails or is reloaded) does not re-serialise
/// the servers whose listing did not change.
pub type ServerPart = Arc<Result<Vec<CatalogTool>, String>>;

impl Catalog {
    /// The snapshot, marked as built by the registry object with `stamp`.
    pub fn with_stamp(mut self, stamp: u64) -> Catalog {
        self.stamp = stamp;
        self
    }

    /// The stamp of the registry object that built the snapshot (0 when
    /// none): server indices of its tools index that object's servers.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// For a name not in the catalog: the server it would belong to, when
    /// that server is configured but not connected (it listed the name when
    /// last connected, or the name is in its `server__` namespace). Calls to
    /// such names are UNAVAILABLE, not NOT_FOUND.
    pub fn down_server_for(&self, name: &str) -> Option<&ServerStatus> {
        let index = self.down_routes.get(name).copied().or_else(|| {
            let (namespace, _) = name.split_once(names::DELIMITER)?;
            // Few servers per tenant: a scan, not a map per snapshot.
            self.servers
                .iter()
                .zip(self.namespaced.iter())
                .position(|(server, &namespaced)| namespaced && server.name == namespace)
        })?;
        let status = &self.servers[index];
        matches!(
            status.state,
            ServerState::Failed(_)
                | ServerState::Connecting
                | ServerState::AuthorizationRequired(_)
        )
        .then_some(status)
    }

    /// The value of type `T` that `build` derives from this snapshot,
    /// built on first use and shared afterwards (the API layer keeps its
    /// wire form here, so a snapshot is converted once, not per call). One
    /// value per type: the first `build` of a type is the one kept.
    pub fn derived<T: Send + Sync + 'static>(&self, build: impl FnOnce(&Catalog) -> T) -> Arc<T> {
        let id = std::any::TypeId::of::<T>();
        let found = self
            .derived
            .read()
            .expect("derived lock")
            .iter()
            .find(|(t, _)| *t == id)
            .map(|(_, slot)| slot.clone());
        let slot = match found {
            Some(slot) => slot,
            None => {
                let mut slots = self.derived.write().expect("derived lock");
                match slots.iter().find(|(t, _)| *t == id) {
                    Some((_, slot)) => slot.clone(),
                    None => {
                        let slot = Arc::new(DerivedSlot::default());
                        slots.push((id, slot.clone()));
                        slot
                    }
                }
            }
        };
        // Built outside the lock: other types are not held up meanwhile.
        let stored = slot.get_or_init(|| Arc::new(build(self)));
        stored
            .clone()
            .downcast::<T>()
            .expect("a slot holds the type it is keyed by")
    }

    /// The tools matching a natural-language `query`, most relevant first,
    /// with their BM25 scores.
    pub fn search(&self, query: &str) -> Vec<(&CatalogTool, f32)> {
        self.search_index
            .get_or_init(|| Box::new(search::Index::new(&self.tools)))
            .search(query)
            .into_iter()
            .filter_map(|(i, score)| self.tools.get(i).map(|t| (t, score)))
            .collect()
    }

    /// Every exposed tool, sorted by name.
    pub fn tools(&self) -> &[CatalogTool] {
        &self.tools
    }

    /// The tool exposed as `name`, if any.
    pub fn get(&self, name: &str) -> Option<&CatalogTool> {
        self.index.get(name).map(|&i| &self.tools[i])
    }

    /// The position of the tool exposed as `name` in [`Catalog::tools`].
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Each configured server's state, in configuration order.
    pub fn servers(&self) -> &[ServerStatus] {
        &self.servers
    }

    /// The tool exposed as `name` would be, were its definition approved:
    /// with the server that lists it.
    pub fn withheld(&self, name: &str) -> Option<(&ServerStatus, &WithheldTool)> {
        self.servers.iter().find_map(|server| {
            server
                .withheld
                .iter()
                .find(|w| w.tool.name == name)
                .map(|w| (server, w))
        })
    }

    /// Whether any server is still connecting.
    pub fn is_settling(&self) -> bool {
        self.servers
            .iter()
            .any(|s| s.state == ServerState::Connecting)
    }

    /// The content-derived version: changes exactly when a tool is added,
    /// removed or changed.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Every exposed prompt, sorted by name.
    pub fn prompts(&self) -> &[prompts::CatalogPrompt] {
        &self.prompts
    }

    /// The prompt exposed as `name`, if any.
    pub fn prompt(&self, name: &str) -> Option<&prompts::CatalogPrompt> {
        self.prompt_index.get(name).map(|&i| &self.prompts[i])
    }

    /// The position of the prompt exposed as `name` in
    /// [`Catalog::prompts`].
    pub fn prompt_position(&self, name: &str) -> Option<usize> {
        self.prompt_index.get(name).copied()
    }

    /// The content-derived version of the prompts: changes exactly when a
    /// prompt is added, removed or changed.
    pub fn prompts_version(&self) -> &str {
        &self.prompts_version
    }
}

/// A shared, immutable catalog snapshot.
pub type SharedCatalog = Arc<Catalog>;

/// One derived value of a snapshot, set once.
type DerivedSlot = std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>;
