//! A verified client certificate as caller authentication reads it: the
//! leaf the TLS handshake verified against `grpc.tls.client_ca_file`,
//! turned into the CEL value `cert` that `callers.mtls` expressions see:
//!
//! | field | value |
//! | --- | --- |
//! | `cert.uri_sans` | the URI subject alternative names, in certificate order |
//! | `cert.dns_sans` | the DNS subject alternative names, in certificate order |
//! | `cert.subject` | the subject distinguished name as an RFC 4514 string (`CN=worker,O=Acme`) |
//! | `cert.spiffe_id` | `{id, trust_domain, path}` of the certificate's one `spiffe://` URI SAN, or `null` |
//!
//! A certificate has a SPIFFE ID when exactly one of its URI SANs is a
//! `spiffe://` URI and that URI is a valid SPIFFE ID (a trust domain of
//! lowercase letters, digits, `.`, `-` and `_`; path segments of letters,
//! digits, `.`, `-` and `_`, none `.` or `..`; no query, fragment, port or
//! user). Two `spiffe://` SANs, or a malformed one, give `null`: such a
//! certificate is no SVID, and an entry with a `trust_domain` never
//! matches it. The path keeps its leading `/` (`/ns/acme/sa/worker`;
//! `cert.spiffe_id.path.split("/")[2]` is the namespace).
//!
//! What is kept of a certificate is these fields and its SHA-256
//! fingerprint, never the certificate itself.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
use x509_parser::x509::{AttributeTypeAndValue, X509Name};

/// The URI scheme of a SPIFFE ID, with its separator.
const SPIFFE_SCHEME: &str = "spiffe://";

/// A certificate's SPIFFE ID (`spiffe://<trust_domain><path>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpiffeId {
    /// The whole ID, as in the certificate.
    pub id: String,
    /// The trust domain (`cluster.local`).
    pub trust_domain: String,
    /// The path, with its leading `/` (`/ns/acme/sa/worker`); empty when
    /// the ID names the trust domain itself.
    pub path: String,
}

impl SpiffeId {
    /// Parses a `spiffe://` URI as the SPIFFE ID standard defines it;
    /// `None` when it is not one.
    pub fn parse(uri: &str) -> Option<Self> {
        let rest = uri.strip_prefix(SPIFFE_SCHEME)?;
        let (trust_domain, path) = match rest.find('/') {
            Some(slash) => rest.split_at(slash),
            None => (rest, ""),
        };
        let domain_ok = !trust_domain.is_empty()
            && trust_domain.len() <= 255
            && trust_domain.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
            });
        let path_ok = path.is_empty()
            || path[1..].split('/').all(|segment| {
                !segment.is_empty()
                    && segment != "."
                    && segment != ".."
                    && segment
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
            });
        (domain_ok && path_ok && uri.len() <= 2048).then(|| Self {
            id: uri.to_owned(),
            trust_domain: trust_domain.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// Why a peer certificate cannot be read (the handshake verified it, so
/// this means a certificate this parser does not understand).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the client certificate cannot be read: {0}")]
pub struct UnreadableCertificate(String);

/// What caller authentication knows of a verified client certificate:
/// the fields `callers.mtls` expressions see, and the fingerprint that
/// names the certificate in audit records. Never the certificate itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificate {
    uri_sans: Vec<String>,
    dns_sans: Vec<String>,
    subject: String,
    spiffe_id: Option<SpiffeId>,
    sha256: [u8; 32],
    not_after: SystemTime,
}

impl PeerCertificate {
    /// Reads the leaf certificate `der` (DER) the handshake verified.
    ///
    /// # Errors
    /// The bytes are not an X.509 certificate x509-parser reads, or its
    /// subject alternative name extension is malformed.
    pub fn from_der(der: &[u8]) -> Result<Self, UnreadableCertificate> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| UnreadableCertificate(e.to_string()))?;
        let mut uri_sans = Vec::new();
        let mut dns_sans = Vec::new();
        let sans = cert
            .subject_alternative_name()
            .map_err(|e| UnreadableCertificate(format!("subject alternative names: {e}")))?;
        for name in sans.iter().flat_map(|ext| ext.value.general_names.iter()) {
            match name {
                GeneralName::URI(uri) => uri_sans.push((*uri).to_owned()),
                GeneralName::DNSName(dns) => dns_sans.push((*dns).to_owned()),
                _ => {}
            }
        }
        let mut spiffe = uri_sans.iter().filter(|u| u.starts_with(SPIFFE_SCHEME));
        let spiffe_id = match (spiffe.next(), spiffe.next()) {
            (Some(only), None) => SpiffeId::parse(only),
            _ => None,
        };
        Ok(Self {
            subject: rfc4514(cert.subject()),
            uri_sans,
            dns_sans,
            spiffe_id,
            sha256: Sha256::digest(der).into(),
            not_after: UNIX_EPOCH
                + Duration::from_secs(
                    u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0),
                ),
        })
    }

    /// The certificate's SPIFFE ID, if it has one.
    pub fn spiffe_id(&self) -> Option<&SpiffeId> {
        self.spiffe_id.as_ref()
    }

    /// The subject distinguished name (RFC 4514).
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// When the certificate stops being valid (its notAfter): a stream
    /// authenticated by it ends then.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Lowercase hex SHA-256 of the certificate (DER).
    pub fn fingerprint(&self) -> String {
        hex::encode(self.sha256)
    }

    /// What names the certificate's holder in logs and audit records: its
    /// SPIFFE ID, else its subject DN.
    pub fn name(&self) -> &str {
        self.spiffe_id
            .as_ref()
            .map_or(self.subject.as_str(), |s| s.id.as_str())
    }

    /// The CEL value `cert` (see the module documentation).
    pub fn to_cel(&self) -> serde_json::Value {
        serde_json::json!({
            "uri_sans": self.uri_sans,
            "dns_sans": self.dns_sans,
            "subject": self.subject,
            "spiffe_id": self.spiffe_id.as_ref().map(|s| serde_json::json!({
                "id": s.id,
                "trust_domain": s.trust_domain,
                "path": s.path,
            })),
        })
    }
}

