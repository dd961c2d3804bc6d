//! TLS on the gateway's own listeners (`grpc.tls`, `metrics.tls`,
//! `oauth.tls`, `admin.tls`): the raw block, its validation (every file
//! is read and checked at load, so a bad file fails the configuration and
//! `toolgate check`, not the first handshake) and the domain type the
//! listeners are built from. The listeners re-read the files when they
//! change (`crate::listen`) through [`ListenerTls::load`], the same check.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use super::fields::{Errors, at_least_one, duration};

/// A `tls:` block of a listener as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListenerTls {
    /// PEM: the listener's certificate, then its intermediates.
    pub(crate) cert_file: Option<String>,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub(crate) key_file: Option<String>,
    /// PEM: the CAs client certificates are verified against.
    pub(crate) client_ca_file: Option<String>,
    /// `none`, `optional` or `required`.
    pub(crate) client_auth: Option<String>,
    /// How long a new connection has to send its first ClientHello.
    pub(crate) client_hello_timeout: Option<String>,
    /// How long a new connection has to complete its handshake.
    pub(crate) handshake_timeout: Option<String>,
    /// Handshakes in progress at once on the listener.
    pub(crate) max_handshakes: Option<usize>,
    /// Handshakes in progress at once from one peer address.
    pub(crate) max_handshakes_per_peer: Option<usize>,
}

/// Default of `tls.client_hello_timeout`.
pub const DEFAULT_CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of `tls.handshake_timeout`.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `tls.max_handshakes`.
pub const DEFAULT_MAX_HANDSHAKES: usize = 1024;
/// Default of `tls.max_handshakes_per_peer`.
pub const DEFAULT_MAX_HANDSHAKES_PER_PEER: usize = 32;

/// How a TLS listener bounds the connections that have not finished their
/// handshake, so that idle or slow connections cannot hold every slot: a
/// peer address holds at most `per_peer` of them, the listener at most
/// `max`; a connection gets `client_hello` to send its ClientHello and
/// `timeout` for the whole handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Time from accept to a complete ClientHello.
    pub client_hello: Duration,
    /// Time from accept to a complete handshake (at least `client_hello`).
    pub timeout: Duration,
    /// Handshakes in progress at once on the listener.
    pub max: usize,
    /// Handshakes in progress at once from one peer address (an IPv4
    /// address, or an IPv6 /64).
    pub per_peer: usize,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            client_hello: DEFAULT_CLIENT_HELLO_TIMEOUT,
            timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max: DEFAULT_MAX_HANDSHAKES,
            per_peer: DEFAULT_MAX_HANDSHAKES_PER_PEER,
        }
    }
}

/// Whether a listener asks callers for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate is asked for (the default without
    /// `client_ca_file`).
    None,
    /// A client certificate is asked for and verified against
    /// `client_ca_file` when sent; a client without one still connects
    /// (the default with `client_ca_file`).
    Optional,
    /// A client without a certificate that verifies against
    /// `client_ca_file` fails the handshake.
    Required,
}

impl ClientAuth {
    /// The name as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAuth::None => "none",
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "required",
        }
    }
}

/// TLS on one listener: where its certificate, key and client CAs are.
/// The files are read at load ([`ListenerTls::load`]) and again whenever
/// they change on disk.
#[derive(Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// Which listener: `grpc`, `metrics`, `oauth` or `admin` (the
    /// `listener` label of the TLS metrics, and the start of every
    /// message's path: `grpc.tls.cert_file`).
    pub listener: &'static str,
    /// The certificate chain (leaf first), PEM.
    pub cert_file: PathBuf,
    /// The private key, PEM.
    pub key_file: PathBuf,
    /// The CA certificates client certificates are verified against, PEM.
    pub client_ca_file: Option<PathBuf>,
    /// Whether a client certificate is asked for or required.
    pub client_auth: ClientAuth,
    /// The bounds on connections still handshaking.
    pub handshakes: HandshakeLimits,
}

impl fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerTls")
            .field("listener", &self.listener)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("client_ca_file", &self.client_ca_file)
            .field("client_auth", &self.client_auth)
            .field("handshakes", &self.handshakes)
            .finish()
    }
}

/// What a listener's files hold, read and checked: the certified key and
/// the client CAs. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct LoadedTls {
    /// The certificate chain and its signing key.
    pub certified: Arc<rustls::sign::CertifiedKey>,
    /// The client CAs (empty without `client_ca_file`).
    pub client_cas: Arc<rustls::RootCertStore>,
    /// When the leaf certificate stops being valid (`notAfter`).
    pub not_after: SystemTime,
    /// A SHA-256 over the three files' contents: equal when nothing
    /// changed.
    pub digest: [u8; 32],
}

