//! Server streams: a call with its progress relayed, and a watch on the
//! tenant's catalog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status};

use super::listing::{self, Filter};
use super::{EventStream, Gateway, call, drain::Drain};
use crate::callers::{Caller, Subject};
use crate::catalog::ServerState;
use crate::grpc::error::CallError;
use crate::pb;
use crate::registry::Tenant;

/// At most one progress event per this interval reaches the caller; more
/// frequent updates are dropped (the next one that comes late enough, with
/// a higher value, goes through).
const PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

/// Progress notifications buffered per call; when the caller reads too
/// slowly, newer ones are dropped (the relay thins them anyway).
const PROGRESS_BUFFER: usize = 64;

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
        let call = call::run_call(&gateway, request, Some(sink));
        tokio::pin!(call);
        let mut last_value = f64::NEG_INFINITY;
        let mut last_sent: Option<Instant> = None;
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
                    // Non-increasing progress breaks the protocol's promise;
                    // too frequent updates are thinned out.
                    if update.progress <= last_value
                        || last_sent.is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL)
                    {
                        continue;
                    }
                    last_value = update.progress;
                    last_sent = Some(Instant::now());
                    let event = pb::InvokeToolEvent {
                        event: Some(pb::invoke_tool_event::Event::Progress(pb::Progress {
                            progress: update.progress,
                            total: update.total,
                            message: update.message.unwrap_or_default(),
                        })),
                    };
                    if out.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

/// What a watcher last sent of one server: its state, its tool count and
/// its withheld tools.
type ServerSeen = (ServerState, u32, Vec<String>);

/// The current filtered catalog (the caller's view of it under the
/// tenant's policy), then a new one whenever the tools it sees or the
/// servers' states change. Ends with UNAVAILABLE (DRAINING) when the
/// gateway drains, so watchers reconnect to another replica.
pub(super) fn watch(
    tenant: Arc<Tenant>,
    filter: Filter,
    (caller, subject): (Caller, Subject),
    drain: Arc<Drain>,
) -> EventStream<super::reply::ListToolsReply> {
    let (out, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut changes = tenant.subscribe();
        // What the last snapshot sent showed: the catalog version (its
        // tools) and each server's state (and withheld tools). A new snapshot is built and sent
        // only when one of them changed: no per-watcher deep copy or
        // comparison of whole catalogs.
        let mut last: Option<(String, Vec<ServerSeen>)> = None;
        loop {
            let catalog = changes.borrow_and_update().clone();
            // The policy of the tenant object that built this snapshot
            // (reloads replace the one the watch started with).
            let policy = listing::policy_for(&tenant, &catalog);
            let view = listing::Viewer {
                policy: policy.as_deref(),
                caller: &caller,
                subject: &subject,
            }
            .view(&catalog);
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
            if last.as_ref() != Some(&seen) {
                let snapshot = listing::list_response(&catalog, &filter, view.as_deref());
                if out.send(Ok(snapshot)).await.is_err() {
                    return;
                }
                last = Some(seen);
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = out.closed() => return,
                () = drain.draining() => {
                    let _ = out.send(Err(CallError::Draining.into())).await;
                    return;
                }
                () = tenant.removed() => {
                    let _ = out
                        .send(Err(CallError::Unauthenticated("the tenant was removed by a configuration reload").into()))
                        .await;
                    return;
                }
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}
