//! The audit trail (`audit:`): one JSON line per tool call (`InvokeTool`,
//! `InvokeToolStream`), per call the authentication layer refused, and per
//! upstream authorization event (OAuth consent started, completed or
//! failed; authorization required).
//!
//! A call's record is written before its response leaves: the call's task
//! hands the serialised line to one writer thread over a bounded queue and
//! waits for the writer's acknowledgement. The writer takes every line
//! queued meanwhile and writes them with one `write(2)` (group commit), so
//! a slow disk delays a batch of calls once rather than each call behind
//! every other. Lines reach the file (the kernel's page cache) before the
//! acknowledgement; they are not `fsync`ed.
//!
//! Rotation is the platform's (logrotate without `copytruncate`, or a log
//! shipper that moves the file): before each batch the writer compares the
//! device and inode behind the path with those of the file it has open,
//! and opens the path anew when they differ or the path is gone; SIGHUP
//! does the same at once.
//!
//! With `required: true`, a call is refused before anything is sent
//! upstream (UNAVAILABLE, reason `AUDIT_UNAVAILABLE`) while the sink is
//! known to be broken (its last write or open failed), and a call whose
//! outcome record cannot be written is not answered with its result. When
//! not required, a record that cannot be written is counted
//! (`toolgate_audit_failures_total`) and logged, and the call goes on.

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::{AuditArguments, AuditConfig, AuditDestination};
use crate::credentials::Redactor;
use crate::telemetry::Metrics;

/// The version of the record schema (`"v"` in every record).
pub const SCHEMA_VERSION: u32 = 1;

/// Records waiting for the writer at most; a call that finds the queue
/// full waits (within [`ACK_TIMEOUT`]).
pub const QUEUE: usize = 4096;

/// Records written with one `write(2)` at most.
const MAX_BATCH: usize = 512;

/// How long a call waits for its record to be written. Past it, the record
/// counts as failed (reason `timeout`; it may still be written later): a
/// disk that hangs delays calls by this much, never forever.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The mode of a newly created audit file (owner read-write, group read).
const FILE_MODE: u32 = 0o640;

/// The environment variables naming this replica, in the order read.
pub const REPLICA_VARIABLES: [&str; 2] = ["POD_NAME", "HOSTNAME"];

/// This replica's name: `POD_NAME`, else `HOSTNAME` (Kubernetes sets both
/// to the pod's name when the manifest passes `POD_NAME` from
/// `metadata.name`); `None` when neither is set.
pub fn replica(env: &dyn crate::config::Environment) -> Option<String> {
    REPLICA_VARIABLES
        .iter()
        .filter_map(|name| env.var(name))
        .map(|value| value.trim().to_owned())
        .find(|value| !value.is_empty())
}

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// An `InvokeTool` or `InvokeToolStream` call that reached the service
    /// (whatever became of it: served, refused by policy or limits,
    /// failed, cancelled).
    Call,
    /// A ToolGateway RPC the authentication layer refused (no tenant).
    Refusal,
    /// An upstream OAuth authorization event of a (tenant, subject,
    /// server).
    Authorization,
}

/// How a call or event ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The tool ran and returned a result.
    Ok,
    /// The tool ran and reported an error (`isError`): still an OK RPC.
    ToolError,
    /// The gateway refused the call before sending anything upstream
    /// (credential, subject, policy, approval, limits, unknown tool, bad
    /// arguments, pins, consent needed).
    Refused,
    /// The call failed: nothing could be sent (server down, draining, state
    /// store down, audit sink down) or the upstream failed (`sent` says
    /// which).
    Failed,
    /// The caller went away before the call ended; the tool may have acted.
    Cancelled,
}

/// How the caller proved who it is: never the credential itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallerRecord {
    /// A static token: its position in `tenants[].tokens`.
    Token {
        /// The index in the tenant's `tokens`.
        token_index: usize,
    },
    /// A JWT: its issuer and subject.
    Jwt {
        /// The `iss` claim.
        issuer: String,
        /// The `sub` claim.
        subject: String,
    },
}

