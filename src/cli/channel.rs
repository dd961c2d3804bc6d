//! The channel the client verbs (`tools`, `call`, `resources`, `prompts`,
//! `tenants`) open to a gateway: plaintext to an `http://` address (or a
//! bare `host:port`), TLS to an `https://` one or whenever `--ca-file` is
//! given. The server's certificate is checked against `--ca-file`, else
//! the system's roots; `--cert-file` with `--key-file` presents a client
//! certificate (a listener with `client_auth`, a `callers.mtls` caller).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How long connecting (TCP and TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS options of a client verb.
#[derive(Debug, Clone, Default, Args)]
pub(super) struct ClientTls {
    /// A PEM file of the CA certificates the gateway's certificate is
    /// checked against (implies TLS). Without it, an `https://` address
    /// is checked against the system's roots.
    #[arg(long, env = "TOOLGATE_CA_FILE")]
    pub(super) ca_file: Option<PathBuf>,
    /// A PEM file of the client certificate (and its intermediates) to
    /// present; needs --key-file.
    #[arg(long, env = "TOOLGATE_CERT_FILE", requires = "key_file")]
    pub(super) cert_file: Option<PathBuf>,
    /// A PEM file of the client certificate's private key; needs
    /// --cert-file.
    #[arg(long, env = "TOOLGATE_KEY_FILE", requires = "cert_file")]
    pub(super) key_file: Option<PathBuf>,
    /// The name the gateway's certificate must be valid for, when it is
    /// not the host of --addr (a probe connecting to 127.0.0.1 checks the
    /// Service's name).
    #[arg(long, env = "TOOLGATE_SERVER_NAME")]
    pub(super) server_name: Option<String>,
}

/// Why no channel could be opened: a usage error (exit 2: an address or
/// file that is not right) or the gateway could not be reached.
#[derive(Debug)]
pub(super) enum ChannelError {
    /// The address or a TLS file is not usable.
    Usage(String),
    /// Connecting failed.
    Unavailable(String),
}

/// Opens a channel to `addr` (`what` names it in messages: "the gateway",
/// "the admin API").
pub(super) async fn open(addr: &str, tls: &ClientTls, what: &str) -> Result<Channel, ChannelError> {
    let endpoint = endpoint(addr, tls)?;
    endpoint
        .connect()
        .await
        .map_err(|e| ChannelError::Unavailable(format!("cannot connect to {what}: {}", chain(&e))))
}

/// The endpoint for `addr` with its TLS settings.
fn endpoint(addr: &str, tls: &ClientTls) -> Result<Endpoint, ChannelError> {
    let wants_tls = addr.starts_with("https://") || tls.ca_file.is_some();
    let url = match addr.split_once("://") {
        Some(("http", _)) if tls.ca_file.is_some() => {
            return Err(ChannelError::Usage(
                "--ca-file asks for TLS, but --addr is http://; use https://".to_owned(),
            ));
        }
        Some(("http" | "https", _)) => addr.to_owned(),
        Some((scheme, _)) => {
            return Err(ChannelError::Usage(format!(
                "--addr: `{scheme}://` is neither http:// nor https://"
            )));
        }
        None if wants_tls => format!("https://{addr}"),
        None => format!("http://{addr}"),
    };
    if !wants_tls && (tls.cert_file.is_some() || tls.server_name.is_some()) {
        return Err(ChannelError::Usage(
            "--cert-file and --server-name are for TLS: use an https:// --addr (and --ca-file \
             unless the system's roots apply)"
                .to_owned(),
        ));
    }
    let mut endpoint = Endpoint::from_shared(url)
        .map_err(|e| ChannelError::Usage(format!("--addr: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT);
    if wants_tls {
        let mut config = ClientTlsConfig::new();
        config = match &tls.ca_file {
            Some(file) => config.ca_certificate(Certificate::from_pem(read("--ca-file", file)?)),
            None => config.with_native_roots(),
        };
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            config = config.identity(Identity::from_pem(
                read("--cert-file", cert)?,
                read("--key-file", key)?,
            ));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| ChannelError::Usage(format!("TLS settings: {}", chain(&e))))?;
    }
    Ok(endpoint)
}

/// A file's bytes, or a usage error naming the option.
fn read(option: &str, path: &Path) -> Result<Vec<u8>, ChannelError> {
    std::fs::read(path)
        .map_err(|e| ChannelError::Usage(format!("cannot read {option} {}: {e}", path.display())))
}

/// An error and its sources, on one line (tonic's transport errors say
/// only "transport error" at the top).
fn chain(error: &dyn std::error::Error) -> String {
    with_sources(&error.to_string(), error.source())
}

/// `text`, then each of `source`'s chain after a colon (a part that only
/// repeats the text before it is left out).
pub(super) fn with_sources(text: &str, mut source: Option<&dyn std::error::Error>) -> String {
    let mut text = text.to_owned();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(addr: &str, tls: &ClientTls) -> Result<String, String> {
        match endpoint(addr, tls) {
            Ok(e) => Ok(e.uri().to_string()),
            Err(ChannelError::Usage(m) | ChannelError::Unavailable(m)) => Err(m),
        }
    }

    #[test]
    fn the_scheme_and_ca_file_choose_tls() {
        let none = ClientTls::default();
        assert_eq!(url("127.0.0.1:1", &none).unwrap(), "http://127.0.0.1:1/");
        assert_eq!(
            url("https://127.0.0.1:1", &none).unwrap(),
            "https://127.0.0.1:1/"
        );
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, crate::config::test_certs::CA_1).unwrap();
        let with_ca = ClientTls {
            ca_file: Some(ca),
            ..ClientTls::default()
        };
        assert_eq!(
            url("127.0.0.1:1", &with_ca).unwrap(),
            "https://127.0.0.1:1/"
        );
        assert!(
            url("http://127.0.0.1:1", &with_ca)
                .unwrap_err()
                .contains("use https://")
        );
        assert!(
            url("ftp://x:1", &none)
                .unwrap_err()
                .contains("neither http")
        );
        let missing = ClientTls {
            ca_file: Some(dir.path().join("missing.pem")),
            ..ClientTls::default()
        };
        assert!(
            url("https://127.0.0.1:1", &missing)
                .unwrap_err()
                .contains("--ca-file")
        );
    }
}
