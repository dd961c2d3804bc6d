//! The writer thread: takes every line queued meanwhile and writes them
//! with one `write(2)` (group commit), acknowledges each, and reopens the
//! file when it was moved or replaced, or on SIGHUP.

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::AuditFailure;
use super::chain::{Chain, ChainReason, Chained, landed};
use crate::config::AuditDestination;
use crate::telemetry::Metrics;

/// Records written with one `write(2)` at most.
const MAX_BATCH: usize = 512;

/// The mode of a newly created audit file (owner read-write, group read).
const FILE_MODE: u32 = 0o640;

/// What the writer is asked to do.
pub(super) enum Message {
    /// Write a line; say whether it was written.
    Line(Vec<u8>, Option<oneshot::Sender<bool>>),
    /// Answer once everything queued before is written (or failed).
    Flush(oneshot::Sender<bool>),
    /// Open the path anew (SIGHUP).
    Reopen,
}

/// Sends [`Message::Reopen`] on each SIGHUP until `stop`.
pub(super) async fn reopen_on_hangup(queue: mpsc::WeakSender<Message>, stop: CancellationToken) {
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
pub(super) struct Sink {
    destination: AuditDestination,
    file: Option<OpenFile>,
    /// Standard output: whether the next record continues what was
    /// written (false at first, and after a failed write).
    stdout_open: bool,
    /// Why the destination is opened next time it is.
    reason: ChainReason,
    /// Whether a destination was ever opened (until then every open is
    /// the start).
    anchored: bool,
    /// A destination opened since the writer last looked.
    fresh: Option<Fresh>,
    /// A write failed part-way, or a file was just opened: the file may end
    /// in a partial line.
    torn: bool,
}

/// A destination the sink opened anew: why, and the last record line of
/// the file it appends to when the chain continues from it.
pub(super) struct Fresh {
    pub(super) reason: ChainReason,
    pub(super) last_line: Option<Vec<u8>>,
}

struct OpenFile {
    file: std::fs::File,
    dev: u64,
    ino: u64,
}

impl Sink {
    pub(super) fn new(destination: AuditDestination) -> Self {
        Self {
            destination,
            file: None,
            stdout_open: false,
            reason: ChainReason::Start,
            anchored: false,
            fresh: None,
            torn: false,
        }
    }

    pub(super) fn describe(&self) -> String {
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

    /// Closes the destination: it is opened anew (for `reason`) with the
    /// next batch.
    fn reopen(&mut self, reason: ChainReason) {
        self.file = None;
        self.stdout_open = false;
        if self.anchored {
            self.reason = reason;
        }
    }

    /// The destination opened since the last call, if one was.
    fn take_fresh(&mut self) -> Option<Fresh> {
        self.fresh.take()
    }

    /// Opens the file when it is not open, or when the path no longer
    /// names the open file (moved away, replaced).
    pub(super) fn ensure_open(&mut self) -> std::io::Result<()> {
        let Some(path) = self.path().cloned() else {
            if !self.stdout_open {
                self.stdout_open = true;
                self.anchored = true;
                self.fresh = Some(Fresh {
                    reason: self.reason,
                    last_line: None,
                });
            }
            return Ok(());
        };
        if let Some(open) = &self.file {
            match std::fs::metadata(&path) {
                Ok(now) if now.dev() == open.dev && now.ino() == open.ino => return Ok(()),
                _ => {
                    tracing::info!(path = %path.display(), "audit file moved or replaced: opening the path anew");
                    self.reopen(ChainReason::Moved);
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
        let mut fresh = Fresh {
            reason: self.reason,
            last_line: None,
        };
        if self.reason == ChainReason::Start && meta.len() > 0 {
            // The process starts on a file with records: continue its chain.
            fresh.last_line = last_record_line(&file, meta.len())?;
            if fresh.last_line.is_some() {
                fresh.reason = ChainReason::Resume;
            } else {
                tracing::warn!(path = %path.display(), "no record found at the end of the audit file: its chain restarts unlinked");
            }
        }
        self.fresh = Some(fresh);
        // Unless said otherwise, the next open is for a move.
        self.reason = ChainReason::Moved;
        self.anchored = true;
        self.torn = true;
        self.file = Some(OpenFile {
            dev: meta.dev(),
            ino: meta.ino(),
            file,
        });
        Ok(())
    }

    /// Writes `bytes` in one call (one `write(2)` unless the kernel writes
    /// short). On failure, says how many bytes were written before it.
    fn write(&mut self, bytes: &[u8]) -> Result<(), (std::io::Error, usize)> {
        let result = match &self.destination {
            AuditDestination::Stdout => {
                let mut out = std::io::stdout().lock();
                write_counting(&mut out, bytes)
                    .and_then(|()| out.flush().map_err(|error| (error, bytes.len())))
            }
            AuditDestination::File(_) => match self.file.as_mut() {
                None => Err((std::io::Error::other("not open"), 0)),
                Some(open) => {
                    // The last failed write may have left half a line.
                    let repaired = if self.torn {
                        end_line(&mut open.file).map_err(|error| (error, 0))
                    } else {
                        Ok(())
                    };
                    repaired.and_then(|()| {
                        self.torn = false;
                        write_counting(&mut open.file, bytes)
                    })
                }
            },
        };
        if result.is_err() {
            self.torn = true;
            self.reopen(ChainReason::Recovered);
        }
        result
    }
}

/// `write_all`, saying on failure how many bytes were written.
fn write_counting(
    out: &mut impl std::io::Write,
    bytes: &[u8],
) -> Result<(), (std::io::Error, usize)> {
    let mut written = 0;
    while written < bytes.len() {
        match out.write(&bytes[written..]) {
            Ok(0) => {
                return Err((std::io::Error::from(std::io::ErrorKind::WriteZero), written));
            }
            Ok(n) => written += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err((error, written)),
        }
    }
    Ok(())
}

/// How far back from its end a file is read for its last record.
const MAX_TAIL: u64 = 16 << 20;

/// The last whole line of `file` (`len` bytes) that is a JSON object,
/// without its newline: the record a resumed chain links to. `None` when
/// none is within the last [`MAX_TAIL`] bytes.
fn last_record_line(file: &std::fs::File, len: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt as _;
    let mut window: u64 = 64 << 10;
    loop {
        let start = len.saturating_sub(window);
        let mut tail = vec![0u8; (len - start) as usize];
        file.read_exact_at(&mut tail, start)?;
        // Only lines that end in a newline are whole; the first one is cut
        // unless the window reaches the start of the file.
        let mut whole: Vec<&[u8]> = tail.split_inclusive(|&byte| byte == b'\n').collect();
        if start > 0 && !whole.is_empty() {
            whole.remove(0);
        }
        let found = whole
            .iter()
            .rev()
            .filter_map(|line| line.strip_suffix(b"\n"))
            .find(|line| {
                serde_json::from_slice::<serde_json::Value>(line).is_ok_and(|v| v.is_object())
            });
        if let Some(line) = found {
            return Ok(Some(line.to_vec()));
        }
        if start == 0 || window >= MAX_TAIL {
            return Ok(None);
        }
        window = (window * 4).min(MAX_TAIL);
    }
}

/// Ends the file's last line with a newline unless it has one (or the
/// file is empty).
fn end_line(file: &mut std::fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.read_at(&mut last, len - 1)?;
    if last[0] != b'\n' {
        file.write_all(b"\n")?;
    }
    Ok(())
}

/// The writer thread's state.
pub(super) struct Writer {
    sink: Sink,
    chain: Chain,
    receiver: mpsc::Receiver<Message>,
    healthy: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// Starts the writer thread over `sink`; the queue it reads (of
    /// `capacity` messages).
    pub(super) fn spawn(
        sink: Sink,
        capacity: usize,
        healthy: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
    ) -> mpsc::Sender<Message> {
        let (queue, receiver) = mpsc::channel(capacity);
        let writer = Writer {
            sink,
            chain: Chain::new(),
            receiver,
            healthy,
            metrics,
        };
        std::thread::Builder::new()
            .name("toolgate-audit".to_owned())
            .spawn(move || writer.run())
            .expect("spawn the audit writer thread");
        queue
    }

    /// Writes batches until every handle is dropped.
    fn run(mut self) {
        self.take_fresh();
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

    /// Marks the next record when the sink opened a destination anew, and
    /// logs where the chain stands (an anchor outside the file).
    fn take_fresh(&mut self) {
        let Some(fresh) = self.sink.take_fresh() else {
            return;
        };
        if let Some(line) = &fresh.last_line {
            self.chain.resume_after(line);
        }
        self.chain.mark(fresh.reason);
        let head = self.chain.head();
        tracing::info!(
            sink = %self.sink.describe(),
            reason = fresh.reason.as_str(),
            next_seq = head.next_seq,
            prev = head.last.as_ref().map(hex::encode).unwrap_or_default(),
            "audit chain: destination opened"
        );
    }

    fn write_batch(&mut self, batch: &mut Vec<Message>, buffer: &mut Vec<u8>) {
        buffer.clear();
        let mut acks = Vec::with_capacity(batch.len());
        let mut lines = Vec::with_capacity(batch.len());
        for message in batch.drain(..) {
            match message {
                Message::Line(line, ack) => {
                    lines.push(line);
                    acks.extend(ack);
                }
                Message::Flush(ack) => acks.push(ack),
                Message::Reopen => self.sink.reopen(ChainReason::Hangup),
            }
        }
        let count = lines.len() as u64;
        let started = Instant::now();
        let before = self.chain.head();
        let result = self.sink.ensure_open().and_then(|()| {
            self.take_fresh();
            if lines.is_empty() {
                return Ok(());
            }
            let chained: Vec<Chained> = lines
                .iter()
                .map(|line| self.chain.append(line, buffer))
                .collect();
            self.sink.write(buffer).map_err(|(error, written)| {
                // The chain goes on from the last line written whole (but
                // for its newline, which the repair adds).
                self.chain.set_head(landed(&chained, written, before));
                error
            })
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
                    tracing::warn!(sink = %self.sink.describe(), elapsed_ms = slow.as_millis() as u64, lines = count, "slow audit write");
                }
            }
            Err(error) => {
                for _ in 0..count {
                    self.metrics.audit_failure(AuditFailure::Write.label());
                }
                if was_healthy {
                    tracing::error!(sink = %self.sink.describe(), %error, lines = count, "audit records not written");
                } else {
                    tracing::debug!(sink = %self.sink.describe(), %error, lines = count, "audit records not written");
                }
            }
        }
        for ack in acks {
            let _ = ack.send(ok);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use crate::audit::{Audit, AuditFailure, Outcome, Record, RecordKind};
    use crate::config::{AuditArguments, AuditConfig, AuditDestination};
    use crate::telemetry::Metrics;

    fn config(path: PathBuf, required: bool) -> AuditConfig {
        AuditConfig {
            destination: AuditDestination::File(path),
            arguments: AuditArguments::Digest,
            required,
            digest_key: None,
            queue: crate::config::DEFAULT_AUDIT_QUEUE,
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
    async fn one_chain_runs_across_moved_files_and_restarts() {
        use crate::audit::ChainReason;
        use crate::audit::verify::verify_files;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let metrics = Arc::new(Metrics::new());
        let audit = Audit::start(&config(path.clone(), false), None, metrics.clone());
        audit.write(call("a")).await.unwrap();
        audit.write(call("b")).await.unwrap();
        let moved = dir.path().join("audit.jsonl.1");
        std::fs::rename(&path, &moved).unwrap();
        audit.write(call("c")).await.unwrap();
        drop(audit);
        let old = lines(&moved);
        assert_eq!(old[0].chain.map(|c| c.reason), Some(ChainReason::Start));
        assert_eq!((old[0].seq, old[0].prev.as_deref()), (Some(1), None));
        let new = lines(&path);
        assert_eq!(new[0].chain.map(|c| c.reason), Some(ChainReason::Moved));
        assert_eq!(new[0].seq, Some(3));
        // A new process appending to the file goes on from its last record.
        let again = Audit::start(&config(path.clone(), false), None, metrics);
        again.write(call("d")).await.unwrap();
        let new = lines(&path);
        assert_eq!(new[1].chain.map(|c| c.reason), Some(ChainReason::Resume));
        assert_eq!(new[1].seq, Some(4));
        let summary = verify_files(&[moved.clone(), path.clone()]).unwrap();
        assert_eq!((summary.records, summary.last.unwrap().0), (4, 4));
        // Without the older file, the newer one's first record links to a
        // record not given.
        let summary = verify_files(std::slice::from_ref(&path)).unwrap();
        assert!(
            summary.notes[0].contains("before the first file"),
            "{summary:?}"
        );
    }

    #[tokio::test]
    async fn a_line_cut_short_is_ended_and_the_chain_goes_on_from_the_last_whole_one() {
        use crate::audit::ChainReason;
        use crate::audit::verify::verify_files;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let metrics = Arc::new(Metrics::new());
        let audit = Audit::start(&config(path.clone(), false), None, metrics.clone());
        audit.write(call("a")).await.unwrap();
        audit.write(call("b")).await.unwrap();
        drop(audit);
        // A write cut short: half a record, no newline.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(r#"{"v":6,"seq":3,"prev":"00"#);
        std::fs::write(&path, &text).unwrap();
        let again = Audit::start(&config(path.clone(), false), None, metrics);
        again.write(call("c")).await.unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), 4, "{written}");
        let resumed: Record = serde_json::from_str(lines[3]).unwrap();
        assert_eq!(resumed.chain.map(|c| c.reason), Some(ChainReason::Resume));
        assert_eq!(resumed.seq, Some(3), "after the last whole record");
        let summary = verify_files(std::slice::from_ref(&path)).unwrap();
        assert_eq!((summary.records, summary.torn), (3, 1));
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
        // Exactly one whole line per record: none lost, none written twice.
        let mut tools: Vec<String> = lines(&path).into_iter().filter_map(|r| r.tool).collect();
        tools.sort();
        let mut expected: Vec<String> = (0..200).map(|i| format!("tool-{i}")).collect();
        expected.sort();
        assert_eq!(tools, expected);
    }

    #[tokio::test]
    async fn a_reserved_place_takes_its_record_when_the_queue_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let config = AuditConfig {
            queue: 1,
            ..config(path.clone(), true)
        };
        let audit = Audit::start(&config, None, Arc::new(Metrics::new()));
        let slot = audit.reserve().await.unwrap().expect("a place");
        // The only place is taken: a record without one finds no room.
        audit.enqueue(call("dropped"));
        audit.enqueue_reserved(slot, call("kept"));
        assert!(audit.flush().await);
        let tools: Vec<String> = lines(&path).into_iter().filter_map(|r| r.tool).collect();
        assert_eq!(tools, ["kept"]);
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
}
