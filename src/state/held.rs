//! Consents held until the tenant's application confirms them: sealed,
//! keyed by a hash of their one-time code, taken once.

use std::time::Duration;

use super::{Record, StateError, StateStore, get, held_aad, now_ms, state_hash};

impl StateStore {
    /// Keeps a held consent (tokens and whose flow it was, serialized by
    /// the caller) under its one-time `code` for `ttl`. Only a hash of
    /// `code` is stored; the value is sealed and bound to the code. Expired
    /// flows and consents are purged on the way.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Database`] when a live consent already has this code.
    pub async fn put_held(
        &self,
        code: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<(), StateError> {
        self.purge_expired().await?;
        let pool = self.ready().await?;
        let sealed = self.keys.seal(value, &held_aad(code));
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(
            "INSERT INTO toolgate_held_grants (code_hash, sealed, expires_at_ms) \
             VALUES ($1, $2, $3)",
        )
        .bind(state_hash(code))
        .bind(sealed)
        .bind(now_ms().saturating_add(ttl_ms))
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(())
    }

    /// Takes the consent held under `code`: returns it and deletes it in one
    /// statement, so a code works once across replicas. An expired one is
    /// deleted and not returned.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the value.
    pub async fn take_held(&self, code: &str) -> Result<Option<Vec<u8>>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(
            "DELETE FROM toolgate_held_grants WHERE code_hash = $1 \
             RETURNING sealed, expires_at_ms",
        )
        .bind(state_hash(code))
        .fetch_optional(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let expires_at_ms: i64 = get(&row, 1, Record::Held)?;
        if expires_at_ms <= now_ms() {
            return Ok(None);
        }
        let sealed: Vec<u8> = get(&row, 0, Record::Held)?;
        self.open(&sealed, &held_aad(code), Record::Held).map(Some)
    }
}
