//! Callers identified by a verified client certificate (`callers.mtls`):
//! the first entry whose `trust_domain` matches the certificate's SPIFFE
//! ID (an entry without one matches any verified certificate) names the
//! caller's tenant and subject with its CEL expressions over `cert`
//! ([`super::cert`]).

use std::sync::{Arc, Mutex};

use hashlink::LruCache;
use sha2::{Digest, Sha256};

use super::cert::{PeerCertificate, UnreadableCertificate};
use super::{CallerIdentity, Namespace, Subject, quoted};
use crate::config::{CallersConfig, MtlsCaller};

/// Why a client certificate does not authenticate its caller. Never holds
/// the certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// The verified certificate cannot be read.
    #[error(transparent)]
    Unreadable(#[from] UnreadableCertificate),
    /// No `callers.mtls` entry matches the certificate (another trust
    /// domain, or no SPIFFE ID while every entry names a trust domain).
    #[error("{0}")]
    Unmatched(String),
    /// The entry's tenant expression fails, or gives no string.
    #[error("{0}")]
    TenantInvalid(String),
    /// The tenant expression names no configured tenant.
    #[error("{0}")]
    TenantUnknown(String),
    /// The entry's subject expression fails, or names an invalid subject.
    #[error("{0}")]
    SubjectInvalid(String),
    /// The certificate of a long-lived stream's caller has expired since
    /// the stream began (its connection's handshake verified it then).
    #[error("{0}")]
    Expired(String),
    /// The call's bearer token is of another tenant than the one its
    /// connection's certificate names.
    #[error("{0}")]
    Conflict(String),
}

/// What a matching `callers.mtls` entry says of a certificate.
#[derive(Debug, Clone)]
pub struct VerifiedCert {
    /// The tenant name the tenant expression gave (not yet looked up).
    pub tenant: String,
    /// The subject the subject expression gave, keyed under the
    /// certificate's trust domain.
    pub subject: Subject,
    /// The caller's identity (its SPIFFE ID or subject DN, fingerprint).
    pub identity: CallerIdentity,
    /// The entry that matched (`callers.mtls[0]`).
    pub path: String,
}

/// Certificates one configuration's entries keep recognized, the most
/// recently seen first: a worker's calls on one connection (and its other
/// connections) present the same certificate, which is then read and its
/// expressions run once, not on every call.
pub const RECOGNIZED_CERTIFICATES: usize = 4096;

/// A certificate read and matched against one configuration's entries.
#[derive(Debug)]
pub struct Recognized {
    /// The certificate's fields.
    pub certificate: Arc<PeerCertificate>,
    /// The `cert` value its expressions saw (the caller's claims).
    pub claims: Arc<serde_json::Value>,
    /// What the first matching entry says of it, or why it names nobody.
    pub identity: Result<VerifiedCert, CertError>,
}

/// The `callers.mtls` entries of one configuration, in file order, and the
/// certificates they recognized (by SHA-256 of the DER; at most
/// [`RECOGNIZED_CERTIFICATES`], dropped with the configuration).
#[derive(Debug, Clone)]
pub struct CertCallers {
    entries: Arc<[MtlsCaller]>,
    recognized: Arc<Mutex<LruCache<[u8; 32], Arc<Recognized>>>>,
}

impl Default for CertCallers {
    fn default() -> Self {
        Self::from_entries(Vec::new())
    }
}

impl CertCallers {
    /// The entries of `config`.
    pub fn new(config: &CallersConfig) -> Self {
        Self::from_entries(config.mtls.clone())
    }

    fn from_entries(entries: Vec<MtlsCaller>) -> Self {
        Self {
            entries: entries.into(),
            recognized: Arc::new(Mutex::new(LruCache::new(RECOGNIZED_CERTIFICATES))),
        }
    }

    /// The verified leaf `der` read and matched ([`CertCallers::identify`]),
    /// once per certificate and configuration.
    ///
    /// # Errors
    /// The certificate cannot be read.
    pub fn recognize(&self, der: &[u8]) -> Result<Arc<Recognized>, CertError> {
        let digest: [u8; 32] = Sha256::digest(der).into();
        if let Some(hit) = self.lock().get(&digest) {
            return Ok(hit.clone());
        }
        let certificate = Arc::new(PeerCertificate::from_der(der)?);
        let claims = Arc::new(certificate.to_cel());
        let recognized = Arc::new(Recognized {
            identity: self.identify_with(&certificate, &claims),
            claims,
            certificate,
        });
        self.lock().insert(digest, recognized.clone());
        Ok(recognized)
    }

