//! Moving a stored token to another key: what migrating the subjects of
//! an earlier release does (`toolgate state migrate-subjects`). A value is
//! sealed to its row's key and version, so it is opened under the old key and sealed
//! again under the new one; the old row goes in the same transaction.

use super::{Record, StateError, StateStore, TokenKey, get, now_ms};

/// What [`StateStore::rekey_token`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rekeyed {
    /// The token is stored under the new key now; the old row is gone.
    Moved,
    /// The new key held a token already (a consent given since): it is
    /// kept, and the old row is gone.
    Superseded,
    /// No row under the old key (moved or deleted meanwhile).
    Gone,
    /// The old row was rewritten while it was being moved (a refresh by a
    /// running gateway): nothing changed; try again.
    Changed,
}

impl StateStore {
    /// The keys of every stored token, without opening any value, in key
    /// order.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn token_keys(&self) -> Result<Vec<TokenKey>, StateError> {
        let pool = self.ready().await?;
        let rows = sqlx::query(
            "SELECT tenant, subject, server FROM toolgate_tokens ORDER BY tenant, server, subject",
        )
        .fetch_all(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        rows.iter()
            .map(|row| {
                Ok(TokenKey::new(
                    get::<String>(row, 0, Record::Token)?,
                    get::<String>(row, 1, Record::Token)?,
                    get::<String>(row, 2, Record::Token)?,
                ))
            })
            .collect()
    }

    /// Moves the token stored under `from` to `to`, in one transaction:
    /// opened under `from`, sealed under `to` (a new row, version 1), and
    /// the row under `from` deleted, only if it still has the version
    /// read. A token already under `to` wins (it is newer: a consent given
    /// under the new key).
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens the value.
    pub async fn rekey_token(&self, from: &TokenKey, to: &TokenKey) -> Result<Rekeyed, StateError> {
        let pool = self.ready().await?;
        let mut tx = pool.begin().await.map_err(StateError::from_sqlx)?;
        let Some((version, sealed)) = super::token_row(&mut *tx, from).await? else {
            return Ok(Rekeyed::Gone);
        };
        let value = super::open_token(&self.keys, from, version, &sealed)?;
        let deleted = sqlx::query(
            "DELETE FROM toolgate_tokens \
             WHERE tenant = $1 AND subject = $2 AND server = $3 AND version = $4",
        )
        .bind(&from.tenant)
        .bind(&from.subject)
        .bind(&from.server)
        .bind(version)
        .execute(&mut *tx)
        .await
        .map_err(StateError::from_sqlx)?;
        if deleted.rows_affected() == 0 {
            return Ok(Rekeyed::Changed);
        }
        let inserted = sqlx::query(
            "INSERT INTO toolgate_tokens (tenant, subject, server, version, sealed_with_version, updated_at_ms) \
             VALUES ($1, $2, $3, 1, $4, $5) \
             ON CONFLICT (tenant, subject, server) DO NOTHING",
        )
        .bind(&to.tenant)
        .bind(&to.subject)
        .bind(&to.server)
        .bind(super::seal_token(&self.keys, to, 1, &value))
        .bind(now_ms())
        .execute(&mut *tx)
        .await
        .map_err(StateError::from_sqlx)?;
        tx.commit().await.map_err(StateError::from_sqlx)?;
        Ok(if inserted.rows_affected() == 1 {
            Rekeyed::Moved
        } else {
            Rekeyed::Superseded
        })
    }
}
