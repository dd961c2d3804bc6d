//! The configuration file as written: serde types that mirror the YAML
//! exactly, with unknown keys refused. [`super::validate`] turns them into
//! the domain types.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub(crate) listen: Option<String>,
    pub(crate) shutdown_delay: Option<String>,
    pub(crate) shutdown_grace: Option<String>,
    pub(crate) reflection: Option<bool>,
    pub(crate) log_format: Option<super::LogFormat>,
    pub(crate) metrics: Option<RawMetrics>,
    pub(crate) grpc: Option<RawGrpc>,
    pub(crate) limits: Option<RawLimits>,
    pub(crate) sessions: Option<RawSessions>,
    pub(crate) defaults: Option<RawDefaults>,
    pub(crate) state: Option<RawState>,
    pub(crate) oauth: Option<RawOAuth>,
    pub(crate) approvals: Option<super::approvals::RawApprovals>,
    pub(crate) callers: Option<super::callers::RawCallers>,
    pub(crate) audit: Option<super::audit::RawAudit>,
    pub(crate) admin: Option<super::admin::RawAdmin>,
    pub(crate) tenant_store: Option<super::admin::RawTenantStore>,
    pub(crate) tenants_dir: Option<super::admin::RawTenantsDir>,
    #[serde(default)]
    pub(crate) upstream_allow: Vec<String>,
    #[serde(default)]
    pub(crate) guards: Vec<super::guards::RawGuard>,
    #[serde(default)]
    pub(crate) tenants: Vec<RawTenant>,
}

/// Where state shared by replicas is kept (OAuth clients, tokens, pending
/// consents).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawState {
    pub(crate) url: Option<RawValue>,
    #[serde(default)]
    pub(crate) keys: Vec<RawValue>,
}

/// The OAuth consent listener and gateway-wide OAuth settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOAuth {
    pub(crate) listen: Option<String>,
    pub(crate) public_url: Option<String>,
    #[serde(default)]
    pub(crate) allow_private_addresses: bool,
    pub(crate) tls: Option<super::listener_tls::RawListenerTls>,
}

/// An HTTP server's OAuth 2.1 client settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServerOAuth {
    pub(crate) grant: String,
    pub(crate) client_id: Option<RawValue>,
    pub(crate) client_secret: Option<RawValue>,
    pub(crate) private_key: Option<RawValue>,
    pub(crate) token_endpoint_auth: Option<String>,
    #[serde(default)]
    pub(crate) scopes: Vec<String>,
    pub(crate) token_endpoint: Option<String>,
    pub(crate) audience: Option<String>,
    pub(crate) subject_token_type: Option<String>,
    pub(crate) subject_issuers: Option<Vec<String>>,
    pub(crate) identity_provider: Option<RawIdentityProvider>,
}

/// The enterprise IdP of `grant: identity_assertion`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIdentityProvider {
    pub(crate) issuer: String,
    pub(crate) token_endpoint: Option<String>,
    pub(crate) client_id: RawValue,
    pub(crate) client_secret: Option<RawValue>,
}

/// The Prometheus metrics listener.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    pub(crate) listen: String,
    pub(crate) tls: Option<super::listener_tls::RawListenerTls>,
}

/// gRPC server transport settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGrpc {
    pub(crate) keepalive_interval: Option<String>,
    pub(crate) keepalive_timeout: Option<String>,
    pub(crate) tcp_keepalive: Option<String>,
    pub(crate) max_concurrent_streams: Option<u32>,
    pub(crate) mcp_transport: Option<bool>,
    pub(crate) tls: Option<super::listener_tls::RawListenerTls>,
}

/// Gateway-wide size and shape limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub(crate) max_argument_bytes: Option<usize>,
    pub(crate) max_result_bytes: Option<usize>,
    pub(crate) max_message_bytes: Option<usize>,
    pub(crate) max_tools_per_server: Option<usize>,
    pub(crate) max_schema_bytes: Option<usize>,
    pub(crate) max_schema_depth: Option<usize>,
    pub(crate) max_description_chars: Option<usize>,
    pub(crate) max_prompts_per_server: Option<usize>,
    pub(crate) max_resources_per_server: Option<usize>,
    pub(crate) max_resource_list_bytes: Option<usize>,
    pub(crate) max_watches: Option<usize>,
    pub(crate) max_cache_entries: Option<usize>,
    pub(crate) max_cache_bytes: Option<usize>,
}

