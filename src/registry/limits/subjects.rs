//! Limits per subject (`tenants[].limits.per_subject`): each subject of a
//! tenant gets its own rate bucket and concurrency slots, keyed by
//! [`Subject::key`] (how the caller authenticated and the id; the tenant
//! itself, `""`, is one subject too), checked before the tenant's own so a
//! looping subject is shed without taking the tenant's tokens or slots.
//!
//! Memory is bounded. A rate bucket is dropped once it is full again
//! (governor's `retain_recent`, every [`SWEEP_INTERVAL`]), a subject's
//! concurrency slots as soon as nobody holds or waits for one. At most
//! [`MAX_SUBJECTS`] subjects are tracked per tenant for each kind of
//! limit; past that (after dropping what is idle), every subject not
//! tracked yet shares one overflow bucket and one set of overflow slots
//! with the same limits, until tracked subjects go idle. Subjects already
//! tracked keep their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::nanos::Nanos;
use governor::state::keyed::{HashMapStateStore, ShrinkableKeyedStateStore};
use governor::state::{InMemoryState, NotKeyed, StateStore};
use governor::{Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Shed;
use crate::callers::Subject;
use crate::config::SubjectLimits;

/// The most subjects of one tenant with their own rate bucket (and, apart,
/// with their own concurrency slots) in one replica.
pub const MAX_SUBJECTS: usize = 50_000;

/// How often full rate buckets are dropped.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// How often full rate buckets are dropped while [`MAX_SUBJECTS`] are
/// tracked.
const FULL_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// One tenant's limits per subject.
pub struct SubjectLimiter {
    /// The tenant (for the log line when subjects overflow).
    tenant: String,
    rate: Option<RateLimiter<Arc<str>, BoundedStore, DefaultClock>>,
    slots: Option<Arc<SubjectSlots>>,
    /// The most subjects tracked for each kind of limit.
    max_subjects: usize,
    /// When full rate buckets were last dropped.
    swept: Mutex<Instant>,
    /// Whether new subjects share the overflow bucket (logged once per
    /// episode).
    overflowing: AtomicBool,
}

impl std::fmt::Debug for SubjectLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectLimiter")
            .field("tenant", &self.tenant)
            .field("rate_subjects", &self.rate_subjects())
            .field("slot_subjects", &self.slot_subjects())
            .finish_non_exhaustive()
    }
}

impl SubjectLimiter {
    /// The limits of `tenant`'s subjects, with at most `max_subjects`
    /// tracked for each kind of limit.
    pub fn new(tenant: &str, limits: &SubjectLimits, max_subjects: usize) -> Self {
        let rate = limits.rate_per_second.map(|rate| {
            let burst = limits.burst.unwrap_or(rate);
            RateLimiter::new(
                Quota::per_second(rate).allow_burst(burst),
                BoundedStore::new(max_subjects),
                DefaultClock::default(),
            )
        });
        let slots = limits
            .max_concurrent_calls
            .map(|limit| Arc::new(SubjectSlots::new(tenant, limit, max_subjects)));
        Self {
            tenant: tenant.to_owned(),
            rate,
            slots,
            max_subjects,
            swept: Mutex::new(Instant::now()),
            overflowing: AtomicBool::new(false),
        }
    }

    /// Takes one token from `subject`'s rate bucket.
    ///
    /// # Errors
    /// [`Shed::SubjectRate`]: the subject's rate limit is reached.
    pub fn check_rate(&self, subject: &Subject) -> Result<(), Shed> {
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        self.sweep(rate);
        rate.check_key(&subject.shared_key()).map_err(|not_until| {
            Shed::SubjectRate(not_until.wait_time_from(DefaultClock::default().now()))
        })
    }

    /// One of `subject`'s concurrency slots, waiting at most `wait`.
    ///
    /// # Errors
    /// [`Shed::SubjectConcurrency`]: none came free in time.
    pub async fn acquire(
        &self,
        subject: &Subject,
        wait: Duration,
    ) -> Result<Option<SubjectPermit>, Shed> {
        match &self.slots {
            None => Ok(None),
            Some(slots) => slots
                .acquire(subject.key(), wait)
                .await
                .map(Some)
                .ok_or(Shed::SubjectConcurrency(slots.limit)),
        }
    }

    /// Subjects with a rate bucket of their own.
    pub fn rate_subjects(&self) -> usize {
        self.rate.as_ref().map_or(0, RateLimiter::len)
    }

    /// Subjects with concurrency slots of their own.
    pub fn slot_subjects(&self) -> usize {
        self.slots.as_ref().map_or(0, |slots| slots.lock().len())
    }

