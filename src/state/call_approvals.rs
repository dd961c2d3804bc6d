//! Call approvals: tool calls a policy rule held for a person's decision
//! (`require_approval`), shared by every replica. A row carries in the
//! clear what the store must compare and count (tenant, subject, the
//! binding's digest, the state, the uses left, the times) and, sealed and
//! bound to its id and tenant, what an approver is shown and what was
//! decided (the caller's domain value, opaque here).
//!
//! Every change is one conditional statement, so that of racing replicas
//! exactly one wins: a decision only of a pending, live row; a use only of
//! an approved, live row with uses left and the same binding; a request
//! only while its subject has room. Rows past their expiry are marked
//! expired by [`StateStore::expire_call_approvals`] (each by one replica)
//! and deleted a while after they ended.

use super::keys::aad;
use super::{Backend, Notices, Record, StateError, StateStore, get, now_ms};

/// The states a row is in.
pub mod states {
    /// Waiting for a decision.
    pub const PENDING: &str = "pending";
    /// Approved, with uses left.
    pub const APPROVED: &str = "approved";
    /// Denied.
    pub const DENIED: &str = "denied";
    /// Approved and used up.
    pub const SPENT: &str = "spent";
    /// Not decided, or not used, in time.
    pub const EXPIRED: &str = "expired";
}

/// The PostgreSQL channel on which a request or a decision is announced
/// (payload: the approval's id), so that calls waiting at other replicas
/// and watches wake at once.
pub const CHANNEL: &str = "toolgate_call_approvals";

/// The PostgreSQL advisory lock a request holds for (`tenant`, `subject`)
/// until it commits, so that of racing requests of one subject at most its
/// limit are stored (`tgapv:` and the first bytes of a SHA-256).
fn request_lock_key(tenant: &str, subject: &str) -> i64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("tgapv:{tenant}\u{0}{subject}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The associated data of a row's sealed value.
fn approval_aad(id: &str, tenant: &str) -> Vec<u8> {
    aad("call_approval", &[id, tenant])
}

/// One call approval as stored, its value opened.
#[derive(Clone, PartialEq, Eq)]
pub struct ApprovalRow {
    /// Its id.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// The subject key of the call it holds.
    pub subject: String,
    /// The digest of what it binds.
    pub binding: String,
    /// One of [`states`], as stored (a live-looking row past its expiry is
    /// expired: [`ApprovalRow::state_now`]).
    pub state: String,
    /// Uses left (approved), or granted on approval (pending).
    pub uses_left: i64,
    /// When it was requested (Unix milliseconds).
    pub created_at_ms: i64,
    /// When it expires undecided (pending) or unused (approved).
    pub expires_at_ms: i64,
    /// When it was decided (0: not yet).
    pub decided_at_ms: i64,
    /// When it last changed.
    pub changed_at_ms: i64,
    /// The caller's value, opened.
    pub value: Vec<u8>,
}

impl std::fmt::Debug for ApprovalRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalRow")
            .field("id", &self.id)
            .field("tenant", &self.tenant)
            .field("state", &self.state)
            .field("uses_left", &self.uses_left)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("value", &format_args!("<{} bytes>", self.value.len()))
            .finish_non_exhaustive()
    }
}

impl ApprovalRow {
    /// The state at `now_ms`: a pending or approved row past its expiry is
    /// expired, whether or not a sweep marked it yet.
    #[must_use]
    pub fn state_now(&self, now_ms: i64) -> &str {
        let live = matches!(self.state.as_str(), states::PENDING | states::APPROVED);
        if live && self.expires_at_ms <= now_ms {
            states::EXPIRED
        } else {
            &self.state
        }
    }
}

/// A call approval to request.
#[derive(Debug)]
pub struct NewApproval<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its tenant.
    pub tenant: &'a str,
    /// The subject key of the call.
    pub subject: &'a str,
    /// The digest of what it binds.
    pub binding: &'a str,
    /// Uses granted on approval.
    pub uses: u32,
    /// When it expires undecided (Unix milliseconds).
    pub expires_at_ms: i64,
    /// The caller's value (sealed here).
    pub value: &'a [u8],
}

