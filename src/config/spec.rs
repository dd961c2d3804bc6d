//! One tenant on its own: a file of `tenants_dir` or a spec written
//! through the admin API, in the schema of one `tenants[]` entry. Parsed
//! ([`TenantSpec::parse`]), asked which stored secrets it reads
//! ([`TenantSpec::stored_references`]), then validated against the file
//! configuration it joins ([`crate::config::Config::validate_tenant`]) with
//! the same checks and messages as a tenant of the file, its errors at
//! `tenants[NAME]...`.

use std::collections::BTreeSet;
use std::path::Path;

use super::fields::Errors;
use super::raw::{RawTenant, RawValue};
use super::sources::{AdminScope, HostSecrets, Sources, StoredSecrets};
use super::{Config, Environment, FieldError, TenantConfig};

/// Largest spec accepted, in bytes.
pub const MAX_SPEC_BYTES: usize = 1 << 20;

/// A tenant spec, parsed but not validated.
#[derive(Debug)]
pub struct TenantSpec {
    raw: RawTenant,
}

/// Where a spec comes from: what it may reach.
#[derive(Clone, Copy)]
pub enum SpecSource<'a> {
    /// A file of `tenants_dir`: like a tenant of the configuration file
    /// (`env:` and `file:`, relative to the file's directory).
    Dir {
        /// The file.
        file: &'a Path,
    },
    /// The state store, written through the admin API: literals and its
    /// own stored secrets; the host's variables and files only as
    /// `admin.host_secrets` lists; `command` servers only with
    /// `admin.allow_stdio_servers`.
    Store {
        /// The tenant's stored secrets, opened.
        stored: &'a dyn StoredSecrets,
        /// The stored version of the spec.
        version: i64,
    },
}

impl std::fmt::Debug for SpecSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecSource::Dir { file } => f.debug_struct("Dir").field("file", file).finish(),
            SpecSource::Store { version, .. } => {
                f.debug_struct("Store").field("version", version).finish()
            }
        }
    }
}

/// Why a spec was refused: every error, each with its path
/// (`tenants[acme].servers[0].url`). Never contains a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", list(.errors))]
pub struct SpecError {
    /// Every problem found.
    pub errors: Vec<FieldError>,
}

fn list(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl SpecError {
    fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            errors: vec![FieldError {
                path: path.into(),
                message: message.into(),
            }],
        }
    }
}

impl TenantSpec {
    /// Parses `text` (YAML or JSON) as one tenant. `name` is the name the
    /// spec is stored or filed under: a `name:` in the spec must equal it
    /// when both are given; without a `name:` the spec takes it. Errors
    /// name `tenants[NAME]` (or `tenant` when no name is known).
    ///
    /// # Errors
    /// Too large, not YAML, not one tenant's shape, or without a name.
    pub fn parse(text: &str, name: Option<&str>) -> Result<Self, SpecError> {
        let at = |n: Option<&str>| match n {
            Some(n) if super::names::is_valid_tenant_name(n) => format!("tenants[{n}]"),
            _ => "tenant".to_owned(),
        };
        if text.len() > MAX_SPEC_BYTES {
            return Err(SpecError::one(
                at(name),
                format!(
                    "the spec is {} bytes; at most {MAX_SPEC_BYTES} are accepted",
                    text.len()
                ),
            ));
        }
        let mut value: yaml_serde::Value = super::parse::parse_value(text)
            .map_err(|e| SpecError::one(prefixed(&at(name), &e.path), e.message))?;
        let Some(map) = value.as_mapping_mut() else {
            return Err(SpecError::one(
                at(name),
                "a tenant spec is a mapping (`tokens:`, `servers:`, ...)",
            ));
        };
        let key = yaml_serde::Value::String("name".to_owned());
        match (map.get(&key).and_then(|v| v.as_str()), name) {
            (Some(written), Some(name)) if written != name => {
                return Err(SpecError::one(
                    format!("{}.name", at(Some(name))),
                    format!(
                        "the spec names tenant `{}`, but it is written as `{name}`",
                        written.chars().take(64).collect::<String>()
                    ),
                ));
            }
            (None, Some(name)) => {
                map.insert(key, yaml_serde::Value::String(name.to_owned()));
            }
            (None, None) => {
                return Err(SpecError::one(
                    "tenant.name",
                    "a tenant spec needs `name:` (or a name it is written under)",
                ));
            }
            _ => {}
        }
        let written = map
            .get(yaml_serde::Value::String("name".to_owned()))
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let raw: RawTenant = super::parse::from_value(value)
            .map_err(|e| SpecError::one(prefixed(&at(written.as_deref()), &e.path), e.message))?;
        Ok(Self { raw })
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.raw.name
    }

