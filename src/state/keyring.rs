//! Encryption at rest: a ring of AES-256-GCM keys. The first key seals, every
//! key opens, so a key is rotated by putting a new one first and dropping the
//! old one once nothing sealed with it is left.

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;

/// Format byte at the start of every sealed value.
const FORMAT_V1: u8 = 1;
/// Length of a key id: the first bytes of SHA-256 over a label and the key.
const KEY_ID_LEN: usize = 8;
/// AES-GCM nonce length (96 bits).
const NONCE_LEN: usize = 12;
/// AES-GCM tag length.
const TAG_LEN: usize = 16;
/// Header: format byte, key id, nonce.
const HEADER_LEN: usize = 1 + KEY_ID_LEN + NONCE_LEN;

/// Why a key ring could not be built. Never holds key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// No key was given; at least one is needed to seal.
    #[error("state.keys: at least one key is required")]
    Empty,
    /// Key `index` (0-based) is not valid base64.
    #[error("state.keys[{index}]: not valid base64")]
    NotBase64 {
        /// Position of the key in the list.
        index: usize,
    },
    /// Key `index` (0-based) does not decode to 32 bytes.
    #[error("state.keys[{index}]: decodes to {len} bytes, expected 32")]
    WrongLength {
        /// Position of the key in the list.
        index: usize,
        /// Decoded length.
        len: usize,
    },
    /// The same key appears twice (at `first` and `second`).
    #[error("state.keys[{second}]: same key as state.keys[{first}]")]
    Duplicate {
        /// Position of the first occurrence.
        first: usize,
        /// Position of the repeat.
        second: usize,
    },
}

/// Why a sealed value could not be opened. Never holds the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The bytes are not a sealed value of a known format (truncated, wrong
    /// format byte).
    #[error("sealed value is malformed")]
    Malformed,
    /// Sealed with a key that is not in the ring (the key was removed).
    #[error("sealed with key {key_id}, which is not configured")]
    UnknownKey {
        /// Hex id of the key that sealed it.
        key_id: KeyId,
    },
    /// The key is known but authentication failed: the ciphertext was
    /// altered or belongs to another row.
    #[error("sealed value failed authentication with key {key_id}")]
    Tampered {
        /// Hex id of the key that was tried.
        key_id: KeyId,
    },
}

/// A public, non-secret identifier of a key: the first 8 bytes of
/// SHA-256(`"toolgate-state-key-id\0"` ‖ key). Shown in logs and errors in hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; KEY_ID_LEN]);