/// What [`StateStore::request_call_approval`] did.
#[derive(Debug)]
pub enum Requested {
    /// The approval was stored, pending.
    Stored,
    /// The subject already has a live pending approval of the same
    /// binding: that one (nothing was stored).
    Existing(Box<ApprovalRow>),
    /// The subject has its limit of pending approvals (nothing was stored).
    Limit,
}

const COLUMNS: &str = "id, tenant, subject, binding, state, uses_left, created_at_ms, \
                       expires_at_ms, decided_at_ms, changed_at_ms, sealed";

impl StateStore {
    /// Stores `new`, pending, unless its subject already has a live pending
    /// approval of the same binding (answered instead), or `max_pending`
    /// live pending approvals. The check and the insert are one step (on
    /// PostgreSQL the subject's requests are locked for the transaction;
    /// on SQLite the statement holds the write lock).
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn request_call_approval(
        &self,
        new: &NewApproval<'_>,
        max_pending: u32,
    ) -> Result<Requested, StateError> {
        let pool = self.ready().await?;
        // On SQLite the transaction takes the write lock before it reads:
        // a deferred one that read first fails at once (`SQLITE_BUSY`, no
        // wait) when another request committed in between.
        let mut tx = match self.backend {
            Backend::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await,
            Backend::Postgres => pool.begin().await,
        }
        .map_err(StateError::from_sqlx)?;
        if self.backend == Backend::Postgres {
            // `count` so the Any driver has a column type it knows (the
            // lock function returns `void`).
            sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_xact_lock($1)) AS locked")
                .bind(request_lock_key(new.tenant, new.subject))
                .execute(&mut *tx)
                .await
                .map_err(StateError::from_sqlx)?;
        }
        let now = now_ms();
        let existing = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM toolgate_call_approvals \
             WHERE tenant = $1 AND binding = $2 AND state = 'pending' AND expires_at_ms > $3 \
             ORDER BY created_at_ms DESC LIMIT 1"
        ))
        .bind(new.tenant)
        .bind(new.binding)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StateError::from_sqlx)?;
        if let Some(row) = existing.and_then(|row| self.readable(&row)) {
            tx.commit().await.map_err(StateError::from_sqlx)?;
            return Ok(Requested::Existing(Box::new(row)));
        }
        let done = sqlx::query(
            "INSERT INTO toolgate_call_approvals \
             (id, tenant, subject, binding, state, uses_left, created_at_ms, expires_at_ms, \
              decided_at_ms, changed_at_ms, sealed) \
             SELECT $1, $2, $3, $4, 'pending', $5, $6, $7, 0, $6, $8 \
             WHERE (SELECT COUNT(*) FROM toolgate_call_approvals \
                    WHERE tenant = $2 AND subject = $3 AND state = 'pending' \
                      AND expires_at_ms > $6) < $9",
        )
        .bind(new.id)
        .bind(new.tenant)
        .bind(new.subject)
        .bind(new.binding)
        .bind(i64::from(new.uses))
        .bind(now)
        .bind(new.expires_at_ms)
        .bind(self.keys.seal(new.value, &approval_aad(new.id, new.tenant)))
        .bind(i64::from(max_pending))
        .execute(&mut *tx)
        .await
        .map_err(StateError::from_sqlx)?;
        tx.commit().await.map_err(StateError::from_sqlx)?;
        if done.rows_affected() == 0 {
            return Ok(Requested::Limit);
        }
        self.announce(new.id).await;
        Ok(Requested::Stored)
    }

    /// Announces a change of approval `id` to the other replicas
    /// (PostgreSQL; a lost notice only delays them to their next look).
    async fn announce(&self, id: &str) {
        if self.backend != Backend::Postgres {
            return;
        }
        let Ok(pool) = self.ready().await else { return };
        let sent = sqlx::query("SELECT count(*) FROM (SELECT pg_notify($1, $2)) AS notified")
            .bind(CHANNEL)
            .bind(id)
            .execute(pool)
            .await;
        if let Err(error) = sent {
            tracing::debug!(%error, "a call approval's change could not be announced");
        }
    }

    /// Listens for requests and decisions of call approvals at any replica
    /// (PostgreSQL only; `None` on SQLite, whose one process sees its own
    /// changes). Listening has begun when this returns.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn listen_call_approvals(&self) -> Result<Option<Notices>, StateError> {
        self.listen(CHANNEL, "call approvals").await
    }

    /// The call approval `id` of `tenant` (`None`: none, or another
    /// tenant's).
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached,
    /// [`StateError::Decrypt`] when no configured key opens its value.
    pub async fn call_approval(
        &self,
        id: &str,
        tenant: &str,
    ) -> Result<Option<ApprovalRow>, StateError> {
        let pool = self.ready().await?;
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM toolgate_call_approvals WHERE id = $1 AND tenant = $2"
        ))
        .bind(id)
        .bind(tenant)
        .fetch_optional(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(row.and_then(|row| self.readable(&row)))
    }

    /// `tenant`'s call approvals whose state now is `state` (one of
    /// [`states`]), newest first, at most `limit`.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn list_call_approvals(
        &self,
        tenant: &str,
        state: &str,
        limit: u32,
    ) -> Result<Vec<ApprovalRow>, StateError> {
        let pool = self.ready().await?;
        let now = now_ms();
        // What is live is live only before its expiry; what expired may
        // not be marked yet.
        let condition = match state {
            states::PENDING | states::APPROVED => "state = $2 AND expires_at_ms > $3",
            states::EXPIRED => {
                "(state = $2 OR (state IN ('pending', 'approved') AND expires_at_ms <= $3))"
            }
            _ => "state = $2 AND $3 = $3",
        };
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM toolgate_call_approvals WHERE tenant = $1 AND {condition} \
             ORDER BY created_at_ms DESC LIMIT $4"
        ))
        .bind(tenant)
        .bind(state)
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(rows.iter().filter_map(|row| self.readable(row)).collect())
    }

    /// `tenant`'s call approvals that changed at or after `since_ms`, in
    /// the order they changed, at most `limit` (what watchers follow).
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn call_approvals_changed_since(
        &self,
        tenant: &str,
        since_ms: i64,
        limit: u32,
    ) -> Result<Vec<ApprovalRow>, StateError> {
        let pool = self.ready().await?;
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM toolgate_call_approvals \
             WHERE tenant = $1 AND changed_at_ms >= $2 ORDER BY changed_at_ms LIMIT $3"
        ))
        .bind(tenant)
        .bind(since_ms)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(rows.iter().filter_map(|row| self.readable(row)).collect())
    }

    /// Decides the pending, live approval `id` of `tenant`: its state
    /// becomes `state` (approved or denied), its value `value`, and it
    /// expires at `expires_at_ms`. Returns whether it was pending and live
    /// (of racing decisions, one wins).
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn decide_call_approval(
        &self,
        id: &str,
        tenant: &str,
        state: &str,
        value: &[u8],
        expires_at_ms: i64,
    ) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE toolgate_call_approvals \
             SET state = $1, sealed = $2, expires_at_ms = $3, decided_at_ms = $4, \
                 changed_at_ms = $4 \
             WHERE id = $5 AND tenant = $6 AND state = 'pending' AND expires_at_ms > $4",
        )
        .bind(state)
        .bind(self.keys.seal(value, &approval_aad(id, tenant)))
        .bind(expires_at_ms)
        .bind(now)
        .bind(id)
        .bind(tenant)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        let won = done.rows_affected() > 0;
        if won {
            self.announce(id).await;
        }
        Ok(won)
    }

    /// Uses the approved, live approval `id` of `tenant` once, when it
    /// binds `binding`: returns whether it did (of racing uses, no more
    /// than it has uses left succeed). The last use leaves it spent.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn spend_call_approval(
        &self,
        id: &str,
        tenant: &str,
        binding: &str,
    ) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE toolgate_call_approvals \
             SET uses_left = uses_left - 1, changed_at_ms = $1, \
                 state = CASE WHEN uses_left <= 1 THEN 'spent' ELSE 'approved' END \
             WHERE id = $2 AND tenant = $3 AND binding = $4 AND state = 'approved' \
               AND uses_left > 0 AND expires_at_ms > $1",
        )
        .bind(now)
        .bind(id)
        .bind(tenant)
        .bind(binding)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    /// Gives back one use of approval `id` of `tenant` (a call that spent
    /// it and then sent nothing), while it is live. Returns whether it did.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn return_call_approval(&self, id: &str, tenant: &str) -> Result<bool, StateError> {
        let pool = self.ready().await?;
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE toolgate_call_approvals \
             SET uses_left = uses_left + 1, state = 'approved', changed_at_ms = $1 \
             WHERE id = $2 AND tenant = $3 AND state IN ('approved', 'spent') \
               AND expires_at_ms > $1",
        )
        .bind(now)
        .bind(id)
        .bind(tenant)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    /// Marks every pending or approved approval past its expiry expired,
    /// and returns them (each row to exactly one of racing sweeps); deletes
    /// rows that ended before `forget_before_ms`.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn expire_call_approvals(
        &self,
        forget_before_ms: i64,
    ) -> Result<Vec<ApprovalRow>, StateError> {
        let pool = self.ready().await?;
        let now = now_ms();
        let rows = sqlx::query(&format!(
            "UPDATE toolgate_call_approvals SET state = 'expired', changed_at_ms = $1 \
             WHERE state IN ('pending', 'approved') AND expires_at_ms <= $1 \
             RETURNING {COLUMNS}"
        ))
        .bind(now)
        .fetch_all(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        sqlx::query(
            "DELETE FROM toolgate_call_approvals \
             WHERE state IN ('denied', 'spent', 'expired') AND changed_at_ms < $1",
        )
        .bind(forget_before_ms)
        .execute(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        Ok(rows.iter().filter_map(|row| self.readable(row)).collect())
    }

    /// How many live pending approvals each tenant has.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the store cannot be reached.
    pub async fn pending_call_approvals(&self) -> Result<Vec<(String, u64)>, StateError> {
        let pool = self.ready().await?;
        let rows = sqlx::query(
            "SELECT tenant, COUNT(*) FROM toolgate_call_approvals \
             WHERE state = 'pending' AND expires_at_ms > $1 GROUP BY tenant",
        )
        .bind(now_ms())
        .fetch_all(pool)
        .await
        .map_err(StateError::from_sqlx)?;
        rows.iter()
            .map(|row| {
                let tenant: String = get(row, 0, Record::CallApproval)?;
                let count: i64 = get(row, 1, Record::CallApproval)?;
                Ok((tenant, u64::try_from(count).unwrap_or(0)))
            })
            .collect()
    }

    /// A row of [`COLUMNS`] whose value a configured key opens; `None`
    /// (logged) for one sealed with a key no longer configured (a process
    /// key of a gateway since restarted, a key removed from `state.keys`)
    /// or altered: it reads as absent, and ends and goes as any other.
    fn readable(&self, row: &sqlx::any::AnyRow) -> Option<ApprovalRow> {
        match self.approval_row(row) {
            Ok(row) => Some(row),
            Err(error) => {
                tracing::warn!(%error, "a call approval cannot be read and is passed over (sealed with a key no longer configured?)");
                None
            }
        }
    }

    /// A row of [`COLUMNS`], its value opened.
    fn approval_row(&self, row: &sqlx::any::AnyRow) -> Result<ApprovalRow, StateError> {
        let record = Record::CallApproval;
        let id: String = get(row, 0, record)?;
        let tenant: String = get(row, 1, record)?;
        let sealed: Vec<u8> = get(row, 10, record)?;
        let value = self.open(&sealed, &approval_aad(&id, &tenant), record)?;
        Ok(ApprovalRow {
            subject: get(row, 2, record)?,
            binding: get(row, 3, record)?,
            state: get(row, 4, record)?,
            uses_left: get(row, 5, record)?,
            created_at_ms: get(row, 6, record)?,
            expires_at_ms: get(row, 7, record)?,
            decided_at_ms: get(row, 8, record)?,
            changed_at_ms: get(row, 9, record)?,
            value,
            id,
            tenant,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (StateStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let store = StateStore::open_lazy(&url, crate::state::KeyRing::ephemeral()).unwrap();
        (store, dir)
    }

    fn new<'a>(id: &'a str, subject: &'a str, binding: &'a str) -> NewApproval<'a> {
        NewApproval {
            id,
            tenant: "acme",
            subject,
            binding,
            uses: 2,
            expires_at_ms: now_ms() + 60_000,
            value: b"details",
        }
    }

    #[tokio::test]
    async fn a_request_is_decided_once_and_spent_by_its_binding_only() {
        let (store, _dir) = store().await;
        assert!(matches!(
            store
                .request_call_approval(&new("apv_1", "token:a", "b1"), 5)
                .await
                .unwrap(),
            Requested::Stored
        ));
        // The same binding again: the pending one.
        match store
            .request_call_approval(&new("apv_2", "token:a", "b1"), 5)
            .await
            .unwrap()
        {
            Requested::Existing(row) => assert_eq!(row.id, "apv_1"),
            other => panic!("{other:?}"),
        }
        assert!(
            store
                .call_approval("apv_1", "other")
                .await
                .unwrap()
                .is_none()
        );
        let row = store.call_approval("apv_1", "acme").await.unwrap().unwrap();
        assert_eq!(row.value, b"details");
        assert_eq!(row.state, states::PENDING);
        // Not spendable before it is approved.
        assert!(
            !store
                .spend_call_approval("apv_1", "acme", "b1")
                .await
                .unwrap()
        );
        let until = now_ms() + 60_000;
        assert!(
            store
                .decide_call_approval("apv_1", "acme", states::APPROVED, b"yes", until)
                .await
                .unwrap()
        );
        // Decided once.
        assert!(
            !store
                .decide_call_approval("apv_1", "acme", states::DENIED, b"no", until)
                .await
                .unwrap()
        );
        assert!(
            !store
                .spend_call_approval("apv_1", "acme", "b2")
                .await
                .unwrap()
        );
        assert!(
            store
                .spend_call_approval("apv_1", "acme", "b1")
                .await
                .unwrap()
        );
        assert!(store.return_call_approval("apv_1", "acme").await.unwrap());
        assert!(
            store
                .spend_call_approval("apv_1", "acme", "b1")
                .await
                .unwrap()
        );
        assert!(
            store
                .spend_call_approval("apv_1", "acme", "b1")
                .await
                .unwrap()
        );
        assert!(
            !store
                .spend_call_approval("apv_1", "acme", "b1")
                .await
                .unwrap()
        );
        let row = store.call_approval("apv_1", "acme").await.unwrap().unwrap();
        assert_eq!((row.state.as_str(), row.uses_left), (states::SPENT, 0));
        assert_eq!(row.value, b"yes");
    }

    /// Concurrent requests on one SQLite file are all stored: the
    /// request's transaction takes the write lock before it reads, so none
    /// fails with `SQLITE_BUSY` when another committed since its read.
    #[tokio::test]
    async fn concurrent_requests_on_sqlite_are_all_stored() {
        let (store, _dir) = store().await;
        let store = std::sync::Arc::new(store);
        let mut requests = Vec::new();
        for task in 0..16 {
            let store = store.clone();
            requests.push(tokio::spawn(async move {
                for n in 0..10 {
                    let (id, binding) = (format!("apv_{task}_{n}"), format!("b{task}_{n}"));
                    let subject = format!("token:{task}");
                    let requested = store
                        .request_call_approval(&new(&id, &subject, &binding), 1000)
                        .await;
                    assert!(matches!(requested, Ok(Requested::Stored)), "{requested:?}");
                }
            }));
        }
        for request in requests {
            request.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_subject_has_a_bounded_number_pending_and_expiry_is_swept_once() {
        let (store, _dir) = store().await;
        for i in 0..3 {
            let id = format!("apv_{i}");
            let binding = format!("b{i}");
            let requested = store
                .request_call_approval(&new(&id, "token:a", &binding), 3)
                .await
                .unwrap();
            assert!(matches!(requested, Requested::Stored), "{requested:?}");
        }
        let over = store
            .request_call_approval(&new("apv_x", "token:a", "bx"), 3)
            .await
            .unwrap();
        assert!(matches!(over, Requested::Limit), "{over:?}");
        // Another subject has its own room.
        let other = store
            .request_call_approval(&new("apv_y", "token:b", "by"), 3)
            .await
            .unwrap();
        assert!(matches!(other, Requested::Stored));
        assert_eq!(
            store.pending_call_approvals().await.unwrap(),
            vec![("acme".to_owned(), 4)]
        );
        let mut short = new("apv_z", "token:c", "bz");
        short.expires_at_ms = now_ms() - 1;
        store.request_call_approval(&short, 3).await.unwrap();
        let row = store.call_approval("apv_z", "acme").await.unwrap().unwrap();
        assert_eq!(row.state_now(now_ms()), states::EXPIRED);
        let listed = store
            .list_call_approvals("acme", states::EXPIRED, 10)
            .await
            .unwrap();
        assert_eq!(listed.len(), 1);
        let swept = store.expire_call_approvals(0).await.unwrap();
        assert_eq!(swept.len(), 1);
        assert_eq!(swept[0].id, "apv_z");
        assert!(store.expire_call_approvals(0).await.unwrap().is_empty());
        assert_eq!(
            store
                .list_call_approvals("acme", states::PENDING, 10)
                .await
                .unwrap()
                .len(),
            4
        );
        // Forgotten once ended long enough ago.
        store.expire_call_approvals(now_ms() + 1).await.unwrap();
        assert!(
            store
                .call_approval("apv_z", "acme")
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn rows_sealed_with_a_key_no_longer_configured_read_as_absent() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let before = StateStore::open_lazy(&url, crate::state::KeyRing::ephemeral()).unwrap();
        before
            .request_call_approval(&new("apv_old", "token:a", "b1"), 5)
            .await
            .unwrap();
        // A restart without state.keys: another process key.
        let after = StateStore::open_lazy(&url, crate::state::KeyRing::ephemeral()).unwrap();
        assert!(
            after
                .call_approval("apv_old", "acme")
                .await
                .unwrap()
                .is_none()
        );
        for state in [states::PENDING, states::EXPIRED] {
            assert!(
                after
                    .list_call_approvals("acme", state, 10)
                    .await
                    .unwrap()
                    .is_empty()
            );
        }
        assert!(
            after
                .call_approvals_changed_since("acme", 0, 10)
                .await
                .unwrap()
                .is_empty()
        );
        // The same call asks anew instead of finding what it cannot read.
        assert!(matches!(
            after
                .request_call_approval(&new("apv_new", "token:a", "b1"), 5)
                .await
                .unwrap(),
            Requested::Stored
        ));
        assert!(
            after
                .call_approval("apv_new", "acme")
                .await
                .unwrap()
                .is_some()
        );
    }
}
