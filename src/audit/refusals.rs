//! `RefusalLayer`: a tower layer that records the ToolGateway RPCs refused
//! before they reached the service (by authentication or while decoding),
//! and `Reached`, how the service tells it a request got through.
//!
//! Refusals are summed up per peer (its IP address) and interval
//! ([`REFUSAL_INTERVAL`]): a peer's first refusal in an interval is
//! written as its own record; the later ones are counted, and written as
//! one summary (`event: refusals_summarized`: the peer, how many, the
//! first and last time, how many of each reason) when the interval ends or
//! the gateway stops. At most [`MAX_REFUSAL_PEERS`] peers are kept per
//! interval; the refusals of further peers are counted into one summary
//! without a peer. Nothing is dropped, and memory stays bounded, however
//! fast a client is refused.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use super::Audit;
use super::record::{Outcome, Record, RecordKind, code_name, millis};

/// How long a peer's refusals are summed up: its first refusal in an
/// interval is written at once, the others as one summary when the
/// interval ends.
pub const REFUSAL_INTERVAL: Duration = Duration::from_secs(10);

/// Most peers whose refusals are summed up one by one in an interval;
/// further peers' refusals go into one summary without a peer.
pub const MAX_REFUSAL_PEERS: usize = 1024;

/// Most distinct reasons a summary counts one by one; further ones are
/// counted as `OTHER`.
const MAX_REASONS: usize = 32;

/// The `event` of a summary of refusals.
pub const REFUSALS_SUMMARIZED: &str = "refusals_summarized";

/// The refusals of one peer (or of the peers over the limit) counted in
/// this interval and not written one by one.
#[derive(Debug)]
struct Tally {
    count: u64,
    first: SystemTime,
    last: SystemTime,
    reasons: BTreeMap<String, u64>,
}

impl Tally {
    fn new() -> Self {
        let now = SystemTime::now();
        Self {
            count: 0,
            first: now,
            last: now,
            reasons: BTreeMap::new(),
        }
    }

    fn add(&mut self, reason: &str) {
        let now = SystemTime::now();
        if self.count == 0 {
            self.first = now;
        }
        self.count += 1;
        self.last = now;
        let key = if self.reasons.len() < MAX_REASONS || self.reasons.contains_key(reason) {
            reason
        } else {
            "OTHER"
        };
        *self.reasons.entry(key.to_owned()).or_default() += 1;
    }

    /// The summary record of what was counted (`peer` absent for the
    /// peers over the limit); `None` when nothing was.
    fn summary(self, peer: Option<IpAddr>) -> Option<Record> {
        if self.count == 0 {
            return None;
        }
        let mut record = Record::new(RecordKind::Refusal, Outcome::Refused);
        record.event = Some(REFUSALS_SUMMARIZED.to_owned());
        record.peer = peer.map(|ip| ip.to_string());
        record.count = Some(self.count);
        record.first_time = Some(humantime::format_rfc3339_millis(self.first).to_string());
        record.last_time = Some(humantime::format_rfc3339_millis(self.last).to_string());
        record.reasons = Some(self.reasons);
        Some(record)
    }
}

/// The refusals of the current interval, per peer: bounded.
#[derive(Debug, Default)]
pub(super) struct RefusalWindow {
    inner: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// Peers refused in this interval (the unknown peer as `None`).
    peers: HashMap<Option<IpAddr>, Tally>,
    /// The refusals of peers beyond [`MAX_REFUSAL_PEERS`].
    overflow: Option<Tally>,
}

impl RefusalWindow {
    /// Notes a refusal of `peer` for `reason`: true when it is to be
    /// written as its own record (the peer's first in this interval),
    /// false when it was counted for the interval's summary.
    pub(super) fn note(&self, peer: Option<IpAddr>, reason: &str) -> bool {
        let mut window = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let full = window.peers.len() >= MAX_REFUSAL_PEERS;
        if let Some(tally) = window.peers.get_mut(&peer) {
            tally.add(reason);
            return false;
        }
        if full {
            window.overflow.get_or_insert_with(Tally::new).add(reason);
            return false;
        }
        window.peers.insert(peer, Tally::new());
        true
    }

    /// Ends the interval: the summaries of what was counted in it.
    pub(super) fn take(&self) -> Vec<Record> {
        let window = std::mem::take(&mut *self.inner.lock().unwrap_or_else(|e| e.into_inner()));
        let mut records: Vec<Record> = window
            .peers
            .into_iter()
            .filter_map(|(peer, tally)| tally.summary(peer))
            .collect();
        records.extend(window.overflow.and_then(|tally| tally.summary(None)));
        records
    }
}

