//! The TLS settings of an HTTPS upstream (`servers[].tls`): which
//! certificate authorities its certificate is checked against. The raw
//! block, its validation (the CA file is read and every certificate parsed
//! at load, so a bad file fails the configuration, not the first connect)
//! and the domain type.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::{self, PemObject};
use serde::Deserialize;

use super::fields::Errors;

/// The `tls:` block of a server, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    /// A PEM file of one or more CA certificates (relative to the
    /// configuration file's directory).
    pub(crate) ca_file: Option<String>,
}

/// The certificate authorities an HTTPS upstream's certificate must chain
/// to. They replace the system's roots for that server: a server whose
/// certificate chains only to a public CA is refused unless that CA is in
/// the file too.
///
/// Servers with the same roots (the same certificates, whatever the file's
/// name) share one HTTP client and connection pool: [`TlsTrust::digest`]
/// identifies them.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsTrust {
    ca_file: PathBuf,
    roots: Arc<[CertificateDer<'static>]>,
    digest: [u8; 32],
}

impl TlsTrust {
    /// Reads and checks the CA certificates of `path`.
    ///
    /// # Errors
    /// A text naming the file and what is wrong with it: unreadable, no
    /// PEM certificate in it, a certificate block that is not valid PEM, or
    /// a certificate that cannot serve as a trust anchor.
    pub fn from_pem_file(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read file {shown}: {}", e.kind()))?;
        let mut roots = Vec::new();
        for (index, item) in CertificateDer::pem_slice_iter(&bytes).enumerate() {
            let cert = item.map_err(|e| {
                format!(
                    "certificate {} of {shown} is not valid PEM: {}",
                    index + 1,
                    pem_error(&e)
                )
            })?;
            let mut store = rustls::RootCertStore::empty();
            store.add(cert.clone()).map_err(|e| {
                format!(
                    "certificate {} of {shown} is not a usable CA certificate: {e}",
                    index + 1
                )
            })?;
            roots.push(cert);
        }
        if roots.is_empty() {
            return Err(format!(
                "{shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            ));
        }
        Ok(Self::new(path.to_path_buf(), roots))
    }

    fn new(ca_file: PathBuf, roots: Vec<CertificateDer<'static>>) -> Self {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for cert in &roots {
            h.update((cert.len() as u64).to_le_bytes());
            h.update(cert.as_ref());
        }
        Self {
            ca_file,
            roots: roots.into(),
            digest: h.finalize().into(),
        }
    }

    /// The file the certificates were read from.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The CA certificates (DER), in file order.
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    /// A SHA-256 over the certificates: equal for equal roots.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }
}

impl fmt::Debug for TlsTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsTrust")
            .field("ca_file", &self.ca_file)
            .field("roots", &self.roots.len())
            .finish()
    }
}

/// A PEM error as text (the variants carry no secret: CA certificates are
/// public, and the parser reports positions, not contents).
fn pem_error(error: &pem::Error) -> String {
    match error {
        pem::Error::MissingSectionEnd { .. } => "a section has no -----END line".into(),
        pem::Error::IllegalSectionStart { .. } => "a malformed -----BEGIN line".into(),
        pem::Error::Base64Decode(_) => "invalid base64".into(),
        other => other.to_string(),
    }
}

/// Validates `servers[].tls` of a server whose URL is `url` (`None` for a
/// stdio server, or a URL that failed to parse). Errors name
/// `{path}.tls...`.
pub(super) fn server_tls(
    errors: &mut Errors,
    path: &str,
    raw: RawTls,
    url: Option<&url::Url>,
    is_stdio: bool,
    src: &super::sources::Sources<'_>,
) -> Option<TlsTrust> {
    let field = format!("{path}.tls");
    if is_stdio {
        errors.push(field, "`tls` applies to `url` servers only");
        return None;
    }
    if let Some(url) = url
        && url.scheme() != "https"
    {
        errors.push(
            field,
            format!(
                "`tls` applies to https:// URLs; this server's `url` is {}://",
                url.scheme()
            ),
        );
        return None;
    }
    let Some(ca_file) = raw.ca_file else {
        errors.push(
            field,
            "`tls` needs `ca_file` (a PEM file of CA certificates)",
        );
        return None;
    };
    let field = format!("{path}.tls.ca_file");
    if ca_file.is_empty() {
        errors.push(field, "needs a path");
        return None;
    }
    let file = src.host_path(errors, &field, &ca_file)?;
    match TlsTrust::from_pem_file(&file) {
        Ok(trust) => Some(trust),
        Err(message) => {
            errors.push(field, message);
            None
        }
    }
}