impl From<&crate::callers::CallerIdentity> for CallerRecord {
    fn from(identity: &crate::callers::CallerIdentity) -> Self {
        match identity {
            crate::callers::CallerIdentity::Token { index } => CallerRecord::Token {
                token_index: *index,
            },
            crate::callers::CallerIdentity::Jwt { issuer, subject } => CallerRecord::Jwt {
                issuer: issuer.clone(),
                subject: subject.clone(),
            },
        }
    }
}

/// What a record keeps of a call's arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArgumentsRecord {
    /// Lowercase hex SHA-256 of `arguments_json` exactly as received (the
    /// empty string's digest when none were sent).
    pub sha256: String,
    /// The size of `arguments_json` in bytes.
    pub bytes: usize,
    /// `arguments: full` only: the arguments, every configured credential
    /// value replaced by `[redacted]`; a JSON string (redacted too) when
    /// they are not valid JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

impl ArgumentsRecord {
    /// The record of `text` in `mode` (`None` in mode `none`); `full` mode
    /// redacts with `redactor`.
    pub fn of(mode: AuditArguments, text: &str, redactor: &Redactor) -> Option<Self> {
        let digest = || {
            let sha256 = Sha256::digest(text.as_bytes());
            let mut hex = String::with_capacity(64);
            for byte in sha256 {
                use std::fmt::Write as _;
                let _ = write!(hex, "{byte:02x}");
            }
            hex
        };
        match mode {
            AuditArguments::None => None,
            AuditArguments::Digest => Some(Self {
                sha256: digest(),
                bytes: text.len(),
                value: None,
            }),
            AuditArguments::Full => {
                let mut value = match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(value) => value,
                    Err(_) => serde_json::Value::String(text.to_owned()),
                };
                redactor.redact_json(&mut value);
                Some(Self {
                    sha256: digest(),
                    bytes: text.len(),
                    value: Some(value),
                })
            }
        }
    }
}

/// One audit record: a JSON object on one line. Fields that do not apply
/// are left out (see `docs/governance.md`, "Audit trail", for when each is
/// present).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The schema version ([`SCHEMA_VERSION`]).
    pub v: u32,
    /// When the call ended or the event happened: RFC 3339, UTC,
    /// milliseconds (`2025-06-01T12:00:00.123Z`).
    pub time: String,
    /// What the record is about.
    pub kind: RecordKind,
    /// The gRPC method (`InvokeTool`, `InvokeToolStream`, ...) of a call or
    /// refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc: Option<String>,
    /// The caller's tenant (or the event's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The end user the call acted for (`x-toolgate-subject`, or a JWT's
    /// subject expression); absent when the tenant acted for itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// How the caller proved who it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<CallerRecord>,
    /// The caller's address (`ip:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The tool name the caller asked for (at most 64 characters, then a
    /// note of the length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The server the name resolved to (or whose namespace it is in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The definition hash of the tool that was resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition_hash: Option<String>,
    /// What the record keeps of the arguments (absent with `arguments:
    /// none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<ArgumentsRecord>,
    /// The authorization event (`consent_started`, `consent_completed`,
    /// `consent_failed`, `authorization_required`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
    /// Whether the request was handed to the upstream server (calls only):
    /// when true, the tool may have acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<bool>,
    /// The gRPC status code name answered (`OK`, `PERMISSION_DENIED`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The `ErrorInfo` reason of an error status, or why an authorization
    /// event failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How long the call took, in milliseconds (microsecond precision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// The W3C trace id of the call (the caller's `traceparent`, or the
    /// gateway's own span when trace export is on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The replica that wrote the record (`POD_NAME`, else `HOSTNAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

impl Record {
    /// A record of `kind` and `outcome` at the current time; every other
    /// field empty.
    pub fn new(kind: RecordKind, outcome: Outcome) -> Self {
        Self {
            v: SCHEMA_VERSION,
            time: now(),
            kind,
            rpc: None,
            tenant: None,
            subject: None,
            caller: None,
            peer: None,
            tool: None,
            server: None,
            definition_hash: None,
            arguments: None,
            event: None,
            outcome,
            sent: None,
            code: None,
            reason: None,
            duration_ms: None,
            trace_id: None,
            replica: None,
        }
    }
}

