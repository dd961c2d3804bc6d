//! `toolgate audit verify FILE...`: checks the hash chain of audit files
//! (one replica's, oldest first) and names the first broken record.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::audit::verify::{Summary, VerifyError, verify_files};

/// Exit code of a chain found broken.
pub(super) const EXIT_BROKEN: u8 = 1;

/// Exit code of a file that cannot be read (EX_NOINPUT).
pub(super) const EXIT_UNREADABLE: u8 = 66;

/// `toolgate audit ...`.
#[derive(Debug, Subcommand)]
pub(super) enum AuditCommand {
    /// Check the hash chain of one replica's audit files, oldest first
    /// (`audit.jsonl.2 audit.jsonl.1 audit.jsonl`): exit 0 with a summary
    /// when intact, 1 naming the file, line and seq of the first broken
    /// record and why, 66 when a file cannot be read.
    Verify {
        /// The files, oldest first (uncompressed).
        #[arg(value_name = "FILE", required = true, num_args = 1..)]
        files: Vec<PathBuf>,
    },
}

/// Runs an `audit` command.
pub(super) fn run(command: AuditCommand) -> ExitCode {
    match command {
        AuditCommand::Verify { files } => match verify_files(&files) {
            Ok(summary) => {
                print!("{}", report(&summary));
                ExitCode::SUCCESS
            }
            Err(VerifyError::Broken(broken)) => {
                eprintln!("toolgate audit verify: chain broken at {broken}");
                ExitCode::from(EXIT_BROKEN)
            }
            Err(error) => {
                eprintln!("toolgate audit verify: {error}");
                ExitCode::from(EXIT_UNREADABLE)
            }
        },
    }
}

/// The summary of an intact chain, one line per file, then the total and
/// the notes.
fn report(summary: &Summary) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for file in &summary.files {
        let _ = write!(out, "{}: {} records", file.file, file.records);
        if let Some((first, last)) = file.seqs {
            let _ = write!(out, ", seq {first} to {last}");
        }
        if let Some((reason, linked)) = &file.starts {
            let link = if *linked { "linked" } else { "unlinked" };
            let _ = write!(out, " (starts: {reason}, {link})");
        }
        out.push('\n');
    }
    let _ = write!(
        out,
        "intact: {} records in {} files",
        summary.records,
        summary.files.len()
    );
    if let Some((seq, hash)) = &summary.last {
        let _ = write!(out, "; last record seq {seq}, sha256 {hash}");
    }
    out.push('\n');
    if summary.torn > 0 {
        let _ = writeln!(
            out,
            "note: {} lines that are not records (writes cut short), each before a marked record or at the end",
            summary.torn
        );
    }
    for note in &summary.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}
