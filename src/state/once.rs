//! Rows used once: pending authorization flows (by their `state`) and
//! consents held for their application's confirmation (by their one-time
//! code). Each value is sealed and bound to its id, the row is keyed by a
//! SHA-256 of the id (the table never holds a live one), taken with
//! `DELETE ... RETURNING` (of two takers on any replicas exactly one gets
//! it), and purged once expired.

use std::time::Duration;

use super::keys::{TokenKey, held_aad, pending_aad, state_hash};
use super::{Record, StateError, StateStore, get, now_ms};

/// What [`StateStore::take_held_with`] does with the consent it took.
#[derive(Debug)]
#[non_exhaustive]
pub enum HeldUse {
    /// Leave it held: nothing changes.
    Keep,
    /// Drop it (it is not the confirming caller's).
    Drop,
    /// Drop it and store `value` as the token of `key`, as
    /// [`StateStore::put_token`] does.
    Save(TokenKey, Vec<u8>),
}

/// What [`StateStore::take_held_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeldTaken {
    /// No live consent is held under the code.
    NotHeld,
    /// It was left held.
    Kept,
    /// It was dropped.
    Dropped,
    /// Its token was stored at this version.
    Saved(i64),
}

/// A table of rows used once.
#[derive(Debug, Clone, Copy)]
struct Once {
    table: &'static str,
    id_column: &'static str,
    record: Record,
    aad: fn(&str) -> Vec<u8>,
}

/// Pending authorization flows, by `state`.
const PENDING: Once = Once {
    table: "toolgate_pending_flows",
    id_column: "state_hash",
    record: Record::Pending,
    aad: pending_aad,
};

/// Consents held for the application's confirmation, by one-time code.
const HELD: Once = Once {
    table: "toolgate_held_grants",
    id_column: "code_hash",
    record: Record::Held,
    aad: held_aad,
};

impl StateStore {
    /// Stores a pending authorization flow (PKCE verifier, subject, server,
    /// serialized by the caller) under its opaque, random `state`, for
    /// `ttl`. Only a hash of `state` is stored. Expired rows are purged on
    /// the way.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Database`] when a live flow already has this `state`.
    pub async fn put_pending(
        &self,
        state: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<(), StateError> {
        self.put_once(PENDING, state, value, ttl).await
    }

    /// Takes the pending flow stored under `state`: returns it and deletes
    /// it in one statement, so of two callbacks with the same `state` (on
    /// any replicas) exactly one gets it. An expired flow is deleted and not
    /// returned.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the value.
    pub async fn take_pending(&self, state: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.take_once(PENDING, state).await
    }

    /// The pending flow stored under `state`, left in place (a callback
    /// that fails its checks must not consume the flow of the genuine one).
    /// An expired flow is not returned. Use [`StateStore::take_pending`] to
    /// consume it.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the value.
    pub async fn get_pending(&self, state: &str) -> Result<Option<Vec<u8>>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(
            "SELECT sealed FROM toolgate_pending_flows \
             WHERE state_hash = $1 AND expires_at_ms > $2",
        )
        .bind(state_hash(state))
        .bind(now_ms())
        .fetch_optional(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let sealed: Vec<u8> = get(&row, 0, Record::Pending)?;
        self.open(&sealed, &pending_aad(state), Record::Pending)
            .map(Some)
    }

    /// Keeps a held consent (tokens and whose flow it was, serialized by
    /// the caller) under its one-time `code` for `ttl`. Only a hash of
    /// `code` is stored. Expired rows are purged on the way.
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
        self.put_once(HELD, code, value, ttl).await
    }

    /// Takes the consent held under `code`: returns it and deletes it in one
    /// statement, so a code works once across replicas. An expired one is
    /// deleted and not returned.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the value.
    pub async fn take_held(&self, code: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.take_once(HELD, code).await
    }

    /// Takes the consent held under `code` and does what `decide` says
    /// with its value, in one transaction: the consent is gone only
    /// together with its token's write (a store that fails half-way leaves
    /// it held, for a retry), and of two takers with one code at most one
    /// gets it. `decide` is called only when a live consent is held.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached (then
    /// nothing changed), [`StateError::Contended`] as for
    /// [`StateStore::put_token`], [`StateError::Decrypt`] when no
    /// configured key opens the value.
    pub async fn take_held_with(
        &self,
        code: &str,
        decide: impl FnOnce(Vec<u8>) -> HeldUse,
    ) -> Result<HeldTaken, StateError> {
        let pool = self.ready().await?;
        let mut tx = pool.begin().await.map_err(StateError::from_sqlx)?;
        let row = sqlx::query(&format!(
            "DELETE FROM {} WHERE {} = $1 RETURNING sealed, expires_at_ms",
            HELD.table, HELD.id_column
        ))
        .bind(state_hash(code))
        .fetch_optional(&mut *tx)
        .await
        .map_err(StateError::from_sqlx)?;
        let Some(row) = row else {
            return Ok(HeldTaken::NotHeld);
        };
        let expires_at_ms: i64 = get(&row, 1, HELD.record)?;
        if expires_at_ms <= now_ms() {
            tx.commit().await.map_err(StateError::from_sqlx)?;
            return Ok(HeldTaken::NotHeld);
        }
        let sealed: Vec<u8> = get(&row, 0, HELD.record)?;
        let value = self.open(&sealed, &(HELD.aad)(code), HELD.record)?;
        let taken = match decide(value) {
            // Dropping the transaction rolls the take back.
            HeldUse::Keep => return Ok(HeldTaken::Kept),
            HeldUse::Drop => HeldTaken::Dropped,
            HeldUse::Save(key, token) => {
                HeldTaken::Saved(self.put_token_on(&mut tx, &key, &token).await?)
            }
        };
        tx.commit().await.map_err(StateError::from_sqlx)?;
        Ok(taken)
    }

    /// Deletes every expired pending flow and held consent; returns how
    /// many.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn purge_expired(&self) -> Result<u64, StateError> {
        let pool = self.ready().await?;
        let mut purged = 0;
        for once in [PENDING, HELD] {
            let done = sqlx::query(&format!(
                "DELETE FROM {} WHERE expires_at_ms <= $1",
                once.table
            ))
            .bind(now_ms())
            .execute(pool)
            .await
            .map_err(StateError::from_sqlx)?;
            purged += done.rows_affected();
        }
        Ok(purged)
    }

    async fn put_once(
        &self,
        once: Once,
        id: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<(), StateError> {
        self.purge_expired().await?;
        let pool = self.ready().await?;
        let sealed = self.keys.seal(value, &(once.aad)(id));
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(&format!(
            "INSERT INTO {} ({}, sealed, expires_at_ms) VALUES ($1, $2, $3)",
            once.table, once.id_column
        ))
        .bind(state_hash(id))
        .bind(sealed)
        .bind(now_ms().saturating_add(ttl_ms))
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(())
    }

    async fn take_once(&self, once: Once, id: &str) -> Result<Option<Vec<u8>>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(&format!(
            "DELETE FROM {} WHERE {} = $1 RETURNING sealed, expires_at_ms",
            once.table, once.id_column
        ))
        .bind(state_hash(id))
        .fetch_optional(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let expires_at_ms: i64 = get(&row, 1, once.record)?;
        if expires_at_ms <= now_ms() {
            return Ok(None);
        }
        let sealed: Vec<u8> = get(&row, 0, once.record)?;
        self.open(&sealed, &(once.aad)(id), once.record).map(Some)
    }
}
