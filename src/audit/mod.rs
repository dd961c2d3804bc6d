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
//! known to be broken (its last write or open failed), or when no place in
//! the writer's queue can be reserved for its record within
//! [`ACK_TIMEOUT`]; the record of a call that was sent (its outcome, or
//! that its caller went away) goes through that reserved place, so it
//! cannot be dropped for want of room. A call whose outcome record cannot
//! be written is not answered with its result. When
//! not required, a record that cannot be written is counted
//! (`toolgate_audit_failures_total`) and logged, and the call goes on.
//!
//! Here: the handle ([`Audit`]). The record and its parts are in `record`,
//! the writer thread (group commit, reopening) in `writer`, the layer that
//! records refusals before the service in `refusals`.

mod chain;
mod digest;
mod record;
mod refusals;
pub mod verify;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use chain::{ChainMark, ChainReason};
pub use digest::DigestKey;
pub use record::{
    ArgumentsRecord, CallerRecord, GuardRecord, InputItem, Outcome, Record, RecordKind,
    SCHEMA_VERSION, code_name, error_outcome, millis, now,
};
pub use refusals::{
    MAX_REFUSAL_PEERS, REFUSAL_INTERVAL, REFUSALS_SUMMARIZED, Reached, Refusal, RefusalLayer,
    Refusals,
};

use crate::config::{AuditArguments, AuditConfig, AuditDestination};
use crate::credentials::Redactor;
use crate::telemetry::Metrics;
use record::{authorization_record, serialise};
use writer::{Message, Sink, Writer, reopen_on_hangup};

/// How long a call waits for its record to be written, or for a place in
/// the writer's queue. Past it, the record
/// counts as failed (reason `timeout`; it may still be written later): a
/// disk that hangs delays calls by this much, never forever.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Why a record was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuditFailure {
    /// The sink could not be opened or written (or the writer is gone).
    #[error("the audit sink cannot be written")]
    Write,
    /// The writer did not acknowledge within [`ACK_TIMEOUT`].
    #[error("the audit sink did not answer within {ACK_TIMEOUT:?}")]
    Timeout,
    /// The writer's queue was full (records that are not waited for, and
    /// places reserved for a record).
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

/// The audit trail's handle: cheap to clone; a disabled one (no `audit:`
/// configured) does nothing.
#[derive(Clone, Default)]
pub struct Audit(Option<Arc<Inner>>);

struct Inner {
    queue: mpsc::Sender<Message>,
    /// False while the last open or write failed.
    healthy: Arc<AtomicBool>,
    arguments: AuditArguments,
    /// The key of the arguments' digest.
    digest_key: DigestKey,
    required: bool,
    replica: Option<String>,
    metrics: Arc<Metrics>,
    /// The refusals of the current interval, summed up per peer.
    refusals: refusals::RefusalWindow,
    /// Stops the SIGHUP listener and the refusals' summaries when the last
    /// handle is dropped.
    _stop: DropGuard,
}

impl Drop for Inner {
    /// Queues the summaries of the refusals counted since the last
    /// interval ended, so that none is lost when the trail closes.
    fn drop(&mut self) {
        for record in self.refusals.take() {
            let kind = record.kind;
            if self
                .queue
                .try_send(Message::Line(self.line(record), None))
                .is_err()
            {
                self.metrics.audit_failure(AuditFailure::Overflow.label());
                tracing::warn!(?kind, "audit queue full: record dropped");
            }
        }
    }
}

/// A place reserved in the writer's queue for one record
/// ([`Audit::reserve`]); released unused when dropped.
pub struct AuditSlot(mpsc::OwnedPermit<Message>);

impl std::fmt::Debug for AuditSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditSlot")
    }
}

impl Inner {
    /// `record` with this replica's name, as one line.
    fn line(&self, mut record: Record) -> Vec<u8> {
        record.replica.clone_from(&self.replica);
        serialise(&record)
    }

    /// Counts and logs a record of `kind` not written (write failures are
    /// counted by the writer, once per record); `outcome` as it was.
    fn failed(
        &self,
        kind: RecordKind,
        outcome: Result<(), AuditFailure>,
    ) -> Result<(), AuditFailure> {
        if let Err(failure) = outcome
            && failure != AuditFailure::Write
        {
            self.metrics.audit_failure(failure.label());
            tracing::warn!(?kind, %failure, "audit record not written");
        }
        outcome
    }
}

