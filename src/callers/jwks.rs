//! One issuer's verification keys: a JWKS document fetched from a URL or
//! read from a file, cached, and refreshed.
//!
//! - A URL is fetched at start (in the background), again when the keys
//!   are older than `refresh_interval` (in the background: the cached keys
//!   keep serving meanwhile), and at once when a token names a key id the
//!   cache does not hold, at most once per `min_refresh_interval` and one
//!   fetch at a time. A fetch that fails keeps the cached keys: callers
//!   whose keys are cached are not stopped by a JWKS endpoint that is down.
//! - A file is read at start and read again when it changes (checked at
//!   most once a second, and whenever a token names an unknown key id).
//!
//! A set survives a configuration reload that leaves its source unchanged
//! (see [`super::JwtCallers::new`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};

use crate::config::JwksSource;

/// How often a JWKS file is looked at for changes, at most.
const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Bound on one fetch of a JWKS URL.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1 << 20;
/// After a failed fetch, the least wait before the next one, whatever
/// `min_refresh_interval` says.
const RETRY_FLOOR: Duration = Duration::from_secs(1);

/// A verification key of the set.
pub(crate) struct Key {
    /// The key, ready for `jsonwebtoken::decode`.
    pub(crate) decoding: DecodingKey,
    /// The JWK's `alg`, when it names one.
    pub(crate) alg: Option<Algorithm>,
}

impl Key {
    /// Whether a token signed with `alg` may be verified with this key.
    pub(crate) fn fits(&self, alg: Algorithm) -> bool {
        self.decoding.family() == alg.family() && self.alg.is_none_or(|a| a == alg)
    }
}

/// The keys of one load of the document.
#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, Arc<Key>>,
    /// Keys without a `kid`.
    unnamed: Vec<Arc<Key>>,
    /// Incremented by every load that changed the keys.
    version: u64,
    /// The file's identity when these keys were read (file sources).
    stamp: Option<FileStamp>,
}

impl Keys {
    /// The key a token names: by `kid`, or without one, the only key that
    /// fits the algorithm.
    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<Arc<Key>> {
        match kid {
            Some(kid) => self.by_kid.get(kid).cloned(),
            None => {
                let mut fitting = self
                    .by_kid
                    .values()
                    .chain(&self.unnamed)
                    .filter(|k| k.fits(alg));
                let first = fitting.next()?;
                fitting.next().is_none().then(|| first.clone())
            }
        }
    }

    fn len(&self) -> usize {
        self.by_kid.len() + self.unnamed.len()
    }
}

/// What identifies one content of a file: a mounted ConfigMap is replaced
/// by a new file (new inode) rather than written in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<std::time::SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path)?;
    Ok(FileStamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
        inode: metadata.ino(),
    })
}

/// The last attempt to load the document.
#[derive(Default)]
struct Attempt {
    at: Option<Instant>,
    /// Why it failed; `None` when it succeeded.
    error: Option<String>,
}

/// Why no key was found for a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// The set (freshly loaded, or loaded too recently to load again) has
    /// no key with the token's key id.
    Unknown,
    /// The set could not be loaded, and the cached keys do not hold the
    /// token's key: why (without secrets).
    Unavailable(String),
}

/// An issuer's keys.
pub(crate) struct KeySet {
    issuer: String,
    source: JwksSource,
    keys: ArcSwap<Keys>,
    /// One load at a time.
    loading: tokio::sync::Mutex<()>,
    attempt: Mutex<Attempt>,
    /// A background refresh is running.
    refreshing: AtomicBool,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("issuer", &self.issuer)
            .field("source", &self.source)
            .field("keys", &self.keys.load().len())
            .finish()
    }
}

/// Why a load changed nothing.
enum Loaded {
    Changed(Keys),
    Unchanged,
}

impl KeySet {
    /// A key set for `issuer`. A file is read now; a URL is fetched in the
    /// background when a Tokio runtime runs (else at the first token).
    pub(crate) fn new(issuer: &str, source: JwksSource) -> Arc<Self> {
        let set = Arc::new(Self {
            issuer: issuer.to_owned(),
            source,
            keys: ArcSwap::from_pointee(Keys::default()),
            loading: tokio::sync::Mutex::new(()),
            attempt: Mutex::new(Attempt::default()),
            refreshing: AtomicBool::new(false),
        });
        match &set.source {
            JwksSource::File { path } => {
                // Validation read it already; a failure now is logged and
                // retried at the first token.
                let _ = set.record(read_file(path, None));
            }
            JwksSource::Url { .. } => set.refresh_in_background(),
        }
        set
    }

    /// Where the keys come from.
    pub(crate) fn source(&self) -> &JwksSource {
        &self.source
    }

