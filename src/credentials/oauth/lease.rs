//! One renewal per key at a time across tasks and replicas: the refresh
//! lease ([`OAuthStore::lock_refresh`]), held by the renewing task while
//! the others wait for its token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::transport::auth::StoredCredentials;

use super::freshness::renewed;
use super::{OAuthClient, OAuthError, OAuthStore};
use crate::config::Secret;
use crate::state::TokenKey;

/// How long a refresh lease is held at most: a renewal that takes longer
/// lets another task or replica try.
pub const REFRESH_LEASE_TTL: Duration = Duration::from_secs(30);

/// How often a task that found the refresh lease taken looks for the
/// holder's token.
const REFRESH_POLL: Duration = Duration::from_millis(100);

/// How long it looks before trying the lease once more.
pub(super) const REFRESH_WAIT: Duration = Duration::from_secs(10);

/// Refresh leases held in this process, per key, each until its time runs
/// out. [`MemoryStore`] uses it alone; the state store's adapter in front of
/// its shared lease, so tasks of one process also exclude each other.
#[derive(Debug, Default)]
pub(crate) struct LocalLeases {
    held: Mutex<HashMap<TokenKey, Instant>>,
}

impl LocalLeases {
    /// Takes the lease of `key` for `ttl` unless it is held and live.
    pub(crate) fn try_take(&self, key: &TokenKey, ttl: Duration) -> bool {
        let now = Instant::now();
        let until = now
            .checked_add(ttl)
            .unwrap_or(now + Duration::from_secs(86_400));
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.retain(|_, until| *until > now);
        if held.contains_key(key) {
            return false;
        }
        held.insert(key.clone(), until);
        true
    }

    /// Gives the lease of `key` back.
    pub(crate) fn release(&self, key: &TokenKey) {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }
}

/// A refresh lease taken with [`OAuthStore::lock_refresh`]: given back by
/// [`RefreshLease::release`], or, when the renewal is abandoned (its future
/// dropped), by a task spawned on drop.
struct RefreshLease {
    store: Arc<dyn OAuthStore>,
    key: TokenKey,
    held: bool,
}

impl RefreshLease {
    async fn release(mut self) {
        if let Err(e) = self.store.unlock_refresh(&self.key).await {
            tracing::warn!(tenant = %self.key.tenant, server = %self.key.server, error = %e, "the refresh lease could not be given back; it runs out by itself");
        }
        self.held = false;
    }
}

impl Drop for RefreshLease {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
            let key = self.key.clone();
            runtime.spawn(async move {
                let _ = store.unlock_refresh(&key).await;
            });
        }
    }
}

impl OAuthClient {
    /// Runs `renew` (which asks the token endpoint and stores the result)
    /// for `key` while holding its refresh lease ([`REFRESH_LEASE_TTL`]),
    /// and gives the lease back afterwards, whatever the outcome. `stale` is
    /// the access token being replaced, if any.
    ///
    /// When another task or replica holds the lease, its token is awaited:
    /// the stored credentials are read every [`REFRESH_POLL`] until a fresh
    /// token other than `stale` appears, for at most [`REFRESH_WAIT`] (less
    /// when the credentials disappear: the holder gave up). Then the lease
    /// is tried once more; still taken, the renewal fails with
    /// [`OAuthError::RefreshInProgress`]. Once the lease is held, the stored
    /// credentials are read again (the previous holder may have just
    /// finished) and handed to `renew`.
    pub(super) async fn renew_exclusively<F, Fut>(
        &self,
        key: &TokenKey,
        stale: Option<&str>,
        renew: F,
    ) -> Result<Secret, OAuthError>
    where
        F: FnOnce(Option<StoredCredentials>) -> Fut,
        Fut: Future<Output = Result<Secret, OAuthError>>,
    {
        if !self.store.lock_refresh(key, REFRESH_LEASE_TTL).await? {
            tracing::debug!(tenant = %key.tenant, server = %key.server, "another holder is renewing this token; waiting for its token");
            if let Some(token) = self.await_renewed(key, stale).await? {
                return Ok(token);
            }
            if !self.store.lock_refresh(key, REFRESH_LEASE_TTL).await? {
                return Err(OAuthError::RefreshInProgress);
            }
        }
        let lease = RefreshLease {
            store: self.store.clone(),
            key: key.clone(),
            held: true,
        };
        let outcome = async {
            let current = self.store.load_credentials(key).await?;
            if let Some(token) = current.as_ref().and_then(|c| renewed(c, stale)) {
                return Ok(token);
            }
            renew(current).await
        }
        .await;
        lease.release().await;
        outcome
    }