/// Whether the writer wrote the line whose acknowledgement is `written`.
async fn acknowledged(written: oneshot::Receiver<bool>) -> Result<(), AuditFailure> {
    match written.await {
        Ok(true) => Ok(()),
        _ => Err(AuditFailure::Write),
    }
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Audit(disabled)"),
            Some(inner) => f
                .debug_struct("Audit")
                .field("arguments", &inner.arguments)
                .field("digest_key", &inner.digest_key)
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
        let digest_key = DigestKey::new(config.digest_key.as_ref());
        if !digest_key.is_configured() && config.arguments == AuditArguments::Digest {
            tracing::warn!(
                key_id = digest_key.id(),
                "audit.digest_key is not set: the arguments' digests are keyed with a random \
                 key of this process, so they cannot be compared across restarts or replicas \
                 (set audit.digest_key from a secret source)"
            );
        }
        let mut sink = Sink::new(config.destination.clone());
        let healthy = Arc::new(AtomicBool::new(false));
        match sink.ensure_open() {
            Ok(()) => {
                healthy.store(true, Ordering::Relaxed);
                tracing::info!(sink = %sink.describe(), arguments = ?config.arguments, digest_key_id = digest_key.id(), required = config.required, "audit trail open");
            }
            Err(error) => {
                tracing::error!(sink = %sink.describe(), %error, required = config.required, "audit sink cannot be opened; retrying with each record");
            }
        }
        let queue = Writer::spawn(sink, config.queue, healthy.clone(), metrics.clone());
        let stop = CancellationToken::new();
        if matches!(config.destination, AuditDestination::File(_)) {
            tokio::spawn(reopen_on_hangup(queue.downgrade(), stop.clone()));
        }
        let inner = Arc::new(Inner {
            queue,
            healthy,
            arguments: config.arguments,
            digest_key,
            required: config.required,
            replica,
            metrics,
            refusals: refusals::RefusalWindow::default(),
            _stop: stop.clone().drop_guard(),
        });
        tokio::spawn(refusals::summarize_refusals(Arc::downgrade(&inner), stop));
        Self(Some(inner))
    }

    /// Closes the trail for shutdown: writes the summaries of the refusals
    /// counted in the current interval, and waits until everything queued
    /// is written (at most [`ACK_TIMEOUT`] each); false when something
    /// failed.
    pub async fn close(&self) -> bool {
        self.write_refusal_summaries().await;
        self.flush().await
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
        let key = &inner.digest_key;
        match inner.arguments {
            AuditArguments::Full => {
                ArgumentsRecord::of(AuditArguments::Full, text, key, &redactor())
            }
            mode => ArgumentsRecord::of(mode, text, key, &Redactor::default()),
        }
    }

    /// Writes `record` (with this replica's name) and waits until it is
    /// written: at most [`ACK_TIMEOUT`]. A failure is counted and logged
    /// here; the caller decides what it means for the call.
    ///
    /// # Errors
    /// The record was not written (or not within [`ACK_TIMEOUT`]).
    pub async fn write(&self, record: Record) -> Result<(), AuditFailure> {
        let Some(inner) = &self.0 else {
            return Ok(());
        };
        let kind = record.kind;
        let line = inner.line(record);
        let outcome = tokio::time::timeout(ACK_TIMEOUT, async {
            let (ack, written) = oneshot::channel();
            inner
                .queue
                .send(Message::Line(line, Some(ack)))
                .await
                .map_err(|_| AuditFailure::Write)?;
            acknowledged(written).await
        })
        .await
        .unwrap_or(Err(AuditFailure::Timeout));
        inner.failed(kind, outcome)
    }

    /// Reserves a place in the writer's queue for one record, waiting at
    /// most [`ACK_TIMEOUT`] for one; `None` when the trail is disabled. A
    /// record sent through it ([`Audit::write_reserved`],
    /// [`Audit::enqueue_reserved`]) never finds the queue full.
    ///
    /// # Errors
    /// No place within [`ACK_TIMEOUT`] (`Overflow`), or the writer is gone
    /// (`Write`).
    pub async fn reserve(&self) -> Result<Option<AuditSlot>, AuditFailure> {
        let Some(inner) = &self.0 else {
            return Ok(None);
        };
        match tokio::time::timeout(ACK_TIMEOUT, inner.queue.clone().reserve_owned()).await {
            Ok(Ok(permit)) => Ok(Some(AuditSlot(permit))),
            Ok(Err(_)) => Err(AuditFailure::Write),
            Err(_) => {
                tracing::warn!(
                    waited_ms = ACK_TIMEOUT.as_millis() as u64,
                    "the audit queue has no room for a call's record"
                );
                Err(AuditFailure::Overflow)
            }
        }
    }

    /// [`Audit::write`] through a place reserved by [`Audit::reserve`]:
    /// waits only for the writer, at most [`ACK_TIMEOUT`].
    ///
    /// # Errors
    /// The record was not written (or not within [`ACK_TIMEOUT`]).
    pub async fn write_reserved(
        &self,
        slot: AuditSlot,
        record: Record,
    ) -> Result<(), AuditFailure> {
        let Some(inner) = &self.0 else {
            return Ok(());
        };
        let kind = record.kind;
        let (ack, written) = oneshot::channel();
        slot.0.send(Message::Line(inner.line(record), Some(ack)));
        let outcome = tokio::time::timeout(ACK_TIMEOUT, acknowledged(written))
            .await
            .unwrap_or(Err(AuditFailure::Timeout));
        inner.failed(kind, outcome)
    }

    /// Queues `record` through a place reserved by [`Audit::reserve`],
    /// without waiting: it cannot be dropped for want of room (for a call
    /// whose caller went away).
    pub fn enqueue_reserved(&self, slot: AuditSlot, record: Record) {
        if let Some(inner) = &self.0 {
            slot.0.send(Message::Line(inner.line(record), None));
        }
    }

    /// Queues `record` without waiting (for events that have no response
    /// to hold back, and for calls whose caller went away). A full queue
    /// drops the record and counts it (`overflow`).
    pub fn enqueue(&self, record: Record) {
        let Some(inner) = &self.0 else {
            return;
        };
        let kind = record.kind;
        if inner
            .queue
            .try_send(Message::Line(inner.line(record), None))
            .is_err()
        {
            inner.metrics.audit_failure(AuditFailure::Overflow.label());
            tracing::warn!(?kind, "audit queue full: record dropped");
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
        self.authorization_from(tenant, subject, server, event, reason, None);
    }

    /// Records an event of a call approval without waiting: `event` (one
    /// of [`RecordKind::CallApproval`]'s), the approval, the call it
    /// holds, who acted (an approver for a decision, the call's caller
    /// otherwise) and, for a decision or a refusal, why.
    pub fn call_approval(&self, event: &CallApprovalEvent<'_>) {
        if self.0.is_none() {
            return;
        }
        let outcome = match event.event {
            "call_approval_refused" | "call_approval_denied" => record::Outcome::Refused,
            "call_approval_expired" => record::Outcome::Failed,
            _ => record::Outcome::Ok,
        };
        let mut record = Record::new(RecordKind::CallApproval, outcome);
        record.tenant = Some(event.tenant.to_owned());
        record.subject = (!event.subject.is_empty()).then(|| event.subject.to_owned());
        record.caller = event.caller.map(CallerRecord::from);
        record.server = Some(event.server.to_owned());
        record.tool = Some(event.tool.to_owned());
        record.definition_hash = Some(event.definition_hash.to_owned());
        record.event = Some(event.event.to_owned());
        record.call_approval = Some(event.approval_id.to_owned());
        record.rule = Some(event.rule.to_owned());
        record.note = event.note.map(str::to_owned);
        record.reason = event.reason.map(str::to_owned);
        record.trace_id = event.trace_id.map(str::to_owned);
        self.enqueue(record);
    }

    /// Records an event of a task (`task_created`, `task_updated`,
    /// `task_completed`, `task_failed`, `task_cancelled`) of (`tenant`,
    /// `subject`, `server`, `tool`) without waiting. `task` is the hash
    /// prefix of the task id, never the id; `subject` is empty for the
    /// tenant itself.
    pub fn task(
        &self,
        tenant: &str,
        subject: &str,
        server: &str,
        tool: &str,
        event: &str,
        task: &str,
    ) {
        if self.0.is_none() {
            return;
        }
        let outcome = match event {
            "task_failed" => record::Outcome::Failed,
            "task_cancelled" => record::Outcome::Cancelled,
            _ => record::Outcome::Ok,
        };
        let mut record = Record::new(record::RecordKind::Task, outcome);
        record.tenant = Some(tenant.to_owned());
        record.subject = (!subject.is_empty()).then(|| subject.to_owned());
        record.server = Some(server.to_owned());
        record.tool = Some(tool.to_owned());
        record.event = Some(event.to_owned());
        record.task = Some(task.to_owned());
        self.enqueue(record);
    }

    /// Records a change made through the admin API: the RPC, who made it,
    /// the tenant (and secret), the tenant's versions before and after.
    /// Never a spec or a secret's value. Through `slot` (taken with
    /// [`Audit::reserve`] before the change, when the trail is required)
    /// it is written and waited for; without one, queued.
    ///
    /// # Errors
    /// The record was written through `slot` and failed (or took longer
    /// than [`ACK_TIMEOUT`]).
    pub async fn admin(
        &self,
        slot: Option<AuditSlot>,
        change: AdminChange<'_>,
    ) -> Result<(), AuditFailure> {
        if self.0.is_none() {
            return Ok(());
        }
        let record = admin_record(change, record::Outcome::Ok, "OK");
        match slot {
            Some(slot) => self.write_reserved(slot, record).await,
            None => {
                self.enqueue(record);
                Ok(())
            }
        }
    }

    /// Records, without waiting, an admin change that was not made:
    /// refused before it was tried (`outcome` refused: the trail could not
    /// take its record), or failed after [`Audit::admin`] wrote its record
    /// (the state store did not commit it); `code` and `reason` as
    /// answered.
    pub fn admin_not_made(
        &self,
        change: AdminChange<'_>,
        outcome: Outcome,
        code: &str,
        reason: &str,
    ) {
        if self.0.is_some() {
            let mut record = admin_record(change, outcome, code);
            record.reason = Some(reason.to_owned());
            self.enqueue(record);
        }
    }

    /// [`Audit::authorization`] with the address of the peer that caused
    /// the event (the consent listener's callbacks).
    pub fn authorization_from(
        &self,
        tenant: &str,
        subject: &str,
        server: &str,
        event: &str,
        reason: Option<&str>,
        peer: Option<std::net::SocketAddr>,
    ) {
        if self.0.is_none() {
            return;
        }
        if let Some(mut record) = authorization_record(tenant, subject, server, event, reason) {
            record.peer = peer.map(|p| p.to_string());
            self.enqueue(record);
        }
    }
}

