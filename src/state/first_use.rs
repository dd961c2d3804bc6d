//! Ids used once: [`FirstUse::claim`] says whether an id is used for the
//! first time, until its expiry. In the state store
//! (`toolgate_used_states`, keyed by the id's SHA-256, so the table never
//! holds a live id) when one is open, so that of two uses on any replicas
//! exactly one is first; else in this process's memory, bounded.
//!
//! The round of questions a `request_state` stands for is answered once:
//! its nonce is claimed here before the answers are sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::keys::state_hash;
use super::{StateError, StateStore, now_ms};

/// Most ids this process remembers without a state store; past it (with
/// none expired) a claim fails as the store would when unreachable.
pub const MAX_REMEMBERED: usize = 100_000;

/// Where first uses are recorded.
#[derive(Debug, Clone)]
pub enum FirstUse {
    /// The shared state store: first on any replica.
    Store(StateStore),
    /// This process only (no state store open): id hash → expiry (ms).
    Memory(Arc<Mutex<HashMap<String, i64>>>),
}

impl Default for FirstUse {
    fn default() -> Self {
        Self::Memory(Arc::default())
    }
}

impl FirstUse {
    /// Claims `id` until `expires_at_ms` (Unix milliseconds): `true` when
    /// this is its first use, `false` when it was claimed before and has
    /// not expired.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached
    /// ([`StateError::Full`] in memory, with [`MAX_REMEMBERED`] live ids
    /// held): nothing is claimed, and the caller must not act as if it
    /// were.
    pub async fn claim(&self, id: &str, expires_at_ms: i64) -> Result<bool, StateError> {
        match self {
            Self::Store(store) => store.claim_first_use(id, expires_at_ms).await,
            Self::Memory(seen) => {
                let now = now_ms();
                let mut seen = seen
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let hash = state_hash(id);
                if seen.get(&hash).is_some_and(|&exp| exp > now) {
                    return Ok(false);
                }
                if seen.len() >= MAX_REMEMBERED {
                    seen.retain(|_, exp| *exp > now);
                }
                if seen.len() >= MAX_REMEMBERED {
                    return Err(StateError::Full(format!(
                        "{MAX_REMEMBERED} answered rounds are remembered in memory (no state store)"
                    )));
                }
                seen.insert(hash, expires_at_ms);
                Ok(true)
            }
        }
    }
}

impl StateStore {
    /// [`FirstUse::claim`] in the store: one `INSERT ... ON CONFLICT DO
    /// NOTHING`, so of two claims on any replicas exactly one inserts.
    /// Expired claims are purged on the way.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn claim_first_use(&self, id: &str, expires_at_ms: i64) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        sqlx::query("DELETE FROM toolgate_used_states WHERE expires_at_ms <= $1")
            .bind(now_ms())
            .execute(pool)
            .await
            .map_err(StateError::from_sqlx)?;
        let inserted = sqlx::query(
            "INSERT INTO toolgate_used_states (nonce_hash, expires_at_ms) VALUES ($1, $2) \
             ON CONFLICT (nonce_hash) DO NOTHING",
        )
        .bind(state_hash(id))
        .bind(expires_at_ms)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(inserted.rows_affected() == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::KeyRing;

    async fn claims_once(first_use: &FirstUse) {
        let later = now_ms() + 60_000;
        assert!(first_use.claim("round-1", later).await.unwrap());
        assert!(!first_use.claim("round-1", later).await.unwrap());
        assert!(first_use.claim("round-2", later).await.unwrap());
        // An expired claim no longer counts (the id's state has expired
        // too, and is refused for that).
        assert!(first_use.claim("old", now_ms() - 1).await.unwrap());
        assert!(first_use.claim("old", later).await.unwrap());
    }

    #[tokio::test]
    async fn an_id_is_claimed_once_in_memory_and_in_the_store() {
        claims_once(&FirstUse::default()).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let keys = KeyRing::new(vec![[7u8; 32]]).expect("keys");
        let store = StateStore::connect(&url, keys).await.expect("connect");
        claims_once(&FirstUse::Store(store.clone())).await;
        // Racing claims: exactly one wins.
        let later = now_ms() + 60_000;
        let claims = (0..8).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.claim_first_use("raced", later).await.unwrap() })
        });
        let won = futures::future::join_all(claims)
            .await
            .into_iter()
            .filter(|won| *won.as_ref().unwrap())
            .count();
        assert_eq!(won, 1);
    }
}
