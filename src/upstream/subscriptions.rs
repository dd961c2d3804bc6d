//! Resource subscriptions of a session, shared by every `WatchResource`
//! of one URI on it: the first watcher subscribes upstream (2025-11-25:
//! `resources/subscribe`; 2026-07-28: a `subscriptions/listen` stream for
//! that URI), later ones join, and when the last one leaves the
//! subscription is undone (`resources/unsubscribe`, or the listen request
//! cancelled). A subscription and its undoing never overlap: each URI
//! takes turns, so a watcher arriving while the last one's unsubscribe is
//! under way subscribes again after it.
//!
//! Updates are coalesced per URI: an update only says "changed", so a
//! watcher that reads slowly sees one update for many.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

// rmcp marks `resources/subscribe` and `resources/unsubscribe` legacy-only:
// they are how a 2025-11-25 session subscribes, and are sent only there.
use rmcp::model::{
    ClientRequest, ServerNotification, SubscribeRequestParams, SubscriptionFilter,
    UnsubscribeRequestParams,
};
#[allow(deprecated)]
use rmcp::model::{SubscribeRequest, UnsubscribeRequest};
use tokio::sync::{OwnedMutexGuard, broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::{Session, UpstreamError};

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
struct Upstream {
    seen: watch::Receiver<Seen>,
    stop: CancellationToken,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What a subscription has seen so far.
#[derive(Debug, Clone)]
struct Seen {
    /// Bumped at each update.
    generation: u64,
    /// The URI the last update named.
    uri: String,
    /// Set when the subscription ended under its watchers.
    ended: Option<WatchEnd>,
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
    fn join(upstream: Arc<Upstream>) -> Self {
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

/// Whether an update of `updated` concerns a watch of `watched`: the same
/// URI, or a sub-resource of it (the protocol lets a server name one).
fn concerns(watched: &str, updated: &str) -> bool {
    updated == watched
        || updated
            .strip_prefix(watched)
            .is_some_and(|rest| watched.ends_with('/') || rest.starts_with(['/', '?', '#']))
}

/// Where a subscription's updates come from.
enum Feed {
    /// 2025-11-25: the session's `notifications/resources/updated`.
    Updates(broadcast::Receiver<String>),
    /// 2026-07-28: the listen stream of this URI.
    /// (Held with the service it streams on: a stateless session's
    /// service stays open while the stream does.)
    Listen(Box<rmcp::service::Subscription>, super::lease::Live),
}

impl Session {
    /// Watches resource `uri`: subscribes upstream unless a watcher on
    /// this session already did (each request answered within `timeout`).
    ///
    /// # Errors
    /// The subscription request failed (the session's errors, or the
    /// server's JSON-RPC error); nothing is left subscribed.
    pub async fn watch_resource(
        self: &Arc<Self>,
        uri: &str,
        timeout: Duration,
    ) -> Result<ResourceWatch, UpstreamError> {
        let turn = match self.events().subscriptions().joined_or_turn(uri) {
            Ok(watch) => return Ok(watch),
            Err(turn) => turn,
        };
        // In a task of its own: a caller that goes away mid-subscribe
        // drops the watch it would have had, which unsubscribes.
        let session = self.clone();
        let uri = uri.to_owned();
        tokio::spawn(async move {
            let subscriptions = session.events().subscriptions();
            let mut turn = turn;
            let guard = loop {
                let guard = turn.lock_owned().await;
                match subscriptions.joined_or_turn(&uri) {
                    Ok(watch) => return Ok(watch),
                    Err(current) if Arc::ptr_eq(&current, OwnedMutexGuard::mutex(&guard)) => {
                        break guard;
                    }
                    // The URI was forgotten meanwhile: take the new turn.
                    Err(current) => turn = current,
                }
            };
            let feed = match session.subscribe(&uri, timeout).await {
                Ok(feed) => feed,
                Err(error) => {
                    subscriptions.forget_unused(&uri, &guard);
                    return Err(error);
                }
            };
            let (seen_tx, seen) = watch::channel(Seen {
                generation: 0,
                uri: uri.clone(),
                ended: None,
            });
            let upstream = Arc::new(Upstream {
                seen,
                stop: CancellationToken::new(),
            });
            let stop = upstream.stop.clone();
            let weak = Arc::downgrade(&upstream);
            subscriptions.install(&uri, weak.clone());
            let follower = Follower {
                session: session.clone(),
                uri,
                timeout,
                seen: seen_tx,
                stop,
                weak,
                _turn: guard,
            };
            tokio::spawn(follower.run(feed));
            Ok(ResourceWatch::join(upstream))
        })
        .await
        .unwrap_or(Err(UpstreamError::Closed))
    }

    /// Subscribes to `uri` upstream, the revision's way.
    async fn subscribe(&self, uri: &str, timeout: Duration) -> Result<Feed, UpstreamError> {
        if self.is_stateless() {
            if let Some(bearer) = &self.bearer {
                bearer.refresh().await?;
            }
            let filter = SubscriptionFilter::builder()
                .resource_subscription(uri)
                .build();
            let live = self.hold().await?;
            let listening = tokio::select! {
                listening = tokio::time::timeout(timeout, live.listen(filter)) => listening,
                () = self.wait_ended() => return Err(UpstreamError::Lost),
            };
            return match listening {
                Ok(Ok(subscription)) => Ok(Feed::Listen(Box::new(subscription), live)),
                Ok(Err(error)) => Err(self.classify(error, true)),
                Err(_) => Err(UpstreamError::Timeout(timeout)),
            };
        }
        // Listening before asking: no update between the two is missed.
        let updates = self.events().resource_updates();
        #[allow(deprecated)]
        let request = ClientRequest::SubscribeRequest(SubscribeRequest::new(
            SubscribeRequestParams::new(uri),
        ));
        self.request(&super::Request::new(request, timeout)).await?;
        Ok(Feed::Updates(updates))
    }
}

impl Subscriptions {
    /// A watch joining `uri`'s live subscription, or else the URI's turn
    /// (to subscribe in).
    fn joined_or_turn(&self, uri: &str) -> Result<ResourceWatch, Arc<tokio::sync::Mutex<()>>> {
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
    fn install(&self, uri: &str, live: Weak<Upstream>) {
        let mut uris = self.uris.lock().expect("subscriptions lock");
        if let Some(slot) = uris.get_mut(uri) {
            slot.live = live;
        }
    }

    /// Forgets `uri` if `live` is still its subscription (its turn held).
    fn remove(&self, uri: &str, live: &Weak<Upstream>) {
        let mut uris = self.uris.lock().expect("subscriptions lock");
        if uris.get(uri).is_some_and(|slot| slot.live.ptr_eq(live)) {
            uris.remove(uri);
        }
    }

    /// Forgets `uri` after a failed subscription, unless another watcher
    /// waits for its turn (whose guard `turn` is).
    fn forget_unused(&self, uri: &str, turn: &OwnedMutexGuard<()>) {
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

/// Follows one subscription until its last watcher leaves (then undoes
/// it) or it ends; holds the URI's turn throughout.
struct Follower {
    session: Arc<Session>,
    uri: String,
    timeout: Duration,
    seen: watch::Sender<Seen>,
    stop: CancellationToken,
    weak: Weak<Upstream>,
    _turn: OwnedMutexGuard<()>,
}

impl Follower {
    async fn run(self, mut feed: Feed) {
        let ended = loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break None,
                () = self.session.wait_ended() => break Some(WatchEnd::SessionEnded),
                update = next_update(&self.session, &self.uri, &mut feed) => match update {
                    Some(uri) => self.seen.send_modify(|seen| {
                        seen.generation += 1;
                        seen.uri = uri;
                    }),
                    None => break Some(WatchEnd::ListenEnded),
                },
            }
        };
        match ended {
            Some(end) => self.seen.send_modify(|seen| seen.ended = Some(end)),
            None => self.unsubscribe(feed).await,
        }
        self.session
            .events()
            .subscriptions()
            .remove(&self.uri, &self.weak);
    }

    /// Undoes the subscription (the last watcher left).
    async fn unsubscribe(&self, feed: Feed) {
        let result = match feed {
            Feed::Listen(mut subscription, _live) => subscription
                .cancel()
                .await
                .map_err(|e| self.session.classify(e, true)),
            Feed::Updates(_) => {
                #[allow(deprecated)]
                let request = ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(
                    UnsubscribeRequestParams::new(self.uri.clone()),
                ));
                self.session
                    .request(&super::Request::new(request, self.timeout))
                    .await
                    .map(drop)
            }
        };
        if let Err(error) = result {
            tracing::debug!(
                tenant = %self.session.label.tenant,
                server = %self.session.label.server,
                %error,
                "unsubscribing a resource failed"
            );
        }
    }
}

/// The URI of the next update of `uri` the feed brings; `None` when the
/// feed ended.
async fn next_update(session: &Session, uri: &str, feed: &mut Feed) -> Option<String> {
    match feed {
        Feed::Updates(updates) => loop {
            match updates.recv().await {
                Ok(updated) if concerns(uri, &updated) => return Some(updated),
                Ok(_) => {}
                // Some were missed: one of them may have been this one.
                Err(broadcast::error::RecvError::Lagged(_)) => return Some(uri.to_owned()),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        },
        Feed::Listen(subscription, _) => loop {
            match subscription.next().await {
                Ok(Some(ServerNotification::ResourceUpdatedNotification(update))) => {
                    let updated = update.params.uri;
                    session.events().resource_updated(updated.clone());
                    return Some(updated);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return None,
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_resources_concern_their_watch() {
        assert!(concerns("file:///a", "file:///a"));
        assert!(concerns("file:///a", "file:///a/b"));
        assert!(concerns("file:///a/", "file:///a/b"));
        assert!(concerns("demo://x", "demo://x?page=2"));
        assert!(!concerns("file:///a", "file:///ab"));
        assert!(!concerns("file:///a/b", "file:///a"));
    }

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