/// Writes the summaries of refusals at the end of each interval, until
/// `stop` (the last handle of the trail dropped; what is left then is
/// queued by the handle's drop).
pub(super) async fn summarize_refusals(
    audit: std::sync::Weak<super::Inner>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut ticks = tokio::time::interval(REFUSAL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let Some(inner) = audit.upgrade() else { return };
        let audit = Audit(Some(inner));
        audit.write_refusal_summaries().await;
    }
}

/// An RPC refused before it reached the service (by the authentication
/// layer), as [`Audit::refused`] records it.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The gRPC method name (`InvokeTool`, `ListTools`, ...).
    pub rpc: String,
    /// The caller's address.
    pub peer: Option<std::net::SocketAddr>,
    /// The status code answered.
    pub code: tonic::Code,
    /// The `ErrorInfo` reason answered.
    pub reason: Option<String>,
    /// How long the refusal took.
    pub duration: Duration,
    /// The caller's W3C trace id.
    pub trace_id: Option<String>,
}

impl Audit {
    /// Records a refusal by the authentication layer (no tenant known) and
    /// waits until it is written. A refused RPC keeps its own status in
    /// every mode: it served nothing.
    ///
    /// A peer's first refusal in an interval is written at once; its later
    /// ones are counted and written as one summary when the interval ends
    /// (see the module's documentation).
    pub async fn refused(&self, refusal: Refusal) {
        let Some(inner) = &self.0 else {
            return;
        };
        let reason = refusal
            .reason
            .as_deref()
            .unwrap_or_else(|| code_name(refusal.code));
        if !inner.refusals.note(refusal.peer.map(|p| p.ip()), reason) {
            return;
        }
        let mut record = Record::new(RecordKind::Refusal, Outcome::Refused);
        record.rpc = Some(refusal.rpc);
        record.peer = refusal.peer.map(|p| p.to_string());
        record.code = Some(code_name(refusal.code).to_owned());
        record.reason = refusal.reason;
        record.duration_ms = Some(millis(refusal.duration));
        record.trace_id = refusal.trace_id;
        let _ = self.write(record).await;
    }

    /// Ends the interval of refusals: writes the summary of each peer's
    /// refusals counted in it (and waits for them).
    pub(super) async fn write_refusal_summaries(&self) {
        let Some(inner) = &self.0 else {
            return;
        };
        for record in inner.refusals.take() {
            let _ = self.write(record).await;
        }
    }
}

/// Put into a ToolGateway request's extensions by [`RefusalLayer`]; marked
/// when the request reaches the service (authentication passed), so the
/// layer records only what was refused before.
#[derive(Debug, Clone, Default)]
pub struct Reached(Arc<AtomicBool>);