/// Two CA certificates (public test material, no key kept) for unit tests.
#[cfg(test)]
pub(crate) mod test_certs {
    /// "toolgate unit-test CA".
    pub(crate) const CA_1: &str = "-----BEGIN CERTIFICATE-----
MIIBlzCCAT2gAwIBAgIUETrTMpRSq7jWTVjW6aFJPO4U9EYwCgYIKoZIzj0EAwIw
IDEeMBwGA1UEAwwVdG9vbGdhdGUgdW5pdC10ZXN0IENBMCAXDTI2MTIwMTA1MzMw
NloYDzIxMjYxMTA3MDUzMzA2WjAgMR4wHAYDVQQDDBV0b29sZ2F0ZSB1bml0LXRl
c3QgQ0EwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAATxGmxDP5DkjnklW7XH9iEG
H5gbWN4SfNA7GoTWmwcVHJvlz/lsQKWSmA+Jy4SrC+QogemvirTm5j6g4XB5E4h7
o1MwUTAdBgNVHQ4EFgQUTVDovDVb0579YU8f97R83A/udDcwHwYDVR0jBBgwFoAU
TVDovDVb0579YU8f97R83A/udDcwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQD
AgNIADBFAiEA8/iuo7CFTXTMvD6vDecsi5KpO485QYz231bJ6wAbwSECIBwExv9a
SL2nSDQMj4ZaOprtkCTykukGFkgVwJl+muIP
-----END CERTIFICATE-----
";
    /// "toolgate unit-test CA 2".
    pub(crate) const CA_2: &str = "-----BEGIN CERTIFICATE-----
MIIBnDCCAUGgAwIBAgIUb7Bg64s3iPC45FzpNTJCJ/Brz78wCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXdG9vbGdhdGUgdW5pdC10ZXN0IENBIDIwIBcNMjYxMjAxMDUz
MzA2WhgPMjEyNjExMDcwNTMzMDZaMCIxIDAeBgNVBAMMF3Rvb2xnYXRlIHVuaXQt
dGVzdCBDQSAyMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEAHupIvGEBZNJUyuF
pHBDnYf7mdi7d3J6gGePv6U/q68VVFHeThUtgMwhh3exHuBm60m5Y5l+WMj1dOpD
5HL146NTMFEwHQYDVR0OBBYEFASw8tbFx5E9LUFZZhI384PabnkxMB8GA1UdIwQY
MBaAFASw8tbFx5E9LUFZZhI384PabnkxMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZI
zj0EAwIDSQAwRgIhALYX2N9WXMGSOUnYxrgQsmnQwbdl9dkf+eYDQ5dRuhdPAiEA
6s2wKHc7Fzucb1P1TUsBwcw66R7Q3cB9S82YhFZQm6c=
-----END CERTIFICATE-----
";
}

#[cfg(test)]
mod tests {
    use super::test_certs::{CA_1, CA_2};
    use super::*;
    use crate::config::{Config, Transport};
    use std::collections::HashMap;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_bundle_is_read_and_equal_roots_have_equal_digests() {
        let dir = tempfile::tempdir().unwrap();
        let both = TlsTrust::from_pem_file(&write(
            dir.path(),
            "both.pem",
            &format!("# comment\n{CA_1}{CA_2}"),
        ))
        .unwrap();
        assert_eq!(both.roots().len(), 2);
        let one = TlsTrust::from_pem_file(&write(dir.path(), "a.pem", CA_1)).unwrap();
        let same = TlsTrust::from_pem_file(&write(dir.path(), "b.pem", CA_1)).unwrap();
        let other = TlsTrust::from_pem_file(&write(dir.path(), "c.pem", CA_2)).unwrap();
        assert_eq!(one.digest(), same.digest());
        assert_ne!(one.digest(), other.digest());
        assert_ne!(one.digest(), both.digest());
        assert!(format!("{one:?}").contains("a.pem"));
    }

