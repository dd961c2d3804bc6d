//! Configuration reload: on SIGHUP, or when the config file's content
//! changes (polled, which also catches the symlink swap Kubernetes uses to
//! update a mounted ConfigMap). A new configuration is validated first; an
//! invalid one is logged and counted, and the gateway keeps serving the
//! old one. A valid one is applied by [`Registry::apply`] with the tenants
//! of its `tenants_dir`, each file read and validated against it again
//! ([`TenantSources::reload`]); a refused one still rescans the directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::Registry;
use super::tenants_dir::TenantSources;
use crate::config::{Config, Environment};
use crate::telemetry::Metrics;

/// How often the config file's content is checked.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Where the configuration comes from, for reloads.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    /// The config file (symlinks are followed on every read).
    pub path: PathBuf,
    /// The environment secret sources read from.
    pub env: Arc<dyn Environment>,
}

fn digest(path: &std::path::Path) -> Option<[u8; 32]> {
    std::fs::read(path)
        .ok()
        .map(|bytes| Sha256::digest(&bytes).into())
}

/// Watches for reload triggers until `stop` is cancelled. `initial` is
/// the configuration in force (its tenants are not needed); `sources` holds
/// the tenants of the file and of `tenants_dir` the registry is built from.
pub async fn watch(
    source: ConfigSource,
    initial: Config,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    sources: Arc<TenantSources>,
    stop: CancellationToken,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => Some(hangup),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP handler; reloading on file changes only");
            None
        }
    };
    let mut seen = digest(&source.path);
    let mut applied = initial;
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let trigger = tokio::select! {
            () = stop.cancelled() => return,
            Some(()) = next_hangup(&mut hangup) => "SIGHUP",
            _ = poll.tick() => {
                let now = digest(&source.path);
                if now == seen || now.is_none() {
                    continue;
                }
                seen = now;
                "file change"
            }
        };
        seen = digest(&source.path).or(seen);
        match Config::load(&source.path, source.env.as_ref()) {
            Err(error) => {
                tracing::error!(%trigger, %error, "configuration reload refused; still serving the previous configuration");
                metrics.config_reload(false);
                // The directory's changes still apply.
                let (s, r) = (sources.clone(), registry.clone());
                // Raced with the stop: a read stuck in the file system
                // does not hold up the shutdown.
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tokio::task::spawn_blocking(move || s.rescan(&r)) => {}
                }
            }
            Ok(mut config) => {
                // Only the restart-only settings are compared later.
                let tenants = std::mem::take(&mut config.tenants);
                let settings = config.clone();
                config.tenants = tenants;
                config.log_warnings();
                let (s, r) = (sources.clone(), registry.clone());
                let reloaded = tokio::select! {
                    () = stop.cancelled() => return,
                    reloaded = tokio::task::spawn_blocking(move || s.reload(config, &r)) => reloaded,
                };
                let Ok(summary) = reloaded else {
                    continue;
                };
                let config = settings;
                tracing::info!(
                    %trigger,
                    tenants_added = ?summary.tenants_added,
                    tenants_removed = ?summary.tenants_removed,
                    servers_started = ?summary.servers_started,
                    servers_retired = ?summary.servers_retired,
                    servers_kept = summary.servers_kept.len(),
                    "configuration reloaded"
                );
                metrics.config_reload(true);
                for (what, changed) in [
                    ("listen", config.listen != applied.listen),
                    ("metrics", config.metrics_listen != applied.metrics_listen),
                    ("grpc", config.grpc != applied.grpc),
                    ("reflection", config.reflection != applied.reflection),
                    (
                        "shutdown_delay",
                        config.shutdown_delay != applied.shutdown_delay,
                    ),
                    (
                        "shutdown_grace",
                        config.shutdown_grace != applied.shutdown_grace,
                    ),
                    ("log_format", config.log_format != applied.log_format),
                    (
                        "limits.max_message_bytes",
                        config.limits.max_message_bytes != applied.limits.max_message_bytes,
                    ),
                    ("state", state_changed(&config, &applied)),
                    ("oauth", oauth_listener(&config) != oauth_listener(&applied)),
                    ("audit", config.audit != applied.audit),
                    // The listeners' TLS blocks (their files are watched
                    // by the listeners themselves).
                    ("metrics.tls", config.metrics_tls != applied.metrics_tls),
                    (
                        "oauth.tls",
                        config.oauth.as_ref().map(|o| &o.tls)
                            != applied.oauth.as_ref().map(|o| &o.tls),
                    ),
                    (
                        "admin.tls",
                        config.admin.as_ref().map(|a| &a.tls)
                            != applied.admin.as_ref().map(|a| &a.tls),
                    ),
                ] {
                    if changed {
                        tracing::warn!(
                            setting = what,
                            "this setting changed but takes effect only after a restart"
                        );
                    }
                }
                applied = config;
            }
        }
    }
}

/// Whether the state store's URL or keys changed (read at start only).
fn state_changed(new: &Config, old: &Config) -> bool {
    let keys = |c: &Config| -> Vec<String> {
        c.state.keys.iter().map(|k| k.expose().to_owned()).collect()
    };
    new.state.url() != old.state.url() || keys(new) != keys(old)
}

/// The consent listener's settings (bound at start only).
fn oauth_listener(config: &Config) -> Option<(std::net::SocketAddr, String, bool)> {
    config.oauth.as_ref().map(|o| {
        (
            o.listen,
            o.public_url.to_string(),
            o.allow_private_addresses,
        )
    })
}

/// The next SIGHUP; never, when no SIGHUP handler could be installed.
pub(crate) async fn next_hangup(hangup: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hangup.as_mut() {
        Some(h) => h.recv().await,
        None => std::future::pending().await,
    }
}
