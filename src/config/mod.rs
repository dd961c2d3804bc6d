//! Configuration: the YAML file parsed into [`raw`] serde types, then
//! validated into the domain types below. Every error names the path of the
//! field at fault (`tenants[0].servers[1].url: ...`).

pub mod address;
mod admin;
mod approvals;
mod audit;
mod breaker;
mod call_approvals;
mod callers;
mod fields;
mod guards;
mod idempotency;
mod input;
mod listener_tls;
pub mod names;
mod oauth;
mod parse;
pub mod policy;
mod raw;
pub mod secret;
mod servers;
mod sources;
mod spec;
mod tenants;
mod tls;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use admin::{
    AdminConfig, DEFAULT_ADMIN_WRITE_BURST, DEFAULT_ADMIN_WRITE_RATE, DEFAULT_MAX_LOADED_TENANTS,
    DEFAULT_TENANT_POLL_INTERVAL, DEFAULT_TENANT_RESYNC_INTERVAL,
    DEFAULT_TENANTS_DIR_POLL_INTERVAL, TenantStoreSettings, TenantsDir,
};
pub use approvals::{ApprovalsConfig, Definitions};
pub use audit::{AuditArguments, AuditConfig, AuditDestination, DEFAULT_AUDIT_QUEUE};
pub use breaker::{
    CircuitBreaker, DEFAULT_CIRCUIT_COOL_DOWN, DEFAULT_CIRCUIT_FAILURES,
    DEFAULT_CIRCUIT_MAX_COOL_DOWN,
};
pub use call_approvals::{
    ApproverToken, CallApprovalsConfig, DEFAULT_MAX_PENDING_PER_SUBJECT, DEFAULT_WEBHOOK_ATTEMPTS,
    DEFAULT_WEBHOOK_TIMEOUT, MAX_PENDING_PER_SUBJECT_LIMIT, MAX_WEBHOOK_ATTEMPTS,
    MIN_WEBHOOK_SECRET_BYTES, WebhookConfig,
};
pub use callers::{
    CallersConfig, ClaimExpression, DEFAULT_ALGORITHMS, DEFAULT_CERT_SUBJECT_EXPRESSION,
    DEFAULT_CLOCK_SKEW, DEFAULT_JWKS_MIN_REFRESH_INTERVAL, DEFAULT_JWKS_REFRESH_INTERVAL,
    DEFAULT_SUBJECT_EXPRESSION, JwksSource, JwtIssuer, MAX_CLOCK_SKEW, MtlsCaller,
};
pub use guards::{
    DEFAULT_GUARD_TIMEOUT, GuardConfig, GuardFailure, GuardPhases, MAX_GUARD_TIMEOUT,
};
pub use idempotency::{
    DEFAULT_KEY_TTL, DEFAULT_MAX_KEYS, DEFAULT_MAX_RESPONSE_BYTES, IdempotencyConfig,
};
pub use input::{InputConfig, Root};
pub use listener_tls::{
    ClientAuth, DEFAULT_CLIENT_HELLO_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_HANDSHAKES,
    DEFAULT_MAX_HANDSHAKES_PER_PEER, HandshakeLimits, ListenerTls, LoadedTls, TlsFileError,
};
pub use oauth::{
    DEFAULT_STATE_URL, Grant, IdentityProvider, OAuthListener, ServerOAuth, StateConfig,
    SubjectTokenType, TokenEndpointAuth, client_name,
};
pub use secret::{Environment, ProcessEnv, Secret, SourceError, ValueSource};
pub use sources::{HostSecrets, StoredSecrets};
pub use spec::{MAX_SPEC_BYTES, SpecError, SpecSource, TenantSpec};
pub use tls::TlsTrust;
#[cfg(test)]
pub(crate) use tls::test_certs;

