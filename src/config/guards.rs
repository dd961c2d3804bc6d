//! `guards:`: the gRPC guards (`toolgate.guard.v1.GuardService`) a tenant
//! or a server references by name (`tenants[].guards`,
//! `servers[].guards`), each asked about a call's request and its answer
//! ([guards.md](../../docs/guards.md)). The raw block, its validation and
//! the domain types; the references are checked against the list by
//! [`references`].

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use super::fields::{Errors, duration, resolve};
use super::names;
use super::raw::RawValue;
use super::sources::Sources;
use super::{Secret, TenantConfig, TlsTrust};

/// How long toolgate waits for a guard's verdict when `timeout` is unset.
pub const DEFAULT_GUARD_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest `timeout` a guard may have: a guard sits in every call's
/// path.
pub const MAX_GUARD_TIMEOUT: Duration = Duration::from_secs(30);

/// One `guards:` entry, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGuard {
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) timeout: Option<String>,
    pub(crate) failure: Option<String>,
    pub(crate) phases: Option<Vec<String>>,
    pub(crate) token: Option<RawValue>,
    pub(crate) tls: Option<super::tls::RawTls>,
}

/// What a call does when its guard is down, late or answers nonsense.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GuardFailure {
    /// The call fails: `UNAVAILABLE` / `GUARD_UNAVAILABLE` (nothing is
    /// sent upstream in the request phase; the result is withheld in the
    /// response phase). The default.
    #[default]
    Closed,
    /// The call goes on as if the guard had allowed it; counted
    /// (`toolgate_guard_checks_total{verdict="failed_open"}`) and logged.
    Open,
}

impl std::fmt::Display for GuardFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GuardFailure::Closed => "closed",
            GuardFailure::Open => "open",
        })
    }
}

/// Which phases of a call a guard is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GuardPhases {
    /// Before the request goes upstream (arguments).
    pub request: bool,
    /// Before the answer goes back (the result).
    pub response: bool,
}

impl Default for GuardPhases {
    fn default() -> Self {
        Self {
            request: true,
            response: true,
        }
    }
}

/// One guard (`guards[]`).
#[derive(Debug, Clone)]
pub struct GuardConfig {
    /// The name tenants and servers reference it by (sent to the guard in
    /// `CheckRequest.guard`).
    pub name: String,
    /// The guard's gRPC endpoint: `http://host:port` (h2c) or
    /// `https://host:port`.
    pub url: url::Url,
    /// The deadline of each `Check`.
    pub timeout: Duration,
    /// What a call does when the guard fails.
    pub failure: GuardFailure,
    /// The phases it is asked about.
    pub phases: GuardPhases,
    /// Sent as `authorization: Bearer <token>` on every `Check`, when set.
    pub token: Option<Secret>,
    /// The CAs an `https://` guard's certificate must chain to (the
    /// system's roots when unset).
    pub tls: Option<TlsTrust>,
}

/// Validates `guards:`: names unique and valid, each URL an http(s) URL
/// with a host, timeouts within [`MAX_GUARD_TIMEOUT`].
pub(super) fn guards(
    errors: &mut Errors,
    raw: Vec<RawGuard>,
    src: &Sources<'_>,
) -> Vec<GuardConfig> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for (index, guard) in raw.into_iter().enumerate() {
        let path = format!("guards[{index}]");
        if let Some(first) = seen.insert(guard.name.clone(), index) {
            errors.push(
                format!("{path}.name"),
                format!(
                    "duplicate guard name `{}` (also guards[{first}])",
                    guard.name
                ),
            );
        }
        if let Some(guard) = validate_guard(errors, &path, guard, src) {
            out.push(guard);
        }
    }
    out
}

/// Validates one guard; `None` when anything in it is refused.
fn validate_guard(
    errors: &mut Errors,
    path: &str,
    raw: RawGuard,
    src: &Sources<'_>,
) -> Option<GuardConfig> {
    let before = errors.0.len();
    if !names::is_valid_tenant_name(&raw.name) {
        errors.push(
            format!("{path}.name"),
            format!(
                "`{}` is not a valid guard name (1 to 64 of a-z A-Z 0-9 . _ -)",
                raw.name
            ),
        );
    }
    let url = match url::Url::parse(&raw.url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Some(url),
        _ => {
            errors.push(
                format!("{path}.url"),
                format!(
                    "`{}` is not an http(s) URL with a host (the guard's gRPC endpoint, e.g. http://127.0.0.1:7000)",
                    raw.url
                ),
            );
            None
        }
    };
    let timeout = duration(
        errors,
        &format!("{path}.timeout"),
        raw.timeout.as_deref(),
        DEFAULT_GUARD_TIMEOUT,
    );
    if timeout > MAX_GUARD_TIMEOUT {
        errors.push(
            format!("{path}.timeout"),
            "at most 30s (a guard sits in every call's path)",
        );
    }
    let failure = match raw.failure.as_deref() {
        None | Some("closed") => GuardFailure::Closed,
        Some("open") => GuardFailure::Open,
        Some(other) => {
            errors.push(
                format!("{path}.failure"),
                format!("`{other}` is not closed or open"),
            );
            GuardFailure::Closed
        }
    };
    let phases = match raw.phases {
        None => GuardPhases::default(),
        Some(list) => {
            let mut phases = GuardPhases {
                request: false,
                response: false,
            };
            for (i, phase) in list.iter().enumerate() {
                match phase.as_str() {
                    "request" => phases.request = true,
                    "response" => phases.response = true,
                    other => errors.push(
                        format!("{path}.phases[{i}]"),
                        format!("`{other}` is not request or response"),
                    ),
                }
            }
            if list.is_empty() {
                errors.push(
                    format!("{path}.phases"),
                    "names no phase: give request, response or both (or leave it out for both)",
                );
            }
            phases
        }
    };
    let token = raw
        .token
        .and_then(|value| resolve(errors, &format!("{path}.token"), &value, src));
    let tls = raw
        .tls
        .and_then(|tls| super::tls::server_tls(errors, path, tls, url.as_ref(), false, src));
    if errors.0.len() != before {
        return None;
    }
    Some(GuardConfig {
        name: raw.name,
        url: url?,
        timeout,
        failure,
        phases,
        token,
        tls,
    })
}

/// Checks that every guard a tenant or its servers reference is in
/// `guards`, naming the reference (`{path}.guards[i]` and
/// `{path}.servers[s].guards[i]`).
pub(super) fn references(
    errors: &mut Errors,
    path: &str,
    tenant: &TenantConfig,
    guards: &[GuardConfig],
) {
    let known = |name: &str| guards.iter().any(|g| g.name == name);
    let mut check = |at: String, names: &[String]| {
        for (i, name) in names.iter().enumerate() {
            if !known(name) {
                errors.push(
                    format!("{at}.guards[{i}]"),
                    format!("`{name}` is not a guard: add it under the top-level `guards:`"),
                );
            } else if names[..i].contains(name) {
                errors.push(
                    format!("{at}.guards[{i}]"),
                    format!("`{name}` is listed twice"),
                );
            }
        }
    };
    check(path.to_owned(), &tenant.guards);
    for (s, server) in tenant.servers.iter().enumerate() {
        check(format!("{path}.servers[{s}]"), &server.guards);
    }
}