/// `name` as an RFC 4514 string: the RDNs last first, joined by `,`;
/// the attributes of a multi-valued RDN joined by `+`; the short names of
/// RFC 4514 (`CN`, `O`, ...), else the dotted OID; string values escaped,
/// other values `#` and the hex of their content octets. How `cert.subject`
/// and `toolgate check` write a certificate's subject.
pub fn rfc4514(name: &X509Name<'_>) -> String {
    let rdns: Vec<String> = name
        .iter()
        .map(|rdn| rdn.iter().map(attribute).collect::<Vec<String>>().join("+"))
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// One `type=value` of an RFC 4514 string.
fn attribute(attr: &AttributeTypeAndValue<'_>) -> String {
    use x509_parser::oid_registry as oids;
    let oid = attr.attr_type();
    let short = [
        (oids::OID_X509_COMMON_NAME, "CN"),
        (oids::OID_X509_LOCALITY_NAME, "L"),
        (oids::OID_X509_STATE_OR_PROVINCE_NAME, "ST"),
        (oids::OID_X509_ORGANIZATION_NAME, "O"),
        (oids::OID_X509_ORGANIZATIONAL_UNIT, "OU"),
        (oids::OID_X509_COUNTRY_NAME, "C"),
        (oids::OID_X509_STREET_ADDRESS, "STREET"),
        (oids::OID_DOMAIN_COMPONENT, "DC"),
        (oids::OID_USERID, "UID"),
    ]
    .into_iter()
    .find(|(known, _)| known == oid)
    .map_or_else(|| oid.to_id_string(), |(_, short)| short.to_owned());
    let value = match attr.as_str() {
        Ok(text) => escape(text),
        Err(_) => format!("#{}", hex::encode(attr.attr_value().as_bytes())),
    };
    format!("{short}={value}")
}

/// An attribute value escaped as RFC 4514 section 2.4 asks.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (index, c) in value.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '#' if index == 0 => out.push_str("\\#"),
            ' ' if index == 0 || index == last => out.push_str("\\ "),
            '\0' => out.push_str("\\00"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(params: rcgen::CertificateParams) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn with_sans(sans: &[rcgen::SanType]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = sans.to_vec();
        issue(params)
    }

    fn uri(text: &str) -> rcgen::SanType {
        rcgen::SanType::URI(text.try_into().unwrap())
    }

    #[test]
    fn spiffe_ids_parse_as_the_standard_says() {
        let id = SpiffeId::parse("spiffe://cluster.local/ns/acme/sa/worker").unwrap();
        assert_eq!(id.trust_domain, "cluster.local");
        assert_eq!(id.path, "/ns/acme/sa/worker");
        assert_eq!(id.id, "spiffe://cluster.local/ns/acme/sa/worker");
        assert_eq!(SpiffeId::parse("spiffe://example.org").unwrap().path, "");
        for bad in [
            "spiffe://",
            "spiffe:///path",
            "spiffe://Cluster.local/x",
            "spiffe://cluster.local:8443/x",
            "spiffe://user@cluster.local/x",
            "spiffe://cluster.local/",
            "spiffe://cluster.local//x",
            "spiffe://cluster.local/a/../b",
            "spiffe://cluster.local/a/./b",
            "spiffe://cluster.local/x?q=1",
            "spiffe://cluster.local/x#f",
            "https://cluster.local/x",
        ] {
            assert_eq!(SpiffeId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_spiffe_certificate_becomes_the_cel_value() {
        let der = with_sans(&[
            rcgen::SanType::DnsName("worker.acme.svc".try_into().unwrap()),
            uri("spiffe://cluster.local/ns/acme/sa/worker"),
            uri("https://worker.example/"),
        ]);
        let cert = PeerCertificate::from_der(&der).unwrap();
        assert_eq!(
            cert.to_cel(),
            serde_json::json!({
                "uri_sans": ["spiffe://cluster.local/ns/acme/sa/worker", "https://worker.example/"],
                "dns_sans": ["worker.acme.svc"],
                "subject": "CN=rcgen self signed cert",
                "spiffe_id": {
                    "id": "spiffe://cluster.local/ns/acme/sa/worker",
                    "trust_domain": "cluster.local",
                    "path": "/ns/acme/sa/worker",
                },
            })
        );
        assert_eq!(cert.name(), "spiffe://cluster.local/ns/acme/sa/worker");
        assert_eq!(cert.fingerprint(), hex::encode(Sha256::digest(&der)));
    }

    #[test]
    fn two_spiffe_sans_or_a_malformed_one_are_no_spiffe_id() {
        let two = with_sans(&[
            uri("spiffe://cluster.local/ns/a/sa/x"),
            uri("spiffe://cluster.local/ns/b/sa/y"),
        ]);
        let two = PeerCertificate::from_der(&two).unwrap();
        assert_eq!(two.spiffe_id(), None);
        assert_eq!(two.to_cel()["spiffe_id"], serde_json::Value::Null);
        let bad = PeerCertificate::from_der(&with_sans(&[uri("spiffe://Upper/x")])).unwrap();
        assert_eq!(bad.spiffe_id(), None);
        assert_eq!(
            bad.to_cel()["uri_sans"],
            serde_json::json!(["spiffe://Upper/x"])
        );
        assert!(PeerCertificate::from_der(b"not a certificate").is_err());
    }

    #[test]
    fn the_subject_is_an_rfc_4514_string() {
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CountryName, "DE");
        dn.push(rcgen::DnType::OrganizationName, "Acme, Inc.");
        dn.push(rcgen::DnType::OrganizationalUnitName, " ops");
        dn.push(rcgen::DnType::CommonName, "#worker+1 ");
        params.distinguished_name = dn;
        let cert = PeerCertificate::from_der(&issue(params)).unwrap();
        // Last RDN first; `,`, `+`, a leading `#` and the edge spaces escaped.
        assert_eq!(
            cert.subject(),
            r"CN=\#worker\+1\ ,OU=\ ops,O=Acme\, Inc.,C=DE"
        );
        assert_eq!(cert.name(), cert.subject());
    }
}