    /// The names of the stored secrets the spec reads (`{stored: NAME}`).
    pub fn stored_references(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut add = |value: &RawValue| {
            if let RawValue::Stored(name) = value {
                names.insert(name.clone());
            }
        };
        self.raw.tokens.iter().for_each(&mut add);
        if let Some(calls) = &self.raw.call_approvals {
            calls.approver_tokens.iter().for_each(|a| add(&a.token));
            if let Some(webhook) = &calls.webhook {
                add(&webhook.secret);
            }
        }
        for server in &self.raw.servers {
            for value in server.env.iter().flat_map(|e| e.values()) {
                add(value);
            }
            for value in server.headers.iter().flat_map(|h| h.values()) {
                add(value);
            }
            if let Some(oauth) = &server.oauth {
                for value in [&oauth.client_id, &oauth.client_secret, &oauth.private_key]
                    .into_iter()
                    .flatten()
                {
                    add(value);
                }
            }
        }
        names
    }
}

/// `tenants[acme]` joined with a parser's path inside the spec.
fn prefixed(at: &str, inner: &str) -> String {
    if inner.is_empty() {
        at.to_owned()
    } else {
        format!("{at}.{inner}")
    }
}

impl Config {
    /// Validates one tenant of `tenants_dir` or of the state store against
    /// this configuration (its `defaults:`, `callers.jwt`, `state`, the
    /// consent listener and `admin:`), exactly as a tenant of the file
    /// would be, with errors at `tenants[NAME]...`. Whether its name or
    /// tokens collide with another source's tenants is the registry's to
    /// say.
    ///
    /// # Errors
    /// Every problem found, each with its path.
    pub fn validate_tenant(
        &self,
        spec: TenantSpec,
        source: SpecSource<'_>,
        env: &dyn Environment,
    ) -> Result<TenantConfig, SpecError> {
        let path = format!("tenants[{}]", spec.raw.name);
        let no_hosts = HostSecrets::default();
        let scope;
        let src = match source {
            SpecSource::Dir { file } => Sources::file(file.parent().unwrap_or(Path::new(".")), env),
            SpecSource::Store { stored, .. } => {
                let admin = self.admin.as_ref();
                scope = AdminScope {
                    host: admin.map_or(&no_hosts, |a| &a.host_secrets),
                    stored,
                    allow_stdio: admin.is_some_and(|a| a.allow_stdio_servers),
                };
                Sources {
                    base: Path::new("/"),
                    env,
                    admin: Some(&scope),
                }
            }
        };
        let mut errors = Errors(Vec::new());
        let tenant = super::tenants::validate_one(
            &mut errors,
            &path,
            spec.raw,
            !self.callers.jwt.is_empty() || !self.callers.mtls.is_empty(),
            &self.spec_defaults.0,
            &src,
        );
        if let Some(tenant) = &tenant {
            super::validate::tenant_requirements(
                &mut errors,
                &path,
                tenant,
                &self.state,
                self.oauth.as_ref(),
                self.approvals.as_ref(),
                &self.callers,
            );
            super::guards::references(&mut errors, &path, tenant, &self.guards);
            super::admin::tokens_not_admin(&mut errors, &path, tenant, self.admin.as_ref());
        }
        match tenant {
            Some(mut tenant) if errors.0.is_empty() => {
                tenant.origin = match source {
                    SpecSource::Dir { file } => super::TenantOrigin::Dir(file.to_owned()),
                    SpecSource::Store { version, .. } => super::TenantOrigin::Store { version },
                };
                // The operator did not write this tenant: its servers
                // reach public addresses and what `upstream_allow` allows.
                for server in &mut tenant.servers {
                    if let super::Transport::Http { reach, .. } = &mut server.transport {
                        *reach = super::Reach::Restricted(self.upstream_allow.clone());
                    }
                }
                Ok(tenant)
            }
            _ => Err(SpecError { errors: errors.0 }),
        }
    }
}