    /// Drops full rate buckets every [`SWEEP_INTERVAL`] (every
    /// [`FULL_SWEEP_INTERVAL`] while [`MAX_SUBJECTS`] are tracked); one
    /// caller sweeps, the others go on.
    fn sweep(&self, rate: &RateLimiter<Arc<str>, BoundedStore, DefaultClock>) {
        let full = rate.len() >= self.max_subjects;
        let interval = if full {
            FULL_SWEEP_INTERVAL
        } else {
            SWEEP_INTERVAL
        };
        let Ok(mut swept) = self.swept.try_lock() else {
            return;
        };
        if swept.elapsed() < interval {
            return;
        }
        *swept = Instant::now();
        let before = rate.len();
        rate.retain_recent();
        let after = rate.len();
        if after < before / 2 {
            rate.shrink_to_fit();
        }
        let still_full = after >= self.max_subjects;
        if still_full && !self.overflowing.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                tenant = %self.tenant,
                max_subjects = self.max_subjects,
                "limits.per_subject: the most subjects a tenant may have rate buckets of their own are active; subjects without one share one bucket until some go idle"
            );
        } else if !still_full && self.overflowing.swap(false, Ordering::Relaxed) {
            tracing::info!(
                tenant = %self.tenant,
                "limits.per_subject: subjects went idle; every subject has a rate bucket of its own again"
            );
        }
    }

    /// Drops full rate buckets now (tests).
    #[cfg(test)]
    fn sweep_now(&self) {
        if let Some(rate) = &self.rate {
            rate.retain_recent();
        }
    }
}

/// The rate buckets of at most `max` subjects, and one shared by every
/// subject beyond.
struct BoundedStore {
    subjects: HashMapStateStore<Arc<str>>,
    overflow: InMemoryState,
    max: usize,
}

impl BoundedStore {
    fn new(max: usize) -> Self {
        Self {
            subjects: HashMapStateStore::new(HashMap::default()),
            overflow: InMemoryState::default(),
            max,
        }
    }
}

impl StateStore for BoundedStore {
    type Key = Arc<str>;

    fn measure_and_replace<T, F, E>(&self, key: &Self::Key, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let overflow = {
            let subjects = self.subjects.lock();
            subjects.len() >= self.max && !subjects.contains_key(key)
        };
        if overflow {
            self.overflow.measure_and_replace(&NotKeyed::NonKey, f)
        } else {
            self.subjects.measure_and_replace(key, f)
        }
    }
}

impl ShrinkableKeyedStateStore<Arc<str>> for BoundedStore {
    fn retain_recent(&self, drop_below: Nanos) {
        self.subjects.retain_recent(drop_below);
    }

    fn shrink_to_fit(&self) {
        self.subjects.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.subjects.len()
    }

    fn is_empty(&self) -> bool {
        self.subjects.is_empty()
    }
}

/// The concurrency slots of at most `max` subjects (an entry lives while
/// someone holds or waits for one of its slots), and one set shared by
/// every subject beyond.
struct SubjectSlots {
    /// The tenant (for the log line when subjects overflow).
    tenant: String,
    limit: usize,
    max: usize,
    subjects: Mutex<HashMap<Arc<str>, Arc<Semaphore>>>,
    overflow: Arc<Semaphore>,
    /// Whether new subjects share the overflow slots (logged once per
    /// episode; changed under the map's lock).
    overflowing: AtomicBool,
}

