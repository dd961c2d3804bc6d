//! Where a tenant's values may come from. A tenant of the configuration
//! file or of `tenants_dir` reads literals, the gateway's environment
//! (`{env: VAR}`) and files (`{file: PATH}`, relative to its file's
//! directory). A tenant written through the admin API reads literals and
//! its own stored secrets (`{stored: NAME}`); the gateway's environment and
//! files only where the file configuration lists them
//! (`admin.host_secrets`), and it starts no program unless
//! `admin.allow_stdio_servers` is set: an admin caller must not be able to
//! send the host's variables or files to a server it names, or run a
//! program on the host.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::fields::Errors;
use super::{Environment, Secret};

/// The secrets stored for one tenant in the state store, opened, by name:
/// what `{stored: NAME}` reads.
pub trait StoredSecrets: Send + Sync {
    /// The value stored under `name`, if any.
    fn stored(&self, name: &str) -> Option<Secret>;
}

impl<S: std::hash::BuildHasher + Send + Sync> StoredSecrets for HashMap<String, Secret, S> {
    fn stored(&self, name: &str) -> Option<Secret> {
        self.get(name).cloned()
    }
}

/// The host's variables and files a tenant written through the admin API
/// may reference (`admin.host_secrets`); nothing by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSecrets {
    /// Environment variables (`{env: VAR}`) allowed.
    pub env: BTreeSet<String>,
    /// Absolute paths allowed as `{file: PATH}` and as `servers[].tls.ca_file`.
    pub files: BTreeSet<PathBuf>,
}

/// What a tenant written through the admin API may reach.
pub(super) struct AdminScope<'a> {
    pub(super) host: &'a HostSecrets,
    pub(super) stored: &'a dyn StoredSecrets,
    pub(super) allow_stdio: bool,
}

/// Where the values of the tenant being validated come from.
#[derive(Clone, Copy)]
pub(super) struct Sources<'a> {
    /// The directory relative paths are taken from.
    pub(super) base: &'a Path,
    /// The gateway's environment.
    pub(super) env: &'a dyn Environment,
    /// Set for a tenant written through the admin API.
    pub(super) admin: Option<&'a AdminScope<'a>>,
}

impl<'a> Sources<'a> {
    /// A file's sources: its directory and the gateway's environment.
    pub(super) fn file(base: &'a Path, env: &'a dyn Environment) -> Self {
        Self {
            base,
            env,
            admin: None,
        }
    }

    /// A host path named at `path` (a `{file:}`, a `tls.ca_file`, a
    /// `cwd`): relative to the base for files; for a tenant of the admin
    /// API only an absolute path that `admin.host_secrets.files` lists.
    pub(super) fn host_path(&self, errors: &mut Errors, path: &str, file: &str) -> Option<PathBuf> {
        let Some(admin) = self.admin else {
            return Some(self.base.join(file));
        };
        let file = PathBuf::from(file);
        if file.is_absolute() && admin.host.files.contains(&file) {
            return Some(file);
        }
        errors.push(
            path,
            "a tenant written through the admin API may name a file of the gateway's host only \
             when admin.host_secrets.files lists its absolute path",
        );
        None
    }

    /// Whether `{env: VAR}` may be read: always for files; for a tenant
    /// of the admin API only a variable `admin.host_secrets.env` lists.
    pub(super) fn allows_env(&self, errors: &mut Errors, path: &str, var: &str) -> bool {
        match self.admin {
            Some(admin) if !admin.host.env.contains(var) => {
                errors.push(
                    path,
                    format!(
                        "`{{env: {var}}}` is refused in a tenant written through the admin API: \
                         admin.host_secrets.env does not list it (store the value with PutSecret \
                         and use `{{stored: NAME}}`)"
                    ),
                );
                false
            }
            _ => true,
        }
    }

    /// The value of `{stored: NAME}`: only in a tenant of the admin API.
    pub(super) fn stored(&self, errors: &mut Errors, path: &str, name: &str) -> Option<Secret> {
        let Some(admin) = self.admin else {
            errors.push(
                path,
                "`stored:` reads a secret written through the admin API (PutSecret), for tenants \
                 of the admin API only; in a file use `env:` or `file:`",
            );
            return None;
        };
        if !super::names::is_valid_secret_name(name) {
            errors.push(
                path,
                "not a valid secret name (1 to 64 of a-z A-Z 0-9 . _ -)",
            );
            return None;
        }
        let secret = admin.stored.stored(name);
        if secret.is_none() {
            errors.push(
                path,
                format!(
                    "secret `{name}` is not stored for this tenant (write it with PutSecret or \
                     `toolgate tenants secrets put`)"
                ),
            );
        }
        secret
    }

    /// Whether a `command` server may be configured: always for files;
    /// for a tenant of the admin API only with `admin.allow_stdio_servers`.
    pub(super) fn allows_stdio(&self, errors: &mut Errors, path: &str) -> bool {
        match self.admin {
            Some(admin) if !admin.allow_stdio => {
                errors.push(
                    path,
                    "`command` (a stdio server, a program on the gateway's host) is refused in a \
                     tenant written through the admin API unless the file configuration sets \
                     admin.allow_stdio_servers: true",
                );
                false
            }
            _ => true,
        }
    }
}
