//! `admin:`, `tenant_store:` and `tenants_dir`: where tenants come from
//! besides `tenants:`. The admin API's listener and its callers
//! (`admin.tokens`; JWT callers are `callers.jwt[].admin`), what a tenant
//! written through it may reach on the gateway's host
//! (`admin.allow_stdio_servers`, `admin.host_secrets`), how replicas follow
//! the tenants of the state store (`tenant_store`), and the directory of
//! one-tenant files (`tenants_dir`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::fields::{Errors, at_least_one, duration, resolve, socket_addr};
use super::raw::RawValue;
use super::sources::{HostSecrets, Sources};
use super::{Environment, Secret};
use std::num::NonZeroU32;

/// Admin writes (`PutTenant`, `DeleteTenant`, `PutSecret`,
/// `DeleteSecret`) per second one replica takes, all callers together, by
/// default.
pub const DEFAULT_ADMIN_WRITE_RATE: NonZeroU32 = NonZeroU32::new(50).expect("not zero");
/// Admin writes that may come at once after a quiet period, by default.
pub const DEFAULT_ADMIN_WRITE_BURST: NonZeroU32 = NonZeroU32::new(100).expect("not zero");

/// Most store tenants loaded at once in one replica, by default.
pub const DEFAULT_MAX_LOADED_TENANTS: usize = 10_000;
/// How often a replica reads every loaded store tenant's version again,
/// by default (what catches a change notice it missed).
pub const DEFAULT_TENANT_RESYNC_INTERVAL: Duration = Duration::from_secs(30);
/// How often a replica asks the state store for changes when it cannot be
/// notified (SQLite), by default.
pub const DEFAULT_TENANT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often `tenants_dir` is scanned for changed files, by default.
pub const DEFAULT_TENANTS_DIR_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// `admin:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub(crate) listen: String,
    #[serde(default)]
    pub(crate) tokens: Vec<RawValue>,
    #[serde(default)]
    pub(crate) allow_stdio_servers: bool,
    #[serde(default)]
    pub(crate) host_secrets: RawHostSecrets,
    pub(crate) tls: Option<super::listener_tls::RawListenerTls>,
    pub(crate) write_rate_per_second: Option<u32>,
    pub(crate) write_burst: Option<u32>,
}

/// `admin.host_secrets` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHostSecrets {
    #[serde(default)]
    pub(crate) env: Vec<String>,
    #[serde(default)]
    pub(crate) files: Vec<String>,
}

/// `tenant_store:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenantStore {
    pub(crate) max_loaded: Option<usize>,
    pub(crate) resync_interval: Option<String>,
    pub(crate) poll_interval: Option<String>,
}

/// `tenants_dir: {path, poll_interval}` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenantsDir {
    pub(crate) path: String,
    pub(crate) poll_interval: Option<String>,
}

/// The admin API (`admin:`).
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// Its listener, never the workers' port.
    pub listen: SocketAddr,
    /// Bearer tokens of admin callers (kept as digests once loaded).
    pub tokens: Vec<Secret>,
    /// Whether tenants written through the API may have `command` servers.
    pub allow_stdio_servers: bool,
    /// The host's variables and files such tenants may reference.
    pub host_secrets: HostSecrets,
    /// TLS on the admin listener (`admin.tls`); plaintext when unset.
    pub tls: Option<super::ListenerTls>,
    /// Admin writes per second this replica takes, all callers together
    /// (`write_rate_per_second`, default [`DEFAULT_ADMIN_WRITE_RATE`]);
    /// a write over it is `RESOURCE_EXHAUSTED` with `RetryInfo`.
    pub write_rate: NonZeroU32,
    /// Admin writes that may come at once (`write_burst`, default
    /// [`DEFAULT_ADMIN_WRITE_BURST`]).
    pub write_burst: NonZeroU32,
}

/// How replicas follow the tenants of the state store (`tenant_store:`):
/// in force whenever `admin:` or `tenant_store:` is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantStoreSettings {
    /// Most store tenants loaded at once; the least recently used idle one
    /// is evicted to make room.
    pub max_loaded: usize,
    /// How often every loaded tenant's version is read again.
    pub resync_interval: Duration,
    /// How often changes are polled for without PostgreSQL's notices.
    pub poll_interval: Duration,
}

impl Default for TenantStoreSettings {
    fn default() -> Self {
        Self {
            max_loaded: DEFAULT_MAX_LOADED_TENANTS,
            resync_interval: DEFAULT_TENANT_RESYNC_INTERVAL,
            poll_interval: DEFAULT_TENANT_POLL_INTERVAL,
        }
    }
}

/// A directory of one-tenant files (`tenants_dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantsDir {
    /// The directory (relative paths from the configuration file's).
    pub path: PathBuf,
    /// How often it is scanned for added, changed and removed files.
    pub poll_interval: Duration,
}

