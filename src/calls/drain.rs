//! Draining: once shutdown reaches the drain stage, new calls are refused
//! (UNAVAILABLE, safe to retry elsewhere) while calls in flight finish. The
//! listener stays open meanwhile, so health checks keep answering
//! NOT_SERVING for the whole drain.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Counts calls in flight and refuses new ones while draining.
#[derive(Debug, Default)]
pub struct Drain {
    draining: AtomicBool,
    started: CancellationToken,
    in_flight: AtomicUsize,
    idle: Notify,
}

/// Held by a call in flight.
#[derive(Debug)]
pub struct CallGuard(Arc<Drain>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Drain {
    /// Admits a call, or `None` while draining.
    pub fn enter(self: &Arc<Self>) -> Option<CallGuard> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = CallGuard(self.clone());
        (!self.draining.load(Ordering::Acquire)).then_some(guard)
    }

    /// Refuses new calls from now on.
    pub fn start(&self) {
        self.draining.store(true, Ordering::Release);
        self.started.cancel();
    }

    /// Resolves once the drain has started.
    pub async fn draining(&self) {
        self.started.cancelled().await;
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Resolves once no call is in flight.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_new_calls_and_waits_for_running_ones() {
        let drain = Arc::new(Drain::default());
        let running = drain.enter().expect("admitted");
        drain.start();
        assert!(drain.enter().is_none());
        let waiter = tokio::spawn({
            let drain = drain.clone();
            async move { drain.idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(running);
        waiter.await.unwrap();
        assert_eq!(drain.in_flight(), 0);
    }
}
