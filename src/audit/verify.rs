//! `toolgate audit verify`: checks the hash chain of one replica's audit
//! files, oldest first, and names the first record where it breaks.
//!
//! What holds in an intact chain: every record has `seq`, one more than
//! the record before; every record's `prev` is the SHA-256 of the line
//! before it as written (across files: of the previous file's last
//! record); the first record of the oldest file carries `chain` (as the
//! writer marks the first record of every file it opens). Allowed, and
//! reported: records of a schema before the chain (`v` below 6, no `seq`)
//! before the chain's first record, when that record links to the last of
//! them (the writer resumed after them; records without `seq` that nothing
//! links to are a break: anyone could have put them there); lines that are
//! not records (a write cut short) right before a marked record or at the
//! very end; a marked record without `prev` as a file's first record (a
//! process that started on a new file: what came before it cannot be
//! checked).
//!
//! What no chain can show: records cut off the end of the newest file (or
//! newest files dropped), and a file rewritten from some record to its end
//! with every hash recomputed. Compare the last record's `seq` and hash
//! with the writer's log lines (`audit chain: destination opened`) or a
//! copy shipped elsewhere.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::chain::line_hash;

/// The first schema version whose records all carry `seq` (the hash
/// chain's); a record without `seq` must be of an earlier one.
pub const FIRST_CHAINED_SCHEMA: u64 = 6;

/// Why a chain is broken at a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// A line that is not a JSON object, where a record must be.
    #[error("not a record (not a JSON object), and no marked record follows it")]
    NotARecord,
    /// A record without `seq` after the chain began.
    #[error("no `seq`: every record after the chain's first has one")]
    NoSeq,
    /// A record without `seq` that claims a schema with the chain (or no
    /// schema at all): no writer wrote it so.
    #[error(
        "no `seq` in a record of schema {}: every record since schema {FIRST_CHAINED_SCHEMA} has one",
        .v.map_or_else(|| "(none)".to_owned(), |v| v.to_string())
    )]
    NoSeqInChainedSchema {
        /// The record's `v`, when it has one.
        v: Option<u64>,
    },
    /// The chain's first record starts anew (no `prev`) after records
    /// without `seq`: nothing links them to the chain.
    #[error(
        "starts a chain without `prev` after {count} records without `seq`: nothing links them to the chain (records put before it; or a file of a release before the chain given before a chain that started anew: leave that file out)"
    )]
    UnlinkedAfterUnchained {
        /// The records without `seq` before it.
        count: u64,
    },
    /// A record that is neither marked nor linked.
    #[error("no `prev`: only a file's first record may start a chain")]
    NoPrev,
    /// The first file's first record does not carry `chain`: records
    /// before it were cut off the file.
    #[error("the file's first record has no `chain` mark: records before it were removed")]
    NotMarked,
    /// A marked record without `prev` after records of the same file.
    #[error("starts a new chain after records of the same file: they are not linked to it")]
    UnlinkedInFile,
    /// The record's line is not the one the next record links to.
    #[error(
        "edited: its SHA-256 is not the `prev` of the record after it ({next_file}:{next_line}); this record, or that `prev`, was changed after it was written"
    )]
    Edited {
        /// The file of the record after it.
        next_file: String,
        /// The line of the record after it.
        next_line: u64,
    },
    /// `seq` jumps: records are missing before this one.
    #[error("seq {seq} follows seq {after}: {} missing before it (removed, moved, or a file between is missing)", missing(*.after, *.seq))]
    Missing {
        /// This record's `seq`.
        seq: u64,
        /// The `seq` of the record before it.
        after: u64,
    },
    /// `seq` does not grow: records are out of order.
    #[error("seq {seq} follows seq {after}: records out of order")]
    OutOfOrder {
        /// This record's `seq`.
        seq: u64,
        /// The `seq` of the record before it.
        after: u64,
    },
    /// `prev` names another line than the one before (`seq` in order).
    #[error("`prev` is not the SHA-256 of the record before it")]
    PrevMismatch,
}