/// The record of an admin change that ended with `outcome` and `code`.
fn admin_record(change: AdminChange<'_>, outcome: record::Outcome, code: &str) -> Record {
    let mut record = Record::new(record::RecordKind::Admin, outcome);
    record.rpc = Some(change.rpc.to_owned());
    record.caller = Some(change.caller);
    record.peer = change.peer;
    record.tenant = Some(change.tenant.to_owned());
    record.secret = change.secret.map(str::to_owned);
    record.old_version = change.old_version;
    record.new_version = change.new_version;
    record.code = Some(code.to_owned());
    record
}

/// A change made through the admin API, for [`Audit::admin`].
#[derive(Debug, Clone)]
pub struct AdminChange<'a> {
    /// The RPC (`PutTenant`, `DeleteTenant`, `PutSecret`, `DeleteSecret`).
    pub rpc: &'a str,
    /// Who made it.
    pub caller: CallerRecord,
    /// The caller's address (`ip:port`).
    pub peer: Option<String>,
    /// The tenant.
    pub tenant: &'a str,
    /// The secret's name (secret RPCs).
    pub secret: Option<&'a str>,
    /// The tenant's version before.
    pub old_version: Option<i64>,
    /// The tenant's version after.
    pub new_version: Option<i64>,
}

/// One event of a call approval ([`Audit::call_approval`]).
#[derive(Debug)]
pub struct CallApprovalEvent<'a> {
    /// `call_approval_requested`, `_approved`, `_denied`, `_expired`,
    /// `_spent`, `_returned` or `_refused`.
    pub event: &'a str,
    /// The tenant.
    pub tenant: &'a str,
    /// The subject key of the call it holds (empty: the tenant itself).
    pub subject: &'a str,
    /// Who acted: the approver of a decision, the caller of a call (`None`:
    /// toolgate itself, e.g. an expiry).
    pub caller: Option<&'a crate::callers::CallerIdentity>,
    /// The approval's id.
    pub approval_id: &'a str,
    /// The tool's exposed name.
    pub tool: &'a str,
    /// Its server.
    pub server: &'a str,
    /// The tool's definition hash the approval binds.
    pub definition_hash: &'a str,
    /// The rule that asked.
    pub rule: &'a str,
    /// A decision's reason, as the approver gave it (redacted).
    pub note: Option<&'a str>,
    /// A refusal's stable reason (`APPROVAL_MISMATCH`, ...).
    pub reason: Option<&'a str>,
    /// The trace id of the call (spent, returned, refused).
    pub trace_id: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

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
    async fn a_disabled_trail_does_nothing() {
        let audit = Audit::disabled();
        assert!(audit.admits_calls());
        assert!(audit.arguments("{}", || unreachable!()).is_none());
        audit
            .write(Record::new(RecordKind::Call, Outcome::Ok))
            .await
            .unwrap();
        assert!(audit.flush().await);
    }
}
