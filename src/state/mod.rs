//! The state store: what must outlive a process or be shared by replicas.
//! Upstream OAuth tokens per (tenant, subject, server), OAuth client
//! registrations per (tenant, server, issuer), and pending authorization flows
//! keyed by their `state` parameter. SQLite (a file, the default) or
//! PostgreSQL (for replicas); every value is sealed with AES-256-GCM
//! ([`KeyRing`]) and bound to its row, a token also to the row's version.
//!
//! # One code path
//! The store runs on [`sqlx::AnyPool`]: one pool type, one set of SQL strings,
//! one function per operation, whatever the backend. The SQL is the common
//! subset of SQLite (≥ 3.35, bundled) and PostgreSQL: `$n` placeholders (SQLite
//! reads `$1` as parameter 1), `INSERT ... ON CONFLICT ... DO UPDATE`,
//! `UPDATE/DELETE ... RETURNING`, `TEXT`, 64-bit integers and byte strings.
//! An enum over `SqlitePool`/`PgPool` would have duplicated every call site
//! for no gain, since nothing here needs a backend-specific type. Only the DDL
//! differs (`BLOB`/`BYTEA`, `INTEGER`/`BIGINT`), so there are two migration
//! directories, `migrations/sqlite` and `migrations/postgres`, kept otherwise
//! identical and embedded in the binary.
//!
//! # Sealed tokens
//! A token row's value is sealed with the row's key and version as
//! associated data (`seal_token`); every write gives the row the next
//! version, chosen before the write and checked by it (`WHERE version =`
//! the one before, or `ON CONFLICT DO NOTHING` for a new row), so the value
//! is always sealed for the version the row ends up with. The value of an
//! older version put back into the row does not open. Rows written before
//! this binding are re-sealed once, by migration 0003 (`migrate`).
//! Registrations and pending flows are bound to their row's key only.
//!
//! # Concurrency between replicas
//! A token refresh is a compare-and-swap on the row's `version`
//! ([`StateStore::replace_token`]): of two replicas refreshing the same token,
//! exactly one writes and the other gets the winner's token back. A pending
//! flow is taken with `DELETE ... RETURNING`, so a callback is consumed once.
//! Before asking the token endpoint at all, a replica takes a short lease
//! ([`StateStore::try_lease`], named by [`TokenKey::lease_name`]) so that the
//! others wait for its token instead of refreshing too; the compare-and-swap
//! stays as the backstop when a lease runs out mid-refresh.
//!
//! Here: the store's operations. Opening it (URLs, the pool, migrations) is
//! in `connect`, the rows' keys and the data that binds a sealed value to
//! its row in `keys`, the keys that seal values in `keyring`, moving a
//! token to another key (migrating subjects) in `rekey`, tool calls held
//! for a person's approval in `call_approvals`.

pub mod call_approvals;
mod connect;
mod error;
mod first_use;
pub mod idempotency;
mod keyring;
mod keys;
mod migrate;
mod notices;
mod once;
mod rekey;
mod tasks;
pub mod tenants;

pub use connect::{ACQUIRE_TIMEOUT, Backend, DEFAULT_URL};
pub use error::{Record, StateError};
pub use first_use::{FirstUse, MAX_REMEMBERED};
pub use keyring::{KeyError, KeyId, KeyRing, OpenError};
pub use keys::{ClientKey, TokenKey, aad};
pub use migrate::MIGRATION_LOCK_KEY;
pub use notices::Notices;
pub use once::{HeldTaken, HeldUse};
pub use rekey::Rekeyed;
pub use tasks::tasks_lock_key;

use sqlx::AnyPool;
use sqlx::Row as _;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::OnceCell;

/// How many times [`StateStore::put_token`] reads the version and tries to
/// write the next one before giving up (each failure means another writer
/// wrote the row meanwhile).
const PUT_ATTEMPTS: usize = 16;

/// A value with the version of the row it was read from. Versions start at 1
/// and grow by one on every write of the row. `Debug` shows the length of the
/// value, never its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    /// The row's version when read or written.
    pub version: i64,
    /// The value.
    pub value: T,
}

impl fmt::Debug for Versioned<Vec<u8>> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Versioned")
            .field("version", &self.version)
            .field("value", &format_args!("<{} bytes>", self.value.len()))
            .finish()
    }
}

/// The outcome of [`StateStore::replace_token`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replaced {
    /// The row still had the expected version; the new value is stored with
    /// this version.
    Won(i64),
    /// Another writer changed the row first. Holds what is stored now (the
    /// winner's token), or `None` when the row was deleted. Use it instead of
    /// refreshing again.
    Lost(Option<Versioned<Vec<u8>>>),
}

