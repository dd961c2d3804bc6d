//! The hash chain of the audit trail: the writer gives every line the
//! next `seq` of this replica and `prev`, the SHA-256 of the line it wrote
//! before (as written, without its newline), and marks the first record
//! of each file it opens with `chain: {"reason": ...}`. Here: the mark,
//! the writer's end of the chain ([`Chain`]) and how a line is chained;
//! the checking side is in `verify`.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Why a record is the first of a file the writer opened (`chain.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainReason {
    /// The process started on a new or empty file: nothing to link to (no
    /// `prev`), `seq` starts at 1.
    Start,
    /// The process started appending to a file that has records: linked to
    /// the file's last record, `seq` continues from it.
    Resume,
    /// The path no longer named the open file (moved away or replaced):
    /// linked to the last record written to the previous file.
    Moved,
    /// SIGHUP reopened the path: linked to the last record written before.
    Hangup,
    /// The path was opened anew after a write failed: linked to the last
    /// record written whole (a line cut short may stand before it).
    Recovered,
}

impl ChainReason {
    /// The name written in records (`start`, `resume`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ChainReason::Start => "start",
            ChainReason::Resume => "resume",
            ChainReason::Moved => "moved",
            ChainReason::Hangup => "hangup",
            ChainReason::Recovered => "recovered",
        }
    }
}

/// The mark on the first record of each file (`"chain": {"reason": ...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainMark {
    /// Why the writer opened the file.
    pub reason: ChainReason,
}

/// The SHA-256 of one line as written (without its newline).
pub(super) fn line_hash(line: &[u8]) -> [u8; 32] {
    Sha256::digest(line).into()
}

/// Where the chain stands: the `seq` the next record gets and the hash of
/// the last line written (`None` before anything is known to link to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) next_seq: u64,
    pub(super) last: Option<[u8; 32]>,
}

/// One line the writer chained: where it ends in the batch (newline
/// included), and the head once it is written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chained {
    pub(super) end: usize,
    pub(super) head: Head,
}

/// Where the chain stands after a write of `chained` that failed once
/// `written` bytes were written: past the last line written whole (but
/// perhaps for its newline, which the writer adds before its next write),
/// else where it stood `before`.
pub(super) fn landed(chained: &[Chained], written: usize, before: Head) -> Head {
    chained
        .iter()
        .rev()
        .find(|line| line.end - 1 <= written)
        .map_or(before, |line| line.head)
}

/// The writer's end of the chain.
#[derive(Debug)]
pub(super) struct Chain {
    head: Head,
    /// The mark the next record carries (a file was opened since the last
    /// record).
    mark: Option<ChainReason>,
}

impl Chain {
    /// A chain with nothing written yet.
    pub(super) fn new() -> Self {
        Self {
            head: Head {
                next_seq: 1,
                last: None,
            },
            mark: None,
        }
    }

    /// Where the chain stands.
    pub(super) fn head(&self) -> Head {
        self.head
    }

    /// Moves the chain to `head` (after a write that failed part-way: the
    /// last line written whole).
    pub(super) fn set_head(&mut self, head: Head) {
        self.head = head;
    }

    /// The next record starts a file opened for `reason`.
    pub(super) fn mark(&mut self, reason: ChainReason) {
        self.mark = Some(reason);
    }

    /// Continues from `line`, the last record of a file the process starts
    /// appending to: links to it, and `seq` follows its `seq` (from 1 when
    /// it has none: a record written before the chain).
    pub(super) fn resume_after(&mut self, line: &[u8]) {
        let seq = serde_json::from_slice::<serde_json::Value>(line)
            .ok()
            .and_then(|value| value.get("seq").and_then(serde_json::Value::as_u64));
        self.head = Head {
            next_seq: seq.map_or(1, |seq| seq.saturating_add(1)),
            last: Some(line_hash(line)),
        };
    }

