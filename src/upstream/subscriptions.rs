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

use std::sync::{Arc, Weak};
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

use super::watchers::{ResourceWatch, Seen, Upstream, WatchEnd};
use super::{Session, UpstreamError};

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
}