    #[test]
    fn bad_files_say_what_is_wrong_and_where() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = TlsTrust::from_pem_file(&missing).unwrap_err();
        assert!(
            err.starts_with("cannot read file ") && err.contains("missing.pem"),
            "{err}"
        );

        let key = write(
            dir.path(),
            "key.pem",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
        );
        let err = TlsTrust::from_pem_file(&key).unwrap_err();
        assert!(err.contains("key.pem holds no PEM certificate"), "{err}");

        let cut = write(dir.path(), "cut.pem", &CA_1[..200]);
        let err = TlsTrust::from_pem_file(&cut).unwrap_err();
        assert!(
            err.contains("certificate 1 of") && err.contains("not valid PEM"),
            "{err}"
        );

        // Valid PEM, but not an X.509 certificate.
        let junk = write(
            dir.path(),
            "junk.pem",
            &format!("{CA_1}-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n"),
        );
        let err = TlsTrust::from_pem_file(&junk).unwrap_err();
        assert!(
            err.contains("certificate 2 of") && err.contains("not a usable CA certificate"),
            "{err}"
        );
    }

    fn load(yaml: &str, base: &Path) -> Result<Config, Vec<String>> {
        Config::from_yaml(yaml, "test.yaml", base, &HashMap::<String, String>::new())
            .map_err(|e| e.field_errors().iter().map(ToString::to_string).collect())
    }

    fn server(lines: &str) -> String {
        format!("tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: s\n{lines}")
    }

    #[test]
    fn tls_is_validated_into_the_http_transport() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ca.pem", CA_1);
        let config = load(
            &server(
                "        url: \"https://mcp.internal/mcp\"\n        tls: { ca_file: ca.pem }\n",
            ),
            dir.path(),
        )
        .unwrap();
        let with = &config.tenants[0].servers[0];
        let Transport::Http { tls: Some(tls), .. } = &with.transport else {
            panic!("{:?}", with.transport);
        };
        assert_eq!(tls.ca_file(), dir.path().join("ca.pem"));
        // A different trust is a different session.
        let without = load(
            &server("        url: \"https://mcp.internal/mcp\"\n"),
            dir.path(),
        )
        .unwrap();
        assert_ne!(
            with.fingerprint(),
            without.tenants[0].servers[0].fingerprint()
        );
    }

    #[test]
    fn tls_errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ca.pem", CA_1);
        for (lines, field, text) in [
            (
                "        command: [\"x\"]\n        tls: { ca_file: ca.pem }\n",
                "tenants[0].servers[0].tls:",
                "applies to `url` servers only",
            ),
            (
                "        url: \"http://127.0.0.1/mcp\"\n        tls: { ca_file: ca.pem }\n",
                "tenants[0].servers[0].tls:",
                "applies to https:// URLs",
            ),
            (
                "        url: \"https://127.0.0.1/mcp\"\n        tls: {}\n",
                "tenants[0].servers[0].tls:",
                "needs `ca_file`",
            ),
            (
                "        url: \"https://127.0.0.1/mcp\"\n        tls: { ca_file: nope.pem }\n",
                "tenants[0].servers[0].tls.ca_file:",
                "nope.pem",
            ),
            (
                "        url: \"https://127.0.0.1/mcp\"\n        tls: { ca: ca.pem }\n",
                "tenants[0].servers[0].tls",
                "unknown field `ca`",
            ),
        ] {
            let errors = load(&server(lines), dir.path()).unwrap_err();
            assert!(
                errors
                    .iter()
                    .any(|e| e.starts_with(field) && e.contains(text)),
                "{lines}: expected {field} … {text} in {errors:?}"
            );
        }
    }
}