    /// The cache, whatever a panicking holder left (it holds no invariant
    /// beyond its entries).
    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<[u8; 32], Arc<Recognized>>> {
        self.recognized
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether no entry is configured (certificates name no caller).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tenant and subject the first matching entry names for `cert`.
    ///
    /// # Errors
    /// No entry matches ([`CertError::Unmatched`]), or its expressions
    /// fail or give no tenant name or valid subject.
    pub fn identify(&self, cert: &PeerCertificate) -> Result<VerifiedCert, CertError> {
        self.identify_with(cert, &cert.to_cel())
    }

    /// [`CertCallers::identify`] with `value`, the certificate's `cert`.
    fn identify_with(
        &self,
        cert: &PeerCertificate,
        value: &serde_json::Value,
    ) -> Result<VerifiedCert, CertError> {
        let spiffe = cert.spiffe_id();
        let entry = self
            .entries
            .iter()
            .find(|entry| match &entry.trust_domain {
                None => true,
                Some(domain) => spiffe.is_some_and(|id| id.trust_domain == *domain),
            })
            .ok_or_else(|| {
                CertError::Unmatched(match spiffe {
                    Some(id) => format!(
                        "the client certificate's SPIFFE ID `{}` is of trust domain `{}`, which no \
                         callers.mtls[].trust_domain accepts",
                        quoted(&id.id),
                        quoted(&id.trust_domain)
                    ),
                    None => "the client certificate has no SPIFFE ID (one spiffe:// URI SAN) and \
                             every callers.mtls entry names a trust_domain"
                        .to_owned(),
                })
            })?;
        let path = &entry.path;
        let tenant = super::expressions::tenant(&entry.tenant, value, path, "certificate")
            .map_err(CertError::TenantInvalid)?;
        let trust_domain = spiffe.map_or("", |id| id.trust_domain.as_str());
        let subject = super::expressions::subject(
            &entry.subject,
            value,
            path,
            "certificate",
            Namespace::Certificate(trust_domain),
        )
        .map_err(CertError::SubjectInvalid)?;
        Ok(VerifiedCert {
            tenant,
            subject,
            identity: CallerIdentity::Certificate {
                trust_domain: trust_domain.to_owned(),
                id: cert.name().to_owned(),
                sha256: cert.fingerprint(),
            },
            path: path.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClaimExpression;

    fn entry(index: usize, domain: Option<&str>, tenant: &str, subject: &str) -> MtlsCaller {
        MtlsCaller {
            trust_domain: domain.map(str::to_owned),
            tenant: ClaimExpression::compile_cert(tenant).unwrap(),
            subject: ClaimExpression::compile_cert(subject).unwrap(),
            path: format!("callers.mtls[{index}]"),
        }
    }

    fn callers(entries: Vec<MtlsCaller>) -> CertCallers {
        CertCallers::from_entries(entries)
    }

    fn cert(uris: &[&str], cn: &str) -> PeerCertificate {
        PeerCertificate::from_der(&cert_der(uris, cn)).unwrap()
    }

    fn cert_der(uris: &[&str], cn: &str) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI((*u).try_into().unwrap()))
            .collect();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, cn);
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_is_read_and_matched_once_per_configuration() {
        let entries = || vec![entry(0, Some("cluster.local"), NAMESPACE, DEFAULT_SUBJECT)];
        let config = callers(entries());
        let acme = cert_der(&["spiffe://cluster.local/ns/acme/sa/worker"], "w");
        let first = config.recognize(&acme).unwrap();
        assert_eq!(first.identity.as_ref().unwrap().tenant, "acme");
        assert_eq!(first.claims["spiffe_id"]["path"], "/ns/acme/sa/worker");
        // The same certificate again: the same reading, not a new one.
        assert!(Arc::ptr_eq(&first, &config.recognize(&acme).unwrap()));
        assert!(Arc::ptr_eq(
            &first,
            &config.clone().recognize(&acme).unwrap()
        ));
        // Another certificate is its own; a refusal is kept as well.
        let other = cert_der(&["spiffe://elsewhere.example/ns/acme/sa/worker"], "w");
        let refused = config.recognize(&other).unwrap();
        assert!(matches!(refused.identity, Err(CertError::Unmatched(_))));
        assert!(Arc::ptr_eq(&refused, &config.recognize(&other).unwrap()));
        // Another configuration reads it anew.
        assert!(!Arc::ptr_eq(
            &first,
            &callers(entries()).recognize(&acme).unwrap()
        ));
        // Not a certificate: unreadable, and nothing kept.
        assert!(matches!(
            config.recognize(b"not der"),
            Err(CertError::Unreadable(_))
        ));
    }

    const NAMESPACE: &str = r#"cert.spiffe_id.path.split("/")[2]"#;
    const DEFAULT_SUBJECT: &str = crate::config::DEFAULT_CERT_SUBJECT_EXPRESSION;

    #[test]
    fn the_worked_example_names_the_namespace_and_the_spiffe_id() {
        let callers = callers(vec![entry(
            0,
            Some("cluster.local"),
            NAMESPACE,
            DEFAULT_SUBJECT,
        )]);
        let worker = cert(&["spiffe://cluster.local/ns/acme/sa/worker"], "worker");
        let verified = callers.identify(&worker).unwrap();
        assert_eq!(verified.tenant, "acme");
        assert_eq!(
            verified.subject.id(),
            Some("spiffe://cluster.local/ns/acme/sa/worker")
        );
        assert_eq!(
            verified.subject.key(),
            "cert:cluster.local spiffe://cluster.local/ns/acme/sa/worker"
        );
        assert_eq!(
            verified.identity,
            CallerIdentity::Certificate {
                trust_domain: "cluster.local".to_owned(),
                id: "spiffe://cluster.local/ns/acme/sa/worker".to_owned(),
                sha256: worker.fingerprint(),
            }
        );
        assert_eq!(verified.path, "callers.mtls[0]");
    }

    #[test]
    fn the_first_entry_of_the_trust_domain_decides() {
        let callers = callers(vec![
            entry(0, Some("prod.example"), "'prod'", DEFAULT_SUBJECT),
            entry(1, Some("cluster.local"), NAMESPACE, DEFAULT_SUBJECT),
            entry(2, None, "'legacy'", "cert.subject"),
        ]);
        let prod = cert(&["spiffe://prod.example/x"], "x");
        assert_eq!(callers.identify(&prod).unwrap().tenant, "prod");
        let local = cert(&["spiffe://cluster.local/ns/globex/sa/y"], "y");
        assert_eq!(callers.identify(&local).unwrap().tenant, "globex");
        // Another trust domain, or no SPIFFE ID: the entry without one.
        let other = cert(&["spiffe://other.example/ns/a/sa/z"], "z");
        let verified = callers.identify(&other).unwrap();
        assert_eq!(verified.tenant, "legacy");
        assert_eq!(verified.path, "callers.mtls[2]");
        assert_eq!(verified.subject.key(), "cert:other.example CN=z");
        let plain = callers.identify(&cert(&[], "plain")).unwrap();
        assert_eq!(plain.subject.key(), "cert: CN=plain");
    }

    #[test]
    fn each_refusal_says_why() {
        let strict = callers(vec![entry(
            0,
            Some("cluster.local"),
            NAMESPACE,
            DEFAULT_SUBJECT,
        )]);
        let other = strict
            .identify(&cert(&["spiffe://evil.example/ns/acme/sa/w"], "w"))
            .unwrap_err();
        assert!(
            matches!(&other, CertError::Unmatched(m) if m.contains("`evil.example`")),
            "{other}"
        );
        let none = strict.identify(&cert(&[], "w")).unwrap_err();
        assert!(matches!(none, CertError::Unmatched(_)), "{none}");

        let short = strict
            .identify(&cert(&["spiffe://cluster.local/x"], "w"))
            .unwrap_err();
        assert!(
            matches!(&short, CertError::TenantInvalid(m) if m.starts_with("callers.mtls[0].tenant names no tenant")),
            "{short}"
        );
        let number = callers(vec![entry(0, None, "42", DEFAULT_SUBJECT)])
            .identify(&cert(&[], "w"))
            .unwrap_err();
        assert_eq!(
            number,
            CertError::TenantInvalid("callers.mtls[0].tenant gave a int, not a tenant name".into())
        );
        let spaced = callers(vec![entry(0, None, "'acme'", "cert.subject")])
            .identify(&cert(&[], "two words"))
            .unwrap_err();
        assert!(
            matches!(&spaced, CertError::SubjectInvalid(m) if m.starts_with("callers.mtls[0].subject:")),
            "{spaced}"
        );
        // Without a SPIFFE ID the default subject is the tenant itself.
        let tenant = callers(vec![entry(0, None, "'acme'", DEFAULT_SUBJECT)])
            .identify(&cert(&[], "w"))
            .unwrap();
        assert_eq!(tenant.subject, Subject::tenant());
    }
}
