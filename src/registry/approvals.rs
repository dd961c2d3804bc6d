//! Following the approvals file: the registry's approvals are replaced
//! when the file changes, on SIGHUP, and when a reload names another file.

use std::path::PathBuf;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::Registry;
use super::reload::{POLL_INTERVAL, next_hangup};
use crate::approvals::{Approvals, ApprovalsError, warn_missing};

/// Reloads the approvals when the configured file's content changes
/// (polled every [`POLL_INTERVAL`]), on SIGHUP, and when a configuration
/// reload names another file, until `stop` is cancelled. `loaded` is the
/// file and digest the gateway started with (digest `None`: missing). A
/// malformed file is refused with its name and line; the previous
/// approvals stay in force.
pub async fn watch(
    registry: Arc<Registry>,
    mut loaded: Option<(PathBuf, Option<[u8; 32]>)>,
    stop: CancellationToken,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup()).ok();
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The content last refused, so that it is reported once.
    let mut refused: Option<(PathBuf, [u8; 32])> = None;
    loop {
        let trigger = tokio::select! {
            () = stop.cancelled() => return,
            Some(()) = next_hangup(&mut hangup) => "SIGHUP",
            () = registry.approvals_file_changed() => "configuration reload",
            _ = poll.tick() => "file change",
        };
        let Some(file) = registry.approvals_file() else {
            continue;
        };
        let bytes = match std::fs::read(&file) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                if trigger != "file change" {
                    tracing::error!(file = %file.display(), error = %e, %trigger, "cannot read the approvals file; keeping the previous approvals");
                }
                continue;
            }
        };
        let digest: Option<[u8; 32]> = bytes.as_ref().map(|b| Sha256::digest(b).into());
        let same = loaded
            .as_ref()
            .is_some_and(|(f, d)| *f == file && *d == digest);
        if same && trigger != "SIGHUP" {
            continue;
        }
        let Some(bytes) = bytes else {
            warn_missing(&file);
            registry.set_approvals(Approvals::new());
            loaded = Some((file, None));
            continue;
        };
        let digest = digest.expect("digest of the bytes read");
        if trigger == "file change" && refused.as_ref() == Some(&(file.clone(), digest)) {
            continue;
        }
        let parsed = String::from_utf8(bytes)
            .map_err(|_| ApprovalsError::Malformed {
                file: file.clone(),
                line: None,
                message: "not UTF-8 text".to_owned(),
            })
            .and_then(|text| Approvals::parse(&text, &file));
        match parsed {
            Ok(approvals) => {
                tracing::info!(
                    %trigger,
                    file = %file.display(),
                    tools = approvals.tool_count(),
                    "approvals reloaded"
                );
                registry.set_approvals(approvals);
                loaded = Some((file, Some(digest)));
                refused = None;
            }
            Err(error) => {
                tracing::error!(%trigger, %error, "approvals reload refused; the previous approvals stay in force");
                refused = Some((file, digest));
            }
        }
    }
}