/// The default gRPC listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// How long new calls are still served after a shutdown signal (while
/// load balancers withdraw the endpoint), by default.
pub const DEFAULT_SHUTDOWN_DELAY: Duration = Duration::from_secs(5);
/// How long in-flight calls may run after shutdown starts, by default.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// How long a session may take to start and list its tools, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Upstream timeout of a call whose caller set no deadline, by default.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Upper bound on any call's upstream timeout, by default.
pub const DEFAULT_MAX_CALL_TIMEOUT: Duration = Duration::from_secs(600);
/// Pages of `tools/list` read from one server before giving up, by default.
pub const DEFAULT_MAX_LIST_PAGES: u32 = 100;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The validated gateway configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address of the gRPC listener.
    pub listen: SocketAddr,
    /// How long new calls are still served after a shutdown signal, with
    /// health already NOT_SERVING.
    pub shutdown_delay: Duration,
    /// Bound on how long in-flight calls may finish once the server stops
    /// taking new calls.
    pub shutdown_grace: Duration,
    /// Serve gRPC server reflection (v1 and v1alpha).
    pub reflection: bool,
    /// Log format, unless the command line says otherwise.
    pub log_format: Option<LogFormat>,
    /// Address of the Prometheus metrics listener; no metrics listener when
    /// unset.
    pub metrics_listen: Option<SocketAddr>,
    /// TLS on the metrics listener (`metrics.tls`); plaintext when unset.
    pub metrics_tls: Option<ListenerTls>,
    /// gRPC transport settings.
    pub grpc: GrpcSettings,
    /// Size and shape limits.
    pub limits: Limits,
    /// Most sessions live at once in this replica; lazy tenants used least
    /// recently are closed to make room. Unlimited when unset.
    pub max_live_sessions: Option<usize>,
    /// Where OAuth clients, tokens and pending consents are kept.
    pub state: StateConfig,
    /// The OAuth consent listener, when configured.
    pub oauth: Option<OAuthListener>,
    /// The approvals file of servers with `definitions: approved`, when
    /// configured.
    pub approvals: Option<ApprovalsConfig>,
    /// Callers with workload identity (`callers.jwt`), besides the
    /// tenants' static tokens.
    pub callers: CallersConfig,
    /// The audit trail (`audit:`), when configured.
    pub audit: Option<AuditConfig>,
    /// Every tenant of the file, in file order.
    pub tenants: Vec<TenantConfig>,
    /// The guards (`guards:`) tenants and servers reference by name.
    pub guards: Vec<GuardConfig>,
    /// The directory of one-tenant files (`tenants_dir`), when configured.
    pub tenants_dir: Option<TenantsDir>,
    /// `upstream_allow`: what the `url` servers of tenants of `tenants_dir`
    /// and of the admin API may reach besides public addresses (their
    /// servers' [`Reach::Restricted`]).
    pub upstream_allow: std::sync::Arc<address::UpstreamAllow>,
    /// The admin API (`admin:`), when configured.
    pub admin: Option<AdminConfig>,
    /// How the tenants of the state store are followed: `Some` when
    /// `admin:` or `tenant_store:` is configured (then the state store
    /// holds tenants), `None` otherwise.
    pub tenant_store: Option<TenantStoreSettings>,
    /// `defaults:`, kept to validate the tenants of other sources
    /// ([`Config::validate_tenant`]).
    spec_defaults: SpecDefaults,
}

/// `defaults:` as validated, for the tenants of other sources. Its
/// `Debug` is opaque: what it holds shows in every tenant it applied to.
#[derive(Clone)]
struct SpecDefaults(std::sync::Arc<servers::Defaults>);

impl std::fmt::Debug for SpecDefaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpecDefaults")
    }
}

