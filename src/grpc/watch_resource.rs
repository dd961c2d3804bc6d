//! `WatchResource`: one resource's updates, from a refcounted upstream
//! subscription per session and URI, ended with a status when the server,
//! the caller's credential or the configuration goes.
//!
//! The watch is checked in order: the URI's normal form
//! (`INVALID_RESOURCE_URI`, [`crate::policy::ResourceUri`]; the server is
//! subscribed to that form), the server (`SERVER_NOT_FOUND`), the
//! tenant's resource policy (`RESOURCE_NOT_PERMITTED`), the tenant's open
//! watches (`WATCH_LIMIT`), the session (per-user servers: the subject's
//! own, with a call's consent errors), the server's capabilities
//! (`RESOURCES_UNSUPPORTED`, `SUBSCRIBE_UNSUPPORTED`), then the
//! subscription itself. The first message says the subscription is in
//! place; each later one that the resource changed (updates arriving
//! while the worker reads slowly are coalesced into one). The stream ends
//! with a status: the session ended (`UPSTREAM_CONNECTION_LOST`, watch
//! again), a reload removed or changed the server (`SERVER_REMOVED`), the
//! caller would be refused now (UNAUTHENTICATED), the gateway drains
//! (`DRAINING`). Its opening and its end are audit records.

use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status};

use super::auth_layer::Standing;
use super::stream::Credential;
use super::{EventStream, Gateway};
use crate::calls::drain;
use crate::calls::error::{CallError, Feature, Target, quoted};
use crate::calls::{AuditedCall, Progress, Recorded};
use crate::pb;
use crate::policy::ResourceUri;
use crate::registry::{Busy, Tenant, WatchPermit};
use crate::upstream::{ResourceWatch, UpstreamError, WatchEnd};

/// `WatchResource`: checks the request and subscribes, then streams.
pub(super) async fn start(
    gateway: &Gateway,
    request: Request<pb::WatchResourceRequest>,
) -> Result<EventStream<pb::ResourceUpdate>, Status> {
    let started = Instant::now();
    // Busy for the watch's life: a lazy tenant's sessions stay up.
    let (tenant, busy) = gateway.listing_tenant(&request)?;
    let (caller, subject) = super::caller_of(&request);
    let standing = request.extensions().get::<Standing>().cloned();
    let asked = request.get_ref().clone();
    // The URI in its normal form: what the policy matches, the server is
    // sent and the records keep (as asked, when it has none).
    let uri = ResourceUri::parse(&asked.uri);
    let recorded = uri
        .as_ref()
        .map_or_else(|_| asked.uri.clone(), |u| u.as_str().to_owned());
    let record = |event: &'static str| {
        let mut origin = gateway.origin(&request, tenant.clone(), "WatchResource");
        origin.started = started;
        let mut audited = AuditedCall::of(gateway.calls.audit(), &origin, || None);
        audited.describe(|record| {
            record.event = Some(event.to_owned());
            record.uri = Some(
                tenant
                    .redactor()
                    .redact(&Target::resource(recorded.as_str()).name)
                    .into_owned(),
            );
        });
        audited
    };
    let mut opening = record("watch_opened");
    let credential = Credential::new(&tenant.name, (caller, subject), standing);
    let opened = match uri {
        Ok(uri) => open(&tenant, &asked.server, uri, &credential, &mut opening).await,
        Err(refused) => Err(refused.into()),
    };
    // The server named, when it is one of the tenant's (refusals too).
    let known = tenant.servers().any(|s| s.name == asked.server);
    let progress = Progress {
        server: known.then_some(asked.server.as_str()),
        sent: opened.is_ok(),
        idempotent: true,
        ..Progress::none()
    };
    let unaudited = opening.finish(&opened, progress).await;
    let opened = opened?;
    if let Some(unaudited) = unaudited {
        return Err(unaudited.into());
    }
    let mut closing = record("watch_ended");
    closing.describe(|record| record.server = Some(opened.server.clone()));
    let first = pb::ResourceUpdate {
        server: opened.server.clone(),
        uri: opened.uri.as_str().to_owned(),
        initial: true,
    };
    let stream = Stream {
        first: Some(first),
        opened,
        credential,
        drain: gateway.calls.drain().clone(),
        tenant,
        closing: Some(closing),
        started,
        _busy: busy,
    };
    Ok(Box::pin(futures::stream::unfold(
        stream,
        |mut stream| async move {
            let item = stream.next().await?;
            Some((item, stream))
        },
    )))
}

/// A watch in place.
struct Opened {
    /// The server's configured name.
    server: String,
    /// The URI watched, in its normal form.
    uri: ResourceUri,
    watch: ResourceWatch,
    /// Cancelled when the server's slot stops (removed or changed).
    stopped: CancellationToken,
    _permit: WatchPermit,
}

impl Recorded for Opened {}

