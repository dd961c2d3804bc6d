//! The rmcp service of a session, standing or leased. A session that
//! keeps state (2025-11-25, or any stdio server) keeps one rmcp service for
//! its whole life. A stateless session (protocol 2026-07-28 over HTTP)
//! needs none between requests: its service (rmcp's service loop and its
//! HTTP worker, two tasks and six channels, about 80 KiB) is opened when a
//! request needs one, shared by every request while it lives, and closed
//! once none has used it for [`LINGER`]. An idle pair then holds only
//! what its catalog needs (the server's `server/discover` result, the
//! transport's settings). Opening again costs one `server/discover` round
//! trip: rmcp's HTTP worker handles the first message of a service outside
//! its main loop (it would drop a call's progress and hold back a
//! concurrent request), so that first message is a `server/discover`.

use std::ops::Deref;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rmcp::model::{RequestMetaObject, ServerPeerInfo};
use rmcp::service::{Peer, RoleClient, RunningService};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::UpstreamError;
use super::handler::GatewayClient;
use super::http::HttpTransport;

/// How long a leased service is kept after its last use: requests in a
/// burst share one service (and its `server/discover`).
pub(super) const LINGER: Duration = Duration::from_secs(5);

/// A service's peer, held: a leased service stays open while any `Live`
/// of it exists.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    peer: Peer<RoleClient>,
    running: Option<Arc<Running>>,
}

impl Deref for Live {
    type Target = Peer<RoleClient>;

    fn deref(&self) -> &Peer<RoleClient> {
        &self.peer
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.touch();
        }
    }
}

/// One open leased service.
#[derive(Debug)]
pub(super) struct Running {
    /// Dropped with the last holder: cancels rmcp's service loop, whose
    /// end stops its HTTP worker.
    service: RunningService<RoleClient, GatewayClient>,
    last_used: Mutex<Instant>,
}

impl Running {
    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    fn is_usable(&self) -> bool {
        !self.service.is_closed() && !self.service.peer().is_transport_closed()
    }
}

/// Why a leased service could not be opened.
#[derive(Debug)]
pub(super) enum OpenError {
    /// The transport could not be built, or the session is closed.
    Upstream(UpstreamError),
    /// `server/discover` failed.
    Service(rmcp::ServiceError),
}

/// Builds a fresh transport for a leased service.
pub(super) type Transports = Box<dyn Fn() -> Result<HttpTransport, UpstreamError> + Send + Sync>;

/// The leased services of one stateless session.
pub(super) struct Leases {
    slot: Mutex<Option<Arc<Running>>>,
    /// One opening at a time (requests arriving meanwhile share it).
    opening: tokio::sync::Mutex<()>,
    transports: Transports,
    client: GatewayClient,
    /// What the server said it is at connect (its `server/discover`
    /// answer): kept alone, not in an rmcp `Peer`, whose channel's first
    /// block (~12 KiB) would outlive the service.
    info: Arc<ServerPeerInfo>,
    /// The session's: cancelled, no service opens and the open one ends.
    cancel: CancellationToken,
    linger: Duration,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("open", &self.is_open())
            .finish_non_exhaustive()
    }
}

impl Leases {
    /// The leases of a session whose server said `info` at connect, with
    /// its first service `first` (the connect's own) already open.
    pub(super) fn start(
        first: RunningService<RoleClient, GatewayClient>,
        info: Arc<ServerPeerInfo>,
        transports: Transports,
        cancel: CancellationToken,
        linger: Duration,
    ) -> Arc<Self> {
        let client = first.service().clone();
        let leases = Arc::new(Self {
            slot: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            transports,
            client,
            info,
            cancel,
            linger,
        });
        leases.install(first);
        leases
    }

    /// What the server said it is at connect.
    pub(super) fn info(&self) -> &Arc<ServerPeerInfo> {
        &self.info
    }

    /// Closes the open service (the session ended).
    pub(super) fn close(&self) {
        let closed = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(closed);
    }

