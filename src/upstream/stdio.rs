//! The stdio transport: a child process in its own process group, with a
//! cleared environment plus exactly the configured variables, its stdout
//! read in lines bounded by `limits.max_result_bytes` ([`framing`]), its
//! stderr redacted into the gateway's log, and its whole group stopped when
//! the session ends ([`group`]).

mod call_reply;
mod framing;
mod group;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use futures::StreamExt;
use process_wrap::tokio::{CommandWrap, ProcessGroup};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, FramedRead};
use tokio_util::sync::CancellationToken;

pub(super) use framing::too_large_limit;
pub(super) use group::Group;

use super::UpstreamError;
use crate::config::{Environment, Secret};
use crate::credentials::SharedRedactor;

/// Longest stderr line kept; the rest of a longer line is dropped.
const MAX_STDERR_LINE: usize = 4096;

/// The transport of a stdio session.
pub(super) type Transport = framing::StdioTransport<ChildStdout, ChildStdin>;

/// Starts the child; returns its transport and its process group (which
/// stops the child when the session ends, see [`Group::stop`]).
pub(super) fn spawn(
    command: &[String],
    cwd: Option<&Path>,
    env: &[(String, Secret)],
    gateway_env: &dyn Environment,
    label: &Label,
    max_result_bytes: usize,
    redactor: &SharedRedactor,
) -> Result<(Transport, Group), UpstreamError> {
    let program = &command[0];
    let failed = |reason: String| UpstreamError::Spawn {
        program: program.clone(),
        reason,
    };
    let resolved = resolve_program(program, gateway_env, cwd)
        .ok_or_else(|| failed("not found on the gateway's PATH (or not executable)".to_owned()))?;
    let mut cmd = tokio::process::Command::new(&resolved);
    cmd.args(&command[1..]).env_clear();
    for (key, value) in env {
        cmd.env(key, value.expose());
    }
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A new process group: the whole group is stopped with the session.
    let mut wrapped = CommandWrap::from(cmd);
    wrapped.wrap(ProcessGroup::leader());
    let mut child = wrapped.spawn().map_err(|e| failed(e.to_string()))?;
    let pid = child.id();
    let stdin = child.inner_mut().stdin().take();
    let stdout = child.inner_mut().stdout().take();
    let stderr = child.inner_mut().stderr().take();
    let close = CancellationToken::new();
    // The group exists from here on: any early return stops it.
    let group = pid.map(|pid| Group::new(child, pid, close.clone(), label.clone()));
    let (Some(group), Some(stdin), Some(stdout)) = (group, stdin, stdout) else {
        return Err(failed("the child's pipes are missing".to_owned()));
    };
    if let Some(stderr) = stderr {
        tokio::spawn(forward_stderr(stderr, label.clone(), redactor.clone()));
    }
    let transport = framing::StdioTransport::new(stdout, stdin, max_result_bytes, close);
    Ok((transport, group))
}

/// Tenant and server, for log lines.
#[derive(Debug, Clone)]
pub struct Label {
    /// The tenant name.
    pub tenant: String,
    /// The server name.
    pub server: String,
}

/// Stderr lines logged per second per child, sustained (burst: twice that).
const STDERR_LINES_PER_SECOND: u32 = 100;

/// Logs each stderr line of the child, labelled, redacted (configured
/// credentials replaced, cut to 1 KiB), with a rate limit: a child that
/// floods stderr cannot flood the gateway's log, and one that prints a
/// secret it was given cannot put it there.
/// Lines over the rate are counted and the count is logged once lines flow
/// again. The pipe is always drained, so the child never blocks on it.
async fn forward_stderr(stderr: ChildStderr, label: Label, redactor: SharedRedactor) {
    use governor::{Quota, RateLimiter};
    let rate = std::num::NonZeroU32::new(STDERR_LINES_PER_SECOND).expect("non-zero");
    let limiter = RateLimiter::direct(
        Quota::per_second(rate)
            .allow_burst(rate.saturating_mul(std::num::NonZeroU32::new(2).expect("non-zero"))),
    );
    let mut dropped: u64 = 0;
    let report = |dropped: &mut u64| {
        if *dropped > 0 {
            tracing::warn!(
                target: "toolgate::upstream::stderr",
                tenant = %label.tenant,
                server = %label.server,
                dropped = *dropped,
                "[stderr lines dropped by the rate limit]"
            );
            *dropped = 0;
        }
    };
    // Bytes, not UTF-8 lines: invalid UTF-8 must not stop the draining.
    let mut lines = FramedRead::new(
        stderr,
        AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), MAX_STDERR_LINE),
    );
    // Reports drops even when the flood ends with no line after it.
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    let mut after_error = false;
    loop {
        let line = tokio::select! {
            line = lines.next() => match line {
                Some(line) => line,
                // After a decode error (a line over the cap) the stream
                // yields one `None`, then resumes reading.
                None if std::mem::take(&mut after_error) => continue,
                None => break,
            },
            _ = tick.tick() => {
                report(&mut dropped);
                continue;
            }
        };
        after_error = matches!(line, Err(AnyDelimiterCodecError::MaxChunkLengthExceeded));
        if limiter.check().is_err() {
            dropped += 1;
            continue;
        }
        report(&mut dropped);
        match line {
            Ok(line) => {
                let line = String::from_utf8_lossy(&line);
                let line = line.strip_suffix('\r').unwrap_or(&line);
                let line = redactor.load().upstream_text(line);
                tracing::info!(
                    target: "toolgate::upstream::stderr",
                    tenant = %label.tenant,
                    server = %label.server,
                    "{line}"
                );
            }
            Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => tracing::info!(
                target: "toolgate::upstream::stderr",
                tenant = %label.tenant,
                server = %label.server,
                "[stderr line longer than {MAX_STDERR_LINE} bytes dropped]"
            ),
            Err(AnyDelimiterCodecError::Io(_)) => break,
        }
    }
}

/// Finds the program: a path with a slash is used as given (relative to
/// `cwd` when set); a bare name is looked up on the gateway's own PATH,
/// since the child's environment has no PATH unless configured.
fn resolve_program(program: &str, env: &dyn Environment, cwd: Option<&Path>) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        let path = match cwd {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path,
        };
        return is_executable(&path).then_some(path);
    }
    let search = env.var("PATH")?;
    std::env::split_paths(&search)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