/// The current time as RFC 3339, UTC, with milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// A duration in milliseconds, to the microsecond.
pub fn millis(duration: Duration) -> f64 {
    (duration.as_micros() as f64) / 1000.0
}

/// The canonical name of a gRPC status code (`PERMISSION_DENIED`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The outcome of a call that ended with `code`: an error with nothing
/// sent upstream is a refusal when its code says the request itself was
/// refused (credential, permission, argument, name, limit, precondition),
/// else a failure.
pub fn error_outcome(code: tonic::Code, sent: bool) -> Outcome {
    use tonic::Code;
    let refusal = matches!(
        code,
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::NotFound
            | Code::ResourceExhausted
            | Code::FailedPrecondition
    );
    if refusal && !sent {
        Outcome::Refused
    } else {
        Outcome::Failed
    }
}

/// Why a record was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuditFailure {
    /// The sink could not be opened or written (or the writer is gone).
    #[error("the audit sink cannot be written")]
    Write,
    /// The writer did not acknowledge within [`ACK_TIMEOUT`].
    #[error("the audit sink did not answer within {ACK_TIMEOUT:?}")]
    Timeout,
    /// The writer's queue was full (records that are not waited for).
    #[error("the audit queue is full")]
    Overflow,
}

impl AuditFailure {
    /// The `reason` label of `toolgate_audit_failures_total`.
    pub fn label(self) -> &'static str {
        match self {
            AuditFailure::Write => "write",
            AuditFailure::Timeout => "timeout",
            AuditFailure::Overflow => "overflow",
        }
    }
}

/// What the writer is asked to do.
enum Message {
    /// Write a line; say whether it was written.
    Line(Vec<u8>, Option<oneshot::Sender<bool>>),
    /// Answer once everything queued before is written (or failed).
    Flush(oneshot::Sender<bool>),
    /// Open the path anew (SIGHUP).
    Reopen,
}

/// The audit trail's handle: cheap to clone; a disabled one (no `audit:`
/// configured) does nothing.
#[derive(Clone, Default)]
pub struct Audit(Option<Arc<Inner>>);

struct Inner {
    queue: mpsc::Sender<Message>,
    /// False while the last open or write failed.
    healthy: Arc<AtomicBool>,
    arguments: AuditArguments,
    required: bool,
    replica: Option<String>,
    metrics: Arc<Metrics>,
    /// Stops the SIGHUP listener when the last handle is dropped.
    _stop: DropGuard,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Audit(disabled)"),
            Some(inner) => f
                .debug_struct("Audit")
                .field("arguments", &inner.arguments)
                .field("required", &inner.required)
                .field("healthy", &inner.healthy.load(Ordering::Relaxed))
                .finish(),
        }
    }
}

impl Audit {
    /// No audit trail: every method does nothing.
    pub fn disabled() -> Self {
        Self(None)
    }

    /// Opens the sink and starts its writer thread (and, for a file, a
    /// SIGHUP listener that reopens it). A sink that cannot be opened now
    /// is retried with each record; until then it counts as broken. Call
    /// inside a Tokio runtime.
    pub fn start(config: &AuditConfig, replica: Option<String>, metrics: Arc<Metrics>) -> Self {
        metrics.audit_configured();
        let mut sink = Sink::new(config.destination.clone());
        let healthy = Arc::new(AtomicBool::new(false));
        match sink.ensure_open() {
            Ok(()) => {
                healthy.store(true, Ordering::Relaxed);
                tracing::info!(sink = %sink.describe(), arguments = ?config.arguments, required = config.required, "audit trail open");
            }
            Err(error) => {
                tracing::error!(sink = %sink.describe(), %error, required = config.required, "audit sink cannot be opened; retrying with each record");
            }
        }
        let (queue, receiver) = mpsc::channel(QUEUE);
        let writer = Writer {
            sink,
            receiver,
            healthy: healthy.clone(),
            metrics: metrics.clone(),
        };
        std::thread::Builder::new()
            .name("toolgate-audit".to_owned())
            .spawn(move || writer.run())
            .expect("spawn the audit writer thread");
        let stop = CancellationToken::new();
        if matches!(config.destination, AuditDestination::File(_)) {
            tokio::spawn(reopen_on_hangup(queue.downgrade(), stop.clone()));
        }
        Self(Some(Arc::new(Inner {
            queue,
            healthy,
            arguments: config.arguments,
            required: config.required,
            replica,
            metrics,
            _stop: stop.drop_guard(),
        })))
    }

