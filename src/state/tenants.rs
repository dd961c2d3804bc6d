//! Tenants of the state store: their specs, the index of their tokens'
//! digests, their stored secrets, and the log of changes every replica
//! follows.
//!
//! Tables (migration 0006): `toolgate_tenants` (name, version, the spec
//! sealed and bound to name and version, written at), `toolgate_tenant_tokens`
//! (a token's SHA-256 digest → tenant and the token's index in its spec;
//! the digest is the key, so one token never selects two tenants),
//! `toolgate_tenant_secrets` (tenant, name, version, the value sealed and
//! bound to tenant and name) and `toolgate_tenant_changes` (a sequence
//! number, the tenant, its version after the change or 0 for a delete, the
//! wall-clock time of the write).
//!
//! A tenant's version is the sequence number of the change that wrote it:
//! it grows with every write, and is never reused, not even after a delete
//! and a create (an `expected_version` read before a delete never matches
//! the tenant created after it). Every write is one transaction that writes
//! the row, its tokens and its change; on PostgreSQL it also sends
//! `NOTIFY toolgate_tenants, '<name>'`, delivered when it commits.

use std::collections::HashMap;

use super::{StateError, StateStore};
use crate::callers::TokenDigest;

/// The PostgreSQL channel a write notifies (payload: the tenant's name).
pub const TENANT_CHANNEL: &str = "toolgate_tenants";

/// A tenant as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredTenant {
    /// Its name.
    pub name: String,
    /// Its version (the sequence number of the change that wrote it).
    pub version: i64,
    /// The spec as written (YAML), opened. May hold literal secrets:
    /// `Debug` shows its length only.
    pub spec: String,
    /// When it was written, in milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
}

impl std::fmt::Debug for StoredTenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredTenant")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("spec", &format_args!("<{} bytes>", self.spec.len()))
            .finish()
    }
}

/// What a write expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No tenant of this name (a create).
    Absent,
    /// Any version, or none (a delete's empty `expected_version`).
    Any,
    /// Exactly this version.
    Version(i64),
}

/// Why a tenant write was refused.
#[derive(Debug, thiserror::Error)]
pub enum TenantWriteError {
    /// The tenant is not at the expected version: `current` is what is
    /// stored (`None`: no tenant).
    #[error("the tenant's stored version is {}", .current.map_or("none".to_owned(), |v| v.to_string()))]
    VersionMismatch {
        /// The stored version, if any.
        current: Option<i64>,
    },
    /// One of the spec's tokens already selects another tenant (`tenant`),
    /// at `index` of the spec's `tokens`.
    #[error("tokens[{index}] already selects tenant `{tenant}`")]
    TokenTaken {
        /// The spec's token index.
        index: usize,
        /// The tenant it selects.
        tenant: String,
    },
    /// The store failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// One entry of the change log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantChange {
    /// Its sequence number (grows with every change).
    pub seq: i64,
    /// The tenant changed.
    pub tenant: String,
    /// Its version after the change; 0 when it was deleted.
    pub version: i64,
    /// When it was written, in milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// A stored secret's name and version, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretInfo {
    /// Its name.
    pub name: String,
    /// Its version (1, then one more at every write).
    pub version: i64,
    /// When it was last written, in milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
}

/// A stream of tenant names from PostgreSQL's `NOTIFY` (one per write,
/// delivered on commit).
pub struct TenantNotices {
    listener: sqlx::postgres::PgListener,
}

impl std::fmt::Debug for TenantNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TenantNotices")
    }
}

impl TenantNotices {
    /// The next tenant written by any replica.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the connection is lost (the
    /// caller resyncs, then listens again).
    pub async fn next(&mut self) -> Result<String, StateError> {
        let _ = &mut self.listener;
        todo!("helper: store-admin")
    }
}

impl StateStore {
    /// Creates or replaces tenant `name` with `spec` if it is as `expect`
    /// says, replacing its token index with `tokens` (the digests of its
    /// resolved `tokens`, in spec order), in one transaction with its
    /// change (and, on PostgreSQL, its notice). Returns the new version.
    ///
    /// # Errors
    /// [`TenantWriteError::VersionMismatch`], [`TenantWriteError::TokenTaken`],
    /// or the store's error.
    pub async fn put_tenant(
        &self,
        name: &str,
        spec: &str,
        expect: Expect,
        tokens: &[TokenDigest],
    ) -> Result<i64, TenantWriteError> {
        let _ = (name, spec, expect, tokens);
        todo!("helper: store-admin")
    }