impl fmt::Debug for LoadedTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedTls")
            .field("chain", &self.certified.cert.len())
            .field("client_cas", &self.client_cas.len())
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Why a listener's files cannot be used: which field's file, and what
/// is wrong with it (never the key's contents).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TlsFileError {
    /// The field whose file is at fault (`grpc.tls.key_file`).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl ListenerTls {
    /// Reads and checks the files: the chain parses and is not expired,
    /// the key parses and matches the leaf, the client CAs parse and are
    /// usable trust anchors.
    ///
    /// # Errors
    /// The first file at fault, naming its field.
    pub fn load(&self) -> Result<LoadedTls, TlsFileError> {
        let at = |field: &str, message: String| TlsFileError {
            path: format!("{}.tls.{field}", self.listener),
            message,
        };
        let cert_bytes = read(&self.cert_file).map_err(|m| at("cert_file", m))?;
        let key_bytes = read(&self.key_file).map_err(|m| at("key_file", m))?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_bytes)
            .collect::<Result<_, _>>()
            .map_err(|e| at("cert_file", format!("not valid PEM: {e}")))?;
        if chain.is_empty() {
            return Err(at(
                "cert_file",
                format!(
                    "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                    self.cert_file.display()
                ),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|_| {
            at(
                "key_file",
                format!(
                    "{} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
                    self.key_file.display()
                ),
            )
        })?;
        let not_after = check_chain(&chain).map_err(|m| at("cert_file", m))?;
        let provider = rustls::crypto::ring::default_provider();
        let certified = rustls::sign::CertifiedKey::from_der(chain, key, &provider)
            .map_err(|e| at("key_file", format!("does not match cert_file: {e}")))?;
        let mut client_cas = rustls::RootCertStore::empty();
        let mut ca_bytes = Vec::new();
        if let Some(file) = &self.client_ca_file {
            ca_bytes = read(file).map_err(|m| at("client_ca_file", m))?;
            for cert in CertificateDer::pem_slice_iter(&ca_bytes) {
                let cert = cert.map_err(|e| at("client_ca_file", format!("not valid PEM: {e}")))?;
                client_cas.add(cert).map_err(|e| {
                    at(
                        "client_ca_file",
                        format!("a certificate is not a usable CA certificate: {e}"),
                    )
                })?;
            }
            if client_cas.is_empty() {
                return Err(at(
                    "client_ca_file",
                    format!("{} holds no PEM certificate", file.display()),
                ));
            }
        }
        Ok(LoadedTls {
            certified: Arc::new(certified),
            client_cas: Arc::new(client_cas),
            not_after,
            digest: contents_digest([Ok(&cert_bytes), Ok(&key_bytes), Ok(&ca_bytes)]),
        })
    }

    /// A SHA-256 over the three files' contents as they are now, equal to
    /// [`LoadedTls::digest`] when they load (no `client_ca_file` counts as
    /// empty). A file that cannot be read counts as its error, so a file
    /// that comes back is a change: what the listener's watcher compares.
    pub fn files_digest(&self) -> [u8; 32] {
        let read = |file: Option<&PathBuf>| {
            file.map(std::fs::read)
                .transpose()
                .map(Option::unwrap_or_default)
                .map_err(|e| e.kind())
        };
        let [cert, key, ca] = [
            read(Some(&self.cert_file)),
            read(Some(&self.key_file)),
            read(self.client_ca_file.as_ref()),
        ];
        contents_digest(
            [cert.as_deref(), key.as_deref(), ca.as_deref()].map(|part| part.map_err(|kind| *kind)),
        )
    }
}

/// The digest of a listener's three files: each one's length and bytes,
/// or, for one that could not be read, a marker and its error.
fn contents_digest(parts: [Result<&[u8], std::io::ErrorKind>; 3]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in parts {
        match part {
            Ok(bytes) => {
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(bytes);
            }
            Err(kind) => {
                h.update(u64::MAX.to_le_bytes());
                h.update(kind.to_string().as_bytes());
            }
        }
    }
    h.finalize().into()
}

/// Checks a listener's chain (leaf first): every certificate parses, the
/// leaf has not expired, and each certificate is issued by the next one
/// (issuer and subject names). Returns the leaf's `notAfter`.
fn check_chain(chain: &[CertificateDer<'_>]) -> Result<SystemTime, String> {
    let mut parsed = Vec::with_capacity(chain.len());
    for (index, der) in chain.iter().enumerate() {
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| {
            format!(
                "certificate {} of the chain is not valid X.509: {e}",
                index + 1
            )
        })?;
        parsed.push(cert);
    }
    let leaf = &parsed[0];
    let not_after = leaf.validity().not_after;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if not_after.timestamp() < now {
        return Err(format!(
            "the certificate ({}) expired on {not_after}",
            leaf.subject()
        ));
    }
    for (index, pair) in parsed.windows(2).enumerate() {
        if pair[0].issuer().as_raw() != pair[1].subject().as_raw() {
            return Err(format!(
                "the chain is not in order: certificate {} is issued by `{}`, but certificate {} \
                 is `{}` (leaf first, then each issuer)",
                index + 1,
                pair[0].issuer(),
                index + 2,
                pair[1].subject()
            ));
        }
    }
    let seconds = u64::try_from(not_after.timestamp()).unwrap_or(0);
    Ok(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(seconds))
}

