//! What keeps a handshake flood from closing a TLS listener: the slots of
//! handshakes in progress, per peer address and for the whole listener,
//! taken at accept and given back when the handshake ends; and the WARN
//! (at most one per [`WARN_INTERVAL`]) and the metric of the connections
//! closed before their handshake.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::HandshakeLimits;
use crate::telemetry::Metrics;

/// At most one WARN per listener in this time; the connections closed
/// meanwhile are counted in the next one (and each in the metric).
pub(super) const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Why a connection was closed before its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its peer address had `max_handshakes_per_peer` in progress.
    PeerLimit,
    /// The listener had `max_handshakes` in progress.
    ListenerLimit,
    /// No ClientHello within `client_hello_timeout`.
    ClientHelloTimeout,
}

impl Refusal {
    /// The `reason` label and log field.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Refusal::PeerLimit => "peer_limit",
            Refusal::ListenerLimit => "listener_limit",
            Refusal::ClientHelloTimeout => "client_hello_timeout",
        }
    }

    /// The setting an operator would look at.
    fn setting(self) -> &'static str {
        match self {
            Refusal::PeerLimit => "max_handshakes_per_peer",
            Refusal::ListenerLimit => "max_handshakes",
            Refusal::ClientHelloTimeout => "client_hello_timeout",
        }
    }
}

/// The key a peer's handshakes are counted under: its IPv4 address (an
/// IPv4-mapped IPv6 one read as IPv4), or the /64 of its IPv6 address (a
/// single host commonly holds a whole /64).
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mask = u128::MAX << 64;
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        },
    }
}

/// The handshake slots of one listener.
#[derive(Debug)]
pub(super) struct Slots {
    limits: HandshakeLimits,
    listener: Arc<Semaphore>,
    /// Handshakes in progress per peer key; an entry goes with its last
    /// slot, so there are never more than `limits.max` (plus the one
    /// being refused).
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A handshake's slots, given back on drop.
#[derive(Debug)]
pub(super) struct Slot {
    _listener: OwnedSemaphorePermit,
    _peer: PeerSlot,
}

#[derive(Debug)]
struct PeerSlot {
    key: IpAddr,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Entry::Occupied(mut entry) = peers.entry(self.key) {
            *entry.get_mut() -= 1;
            if *entry.get() == 0 {
                entry.remove();
            }
        }
    }
}

impl Slots {
    pub(super) fn new(limits: HandshakeLimits) -> Slots {
        Slots {
            limits,
            listener: Arc::new(Semaphore::new(limits.max)),
            peers: Arc::default(),
        }
    }

    /// A slot for a handshake from `peer`: its peer's first, then the
    /// listener's.
    pub(super) fn take(&self, peer: IpAddr) -> Result<Slot, Refusal> {
        let key = peer_key(peer);
        let peer = {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            let held = peers.entry(key).or_insert(0);
            if *held >= self.limits.per_peer {
                return Err(Refusal::PeerLimit);
            }
            *held += 1;
            PeerSlot {
                key,
                peers: self.peers.clone(),
            }
        };
        let listener = self
            .listener
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::ListenerLimit)?;
        Ok(Slot {
            _listener: listener,
            _peer: peer,
        })
    }

    #[cfg(test)]
    fn peers_held(&self) -> usize {
        self.peers.lock().unwrap().len()
    }
}

/// Counts the connections a listener closes before their handshake and
/// says so at WARN, at most once per [`WARN_INTERVAL`].
#[derive(Debug)]
pub(super) struct Refusals {
    listener: &'static str,
    metrics: Arc<Metrics>,
    /// When the last WARN was written, and the refusals since.
    last: Mutex<(Option<Instant>, u64)>,
}

impl Refusals {
    pub(super) fn new(listener: &'static str, metrics: Arc<Metrics>) -> Refusals {
        Refusals {
            listener,
            metrics,
            last: Mutex::new((None, 0)),
        }
    }

    /// Counts one closed connection of `peer`, and writes the WARN when
    /// the last one is old enough.
    pub(super) fn refused(&self, why: Refusal, peer: IpAddr) {
        self.metrics
            .tls()
            .connection_refused(self.listener, why.as_str());
        let refused = {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            last.1 += 1;
            let due = last.0.is_none_or(|at| at.elapsed() >= WARN_INTERVAL);
            if !due {
                return;
            }
            let refused = last.1;
            *last = (Some(Instant::now()), 0);
            refused
        };
        tracing::warn!(
            listener = self.listener,
            reason = why.as_str(),
            %peer,
            setting = format!("{}.tls.{}", self.listener, why.setting()),
            refused,
            interval = ?WARN_INTERVAL,
            "TLS connections closed before their handshake (a handshake flood, or the limit is too low): \
             `refused` counts them since the last such line; at most one line per interval"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_peer: usize) -> HandshakeLimits {
        HandshakeLimits {
            max,
            per_peer,
            ..HandshakeLimits::default()
        }
    }

    #[test]
    fn a_peer_holds_at_most_its_share_and_gets_it_back() {
        let slots = Slots::new(limits(4, 2));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = slots.take(a).unwrap();
        let _second = slots.take(a).unwrap();
        assert_eq!(slots.take(a).unwrap_err(), Refusal::PeerLimit);
        let _other = slots.take(b).unwrap();
        drop(first);
        let _third = slots.take(a).unwrap();
        let _other2 = slots.take(b).unwrap();
        // The listener's four are all held now.
        let c: IpAddr = "192.0.2.3".parse().unwrap();
        assert_eq!(slots.take(c).unwrap_err(), Refusal::ListenerLimit);
        // The refused peer holds nothing afterwards.
        drop((_second, _third, _other, _other2));
        assert_eq!(slots.peers_held(), 0);
    }

    #[test]
    fn an_ipv6_slash_64_is_one_peer_and_mapped_ipv4_is_ipv4() {
        let slots = Slots::new(limits(8, 1));
        let _one = slots.take("2001:db8:1:2::1".parse().unwrap()).unwrap();
        assert_eq!(
            slots
                .take("2001:db8:1:2::ffff".parse().unwrap())
                .unwrap_err(),
            Refusal::PeerLimit
        );
        let _other = slots.take("2001:db8:1:3::1".parse().unwrap()).unwrap();
        let _v4 = slots.take("198.51.100.7".parse().unwrap()).unwrap();
        assert_eq!(
            slots
                .take("::ffff:198.51.100.7".parse().unwrap())
                .unwrap_err(),
            Refusal::PeerLimit
        );
    }
}
