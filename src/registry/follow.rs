//! The follower: keeps the loaded tenants of the state store as the store
//! has them, on every replica, within about a second of a write.
//!
//! - **Notices** (PostgreSQL): every write sends `NOTIFY toolgate_tenants`;
//!   a notice makes the follower read the change log at once.
//! - **Polling**: without a `LISTEN` connection (SQLite always; PostgreSQL
//!   after the connection dropped, until it is back) the change log is read
//!   every `tenant_store.poll_interval`.
//! - **Resync**: every `tenant_store.resync_interval`, the stored versions
//!   of every loaded tenant are compared with the loaded ones (a change
//!   whose notice was lost, or that fell out of the log's window, is
//!   applied then); also when the store comes back after being
//!   unreachable, and (validating every loaded tenant again) when the
//!   configuration changes.
//!
//! The follower keeps its own position in the change log and reads a small
//! window behind it each time (PostgreSQL sequence values can commit out of
//! order), skipping the changes it has seen. A change to a tenant that is
//! not loaded only clears the cache of unknown tokens; a loaded one is
//! loaded again ([`StoredTenants::refresh`](super::store::StoredTenants::refresh)).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use super::Registry;
use super::store::Refresh;
use crate::config::TenantStoreSettings;
use crate::state::Notices;
use crate::state::StateError;
use crate::state::tenants::TenantChange;

/// How many sequence numbers behind its position the follower reads again.
const WINDOW: i64 = 256;

/// Changes read per page of the log.
const PAGE: u32 = 500;

/// Most pages read in one catch-up (the rest waits for the next one).
const MAX_PAGES: usize = 100;

/// Loaded tenants whose versions are read per query of a resync.
const RESYNC_CHUNK: usize = 500;

/// Follows the state store's tenant changes until `stop` (see the module
/// documentation). Started when `tenant_store` is configured, after
/// [`Registry::serve_store_tenants`].
pub async fn follow(
    registry: Arc<Registry>,
    settings: TenantStoreSettings,
    stop: CancellationToken,
) {
    let Some(state) = registry.store_tenants().map(|s| s.state.clone()) else {
        return;
    };
    let mut follower = Follower {
        registry,
        state,
        settings,
        position: None,
        seen: BTreeSet::new(),
        reachable: true,
        resync_due: false,
        listens: None,
    };
    follower.run(stop).await;
}

/// The follower's state.
struct Follower {
    registry: Arc<Registry>,
    state: crate::state::StateStore,
    settings: TenantStoreSettings,
    /// The highest sequence number seen (`None` until first read).
    position: Option<i64>,
    /// Sequence numbers seen within [`WINDOW`] of the position.
    seen: BTreeSet<i64>,
    /// Whether the last call to the store succeeded.
    reachable: bool,
    /// A full resync is owed (the store came back).
    resync_due: bool,
    /// Whether the store delivers notices (`None`: not asked yet;
    /// `Some(false)`: SQLite, polled).
    listens: Option<bool>,
}

impl Follower {
    async fn run(&mut self, stop: CancellationToken) {
        let mut notices: Option<Notices> = None;
        let mut poll = tokio::time::interval(self.settings.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval(self.settings.resync_interval);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resync.reset();
        let registry = self.registry.clone();
        loop {
            if notices.is_none() && self.listens != Some(false) {
                notices = self.listen().await;
                if notices.is_some() {
                    // Changes written while no one listened.
                    self.catch_up().await;
                }
            }
            if self.resync_due {
                self.resync(false).await;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                notice = next_notice(&mut notices) => match notice {
                    Ok(tenant) => {
                        tracing::debug!(%tenant, "tenant change notice");
                        self.catch_up().await;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "lost the tenant store's LISTEN connection: polling the change log until it is back");
                        notices = None;
                        self.down(&error);
                    }
                },
                _ = poll.tick(), if notices.is_none() => self.catch_up().await,
                _ = resync.tick() => {
                    self.catch_up().await;
                    self.resync(false).await;
                }
                () = registry.config_changed.notified() => self.resync(true).await,
            }
        }
    }

