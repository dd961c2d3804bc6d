//! Idempotency keys of tool calls, shared by every replica: the first call
//! with a key claims its row ("in flight", with the digest of its
//! arguments) before anything is sent; its end records the outcome (the
//! response, sealed to the row, or "in doubt"). A row is keyed by a
//! SHA-256 of (tenant, subject, exposed tool name, key): the table never
//! holds a key. Every step is one conditional statement, so of racing
//! calls with one key exactly one claims it.

use super::keys::aad;
use super::{Backend, Record, StateError, StateStore, get, now_ms};

/// The states of a key's row.
pub mod states {
    /// Claimed by a call that has not ended (or whose gateway died).
    pub const IN_FLIGHT: &str = "in_flight";
    /// The call ended; its response (or status) is recorded.
    pub const DONE: &str = "done";
    /// The call may or may not have acted (it ended `UNKNOWN`).
    pub const IN_DOUBT: &str = "in_doubt";
}

/// The row key of (`tenant`, `subject`, `tool`, `key`): length-prefixed
/// parts, hashed.
#[must_use]
pub fn key_hash(tenant: &str, subject: &str, tool: &str, key: &str) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    for part in [tenant, subject, tool, key] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hex::encode(hash.finalize())
}

/// The PostgreSQL advisory lock a claim holds for `tenant` until it
/// commits (the count of live keys and the insert are one step).
fn claim_lock_key(tenant: &str) -> i64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("tgidem:{tenant}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The associated data of a row's sealed response.
fn key_aad(key_hash: &str, tenant: &str) -> Vec<u8> {
    aad("idempotency", &[key_hash, tenant])
}

/// A key's row.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyRow {
    /// The digest of the arguments of the call that claimed it.
    pub arguments_sha256: String,
    /// One of [`states`], as stored ([`KeyRow::state_now`]).
    pub state: String,
    /// The id of the call that claimed it.
    pub call_id: String,
    /// When an in-flight row is in doubt (its gateway never finished it).
    pub in_flight_until_ms: i64,
    /// When the key is forgotten.
    pub expires_at_ms: i64,
    /// The recorded outcome, opened (`None`: none yet, or unreadable).
    pub response: Option<Vec<u8>>,
    /// An outcome is recorded but no configured key opens it (a gateway
    /// restarted without `state.keys`, a key removed).
    pub unreadable: bool,
}

impl std::fmt::Debug for KeyRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRow")
            .field("state", &self.state)
            .field("call_id", &self.call_id)
            .field(
                "response",
                &self
                    .response
                    .as_ref()
                    .map(|r| format!("<{} bytes>", r.len())),
            )
            .finish_non_exhaustive()
    }
}

impl KeyRow {
    /// The state at `now_ms`: an in-flight row past `in_flight_until_ms`
    /// is in doubt (the call that claimed it can no longer be running).
    #[must_use]
    pub fn state_now(&self, now_ms: i64) -> &str {
        if self.state == states::IN_FLIGHT && self.in_flight_until_ms <= now_ms {
            states::IN_DOUBT
        } else {
            &self.state
        }
    }
}

/// A claim of a key.
#[derive(Debug)]
pub struct NewKey<'a> {
    /// [`key_hash`] of the call.
    pub key_hash: &'a str,
    /// Its tenant.
    pub tenant: &'a str,
    /// The digest of its canonical arguments.
    pub arguments_sha256: &'a str,
    /// Its call id.
    pub call_id: &'a str,
    /// When it is in doubt unless finished (the call's longest run).
    pub in_flight_until_ms: i64,
    /// When the key is forgotten.
    pub expires_at_ms: i64,
}

/// What [`StateStore::claim_key`] did.
#[derive(Debug)]
pub enum Claimed {
    /// This call holds the key: it runs.
    Won,
    /// Another call holds (or held) it: its row.
    Existing(Box<KeyRow>),
    /// The tenant has its most live keys.
    Limit,
}

const COLUMNS: &str =
    "arguments_sha256, state, call_id, in_flight_until_ms, expires_at_ms, sealed, key_hash, tenant";

