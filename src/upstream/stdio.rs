//! The stdio transport: a child process in its own process group, with a
//! cleared environment plus exactly the configured variables, and its
//! stderr captured into the gateway's log.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use futures::StreamExt;
use process_wrap::tokio::{CommandWrap, ProcessGroup};
use rmcp::transport::TokioChildProcess;
use tokio::process::ChildStderr;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use super::UpstreamError;
use crate::config::{Environment, Secret};

/// Longest stderr line kept; the rest of a longer line is dropped.
const MAX_STDERR_LINE: usize = 4096;

/// Starts the child and returns its transport and process id.
pub(super) fn spawn(
    command: &[String],
    cwd: Option<&Path>,
    env: &[(String, Secret)],
    gateway_env: &dyn Environment,
    label: &Label,
) -> Result<(TokioChildProcess, Option<u32>), UpstreamError> {
    let program = &command[0];
    let resolved =
        resolve_program(program, gateway_env, cwd).ok_or_else(|| UpstreamError::Spawn {
            program: program.clone(),
            reason: "not found on the gateway's PATH (or not executable)".to_owned(),
        })?;
    let mut cmd = tokio::process::Command::new(&resolved);
    cmd.args(&command[1..]).env_clear();
    for (key, value) in env {
        cmd.env(key, value.expose());
    }
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    // A new process group: shutdown signals reach the server's own children.
    let mut wrapped = CommandWrap::from(cmd);
    wrapped.wrap(ProcessGroup::leader());
    let (transport, stderr) = TokioChildProcess::builder(wrapped)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| UpstreamError::Spawn {
            program: program.clone(),
            reason: e.to_string(),
        })?;
    let pid = transport.id();
    if let Some(stderr) = stderr {
        tokio::spawn(forward_stderr(stderr, label.clone()));
    }
    Ok((transport, pid))
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

/// Logs each stderr line of the child, labelled, with long lines cut and a
/// rate limit: a child that floods stderr cannot flood the gateway's log.
/// Lines over the rate are counted and the count is logged once lines flow
/// again. The pipe is always drained, so the child never blocks on it.
async fn forward_stderr(stderr: ChildStderr, label: Label) {
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
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(MAX_STDERR_LINE));
    // Reports drops even when the flood ends with no line after it.
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        let line = tokio::select! {
            line = lines.next() => match line {
                Some(line) => line,
                None => break,
            },
            _ = tick.tick() => {
                report(&mut dropped);
                continue;
            }
        };
        if limiter.check().is_err() {
            dropped += 1;
            continue;
        }
        report(&mut dropped);
        match line {
            Ok(line) => tracing::info!(
                target: "toolgate::upstream::stderr",
                tenant = %label.tenant,
                server = %label.server,
                "{line}"
            ),
            Err(LinesCodecError::MaxLineLengthExceeded) => tracing::info!(
                target: "toolgate::upstream::stderr",
                tenant = %label.tenant,
                server = %label.server,
                "[stderr line longer than {MAX_STDERR_LINE} bytes dropped]"
            ),
            Err(LinesCodecError::Io(_)) => break,
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
