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
//!
//! # One writer at a time
//! Tenant writes are serialized: on SQLite the first statement of each
//! write transaction is a write (the file's single writer lock, waited for
//! up to the busy timeout), on PostgreSQL each takes the transaction-scoped
//! advisory lock [`TENANT_LOCK_KEY`] first. So of two writes expecting the
//! same version exactly one wins, and the change log's sequence numbers
//! become visible in order: a follower reading the changes after `seq`
//! never misses one committed later with a smaller number.
//!
//! Here: the specs and the change log; the token index in `tokens`, the
//! stored secrets in `secrets`.

mod secrets;
mod tokens;

use std::collections::HashMap;

use sqlx::{Any, Transaction};

use super::keys::aad;
use super::{Backend, Notices, Record, StateError, StateStore, get, now_ms};
use crate::callers::TokenDigest;

/// The PostgreSQL advisory lock every tenant write holds until it commits:
/// the ASCII bytes of `tgtenant` as a big-endian 64-bit integer.
pub const TENANT_LOCK_KEY: i64 = i64::from_be_bytes(*b"tgtenant");

/// Most names one statement of [`StateStore::tenant_versions`] or
/// [`StateStore::secrets`] asks for (bound parameters are limited).
const NAMES_PER_QUERY: usize = 500;

/// The PostgreSQL channel a write notifies (payload: the tenant's name).
pub const TENANT_CHANNEL: &str = "toolgate_tenants";

/// A tenant write made in its transaction (holding the tenants' write
/// lock) and not committed yet: [`Staged::commit`] makes it, dropping it
/// rolls it back. What happens between the two (the admin API writes the
/// change's audit record there) decides whether the write is made.
pub struct Staged<T> {
    tx: Transaction<'static, Any>,
    value: T,
}

impl<T> std::fmt::Debug for Staged<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Staged")
    }
}

impl<T> Staged<T> {
    /// What the write returns once committed.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// Commits the write.
    ///
    /// # Errors
    /// The store's error: the write is not made.
    pub async fn commit(self) -> Result<T, StateError> {
        self.tx.commit().await.map_err(db)?;
        Ok(self.value)
    }
}

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
    /// One of the spec's approver tokens (`call_approvals.approver_tokens`,
    /// at `index`) is already a token of tenant `tenant` (a caller's or an
    /// approver's).
    #[error("call_approvals.approver_tokens[{index}] is already a token of tenant `{tenant}`")]
    ApproverTokenTaken {
        /// The index in the spec's approver tokens.
        index: usize,
        /// The tenant it is a token of.
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

/// The associated data of tenant `name`'s spec at `version`: a spec moved
/// to another tenant's row, or an older spec put back, does not open.
fn spec_aad(name: &str, version: i64) -> Vec<u8> {
    aad("tenant-spec", &[name, &version.to_string()])
}

/// The associated data of secret `name` of `tenant`.
fn secret_aad(tenant: &str, name: &str) -> Vec<u8> {
    aad("tenant-secret", &[tenant, name])
}

/// What a change did (the `kind` column).
#[derive(Clone, Copy)]
enum ChangeKind {
    Put,
    Secret,
    Delete,
}

impl ChangeKind {
    fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Put => "put",
            ChangeKind::Secret => "secret",
            ChangeKind::Delete => "delete",
        }
    }
}

fn db(error: sqlx::Error) -> StateError {
    StateError::from_sqlx(error)
}