/// Replica-wide session settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSessions {
    pub(crate) max_live: Option<usize>,
}

/// Per-tenant call limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenantLimits {
    pub(crate) max_concurrent_calls: Option<usize>,
    pub(crate) queue_timeout: Option<String>,
    pub(crate) rate_per_second: Option<u32>,
    pub(crate) burst: Option<u32>,
    pub(crate) per_subject: Option<RawSubjectLimits>,
}

/// `tenants[].limits.per_subject`: the same limits, for each subject of
/// the tenant.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSubjectLimits {
    pub(crate) max_concurrent_calls: Option<usize>,
    pub(crate) rate_per_second: Option<u32>,
    pub(crate) burst: Option<u32>,
}

/// Reconnect backoff.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReconnect {
    pub(crate) initial_backoff: Option<String>,
    pub(crate) max_backoff: Option<String>,
}

/// Defaults applied to every server unless the server sets its own.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDefaults {
    pub(crate) connect_timeout: Option<String>,
    pub(crate) call_timeout: Option<String>,
    pub(crate) max_call_timeout: Option<String>,
    pub(crate) max_list_pages: Option<u32>,
    pub(crate) reconnect: Option<RawReconnect>,
    pub(crate) max_concurrent_calls: Option<usize>,
    pub(crate) lifecycle: Option<super::Lifecycle>,
    pub(crate) connect: Option<super::ConnectMode>,
    pub(crate) idle_timeout: Option<String>,
    pub(crate) circuit_breaker: Option<RawCircuitBreaker>,
}

/// `circuit_breaker:` (in `defaults` and per server) as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCircuitBreaker {
    pub(crate) enabled: Option<bool>,
    pub(crate) failures: Option<u32>,
    pub(crate) cool_down: Option<String>,
    pub(crate) max_cool_down: Option<String>,
}

/// One tenant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenant {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) tokens: Vec<RawValue>,
    /// Boxed: serde grows a sequence's vector from 4 places, and a server
    /// as written is large, so a one-server tenant would hold room for
    /// four (40 MB while a 10,000-tenant file is read).
    #[serde(default)]
    #[expect(clippy::vec_box, reason = "serde grows the vector to 4 at once")]
    pub(crate) servers: Vec<Box<RawServer>>,
    pub(crate) limits: Option<RawTenantLimits>,
    pub(crate) connect: Option<super::ConnectMode>,
    pub(crate) idle_timeout: Option<String>,
    #[serde(default)]
    pub(crate) policy: Vec<super::policy::RawRule>,
    pub(crate) consent_return_url: Option<String>,
    pub(crate) confirm_consent: Option<bool>,
    #[serde(default)]
    pub(crate) guards: Vec<String>,
    pub(crate) call_approvals: Option<RawCallApprovals>,
    pub(crate) idempotency: Option<RawIdempotency>,
}

/// `tenants[].idempotency` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIdempotency {
    pub(crate) ttl: Option<String>,
    pub(crate) max_keys: Option<u64>,
    pub(crate) max_response_bytes: Option<usize>,
}

/// `tenants[].call_approvals` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCallApprovals {
    #[serde(default)]
    pub(crate) approver_tokens: Vec<RawApproverToken>,
    pub(crate) max_pending_per_subject: Option<u32>,
    pub(crate) webhook: Option<RawWebhook>,
}

/// One `approver_tokens[]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApproverToken {
    pub(crate) name: String,
    pub(crate) token: RawValue,
}

/// `call_approvals.webhook` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWebhook {
    pub(crate) url: String,
    pub(crate) secret: RawValue,
    pub(crate) timeout: Option<String>,
    pub(crate) attempts: Option<u32>,
}