/// Gateway-wide size and shape limits. Over a size limit a call gets
/// RESOURCE_EXHAUSTED naming the limit; a server whose listing breaks a
/// shape limit is refused, naming the tool and the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest `arguments_json` accepted.
    pub max_argument_bytes: usize,
    /// Largest upstream tool result accepted (the MCP transport's cap).
    pub max_result_bytes: usize,
    /// Largest gRPC message received or sent.
    pub max_message_bytes: usize,
    /// Most tools one server may list.
    pub max_tools_per_server: usize,
    /// Largest input or output schema of one tool, as JSON text.
    pub max_schema_bytes: usize,
    /// Deepest nesting of a tool's schema.
    pub max_schema_depth: usize,
    /// Longest tool description, in characters.
    pub max_description_chars: usize,
    /// Most prompts one server may list (and most skills).
    pub max_prompts_per_server: usize,
    /// Most resources and resource templates one server may list.
    pub max_resources_per_server: usize,
    /// Largest resource list of one server kept in memory (the bytes of
    /// its URIs, names, titles, descriptions and MIME types).
    pub max_resource_list_bytes: usize,
    /// Most `WatchResource` streams one tenant may have open.
    pub max_watches: usize,
    /// Most results one tenant's result cache keeps (least recently used
    /// dropped first).
    pub max_cache_entries: usize,
    /// Most bytes one tenant's result cache keeps (the results as JSON and
    /// their keys; least recently used dropped first). A larger result is
    /// not kept.
    pub max_cache_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_argument_bytes: 1 << 20,
            max_result_bytes: 16 << 20,
            max_message_bytes: 32 << 20,
            max_tools_per_server: 10_000,
            max_schema_bytes: 256 << 10,
            max_schema_depth: 32,
            max_description_chars: 16_384,
            max_prompts_per_server: 10_000,
            max_resources_per_server: 10_000,
            max_resource_list_bytes: 8 << 20,
            max_watches: 256,
            max_cache_entries: 1000,
            max_cache_bytes: 16 << 20,
        }
    }
}

/// Per-tenant call limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// Calls of the tenant running at once; beyond, calls wait up to
    /// `queue_timeout`, then get RESOURCE_EXHAUSTED.
    pub max_concurrent_calls: Option<usize>,
    /// How long a call may wait for a concurrency slot.
    pub queue_timeout: Duration,
    /// Sustained calls per second (token bucket), if limited.
    pub rate_per_second: Option<std::num::NonZeroU32>,
    /// Burst size of the rate limit.
    pub burst: Option<std::num::NonZeroU32>,
    /// The same limits for each subject of the tenant
    /// (`limits.per_subject`), on top of the tenant's own.
    pub per_subject: Option<SubjectLimits>,
}

/// `tenants[].limits.per_subject`: limits each subject of a tenant gets
/// on its own, so one looping agent cannot starve its tenant. A subject is
/// keyed as its credentials are ([`crate::callers::Subject::key`]: how the
/// caller authenticated and the id), and counted per replica.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubjectLimits {
    /// Calls of one subject running at once; beyond, calls wait up to the
    /// tenant's `queue_timeout`, then get RESOURCE_EXHAUSTED.
    pub max_concurrent_calls: Option<usize>,
    /// Sustained calls per second of one subject (token bucket).
    pub rate_per_second: Option<std::num::NonZeroU32>,
    /// Burst size of one subject's rate limit.
    pub burst: Option<std::num::NonZeroU32>,
}

/// How a session is established.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lifecycle {
    /// The `initialize` handshake, which every MCP server to date speaks.
    #[default]
    Initialize,
    /// `server/discover` only (the 2026-07-28 revision); fails against
    /// servers that do not speak it.
    Discover,
    /// Try `server/discover`; on any failure, start over on a fresh
    /// connection with `initialize`.
    Auto,
}

/// Reconnect backoff: exponential from `initial` to `max`, with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// The first delay.
    pub initial: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Default for Reconnect {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

/// gRPC server transport settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcSettings {
    /// Interval of HTTP/2 keepalive pings to callers.
    pub keepalive_interval: Duration,
    /// How long to wait for a keepalive ping's answer before closing.
    pub keepalive_timeout: Duration,
    /// TCP keepalive on accepted connections.
    pub tcp_keepalive: Duration,
    /// Concurrent streams per HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// Whether MCP's own gRPC transport (`model_context_protocol.Mcp`) is
    /// served beside `toolgate.v1` (`grpc.mcp_transport`, on by default).
    pub mcp_transport: bool,
    /// TLS on the gRPC port (`grpc.tls`); plaintext when unset.
    pub tls: Option<ListenerTls>,
}

impl Default for GrpcSettings {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            tcp_keepalive: Duration::from_secs(60),
            max_concurrent_streams: 1024,
            mcp_transport: true,
            tls: None,
        }
    }
}

