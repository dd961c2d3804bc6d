//! What `toolgate check` prints of a listener's certificate.

use std::time::SystemTime;

use x509_parser::extensions::GeneralName;

use crate::config::LoadedTls;

/// The leaf certificate of a listener, as an operator reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSummary {
    /// The subject (RFC 4514, as `callers.mtls` expressions see it).
    pub subject: String,
    /// The subject alternative names (`DNS:…`, `IP:…`, `URI:…`).
    pub sans: Vec<String>,
    /// When it stops being valid.
    pub not_after: SystemTime,
}

/// The subject and SANs of `loaded`'s leaf (its `not_after` is the one
/// checked at load).
///
/// # Errors
/// The leaf does not parse (it did at load, so only if it changed type).
pub fn describe_leaf(loaded: &LoadedTls) -> Result<LeafSummary, String> {
    let leaf = loaded
        .certified
        .cert
        .first()
        .ok_or_else(|| "no certificate".to_owned())?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| format!("not valid X.509: {e}"))?;
    let mut sans = Vec::new();
    if let Ok(Some(extension)) = cert.subject_alternative_name() {
        for name in &extension.value.general_names {
            match name {
                GeneralName::DNSName(dns) => sans.push(format!("DNS:{dns}")),
                GeneralName::URI(uri) => sans.push(format!("URI:{uri}")),
                GeneralName::RFC822Name(mail) => sans.push(format!("email:{mail}")),
                GeneralName::IPAddress(bytes) => sans.push(format!("IP:{}", ip(bytes))),
                _ => {}
            }
        }
    }
    Ok(LeafSummary {
        subject: crate::callers::rfc4514(cert.subject()),
        sans,
        not_after: loaded.not_after,
    })
}

/// An IP SAN's bytes as an address (hex when neither v4 nor v6).
fn ip(bytes: &[u8]) -> String {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        std::net::Ipv4Addr::from(v4).to_string()
    } else if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        std::net::Ipv6Addr::from(v6).to_string()
    } else {
        hex::encode(bytes)
    }
}
