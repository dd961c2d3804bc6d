//! What a `WatchResource` stream holds of its tenant: a place among the
//! tenant's `limits.max_watches` open watches, and the stop of the slot it
//! watches (a reload that removes or changes the server stops it).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use super::Tenant;

/// One open watch of a tenant, counted until it drops.
#[derive(Debug)]
pub struct WatchPermit(Arc<AtomicUsize>);

impl Drop for WatchPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Tenant {
    /// A place for one more open watch, unless the tenant has
    /// `limits.max_watches` open (counted across reloads, per replica).
    #[must_use]
    pub fn open_watch(&self) -> Option<WatchPermit> {
        let watches = &self.publication().watches;
        let limit = self.limits().max_watches;
        watches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < limit).then_some(open + 1)
            })
            .ok()
            .map(|_| WatchPermit(watches.clone()))
    }

    /// Cancelled when server `index`'s slot stops for good: a reload
    /// removed or changed the server, or the gateway shuts down. `None`
    /// for an index the tenant does not have.
    #[must_use]
    pub fn server_stopped(&self, index: usize) -> Option<CancellationToken> {
        self.slots.get(index).map(|slot| slot.stop.clone())
    }
}