    /// Reads the credentials of `key` every [`REFRESH_POLL`] until a fresh
    /// token other than `stale` appears (`Some`), the credentials disappear
    /// after having been seen, or `refresh_wait` passes (`None`).
    async fn await_renewed(
        &self,
        key: &TokenKey,
        stale: Option<&str>,
    ) -> Result<Option<Secret>, OAuthError> {
        let deadline = Instant::now() + self.refresh_wait;
        let mut seen = false;
        loop {
            tokio::time::sleep(REFRESH_POLL).await;
            match self.store.load_credentials(key).await? {
                Some(now) => {
                    if let Some(token) = renewed(&now, stale) {
                        return Ok(Some(token));
                    }
                    seen = true;
                }
                None if seen => return Ok(None),
                None => {}
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Grant;
    use crate::credentials::oauth::MemoryStore;
    use crate::credentials::oauth::freshness::access_of;
    use crate::credentials::oauth::testing::{alice_with, expired, live, stored_later};

    #[tokio::test]
    async fn memory_refresh_leases_exclude_until_given_back_or_run_out() {
        let store = MemoryStore::new();
        let alice = TokenKey::new("t", "alice", "s");
        let bob = TokenKey::new("t", "bob", "s");
        let ttl = Duration::from_secs(30);
        assert!(store.lock_refresh(&alice, ttl).await.unwrap());
        assert!(!store.lock_refresh(&alice, ttl).await.unwrap());
        assert!(store.lock_refresh(&bob, ttl).await.unwrap());
        store.unlock_refresh(&alice).await.unwrap();
        assert!(
            store
                .lock_refresh(&alice, Duration::from_millis(20))
                .await
                .unwrap()
        );
        assert!(!store.lock_refresh(&alice, ttl).await.unwrap());
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(store.lock_refresh(&alice, ttl).await.unwrap(), "ran out");
        assert!(!store.lock_refresh(&bob, ttl).await.unwrap());
    }

    #[tokio::test]
    async fn concurrent_renewals_ask_once_and_share_the_token() {
        let (store, client, key) = alice_with(Grant::AuthorizationCode, expired("old"));
        let asked = std::sync::atomic::AtomicU32::new(0);
        let renew = |_current: Option<StoredCredentials>| async {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            store.set_credentials(&key, Some(live("new")));
            Ok(Secret::new("new"))
        };
        let (a, b, c) = tokio::join!(
            client.renew_exclusively(&key, Some("old"), renew),
            client.renew_exclusively(&key, Some("old"), renew),
            client.renew_exclusively(&key, Some("old"), renew),
        );
        for token in [a, b, c] {
            assert_eq!(token.expect("a token").expose(), "new");
        }
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(
            store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap(),
            "the lease was given back"
        );
    }

    #[tokio::test]
    async fn a_lease_loser_reads_the_holders_token_through_access_token() {
        for grant in [Grant::AuthorizationCode, Grant::ClientCredentials] {
            let (store, client, key) = alice_with(grant, expired("old"));
            // Another replica holds the lease and stores its token later.
            assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
            let writer = stored_later(&store, &key, 350, Some(live("renewed")));
            let token = client.access_token(&key).await.expect("the holder's token");
            assert_eq!(token.expose(), "renewed", "{grant:?}");
            writer.await.unwrap();
            // The loser never held the lease, so it did not give it back.
            assert!(!store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        }
    }

    #[tokio::test]
    async fn a_refused_token_is_renewed_under_the_lease() {
        let (store, client, key) = alice_with(Grant::ClientCredentials, live("refused"));
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        let writer = stored_later(&store, &key, 250, Some(live("replacement")));
        let token = client
            .refused(&key, &Secret::new("refused"), None)
            .await
            .expect("the holder's token");
        assert_eq!(token.expose(), "replacement");
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_lease_never_given_back_fails_retryably() {
        let (store, mut client, key) = alice_with(Grant::AuthorizationCode, expired("old"));
        client.refresh_wait = Duration::from_millis(300);
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        let started = Instant::now();
        let error = client.access_token(&key).await.expect_err("still held");
        assert!(matches!(error, OAuthError::RefreshInProgress), "{error:?}");
        assert!(error.is_retryable());
        assert!(started.elapsed() >= Duration::from_millis(300));
        // The holder's lease is untouched.
        assert!(!store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
    }

    #[tokio::test]
    async fn credentials_cleared_by_the_holder_end_the_wait() {
        let (store, client, key) = alice_with(Grant::AuthorizationCode, expired("old"));
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        let holder = stored_later(&store, &key, 250, None);
        let started = Instant::now();
        let found = client.await_renewed(&key, Some("old")).await.unwrap();
        assert!(found.is_none());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        holder.await.unwrap();
    }

    #[tokio::test]
    async fn the_lease_is_given_back_after_a_failed_renewal() {
        // Through the real refresh: discovery fails at the discard port.
        let (store, client, key) = alice_with(Grant::AuthorizationCode, expired("old"));
        let error = client.access_token(&key).await.expect_err("unreachable");
        assert!(!matches!(error, OAuthError::RefreshInProgress), "{error:?}");
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        store.unlock_refresh(&key).await.unwrap();
        // A renewal that fails.
        let outcome = client
            .renew_exclusively(&key, Some("old"), |_| async {
                Err(OAuthError::Unreachable("down".into()))
            })
            .await;
        assert!(matches!(outcome, Err(OAuthError::Unreachable(_))));
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
        store.unlock_refresh(&key).await.unwrap();
        // A renewal abandoned midway (its caller went away).
        let abandoned = tokio::time::timeout(
            Duration::from_millis(100),
            client.renew_exclusively(&key, Some("old"), |_| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(Secret::new("never"))
            }),
        )
        .await;
        assert!(abandoned.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(store.lock_refresh(&key, REFRESH_LEASE_TTL).await.unwrap());
    }

    #[tokio::test]
    async fn the_lease_winner_uses_a_token_renewed_just_before() {
        // Read as stale, then renewed by someone who has given the lease back.
        let (_store, client, key) = alice_with(Grant::AuthorizationCode, live("renewed"));
        let token = client
            .renew_exclusively(&key, Some("old"), |_| async {
                Err(OAuthError::Refused(
                    "must not ask the token endpoint".into(),
                ))
            })
            .await
            .expect("the stored token");
        assert_eq!(token.expose(), "renewed");
        // The same token as the stale one is not taken for a renewed one.
        let outcome = client
            .renew_exclusively(&key, Some("renewed"), |current| async move {
                assert_eq!(current.as_ref().and_then(access_of), Some("renewed"));
                Ok(Secret::new("fresh"))
            })
            .await
            .expect("renewed");
        assert_eq!(outcome.expose(), "fresh");
    }
}