    /// Starts listening (PostgreSQL); `None` on SQLite or when the store
    /// cannot be reached.
    async fn listen(&mut self) -> Option<Notices> {
        match self.state.listen_tenants().await {
            Ok(Some(notices)) => {
                self.up();
                self.listens = Some(true);
                Some(notices)
            }
            Ok(None) => {
                self.up();
                self.listens = Some(false);
                None
            }
            Err(error) => {
                self.down(&error);
                None
            }
        }
    }

    fn up(&mut self) {
        if !self.reachable {
            tracing::info!("the tenant store is reachable again: resyncing the loaded tenants");
            self.reachable = true;
            self.resync_due = true;
        }
    }

    fn down(&mut self, error: &StateError) {
        if self.reachable {
            tracing::warn!(%error, "the tenant store cannot be reached: loaded tenants keep serving as loaded");
            self.reachable = false;
        }
    }

    /// Reads the change log from a window behind the position, and applies
    /// every change not seen yet.
    async fn catch_up(&mut self) {
        let Some(position) = self.position else {
            match self.state.last_tenant_change().await {
                Ok(last) => {
                    self.up();
                    self.position = Some(last);
                    // Whatever was loaded before the position was known.
                    self.resync_due = true;
                }
                Err(error) => self.down(&error),
            }
            return;
        };
        let floor = (position - WINDOW).max(0);
        let mut after = floor;
        let mut newest = position;
        for _ in 0..MAX_PAGES {
            let changes = match self.state.tenant_changes(after, PAGE).await {
                Ok(changes) => {
                    self.up();
                    changes
                }
                Err(error) => {
                    self.down(&error);
                    break;
                }
            };
            let count = changes.len();
            for change in changes {
                after = change.seq;
                newest = newest.max(change.seq);
                if self.seen.insert(change.seq) {
                    self.apply(&change).await;
                }
            }
            if count < PAGE as usize {
                break;
            }
        }
        self.position = Some(newest);
        let keep_from = (newest - WINDOW).max(0);
        self.seen = self.seen.split_off(&keep_from);
    }

    /// Applies one change: a loaded tenant is loaded again (or removed);
    /// any change clears the cache of unknown tokens.
    async fn apply(&mut self, change: &TenantChange) {
        let Some(store) = self.registry.store_tenants() else {
            return;
        };
        store.forget_unknown();
        let how = Refresh::Changed {
            version: Some(change.version),
        };
        match store.refresh(&self.registry, &change.tenant, how).await {
            Ok(_) => {
                let now_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                #[allow(clippy::cast_precision_loss)]
                let lag = (now_ms - change.at_ms) as f64 / 1000.0;
                self.registry.metrics.tenants().change_lag(lag);
            }
            Err(error) => {
                // Applied at the resync once the store is back.
                self.down(&error);
            }
        }
    }

    /// Compares every loaded tenant's version with the stored one and
    /// loads again those that differ (removing those gone); with
    /// `revalidate`, every loaded tenant is validated again.
    async fn resync(&mut self, revalidate: bool) {
        let registry = self.registry.clone();
        let Some(store) = registry.store_tenants() else {
            return;
        };
        self.resync_due = false;
        store.forget_unknown();
        let loaded = store.versions();
        for chunk in loaded.chunks(RESYNC_CHUNK) {
            let names: Vec<String> = chunk.iter().map(|(name, _)| name.clone()).collect();
            let stored = match self.state.tenant_versions(&names).await {
                Ok(stored) => {
                    self.up();
                    stored
                }
                Err(error) => {
                    self.down(&error);
                    self.resync_due = true;
                    return;
                }
            };
            for (name, version) in chunk {
                let how = match stored.get(name) {
                    _ if revalidate => Refresh::Revalidate,
                    Some(v) if v == version => continue,
                    Some(v) => Refresh::Changed { version: Some(*v) },
                    None => Refresh::Changed { version: Some(0) },
                };
                if let Err(error) = store.refresh(&registry, name, how).await {
                    self.down(&error);
                    self.resync_due = true;
                    return;
                }
            }
        }
    }
}

/// The next notice, or never without a listener.
async fn next_notice(notices: &mut Option<Notices>) -> Result<String, StateError> {
    match notices {
        Some(notices) => notices.next().await,
        None => std::future::pending().await,
    }
}