/// Checks the request and subscribes (see the module's order).
async fn open(
    tenant: &Tenant,
    server: &str,
    uri: ResourceUri,
    credential: &Credential,
    opening: &mut AuditedCall,
) -> Result<Opened, CallError> {
    let Some(index) = tenant.servers().position(|s| s.name == server) else {
        return Err(CallError::ServerNotFound {
            server: quoted(server).into_owned(),
        });
    };
    let server = server.to_owned();
    let target = Target::resource(uri.as_str());
    if let Some(policy) = tenant.policy()
        && !policy.allows_resource(&credential.caller, &credential.subject, &server, &uri)
    {
        return Err(CallError::NotPermitted { server, target });
    }
    let limit = tenant.limits().max_watches;
    let permit = tenant.open_watch().ok_or(CallError::WatchLimit { limit })?;
    let stopped = tenant
        .server_stopped(index)
        .ok_or_else(|| CallError::ServerRemoved {
            server: server.clone(),
        })?;
    // Under `audit.required`, nothing is subscribed that is not recorded.
    opening.admit(true).await?;
    let session =
        crate::calls::session::session(tenant, index, &credential.subject, &target, true).await?;
    let capabilities = session.server_capabilities();
    let Some(resources) = capabilities.resources else {
        return Err(CallError::Unsupported {
            server,
            feature: Feature::Resources,
        });
    };
    if resources.subscribe != Some(true) {
        return Err(CallError::Unsupported {
            server,
            feature: Feature::Subscriptions,
        });
    }
    let timeout = tenant.server(index).call_timeout;
    let watch = session
        .watch_resource(uri.as_str(), timeout)
        .await
        .map_err(|error| {
            crate::calls::session::failure(
                tenant,
                index,
                &server,
                &target,
                &credential.subject,
                error,
                true,
            )
        })?;
    Ok(Opened {
        server,
        uri,
        watch,
        stopped,
        _permit: permit,
    })
}

/// One watch's state between messages.
struct Stream {
    /// The first message, until sent.
    first: Option<pb::ResourceUpdate>,
    opened: Opened,
    credential: Credential,
    drain: Arc<drain::Drain>,
    tenant: Arc<Tenant>,
    /// The record of the watch's end; `None` once written. Dropped with
    /// the stream (the worker went away), it is recorded as cancelled.
    closing: Option<AuditedCall>,
    started: Instant,
    _busy: Busy,
}

impl Stream {
    /// The next message, or the status that ends the stream (`None`
    /// after it).
    async fn next(&mut self) -> Option<Result<pb::ResourceUpdate, Status>> {
        self.closing.as_ref()?;
        // Nothing leaves for a caller that would be refused now.
        if let Err(refused) = self.credential.check() {
            return Some(Err(self.end(refused).await));
        }
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        let ended = loop {
            tokio::select! {
                biased;
                () = self.drain.draining() => break CallError::Draining,
                () = self.credential.recheck_due() => {
                    if let Err(refused) = self.credential.check() {
                        break refused;
                    }
                }
                () = self.opened.stopped.cancelled() => {
                    break if self.drain.draining().now_or_never().is_some() {
                        CallError::Draining
                    } else {
                        CallError::ServerRemoved {
                            server: self.opened.server.clone(),
                        }
                    };
                }
                () = self.tenant.removed() => {
                    break CallError::Unauthenticated(
                        "the tenant was removed by a configuration reload",
                    );
                }
                update = self.opened.watch.next() => match update {
                    Ok(uri) => {
                        if let Err(refused) = self.credential.check() {
                            break refused;
                        }
                        // The server's URI in normal form, as a worker
                        // reads it (as the server named it, without one).
                        let uri = ResourceUri::parse(&uri).map_or(uri, ResourceUri::into_string);
                        return Some(Ok(pb::ResourceUpdate {
                            server: self.opened.server.clone(),
                            uri,
                            initial: false,
                        }));
                    }
                    Err(end) => break self.lost(end),
                },
            }
        };
        Some(Err(self.end(ended).await))
    }

    /// The error of a subscription that ended under the watch.
    fn lost(&self, end: WatchEnd) -> CallError {
        let what = match end {
            WatchEnd::SessionEnded => "the session with the server ended; watch again",
            WatchEnd::ListenEnded => "the server ended the subscription stream; watch again",
        };
        CallError::Upstream {
            server: self.opened.server.clone(),
            tool: Target::resource(self.opened.uri.as_str()),
            error: UpstreamError::Transport(what.to_owned()),
            idempotent: true,
        }
    }

    /// Records the end and gives the status that ends the stream.
    async fn end(&mut self, error: CallError) -> Status {
        if let Some(closing) = self.closing.take() {
            let result: Result<(), CallError> = Err(error);
            let progress = Progress {
                server: Some(&self.opened.server),
                sent: true,
                idempotent: true,
                ..Progress::none()
            };
            let _ = closing.finish(&result, progress).await;
            tracing::debug!(
                tenant = %self.tenant.name,
                server = %self.opened.server,
                watched_ms = self.started.elapsed().as_millis() as u64,
                "a resource watch ended"
            );
            return match result {
                Err(error) => error.into(),
                Ok(()) => Status::ok(""),
            };
        }
        Status::from(error)
    }
}