    /// Appends `line` (one serialised record, `{"v":..,...}` and its
    /// newline) to `out` with `seq`, `prev` (when there is a line to link
    /// to) and the pending mark written after `v`, and moves the head past
    /// it.
    pub(super) fn append(&mut self, line: &[u8], out: &mut Vec<u8>) -> Chained {
        let start = out.len();
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        // After `"v":N,`: the version is a number, so the first comma ends
        // it. A record always has more fields after it.
        let split = body
            .iter()
            .position(|&byte| byte == b',')
            .map_or(1.min(body.len()), |comma| comma + 1);
        out.extend_from_slice(&body[..split]);
        out.extend_from_slice(format!("\"seq\":{},", self.head.next_seq).as_bytes());
        if let Some(last) = &self.head.last {
            out.extend_from_slice(b"\"prev\":\"");
            out.extend_from_slice(hex::encode(last).as_bytes());
            out.extend_from_slice(b"\",");
        }
        if let Some(reason) = self.mark.take() {
            out.extend_from_slice(b"\"chain\":{\"reason\":\"");
            out.extend_from_slice(reason.as_str().as_bytes());
            out.extend_from_slice(b"\"},");
        }
        out.extend_from_slice(&body[split..]);
        let hash = line_hash(&out[start..]);
        out.push(b'\n');
        self.head = Head {
            next_seq: self.head.next_seq.saturating_add(1),
            last: Some(hash),
        };
        Chained {
            end: out.len(),
            head: self.head,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Outcome, Record, RecordKind, record::serialise};

    fn record(tool: &str) -> Vec<u8> {
        let mut record = Record::new(RecordKind::Call, Outcome::Ok);
        record.tool = Some(tool.to_owned());
        serialise(&record)
    }

    fn parse(line: &[u8]) -> Record {
        serde_json::from_slice(line).expect("a chained line is a record")
    }

    #[test]
    fn each_line_links_to_the_line_before_as_written() {
        let mut chain = Chain::new();
        chain.mark(ChainReason::Start);
        let mut out = Vec::new();
        let first = chain.append(&record("a"), &mut out);
        let second = chain.append(&record("b"), &mut out);
        let text = String::from_utf8(out.clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with(r#"{"v":8,"seq":1,"chain":{"reason":"start"},"time":"#),
            "{}",
            lines[0]
        );
        let one = parse(lines[0].as_bytes());
        assert_eq!((one.seq, one.prev.as_deref()), (Some(1), None));
        assert_eq!(
            one.chain,
            Some(ChainMark {
                reason: ChainReason::Start
            })
        );
        let two = parse(lines[1].as_bytes());
        assert_eq!(two.seq, Some(2));
        assert_eq!(two.chain, None, "only a file's first record is marked");
        assert_eq!(
            two.prev.as_deref(),
            Some(hex::encode(line_hash(lines[0].as_bytes())).as_str())
        );
        assert_eq!(first.end, lines[0].len() + 1);
        assert_eq!(second.end, out.len());
        assert_eq!(second.head.last, Some(line_hash(lines[1].as_bytes())));
        // A record read back and written again is the same line.
        let again = String::from_utf8(serialise(&two)).unwrap();
        assert_eq!(again.trim_end(), lines[1]);
    }

    #[test]
    fn a_write_cut_short_leaves_the_chain_after_the_last_whole_line() {
        let mut chain = Chain::new();
        let before = chain.head();
        let mut out = Vec::new();
        let chained = [
            chain.append(&record("a"), &mut out),
            chain.append(&record("b"), &mut out),
        ];
        let first = chained[0].end;
        assert_eq!(landed(&chained, 0, before), before);
        assert_eq!(landed(&chained, first - 2, before), before);
        // All but the newline: the line is whole once the newline is added.
        assert_eq!(landed(&chained, first - 1, before), chained[0].head);
        assert_eq!(landed(&chained, first + 5, before), chained[0].head);
        assert_eq!(landed(&chained, out.len() - 1, before), chained[1].head);
    }

    #[test]
    fn resuming_links_to_the_last_line_and_follows_its_seq() {
        let mut chain = Chain::new();
        let last = br#"{"v":6,"seq":41,"time":"t","kind":"call","outcome":"ok"}"#;
        chain.resume_after(last);
        chain.mark(ChainReason::Resume);
        let mut out = Vec::new();
        chain.append(&record("a"), &mut out);
        let record = parse(out.strip_suffix(b"\n").unwrap());
        assert_eq!(record.seq, Some(42));
        assert_eq!(record.prev, Some(hex::encode(line_hash(last))));
        // A record written before the chain: linked, seq from 1.
        let mut chain = Chain::new();
        chain.resume_after(br#"{"v":5,"time":"t","kind":"call","outcome":"ok"}"#);
        assert_eq!(chain.head().next_seq, 1);
        assert!(chain.head().last.is_some());
    }
}