/// One tenant: its caller credentials and its upstream servers.
#[derive(Debug, Clone)]
pub struct TenantConfig {
    /// Unique tenant name (used in logs and metrics, never for routing).
    pub name: String,
    /// Bearer tokens that authenticate callers as this tenant.
    pub tokens: Vec<Secret>,
    /// Upstream servers, in file order.
    pub servers: Vec<ServerConfig>,
    /// Call limits.
    pub limits: TenantLimits,
    /// When the tenant's sessions connect.
    pub connect: ConnectMode,
    /// For lazy tenants: sessions unused this long are closed.
    pub idle_timeout: Duration,
    /// Per-tool policy (`policy:`), checked (the policy room builds the evaluating `Policy`); `None` when the tenant has
    /// no rules (every caller sees and calls every tool).
    pub policy: Option<std::sync::Arc<policy::PolicyRules>>,
    /// How an end user's consent to a per-user server becomes usable.
    pub consent: TenantConsent,
    /// Where the tenant is defined.
    pub origin: TenantOrigin,
    /// The guards (`guards[].name`) asked about every call of the tenant,
    /// in order, before those of the call's server.
    pub guards: Vec<String>,
    /// Call approvals (`call_approvals:`): who approves the calls a
    /// `require_approval` rule holds, and who is told of them.
    pub call_approvals: CallApprovalsConfig,
    /// Idempotency keys of tool calls (`idempotency:`): how long they are
    /// kept, how many, and the largest response kept for a retry.
    pub idempotency: IdempotencyConfig,
}

/// Where a tenant is defined: the sources in the order they win when two
/// define one name (the file over `tenants_dir` over the state store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantOrigin {
    /// `tenants:` of the configuration file.
    File,
    /// A file of `tenants_dir`.
    Dir(PathBuf),
    /// The state store, written through the admin API, at this version.
    Store {
        /// The stored version.
        version: i64,
    },
}

impl std::fmt::Display for TenantOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TenantOrigin::File => f.write_str("the configuration file"),
            TenantOrigin::Dir(path) => write!(f, "tenants_dir file {}", path.display()),
            TenantOrigin::Store { .. } => f.write_str("the state store (admin API)"),
        }
    }
}

impl TenantOrigin {
    /// `file`, `dir` or `store`: the metric label of the source.
    pub fn label(&self) -> &'static str {
        match self {
            TenantOrigin::File => "file",
            TenantOrigin::Dir(_) => "dir",
            TenantOrigin::Store { .. } => "store",
        }
    }
}

/// How an end user's consent to a per-user (`authorization_code`) server
/// becomes usable (`tenants[].confirm_consent`, `consent_return_url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantConsent {
    /// The default: after the code exchange the gateway holds the grant and
    /// sends the browser to this URL with a one-time `code`; the grant is
    /// usable once the tenant's application confirms it for the same
    /// subject (`CompleteAuthorization`). `None` only for a tenant without
    /// per-user servers.
    Confirmed(Option<url::Url>),
    /// `confirm_consent: false`: the grant is usable as soon as the
    /// callback completes, for the subject the link was made for, whoever
    /// opened it (single-user tools and CLIs only).
    Unconfirmed,
}

/// When a tenant's sessions connect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectMode {
    /// At start (and on reload), and kept up.
    #[default]
    Eager,
    /// On the tenant's first call or listing; closed after `idle_timeout`
    /// without use, or when `sessions.max_live` needs room.
    Lazy,
}