    /// Whether an audit trail is configured.
    pub fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Whether calls fail when their record cannot be written.
    pub fn is_required(&self) -> bool {
        self.0.as_ref().is_some_and(|inner| inner.required)
    }

    /// Whether the sink's last open or write succeeded (true when
    /// disabled).
    pub fn is_healthy(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|inner| inner.healthy.load(Ordering::Relaxed))
    }

    /// Whether a call may be sent upstream: false only when the trail is
    /// required and the sink is known to be broken.
    pub fn admits_calls(&self) -> bool {
        !self.is_required() || self.is_healthy()
    }

    /// What a record keeps of `arguments_json` (nothing when disabled).
    /// `redactor` is asked for only in `full` mode.
    pub fn arguments(
        &self,
        text: &str,
        redactor: impl FnOnce() -> Arc<Redactor>,
    ) -> Option<ArgumentsRecord> {
        let inner = self.0.as_ref()?;
        match inner.arguments {
            AuditArguments::Full => ArgumentsRecord::of(AuditArguments::Full, text, &redactor()),
            mode => ArgumentsRecord::of(mode, text, &Redactor::default()),
        }
    }

    /// Writes `record` (with this replica's name) and waits until it is
    /// written: at most [`ACK_TIMEOUT`]. A failure is counted and logged
    /// here; the caller decides what it means for the call.
    ///
    /// # Errors
    /// The record was not written (or not within [`ACK_TIMEOUT`]).
    pub async fn write(&self, mut record: Record) -> Result<(), AuditFailure> {
        let Some(inner) = &self.0 else {
            return Ok(());
        };
        record.replica.clone_from(&inner.replica);
        let line = serialise(&record);
        let (ack, written) = oneshot::channel();
        let outcome = tokio::time::timeout(ACK_TIMEOUT, async {
            inner
                .queue
                .send(Message::Line(line, Some(ack)))
                .await
                .map_err(|_| AuditFailure::Write)?;
            match written.await {
                Ok(true) => Ok(()),
                _ => Err(AuditFailure::Write),
            }
        })
        .await
        .unwrap_or(Err(AuditFailure::Timeout));
        if let Err(failure) = outcome {
            // Write failures are counted by the writer (once per record).
            if failure != AuditFailure::Write {
                inner.metrics.audit_failure(failure.label());
                tracing::warn!(kind = ?record.kind, %failure, "audit record not written");
            }
        }
        outcome
    }

    /// Queues `record` without waiting (for events that have no response
    /// to hold back, and for calls whose caller went away). A full queue
    /// drops the record and counts it (`overflow`).
    pub fn enqueue(&self, mut record: Record) {
        let Some(inner) = &self.0 else {
            return;
        };
        record.replica.clone_from(&inner.replica);
        let line = serialise(&record);
        if inner.queue.try_send(Message::Line(line, None)).is_err() {
            inner.metrics.audit_failure(AuditFailure::Overflow.label());
            tracing::warn!(kind = ?record.kind, "audit queue full: record dropped");
        }
    }

    /// Waits until every record queued before is written (or failed), at
    /// most [`ACK_TIMEOUT`]; false when something failed.
    pub async fn flush(&self) -> bool {
        let Some(inner) = &self.0 else {
            return true;
        };
        let (ack, done) = oneshot::channel();
        tokio::time::timeout(ACK_TIMEOUT, async {
            inner.queue.send(Message::Flush(ack)).await.ok()?;
            done.await.ok()
        })
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
    }

    /// Records an upstream authorization event of (`tenant`, `subject`,
    /// `server`) without waiting. `subject` is empty for the tenant itself.
    /// Only `consent_started`, `consent_completed`, `consent_failed` and
    /// `authorization_required` are recorded; other OAuth events (tokens
    /// issued and refreshed) are metrics only.
    pub fn authorization(
        &self,
        tenant: &str,
        subject: &str,
        server: &str,
        event: &str,
        reason: Option<&str>,
    ) {
        if self.0.is_none() {
            return;
        }
        if let Some(record) = authorization_record(tenant, subject, server, event, reason) {
            self.enqueue(record);
        }
    }

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

