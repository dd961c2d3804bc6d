//! Server streams: a call with its progress relayed, and a watch on the
//! tenant's catalog.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status};

use super::auth_layer::Standing;
use super::listing::{self, Filter};
use super::{EventStream, Gateway, calls};
use crate::callers::{Caller, Subject};
use crate::calls::drain;
use crate::calls::error::CallError;
use crate::catalog::ServerState;
use crate::pb;
use crate::registry::Tenant;

/// At most one progress event per this interval reaches the caller; more
/// frequent updates are dropped (the next one that comes late enough, with
/// a higher value, goes through).
const PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

/// Progress notifications buffered per call; when the caller reads too
/// slowly, newer ones are dropped (the relay thins them anyway).
pub(super) const PROGRESS_BUFFER: usize = 64;

/// Runs the call in its own task and streams its progress, then its
/// result. When the caller cancels the stream, the task stops and the
/// upstream request is cancelled.
pub(super) fn invoke_with_progress(
    gateway: Gateway,
    request: Request<pb::InvokeToolRequest>,
) -> EventStream<pb::InvokeToolEvent> {
    let (out, rx) = mpsc::channel::<Result<pb::InvokeToolEvent, Status>>(16);
    tokio::spawn(async move {
        let (sink, mut progress) = mpsc::channel(PROGRESS_BUFFER);
        let sinks = crate::calls::Sinks {
            progress: Some(sink),
            asker: None,
            approval: None,
        };
        let call = calls::invoke(&gateway, request, sinks);
        tokio::pin!(call);
        let mut thinning = Thinning::default();
        loop {
            tokio::select! {
                // The result first: no progress is relayed after it.
                biased;
                result = &mut call => {
                    let event = result.map(|response| pb::InvokeToolEvent {
                        event: Some(pb::invoke_tool_event::Event::Result(response)),
                    });
                    let _ = out.send(event).await;
                    return;
                }
                () = out.closed() => return, // the caller went away: dropping `call` cancels upstream
                Some(update) = progress.recv() => {
                    let Some(event) = thinning.admit(update) else { continue };
                    if out.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

/// The progress relay's filter: non-increasing progress breaks the
/// protocol's promise and is dropped; updates closer together than
/// [`PROGRESS_INTERVAL`] are thinned out.
#[derive(Debug)]
pub(super) struct Thinning {
    last_value: f64,
    last_sent: Option<Instant>,
}

impl Default for Thinning {
    fn default() -> Self {
        Self {
            last_value: f64::NEG_INFINITY,
            last_sent: None,
        }
    }
}

impl Thinning {
    /// The event of `update`, or `None` when it is dropped.
    pub(super) fn admit(
        &mut self,
        update: rmcp::model::ProgressNotificationParam,
    ) -> Option<pb::InvokeToolEvent> {
        if update.progress <= self.last_value
            || self
                .last_sent
                .is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL)
        {
            return None;
        }
        self.last_value = update.progress;
        self.last_sent = Some(Instant::now());
        Some(pb::InvokeToolEvent {
            event: Some(pb::invoke_tool_event::Event::Progress(pb::Progress {
                progress: update.progress,
                total: update.total,
                message: update.message.unwrap_or_default(),
            })),
        })
    }
}

/// What a watcher last sent of one server: its state, its tool count and
/// its withheld tools.
type ServerSeen = (ServerState, u32, Vec<String>);

/// The current filtered catalog (the caller's view of it under the
/// tenant's policy), then a new one whenever the tools it sees or the
/// servers' states change. Ends with UNAVAILABLE (DRAINING) when the
/// gateway drains, so watchers reconnect to another replica, and with
/// UNAUTHENTICATED as soon as its caller would be refused: a reload
/// removed its token or tenant (re-checked at every configuration
/// applied), or its JWT expired (at `exp` plus the issuer's clock skew).
/// The caller is also re-checked right before each snapshot is handed
/// over, and the stream has no buffer of its own: no snapshot leaves
/// after the credential ended.
pub(super) fn watch(
    tenant: Arc<Tenant>,
    filter: Filter,
    (caller, subject): (Caller, Subject),
    standing: Option<Standing>,
    drain: Arc<drain::Drain>,
) -> EventStream<super::reply::ListToolsReply> {
    let watch = Watch {
        changes: tenant.subscribe(),
        credential: Credential::new(&tenant.name, (caller, subject), standing),
        tenant,
        filter,
        drain,
        last: None,
        ended: false,
    };
    Box::pin(futures::stream::unfold(watch, |mut watch| async move {
        let item = watch.next().await?;
        Some((item, watch))
    }))
}

/// One watch's state between snapshots.
struct Watch {
    tenant: Arc<Tenant>,
    filter: Filter,
    /// The caller, re-checked at reloads and at its JWT's expiry.
    credential: Credential,
    drain: Arc<drain::Drain>,
    changes: tokio::sync::watch::Receiver<crate::catalog::SharedCatalog>,
    /// What the last snapshot sent showed: the catalog version (its tools)
    /// and each server's state (and withheld tools). A new snapshot is
    /// built and sent only when one of them changed: no per-watcher deep
    /// copy or comparison of whole catalogs.
    last: Option<(String, Vec<ServerSeen>)>,
    /// Set once the stream's last message is out.
    ended: bool,
}

impl Watch {
    /// The next message: a snapshot, or the status that ends the stream
    /// (`None` after it).
    async fn next(&mut self) -> Option<Result<super::reply::ListToolsReply, Status>> {
        loop {
            if self.ended {
                return None;
            }
            let in_force = match self.credential.check() {
                Ok(stamp) => stamp,
                Err(refused) => return Some(Err(self.end(refused))),
            };
            let catalog = self.changes.borrow_and_update().clone();
            // A reload publishes its tenants' catalogs just before its
            // configuration is in force: one built by a tenant object newer
            // than the one the caller was re-checked against waits for
            // that configuration (and a re-check against it).
            let ahead = in_force.is_some_and(|stamp| catalog.stamp() > stamp);
            if !ahead && let Some(snapshot) = self.snapshot_if_changed(&catalog) {
                return Some(Ok(snapshot));
            }
            let woke = self.wait().await;
            match woke {
                Woke::Changed => {}
                Woke::Closed => return None,
                Woke::Draining => return Some(Err(self.end(CallError::Draining))),
                Woke::Removed => {
                    let removed = CallError::Unauthenticated(
                        "the tenant was removed by a configuration reload",
                    );
                    return Some(Err(self.end(removed)));
                }
                // The caller is re-checked at the top of the loop.
                Woke::Recheck => {}
            }
        }
    }

    /// Waits for whatever comes first of what may change the next message.
    async fn wait(&mut self) -> Woke {
        let Watch {
            changes,
            credential,
            drain,
            tenant,
            ..
        } = self;
        tokio::select! {
            changed = changes.changed() => if changed.is_ok() { Woke::Changed } else { Woke::Closed },
            () = drain.draining() => Woke::Draining,
            () = tenant.removed() => Woke::Removed,
            () = credential.recheck_due() => Woke::Recheck,
        }
    }

    /// Marks the stream ended with `error`, its last message.
    fn end(&mut self, error: CallError) -> Status {
        self.ended = true;
        error.into()
    }

    /// The caller's snapshot of `catalog`, when what it shows differs from
    /// the last one sent.
    fn snapshot_if_changed(
        &mut self,
        catalog: &crate::catalog::SharedCatalog,
    ) -> Option<super::reply::ListToolsReply> {
        // The policy of the tenant object that built this snapshot
        // (reloads replace the one the watch started with).
        let policy = crate::calls::viewer::policy_for(&self.tenant, catalog);
        let view = crate::calls::viewer::Viewer {
            policy: policy.as_deref(),
            caller: &self.credential.caller,
            subject: &self.credential.subject,
        }
        .view(catalog);
        let seen = (
            view.as_ref()
                .map_or(catalog.version(), |v| v.version())
                .to_owned(),
            catalog
                .servers()
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let withheld = s
                        .withheld
                        .iter()
                        .map(|w| w.tool.name.clone())
                        .filter(|n| view.as_ref().is_none_or(|v| !v.hides_withheld(n)));
                    let count = view
                        .as_ref()
                        .map_or(s.tool_count, |v| v.server_tool_count(i));
                    (s.state.clone(), count, withheld.collect())
                })
                .collect::<Vec<_>>(),
        );
        if self.last.as_ref() == Some(&seen) {
            return None;
        }
        self.last = Some(seen);
        Some(listing::list_response(
            catalog,
            &self.filter,
            view.as_deref(),
        ))
    }
}

/// What woke a waiting watch.
enum Woke {
    /// A new catalog was published.
    Changed,
    /// The tenant's catalog channel closed.
    Closed,
    /// The gateway drains.
    Draining,
    /// A reload removed the tenant.
    Removed,
    /// The caller must be re-checked: a configuration was applied, or its
    /// JWT expired.
    Recheck,
}

/// The caller of a long-lived stream (`WatchTools`, `WatchResource`),
/// re-checked as the configuration and time go: the stream ends as soon as
/// the caller would be refused (a reload removed its token or tenant, or
/// moved it to another tenant; its JWT expired, at `exp` plus the issuer's
/// clock skew).
pub(super) struct Credential {
    /// The tenant the stream serves.
    tenant: String,
    pub(super) caller: Caller,
    pub(super) subject: Subject,
    /// What re-checks the caller (absent only without the auth layer).
    standing: Option<Standing>,
    /// Changes at every configuration applied.
    applied: Option<tokio::sync::watch::Receiver<u64>>,
    /// When the caller's JWT stops being accepted.
    expires: Option<SystemTime>,
}

impl Credential {
    /// The caller of a stream of `tenant`.
    pub(super) fn new(
        tenant: &str,
        (caller, subject): (Caller, Subject),
        standing: Option<Standing>,
    ) -> Self {
        Self {
            tenant: tenant.to_owned(),
            applied: standing.as_ref().map(|s| s.registry.applied()),
            expires: expiry(standing.as_ref(), &caller),
            caller,
            subject,
            standing,
        }
    }

    /// Whether the caller would still be accepted now, for this tenant;
    /// the stamp of the tenant object in force (`None`: not re-checked).
    ///
    /// # Errors
    /// The caller would be refused now (UNAUTHENTICATED).
    pub(super) fn check(&self) -> Result<Option<u64>, CallError> {
        if self.expires.is_some_and(|at| SystemTime::now() >= at) {
            return Err(CallError::Token(crate::callers::TokenError::Expired));
        }
        let Some(standing) = &self.standing else {
            return Ok(None);
        };
        let tenant = standing
            .recheck(&self.caller, &self.subject)
            .map_err(CallError::from)?;
        if tenant.name != self.tenant {
            return Err(CallError::Unauthenticated(
                "the credential selects another tenant since a configuration reload",
            ));
        }
        Ok(Some(tenant.stamp()))
    }

    /// Resolves when the caller must be checked again ([`Self::check`]):
    /// a configuration was applied, or the JWT's expiry came.
    pub(super) async fn recheck_due(&mut self) {
        let Credential {
            applied,
            expires,
            standing,
            caller,
            ..
        } = self;
        let reloaded = async {
            let changed = match applied {
                Some(applied) => applied.changed().await.is_ok(),
                None => false,
            };
            if !changed {
                std::future::pending::<()>().await;
            }
        };
        let expired = async {
            match *expires {
                Some(at) => {
                    let left = at
                        .duration_since(SystemTime::now())
                        .unwrap_or(Duration::ZERO);
                    tokio::time::sleep(left).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // The new configuration may give the issuer another skew.
            () = reloaded => *expires = expiry(standing.as_ref(), caller),
            () = expired => {}
        }
    }
}

/// When the caller's JWT stops being accepted, under the current
/// configuration.
fn expiry(standing: Option<&Standing>, caller: &Caller) -> Option<SystemTime> {
    standing.and_then(|s| s.expires_at(caller))
}