impl SubjectSlots {
    fn new(tenant: &str, limit: usize, max: usize) -> Self {
        Self {
            tenant: tenant.to_owned(),
            limit,
            max,
            subjects: Mutex::new(HashMap::new()),
            overflow: Arc::new(Semaphore::new(limit)),
            overflowing: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Arc<Semaphore>>> {
        // The map stays consistent whatever panicked while holding it.
        self.subjects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `key`'s slots (made now if need be), or the overflow's.
    fn semaphore(&self, key: &str) -> (Option<Arc<str>>, Arc<Semaphore>) {
        let mut subjects = self.lock();
        if let Some((key, semaphore)) = subjects.get_key_value(key) {
            return (Some(key.clone()), semaphore.clone());
        }
        if subjects.len() >= self.max {
            // Entries nobody holds or waits for (one whose last waiter
            // gave up after its last holder left).
            subjects.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
        }
        if subjects.len() >= self.max {
            if !self.overflowing.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    tenant = %self.tenant,
                    max_subjects = self.max,
                    "limits.per_subject: the most subjects a tenant may have concurrency slots of their own have calls running; subjects without them share one set until some finish"
                );
            }
            return (None, self.overflow.clone());
        }
        self.overflowing.store(false, Ordering::Relaxed);
        let key: Arc<str> = Arc::from(key);
        let semaphore = Arc::new(Semaphore::new(self.limit));
        subjects.insert(key.clone(), semaphore.clone());
        (Some(key), semaphore)
    }

    /// A slot of `key`'s, waiting at most `wait`.
    async fn acquire(self: &Arc<Self>, key: &str, wait: Duration) -> Option<SubjectPermit> {
        let (key, semaphore) = self.semaphore(key);
        let permit = match semaphore.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) if wait.is_zero() => None,
            Err(_) => tokio::time::timeout(wait, semaphore.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok),
        };
        match permit {
            Some(permit) => Some(SubjectPermit {
                permit: Some(permit),
                key,
                slots: self.clone(),
            }),
            None => {
                if let Some(key) = key {
                    self.release(&key, semaphore);
                }
                None
            }
        }
    }

    /// Drops `key`'s entry when `semaphore` (the caller's clone) and the
    /// map's are the only references left: nobody holds or waits for a
    /// slot. Clones are made only under the map's lock, so the count
    /// cannot grow while it is checked.
    fn release(&self, key: &str, semaphore: Arc<Semaphore>) {
        let mut subjects = self.lock();
        if let Some(current) = subjects.get(key)
            && Arc::ptr_eq(current, &semaphore)
            && Arc::strong_count(&semaphore) == 2
        {
            subjects.remove(key);
        }
    }
}

/// A subject's concurrency slot, held for the duration of a call; the
/// subject's entry goes when its last slot is given back.
pub struct SubjectPermit {
    permit: Option<OwnedSemaphorePermit>,
    /// The subject's entry (`None`: an overflow slot).
    key: Option<Arc<str>>,
    slots: Arc<SubjectSlots>,
}

impl std::fmt::Debug for SubjectPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectPermit")
            .field("overflow", &self.key.is_none())
            .finish_non_exhaustive()
    }
}

