//! Bringing the schema up to date: the embedded migrations, one process at a
//! time, and the steps that re-seal stored values when a migration changes
//! what a value is bound to.
//!
//! # One migrator at a time
//! The whole run is one transaction that first takes the database's write
//! lock: `BEGIN IMMEDIATE` on SQLite (the file's single writer lock, waited
//! for up to the connection's busy timeout, 5 s), and on PostgreSQL the
//! transaction-scoped advisory lock [`MIGRATION_LOCK_KEY`]
//! (`pg_advisory_xact_lock`), released by the commit or the rollback, so an
//! error can never leave it held on a pooled connection. A second gateway
//! starting at the same moment waits, then finds every migration applied.
//! sqlx's own migration lock is not used: it is a no-op on SQLite, and on
//! PostgreSQL a session lock that an error leaves held.
//!
//! # Data steps
//! Some migrations change the associated data a value is sealed with; SQL
//! cannot re-seal, so the gateway does it right after applying such a
//! migration, in the same transaction: either both are committed or
//! neither. A step runs only when its migration is applied, so it runs once
//! per database; nothing re-runs it later, and no code path reads the old
//! format afterwards.

use std::collections::HashMap;

use sqlx::migrate::{Migrate as _, MigrateError, Migrator};
use sqlx::{AnyConnection, Connection as _, Row as _};

use super::keys::TokenKey;
use super::{Backend, KeyRing, StateError, seal_token};

/// The PostgreSQL advisory lock held while migrating: the ASCII bytes of
/// `toolgate` as a big-endian 64-bit integer (8390880602192880741). Another
/// application using the same key on the same database would wait for
/// toolgate's migrations (and toolgate for it).
pub const MIGRATION_LOCK_KEY: i64 = i64::from_be_bytes(*b"toolgate");

/// The migration after which token values are sealed for their row's
/// version (`0003_token_seal_binds_version.sql`).
const TOKEN_SEAL_BINDS_VERSION: i64 = 3;

/// What the data steps did, for the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Resealed {
    /// Token rows re-sealed for their version.
    pub(super) tokens: u64,
    /// Token rows that no configured key opened, left as they were (they
    /// cannot be read before or after).
    pub(super) unreadable: u64,
}

/// Applies `migrator`'s pending migrations, and the data step of each, in
/// one transaction holding the migration lock of `backend`.
///
/// # Errors
/// [`StateError::Unavailable`] when the database cannot be reached (or the
/// SQLite lock was not free within the busy timeout),
/// [`StateError::Migrate`] when the schema cannot be brought up to date
/// (for instance a database migrated by a newer toolgate).
pub(super) async fn run(
    conn: &mut AnyConnection,
    backend: Backend,
    migrator: &Migrator,
    keys: &KeyRing,
) -> Result<Resealed, StateError> {
    let mut tx = match backend {
        Backend::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await,
        Backend::Postgres => conn.begin().await,
    }
    .map_err(StateError::from_sqlx)?;
    if backend == Backend::Postgres {
        // `count` so the Any driver has a column type it knows (the lock
        // function returns `void`).
        sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_xact_lock($1)) AS locked")
            .bind(MIGRATION_LOCK_KEY)
            .execute(&mut *tx)
            .await
            .map_err(StateError::from_sqlx)?;
    }
    let resealed = apply_pending(&mut tx, migrator, keys).await?;
    tx.commit().await.map_err(StateError::from_sqlx)?;
    Ok(resealed)
}

/// What `Migrator::run` does, with the data steps in between: refuses a
/// dirty or foreign history, then applies each missing migration in order.
async fn apply_pending(
    conn: &mut AnyConnection,
    migrator: &Migrator,
    keys: &KeyRing,
) -> Result<Resealed, StateError> {
    conn.ensure_migrations_table()
        .await
        .map_err(StateError::from_migrate)?;
    if let Some(version) = conn
        .dirty_version()
        .await
        .map_err(StateError::from_migrate)?
    {
        return Err(StateError::Migrate(MigrateError::Dirty(version)));
    }
    let applied: HashMap<i64, Vec<u8>> = conn
        .list_applied_migrations()
        .await
        .map_err(StateError::from_migrate)?
        .into_iter()
        .map(|m| (m.version, m.checksum.into_owned()))
        .collect();
    for (&version, checksum) in &applied {
        match migrator.iter().find(|m| m.version == version) {
            None => return Err(StateError::Migrate(MigrateError::VersionMissing(version))),
            Some(known) if *known.checksum != **checksum => {
                return Err(StateError::Migrate(MigrateError::VersionMismatch(version)));
            }
            Some(_) => {}
        }
    }
    let mut resealed = Resealed::default();
    for migration in migrator.iter() {
        if migration.migration_type.is_down_migration() || applied.contains_key(&migration.version)
        {
            continue;
        }
        conn.apply(migration)
            .await
            .map_err(StateError::from_migrate)?;
        if migration.version == TOKEN_SEAL_BINDS_VERSION {
            resealed = reseal_tokens_for_their_version(conn, keys).await?;
        }
    }
    Ok(resealed)
}

/// The data step of migration 0003: every token row was sealed for its key
/// only; each one a configured key opens is re-sealed for its key and
/// version. A row no key opens is left as it is: it could not be read
/// before (its key was removed, or it was altered) and cannot be now.
async fn reseal_tokens_for_their_version(
    conn: &mut AnyConnection,
    keys: &KeyRing,
) -> Result<Resealed, StateError> {
    let rows = sqlx::query(
        "SELECT tenant, subject, server, version, sealed_with_version FROM toolgate_tokens",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(StateError::from_sqlx)?;
    let mut done = Resealed::default();
    for row in rows {
        let corrupt = |_| StateError::Corrupt {
            record: super::Record::Token,
        };
        let key = TokenKey::new(
            row.try_get::<String, _>(0).map_err(corrupt)?,
            row.try_get::<String, _>(1).map_err(corrupt)?,
            row.try_get::<String, _>(2).map_err(corrupt)?,
        );
        let version: i64 = row.try_get(3).map_err(corrupt)?;
        let sealed: Vec<u8> = row.try_get(4).map_err(corrupt)?;
        let Ok(value) = keys.open(&sealed, &key.aad_before_versions()) else {
            done.unreadable += 1;
            continue;
        };
        sqlx::query(
            "UPDATE toolgate_tokens SET sealed_with_version = $1 \
             WHERE tenant = $2 AND subject = $3 AND server = $4 AND version = $5",
        )
        .bind(seal_token(keys, &key, version, &value))
        .bind(&key.tenant)
        .bind(&key.subject)
        .bind(&key.server)
        .bind(version)
        .execute(&mut *conn)
        .await
        .map_err(StateError::from_sqlx)?;
        done.tokens += 1;
    }
    Ok(done)
}
