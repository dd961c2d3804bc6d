//! The process group of a stdio server and how it is stopped.
//!
//! Every end of a stdio session (gateway shutdown, reload, idle eviction, a
//! crashed or finished server, a failed connect) goes through
//! [`Group::stop`]: close the child's stdin, give the leader [`GRACE`] to
//! exit, then SIGTERM the whole process group, wait while it still has live
//! members, then SIGKILL it. The group is signalled whether or not the
//! leader is still there: a server that exits on EOF must not leave its
//! helpers behind.

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use process_wrap::tokio::ChildWrapper;
use tokio_util::sync::CancellationToken;

use super::Label;

/// How long the leader has to exit after its stdin closes.
const GRACE: Duration = Duration::from_secs(3);
/// How long the group has to go after SIGTERM, before SIGKILL.
const TERM_WAIT: Duration = Duration::from_secs(2);
/// How long the group has to go after SIGKILL (it cannot refuse; this only
/// bounds the wait for the kernel).
const KILL_WAIT: Duration = Duration::from_secs(1);
/// How often the group is probed while waiting.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// A spawned stdio server: the leader of its own process group (pgid = pid).
/// Dropped without [`Group::stop`], it stops itself in the background (or,
/// with no runtime left, SIGKILLs the group at once).
pub(in crate::upstream) struct Group {
    child: Option<Box<dyn ChildWrapper>>,
    pgid: Pid,
    /// Cancelling it closes the child's stdin.
    stdin: CancellationToken,
    label: Label,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("pgid", &self.pgid.as_raw())
            .finish_non_exhaustive()
    }
}

impl Group {
    pub(super) fn new(
        child: Box<dyn ChildWrapper>,
        pid: u32,
        stdin: CancellationToken,
        label: Label,
    ) -> Self {
        Self {
            child: Some(child),
            pgid: Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
            stdin,
            label,
        }
    }

    /// The leader's pid, which is also the group's id.
    pub(in crate::upstream) fn pid(&self) -> u32 {
        self.pgid.as_raw().unsigned_abs()
    }

    /// Stops the group; returns once no live process is left in it (each
    /// wait bounded: at most about [`GRACE`] + 3 s).
    pub(in crate::upstream) async fn stop(mut self) {
        if let Some(child) = self.child.take() {
            let armed = KillOnDrop(Some(self.pgid));
            stop(
                child,
                self.pgid,
                self.stdin.clone(),
                self.label.clone(),
                armed,
            )
            .await;
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let Some(child) = self.child.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let armed = KillOnDrop(Some(self.pgid));
                runtime.spawn(stop(
                    child,
                    self.pgid,
                    self.stdin.clone(),
                    self.label.clone(),
                    armed,
                ));
            }
            Err(_) => {
                let _ = killpg(self.pgid, Signal::SIGKILL);
            }
        }
    }
}

/// SIGKILLs the group when dropped armed: a stop abandoned half-way (the
/// runtime shutting down) still leaves no process behind.
struct KillOnDrop(Option<Pid>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

/// Stops the group. `armed` is made by the caller, so that even a stop
/// dropped before it first runs (spawned while the runtime shuts down)
/// SIGKILLs the group.
async fn stop(
    mut child: Box<dyn ChildWrapper>,
    pgid: Pid,
    stdin: CancellationToken,
    label: Label,
    mut armed: KillOnDrop,
) {
    let mut leader = Leader {
        child: &mut child,
        reaped: false,
    };
    stdin.cancel();
    // The grace: the leader exits on EOF, or not.
    if tokio::time::timeout(GRACE, leader.wait()).await.is_err() {
        tracing::debug!(tenant = %label.tenant, server = %label.server, pgid = pgid.as_raw(), "the server did not exit within the grace after its stdin closed");
    }
    if !group_gone(pgid) {
        let _ = killpg(pgid, Signal::SIGTERM);
        if !leader.wait_gone(pgid, TERM_WAIT).await {
            tracing::warn!(tenant = %label.tenant, server = %label.server, pgid = pgid.as_raw(), "the server's process group outlived SIGTERM; sending SIGKILL");
            let _ = killpg(pgid, Signal::SIGKILL);
            if !leader.wait_gone(pgid, KILL_WAIT).await {
                tracing::warn!(tenant = %label.tenant, server = %label.server, pgid = pgid.as_raw(), "the server's process group is still there after SIGKILL");
            }
        }
    }
    armed.0 = None;
    // The leader is ours to reap (it is gone or killed by now).
    if !leader.reaped {
        let _ = tokio::time::timeout(KILL_WAIT, leader.wait()).await;
    }
}

/// The leader, reaped once.
struct Leader<'a> {
    child: &'a mut Box<dyn ChildWrapper>,
    reaped: bool,
}

impl Leader<'_> {
    /// Waits for the leader to exit and reaps it. Cancel-safe.
    async fn wait(&mut self) {
        if self.reaped {
            return;
        }
        // An error (already reaped elsewhere) ends the wait as well.
        let _ = self.child.wait().await;
        self.reaped = true;
    }

    /// Waits until the group has no live member, reaping the leader on the
    /// way; `false` when `limit` passes first.
    async fn wait_gone(&mut self, pgid: Pid, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if group_gone(pgid) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            if self.reaped {
                tokio::time::sleep(PROBE_EVERY).await;
            } else {
                let _ = tokio::time::timeout(PROBE_EVERY, self.wait()).await;
            }
        }
    }
}

/// Whether the group has no process left that a signal could still stop.
/// Zombies do not count: they have exited, and reaping the orphans among
/// them is their new parent's (init's) job.
fn group_gone(pgid: Pid) -> bool {
    match killpg(pgid, None) {
        Err(Errno::ESRCH) => true,
        // EPERM: nothing in it the gateway may signal.
        Err(_) => true,
        Ok(()) => !has_live_member(pgid),
    }
}

/// Whether `/proc` shows a process of the group that is not a zombie (true
/// when `/proc` cannot be read: the signal probe said there is one).
fn has_live_member(pgid: Pid) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((state, pgrp)) = state_and_pgrp(&stat)
            && pgrp == pgid.as_raw()
            && state != "Z"
            && state != "X"
        {
            return true;
        }
    }
    false
}

/// The state and process group of a `/proc/<pid>/stat` line (fields 3 and
/// 5; the command name before them may contain spaces and parentheses).
fn state_and_pgrp(stat: &str) -> Option<(&str, i32)> {
    let (_, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_whitespace();
    let state = fields.next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_odd_command_names() {
        let stat = "4242 (we ird) (name)) S 1 4240 4240 0 -1 4194560";
        assert_eq!(state_and_pgrp(stat), Some(("S", 4240)));
        assert_eq!(state_and_pgrp("garbage"), None);
    }
}
