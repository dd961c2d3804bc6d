//! Tasks (SEP-2663) that workers follow with GetTask, UpdateTask and
//! CancelTask, from any replica. A row is keyed by a SHA-256 of toolgate's
//! task id (the table never holds a live one), carries its tenant in the
//! clear (to count a tenant's open tasks) and everything else sealed and
//! bound to the id and the tenant: a row read with another id or for
//! another tenant does not open. Expired rows are purged on the way.

use super::keys::{state_hash, task_aad};
use super::{Backend, Record, StateError, StateStore, get, now_ms};

/// The PostgreSQL advisory lock a task put holds for `tenant` until it
/// commits: `tgtasks:` and the first bytes of the tenant's SHA-256, as a
/// 64-bit integer (tenants seldom share one; when two do, they only wait
/// for each other). Public for operators and tests that must hold a
/// tenant's task puts (as [`TENANT_LOCK_KEY`](super::tenants::TENANT_LOCK_KEY)
/// does tenant writes).
pub fn tasks_lock_key(tenant: &str) -> i64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("tgtasks:{tenant}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

impl StateStore {
    /// Stores the task `task_id` of `tenant` (its value serialized by the
    /// caller) until `expires_at_ms` (Unix milliseconds), unless `tenant`
    /// already has `max_open` live tasks: returns whether it was stored.
    /// The count and the insert are one step: of racing puts, at most
    /// `max_open` are stored (on PostgreSQL the tenant's tasks are locked
    /// for the transaction; on SQLite the statement holds the write lock).
    /// Expired tasks are purged first.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Database`] when a live task already has this id.
    pub async fn put_task(
        &self,
        task_id: &str,
        tenant: &str,
        value: &[u8],
        expires_at_ms: i64,
        max_open: u64,
    ) -> Result<bool, StateError> {
        self.purge_expired_tasks().await?;
        let pool = self.ready().await?;
        let mut tx = pool.begin().await.map_err(StateError::from_sqlx)?;
        if self.backend == Backend::Postgres {
            // `count` so the Any driver has a column type it knows (the
            // lock function returns `void`).
            sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_xact_lock($1)) AS locked")
                .bind(tasks_lock_key(tenant))
                .execute(&mut *tx)
                .await
                .map_err(StateError::from_sqlx)?;
        }
        let now = now_ms();
        let done = sqlx::query(
            "INSERT INTO toolgate_tasks (task_hash, tenant, sealed, created_at_ms, expires_at_ms) \
             SELECT $1, $2, $3, $4, $5 \
             WHERE (SELECT COUNT(*) FROM toolgate_tasks \
                    WHERE tenant = $2 AND expires_at_ms > $4) < $6",
        )
        .bind(state_hash(task_id))
        .bind(tenant)
        .bind(self.keys.seal(value, &task_aad(task_id, tenant)))
        .bind(now)
        .bind(expires_at_ms)
        .bind(i64::try_from(max_open).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(StateError::from_sqlx)?;
        tx.commit().await.map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    /// The task `task_id` of `tenant` and when it expires (Unix
    /// milliseconds); `None` when there is none, it expired, or it is
    /// another tenant's.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the value.
    pub async fn get_task(
        &self,
        task_id: &str,
        tenant: &str,
    ) -> Result<Option<(Vec<u8>, i64)>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(
            "SELECT sealed, expires_at_ms FROM toolgate_tasks \
             WHERE task_hash = $1 AND tenant = $2 AND expires_at_ms > $3",
        )
        .bind(state_hash(task_id))
        .bind(tenant)
        .bind(now_ms())
        .fetch_optional(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let sealed: Vec<u8> = get(&row, 0, Record::Task)?;
        let expires_at_ms: i64 = get(&row, 1, Record::Task)?;
        let value = self.open(&sealed, &task_aad(task_id, tenant), Record::Task)?;
        Ok(Some((value, expires_at_ms)))
    }

    /// Replaces the value of the live task `task_id` of `tenant` (its
    /// expiry stays); returns whether there was one.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn replace_task(
        &self,
        task_id: &str,
        tenant: &str,
        value: &[u8],
    ) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let done = sqlx::query(
            "UPDATE toolgate_tasks SET sealed = $1 \
             WHERE task_hash = $2 AND tenant = $3 AND expires_at_ms > $4",
        )
        .bind(self.keys.seal(value, &task_aad(task_id, tenant)))
        .bind(state_hash(task_id))
        .bind(tenant)
        .bind(now_ms())
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    /// How many live tasks `tenant` has.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn count_tasks(&self, tenant: &str) -> Result<u64, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(
            "SELECT COUNT(*) FROM toolgate_tasks WHERE tenant = $1 AND expires_at_ms > $2",
        )
        .bind(tenant)
        .bind(now_ms())
        .fetch_one(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        let count: i64 = get(&row, 0, Record::Task)?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Deletes every expired task; returns how many.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn purge_expired_tasks(&self) -> Result<u64, StateError> {
        let pool = self.ready().await?;
        let done = sqlx::query("DELETE FROM toolgate_tasks WHERE expires_at_ms <= $1")
            .bind(now_ms())
            .execute(pool)
            .await
            .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected())
    }
}
