//! The key of the arguments' digest (`audit.digest_key`): records keep
//! HMAC-SHA-256 of a call's arguments under it, never a plain hash, so a
//! low-entropy argument (a PIN, yes/no) cannot be recovered by hashing
//! guesses without the key. The key is named in records by its id, never
//! shown.

use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};

use crate::config::Secret;

/// What the key id hashes before the key: the id names this key for this
/// use, and no other hash of the key.
const KEY_ID_LABEL: &[u8] = b"toolgate-audit-digest-key-id\0";

/// Bytes of a random per-process key.
const RANDOM_KEY_BYTES: usize = 32;

/// The key the arguments' digest is keyed with, and its id.
#[derive(Clone)]
pub struct DigestKey {
    key: Vec<u8>,
    id: String,
    configured: bool,
}

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigestKey")
            .field("id", &self.id)
            .field("configured", &self.configured)
            .finish_non_exhaustive()
    }
}

impl DigestKey {
    /// The configured key (`audit.digest_key`, validated to be at least 32
    /// bytes), or, without one, a random key for this process.
    pub fn new(configured: Option<&Secret>) -> Self {
        match configured {
            Some(secret) => Self::from_bytes(secret.expose().as_bytes().to_vec(), true),
            None => {
                let mut key = vec![0u8; RANDOM_KEY_BYTES];
                ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
                    .expect("the system's random source works");
                Self::from_bytes(key, false)
            }
        }
    }

    fn from_bytes(key: Vec<u8>, configured: bool) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(KEY_ID_LABEL);
        hasher.update(&key);
        let mut id = hex::encode(hasher.finalize());
        id.truncate(16);
        Self {
            key,
            id,
            configured,
        }
    }

    /// The key's id: the first 16 hex characters of
    /// SHA-256(`"toolgate-audit-digest-key-id\0"` ‖ key). The same key has
    /// the same id in every process; it reveals nothing of the key.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the key was configured (else it is random, this process's
    /// own).
    pub fn is_configured(&self) -> bool {
        self.configured
    }

    /// Lowercase hex HMAC-SHA-256 of `bytes` under this key.
    pub fn hmac_hex(&self, bytes: &[u8]) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        mac.update(bytes);
        hex::encode(mac.finalize().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "0123456789abcdef0123456789abcdef-a";
    const KEY_B: &str = "0123456789abcdef0123456789abcdef-b";

    #[test]
    fn one_key_gives_one_digest_another_key_another() {
        let a = DigestKey::new(Some(&Secret::sourced(KEY_A)));
        let again = DigestKey::new(Some(&Secret::sourced(KEY_A)));
        let b = DigestKey::new(Some(&Secret::sourced(KEY_B)));
        assert_eq!(a.hmac_hex(b"1234"), again.hmac_hex(b"1234"));
        assert_eq!(a.id(), again.id(), "the id is stable across processes");
        assert_ne!(a.hmac_hex(b"1234"), b.hmac_hex(b"1234"));
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id().len(), 16);
        let plain: String = hex::encode(Sha256::digest(b"1234"));
        assert_ne!(a.hmac_hex(b"1234"), plain);
        assert!(a.is_configured());
    }

    #[test]
    fn hmac_is_rfc_4231() {
        // RFC 4231, test case 2.
        let key = DigestKey::from_bytes(b"Jefe".to_vec(), true);
        assert_eq!(
            key.hmac_hex(b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn without_a_key_each_process_draws_its_own() {
        let a = DigestKey::new(None);
        let b = DigestKey::new(None);
        assert!(!a.is_configured());
        assert_ne!(a.id(), b.id());
        assert_ne!(a.hmac_hex(b"yes"), b.hmac_hex(b"yes"));
        let configured = DigestKey::new(Some(&Secret::sourced(KEY_A)));
        assert!(!format!("{configured:?}").contains("0123456789abcdef"));
    }
}
