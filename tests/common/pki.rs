//! A certificate authority made in a test (rcgen), for the gateway's own
//! listeners and its callers' client certificates.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A test CA: its certificate (PEM) and what signs with it.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl TestCa {
    /// A self-signed CA named `name` (may sign certificates and CRLs).
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// Signs `params` with a new key: the certificate and the key.
    pub fn sign(&self, params: CertificateParams) -> (Certificate, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert, key)
    }
}