fn missing(after: u64, seq: u64) -> String {
    let first = after.saturating_add(1);
    let last = seq.saturating_sub(1);
    if first == last {
        format!("seq {first} is")
    } else {
        format!("seqs {first} to {last} are")
    }
}

/// The first broken record: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}{}: {problem}", .seq.map(|s| format!(" (seq {s})")).unwrap_or_default())]
pub struct Break {
    /// The file, as given.
    pub file: String,
    /// The line (1 for the first).
    pub line: u64,
    /// The record's `seq`, when it has one.
    pub seq: Option<u64>,
    /// Why.
    pub problem: Problem,
}

/// Why verification did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A file cannot be read.
    #[error("{file}: cannot be read: {source}")]
    Read {
        /// The file, as given.
        file: String,
        /// The error.
        source: std::io::Error,
    },
    /// The chain is broken.
    #[error(transparent)]
    Broken(#[from] Break),
}

/// What was checked in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSummary {
    /// The file, as given.
    pub file: String,
    /// Chained records.
    pub records: u64,
    /// The first and last `seq`.
    pub seqs: Option<(u64, u64)>,
    /// The first record's mark, and whether it links to a record (`prev`).
    pub starts: Option<(String, bool)>,
}

/// An intact chain: what was checked, and what it cannot vouch for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Each file, in the order given.
    pub files: Vec<FileSummary>,
    /// Chained records in all.
    pub records: u64,
    /// Records of an earlier schema before the chain began (not checked).
    pub unchained: u64,
    /// Lines that are not records, each right before a marked record or at
    /// the end (writes cut short).
    pub torn: u64,
    /// The last record's `seq` and the SHA-256 of its line (hex).
    pub last: Option<(u64, String)>,
    /// What the chain cannot vouch for (unlinked starts, a first record
    /// linking to a file not given, a torn end).
    pub notes: Vec<String>,
}

/// The chain fields of a line.
#[derive(Deserialize)]
struct Fields {
    #[serde(default)]
    v: Option<u64>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    prev: Option<String>,
    #[serde(default)]
    chain: Option<Mark>,
}

#[derive(Deserialize)]
struct Mark {
    reason: String,
}

/// The record verified last.
struct Last {
    file: String,
    line: u64,
    seq: Option<u64>,
    hash: [u8; 32],
}

/// Checks lines one at a time ([`Verifier::file`], [`Verifier::line`],
/// [`Verifier::finish`]).
#[derive(Default)]
pub struct Verifier {
    summary: Summary,
    last: Option<Last>,
    /// A chained record was seen: records without `seq` are broken now.
    chained: bool,
    /// Records without `seq` since the last chained record (only before
    /// the chain began): the chain's first record must link to them.
    pending_unchained: u64,
    /// The first line that is not a record since the last record.
    torn_at: Option<(String, u64)>,
    /// Records in the current file.
    in_file: u64,
    file: String,
    line: u64,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("file", &self.file)
            .field("line", &self.line)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier before any file.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next file (named `name` in what is reported) begins.
    pub fn file(&mut self, name: &str) {
        self.file = name.to_owned();
        self.line = 0;
        self.in_file = 0;
        self.summary.files.push(FileSummary {
            file: name.to_owned(),
            records: 0,
            seqs: None,
            starts: None,
        });
    }

