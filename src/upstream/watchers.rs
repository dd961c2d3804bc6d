//! Who watches which resource of a session: per URI, its turn (one
//! subscribe or unsubscribe under way at a time) and the live subscription
//! its watchers share (`ResourceWatch`), updates coalesced. How a
//! subscription is made and undone upstream is `subscriptions.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OwnedMutexGuard, watch};
use tokio_util::sync::CancellationToken;

/// The subscriptions of one session, by URI.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    uris: Mutex<HashMap<String, UriSlot>>,
}

/// One URI's subscription (if live) and its turn.
#[derive(Debug)]
struct UriSlot {
    /// Held by whoever subscribes or unsubscribes the URI upstream.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// The live subscription, shared by its watchers.
    live: Weak<Upstream>,
}

/// One upstream subscription: dropped with its last watcher, which stops
/// its follower (who then unsubscribes).
#[derive(Debug)]
pub(super) struct Upstream {
    pub(super) seen: watch::Receiver<Seen>,
    pub(super) stop: CancellationToken,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What a subscription has seen so far.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    /// Bumped at each update.
    pub(super) generation: u64,
    /// The URI the last update named.
    pub(super) uri: String,
    /// Set when the subscription ended under its watchers.
    pub(super) ended: Option<WatchEnd>,
}

/// Why a subscription ended while watchers held it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The session ended (the server went away or the connection broke).
    SessionEnded,
    /// The server ended the `subscriptions/listen` stream (2026-07-28).
    ListenEnded,
}

/// One watcher's hold on a subscription: updates come from
/// [`ResourceWatch::next`]; dropping the last one unsubscribes.
#[derive(Debug)]
pub struct ResourceWatch {
    upstream: Arc<Upstream>,
    seen: watch::Receiver<Seen>,
}

impl ResourceWatch {
    pub(super) fn join(upstream: Arc<Upstream>) -> Self {
        let mut seen = upstream.seen.clone();
        seen.mark_unchanged();
        Self { upstream, seen }
    }

    /// The URI of the next update (of all since the last one read: they
    /// are coalesced).
    ///
    /// # Errors
    /// The subscription ended: the session ended or the server ended the
    /// listen stream.
    pub async fn next(&mut self) -> Result<String, WatchEnd> {
        if self.seen.changed().await.is_err() {
            return Err(self.ended().unwrap_or(WatchEnd::SessionEnded));
        }
        let seen = self.seen.borrow_and_update();
        match seen.ended {
            Some(end) => Err(end),
            None => Ok(seen.uri.clone()),
        }
    }

    fn ended(&self) -> Option<WatchEnd> {
        self.upstream.seen.borrow().ended
    }
}

impl Subscriptions {
    /// A watch joining `uri`'s live subscription, or else the URI's turn
    /// (to subscribe in).
    pub(super) fn joined_or_turn(
        &self,
        uri: &str,
    ) -> Result<ResourceWatch, Arc<tokio::sync::Mutex<()>>> {
        let mut uris = self.uris.lock().expect("subscriptions lock");
        let slot = uris.entry(uri.to_owned()).or_insert_with(|| UriSlot {
            turn: Arc::default(),
            live: Weak::new(),
        });
        match slot.live.upgrade() {
            Some(upstream) if upstream.seen.borrow().ended.is_none() => {
                Ok(ResourceWatch::join(upstream))
            }
            _ => Err(slot.turn.clone()),
        }
    }

    /// Makes `live` the subscription of `uri` (its turn held).
    pub(super) fn install(&self, uri: &str, live: Weak<Upstream>) {
        let mut uris = self.uris.lock().expect("subscriptions lock");
        if let Some(slot) = uris.get_mut(uri) {
            slot.live = live;
        }
    }

    /// Forgets `uri` if `live` is still its subscription (its turn held).
    pub(super) fn remove(&self, uri: &str, live: &Weak<Upstream>) {
        let mut uris = self.uris.lock().expect("subscriptions lock");
        if uris.get(uri).is_some_and(|slot| slot.live.ptr_eq(live)) {
            uris.remove(uri);
        }
    }

    /// Forgets `uri` after a failed subscription, unless another watcher
    /// waits for its turn (whose guard `turn` is).
    pub(super) fn forget_unused(&self, uri: &str, turn: &OwnedMutexGuard<()>) {
        let mut uris = self.uris.lock().expect("subscriptions lock");
        let unused = uris.get(uri).is_some_and(|slot| {
            // The slot's reference and the guard's: nobody else waits.
            Arc::ptr_eq(&slot.turn, OwnedMutexGuard::mutex(turn))
                && Arc::strong_count(&slot.turn) == 2
                && slot.live.strong_count() == 0
        });
        if unused {
            uris.remove(uri);
        }
    }

    /// How many URIs have a subscription or one being made or undone.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.uris.lock().expect("subscriptions lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_watcher_gets_one_update_for_many() {
        use futures::FutureExt;
        let (seen_tx, seen) = watch::channel(Seen {
            generation: 0,
            uri: "u".into(),
            ended: None,
        });
        let mut watch = ResourceWatch::join(Arc::new(Upstream {
            seen,
            stop: CancellationToken::new(),
        }));
        assert!(watch.next().now_or_never().is_none(), "nothing yet");
        for uri in ["u/1", "u/2", "u/3"] {
            seen_tx.send_modify(|seen| {
                seen.generation += 1;
                seen.uri = uri.into();
            });
        }
        assert_eq!(watch.next().await, Ok("u/3".to_owned()), "the latest");
        assert!(
            watch.next().now_or_never().is_none(),
            "one update for three"
        );
        seen_tx.send_modify(|seen| seen.ended = Some(WatchEnd::SessionEnded));
        assert_eq!(watch.next().await, Err(WatchEnd::SessionEnded));
    }

    #[test]
    fn a_dead_subscription_gives_the_turn() {
        let subscriptions = Subscriptions::default();
        let turn = subscriptions.joined_or_turn("u").unwrap_err();
        let (_tx, seen) = watch::channel(Seen {
            generation: 0,
            uri: "u".into(),
            ended: None,
        });
        let upstream = Arc::new(Upstream {
            seen,
            stop: CancellationToken::new(),
        });
        let stop = upstream.stop.clone();
        subscriptions.install("u", Arc::downgrade(&upstream));
        let joined = subscriptions
            .joined_or_turn("u")
            .expect("joins the live one");
        drop(upstream);
        assert!(!stop.is_cancelled(), "a watcher still holds it");
        drop(joined);
        assert!(stop.is_cancelled(), "the last watcher left");
        let again = subscriptions.joined_or_turn("u").unwrap_err();
        assert!(
            Arc::ptr_eq(&turn, &again),
            "the same turn: after the unsubscribe"
        );
        subscriptions.remove("u", &Weak::new());
        assert_eq!(
            subscriptions.len(),
            1,
            "another subscription's removal is ignored"
        );
    }
}
