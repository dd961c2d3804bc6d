//! Re-reading a listener's certificate, key and client CAs when their
//! files change (cert-manager, a Kubernetes Secret updated by the
//! kubelet, a renewal cron job).
//!
//! Every [`POLL_INTERVAL`] the three files are read and digested; when
//! the digest differs from the files in force, [`ListenerTls::load`] (the
//! check of configuration load) runs on them: files that load replace the
//! server configuration for new handshakes (INFO, `outcome="applied"`).
//! Files that do not load are given one more interval (a renewal that
//! writes the certificate, then the key, is seen half-written) and then
//! refused once per content (WARN naming the field and file,
//! `outcome="refused"`): the last good ones keep serving.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use super::server_config::{Alpn, server_config};
use crate::config::{ListenerTls, TlsFileError};
use crate::telemetry::Metrics;

/// How often a TLS listener's files are read for changes.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Seconds since the Unix epoch (the expiry gauge's value).
pub(super) fn unix_seconds(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// What the watcher knows of the files between two polls.
#[derive(Debug)]
struct Seen {
    /// The digest of the files in force.
    applied: [u8; 32],
    /// Files that failed to load once, given one more interval.
    failing: Option<[u8; 32]>,
    /// Files refused (reported once).
    refused: Option<[u8; 32]>,
}

/// What one poll found.
#[derive(Debug)]
enum Poll {
    /// Nothing new.
    Unchanged,
    /// New files that load: their configuration, notAfter and digest.
    Applied(Arc<rustls::ServerConfig>, SystemTime, [u8; 32]),
    /// New files that do not load, seen twice.
    Refused(TlsFileError, [u8; 32]),
}

/// Reads the files once and decides (blocking: file reads).
fn poll(tls: &ListenerTls, alpn: Alpn, seen: &mut Seen) -> Poll {
    let digest = tls.files_digest();
    if digest == seen.applied {
        seen.failing = None;
        return Poll::Unchanged;
    }
    if seen.refused == Some(digest) {
        return Poll::Unchanged;
    }
    let loaded = tls
        .load()
        .and_then(|loaded| Ok((server_config(tls, &loaded, alpn)?, loaded)));
    match loaded {
        Ok((config, loaded)) => {
            seen.applied = digest;
            seen.failing = None;
            seen.refused = None;
            Poll::Applied(config, loaded.not_after, digest)
        }
        Err(_) if seen.failing != Some(digest) => {
            seen.failing = Some(digest);
            Poll::Unchanged
        }
        Err(error) => {
            seen.failing = None;
            seen.refused = Some(digest);
            Poll::Refused(error, digest)
        }
    }
}

/// Watches `tls`'s files until `stop`, swapping `current` when they
/// change and load.
pub(super) async fn watch(
    tls: ListenerTls,
    alpn: Alpn,
    current: Arc<ArcSwap<rustls::ServerConfig>>,
    applied: [u8; 32],
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let listener = tls.listener;
    let tls = Arc::new(tls);
    let mut seen = Seen {
        applied,
        failing: None,
        refused: None,
    };
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let files = tls.clone();
        let polled = tokio::task::spawn_blocking(move || {
            let outcome = poll(&files, alpn, &mut seen);
            (outcome, seen)
        })
        .await;
        let outcome;
        (outcome, seen) = match polled {
            Ok(polled) => polled,
            // The poll panicked: `seen` is lost with it, so stop watching
            // (the configuration in force keeps serving).
            Err(error) => {
                tracing::error!(listener, %error, "TLS file watcher failed; certificate reloads stop");
                return;
            }
        };
        match outcome {
            Poll::Unchanged => {}
            Poll::Applied(config, not_after, digest) => {
                current.store(config);
                metrics.tls().reload(listener, true);
                metrics
                    .tls()
                    .certificate_expiry(listener, unix_seconds(not_after));
                tracing::info!(
                    listener,
                    cert_file = %tls.cert_file.display(),
                    not_after = %humantime::format_rfc3339_seconds(not_after),
                    digest = %hex_prefix(&digest),
                    "TLS certificate reloaded: new handshakes use it"
                );
            }
            Poll::Refused(error, digest) => {
                metrics.tls().reload(listener, false);
                tracing::warn!(
                    listener,
                    field = %error.path,
                    error = %error.message,
                    digest = %hex_prefix(&digest),
                    "TLS files changed but do not load; the previous certificate keeps serving"
                );
            }
        }
    }
}

/// The first bytes of a digest in hex (which content a log line is about).
fn hex_prefix(digest: &[u8; 32]) -> String {
    hex::encode(&digest[..6])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener_tls(dir: &std::path::Path) -> ListenerTls {
        ListenerTls {
            listener: "grpc",
            cert_file: dir.join("cert.pem"),
            key_file: dir.join("key.pem"),
            client_ca_file: None,
            client_auth: crate::config::ClientAuth::None,
            handshakes: crate::config::HandshakeLimits::default(),
        }
    }

    fn write_cert(dir: &std::path::Path, name: &str) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    }

    #[test]
    fn the_files_digest_is_the_loaded_digest() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "localhost");
        let tls = listener_tls(dir.path());
        assert_eq!(tls.files_digest(), tls.load().unwrap().digest);
    }

    #[test]
    fn new_files_apply_and_bad_ones_are_refused_after_a_second_look() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "localhost");
        let tls = listener_tls(dir.path());
        let mut seen = Seen {
            applied: tls.load().unwrap().digest,
            failing: None,
            refused: None,
        };
        assert!(matches!(poll(&tls, Alpn::H2, &mut seen), Poll::Unchanged));
        write_cert(dir.path(), "renewed.example");
        assert!(matches!(poll(&tls, Alpn::H2, &mut seen), Poll::Applied(..)));
        assert!(matches!(poll(&tls, Alpn::H2, &mut seen), Poll::Unchanged));
        std::fs::write(dir.path().join("key.pem"), "garbage").unwrap();
        // Seen once: maybe half-written, wait.
        assert!(matches!(poll(&tls, Alpn::H2, &mut seen), Poll::Unchanged));
        match poll(&tls, Alpn::H2, &mut seen) {
            Poll::Refused(error, _) => assert_eq!(error.path, "grpc.tls.key_file"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Reported once per content.
        assert!(matches!(poll(&tls, Alpn::H2, &mut seen), Poll::Unchanged));
        write_cert(dir.path(), "fixed.example");
        assert!(matches!(poll(&tls, Alpn::H2, &mut seen), Poll::Applied(..)));
    }
}
