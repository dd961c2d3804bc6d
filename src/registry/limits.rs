//! Call limits: per-tenant rate (token bucket) and concurrency, the same
//! per subject of a tenant ([`subjects`]), and per-server concurrency, each
//! with a bounded wait. Beyond a limit a call is shed at once with
//! RESOURCE_EXHAUSTED; nothing queues without bound.

pub mod subjects;

use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::callers::Subject;
use crate::config::TenantLimits;

pub use subjects::{MAX_SUBJECTS, SubjectLimiter, SubjectPermit};

/// Which limit shed a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shed {
    /// The tenant's `rate_per_second`; retry after the given time.
    Rate(Duration),
    /// The tenant's `max_concurrent_calls`.
    TenantConcurrency(usize),
    /// The server's `max_concurrent_calls`.
    ServerConcurrency(usize),
    /// The subject's `limits.per_subject.rate_per_second`; retry after the
    /// given time.
    SubjectRate(Duration),
    /// The subject's `limits.per_subject.max_concurrent_calls`.
    SubjectConcurrency(usize),
}

/// A concurrency limit with a bounded wait.
#[derive(Debug)]
pub struct Concurrency {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl Concurrency {
    /// At most `limit` holders at once.
    pub fn new(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// A slot, waiting at most `wait`; `None` when none came free.
    pub async fn acquire(&self, wait: Duration) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Some(permit);
        }
        if wait.is_zero() {
            return None;
        }
        tokio::time::timeout(wait, self.permits.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// The configured limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// A tenant's limits, and its subjects'.
pub struct TenantLimiter {
    rate: Option<DefaultDirectRateLimiter>,
    concurrency: Option<Concurrency>,
    queue_timeout: Duration,
    subjects: Option<SubjectLimiter>,
}

impl std::fmt::Debug for TenantLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantLimiter")
            .field("rate", &self.rate.is_some())
            .field("concurrency", &self.concurrency)
            .field("queue_timeout", &self.queue_timeout)
            .field("subjects", &self.subjects)
            .finish()
    }
}

/// Permits held for the duration of a call.
#[derive(Debug, Default)]
pub struct Admission {
    _tenant: Option<OwnedSemaphorePermit>,
    _subject: Option<SubjectPermit>,
}

impl TenantLimiter {
    /// `tenant`'s limits as configured.
    pub fn new(tenant: &str, limits: &TenantLimits) -> Self {
        let rate = limits.rate_per_second.map(|rate| {
            let burst = limits.burst.unwrap_or(rate);
            RateLimiter::direct(Quota::per_second(rate).allow_burst(burst))
        });
        Self {
            rate,
            concurrency: limits.max_concurrent_calls.map(Concurrency::new),
            queue_timeout: limits.queue_timeout,
            subjects: limits
                .per_subject
                .as_ref()
                .map(|per_subject| SubjectLimiter::new(tenant, per_subject, MAX_SUBJECTS)),
        }
    }

    /// How long a call may wait for a slot.
    pub fn queue_timeout(&self) -> Duration {
        self.queue_timeout
    }

    /// Takes one token from `subject`'s rate bucket, then one from the
    /// tenant's (catalog RPCs count against the rates, not the
    /// concurrency). The subject's comes first: a subject past its own
    /// rate takes nothing from its tenant's.
    ///
    /// # Errors
    /// The subject's or the tenant's rate limit is reached.
    pub fn check_rate(&self, subject: &Subject) -> Result<(), Shed> {
        if let Some(subjects) = &self.subjects {
            subjects.check_rate(subject)?;
        }
        if let Some(rate) = &self.rate
            && let Err(not_until) = rate.check()
        {
            return Err(Shed::Rate(
                not_until.wait_time_from(DefaultClock::default().now()),
            ));
        }
        Ok(())
    }

    /// Admits `subject`'s call or says which limit shed it: the rates,
    /// then a slot of the subject's and one of the tenant's, both within
    /// one `queue_timeout` (a subject waiting on its own limit holds none
    /// of the tenant's slots).
    ///
    /// # Errors
    /// A rate or concurrency limit is reached.
    pub async fn admit(&self, subject: &Subject) -> Result<Admission, Shed> {
        self.check_rate(subject)?;
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        let subject = match &self.subjects {
            Some(subjects) => subjects.acquire(subject, self.queue_timeout).await?,
            None => None,
        };
        let tenant = match &self.concurrency {
            Some(c) => Some(
                c.acquire(deadline.saturating_duration_since(tokio::time::Instant::now()))
                    .await
                    .ok_or(Shed::TenantConcurrency(c.limit()))?,
            ),
            None => None,
        };
        Ok(Admission {
            _tenant: tenant,
            _subject: subject,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    #[tokio::test]
    async fn concurrency_sheds_beyond_the_limit() {
        let limiter = TenantLimiter::new(
            "acme",
            &TenantLimits {
                max_concurrent_calls: Some(1),
                queue_timeout: Duration::ZERO,
                ..TenantLimits::default()
            },
        );
        let first = limiter.admit(&Subject::tenant()).await.unwrap();
        assert_eq!(
            limiter.admit(&Subject::tenant()).await.unwrap_err(),
            Shed::TenantConcurrency(1)
        );
        drop(first);
        assert!(limiter.admit(&Subject::tenant()).await.is_ok());
    }

    #[tokio::test]
    async fn a_subject_past_its_limits_takes_nothing_of_its_tenants() {
        use crate::callers::Namespace;
        let limiter = TenantLimiter::new(
            "acme",
            &TenantLimits {
                rate_per_second: Some(NonZeroU32::MIN),
                burst: NonZeroU32::new(3),
                max_concurrent_calls: Some(2),
                queue_timeout: Duration::ZERO,
                per_subject: Some(crate::config::SubjectLimits {
                    rate_per_second: Some(NonZeroU32::MIN),
                    burst: NonZeroU32::new(2),
                    max_concurrent_calls: Some(1),
                }),
            },
        );
        let alice = Subject::named(Namespace::Token, "alice").unwrap();
        let bob = Subject::named(Namespace::Token, "bob").unwrap();
        let held = limiter.admit(&alice).await.unwrap();
        // Alice's second call: her own slot is taken (one tenant token
        // spent), then her bucket is empty.
        assert_eq!(
            limiter.admit(&alice).await.unwrap_err(),
            Shed::SubjectConcurrency(1)
        );
        for _ in 0..5 {
            assert!(matches!(
                limiter.admit(&alice).await,
                Err(Shed::SubjectRate(_))
            ));
        }
        // Bob gets the tenant's last token and its other slot.
        let _bob = limiter.admit(&bob).await.unwrap();
        assert!(matches!(limiter.admit(&bob).await, Err(Shed::Rate(_))));
        drop(held);
    }

    #[tokio::test]
    async fn rate_sheds_beyond_the_burst() {
        let limiter = TenantLimiter::new(
            "acme",
            &TenantLimits {
                rate_per_second: Some(NonZeroU32::MIN),
                burst: NonZeroU32::new(2),
                ..TenantLimits::default()
            },
        );
        assert!(limiter.admit(&Subject::tenant()).await.is_ok());
        assert!(limiter.admit(&Subject::tenant()).await.is_ok());
        assert!(matches!(
            limiter.admit(&Subject::tenant()).await,
            Err(Shed::Rate(_))
        ));
    }
}
