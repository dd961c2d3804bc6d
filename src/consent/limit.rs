//! The bound on unmatched callbacks: a callback whose `state` names no
//! pending flow (expired, forged or malformed) is counted always, but
//! recorded in the audit trail only while its peer (and all peers
//! together) stay under a rate. Past it the callback is answered 429 with
//! nothing written, so forged callbacks cannot fill the audit sink (with
//! `audit.required`, a full sink stops every call). A callback that
//! completes a real flow is never limited.

use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Unmatched callbacks one peer may have recorded at once (the burst).
pub const PEER_BURST: u32 = 10;
/// One more recorded unmatched callback per peer after this long.
pub const PEER_REPLENISH: Duration = Duration::from_secs(6);
/// Unmatched callbacks all peers together may have recorded at once.
pub const GLOBAL_BURST: u32 = 100;
/// One more recorded unmatched callback (all peers) after this long.
pub const GLOBAL_REPLENISH: Duration = Duration::from_millis(600);
/// The most peers whose state is kept; past it, stale peers are dropped
/// and, if none is stale, an unknown peer's callback is limited.
pub const MAX_PEERS: usize = 4096;

/// Whether an unmatched callback may be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Under the rate: write the record.
    Record,
    /// Over the rate: answer 429, write nothing.
    Limited,
}

impl Verdict {
    /// The `outcome` label of `toolgate_oauth_callbacks_unmatched_total`.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Record => "recorded",
            Verdict::Limited => "limited",
        }
    }
}

/// Per-peer and global rates of recorded unmatched callbacks.
pub struct UnmatchedLimiter {
    peers: DefaultKeyedRateLimiter<IpAddr>,
    global: DefaultDirectRateLimiter,
    max_peers: usize,
}

impl std::fmt::Debug for UnmatchedLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnmatchedLimiter")
            .field("peers", &self.peers.len())
            .finish_non_exhaustive()
    }
}

impl Default for UnmatchedLimiter {
    fn default() -> Self {
        Self::new(MAX_PEERS)
    }
}

impl UnmatchedLimiter {
    /// The limiter with the fixed rates, keeping at most `max_peers` peers.
    pub fn new(max_peers: usize) -> Self {
        Self {
            peers: RateLimiter::keyed(quota(PEER_BURST, PEER_REPLENISH)),
            global: RateLimiter::direct(quota(GLOBAL_BURST, GLOBAL_REPLENISH)),
            max_peers,
        }
    }

    /// Whether an unmatched callback from `peer` may be recorded.
    pub fn check(&self, peer: IpAddr) -> Verdict {
        let key = peer_key(peer);
        if self.peers.len() >= self.max_peers {
            self.peers.retain_recent();
            self.peers.shrink_to_fit();
            if self.peers.len() >= self.max_peers {
                return Verdict::Limited;
            }
        }
        if self.peers.check_key(&key).is_err() || self.global.check().is_err() {
            return Verdict::Limited;
        }
        Verdict::Record
    }

    /// How many peers' state is kept.
    pub fn peers(&self) -> usize {
        self.peers.len()
    }
}

fn quota(burst: u32, replenish: Duration) -> Quota {
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    Quota::with_period(replenish)
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
        .allow_burst(burst)
}

/// The key of a peer: an IPv4 address (an IPv4-mapped IPv6 one read as
/// IPv4), or an IPv6 address's /64, which one host can rotate within.
fn peer_key(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_limited_after_its_burst_and_others_are_not() {
        let limiter = UnmatchedLimiter::default();
        let peer: IpAddr = "203.0.113.7".parse().unwrap();
        let recorded = (0..300)
            .filter(|_| limiter.check(peer) == Verdict::Record)
            .count();
        assert_eq!(recorded, PEER_BURST as usize);
        assert_eq!(
            limiter.check("198.51.100.1".parse().unwrap()),
            Verdict::Record
        );
    }

    #[test]
    fn an_ipv6_host_cannot_rotate_within_its_64() {
        let limiter = UnmatchedLimiter::default();
        let recorded = (0..300u16)
            .filter(|i| {
                let peer = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 2, *i, 0, 0, 1));
                limiter.check(peer) == Verdict::Record
            })
            .count();
        assert_eq!(recorded, PEER_BURST as usize);
        assert_eq!(limiter.peers(), 1);
    }

    #[test]
    fn the_peers_kept_are_bounded_and_all_peers_share_a_global_rate() {
        let limiter = UnmatchedLimiter::new(50);
        let recorded = (0..=255u8)
            .flat_map(|a| (0..4u8).map(move |b| IpAddr::from([10, a, b, 1])))
            .filter(|peer| limiter.check(*peer) == Verdict::Record)
            .count();
        assert!(limiter.peers() <= 50, "{} peers kept", limiter.peers());
        assert!(recorded <= 50, "{recorded} recorded");
        let global = UnmatchedLimiter::default();
        let recorded = (0..=255u8)
            .flat_map(|a| (0..4u8).map(move |b| IpAddr::from([10, a, b, 1])))
            .filter(|peer| global.check(*peer) == Verdict::Record)
            .count();
        assert_eq!(recorded, GLOBAL_BURST as usize);
    }
}