impl StateStore {
    /// Claims `new`'s key, unless a live row holds it (answered instead) or
    /// `tenant` has `max_live` live keys. The key's own row is purged first
    /// if it expired.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn claim_key(&self, new: &NewKey<'_>, max_live: u64) -> Result<Claimed, StateError> {
        let pool = self.ready().await?;
        let now = now_ms();
        // This key's row, if it expired (the minute's sweep,
        // [`StateStore::purge_expired_keys`], takes the others): a key
        // past its ttl names a new call.
        sqlx::query(
            "DELETE FROM toolgate_idempotency_keys WHERE key_hash = $1 AND expires_at_ms <= $2",
        )
        .bind(new.key_hash)
        .bind(now)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        // On SQLite the transaction takes the write lock before it reads:
        // a deferred one that read first fails at once (`SQLITE_BUSY`, no
        // wait) when another claim committed in between.
        let mut tx = match self.backend {
            Backend::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await,
            Backend::Postgres => pool.begin().await,
        }
        .map_err(StateError::from_sqlx)?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_xact_lock($1)) AS locked")
                .bind(claim_lock_key(new.tenant))
                .execute(&mut *tx)
                .await
                .map_err(StateError::from_sqlx)?;
        }
        let existing = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM toolgate_idempotency_keys \
             WHERE key_hash = $1 AND tenant = $2 AND expires_at_ms > $3"
        ))
        .bind(new.key_hash)
        .bind(new.tenant)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StateError::from_sqlx)?;
        if let Some(row) = existing {
            let row = self.key_row(&row)?;
            tx.commit().await.map_err(StateError::from_sqlx)?;
            return Ok(Claimed::Existing(Box::new(row)));
        }
        let done = sqlx::query(
            "INSERT INTO toolgate_idempotency_keys \
             (key_hash, tenant, arguments_sha256, state, call_id, in_flight_until_ms, \
              created_at_ms, expires_at_ms, sealed) \
             SELECT $1, $2, $3, 'in_flight', $4, $5, $6, $7, NULL \
             WHERE (SELECT COUNT(*) FROM toolgate_idempotency_keys \
                    WHERE tenant = $2 AND expires_at_ms > $6) < $8",
        )
        .bind(new.key_hash)
        .bind(new.tenant)
        .bind(new.arguments_sha256)
        .bind(new.call_id)
        .bind(new.in_flight_until_ms)
        .bind(now)
        .bind(new.expires_at_ms)
        .bind(i64::try_from(max_live).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(StateError::from_sqlx)?;
        tx.commit().await.map_err(StateError::from_sqlx)?;
        Ok(if done.rows_affected() > 0 {
            Claimed::Won
        } else {
            Claimed::Limit
        })
    }

    /// The live row of `key_hash` of `tenant`.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn key(&self, key_hash: &str, tenant: &str) -> Result<Option<KeyRow>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM toolgate_idempotency_keys \
             WHERE key_hash = $1 AND tenant = $2 AND expires_at_ms > $3"
        ))
        .bind(key_hash)
        .bind(tenant)
        .bind(now_ms())
        .fetch_optional(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        row.map(|row| self.key_row(&row)).transpose()
    }

    /// Records the end of the call holding `key_hash` (`call_id`): `state`
    /// (done or in doubt) and, for a done call, its `response` (sealed).
    /// Returns whether the row was still this call's and in flight.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn finish_key(
        &self,
        key_hash: &str,
        tenant: &str,
        call_id: &str,
        state: &str,
        response: Option<&[u8]>,
    ) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let sealed = response.map(|r| self.keys.seal(r, &key_aad(key_hash, tenant)));
        let done = sqlx::query(
            "UPDATE toolgate_idempotency_keys SET state = $1, sealed = $2 \
             WHERE key_hash = $3 AND tenant = $4 AND call_id = $5 AND state = 'in_flight'",
        )
        .bind(state)
        .bind(sealed)
        .bind(key_hash)
        .bind(tenant)
        .bind(call_id)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    /// Lets go of `key_hash` claimed by `call_id` (a call that sent
    /// nothing: a retry may run it). Returns whether it did.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn release_key(
        &self,
        key_hash: &str,
        tenant: &str,
        call_id: &str,
    ) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let done = sqlx::query(
            "DELETE FROM toolgate_idempotency_keys \
             WHERE key_hash = $1 AND tenant = $2 AND call_id = $3 AND state = 'in_flight'",
        )
        .bind(key_hash)
        .bind(tenant)
        .bind(call_id)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    /// Deletes every expired key; nothing (and no connection) when this
    /// process has not used the store yet. Returns how many went.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn purge_expired_keys(&self) -> Result<u64, StateError> {
        if !self.is_ready() {
            return Ok(0);
        }
        let pool = self.ready().await?;
        let done = sqlx::query("DELETE FROM toolgate_idempotency_keys WHERE expires_at_ms <= $1")
            .bind(now_ms())
            .execute(pool)
            .await
            .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected())
    }

    /// A row of [`COLUMNS`], its response opened.
    fn key_row(&self, row: &sqlx::any::AnyRow) -> Result<KeyRow, StateError> {
        let record = Record::IdempotencyKey;
        let sealed: Option<Vec<u8>> = get(row, 5, record)?;
        let key_hash: String = get(row, 6, record)?;
        let tenant: String = get(row, 7, record)?;
        // An outcome no configured key opens is known to exist, and is
        // never taken for "no outcome": the call is not run again.
        let (response, unreadable) = match sealed {
            None => (None, false),
            Some(sealed) => match self.open(&sealed, &key_aad(&key_hash, &tenant), record) {
                Ok(opened) => (Some(opened), false),
                Err(_) => (None, true),
            },
        };
        Ok(KeyRow {
            arguments_sha256: get(row, 0, record)?,
            state: get(row, 1, record)?,
            call_id: get(row, 2, record)?,
            in_flight_until_ms: get(row, 3, record)?,
            expires_at_ms: get(row, 4, record)?,
            response,
            unreadable,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim<'a>(hash: &'a str, call: &'a str, arguments: &'a str) -> NewKey<'a> {
        NewKey {
            key_hash: hash,
            tenant: "acme",
            arguments_sha256: arguments,
            call_id: call,
            in_flight_until_ms: now_ms() + 60_000,
            expires_at_ms: now_ms() + 3_600_000,
        }
    }

    #[tokio::test]
    async fn a_key_is_claimed_once_finished_once_and_released_only_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let store = StateStore::open_lazy(&url, crate::state::KeyRing::ephemeral()).unwrap();
        let hash = key_hash("acme", "token:a", "pay__send", "k1");
        assert_ne!(hash, key_hash("acme", "token:a", "pay__send", "k2"));
        assert_ne!(hash, key_hash("acm", "etoken:a", "pay__send", "k1"));
        assert!(matches!(
            store
                .claim_key(&claim(&hash, "c1", "a1"), 10)
                .await
                .unwrap(),
            Claimed::Won
        ));
        match store
            .claim_key(&claim(&hash, "c2", "a1"), 10)
            .await
            .unwrap()
        {
            Claimed::Existing(row) => {
                assert_eq!(
                    (row.state.as_str(), row.call_id.as_str()),
                    (states::IN_FLIGHT, "c1")
                );
            }
            other => panic!("{other:?}"),
        }
        // Only its own call finishes it.
        assert!(
            !store
                .finish_key(&hash, "acme", "c2", states::DONE, Some(b"r"))
                .await
                .unwrap()
        );
        assert!(
            store
                .finish_key(&hash, "acme", "c1", states::DONE, Some(b"resp"))
                .await
                .unwrap()
        );
        assert!(
            !store
                .finish_key(&hash, "acme", "c1", states::IN_DOUBT, None)
                .await
                .unwrap()
        );
        assert!(!store.release_key(&hash, "acme", "c1").await.unwrap());
        let row = store.key(&hash, "acme").await.unwrap().unwrap();
        assert_eq!(row.response.as_deref(), Some(&b"resp"[..]));
        assert!(store.key(&hash, "other").await.unwrap().is_none());
        // A claim that sent nothing lets go: the next call runs.
        let other = key_hash("acme", "token:a", "pay__send", "k3");
        store
            .claim_key(&claim(&other, "c3", "a"), 10)
            .await
            .unwrap();
        assert!(store.release_key(&other, "acme", "c3").await.unwrap());
        assert!(matches!(
            store
                .claim_key(&claim(&other, "c4", "a"), 10)
                .await
                .unwrap(),
            Claimed::Won
        ));
        // An in-flight row past its time is in doubt.
        let mut stale = store.key(&other, "acme").await.unwrap().unwrap();
        stale.in_flight_until_ms = now_ms() - 1;
        assert_eq!(stale.state_now(now_ms()), states::IN_DOUBT);
        // Expired keys are purged, by the sweep too.
        let brief = key_hash("acme", "token:a", "pay__send", "brief");
        let mut short = claim(&brief, "c6", "a");
        short.expires_at_ms = now_ms() + 30;
        store.claim_key(&short, 10).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        assert_eq!(store.purge_expired_keys().await.unwrap(), 1);
        assert!(store.key(&brief, "acme").await.unwrap().is_none());
        // A tenant's live keys are bounded.
        let third = key_hash("acme", "token:a", "pay__send", "k5");
        assert!(matches!(
            store.claim_key(&claim(&third, "c5", "a"), 2).await.unwrap(),
            Claimed::Limit
        ));
    }

    /// Concurrent claims of distinct keys on one SQLite file all win: the
    /// claim's transaction takes the write lock before it reads, so no
    /// claim fails with `SQLITE_BUSY` when another committed since its read
    /// (found by `toolgate-bench --only-steps`: 16 keyed calls in flight
    /// answered `STATE_UNAVAILABLE`).
    #[tokio::test]
    async fn concurrent_claims_on_sqlite_all_win() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let store = std::sync::Arc::new(
            StateStore::open_lazy(&url, crate::state::KeyRing::ephemeral()).unwrap(),
        );
        let mut claims = Vec::new();
        for task in 0..16 {
            let store = store.clone();
            claims.push(tokio::spawn(async move {
                for n in 0..20 {
                    let hash = key_hash("acme", "", "fast__echo", &format!("k-{task}-{n}"));
                    let call = format!("c-{task}-{n}");
                    let won = store.claim_key(&claim(&hash, &call, "a"), 1_000_000).await;
                    assert!(matches!(won, Ok(Claimed::Won)), "{won:?}");
                    let finished = store
                        .finish_key(&hash, "acme", &call, states::DONE, Some(b"r"))
                        .await;
                    assert!(matches!(finished, Ok(true)), "{finished:?}");
                }
            }));
        }
        for claim in claims {
            claim.await.unwrap();
        }
    }
}