/// Validates `admin:`.
pub(super) fn admin(
    errors: &mut Errors,
    raw: RawAdmin,
    listen: Option<SocketAddr>,
    base: &Path,
    env: &dyn Environment,
) -> Option<AdminConfig> {
    let before = errors.0.len();
    let addr = socket_addr(errors, "admin.listen", &raw.listen, "127.0.0.1:50052");
    if let Some(addr) = addr
        && listen == Some(addr)
        && addr.port() != 0
    {
        errors.push(
            "admin.listen",
            "must differ from `listen` (the admin API never shares the workers' port)",
        );
    }
    let src = Sources::file(base, env);
    let mut tokens = Vec::with_capacity(raw.tokens.len());
    for (i, value) in raw.tokens.iter().enumerate() {
        let path = format!("admin.tokens[{i}]");
        if let Some(token) = resolve(errors, &path, value, &src) {
            if token.expose().is_empty() {
                errors.push(path, "must not be empty");
            } else {
                tokens.push(token);
            }
        }
    }
    let mut host_secrets = HostSecrets::default();
    for (i, var) in raw.host_secrets.env.into_iter().enumerate() {
        if var.is_empty() || var.contains('=') || var.contains('\0') {
            errors.push(
                format!("admin.host_secrets.env[{i}]"),
                "not a valid environment variable name",
            );
        } else {
            host_secrets.env.insert(var);
        }
    }
    let mut files = BTreeSet::new();
    for (i, file) in raw.host_secrets.files.into_iter().enumerate() {
        let file = PathBuf::from(file);
        if file.is_absolute() {
            files.insert(file);
        } else {
            errors.push(
                format!("admin.host_secrets.files[{i}]"),
                "must be an absolute path (tenants of the admin API name it exactly)",
            );
        }
    }
    host_secrets.files = files;
    let tls = raw
        .tls
        .and_then(|tls| super::listener_tls::listener_tls(errors, "admin", tls, base));
    let write_rate = at_least_one(
        errors,
        "admin.write_rate_per_second",
        raw.write_rate_per_second,
        DEFAULT_ADMIN_WRITE_RATE.get(),
    );
    let write_burst = at_least_one(
        errors,
        "admin.write_burst",
        raw.write_burst,
        DEFAULT_ADMIN_WRITE_BURST.get(),
    );
    (errors.0.len() == before).then(|| AdminConfig {
        listen: addr.expect("checked"),
        tokens,
        allow_stdio_servers: raw.allow_stdio_servers,
        host_secrets,
        tls,
        write_rate: NonZeroU32::new(write_rate).unwrap_or(DEFAULT_ADMIN_WRITE_RATE),
        write_burst: NonZeroU32::new(write_burst).unwrap_or(DEFAULT_ADMIN_WRITE_BURST),
    })
}

/// Refuses a tenant's token or approver token that is also one of
/// `admin.tokens`: the tenant's workers (or approvers) would hold an admin
/// credential.
pub(super) fn tokens_not_admin(
    errors: &mut Errors,
    path: &str,
    tenant: &super::TenantConfig,
    admin: Option<&AdminConfig>,
) {
    let Some(admin) = admin else { return };
    for (i, token) in tenant.tokens.iter().enumerate() {
        if admin.tokens.iter().any(|a| a.expose() == token.expose()) {
            errors.push(
                format!("{path}.tokens[{i}]"),
                "is also one of admin.tokens: a worker's token must never open the admin API \
                 (give the tenant a token of its own)",
            );
        }
    }
    for (i, approver) in tenant.call_approvals.approver_tokens.iter().enumerate() {
        if admin
            .tokens
            .iter()
            .any(|a| a.expose() == approver.token.expose())
        {
            errors.push(
                format!("{path}.call_approvals.approver_tokens[{i}].token"),
                "is also one of admin.tokens: an approver's token must never open the admin API \
                 (give the approver a token of its own)",
            );
        }
    }
}

/// Validates `tenant_store:`.
pub(super) fn tenant_store(errors: &mut Errors, raw: RawTenantStore) -> TenantStoreSettings {
    TenantStoreSettings {
        max_loaded: at_least_one(
            errors,
            "tenant_store.max_loaded",
            raw.max_loaded,
            DEFAULT_MAX_LOADED_TENANTS,
        ),
        resync_interval: duration(
            errors,
            "tenant_store.resync_interval",
            raw.resync_interval.as_deref(),
            DEFAULT_TENANT_RESYNC_INTERVAL,
        ),
        poll_interval: duration(
            errors,
            "tenant_store.poll_interval",
            raw.poll_interval.as_deref(),
            DEFAULT_TENANT_POLL_INTERVAL,
        ),
    }
}

/// Validates `tenants_dir`. The directory need not exist yet (a volume
/// mounted late); a missing one holds no tenants until it appears.
pub(super) fn tenants_dir(
    errors: &mut Errors,
    raw: RawTenantsDir,
    base: &Path,
) -> Option<TenantsDir> {
    let (path, poll) = (raw.path, raw.poll_interval);
    if path.is_empty() {
        errors.push("tenants_dir.path", "needs a path");
        return None;
    }
    let poll_interval = duration(
        errors,
        "tenants_dir.poll_interval",
        poll.as_deref(),
        DEFAULT_TENANTS_DIR_POLL_INTERVAL,
    );
    Some(TenantsDir {
        path: base.join(path),
        poll_interval,
    })
}