/// A record of an authorization `event`, if it is one that is audited.
fn authorization_record(
    tenant: &str,
    subject: &str,
    server: &str,
    event: &str,
    reason: Option<&str>,
) -> Option<Record> {
    let outcome = match event {
        "consent_started" | "authorization_required" => Outcome::Refused,
        "consent_completed" => Outcome::Ok,
        "consent_failed" => Outcome::Failed,
        _ => return None,
    };
    let mut record = Record::new(RecordKind::Authorization, outcome);
    record.tenant = (!tenant.is_empty()).then(|| tenant.to_owned());
    record.subject = (!subject.is_empty()).then(|| subject.to_owned());
    record.server = (!server.is_empty()).then(|| server.to_owned());
    record.event = Some(event.to_owned());
    record.reason = reason.map(str::to_owned);
    Some(record)
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

fn serialise(record: &Record) -> Vec<u8> {
    let mut line = serde_json::to_vec(record).expect("a record always serialises");
    line.push(b'\n');
    line
}

/// Sends [`Message::Reopen`] on each SIGHUP until `stop`.
async fn reopen_on_hangup(queue: mpsc::WeakSender<Message>, stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => hangup,
        Err(error) => {
            tracing::warn!(%error, "no SIGHUP handler: the audit file is reopened only when moved");
            return;
        }
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            received = hangup.recv() => {
                if received.is_none() {
                    return;
                }
                let Some(queue) = queue.upgrade() else { return };
                let _ = queue.try_send(Message::Reopen);
            }
        }
    }
}

/// The open sink.
struct Sink {
    destination: AuditDestination,
    file: Option<OpenFile>,
    /// A write failed part-way: the file may end in a partial line.
    torn: bool,
}

struct OpenFile {
    file: std::fs::File,
    dev: u64,
    ino: u64,
}

impl Sink {
    fn new(destination: AuditDestination) -> Self {
        Self {
            destination,
            file: None,
            torn: false,
        }
    }

    fn describe(&self) -> String {
        match &self.destination {
            AuditDestination::Stdout => "stdout".to_owned(),
            AuditDestination::File(path) => path.display().to_string(),
        }
    }

    fn path(&self) -> Option<&PathBuf> {
        match &self.destination {
            AuditDestination::Stdout => None,
            AuditDestination::File(path) => Some(path),
        }
    }

    /// Opens the file when it is not open, or when the path no longer
    /// names the open file (moved away, replaced).
    fn ensure_open(&mut self) -> std::io::Result<()> {
        let Some(path) = self.path().cloned() else {
            return Ok(());
        };
        if let Some(open) = &self.file {
            match std::fs::metadata(&path) {
                Ok(now) if now.dev() == open.dev && now.ino() == open.ino => return Ok(()),
                _ => {
                    tracing::info!(path = %path.display(), "audit file moved or replaced: opening the path anew");
                    self.file = None;
                }
            }
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(FILE_MODE)
            .open(&path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        self.file = Some(OpenFile {
            dev: meta.dev(),
            ino: meta.ino(),
            file,
        });
        Ok(())
    }

    /// Writes `bytes` in one call (one `write(2)` unless the kernel writes
    /// short).
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match &self.destination {
            AuditDestination::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes)?;
                out.flush()
            }
            AuditDestination::File(_) => {
                let open = self
                    .file
                    .as_mut()
                    .ok_or_else(|| std::io::Error::other("not open"))?;
                if self.torn {
                    // The last failed write may have left half a line.
                    if !ends_with_newline(&open.file)? {
                        open.file.write_all(b"\n")?;
                    }
                    self.torn = false;
                }
                let result = open.file.write_all(bytes);
                if result.is_err() {
                    self.torn = true;
                    self.file = None;
                }
                result
            }
        }
    }
}