    /// The key for a token signed with `alg` naming `kid`, loading the
    /// set again first when the key is unknown (rate limited) or, for a
    /// file, when it is due.
    pub(crate) async fn key(
        self: &Arc<Self>,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Arc<Key>, KeyError> {
        if matches!(self.source, JwksSource::File { .. }) && self.due() {
            let seen = self.keys.load().version;
            // A file that cannot be read keeps the keys read before.
            let _ = self.refresh(seen, self.due_interval()).await;
        }
        let keys = self.keys.load_full();
        if let Some(key) = keys.find(kid, alg) {
            if matches!(self.source, JwksSource::Url { .. }) && self.due() {
                self.refresh_in_background();
            }
            return Ok(key);
        }
        // Unknown: the issuer may have rotated its keys.
        self.refresh(keys.version, self.min_interval())
            .await
            .map_err(KeyError::Unavailable)?;
        self.keys.load().find(kid, alg).ok_or(KeyError::Unknown)
    }

    /// Loads the set now (for `toolgate check`): how many keys it holds.
    ///
    /// # Errors
    /// The set cannot be loaded (why, without secrets).
    pub(crate) async fn probe(&self) -> Result<usize, String> {
        let seen = self.keys.load().version;
        self.refresh(seen, Duration::ZERO).await?;
        Ok(self.keys.load().len())
    }

    /// The least time between two loads triggered by unknown key ids.
    fn min_interval(&self) -> Duration {
        match &self.source {
            JwksSource::Url {
                min_refresh_interval,
                ..
            } => *min_refresh_interval,
            JwksSource::File { .. } => Duration::ZERO,
        }
    }

    /// How old the last load may get before the set is loaded again: the
    /// refresh interval after a success, the retry interval after a
    /// failure.
    fn due_interval(&self) -> Duration {
        let failed = self.attempt.lock().expect("attempt lock").error.is_some();
        match &self.source {
            JwksSource::Url {
                refresh_interval, ..
            } if !failed => *refresh_interval,
            JwksSource::Url { .. } => self.min_interval().max(RETRY_FLOOR),
            JwksSource::File { .. } => FILE_CHECK_INTERVAL,
        }
    }

    fn due(&self) -> bool {
        let interval = self.due_interval();
        self.attempt
            .lock()
            .expect("attempt lock")
            .at
            .is_none_or(|at| at.elapsed() >= interval)
    }

    /// Loads the set again in a background task, unless one already runs.
    fn refresh_in_background(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let set = self.clone();
        runtime.spawn(async move {
            let seen = set.keys.load().version;
            let _ = set.refresh(seen, set.due_interval()).await;
            set.refreshing.store(false, Ordering::Release);
        });
    }

    /// Loads the set, one load at a time, unless another load finished
    /// since the caller saw version `seen`, or the last attempt is more
    /// recent than `interval`.
    ///
    /// # Errors
    /// This load (or the last one, when too recent to load again) failed.
    async fn refresh(&self, seen: u64, interval: Duration) -> Result<(), String> {
        let _one = self.loading.lock().await;
        if self.keys.load().version != seen {
            return Ok(());
        }
        {
            let attempt = self.attempt.lock().expect("attempt lock");
            if attempt.at.is_some_and(|at| at.elapsed() < interval) {
                return attempt.error.clone().map_or(Ok(()), Err);
            }
        }
        let result = match &self.source {
            JwksSource::Url { url, .. } => fetch(url).await.map(Loaded::Changed),
            JwksSource::File { path } => {
                let current = self.keys.load().stamp;
                let path = path.clone();
                tokio::task::spawn_blocking(move || read_file(&path, current))
                    .await
                    .unwrap_or_else(|e| Err(format!("reading the file failed: {e}")))
            }
        };
        self.record(result)
    }

    /// Keeps the outcome of a load: new keys replace the cached ones; a
    /// failure keeps them.
    fn record(&self, result: Result<Loaded, String>) -> Result<(), String> {
        let mut attempt = self.attempt.lock().expect("attempt lock");
        attempt.at = Some(Instant::now());
        match result {
            Ok(Loaded::Changed(mut keys)) => {
                keys.version = self.keys.load().version + 1;
                tracing::info!(issuer = %self.issuer, keys = keys.len(), "JWKS loaded");
                self.keys.store(Arc::new(keys));
                attempt.error = None;
                Ok(())
            }
            Ok(Loaded::Unchanged) => {
                attempt.error = None;
                Ok(())
            }
            Err(reason) => {
                tracing::warn!(
                    issuer = %self.issuer,
                    %reason,
                    cached_keys = self.keys.load().len(),
                    "JWKS not loaded (the keys cached before, if any, stay in use)"
                );
                attempt.error = Some(reason.clone());
                Err(reason)
            }
        }
    }
}

/// The HTTP client of every JWKS fetch: no redirects (a JWKS answer must
/// come from the configured URL), bounded in time.
fn client() -> Result<reqwest::Client, String> {
    static CLIENT: std::sync::OnceLock<Result<reqwest::Client, String>> =
        std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(FETCH_TIMEOUT)
                .build()
                .map_err(|e| format!("cannot build the HTTP client: {e}"))
        })
        .clone()
}

