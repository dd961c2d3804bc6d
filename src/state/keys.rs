//! The keys of the store's rows, and the associated data that binds a
//! sealed value to its table and row (so a value moved to another row does
//! not open) and, for a token, to the row's version (so an older value put
//! back into its own row does not open either).

use sha2::{Digest, Sha256};

/// The key of an upstream token: whose credential for which server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenKey {
    /// The tenant.
    pub tenant: String,
    /// The end user the tenant acts for; the empty string is the tenant
    /// itself.
    pub subject: String,
    /// The upstream server's name in the tenant's configuration.
    pub server: String,
}

impl TokenKey {
    /// A key for `subject` of `tenant` on `server`.
    pub fn new(
        tenant: impl Into<String>,
        subject: impl Into<String>,
        server: impl Into<String>,
    ) -> TokenKey {
        TokenKey {
            tenant: tenant.into(),
            subject: subject.into(),
            server: server.into(),
        }
    }

    /// A key for the tenant itself (no end user) on `server`.
    pub fn tenant_wide(tenant: impl Into<String>, server: impl Into<String>) -> TokenKey {
        TokenKey::new(tenant, "", server)
    }

    /// The name of this key's refresh lease
    /// ([`StateStore::try_lease`](super::StateStore::try_lease)): `token:`
    /// and the SHA-256 (hex) of the key's fields, so that neither the
    /// subject nor the tenant appears in the leases table.
    pub fn lease_name(&self) -> String {
        let digest = Sha256::digest(aad(
            "token-lease",
            &[&self.tenant, &self.subject, &self.server],
        ));
        format!("token:{}", hex::encode(digest))
    }

    /// The associated data of this token row at `version`: the key's
    /// fields and the version, so that a value sealed for one version of
    /// the row opens at that version only.
    pub(super) fn aad(&self, version: i64) -> Vec<u8> {
        aad(
            "token-at-version",
            &[
                &self.tenant,
                &self.subject,
                &self.server,
                &version.to_string(),
            ],
        )
    }

    /// The associated data of token rows written before migration 0003
    /// (the key's fields only). Used once, by that migration, to re-seal
    /// them; never to read a row.
    pub(super) fn aad_before_versions(&self) -> Vec<u8> {
        aad("token", &[&self.tenant, &self.subject, &self.server])
    }
}

/// The key of an OAuth client registration.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientKey {
    /// The tenant.
    pub tenant: String,
    /// The upstream server's name in the tenant's configuration.
    pub server: String,
    /// The authorization server's issuer identifier.
    pub issuer: String,
}

impl ClientKey {
    /// A key for `tenant`'s client of `issuer` used for `server`.
    pub fn new(
        tenant: impl Into<String>,
        server: impl Into<String>,
        issuer: impl Into<String>,
    ) -> ClientKey {
        ClientKey {
            tenant: tenant.into(),
            server: server.into(),
            issuer: issuer.into(),
        }
    }

    pub(super) fn aad(&self) -> Vec<u8> {
        aad("client", &[&self.tenant, &self.server, &self.issuer])
    }
}

/// Associated data binding a sealed value to its table and row (or, for a
/// value kept outside the store, to its use): a label, then each key field
/// length-prefixed so that no two keys share an encoding.
pub fn aad(kind: &str, fields: &[&str]) -> Vec<u8> {
    let mut out = Vec::from(b"toolgate-state-v1\0".as_slice());
    out.extend_from_slice(kind.as_bytes());
    out.push(0);
    for field in fields {
        out.extend_from_slice(&u64::try_from(field.len()).unwrap_or(u64::MAX).to_be_bytes());
        out.extend_from_slice(field.as_bytes());
    }
    out
}

/// The associated data of the pending flow under `state`.
pub(super) fn pending_aad(state: &str) -> Vec<u8> {
    aad("pending", &[state])
}

/// The associated data of the consent held under the one-time `code`.
pub(super) fn held_aad(code: &str) -> Vec<u8> {
    aad("held", &[code])
}

/// The associated data of the task `task_id` of `tenant`.
pub(super) fn task_aad(task_id: &str, tenant: &str) -> Vec<u8> {
    aad("task", &[task_id, tenant])
}

/// The hash under which the pending flow of `state` (or the consent held
/// under a code) is stored.
pub(super) fn state_hash(state: &str) -> String {
    hex::encode(Sha256::digest(state.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aad_is_unambiguous() {
        assert_ne!(
            aad("token", &["a", "bc", ""]),
            aad("token", &["ab", "c", ""])
        );
        assert_ne!(
            aad("token", &["a", "b", "c"]),
            aad("client", &["a", "b", "c"])
        );
    }

    #[test]
    fn token_aad_binds_the_version_and_differs_from_the_old_format() {
        let key = TokenKey::new("acme", "alice", "github");
        assert_ne!(key.aad(1), key.aad(2));
        assert_eq!(key.aad(7), key.clone().aad(7));
        for version in [0, 1, 2, i64::MAX] {
            assert_ne!(key.aad(version), key.aad_before_versions());
        }
        assert_ne!(key.aad(1), TokenKey::new("acme", "bob", "github").aad(1));
    }

    #[test]
    fn lease_names_hide_the_key() {
        let alice = TokenKey::new("acme", "alice@example.com", "github");
        let name = alice.lease_name();
        assert!(name.starts_with("token:"), "{name}");
        assert_eq!(name.len(), "token:".len() + 64, "{name}");
        assert!(!name.contains("alice") && !name.contains("acme") && !name.contains("github"));
        assert_eq!(name, alice.clone().lease_name(), "stable");
        // Each field counts, and field boundaries are not ambiguous.
        let others = [
            TokenKey::new("acme", "bob", "github"),
            TokenKey::new("other", "alice@example.com", "github"),
            TokenKey::new("acme", "alice@example.com", "gitlab"),
            TokenKey::new("acmealice@example.com", "", "github"),
            TokenKey::tenant_wide("acme", "github"),
        ];
        for other in &others {
            assert_ne!(other.lease_name(), name, "{other:?}");
        }
    }
}