/// The handshake bounds of a listener's `tls:` block, defaults where unset.
fn handshake_limits(errors: &mut Errors, listener: &str, raw: &RawListenerTls) -> HandshakeLimits {
    let path = |field: &str| format!("{listener}.tls.{field}");
    let client_hello = duration(
        errors,
        &path("client_hello_timeout"),
        raw.client_hello_timeout.as_deref(),
        DEFAULT_CLIENT_HELLO_TIMEOUT,
    );
    let timeout = duration(
        errors,
        &path("handshake_timeout"),
        raw.handshake_timeout.as_deref(),
        DEFAULT_HANDSHAKE_TIMEOUT,
    );
    if client_hello > timeout {
        errors.push(
            path("client_hello_timeout"),
            format!(
                "{} is longer than handshake_timeout ({}), which it is part of",
                humantime::format_duration(client_hello),
                humantime::format_duration(timeout)
            ),
        );
    }
    HandshakeLimits {
        client_hello,
        timeout,
        max: at_least_one(
            errors,
            &path("max_handshakes"),
            raw.max_handshakes,
            DEFAULT_MAX_HANDSHAKES,
        ),
        per_peer: at_least_one(
            errors,
            &path("max_handshakes_per_peer"),
            raw.max_handshakes_per_peer,
            DEFAULT_MAX_HANDSHAKES_PER_PEER,
        ),
    }
}

/// A file's bytes, or why it cannot be read.
fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read file {}: {}", path.display(), e.kind()))
}