    /// Whether a service is open now.
    pub(super) fn is_open(&self) -> bool {
        self.slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The open service, held, if it is usable.
    fn current(&self) -> Option<Live> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(running) if running.is_usable() => {
                running.touch();
                Some(Live {
                    peer: running.service.peer().clone(),
                    running: Some(running.clone()),
                })
            }
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    /// The open service, held; else one opened now.
    ///
    /// # Errors
    /// The session is closed, the transport cannot be built, or
    /// `server/discover` fails.
    pub(super) async fn hold(self: &Arc<Self>) -> Result<Live, OpenError> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let _turn = self.opening.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        if self.cancel.is_cancelled() {
            return Err(OpenError::Upstream(UpstreamError::Closed));
        }
        let transport = (self.transports)().map_err(OpenError::Upstream)?;
        let service = rmcp::service::serve_directly_with_ct(
            self.client.clone(),
            transport,
            Some(ServerPeerInfo::clone(&self.info)),
            self.cancel.child_token(),
        );
        let peer = service.peer().clone();
        peer.set_response_cache_config(rmcp::service::ClientCacheConfig::disabled())
            .await;
        // rmcp's worker sends its first message outside its main loop.
        peer.discover(RequestMetaObject::new())
            .await
            .map_err(OpenError::Service)?;
        self.install(service);
        self.current()
            .ok_or(OpenError::Upstream(UpstreamError::Closed))
    }

    /// Puts `service` in the slot and closes it once unused for `linger`.
    fn install(self: &Arc<Self>, service: RunningService<RoleClient, GatewayClient>) {
        let running = Arc::new(Running {
            service,
            last_used: Mutex::new(Instant::now()),
        });
        let weak_running = Arc::downgrade(&running);
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        let leases = Arc::downgrade(self);
        let linger = self.linger;
        tokio::spawn(reap(leases, weak_running, linger));
    }
}

/// Closes `running` once nothing but the slot has held it for `linger`
/// (or as soon as it is no longer the slot's, or the session is gone).
async fn reap(leases: Weak<Leases>, running: Weak<Running>, linger: Duration) {
    let mut wait = linger;
    loop {
        tokio::time::sleep(wait).await;
        let Some(leases) = leases.upgrade() else {
            return;
        };
        let mut slot = leases.slot.lock().unwrap_or_else(|e| e.into_inner());
        let Some(current) = slot.as_ref() else {
            return;
        };
        if !std::ptr::eq(Arc::as_ptr(current), running.as_ptr()) {
            return;
        }
        let idle = current.idle_for();
        if Arc::strong_count(current) == 1 && idle >= linger {
            // Dropped outside the lock.
            let closed = slot.take();
            drop(slot);
            drop(closed);
            return;
        }
        wait = linger.saturating_sub(idle).max(linger / 10);
    }
}

/// A session's rmcp service: one for its whole life, or leased.
#[derive(Debug, Clone)]
pub(super) enum Peers {
    /// One service for the session's life (its loop watched by the
    /// session).
    Standing(Peer<RoleClient>),
    /// Opened per burst of requests (stateless HTTP sessions). No peer is
    /// kept between them: what the server said it is stays in the leases.
    Leased(Arc<Leases>),
}

impl Peers {
    /// What the server said it is (`initialize` or `server/discover`);
    /// `None` before the handshake.
    pub(super) fn peer_info(&self) -> Option<Arc<ServerPeerInfo>> {
        match self {
            Peers::Standing(peer) => peer.peer_info(),
            Peers::Leased(leases) => Some(leases.info().clone()),
        }
    }

    /// Whether the server said it speaks a revision without `initialize`
    /// (2026-07-28 or later).
    pub(super) fn is_stateless(&self) -> bool {
        self.peer_info()
            .is_some_and(|info| !info.protocol_version.has_initialize())
    }

    /// A peer to send on, held while the result lives.
    pub(super) async fn hold(&self) -> Result<Live, OpenError> {
        match self {
            Peers::Standing(peer) => Ok(Live {
                peer: peer.clone(),
                running: None,
            }),
            Peers::Leased(leases) => leases.hold().await,
        }
    }

    /// The leases, on a leased session.
    pub(super) fn leases(&self) -> Option<&Arc<Leases>> {
        match self {
            Peers::Standing(_) => None,
            Peers::Leased(leases) => Some(leases),
        }
    }
}
