//! The rustls server configuration of a listener, from its checked files.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::SingleCertAndKey;

use crate::config::{ClientAuth, ListenerTls, LoadedTls, TlsFileError};

/// The application protocol a listener speaks, offered by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/2 (`h2`): the gRPC port and the admin API.
    H2,
    /// HTTP/1.1 (`http/1.1`): metrics and the consent listener.
    Http1,
}

impl Alpn {
    /// The ALPN protocol ids offered.
    fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::H2 => vec![b"h2".to_vec()],
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
        }
    }
}

/// A server configuration over `loaded`: TLS 1.2 and 1.3 with the ring
/// provider, the listener's certificate, client certificates verified
/// against `client_ca_file` as `client_auth` says, and ALPN.
///
/// # Errors
/// The client CAs cannot make a verifier (named `<listener>.tls.client_ca_file`).
pub(super) fn server_config(
    tls: &ListenerTls,
    loaded: &LoadedTls,
    alpn: Alpn,
) -> Result<Arc<ServerConfig>, TlsFileError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsFileError {
            path: format!("{}.tls", tls.listener),
            message: format!("no TLS 1.2 or 1.3 with the ring provider: {e}"),
        })?;
    let builder = match tls.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Optional | ClientAuth::Required => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(loaded.client_cas.clone(), provider);
            let verifier = if tls.client_auth == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| TlsFileError {
                path: format!("{}.tls.client_ca_file", tls.listener),
                message: format!("cannot verify client certificates with these CAs: {e}"),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config =
        builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(loaded.certified.clone())));
    config.alpn_protocols = alpn.protocols();
    Ok(Arc::new(config))
}
