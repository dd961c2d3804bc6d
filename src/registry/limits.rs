//! Call limits: per-tenant rate (token bucket) and concurrency, and
//! per-server concurrency, each with a bounded wait. Beyond a limit a call
//! is shed at once with RESOURCE_EXHAUSTED; nothing queues without bound.

use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::TenantLimits;

/// Which limit shed a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shed {
    /// The tenant's `rate_per_second`; retry after the given time.
    Rate(Duration),
    /// The tenant's `max_concurrent_calls`.
    TenantConcurrency(usize),
    /// The server's `max_concurrent_calls`.
    ServerConcurrency(usize),
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

/// A tenant's limits.
pub struct TenantLimiter {
    rate: Option<DefaultDirectRateLimiter>,
    concurrency: Option<Concurrency>,
    queue_timeout: Duration,
}

impl std::fmt::Debug for TenantLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantLimiter")
            .field("rate", &self.rate.is_some())
            .field("concurrency", &self.concurrency)
            .field("queue_timeout", &self.queue_timeout)
            .finish()
    }
}

/// Permits held for the duration of a call.
#[derive(Debug, Default)]
pub struct Admission {
    _tenant: Option<OwnedSemaphorePermit>,
}

impl TenantLimiter {
    /// Limits as configured.
    pub fn new(limits: &TenantLimits) -> Self {
        let rate = limits.rate_per_second.map(|rate| {
            let burst = limits.burst.unwrap_or(rate);
            RateLimiter::direct(Quota::per_second(rate).allow_burst(burst))
        });
        Self {
            rate,
            concurrency: limits.max_concurrent_calls.map(Concurrency::new),
            queue_timeout: limits.queue_timeout,
        }
    }

    /// How long a call may wait for a slot.
    pub fn queue_timeout(&self) -> Duration {
        self.queue_timeout
    }

    /// Takes one token from the rate bucket (catalog RPCs count against
    /// the tenant's rate, not its concurrency).
    ///
    /// # Errors
    /// The rate limit is reached.
    pub fn check_rate(&self) -> Result<(), Shed> {
        if let Some(rate) = &self.rate
            && let Err(not_until) = rate.check()
        {
            return Err(Shed::Rate(
                not_until.wait_time_from(DefaultClock::default().now()),
            ));
        }
        Ok(())
    }

    /// Admits a call or says which limit shed it.
    ///
    /// # Errors
    /// The rate or concurrency limit is reached.
    pub async fn admit(&self) -> Result<Admission, Shed> {
        self.check_rate()?;
        let tenant = match &self.concurrency {
            Some(c) => Some(
                c.acquire(self.queue_timeout)
                    .await
                    .ok_or(Shed::TenantConcurrency(c.limit()))?,
            ),
            None => None,
        };
        Ok(Admission { _tenant: tenant })
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    #[tokio::test]
    async fn concurrency_sheds_beyond_the_limit() {
        let limiter = TenantLimiter::new(&TenantLimits {
            max_concurrent_calls: Some(1),
            queue_timeout: Duration::ZERO,
            ..TenantLimits::default()
        });
        let first = limiter.admit().await.unwrap();
        assert_eq!(
            limiter.admit().await.unwrap_err(),
            Shed::TenantConcurrency(1)
        );
        drop(first);
        assert!(limiter.admit().await.is_ok());
    }

    #[tokio::test]
    async fn rate_sheds_beyond_the_burst() {
        let limiter = TenantLimiter::new(&TenantLimits {
            rate_per_second: Some(NonZeroU32::MIN),
            burst: NonZeroU32::new(2),
            ..TenantLimits::default()
        });
        assert!(limiter.admit().await.is_ok());
        assert!(limiter.admit().await.is_ok());
        assert!(matches!(limiter.admit().await, Err(Shed::Rate(_))));
    }
}