impl Drop for SubjectPermit {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let semaphore = permit.semaphore().clone();
        drop(permit);
        if let Some(key) = &self.key {
            self.slots.release(key, semaphore);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::callers::Namespace;

    /// Per-subject limits as configured.
    fn limits(rate: Option<u32>, burst: Option<u32>, concurrent: Option<usize>) -> SubjectLimits {
        SubjectLimits {
            max_concurrent_calls: concurrent,
            rate_per_second: rate.and_then(NonZeroU32::new),
            burst: burst.and_then(NonZeroU32::new),
        }
    }

    fn subject(id: &str) -> Subject {
        Subject::named(Namespace::Token, id).unwrap()
    }

    #[test]
    fn each_subject_has_its_own_bucket() {
        let limiter = SubjectLimiter::new("acme", &limits(Some(1), Some(2), None), 10);
        let (alice, bob) = (subject("alice"), subject("bob"));
        assert!(limiter.check_rate(&alice).is_ok());
        assert!(limiter.check_rate(&alice).is_ok());
        assert!(matches!(
            limiter.check_rate(&alice),
            Err(Shed::SubjectRate(_))
        ));
        assert!(limiter.check_rate(&bob).is_ok());
        assert!(limiter.check_rate(&Subject::tenant()).is_ok());
        assert_eq!(limiter.rate_subjects(), 3);
    }

    #[test]
    fn full_buckets_are_dropped() {
        // One token every millisecond: a bucket is full again at once.
        let limiter = SubjectLimiter::new("acme", &limits(Some(1000), Some(1), None), 100);
        for i in 0..50 {
            limiter.check_rate(&subject(&format!("s{i}"))).unwrap();
        }
        assert_eq!(limiter.rate_subjects(), 50);
        std::thread::sleep(Duration::from_millis(20));
        limiter.sweep_now();
        assert_eq!(limiter.rate_subjects(), 0);
    }

    #[test]
    fn the_same_id_vouched_for_another_way_is_another_subject() {
        let limiter = SubjectLimiter::new("acme", &limits(Some(1), Some(1), None), 10);
        let by_token = subject("alice");
        let by_jwt = Subject::named(Namespace::Jwt("https://idp.example"), "alice").unwrap();
        let by_other_issuer =
            Subject::named(Namespace::Jwt("https://other.example"), "alice").unwrap();
        for alice in [&by_token, &by_jwt, &by_other_issuer] {
            assert!(limiter.check_rate(alice).is_ok(), "{}", alice.key());
        }
        assert!(limiter.check_rate(&by_jwt).is_err());
        assert_eq!(limiter.rate_subjects(), 3);
    }

    /// As if the last sweep was `ago`.
    fn swept_ago(limiter: &SubjectLimiter, ago: Duration) {
        *limiter.swept.lock().unwrap() = Instant::now().checked_sub(ago).unwrap();
    }

    #[test]
    fn checks_drop_full_buckets_every_sweep_interval() {
        let limiter = SubjectLimiter::new("acme", &limits(Some(1000), Some(1), None), 100);
        for i in 0..50 {
            limiter.check_rate(&subject(&format!("s{i}"))).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        limiter.check_rate(&subject("late")).unwrap();
        assert_eq!(
            limiter.rate_subjects(),
            51,
            "not yet: swept at most every 10 s"
        );
        swept_ago(&limiter, SWEEP_INTERVAL);
        limiter.check_rate(&subject("later")).unwrap();
        // `late`'s bucket (taken from 0 ms ago) may not be full yet.
        assert!(limiter.rate_subjects() <= 2, "{}", limiter.rate_subjects());
    }

    #[test]
    fn at_the_cap_idle_buckets_make_room_sooner() {
        let limiter = SubjectLimiter::new("acme", &limits(Some(1000), Some(1), None), 2);
        limiter.check_rate(&subject("alice")).unwrap();
        limiter.check_rate(&subject("bob")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        swept_ago(&limiter, FULL_SWEEP_INTERVAL);
        limiter.check_rate(&subject("carol")).unwrap();
        assert_eq!(limiter.rate_subjects(), 1, "carol has a bucket of her own");
    }

    #[test]
    fn subjects_past_the_cap_share_one_bucket() {
        let limiter = SubjectLimiter::new("acme", &limits(Some(1), Some(1), None), 2);
        let (alice, bob) = (subject("alice"), subject("bob"));
        limiter.check_rate(&alice).unwrap();
        limiter.check_rate(&bob).unwrap();
        // Both tracked, both busy: newcomers share the overflow bucket.
        limiter.check_rate(&subject("carol")).unwrap();
        assert!(matches!(
            limiter.check_rate(&subject("dave")),
            Err(Shed::SubjectRate(_))
        ));
        assert_eq!(limiter.rate_subjects(), 2, "memory stays bounded");
        // Tracked subjects keep their own bucket.
        assert!(matches!(
            limiter.check_rate(&alice),
            Err(Shed::SubjectRate(_))
        ));
    }

    #[tokio::test]
    async fn concurrency_is_per_subject_and_entries_go_with_their_last_holder() {
        let limiter = SubjectLimiter::new("acme", &limits(None, None, Some(1)), 10);
        let (alice, bob) = (subject("alice"), subject("bob"));
        let first = limiter.acquire(&alice, Duration::ZERO).await.unwrap();
        assert_eq!(
            limiter
                .acquire(&alice, Duration::from_millis(10))
                .await
                .unwrap_err(),
            Shed::SubjectConcurrency(1)
        );
        let other = limiter.acquire(&bob, Duration::ZERO).await.unwrap();
        assert_eq!(limiter.slot_subjects(), 2);
        drop(first);
        drop(other);
        assert_eq!(limiter.slot_subjects(), 0, "no holder, no entry");
        assert!(limiter.acquire(&alice, Duration::ZERO).await.is_ok());
    }

    #[tokio::test]
    async fn a_waiter_gets_the_slot_given_back() {
        let limiter = Arc::new(SubjectLimiter::new(
            "acme",
            &limits(None, None, Some(1)),
            10,
        ));
        let alice = subject("alice");
        let first = limiter.acquire(&alice, Duration::ZERO).await.unwrap();
        let waiter = {
            let (limiter, alice) = (limiter.clone(), alice.clone());
            tokio::spawn(async move {
                limiter
                    .acquire(&alice, Duration::from_secs(10))
                    .await
                    .map(|permit| permit.is_some())
            })
        };
        tokio::task::yield_now().await;
        drop(first);
        assert_eq!(waiter.await.unwrap(), Ok(true));
        assert_eq!(limiter.slot_subjects(), 0);
    }

    #[tokio::test]
    async fn slots_past_the_cap_are_shared() {
        let limiter = SubjectLimiter::new("acme", &limits(None, None, Some(1)), 1);
        let held = limiter
            .acquire(&subject("alice"), Duration::ZERO)
            .await
            .unwrap();
        let overflow = limiter
            .acquire(&subject("bob"), Duration::ZERO)
            .await
            .unwrap();
        assert!(
            limiter
                .acquire(&subject("carol"), Duration::ZERO)
                .await
                .is_err(),
            "bob and carol share the overflow's one slot"
        );
        assert_eq!(limiter.slot_subjects(), 1, "memory stays bounded");
        drop((held, overflow));
        assert!(
            limiter
                .acquire(&subject("carol"), Duration::ZERO)
                .await
                .is_ok()
        );
    }
}