impl Reached {
    /// The request reached the service.
    pub fn mark(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_marked(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The gRPC path prefix of the audited service.
const SERVICE_PATH: &str = "/toolgate.v1.ToolGateway/";

/// The gRPC path prefix of MCP's transport, whose RPCs are recorded as
/// `Mcp/<method>` (as its calls are: `crate::grpc::mcp`).
const MCP_SERVICE_PATH: &str = "/model_context_protocol.Mcp/";

/// A tower layer that records every ToolGateway (and `Mcp`) RPC refused before it
/// reached the service: by authentication (a missing, unknown or invalid
/// credential, an invalid subject) or while decoding the request. The
/// record is written before the refusal leaves.
#[derive(Debug, Clone)]
pub struct RefusalLayer {
    audit: Audit,
}

impl RefusalLayer {
    /// A layer recording into `audit` (does nothing when disabled).
    pub fn new(audit: Audit) -> Self {
        Self { audit }
    }
}

impl<S> tower::Layer<S> for RefusalLayer {
    type Service = Refusals<S>;

    fn layer(&self, inner: S) -> Refusals<S> {
        Refusals {
            inner,
            audit: self.audit.clone(),
        }
    }
}

/// The service of [`RefusalLayer`].
#[derive(Debug, Clone)]
pub struct Refusals<S> {
    inner: S,
    audit: Audit,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

impl<S, B, R> tower::Service<http::Request<B>> for Refusals<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The ready service answers this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = request.uri().path();
        let rpc = path
            .strip_prefix(SERVICE_PATH)
            .map(str::to_owned)
            .or_else(|| {
                path.strip_prefix(MCP_SERVICE_PATH)
                    .map(|rpc| format!("Mcp/{rpc}"))
            })
            .filter(|_| self.audit.is_enabled());
        let Some(rpc) = rpc else {
            return Box::pin(inner.call(request));
        };
        let reached = Reached::default();
        request.extensions_mut().insert(reached.clone());
        let peer = peer_addr(request.extensions());
        let trace_id = request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(crate::telemetry::trace::traceparent_id);
        let started = Instant::now();
        let audit = self.audit.clone();
        let call = inner.call(request);
        Box::pin(async move {
            let response = call.await?;
            if !reached.is_marked()
                && let Some(status) = refusal_status(&response)
            {
                use tonic_types::StatusExt as _;
                audit
                    .refused(Refusal {
                        rpc,
                        peer,
                        code: status.code(),
                        reason: status.get_details_error_info().map(|info| info.reason),
                        duration: started.elapsed(),
                        trace_id,
                    })
                    .await;
            }
            Ok(response)
        })
    }
}

/// The error status of a trailers-only response (how a refusal before the
/// service is answered), if it is one.
fn refusal_status<R>(response: &http::Response<R>) -> Option<tonic::Status> {
    // The headers are what leaves (a later layer may have rewritten them).
    let status = tonic::Status::from_header_map(response.headers())
        .or_else(|| response.extensions().get::<tonic::Status>().cloned())?;
    (status.code() != tonic::Code::Ok).then_some(status)
}

/// The caller's address: from the TCP connection, or the TCP connection
/// under TLS (`grpc.tls`).
fn peer_addr(extensions: &http::Extensions) -> Option<std::net::SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    extensions
        .get::<TcpConnectInfo>()
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .map(TlsConnectInfo::get_ref)
        })
        .and_then(TcpConnectInfo::remote_addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn a_peers_first_refusal_is_written_and_the_rest_summed_up() {
        let window = RefusalWindow::default();
        assert!(window.note(ip(1), "UNAUTHENTICATED"));
        for _ in 0..29_180 {
            assert!(!window.note(ip(1), "UNAUTHENTICATED"));
        }
        assert!(!window.note(ip(1), "TOKEN_INVALID"));
        assert!(window.note(ip(2), "UNAUTHENTICATED"), "another peer");
        let records = window.take();
        assert_eq!(records.len(), 1, "only what was counted: {records:?}");
        let summary = &records[0];
        assert_eq!(summary.kind, RecordKind::Refusal);
        assert_eq!(summary.event.as_deref(), Some(REFUSALS_SUMMARIZED));
        assert_eq!(summary.peer.as_deref(), Some("10.0.0.1"));
        assert_eq!(summary.count, Some(29_181));
        let reasons = summary.reasons.as_ref().unwrap();
        assert_eq!(reasons["UNAUTHENTICATED"], 29_180);
        assert_eq!(reasons["TOKEN_INVALID"], 1);
        assert!(summary.first_time.as_ref().unwrap() <= summary.last_time.as_ref().unwrap());
        // A new interval: the first refusal is written again.
        assert!(window.note(ip(1), "UNAUTHENTICATED"));
        assert!(window.take().is_empty());
    }

    #[test]
    fn peers_beyond_the_bound_are_summed_up_together() {
        let window = RefusalWindow::default();
        for n in 0..MAX_REFUSAL_PEERS {
            let peer = Some(IpAddr::from(std::net::Ipv6Addr::from(n as u128)));
            assert!(window.note(peer, "UNAUTHENTICATED"));
        }
        for n in 0..500u128 {
            let peer = Some(IpAddr::from(std::net::Ipv6Addr::from(u128::MAX - n)));
            assert!(!window.note(peer, "UNAUTHENTICATED"), "over the bound");
        }
        assert_eq!(window.inner.lock().unwrap().peers.len(), MAX_REFUSAL_PEERS);
        let records = window.take();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0].peer, None);
        assert_eq!(records[0].count, Some(500));
    }

    #[test]
    fn reasons_are_bounded_too() {
        let window = RefusalWindow::default();
        assert!(window.note(ip(1), "first"));
        for n in 0..100 {
            window.note(ip(1), &format!("R{n}"));
        }
        let records = window.take();
        let reasons = records[0].reasons.as_ref().unwrap();
        assert_eq!(reasons.len(), MAX_REASONS + 1);
        assert_eq!(reasons["OTHER"], 100 - MAX_REASONS as u64);
    }
}