/// The state store: a pool over SQLite or PostgreSQL and the keys that seal
/// its values. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct StateStore {
    pool: AnyPool,
    backend: Backend,
    /// The URL as opened (may hold a password: never shown), for the
    /// connections that are not the pool's (PostgreSQL's `LISTEN`).
    url: std::sync::Arc<str>,
    keys: KeyRing,
    migrated: std::sync::Arc<OnceCell<()>>,
}

impl fmt::Debug for StateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateStore")
            .field("backend", &self.backend)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl StateStore {
    // ---- tokens ---------------------------------------------------------

    /// The token stored for `key`, with its version.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the value at
    /// the row's version (the key was removed, or the value was altered,
    /// copied from another row or from an older version of this one).
    pub async fn get_token(
        &self,
        key: &TokenKey,
    ) -> Result<Option<Versioned<Vec<u8>>>, StateError> {
        let pool = self.ready().await?;
        token_row(pool, key)
            .await?
            .map(|(version, sealed)| {
                let value = open_token(&self.keys, key, version, &sealed)?;
                Ok(Versioned { version, value })
            })
            .transpose()
    }

    /// Stores `value` for `key` whatever the row holds now (a first token
    /// after consent, or a replacement that needs no compare-and-swap).
    /// Returns the new version: 1 for a new row, else the old one plus one.
    ///
    /// The value is sealed for the version it is written with, so the
    /// version is chosen before the write and the write is conditional on
    /// the row still having the one before; when another writer got in
    /// between, this one reads again and retries (at most 16 times).
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Contended`] when other writers changed the row at every
    /// attempt.
    pub async fn put_token(&self, key: &TokenKey, value: &[u8]) -> Result<i64, StateError> {
        let pool = self.ready().await?;
        let mut conn = pool.acquire().await.map_err(StateError::from_sqlx)?;
        self.put_token_on(&mut conn, key, value).await
    }

    /// [`StateStore::put_token`] on one connection (a transaction's, so
    /// the write commits or rolls back with the rest of it).
    async fn put_token_on(
        &self,
        conn: &mut sqlx::AnyConnection,
        key: &TokenKey,
        value: &[u8],
    ) -> Result<i64, StateError> {
        for _ in 0..PUT_ATTEMPTS {
            let row = sqlx::query(
                "SELECT version FROM toolgate_tokens \
                 WHERE tenant = $1 AND subject = $2 AND server = $3",
            )
            .bind(&key.tenant)
            .bind(&key.subject)
            .bind(&key.server)
            .fetch_optional(&mut *conn)
            .await
            .map_err(StateError::from_sqlx)?;
            let current = row.map(|row| get(&row, 0, Record::Token)).transpose()?;
            if let Some(version) = self.write_token(&mut *conn, key, current, value).await? {
                return Ok(version);
            }
        }
        Err(StateError::Contended {
            record: Record::Token,
        })
    }

    /// Compare-and-swap: stores `value` for `key` only if the row still has
    /// `expected_version` (the version the caller read before refreshing).
    /// Of two replicas refreshing the same token, one gets [`Replaced::Won`];
    /// the other gets [`Replaced::Lost`] with the winner's token.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when the winner's value cannot be opened.
    pub async fn replace_token(
        &self,
        key: &TokenKey,
        expected_version: i64,
        value: &[u8],
    ) -> Result<Replaced, StateError> {
        let pool = self.ready().await?;
        match self
            .write_token(pool, key, Some(expected_version), value)
            .await?
        {
            Some(version) => Ok(Replaced::Won(version)),
            None => Ok(Replaced::Lost(self.get_token(key).await?)),
        }
    }

    /// Writes `value` for `key` as the version after `current` (1 when
    /// `current` is `None`: no row), sealed for that version, only if the
    /// row is still at `current` (still absent). Returns the version
    /// written, or `None` when the row was not at `current`.
    async fn write_token<'e, E>(
        &self,
        executor: E,
        key: &TokenKey,
        current: Option<i64>,
        value: &[u8],
    ) -> Result<Option<i64>, StateError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Any>,
    {
        let version = match current {
            None => 1,
            Some(old) => old.checked_add(1).ok_or(StateError::Corrupt {
                record: Record::Token,
            })?,
        };
        let sealed = seal_token(&self.keys, key, version, value);
        let query = match current {
            None => sqlx::query(
                "INSERT INTO toolgate_tokens \
                 (tenant, subject, server, version, sealed_with_version, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (tenant, subject, server) DO NOTHING \
                 RETURNING version",
            ),
            Some(_) => sqlx::query(
                "UPDATE toolgate_tokens \
                 SET version = $4, sealed_with_version = $5, updated_at_ms = $6 \
                 WHERE tenant = $1 AND subject = $2 AND server = $3 AND version = $7 \
                 RETURNING version",
            ),
        };
        let query = query
            .bind(&key.tenant)
            .bind(&key.subject)
            .bind(&key.server)
            .bind(version)
            .bind(sealed)
            .bind(now_ms());
        let query = match current {
            None => query,
            Some(old) => query.bind(old),
        };
        let row = query
            .fetch_optional(executor)
            .await
            .map_err(StateError::from_sqlx)?;
        Ok(row.map(|_| version))
    }

    /// Deletes the token for `key` (revoked, or consent withdrawn). Returns
    /// whether a row existed.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn delete_token(&self, key: &TokenKey) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let done = sqlx::query(
            "DELETE FROM toolgate_tokens WHERE tenant = $1 AND subject = $2 AND server = $3",
        )
        .bind(&key.tenant)
        .bind(&key.subject)
        .bind(&key.server)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    /// The subjects holding a token for `server` of `tenant`, at most
    /// `limit`: the tenant itself first when it holds a token (as the empty
    /// subject), then the least recently written (`updated_at_ms`, then
    /// subject). Used to pick whose token lists a per-user server's
    /// tools; only the key columns are read, no value is opened.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn subjects(
        &self,
        tenant: &str,
        server: &str,
        limit: usize,
    ) -> Result<Vec<String>, StateError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let pool = self.ready().await?;
        let rows = sqlx::query(
            "SELECT subject FROM toolgate_tokens WHERE tenant = $1 AND server = $2 \
             ORDER BY subject <> '', updated_at_ms, subject LIMIT $3",
        )
        .bind(tenant)
        .bind(server)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        rows.iter().map(|row| get(row, 0, Record::Token)).collect()
    }

    // ---- leases ---------------------------------------------------------

    /// Takes or renews the lease `name` for `holder` until `ttl` from now,
    /// in one statement: the lease is written when nobody holds it, when its
    /// holder's time has run out, or when `holder` holds it already (a
    /// renewal). Returns whether `holder` holds it now. Of several replicas
    /// racing for a free lease exactly one gets `true`, on SQLite (one
    /// writer) and on PostgreSQL (the conflicting row is locked and the
    /// condition re-read). Expiry compares the callers' clocks, so replicas
    /// need roughly synchronized clocks; a lease is a courtesy that avoids
    /// duplicate work, not a guarantee (see [`StateStore::replace_token`]).
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn try_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let now = now_ms();
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let row = sqlx::query(
            "INSERT INTO toolgate_leases (name, holder, expires_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE \
             SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms \
             WHERE toolgate_leases.expires_at_ms < $4 \
                OR toolgate_leases.holder = excluded.holder \
             RETURNING holder",
        )
        .bind(name)
        .bind(holder)
        .bind(now.saturating_add(ttl_ms))
        .bind(now)
        .fetch_optional(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        // A row comes back only when this statement wrote it.
        Ok(row.is_some())
    }

    /// Gives up the lease `name` if `holder` holds it (whether or not its
    /// time has run out). Returns whether it did; a lease taken over by
    /// another holder meanwhile is left alone.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let done = sqlx::query("DELETE FROM toolgate_leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(pool)
            .await
            .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    // ---- OAuth clients --------------------------------------------------

    /// The OAuth client registration stored for `key`.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the value.
    pub async fn get_client(&self, key: &ClientKey) -> Result<Option<Vec<u8>>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(
            "SELECT sealed FROM toolgate_oauth_clients \
             WHERE tenant = $1 AND server = $2 AND issuer = $3",
        )
        .bind(&key.tenant)
        .bind(&key.server)
        .bind(&key.issuer)
        .fetch_optional(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        row.map(|row| {
            let sealed: Vec<u8> = get(&row, 0, Record::Client)?;
            self.open(&sealed, &key.aad(), Record::Client)
        })
        .transpose()
    }

    /// Stores (or replaces) the OAuth client registration for `key`.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn put_client(&self, key: &ClientKey, value: &[u8]) -> Result<(), StateError> {
        let pool = self.ready().await?;
        let sealed = self.keys.seal(value, &key.aad());
        sqlx::query(
            "INSERT INTO toolgate_oauth_clients (tenant, server, issuer, sealed, updated_at_ms) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant, server, issuer) DO UPDATE \
             SET sealed = excluded.sealed, updated_at_ms = excluded.updated_at_ms",
        )
        .bind(&key.tenant)
        .bind(&key.server)
        .bind(&key.issuer)
        .bind(sealed)
        .bind(now_ms())
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(())
    }

    /// Deletes the OAuth client registration for `key` (for instance after
    /// the authorization server forgot it). Returns whether a row existed.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn delete_client(&self, key: &ClientKey) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let done = sqlx::query(
            "DELETE FROM toolgate_oauth_clients \
             WHERE tenant = $1 AND server = $2 AND issuer = $3",
        )
        .bind(&key.tenant)
        .bind(&key.server)
        .bind(&key.issuer)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    fn open(&self, sealed: &[u8], aad: &[u8], record: Record) -> Result<Vec<u8>, StateError> {
        self.keys
            .open(sealed, aad)
            .map_err(|cause| StateError::Decrypt { record, cause })
    }
}

/// Reads column `index`, mapping a type mismatch to [`StateError::Corrupt`].
fn get<T>(row: &sqlx::any::AnyRow, index: usize, record: Record) -> Result<T, StateError>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any>,
{
    row.try_get(index)
        .map_err(|_| StateError::Corrupt { record })
}

/// Seals `value` as the token of row `key` at `version`: the associated
/// data names the row and its version, so the result opens in that row at
/// that version only. Every write of a token row goes through here (and a
/// migration that re-keys or re-versions rows re-seals with it).
pub(super) fn seal_token(keys: &KeyRing, key: &TokenKey, version: i64, value: &[u8]) -> Vec<u8> {
    keys.seal(value, &key.aad(version))
}

/// The version and sealed value of the token row of `key`, read through
/// `executor` (the pool, or a transaction).
async fn token_row<'e, E>(executor: E, key: &TokenKey) -> Result<Option<(i64, Vec<u8>)>, StateError>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    let row = sqlx::query(
        "SELECT version, sealed_with_version FROM toolgate_tokens \
         WHERE tenant = $1 AND subject = $2 AND server = $3",
    )
    .bind(&key.tenant)
    .bind(&key.subject)
    .bind(&key.server)
    .fetch_optional(executor)
    .await
    .map_err(StateError::from_sqlx)?;
    row.map(|row| Ok((get(&row, 0, Record::Token)?, get(&row, 1, Record::Token)?)))
        .transpose()
}

/// Opens what [`seal_token`] sealed for row `key` at `version`.
///
/// # Errors
/// [`StateError::Decrypt`] when no configured key opens it for that row and
/// version.
pub(super) fn open_token(
    keys: &KeyRing,
    key: &TokenKey,
    version: i64,
    sealed: &[u8],
) -> Result<Vec<u8>, StateError> {
    keys.open(sealed, &key.aad(version))
        .map_err(|cause| StateError::Decrypt {
            record: Record::Token,
            cause,
        })
}

/// Now, as Unix time in milliseconds (the stores' expiry column).
pub(crate) fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_in_its_row_at_its_version_only() {
        let keys = KeyRing::new(vec![[3u8; 32]]).unwrap();
        let alice = TokenKey::new("acme", "alice", "github");
        let sealed = seal_token(&keys, &alice, 2, b"refresh-2");
        assert_eq!(open_token(&keys, &alice, 2, &sealed).unwrap(), b"refresh-2");
        for (key, version) in [
            (&alice, 1),
            (&alice, 3),
            (&TokenKey::new("acme", "bob", "github"), 2),
        ] {
            assert!(matches!(
                open_token(&keys, key, version, &sealed),
                Err(StateError::Decrypt {
                    record: Record::Token,
                    cause: OpenError::Tampered { .. }
                })
            ));
        }
        // What the earlier release sealed (the key only) does not open.
        let before = keys.seal(b"refresh-1", &alice.aad_before_versions());
        assert!(open_token(&keys, &alice, 1, &before).is_err());
    }

    #[test]
    fn versioned_debug_hides_the_value() {
        let v = Versioned {
            version: 3,
            value: b"secret".to_vec(),
        };
        let debug = format!("{v:?}");
        assert!(
            debug.contains("<6 bytes>") && !debug.contains("115"),
            "{debug}"
        );
    }
}