/// `$first, $first+1, ...`: `count` placeholders.
fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl StateStore {
    /// Starts a tenant write: a transaction holding the tenants' write
    /// lock (see the module's documentation).
    async fn begin_tenant_write(&self) -> Result<Transaction<'static, Any>, StateError> {
        let pool = self.ready().await?;
        let mut tx = pool.begin().await.map_err(db)?;
        if self.backend == Backend::Postgres {
            // `count` so the Any driver has a column type it knows (the
            // lock function returns `void`).
            sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_xact_lock($1)) AS locked")
                .bind(TENANT_LOCK_KEY)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        Ok(tx)
    }

    /// Appends a change of `tenant` to the log; returns its sequence
    /// number (the tenant's new version, unless it is a delete).
    async fn insert_change(
        tx: &mut Transaction<'static, Any>,
        tenant: &str,
        kind: ChangeKind,
    ) -> Result<i64, StateError> {
        let row = sqlx::query(
            "INSERT INTO toolgate_tenant_changes (tenant, kind, at_ms) VALUES ($1, $2, $3) \
             RETURNING seq",
        )
        .bind(tenant)
        .bind(kind.as_str())
        .bind(now_ms())
        .fetch_one(&mut **tx)
        .await
        .map_err(db)?;
        get(&row, 0, Record::TenantChange)
    }

    /// Sends the tenant's notice (PostgreSQL; delivered on commit).
    async fn notify(
        &self,
        tx: &mut Transaction<'static, Any>,
        tenant: &str,
    ) -> Result<(), StateError> {
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT count(*) FROM (SELECT pg_notify($1, $2)) AS notified")
                .bind(TENANT_CHANNEL)
                .bind(tenant)
                .execute(&mut **tx)
                .await
                .map_err(db)?;
        }
        Ok(())
    }

    /// The stored version of `name`, read inside a write.
    async fn current_version(
        tx: &mut Transaction<'static, Any>,
        name: &str,
    ) -> Result<Option<i64>, StateError> {
        let row = sqlx::query("SELECT version FROM toolgate_tenants WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db)?;
        row.map(|row| get(&row, 0, Record::Tenant)).transpose()
    }

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
        Ok(self
            .stage_put_tenant(name, spec, expect, tokens)
            .await?
            .commit()
            .await?)
    }

    /// [`StateStore::put_tenant`], not committed yet.
    ///
    /// # Errors
    /// As [`StateStore::put_tenant`].
    pub async fn stage_put_tenant(
        &self,
        name: &str,
        spec: &str,
        expect: Expect,
        tokens: &[TokenDigest],
    ) -> Result<Staged<i64>, TenantWriteError> {
        self.stage_put_tenant_with_approvers(name, spec, expect, tokens, None)
            .await
    }

    /// [`StateStore::stage_put_tenant`], indexing the digests of the
    /// tenant's approver tokens (`call_approvals.approver_tokens`) too, so
    /// that an approver token finds its tenant while it is not loaded. An
    /// approver token's row never selects a tenant for a caller's token
    /// ([`StateStore::tenant_for_token`] passes over it).
    ///
    /// # Errors
    /// As [`StateStore::put_tenant`], and
    /// [`TenantWriteError::ApproverTokenTaken`].
    pub async fn stage_put_tenant_with_approvers(
        &self,
        name: &str,
        spec: &str,
        expect: Expect,
        tokens: &[TokenDigest],
        approver_tokens: Option<&[TokenDigest]>,
    ) -> Result<Staged<i64>, TenantWriteError> {
        let mut tx = self.begin_tenant_write().await?;
        let version = Self::insert_change(&mut tx, name, ChangeKind::Put).await?;
        let sealed = self.keys.seal(spec.as_bytes(), &spec_aad(name, version));
        let query = match expect {
            Expect::Absent => sqlx::query(
                "INSERT INTO toolgate_tenants (name, version, sealed, updated_at_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING RETURNING version",
            ),
            Expect::Any => sqlx::query(
                "INSERT INTO toolgate_tenants (name, version, sealed, updated_at_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO UPDATE \
                 SET version = excluded.version, sealed = excluded.sealed, \
                     updated_at_ms = excluded.updated_at_ms \
                 RETURNING version",
            ),
            Expect::Version(_) => sqlx::query(
                "UPDATE toolgate_tenants SET version = $2, sealed = $3, updated_at_ms = $4 \
                 WHERE name = $1 AND version = $5 RETURNING version",
            ),
        };
        let query = query.bind(name).bind(version).bind(sealed).bind(now_ms());
        let query = match expect {
            Expect::Version(expected) => query.bind(expected),
            Expect::Absent | Expect::Any => query,
        };
        let written = query.fetch_optional(&mut *tx).await.map_err(db)?;
        if written.is_none() {
            let current = Self::current_version(&mut tx, name).await?;
            tx.rollback().await.map_err(db)?;
            return Err(TenantWriteError::VersionMismatch { current });
        }
        Self::replace_tokens(&mut tx, name, tokens, approver_tokens).await?;
        self.notify(&mut tx, name).await?;
        Ok(Staged { tx, value: version })
    }

    /// Deletes tenant `name` (its tokens and secrets too) if it is as
    /// `expect` says. Returns the version deleted.
    ///
    /// # Errors
    /// [`TenantWriteError::VersionMismatch`] (no tenant: `current: None`),
    /// or the store's error.
    pub async fn delete_tenant(&self, name: &str, expect: Expect) -> Result<i64, TenantWriteError> {
        Ok(self
            .stage_delete_tenant(name, expect)
            .await?
            .commit()
            .await?)
    }

    /// [`StateStore::delete_tenant`], not committed yet.
    ///
    /// # Errors
    /// As [`StateStore::delete_tenant`].
    pub async fn stage_delete_tenant(
        &self,
        name: &str,
        expect: Expect,
    ) -> Result<Staged<i64>, TenantWriteError> {
        let mut tx = self.begin_tenant_write().await?;
        Self::insert_change(&mut tx, name, ChangeKind::Delete).await?;
        let deleted = match expect {
            // Nothing to delete when none is expected.
            Expect::Absent => None,
            Expect::Any => {
                sqlx::query("DELETE FROM toolgate_tenants WHERE name = $1 RETURNING version")
                    .bind(name)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?
            }
            Expect::Version(expected) => sqlx::query(
                "DELETE FROM toolgate_tenants WHERE name = $1 AND version = $2 RETURNING version",
            )
            .bind(name)
            .bind(expected)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?,
        };
        let Some(deleted) = deleted else {
            let current = Self::current_version(&mut tx, name).await?;
            tx.rollback().await.map_err(db)?;
            return Err(TenantWriteError::VersionMismatch { current });
        };
        let version = get(&deleted, 0, Record::Tenant)?;
        // Everything kept for the tenant goes with it, in this transaction:
        // a tenant re-created under the same name starts with nothing of
        // the old one (no upstream token, client registration or task).
        for sql in [
            "DELETE FROM toolgate_tenant_tokens WHERE tenant = $1",
            "DELETE FROM toolgate_tenant_secrets WHERE tenant = $1",
            "DELETE FROM toolgate_tokens WHERE tenant = $1",
            "DELETE FROM toolgate_oauth_clients WHERE tenant = $1",
            "DELETE FROM toolgate_tasks WHERE tenant = $1",
        ] {
            sqlx::query(sql)
                .bind(name)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        self.notify(&mut tx, name).await?;
        Ok(Staged { tx, value: version })
    }

    /// Opens a tenant row (`name`, `version`, `sealed`, `updated_at_ms`).
    fn tenant_from_row(&self, row: &sqlx::any::AnyRow) -> Result<StoredTenant, StateError> {
        let name: String = get(row, 0, Record::Tenant)?;
        let version: i64 = get(row, 1, Record::Tenant)?;
        let sealed: Vec<u8> = get(row, 2, Record::Tenant)?;
        let updated_at_ms: i64 = get(row, 3, Record::Tenant)?;
        let spec = self.open(&sealed, &spec_aad(&name, version), Record::Tenant)?;
        let spec = String::from_utf8(spec).map_err(|_| StateError::Corrupt {
            record: Record::Tenant,
        })?;
        Ok(StoredTenant {
            name,
            version,
            spec,
            updated_at_ms,
        })
    }

    /// Tenant `name`, if stored.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the spec for
    /// this name and version.
    pub async fn get_tenant(&self, name: &str) -> Result<Option<StoredTenant>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(
            "SELECT name, version, sealed, updated_at_ms FROM toolgate_tenants WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(pool)
        .await
        .map_err(db)?;
        row.map(|row| self.tenant_from_row(&row)).transpose()
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
        let pool = self.ready().await?;
        // Every name is longer than the empty string.
        let rows = sqlx::query(
            "SELECT name, version, sealed, updated_at_ms FROM toolgate_tenants \
             WHERE name > $1 ORDER BY name LIMIT $2",
        )
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await
        .map_err(db)?;
        rows.iter().map(|row| self.tenant_from_row(row)).collect()
    }

    /// How many tenants are stored.
    ///
    /// # Errors
    /// The store's error.
    pub async fn count_tenants(&self) -> Result<u64, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query("SELECT COUNT(*) FROM toolgate_tenants")
            .fetch_one(pool)
            .await
            .map_err(db)?;
        let count: i64 = get(&row, 0, Record::Tenant)?;
        Ok(u64::try_from(count).unwrap_or(0))
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
        let pool = self.ready().await?;
        let mut versions = HashMap::with_capacity(names.len());
        for chunk in names.chunks(NAMES_PER_QUERY) {
            let sql = format!(
                "SELECT name, version FROM toolgate_tenants WHERE name IN ({})",
                placeholders(1, chunk.len())
            );
            let mut query = sqlx::query(&sql);
            for name in chunk {
                query = query.bind(name);
            }
            for row in query.fetch_all(pool).await.map_err(db)? {
                versions.insert(get(&row, 0, Record::Tenant)?, get(&row, 1, Record::Tenant)?);
            }
        }
        Ok(versions)
    }

    /// Up to `limit` changes after sequence number `after`, oldest first.
    /// Numbers become visible in order (writes are serialized), with gaps
    /// where a write was refused and rolled back.
    ///
    /// # Errors
    /// The store's error.
    pub async fn tenant_changes(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<Vec<TenantChange>, StateError> {
        let pool = self.ready().await?;
        let rows = sqlx::query(
            "SELECT seq, tenant, kind, at_ms FROM toolgate_tenant_changes \
             WHERE seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|row| {
                let seq: i64 = get(row, 0, Record::TenantChange)?;
                let kind: String = get(row, 2, Record::TenantChange)?;
                Ok(TenantChange {
                    seq,
                    tenant: get(row, 1, Record::TenantChange)?,
                    version: if kind == ChangeKind::Delete.as_str() {
                        0
                    } else {
                        seq
                    },
                    at_ms: get(row, 3, Record::TenantChange)?,
                })
            })
            .collect()
    }

    /// The newest change's sequence number (0 with none).
    ///
    /// # Errors
    /// The store's error.
    pub async fn last_tenant_change(&self) -> Result<i64, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM toolgate_tenant_changes")
            .fetch_one(pool)
            .await
            .map_err(db)?;
        get(&row, 0, Record::TenantChange)
    }

    /// Deletes changes written before `before_ms` (the log's retention),
    /// except the newest, so [`StateStore::last_tenant_change`] never goes
    /// back. Returns how many were deleted.
    ///
    /// # Errors
    /// The store's error.
    pub async fn prune_tenant_changes(&self, before_ms: i64) -> Result<u64, StateError> {
        let pool = self.ready().await?;
        let done = sqlx::query(
            "DELETE FROM toolgate_tenant_changes WHERE at_ms < $1 \
             AND seq < (SELECT MAX(seq) FROM toolgate_tenant_changes)",
        )
        .bind(before_ms)
        .execute(pool)
        .await
        .map_err(db)?;
        Ok(done.rows_affected())
    }

    /// Listens for tenant writes (PostgreSQL only; `None` on SQLite, which
    /// is polled with [`StateStore::tenant_changes`]). Listening has begun
    /// when this returns: every write committed afterwards is a notice
    /// (its payload the tenant's name).
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn listen_tenants(&self) -> Result<Option<Notices>, StateError> {
        self.listen(TENANT_CHANNEL, "tenant changes").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_bind_their_row() {
        assert_ne!(spec_aad("acme", 3), spec_aad("acme", 4));
        assert_ne!(spec_aad("acme", 3), spec_aad("globex", 3));
        assert_ne!(secret_aad("acme", "token"), secret_aad("acme", "other"));
        assert_ne!(secret_aad("acme", "3"), spec_aad("acme", 3));
    }

    #[test]
    fn debug_hides_the_spec() {
        let tenant = StoredTenant {
            name: "acme".into(),
            version: 7,
            spec: "tokens: [hunter2]".into(),
            updated_at_ms: 0,
        };
        let debug = format!("{tenant:?}");
        assert!(
            !debug.contains("hunter2") && debug.contains("<17 bytes>"),
            "{debug}"
        );
    }

    /// Issue 37: a deleted tenant's upstream tokens, OAuth client
    /// registrations and tasks go with it; another tenant's stay.
    #[tokio::test]
    async fn deleting_a_tenant_deletes_what_was_kept_for_it() {
        use crate::state::{ClientKey, KeyRing, TokenKey};
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let keys = KeyRing::new(vec![[7u8; 32]]).expect("keys");
        let state = StateStore::connect(&url, keys).await.expect("connect");
        for tenant in ["acme", "globex"] {
            state
                .put_tenant(tenant, "servers: []", Expect::Absent, &[])
                .await
                .expect("put");
            state
                .put_token(&TokenKey::new(tenant, "alice", "crm"), b"{}")
                .await
                .expect("token");
            state
                .put_client(&ClientKey::new(tenant, "crm", "https://as.example"), b"{}")
                .await
                .expect("client");
            let task = format!("task-of-{tenant}");
            state
                .put_task(&task, tenant, b"{}", now_ms() + 60_000, 10)
                .await
                .expect("task");
        }
        state
            .delete_tenant("acme", Expect::Any)
            .await
            .expect("delete");
        let acme_token = TokenKey::new("acme", "alice", "crm");
        assert!(state.get_token(&acme_token).await.unwrap().is_none());
        let acme_client = ClientKey::new("acme", "crm", "https://as.example");
        assert!(state.get_client(&acme_client).await.unwrap().is_none());
        assert_eq!(state.count_tasks("acme").await.unwrap(), 0);
        let globex_token = TokenKey::new("globex", "alice", "crm");
        assert!(state.get_token(&globex_token).await.unwrap().is_some());
        let globex_client = ClientKey::new("globex", "crm", "https://as.example");
        assert!(state.get_client(&globex_client).await.unwrap().is_some());
        assert_eq!(state.count_tasks("globex").await.unwrap(), 1);
    }

    #[test]
    fn placeholders_number_from_the_first() {
        assert_eq!(placeholders(2, 3), "$2, $3, $4");
        assert_eq!(placeholders(1, 1), "$1");
    }
}
