//! `RefusalLayer`: a tower layer that records the ToolGateway RPCs refused
//! before they reached the service (by authentication or while decoding),
//! and `Reached`, how the service tells it a request got through.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::Audit;
use super::record::{Outcome, Record, RecordKind, code_name, millis};

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
    pub async fn refused(&self, refusal: Refusal) {
        if self.0.is_none() {
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

/// A tower layer that records every ToolGateway RPC refused before it
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
        let rpc = request
            .uri()
            .path()
            .strip_prefix(SERVICE_PATH)
            .filter(|_| self.audit.is_enabled())
            .map(str::to_owned);
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