fn ends_with_newline(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt as _;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    let mut last = [0u8; 1];
    file.read_at(&mut last, len - 1)?;
    Ok(last[0] == b'\n')
}

/// The writer thread's state.
struct Writer {
    sink: Sink,
    receiver: mpsc::Receiver<Message>,
    healthy: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// Writes batches until every handle is dropped.
    fn run(mut self) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut buffer = Vec::with_capacity(64 << 10);
        while let Some(first) = self.receiver.blocking_recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match self.receiver.try_recv() {
                    Ok(message) => batch.push(message),
                    Err(_) => break,
                }
            }
            self.write_batch(&mut batch, &mut buffer);
        }
    }

    fn write_batch(&mut self, batch: &mut Vec<Message>, buffer: &mut Vec<u8>) {
        buffer.clear();
        let mut acks = Vec::with_capacity(batch.len());
        let mut lines = 0u64;
        for message in batch.drain(..) {
            match message {
                Message::Line(line, ack) => {
                    buffer.extend_from_slice(&line);
                    lines += 1;
                    acks.extend(ack);
                }
                Message::Flush(ack) => acks.push(ack),
                Message::Reopen => self.sink.file = None,
            }
        }
        let started = Instant::now();
        let result = self.sink.ensure_open().and_then(|()| {
            if buffer.is_empty() {
                Ok(())
            } else {
                self.sink.write(buffer)
            }
        });
        let ok = result.is_ok();
        let was_healthy = self.healthy.swap(ok, Ordering::Relaxed);
        match result {
            Ok(()) => {
                if !was_healthy {
                    tracing::info!(sink = %self.sink.describe(), "audit sink writable again");
                }
                let slow = started.elapsed();
                if slow > Duration::from_secs(1) {
                    tracing::warn!(sink = %self.sink.describe(), elapsed_ms = slow.as_millis() as u64, lines, "slow audit write");
                }
            }
            Err(error) => {
                for _ in 0..lines {
                    self.metrics.audit_failure(AuditFailure::Write.label());
                }
                if was_healthy {
                    tracing::error!(sink = %self.sink.describe(), %error, lines, "audit records not written");
                } else {
                    tracing::debug!(sink = %self.sink.describe(), %error, lines, "audit records not written");
                }
            }
        }
        for ack in acks {
            let _ = ack.send(ok);
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
        let peer = request
            .extensions()
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|info| info.remote_addr());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: PathBuf, required: bool) -> AuditConfig {
        AuditConfig {
            destination: AuditDestination::File(path),
            arguments: AuditArguments::Digest,
            required,
        }
    }

    fn lines(path: &std::path::Path) -> Vec<Record> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a record per line"))
            .collect()
    }

    fn call(tool: &str) -> Record {
        let mut record = Record::new(RecordKind::Call, Outcome::Ok);
        record.tool = Some(tool.to_owned());
        record
    }

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        let time = now();
        assert_eq!(time.len(), "2025-06-01T12:00:00.123Z".len(), "{time}");
        assert!(time.ends_with('Z') && time.as_bytes()[19] == b'.', "{time}");
    }

    #[test]
    fn digests_are_of_the_text_as_received() {
        let record =
            ArgumentsRecord::of(AuditArguments::Digest, "{\"a\": 1}", &Redactor::default())
                .unwrap();
        let expected: String = Sha256::digest(b"{\"a\": 1}")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(record.sha256, expected);
        assert_eq!(record.bytes, 8);
        assert!(record.value.is_none());
        assert!(ArgumentsRecord::of(AuditArguments::None, "{}", &Redactor::default()).is_none());
        let redactor = Redactor::new(["very-secret-value"]);
        let full = ArgumentsRecord::of(
            AuditArguments::Full,
            "{\"q\": \"x very-secret-value\"}",
            &redactor,
        )
        .unwrap();
        assert_eq!(full.value, Some(serde_json::json!({"q": "x [redacted]"})));
        let text = ArgumentsRecord::of(
            AuditArguments::Full,
            "not json very-secret-value",
            &redactor,
        )
        .unwrap();
        assert_eq!(text.value, Some(serde_json::json!("not json [redacted]")));
    }

    #[test]
    fn absent_fields_are_left_out_and_read_back() {
        let mut record = call("t__echo");
        record.caller = Some(CallerRecord::Token { token_index: 2 });
        let text = String::from_utf8(serialise(&record)).unwrap();
        assert!(text.ends_with('\n') && !text.trim_end().contains('\n'));
        assert!(!text.contains("null"), "{text}");
        assert!(
            text.contains(r#""caller":{"kind":"token","token_index":2}"#),
            "{text}"
        );
        let back: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn callers_are_named_never_their_credential() {
        let jwt = crate::callers::CallerIdentity::Jwt {
            issuer: "https://issuer.example".to_owned(),
            subject: "system:serviceaccount:acme:worker".to_owned(),
        };
        let mut record = call("t__echo");
        record.caller = Some(CallerRecord::from(&jwt));
        let text = String::from_utf8(serialise(&record)).unwrap();
        assert!(
            text.contains(
                r#""caller":{"kind":"jwt","issuer":"https://issuer.example","subject":"system:serviceaccount:acme:worker"}"#
            ),
            "{text}"
        );
    }

    #[test]
    fn authorization_events_that_are_not_decisions_are_not_recorded() {
        assert!(authorization_record("t", "u", "s", "token_refreshed", None).is_none());
        let record = authorization_record("t", "", "s", "consent_completed", None).unwrap();
        assert_eq!(record.outcome, Outcome::Ok);
        assert_eq!(record.subject, None);
    }

    #[test]
    fn replica_is_the_pod_name_then_the_host_name() {
        let env = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            replica(&env(&[("POD_NAME", "gw-1"), ("HOSTNAME", "h")])),
            Some("gw-1".to_owned())
        );
        assert_eq!(replica(&env(&[("HOSTNAME", "h")])), Some("h".to_owned()));
        assert_eq!(replica(&env(&[])), None);
    }

    #[tokio::test]
    async fn records_are_written_before_the_ack_and_follow_a_moved_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::start(
            &config(path.clone(), false),
            Some("r1".to_owned()),
            Arc::new(Metrics::new()),
        );
        audit.write(call("a")).await.unwrap();
        let written = lines(&path);
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].replica.as_deref(), Some("r1"));
        let moved = dir.path().join("audit.jsonl.1");
        std::fs::rename(&path, &moved).unwrap();
        audit.write(call("b")).await.unwrap();
        assert_eq!(lines(&moved).len(), 1, "nothing more in the moved file");
        let fresh = lines(&path);
        assert_eq!(fresh.len(), 1);
        assert_eq!(fresh[0].tool.as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn concurrent_records_each_get_one_whole_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::start(&config(path.clone(), false), None, Arc::new(Metrics::new()));
        let mut tasks = Vec::new();
        for i in 0..200 {
            let audit = audit.clone();
            tasks.push(tokio::spawn(async move {
                audit.write(call(&format!("tool-{i}"))).await
            }));
        }
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let mut tools: Vec<String> = lines(&path).into_iter().filter_map(|r| r.tool).collect();
        tools.sort();
        tools.dedup();
        assert_eq!(tools.len(), 200);
    }

    #[tokio::test]
    async fn an_unwritable_path_is_broken_until_it_can_be_opened() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: it cannot be opened.
        let path = dir.path().join("audit.jsonl");
        std::fs::create_dir(&path).unwrap();
        let metrics = Arc::new(Metrics::new());
        let audit = Audit::start(&config(path.clone(), true), None, metrics);
        assert!(!audit.is_healthy());
        assert!(!audit.admits_calls());
        assert_eq!(audit.write(call("a")).await, Err(AuditFailure::Write));
        std::fs::remove_dir(&path).unwrap();
        audit.write(call("b")).await.unwrap();
        assert!(audit.admits_calls());
        assert_eq!(lines(&path).len(), 1);
    }

    #[tokio::test]
    async fn a_disabled_trail_does_nothing() {
        let audit = Audit::disabled();
        assert!(audit.admits_calls());
        assert!(audit.arguments("{}", || unreachable!()).is_none());
        audit.write(call("a")).await.unwrap();
        assert!(audit.flush().await);
    }
}