async fn fetch(url: &url::Url) -> Result<Keys, String> {
    let mut response = client()?
        .get(url.clone())
        .header(http::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| format!("GET {url}: {}", describe(&e.without_url())))?;
    if !response.status().is_success() {
        return Err(format!("GET {url}: HTTP {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("GET {url}: {}", describe(&e.without_url())))?
    {
        if body.len() + chunk.len() > MAX_JWKS_BYTES {
            return Err(format!(
                "GET {url}: the document is over {MAX_JWKS_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    parse(&body).map_err(|e| format!("GET {url}: {e}"))
}

/// An error and its sources, on one line.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    // Bounded: error chains are short, but never trust a cycle.
    for _ in 0..8 {
        let Some(source) = current else { break };
        text.push_str(": ");
        text.push_str(&source.to_string());
        current = source.source();
    }
    text
}

fn read_file(path: &PathBuf, current: Option<FileStamp>) -> Result<Loaded, String> {
    let before = stamp(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if current == Some(before) {
        return Ok(Loaded::Unchanged);
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() > MAX_JWKS_BYTES {
        return Err(format!("{}: over {MAX_JWKS_BYTES} bytes", path.display()));
    }
    let mut keys = parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    keys.stamp = Some(before);
    Ok(Loaded::Changed(keys))
}

/// The signature keys of a JWKS document. Keys for encryption, symmetric
/// keys and keys of unknown types are left out.
fn parse(bytes: &[u8]) -> Result<Keys, String> {
    #[derive(serde::Deserialize)]
    struct Document {
        keys: Vec<serde_json::Value>,
    }
    let document: Document = serde_json::from_slice(bytes)
        .map_err(|e| format!("not a JWKS document ({{\"keys\": [...]}}): {e}"))?;
    let mut keys = Keys::default();
    for value in document.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        if matches!(
            jwk.common.public_key_use,
            Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
        ) || matches!(
            jwk.algorithm,
            AlgorithmParameters::OctetKey(_) | AlgorithmParameters::Other(_)
        ) {
            continue;
        }
        let alg = match jwk.common.key_algorithm {
            None => None,
            Some(alg) => match Algorithm::try_from(alg) {
                Ok(alg) if alg.family() != AlgorithmFamily::Hmac => Some(alg),
                // An encryption or HMAC algorithm: not a signature key.
                _ => continue,
            },
        };
        let Ok(decoding) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        let key = Arc::new(Key { decoding, alg });
        match jwk.common.key_id {
            Some(kid) => {
                keys.by_kid.entry(kid).or_insert(key);
            }
            None => keys.unnamed.push(key),
        }
    }
    if keys.len() == 0 {
        return Err("no signature key toolgate can use (RSA, EC or OKP public keys)".to_owned());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSA_N: &str = "u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0_IzW7yWR7QkrmBL7jTKEn5u-qKhbwKfBstIs-bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW_VDL5AaWTg0nLVkjRo9z-40RQzuVaE8AkAFmxZzow3x-VJYKdjykkJ0iT9wCS0DRTXu269V264Vf_3jvredZiKRkgwlL9xNAwxXFg0x_XFw005UWVRIkdgcKWTjpBP2dPwVZ4WWC-9aGVd-Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbcmw";

    #[test]
    fn parses_signature_keys_and_skips_the_rest() {
        let document = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "a", "alg": "RS256", "use": "sig", "n": RSA_N, "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": RSA_N, "e": "AQAB"},
            {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
            {"kty": "weird", "kid": "w"},
            {"kty": "RSA", "n": RSA_N, "e": "AQAB"}
        ]});
        let keys = parse(document.to_string().as_bytes()).unwrap();
        assert_eq!(keys.by_kid.len(), 1);
        assert_eq!(keys.unnamed.len(), 1);
        assert!(keys.find(Some("a"), Algorithm::RS256).is_some());
        assert!(keys.find(Some("secret"), Algorithm::HS256).is_none());
        // Without a kid, two RSA keys fit RS256: ambiguous, none chosen.
        assert!(keys.find(None, Algorithm::RS256).is_none());
        assert!(!keys.by_kid["a"].fits(Algorithm::PS256));
        assert!(!keys.by_kid["a"].fits(Algorithm::ES256));
        assert!(keys.unnamed[0].fits(Algorithm::PS512));
        assert!(parse(br#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).is_err());
        assert!(parse(b"[]").is_err());
    }
}