/// How long an unused lazy tenant keeps its sessions, by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// One upstream MCP server of a tenant.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The server's name, unique within the tenant; the namespace of its tools.
    pub name: String,
    /// How to reach the server.
    pub transport: Transport,
    /// Which of the server's tools are exposed.
    pub filter: ToolFilter,
    /// Expose the server's own tool names without the `server__` prefix.
    pub bare: bool,
    /// Bound on starting the session and reading the tool list.
    pub connect_timeout: Duration,
    /// Upstream timeout of a call whose caller set no deadline.
    pub call_timeout: Duration,
    /// Upper bound on any call's upstream timeout, caller deadline or not.
    pub max_call_timeout: Duration,
    /// Pages of `tools/list` read before the server is refused.
    pub max_list_pages: u32,
    /// Per-tool overrides of `call_timeout`, by the server's tool name.
    pub tool_timeouts: std::collections::HashMap<String, Duration>,
    /// Reconnect backoff.
    pub reconnect: Reconnect,
    /// Calls to this server running at once (across the tenant), if limited.
    pub max_concurrent_calls: Option<usize>,
    /// How the session is established.
    pub lifecycle: Lifecycle,
    /// Operator overrides of tool definitions, by the server's tool name.
    pub overrides: std::collections::HashMap<String, ToolOverride>,
    /// Replace configured credential values in this server's tool results
    /// with `[redacted]` (on by default).
    pub redact_results: bool,
    /// Keep this server's results that it marks reusable (`ttlMs` above
    /// 0) and answer them again while fresh (on by default; `false`: every
    /// request reaches the server).
    pub cache_results: bool,
    /// OAuth 2.1 client settings, for an HTTP server that needs them
    /// (boxed: most servers have none, and every tenant holds its servers).
    pub oauth: Option<Box<ServerOAuth>>,
    /// Which tool definitions are served: any (the default), or only
    /// approved ones.
    pub definitions: Definitions,
    /// What the server's tools may ask of workers that opt in.
    pub input: InputConfig,
    /// The roots toolgate lists to the server (none by default).
    pub roots: Vec<Root>,
    /// The guards (`guards[].name`) asked about every call to this server,
    /// in order, after the tenant's.
    pub guards: Vec<String>,
    /// The server's circuit breaker (`circuit_breaker`); `None`: switched
    /// off.
    pub circuit_breaker: Option<CircuitBreaker>,
}

/// An operator's override of one tool's definition, applied before the
/// tool is exposed (and so counted in its definition hash).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolOverride {
    /// Replaces the server's description.
    pub description: Option<String>,
    /// Replaces the server's title.
    pub title: Option<String>,
    /// Removes every `default` from the input schema's properties.
    pub hide_defaults: bool,
}

impl ServerConfig {
    /// A digest of everything that shapes the server's session and
    /// catalog, secret values included (they are hashed, never kept): two
    /// configurations with the same fingerprint need no new session.
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(self.name.as_bytes());
        match &self.transport {
            Transport::Stdio { command, cwd, env } => {
                field(b"stdio");
                for part in command {
                    field(part.as_bytes());
                }
                field(
                    cwd.as_ref()
                        .map(|c| c.to_string_lossy().into_owned())
                        .unwrap_or_default()
                        .as_bytes(),
                );
                for (key, value) in env {
                    field(key.as_bytes());
                    field(value.expose().as_bytes());
                }
            }
            Transport::Http {
                url,
                headers,
                tls,
                reach,
            } => {
                field(b"http");
                field(url.as_str().as_bytes());
                for (name, value) in headers {
                    field(name.as_str().as_bytes());
                    field(value.expose().as_bytes());
                }
                if let Some(tls) = tls {
                    field(b"tls");
                    field(&tls.digest());
                }
                // A changed `upstream_allow` reconnects the servers it
                // applies to.
                if let Reach::Restricted(allow) = reach {
                    field(b"restricted");
                    field(allow.to_string().as_bytes());
                }
            }
        }
        let (allow, deny) = &self.filter.patterns;
        field(format!("{allow:?}{deny:?}").as_bytes());
        let mut timeouts: Vec<_> = self.tool_timeouts.iter().collect();
        timeouts.sort();
        let mut overrides: Vec<_> = self.overrides.iter().collect();
        overrides.sort_by(|a, b| a.0.cmp(b.0));
        field(
            format!(
                "{}{:?}{:?}{:?}{}{timeouts:?}{:?}{:?}{:?}{overrides:?}{}",
                self.bare,
                self.connect_timeout,
                self.call_timeout,
                self.max_call_timeout,
                self.max_list_pages,
                self.reconnect,
                self.max_concurrent_calls,
                self.lifecycle,
                self.redact_results,
            )
            .as_bytes(),
        );
        field(format!("definitions{:?}", self.definitions).as_bytes());
        // The slot keeps its configuration: a change must make a new one.
        field(format!("cache_results{}", self.cache_results).as_bytes());
        field(format!("input{:?}roots{:?}", self.input, self.roots).as_bytes());
        field(format!("circuit_breaker{:?}", self.circuit_breaker).as_bytes());
        if let Some(oauth) = &self.oauth {
            field(
                format!(
                    "oauth{:?}{:?}{:?}{:?}",
                    oauth.grant, oauth.client_id, oauth.token_endpoint_auth, oauth.scopes
                )
                .as_bytes(),
            );
            for secret in [&oauth.client_secret, &oauth.private_key]
                .into_iter()
                .flatten()
            {
                field(secret.expose().as_bytes());
            }
        }
        h.finalize().into()
    }

    /// The upstream timeout of a call to `tool` without a caller deadline.
    pub fn timeout_for(&self, tool: &str) -> Duration {
        self.tool_timeouts
            .get(tool)
            .copied()
            .unwrap_or(self.call_timeout)
            .min(self.max_call_timeout)
    }
}