    /// Checks the file's next line (without its newline).
    ///
    /// # Errors
    /// The chain breaks at this line or at the record before it.
    pub fn line(&mut self, line: &[u8]) -> Result<(), Break> {
        self.line += 1;
        let fields = match serde_json::from_slice::<serde_json::Value>(line) {
            Ok(value) if value.is_object() => serde_json::from_value::<Fields>(value).ok(),
            _ => None,
        };
        let Some(fields) = fields else {
            if self.torn_at.is_none() {
                self.torn_at = Some((self.file.clone(), self.line));
            }
            return Ok(());
        };
        let hash = line_hash(line);
        let here = |problem| Break {
            file: self.file.clone(),
            line: self.line,
            seq: fields.seq,
            problem,
        };
        let marked = fields.chain.as_ref().map(|mark| mark.reason.clone());
        if let Some((file, line)) = self.torn_at.take() {
            if marked.is_none() {
                return Err(Break {
                    file,
                    line,
                    seq: None,
                    problem: Problem::NotARecord,
                });
            }
            self.summary.torn += 1;
        }
        let Some(seq) = fields.seq else {
            if self.chained {
                return Err(here(Problem::NoSeq));
            }
            if fields.v.is_none_or(|v| v >= FIRST_CHAINED_SCHEMA) {
                return Err(here(Problem::NoSeqInChainedSchema { v: fields.v }));
            }
            self.pending_unchained += 1;
            self.summary.unchained += 1;
            self.last = Some(self.last_here(None, hash));
            return Ok(());
        };
        // A file's first record is marked, so that records cut from the
        // start of the oldest file show. In a later file an unmarked first
        // record is checked against the file before (a copy-and-truncate
        // rotation splits the chain at any record).
        if self.in_file == 0 && marked.is_none() && self.last.is_none() {
            return Err(here(Problem::NotMarked));
        }
        match (&fields.prev, &self.last) {
            (None, _) if marked.is_none() => return Err(here(Problem::NoPrev)),
            (None, _) if self.in_file > 0 => return Err(here(Problem::UnlinkedInFile)),
            // Records without `seq` before it are the chain's only if it
            // links to them (the writer resumed after them).
            (None, _) if self.pending_unchained > 0 => {
                return Err(here(Problem::UnlinkedAfterUnchained {
                    count: self.pending_unchained,
                }));
            }
            (None, _) => self.summary.notes.push(format!(
                "{}:{} (seq {seq}): the chain starts anew ({}): what came before it cannot be checked",
                self.file,
                self.line,
                marked.as_deref().unwrap_or_default()
            )),
            (Some(_), None) => self.summary.notes.push(format!(
                "{}:{} (seq {seq}): links to a record before the first file given",
                self.file, self.line
            )),
            (Some(prev), Some(last)) => {
                if let Some(after) = last.seq {
                    if seq <= after {
                        return Err(here(Problem::OutOfOrder { seq, after }));
                    }
                    if seq > after + 1 {
                        return Err(here(Problem::Missing { seq, after }));
                    }
                }
                if *prev != hex::encode(last.hash) {
                    if last.seq.is_some() {
                        return Err(Break {
                            file: last.file.clone(),
                            line: last.line,
                            seq: last.seq,
                            problem: Problem::Edited {
                                next_file: self.file.clone(),
                                next_line: self.line,
                            },
                        });
                    }
                    return Err(here(Problem::PrevMismatch));
                }
            }
        }
        self.chained = true;
        self.pending_unchained = 0;
        self.in_file += 1;
        self.summary.records += 1;
        if let Some(current) = self.summary.files.last_mut() {
            current.records += 1;
            current.seqs = Some(current.seqs.map_or((seq, seq), |(first, _)| (first, seq)));
            if current.starts.is_none() {
                current.starts = marked.map(|reason| (reason, fields.prev.is_some()));
            }
        }
        self.summary.last = Some((seq, hex::encode(hash)));
        self.last = Some(self.last_here(Some(seq), hash));
        Ok(())
    }

    fn last_here(&self, seq: Option<u64>, hash: [u8; 32]) -> Last {
        Last {
            file: self.file.clone(),
            line: self.line,
            seq,
            hash,
        }
    }

    /// The summary of an intact chain.
    pub fn finish(mut self) -> Summary {
        if let Some((file, line)) = self.torn_at.take() {
            self.summary.torn += 1;
            self.summary.notes.push(format!(
                "{file}:{line}: the last lines are not records (a write cut short)"
            ));
        }
        if self.summary.unchained > 0 {
            self.summary.notes.push(format!(
                "{} records of an earlier schema before the chain began were not checked",
                self.summary.unchained
            ));
        }
        self.summary
    }
}

/// Verifies `files`, oldest first, as one chain.
///
/// # Errors
/// A file cannot be read, or the chain is broken.
pub fn verify_files(files: &[PathBuf]) -> Result<Summary, VerifyError> {
    let mut verifier = Verifier::new();
    for path in files {
        verify_file(&mut verifier, path)?;
    }
    Ok(verifier.finish())
}