/// Validates a listener's `tls:` block (`listener` is `grpc`, `metrics`,
/// `oauth` or `admin`); paths are resolved against the configuration
/// file's directory, and the files are read and checked.
pub(super) fn listener_tls(
    errors: &mut Errors,
    listener: &'static str,
    raw: RawListenerTls,
    base: &Path,
) -> Option<ListenerTls> {
    let before = errors.0.len();
    let handshakes = handshake_limits(errors, listener, &raw);
    let file = |errors: &mut Errors, field: &str, value: Option<String>, required: bool| {
        let path = format!("{listener}.tls.{field}");
        match value {
            None if required => {
                errors.push(path, "required: a PEM file");
                None
            }
            None => None,
            Some(text) if text.is_empty() => {
                errors.push(path, "needs a path");
                None
            }
            Some(text) => Some(base.join(text)),
        }
    };
    let cert_file = file(errors, "cert_file", raw.cert_file, true);
    let key_file = file(errors, "key_file", raw.key_file, true);
    let client_ca_file = file(errors, "client_ca_file", raw.client_ca_file, false);
    let client_auth = match (raw.client_auth.as_deref(), &client_ca_file) {
        (None, None) => ClientAuth::None,
        (None, Some(_)) => ClientAuth::Optional,
        (Some("none"), _) => ClientAuth::None,
        (Some(auth @ ("optional" | "required")), ca) => {
            if ca.is_none() {
                errors.push(
                    format!("{listener}.tls.client_auth"),
                    format!(
                        "`{auth}` needs `client_ca_file` (the CAs client certificates are verified against)"
                    ),
                );
            }
            if auth == "optional" {
                ClientAuth::Optional
            } else {
                ClientAuth::Required
            }
        }
        (Some(other), _) => {
            errors.push(
                format!("{listener}.tls.client_auth"),
                format!("`{other}` is not one of none, optional, required"),
            );
            ClientAuth::None
        }
    };
    if errors.0.len() != before {
        return None;
    }
    let tls = ListenerTls {
        listener,
        cert_file: cert_file?,
        key_file: key_file?,
        client_ca_file,
        client_auth,
        handshakes,
    };
    if let Err(e) = tls.load() {
        errors.push(e.path, e.message);
        return None;
    }
    Some(tls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

    /// A CA: its certificate (PEM) and issuer.
    fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), Issuer::new(params, key))
    }

    /// A leaf for `localhost` valid until the start of `until_year`.
    fn leaf(issuer: &Issuer<'_, KeyPair>, until_year: i32) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(until_year, 1, 1);
        let cert = params.signed_by(&key, issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn tls(dir: &Path, cert: &str, key: &str) -> ListenerTls {
        std::fs::write(dir.join("cert.pem"), cert).unwrap();
        std::fs::write(dir.join("key.pem"), key).unwrap();
        ListenerTls {
            listener: "admin",
            cert_file: dir.join("cert.pem"),
            key_file: dir.join("key.pem"),
            client_ca_file: None,
            client_auth: ClientAuth::None,
            handshakes: HandshakeLimits::default(),
        }
    }

    #[test]
    fn handshake_limits_default_and_are_checked() {
        let raw = |hello: Option<&str>, per_peer: Option<usize>| RawListenerTls {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            client_auth: None,
            client_hello_timeout: hello.map(str::to_owned),
            handshake_timeout: None,
            max_handshakes: None,
            max_handshakes_per_peer: per_peer,
        };
        let mut errors = Errors(Vec::new());
        let limits = handshake_limits(&mut errors, "oauth", &raw(None, None));
        assert!(errors.0.is_empty());
        assert_eq!(limits, HandshakeLimits::default());
        let limits = handshake_limits(&mut errors, "oauth", &raw(Some("1s"), Some(4)));
        assert!(errors.0.is_empty());
        assert_eq!(
            (limits.client_hello, limits.per_peer),
            (Duration::from_secs(1), 4)
        );
        handshake_limits(&mut errors, "oauth", &raw(Some("11s"), Some(0)));
        let paths: Vec<&str> = errors.0.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "oauth.tls.client_hello_timeout",
                "oauth.tls.max_handshakes_per_peer"
            ]
        );
    }

    #[test]
    fn not_after_is_the_leafs() {
        let dir = tempfile::tempdir().unwrap();
        let (_, issuer) = ca("root");
        let (cert, key) = leaf(&issuer, 2300);
        let loaded = tls(dir.path(), &cert, &key).load().unwrap();
        let year_2300 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(10_413_792_000);
        assert_eq!(loaded.not_after, year_2300);
    }

    #[test]
    fn an_expired_leaf_is_an_error_naming_cert_file() {
        let dir = tempfile::tempdir().unwrap();
        let (_, issuer) = ca("root");
        let (cert, key) = leaf(&issuer, 2021);
        let error = tls(dir.path(), &cert, &key).load().unwrap_err();
        assert_eq!(error.path, "admin.tls.cert_file");
        assert!(error.message.contains("expired"), "{error}");
    }

    #[test]
    fn a_chain_out_of_order_is_an_error_naming_cert_file() {
        let dir = tempfile::tempdir().unwrap();
        let (root_pem, _) = ca("root");
        let (other_pem, issuer) = ca("intermediate");
        let (cert, key) = leaf(&issuer, 2300);
        // In order (leaf, its issuer): loads.
        tls(dir.path(), &format!("{cert}{other_pem}"), &key)
            .load()
            .unwrap();
        // Leaf, then a certificate that did not issue it.
        let error = tls(dir.path(), &format!("{cert}{root_pem}"), &key)
            .load()
            .unwrap_err();
        assert_eq!(error.path, "admin.tls.cert_file");
        assert!(error.message.contains("not in order"), "{error}");
    }

    #[test]
    fn callers_mtls_needs_a_listener_that_asks_for_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let (ca_pem, issuer) = ca("root");
        let (cert, key) = leaf(&issuer, 2300);
        tls(dir.path(), &cert, &key);
        std::fs::write(dir.path().join("ca.pem"), ca_pem).unwrap();
        let config = |tls_extra: &str| {
            format!(
                "grpc:\n  tls:\n    cert_file: cert.pem\n    key_file: key.pem\n{tls_extra}\
                 callers:\n  mtls:\n    - tenant: '\"t\"'\ntenants: [{{name: t}}]\n"
            )
        };
        let load = |yaml: &str| {
            let env = std::collections::HashMap::<String, String>::new();
            super::super::Config::from_yaml(yaml, "t.yaml", dir.path(), &env)
                .map_err(|e| e.to_string())
        };
        let without_ca = load(&config("")).unwrap_err();
        assert!(
            without_ca.contains("callers.mtls: needs `grpc.tls` with `client_ca_file`"),
            "{without_ca}"
        );
        let none = load(&config(
            "    client_ca_file: ca.pem\n    client_auth: none\n",
        ))
        .unwrap_err();
        assert!(
            none.contains("callers.mtls: `grpc.tls.client_auth` is `none`"),
            "{none}"
        );
        load(&config("    client_ca_file: ca.pem\n")).unwrap();
        load(&config(
            "    client_ca_file: ca.pem\n    client_auth: required\n",
        ))
        .unwrap();
    }
}
