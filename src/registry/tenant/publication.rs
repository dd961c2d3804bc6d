//! Where a tenant publishes its catalog, kept across reloads: the current
//! catalog, its watchers, the recent versions, the owning generation, and
//! what a tenant's generations share (calls in flight, last use).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::Tenant;
use crate::catalog::{Catalog, SharedCatalog};

/// Where a tenant publishes its catalog; kept across configuration
/// reloads, so watchers and pinned plans see one continuous history. One
/// allocation per tenant: a configured tenant that is never used costs
/// little more than its configuration.
#[derive(Debug, Clone)]
pub(in crate::registry) struct Publication(pub(super) Arc<Shared>);

/// What a tenant's generations share.
#[derive(Debug)]
pub(in crate::registry) struct Shared {
    /// The current catalog, read without locking.
    pub(super) current: ArcSwap<Catalog>,
    /// The sender of every new catalog to watchers, made on the first
    /// subscription (most tenants are never watched). Its lock also
    /// orders a new catalog with a first subscription, so no watcher
    /// misses one.
    pub(super) watch: Mutex<Option<watch::Sender<SharedCatalog>>>,
    pub(super) history: Mutex<VecDeque<SharedCatalog>>,
    /// The tenant object that publishes here now (the newest generation's).
    /// Its lock serialises every rebuild of every generation: only the
    /// owner publishes, so a stale generation can never publish after a
    /// newer one.
    pub(super) owner: Mutex<Weak<Tenant>>,
    /// Cancelled when a reload removes the tenant: watches end.
    pub(in crate::registry) removed: tokio_util::sync::CancellationToken,
    /// Calls of the tenant running now, across reloads (idle eviction
    /// waits for zero).
    pub(super) in_flight: AtomicUsize,
    /// `WatchResource` streams of the tenant open now, across reloads
    /// (bounded by `limits.max_watches`; see `registry/watches.rs`).
    pub(in crate::registry) watches: Arc<AtomicUsize>,
    /// When the tenant was last used, in ms since the registry started
    /// (kept across reloads).
    pub(super) last_used: AtomicU64,
    /// Held while a lazy tenant is marked used and connected, and while the
    /// reaper closes it: a call that has marked itself busy is never closed
    /// under.
    pub(super) activity: Mutex<()>,
}

impl std::ops::Deref for Publication {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl Publication {
    pub(in crate::registry) fn new(now_ms: u64) -> Self {
        Self(Arc::new(Shared {
            current: ArcSwap::from_pointee(Catalog::default()),
            watch: Mutex::new(None),
            history: Mutex::default(),
            owner: Mutex::new(Weak::new()),
            removed: tokio_util::sync::CancellationToken::new(),
            in_flight: AtomicUsize::new(0),
            watches: Arc::default(),
            last_used: AtomicU64::new(now_ms),
            activity: Mutex::new(()),
        }))
    }

    /// Makes `catalog` the current one and sends it to the watchers.
    pub(super) fn publish(&self, catalog: SharedCatalog) {
        let watch = self.watch.lock().expect("watch lock");
        self.current.store(catalog.clone());
        if let Some(sender) = watch.as_ref() {
            sender.send_replace(catalog);
        }
    }

    /// A receiver of every catalog from the current one on.
    pub(super) fn subscribe(&self) -> watch::Receiver<SharedCatalog> {
        let mut watch = self.watch.lock().expect("watch lock");
        watch
            .get_or_insert_with(|| watch::channel(self.current.load_full()).0)
            .subscribe()
    }
}
