//! `toolgate check`: the certificate of each TLS listener (subject, SANs,
//! expiry), with a warning when it expires soon, and the callers
//! identified by their certificates. Bad files never get here:
//! configuration load already refused them, naming the field.

use std::time::{Duration, SystemTime};

use crate::config::{Config, ListenerTls};

/// A certificate expiring within this long gets a warning.
pub(super) const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// Every listener's TLS block, in the order the listeners are documented.
fn listeners(config: &Config) -> Vec<&ListenerTls> {
    [
        config.grpc.tls.as_ref(),
        config.metrics_tls.as_ref(),
        config.oauth.as_ref().and_then(|o| o.tls.as_ref()),
        config.admin.as_ref().and_then(|a| a.tls.as_ref()),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Prints a line per TLS listener, and a warning for a certificate that
/// expires within [`EXPIRY_WARNING`].
pub(super) fn check_listener_tls(config: &Config) {
    for tls in listeners(config) {
        let summary = tls
            .load()
            .map_err(|e| e.to_string())
            .and_then(|loaded| crate::listen::describe_leaf(&loaded));
        let summary = match summary {
            Ok(summary) => summary,
            // The files changed since the configuration was read.
            Err(error) => {
                println!("warning: {}.tls: {error}", tls.listener);
                continue;
            }
        };
        let not_after = humantime::format_rfc3339_seconds(summary.not_after);
        let sans = if summary.sans.is_empty() {
            "none".to_owned()
        } else {
            summary.sans.join(", ")
        };
        println!(
            "tls {}: subject {}, SANs {sans}, expires {not_after}, client_auth {}",
            tls.listener,
            summary.subject,
            tls.client_auth.as_str()
        );
        let left = summary
            .not_after
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        if left < EXPIRY_WARNING {
            println!(
                "warning: {}.tls.cert_file: the certificate expires in {} day(s) ({not_after}): \
                 renew it ({})",
                tls.listener,
                left.as_secs() / 86_400,
                tls.cert_file.display()
            );
        }
    }
}

/// Prints a line per `callers.mtls` entry: which certificates it matches,
/// its expressions, and the CA file certificates are verified against.
pub(super) fn check_cert_callers(config: &Config) {
    let ca_file = config
        .grpc
        .tls
        .as_ref()
        .and_then(|tls| tls.client_ca_file.as_ref());
    for entry in &config.callers.mtls {
        let matches = match &entry.trust_domain {
            Some(domain) => format!("SPIFFE IDs of trust domain {domain}"),
            None => "any verified certificate".to_owned(),
        };
        println!(
            "{}: {matches}, tenant `{}`, subject `{}`, verified against {}",
            entry.path,
            entry.tenant.source(),
            entry.subject.source(),
            ca_file.map_or_else(|| "nothing".to_owned(), |f| f.display().to_string())
        );
    }
}