impl KeyId {
    fn of(key: &[u8; 32]) -> KeyId {
        let digest = Sha256::new()
            .chain_update(b"toolgate-state-key-id\0")
            .chain_update(key)
            .finalize();
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&digest[..KEY_ID_LEN]);
        KeyId(id)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

struct RingKey {
    id: KeyId,
    cipher: Aes256Gcm,
}

/// AES-256-GCM keys for the state store. The first key seals; all keys open.
///
/// A sealed value is `0x01 ‖ key id (8) ‖ nonce (12, random) ‖ ciphertext ‖
/// tag (16)`. The caller passes associated data naming the row the value
/// belongs to, so a value copied to another row fails to open.
///
/// `Debug` shows only the key ids; the keys themselves never print.
#[derive(Clone)]
pub struct KeyRing {
    keys: Arc<[RingKey]>,
}

impl KeyRing {
    /// A ring from raw 32-byte keys, the first one sealing.
    ///
    /// # Errors
    /// [`KeyError::Empty`] for no key, [`KeyError::Duplicate`] for a key given
    /// twice.
    pub fn new(keys: Vec<[u8; 32]>) -> Result<KeyRing, KeyError> {
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        let mut ring: Vec<RingKey> = Vec::with_capacity(keys.len());
        for (second, key) in keys.iter().enumerate() {
            let id = KeyId::of(key);
            if let Some(first) = ring.iter().position(|k| k.id == id) {
                return Err(KeyError::Duplicate { first, second });
            }
            ring.push(RingKey {
                id,
                cipher: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key)),
            });
        }
        Ok(KeyRing { keys: ring.into() })
    }

    /// A ring from base64 keys (standard alphabet, padding optional,
    /// surrounding whitespace ignored, as in a mounted Secret file), each
    /// decoding to 32 bytes. Generate one with `openssl rand -base64 32`.
    ///
    /// # Errors
    /// [`KeyError`] naming the index of the bad key, never its value.
    pub fn from_base64(keys: &[&str]) -> Result<KeyRing, KeyError> {
        let engine = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let mut raw = Vec::with_capacity(keys.len());
        for (index, text) in keys.iter().enumerate() {
            let bytes = engine
                .decode(text.trim())
                .map_err(|_| KeyError::NotBase64 { index })?;
            let key: [u8; 32] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| KeyError::WrongLength {
                    index,
                    len: bytes.len(),
                })?;
            raw.push(key);
        }
        KeyRing::new(raw)
    }

    /// A ring of one random key, for this process only: what it seals no
    /// other process (and no later run) can open.
    pub fn ephemeral() -> KeyRing {
        let key: [u8; 32] = Aes256Gcm::generate_key(&mut OsRng).into();
        KeyRing::new(vec![key]).expect("one key is a valid ring")
    }

    /// The ids of the keys, the sealing key first.
    pub fn key_ids(&self) -> Vec<KeyId> {
        self.keys.iter().map(|k| k.id).collect()
    }

    /// Seals `plaintext` with the first key, binding `aad`.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
        let key = &self.keys[0];
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let ciphertext = key
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("AES-GCM encryption of an in-memory buffer cannot fail");
        let mut out = Vec::with_capacity(HEADER_LEN + ciphertext.len());
        out.push(FORMAT_V1);
        out.extend_from_slice(&key.id.0);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ciphertext);
        out
    }

    /// Opens a value sealed by [`KeyRing::seal`] with any key of the ring.
    ///
    /// # Errors
    /// [`OpenError`] when the value is malformed, was sealed with a key not in
    /// the ring, or fails authentication (altered, or another row's).
    pub fn open(&self, sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, OpenError> {
        if sealed.len() < HEADER_LEN + TAG_LEN || sealed[0] != FORMAT_V1 {
            return Err(OpenError::Malformed);
        }
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&sealed[1..1 + KEY_ID_LEN]);
        let key_id = KeyId(id);
        let key = self
            .keys
            .iter()
            .find(|k| k.id == key_id)
            .ok_or(OpenError::UnknownKey { key_id })?;
        let nonce = Nonce::from_slice(&sealed[1 + KEY_ID_LEN..HEADER_LEN]);
        key.cipher
            .decrypt(
                nonce,
                Payload {
                    msg: &sealed[HEADER_LEN..],
                    aad,
                },
            )
            .map_err(|_| OpenError::Tampered { key_id })
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("count", &self.keys.len())
            .field("ids", &self.key_ids())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 32] = [1; 32];
    const B: [u8; 32] = [2; 32];

    #[test]
    fn round_trip_binds_the_associated_data() {
        let ring = KeyRing::new(vec![A]).unwrap();
        let sealed = ring.seal(b"secret token", b"row-1");
        assert_eq!(ring.open(&sealed, b"row-1").unwrap(), b"secret token");
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        // The same ciphertext under another row's AAD does not open.
        assert!(matches!(
            ring.open(&sealed, b"row-2"),
            Err(OpenError::Tampered { .. })
        ));
    }

    #[test]
    fn nonces_are_fresh() {
        let ring = KeyRing::new(vec![A]).unwrap();
        assert_ne!(ring.seal(b"x", b""), ring.seal(b"x", b""));
    }

    #[test]
    fn rotation_first_key_seals_all_keys_open() {
        let old = KeyRing::new(vec![A]).unwrap();
        let sealed_old = old.seal(b"v1", b"k");

        let rotated = KeyRing::new(vec![B, A]).unwrap();
        assert_eq!(rotated.open(&sealed_old, b"k").unwrap(), b"v1");
        let sealed_new = rotated.seal(b"v2", b"k");
        assert_eq!(&sealed_new[1..9], &KeyId::of(&B).0);
        assert_eq!(&sealed_old[1..9], &KeyId::of(&A).0);

        // The old ring cannot open what the new key sealed.
        assert_eq!(
            old.open(&sealed_new, b"k"),
            Err(OpenError::UnknownKey {
                key_id: KeyId::of(&B)
            })
        );
        // Once the old key is dropped, old values no longer open.
        let new_only = KeyRing::new(vec![B]).unwrap();
        assert!(matches!(
            new_only.open(&sealed_old, b"k"),
            Err(OpenError::UnknownKey { .. })
        ));
        assert_eq!(new_only.open(&sealed_new, b"k").unwrap(), b"v2");
    }

    #[test]
    fn tampering_and_truncation_are_detected() {
        let ring = KeyRing::new(vec![A]).unwrap();
        let mut sealed = ring.seal(b"value", b"k");
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        assert!(matches!(
            ring.open(&sealed, b"k"),
            Err(OpenError::Tampered { .. })
        ));
        assert_eq!(ring.open(&sealed[..10], b"k"), Err(OpenError::Malformed));
        assert_eq!(ring.open(b"", b"k"), Err(OpenError::Malformed));
    }

    #[test]
    fn base64_keys_are_checked_without_echoing_them() {
        use base64::engine::general_purpose::STANDARD;
        let a = STANDARD.encode(A);
        let b = format!("{}\n", STANDARD.encode(B).trim_end_matches('='));
        let ring = KeyRing::from_base64(&[&a, &b]).unwrap();
        assert_eq!(ring.key_ids(), vec![KeyId::of(&A), KeyId::of(&B)]);

        let short = STANDARD.encode([7u8; 16]);
        let err = KeyRing::from_base64(&[&a, &short]).unwrap_err();
        assert!(matches!(err, KeyError::WrongLength { index: 1, len: 16 }));
        assert!(!err.to_string().contains(&short));
        let err = KeyRing::from_base64(&["not base64!"]).unwrap_err();
        assert!(matches!(err, KeyError::NotBase64 { index: 0 }));
        assert!(!err.to_string().contains("not base64!"));
        assert!(matches!(
            KeyRing::from_base64(&[]).unwrap_err(),
            KeyError::Empty
        ));
        assert!(matches!(
            KeyRing::from_base64(&[&a, &a]).unwrap_err(),
            KeyError::Duplicate {
                first: 0,
                second: 1
            }
        ));
    }

    #[test]
    fn debug_shows_ids_not_keys() {
        let ring = KeyRing::new(vec![A, B]).unwrap();
        let debug = format!("{ring:?}");
        assert!(debug.contains("count: 2"), "{debug}");
        assert!(debug.contains(&KeyId::of(&A).to_string()), "{debug}");
        assert!(!debug.contains("[1, 1"), "{debug}");
        assert!(!debug.contains("0101010101"), "{debug}");
    }
}