/// How an upstream server is reached.
#[derive(Debug, Clone)]
pub enum Transport {
    /// A child process speaking MCP over stdin/stdout.
    Stdio {
        /// Program and arguments.
        command: Vec<String>,
        /// The child's working directory (the gateway's when unset).
        cwd: Option<PathBuf>,
        /// The child's entire environment: nothing else is inherited.
        env: Vec<(String, Secret)>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The endpoint URL.
        url: url::Url,
        /// Headers sent with every request of this transport.
        headers: Vec<(http::HeaderName, Secret)>,
        /// The CA certificates an `https://` server's certificate must
        /// chain to, instead of the system's roots (`servers[].tls`).
        tls: Option<TlsTrust>,
        /// Which addresses it may be reached at.
        reach: Reach,
    },
}

/// Which addresses a `url` server may be reached at, checked on the
/// addresses its host resolves to when connecting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Reach {
    /// Any: a server of the configuration file (the operator wrote it).
    #[default]
    Any,
    /// Public addresses, and what `upstream_allow` (held here as validated)
    /// allows: a server of a tenant of `tenants_dir` or of the admin API.
    Restricted(std::sync::Arc<address::UpstreamAllow>),
}

impl Transport {
    /// `"stdio"` or `"http"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "http",
        }
    }
}

/// Allow/deny globs over a server's own tool names. A tool is exposed when
/// it matches an allow glob (or no allow list is set) and no deny glob.
#[derive(Debug, Clone, Default)]
pub struct ToolFilter {
    allow: Option<globset::GlobSet>,
    deny: Option<globset::GlobSet>,
    /// The globs as written (allow, deny), to compare configurations.
    patterns: (Option<Vec<String>>, Vec<String>),
}

impl ToolFilter {
    /// Builds a filter from already validated glob sets and the patterns
    /// they were built from.
    pub fn new(
        allow: Option<globset::GlobSet>,
        deny: Option<globset::GlobSet>,
        patterns: (Option<Vec<String>>, Vec<String>),
    ) -> Self {
        Self {
            allow,
            deny,
            patterns,
        }
    }

    /// Whether the server's tool `name` is exposed.
    pub fn allows(&self, name: &str) -> bool {
        let allowed = self.allow.as_ref().is_none_or(|set| set.is_match(name));
        allowed && !self.deny.as_ref().is_some_and(|set| set.is_match(name))
    }
}

/// One problem in the configuration, at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where: `tenants[0].servers[1].url`, or empty for the whole file.
    pub path: String,
    /// What is wrong. Never contains a secret value.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Something valid but risky in the configuration, at a path: printed by
/// `toolgate check` and logged when `serve` starts. Never contains a
/// secret value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldWarning {
    /// Where: `tenants[0].servers[1]`.
    pub path: String,
    /// The tenant the field belongs to.
    pub tenant: String,
    /// The server the field belongs to.
    pub server: String,
    /// What is risky, and why.
    pub message: String,
}

impl std::fmt::Display for FieldWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (tenant `{}`, server `{}`): {}",
            self.path, self.tenant, self.server, self.message
        )
    }
}

/// Whether `url`'s host is on this machine: `localhost`, 127.0.0.0/8 or
/// `::1` (also as `::ffff:127.x.y.z`).
fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => {
            name.trim_end_matches('.').eq_ignore_ascii_case("localhost")
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        None => false,
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid YAML of the expected shape.
    #[error("{file}: {error}")]
    Parse {
        /// The file (or `<inline>`).
        file: String,
        /// The first error, with its path.
        error: FieldError,
    },
    /// The file parsed but its values are invalid.
    #[error("{file}: invalid configuration:\n{}", list(.errors))]
    Invalid {
        /// The file (or `<inline>`).
        file: String,
        /// Every problem found.
        errors: Vec<FieldError>,
    },
}