fn verify_file(verifier: &mut Verifier, path: &Path) -> Result<(), VerifyError> {
    let name = path.display().to_string();
    let read_error = |source| VerifyError::Read {
        file: name.clone(),
        source,
    };
    let mut reader = std::io::BufReader::new(std::fs::File::open(path).map_err(read_error)?);
    verifier.file(&name);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(read_error)? == 0 {
            return Ok(());
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        verifier.line(text)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::chain::{Chain, ChainReason};
    use crate::audit::{Outcome, Record, RecordKind, record::serialise};

    /// `count` chained lines in one file from `chain`.
    fn lines(chain: &mut Chain, reason: ChainReason, count: usize) -> Vec<Vec<u8>> {
        chain.mark(reason);
        (0..count)
            .map(|i| {
                let mut record = Record::new(RecordKind::Call, Outcome::Ok);
                record.tool = Some(format!("tool-{i}"));
                let mut out = Vec::new();
                chain.append(&serialise(&record), &mut out);
                out.pop();
                out
            })
            .collect()
    }

    fn check(files: &[(&str, Vec<Vec<u8>>)]) -> Result<Summary, Break> {
        let mut verifier = Verifier::new();
        for (name, lines) in files {
            verifier.file(name);
            for line in lines {
                verifier.line(line)?;
            }
        }
        Ok(verifier.finish())
    }

    #[test]
    fn an_intact_chain_across_files_passes() {
        let mut chain = Chain::new();
        let one = lines(&mut chain, ChainReason::Start, 3);
        let two = lines(&mut chain, ChainReason::Moved, 2);
        let summary = check(&[("a.1", one), ("a", two)]).unwrap();
        assert_eq!(summary.records, 5);
        assert_eq!(summary.files[1].seqs, Some((4, 5)));
        assert_eq!(summary.files[1].starts, Some(("moved".to_owned(), true)));
        assert_eq!(summary.notes.len(), 1, "the unlinked start: {summary:?}");
        assert_eq!(summary.last.as_ref().unwrap().0, 5);
    }

    #[test]
    fn an_edited_record_is_named() {
        let mut chain = Chain::new();
        let mut one = lines(&mut chain, ChainReason::Start, 4);
        one[1] = String::from_utf8(one[1].clone())
            .unwrap()
            .replace("tool-1", "tool-X")
            .into_bytes();
        let broken = check(&[("a", one)]).unwrap_err();
        assert_eq!((broken.line, broken.seq), (2, Some(2)), "{broken}");
        assert!(matches!(
            broken.problem,
            Problem::Edited { next_line: 3, .. }
        ));
    }

    #[test]
    fn a_removed_or_moved_record_is_named() {
        let mut chain = Chain::new();
        let one = lines(&mut chain, ChainReason::Start, 4);
        let mut removed = one.clone();
        removed.remove(1);
        let broken = check(&[("a", removed)]).unwrap_err();
        assert_eq!((broken.line, broken.seq), (2, Some(3)), "{broken}");
        assert_eq!(broken.problem, Problem::Missing { seq: 3, after: 1 });
        let mut swapped = one;
        swapped.swap(1, 2);
        let broken = check(&[("a", swapped)]).unwrap_err();
        assert_eq!((broken.line, broken.seq), (2, Some(3)), "{broken}");
    }

    #[test]
    fn a_file_missing_between_two_is_found() {
        let mut chain = Chain::new();
        let one = lines(&mut chain, ChainReason::Start, 2);
        let _two = lines(&mut chain, ChainReason::Moved, 2);
        let three = lines(&mut chain, ChainReason::Hangup, 2);
        let broken = check(&[("a.2", one), ("a", three)]).unwrap_err();
        assert_eq!(broken.file, "a");
        assert_eq!(broken.problem, Problem::Missing { seq: 5, after: 2 });
    }

    #[test]
    fn a_file_cut_at_its_start_is_found() {
        let mut chain = Chain::new();
        let mut one = lines(&mut chain, ChainReason::Start, 3);
        one.remove(0);
        let broken = check(&[("a", one)]).unwrap_err();
        assert_eq!(broken.problem, Problem::NotMarked);
    }

    #[test]
    fn a_chain_split_between_files_at_any_record_still_links() {
        let mut chain = Chain::new();
        let mut one = lines(&mut chain, ChainReason::Start, 4);
        let two = one.split_off(2);
        let summary = check(&[("a.1", one.clone()), ("a", two.clone())]).unwrap();
        assert_eq!(summary.records, 4);
        // Without its first record, the second file does not link.
        let broken = check(&[("a.1", one), ("a", two[1..].to_vec())]).unwrap_err();
        assert_eq!(broken.problem, Problem::Missing { seq: 4, after: 2 });
    }

    #[test]
    fn a_torn_line_is_allowed_only_before_a_marked_record() {
        let mut chain = Chain::new();
        let one = lines(&mut chain, ChainReason::Start, 2);
        // A write cut short: part of a line; the writer goes on from the
        // last whole line, marking its next record.
        let torn = one[1][..20].to_vec();
        let more = lines(&mut chain, ChainReason::Recovered, 1);
        let file = vec![
            one[0].clone(),
            one[1].clone(),
            torn.clone(),
            more[0].clone(),
        ];
        let summary = check(&[("a", file)]).unwrap();
        assert_eq!(summary.torn, 1);
        // Not before an unmarked record.
        let file = vec![one[0].clone(), torn, one[1].clone()];
        let broken = check(&[("a", file)]).unwrap_err();
        assert_eq!((broken.line, broken.problem), (2, Problem::NotARecord));
    }

    #[test]
    fn records_without_seq_that_the_chain_does_not_link_to_are_a_break() {
        let old = br#"{"v":5,"time":"t","kind":"call","outcome":"ok"}"#.to_vec();
        // Put before the first record of a chain that started anew.
        let mut chain = Chain::new();
        let one = lines(&mut chain, ChainReason::Start, 2);
        let mut file = vec![old.clone(), old.clone()];
        file.extend(one.clone());
        let broken = check(&[("a", file)]).unwrap_err();
        assert_eq!((broken.line, broken.seq), (3, Some(1)), "{broken}");
        assert_eq!(broken.problem, Problem::UnlinkedAfterUnchained { count: 2 });
        // A file of them given before such a chain: the same.
        let broken = check(&[("a.1", vec![old.clone()]), ("a", one.clone())]).unwrap_err();
        assert_eq!(broken.file, "a");
        // A record without `seq` claiming the chain's schema (or none).
        for forged in [
            br#"{"v":7,"time":"t","kind":"call","outcome":"ok"}"#.to_vec(),
            br#"{"time":"t","kind":"call","outcome":"ok"}"#.to_vec(),
        ] {
            let mut file = vec![forged];
            file.extend(one.clone());
            let broken = check(&[("a", file)]).unwrap_err();
            assert_eq!(broken.line, 1, "{broken}");
            assert!(
                matches!(broken.problem, Problem::NoSeqInChainedSchema { .. }),
                "{broken}"
            );
        }
        // One put between earlier records and the chain that links to the
        // last of them.
        let mut chain = Chain::new();
        chain.resume_after(&old);
        let resumed = lines(&mut chain, ChainReason::Resume, 1);
        let other = br#"{"v":5,"time":"u","kind":"call","outcome":"ok"}"#.to_vec();
        let file = vec![old, other, resumed[0].clone()];
        let broken = check(&[("a", file)]).unwrap_err();
        assert_eq!(broken.problem, Problem::PrevMismatch, "{broken}");
    }

    #[test]
    fn records_before_the_chain_are_counted_not_checked() {
        let old = br#"{"v":5,"time":"t","kind":"call","outcome":"ok"}"#.to_vec();
        let mut chain = Chain::new();
        chain.resume_after(&old);
        let one = lines(&mut chain, ChainReason::Resume, 2);
        let mut file = vec![old.clone(), old];
        file.extend(one);
        let summary = check(&[("a", file)]).unwrap();
        assert_eq!((summary.unchained, summary.records), (2, 2));
    }
}