    /// Deletes tenant `name` (its tokens and secrets too) if it is as
    /// `expect` says. Returns the version deleted.
    ///
    /// # Errors
    /// [`TenantWriteError::VersionMismatch`] (no tenant: `current: None`),
    /// or the store's error.
    pub async fn delete_tenant(&self, name: &str, expect: Expect) -> Result<i64, TenantWriteError> {
        let _ = (name, expect);
        todo!("helper: store-admin")
    }

    /// Tenant `name`, if stored.
    ///
    /// # Errors
    /// The store's error.
    pub async fn get_tenant(&self, name: &str) -> Result<Option<StoredTenant>, StateError> {
        let _ = name;
        todo!("helper: store-admin")
    }

    /// Up to `limit` tenants by name after `after` (exclusive).
    ///
    /// # Errors
    /// The store's error.
    pub async fn list_tenants(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StoredTenant>, StateError> {
        let _ = (after, limit);
        todo!("helper: store-admin")
    }

    /// How many tenants are stored.
    ///
    /// # Errors
    /// The store's error.
    pub async fn count_tenants(&self) -> Result<u64, StateError> {
        todo!("helper: store-admin")
    }

    /// The tenant a token with this digest selects, and the token's index
    /// in its spec's `tokens`.
    ///
    /// # Errors
    /// The store's error.
    pub async fn tenant_for_token(
        &self,
        digest: &TokenDigest,
    ) -> Result<Option<(String, usize)>, StateError> {
        let _ = digest;
        todo!("helper: store-admin")
    }

    /// The stored versions of these tenants (absent: deleted): what a
    /// resync compares its loaded tenants with.
    ///
    /// # Errors
    /// The store's error.
    pub async fn tenant_versions(
        &self,
        names: &[String],
    ) -> Result<HashMap<String, i64>, StateError> {
        let _ = names;
        todo!("helper: store-admin")
    }

    /// Up to `limit` changes after sequence number `after`, oldest first.
    ///
    /// # Errors
    /// The store's error.
    pub async fn tenant_changes(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<Vec<TenantChange>, StateError> {
        let _ = (after, limit);
        todo!("helper: store-admin")
    }

    /// The newest change's sequence number (0 with none).
    ///
    /// # Errors
    /// The store's error.
    pub async fn last_tenant_change(&self) -> Result<i64, StateError> {
        todo!("helper: store-admin")
    }

    /// Deletes changes written before `before_ms` (the log's retention).
    ///
    /// # Errors
    /// The store's error.
    pub async fn prune_tenant_changes(&self, before_ms: i64) -> Result<u64, StateError> {
        let _ = before_ms;
        todo!("helper: store-admin")
    }

    /// Listens for tenant writes (PostgreSQL only; `None` on SQLite, which
    /// is polled with [`StateStore::tenant_changes`]).
    ///
    /// # Errors
    /// The store's error.
    pub async fn listen_tenants(&self) -> Result<Option<TenantNotices>, StateError> {
        todo!("helper: store-admin")
    }

    /// Stores secret `name` of `tenant` (sealed, bound to both), and, when
    /// the tenant exists, writes a change for it (its version grows, so
    /// every replica loads it again with the new value) with `tokens` as
    /// its new token index when given (the secret was one of its tokens).
    /// Returns the secret's version.
    ///
    /// # Errors
    /// [`TenantWriteError::TokenTaken`], or the store's error.
    pub async fn put_secret(
        &self,
        tenant: &str,
        name: &str,
        value: &[u8],
        tokens: Option<&[TokenDigest]>,
    ) -> Result<i64, TenantWriteError> {
        let _ = (tenant, name, value, tokens);
        todo!("helper: store-admin")
    }

    /// Deletes secret `name` of `tenant`. Returns whether it existed.
    ///
    /// # Errors
    /// The store's error.
    pub async fn delete_secret(&self, tenant: &str, name: &str) -> Result<bool, StateError> {
        let _ = (tenant, name);
        todo!("helper: store-admin")
    }

    /// The names and versions of `tenant`'s secrets, by name.
    ///
    /// # Errors
    /// The store's error.
    pub async fn list_secrets(&self, tenant: &str) -> Result<Vec<SecretInfo>, StateError> {
        let _ = tenant;
        todo!("helper: store-admin")
    }

    /// The values of `tenant`'s secrets named in `names`, opened (absent
    /// names are left out).
    ///
    /// # Errors
    /// The store's error, or a value that does not open.
    pub async fn secrets(
        &self,
        tenant: &str,
        names: &[String],
    ) -> Result<HashMap<String, crate::config::Secret>, StateError> {
        let _ = (tenant, names);
        todo!("helper: store-admin")
    }
}