fn list(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("  - {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl ConfigError {
    /// Every field error, for callers that inspect them.
    pub fn field_errors(&self) -> Vec<FieldError> {
        match self {
            ConfigError::Read { .. } => Vec::new(),
            ConfigError::Parse { error, .. } => vec![error.clone()],
            ConfigError::Invalid { errors, .. } => errors.clone(),
        }
    }
}

impl Config {
    /// Reads and validates the file at `path`. Relative `{file: ...}` and
    /// `cwd` paths are taken relative to the file's directory.
    ///
    /// # Errors
    /// The file cannot be read, does not parse, or fails validation.
    pub fn load(path: &Path, env: &dyn Environment) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::from_yaml(&text, &path.display().to_string(), base, env)
    }

    /// Settings that are valid but risky, each naming its tenant and server.
    /// Two kinds: a server reached over plain `http://` on a host other
    /// than loopback (127.0.0.0/8, `::1`, `localhost`), where its configured
    /// headers (typically credentials), the tool arguments and the results
    /// travel unencrypted; and a tenant with per-user servers and
    /// `confirm_consent: false`, where whoever opens an authorization link
    /// grants their access to the subject it was made for.
    pub fn warnings(&self) -> Vec<FieldWarning> {
        self.collect_warnings()
    }

    /// Logs each of [`Config::warnings`] at WARN ("configuration warning",
    /// with `path`, `tenant`, `server` and `warning` fields): at start and
    /// after each applied reload.
    pub fn log_warnings(&self) {
        for warning in self.warnings() {
            tracing::warn!(
                path = %warning.path,
                tenant = %warning.tenant,
                server = %warning.server,
                warning = %warning.message,
                "configuration warning"
            );
        }
    }

    fn collect_warnings(&self) -> Vec<FieldWarning> {
        let mut warnings = Vec::new();
        for (t, tenant) in self.tenants.iter().enumerate() {
            if tenant.consent == TenantConsent::Unconfirmed
                && let Some(server) = tenant.servers.iter().find(|s| {
                    s.oauth
                        .as_ref()
                        .is_some_and(|o| o.grant == Grant::AuthorizationCode)
                })
            {
                warnings.push(FieldWarning {
                    path: format!("tenants[{t}].confirm_consent"),
                    tenant: tenant.name.clone(),
                    server: server.name.clone(),
                    message: "consents are not confirmed by the application: whoever opens an \
                              authorization link (a forwarded one too) grants their own upstream \
                              account to the subject the link was made for; use only for \
                              single-user tools"
                        .to_owned(),
                });
            }
            for (s, server) in tenant.servers.iter().enumerate() {
                let Transport::Http { url, headers, .. } = &server.transport else {
                    continue;
                };
                if url.scheme() != "http" || is_loopback(url) {
                    continue;
                }
                let exposed = if headers.is_empty() {
                    "tool arguments and results travel unencrypted"
                } else {
                    "configured headers travel unencrypted"
                };
                warnings.push(FieldWarning {
                    path: format!("tenants[{t}].servers[{s}]"),
                    tenant: tenant.name.clone(),
                    server: server.name.clone(),
                    message: format!(
                        "url uses plain http:// to a non-loopback host ({}); {exposed}",
                        url.host_str().unwrap_or_default()
                    ),
                });
            }
        }
        warnings
    }

    /// Parses and validates YAML text. `file` names it in errors; `base` is
    /// the directory relative paths are resolved against.
    ///
    /// # Errors
    /// The text does not parse or fails validation.
    pub fn from_yaml(
        text: &str,
        file: &str,
        base: &Path,
        env: &dyn Environment,
    ) -> Result<Config, ConfigError> {
        let raw = parse::parse(text).map_err(|error| ConfigError::Parse {
            file: file.to_owned(),
            error,
        })?;
        validate::validate(raw, base, env).map_err(|errors| ConfigError::Invalid {
            file: file.to_owned(),
            errors,
        })
    }
}