/// One upstream MCP server of a tenant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub(crate) name: String,
    pub(crate) command: Option<Vec<String>>,
    pub(crate) cwd: Option<String>,
    pub(crate) env: Option<BTreeMap<String, RawValue>>,
    pub(crate) url: Option<String>,
    pub(crate) headers: Option<BTreeMap<String, RawValue>>,
    pub(crate) tls: Option<super::tls::RawTls>,
    pub(crate) tools: Option<RawToolFilter>,
    #[serde(default)]
    pub(crate) bare: bool,
    pub(crate) connect_timeout: Option<String>,
    pub(crate) call_timeout: Option<String>,
    pub(crate) max_list_pages: Option<u32>,
    pub(crate) tool_timeouts: Option<BTreeMap<String, String>>,
    pub(crate) overrides: Option<BTreeMap<String, RawOverride>>,
    pub(crate) reconnect: Option<RawReconnect>,
    pub(crate) max_concurrent_calls: Option<usize>,
    pub(crate) lifecycle: Option<super::Lifecycle>,
    pub(crate) redact_results: Option<bool>,
    pub(crate) cache_results: Option<bool>,
    pub(crate) oauth: Option<RawServerOAuth>,
    pub(crate) definitions: Option<super::Definitions>,
    pub(crate) input: Option<super::input::RawInput>,
    pub(crate) roots: Option<Vec<super::input::RawRoot>>,
    #[serde(default)]
    pub(crate) guards: Vec<String>,
    pub(crate) circuit_breaker: Option<RawCircuitBreaker>,
}

/// An operator's override of one tool's definition.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOverride {
    pub(crate) description: Option<String>,
    pub(crate) title: Option<String>,
    #[serde(default)]
    pub(crate) hide_defaults: bool,
}

/// Allow and deny globs over a server's own tool names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawToolFilter {
    pub(crate) allow: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) deny: Vec<String>,
}

/// A literal string, or a secret source `{env: VAR}` / `{file: PATH}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawValue {
    Literal(String),
    Env(String),
    File(String),
    /// `{stored: NAME}`: a secret written through the admin API.
    Stored(String),
}

impl<'de> Deserialize<'de> for RawValue {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawValueVisitor)
    }
}

struct RawValueVisitor;

impl<'de> Visitor<'de> for RawValueVisitor {
    type Value = RawValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, {env: VARIABLE}, {file: PATH} or {stored: NAME}")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawValue, E> {
        Ok(RawValue::Literal(v.to_owned()))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawValue, E> {
        Ok(RawValue::Literal(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawValue, E> {
        Ok(RawValue::Literal(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawValue, E> {
        Ok(RawValue::Literal(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawValue, E> {
        Ok(RawValue::Literal(v.to_string()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawValue, A::Error> {
        let mut found: Option<RawValue> = None;
        while let Some(key) = map.next_key::<String>()? {
            // The key is checked before the value is read. A key that is
            // not a plain word may be a value written in the wrong place
            // (`{ Bearer s3cret }` is a map in YAML): it is not echoed.
            let parsed: fn(String) -> RawValue = match key.as_str() {
                "env" => RawValue::Env,
                "file" => RawValue::File,
                "stored" => RawValue::Stored,
                other if is_word(other) => {
                    return Err(de::Error::unknown_field(other, &["env", "file", "stored"]));
                }
                _ => {
                    return Err(de::Error::custom(
                        "a secret source takes `env`, `file` or `stored`; \
                         this one has another key (not shown)",
                    ));
                }
            };
            let parsed = parsed(map.next_value()?);
            if found.is_some() {
                return Err(de::Error::custom(
                    "a secret source takes exactly one of `env`, `file` or `stored`",
                ));
            }
            found = Some(parsed);
        }
        found.ok_or_else(|| de::Error::custom("a secret source needs `env`, `file` or `stored`"))
    }
}

/// A short key of lowercase letters such as `vault` or `secret_ref`: a
/// key name, safe to show in an error. Anything else (digits, capitals,
/// length) may be a credential.
fn is_word(key: &str) -> bool {
    (1..=16).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}
