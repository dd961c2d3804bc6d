//! DPoP (RFC 9449), the piece rmcp 3.11 lacks: a proof key, a proof per
//! request, and the server-provided nonces. Everything else about the
//! tokens stays rmcp's: the [`OAuthHttp`] client below is handed to rmcp's
//! `AuthorizationManager` (its `OAuthHttpClient` seam), which then does
//! discovery, registration and every token request as usual; the client
//! adds a proof to the requests that go to a token endpoint.
//!
//! - [`DpopKey`]: an ES256 (P-256) key, generated (ring) or configured
//!   (PKCS#8 PEM); proofs are JWTs signed with it (jsonwebtoken): header
//!   `typ: dpop+jwt`, `alg: ES256`, `jwk` (the public key), claims `jti`,
//!   `htm`, `htu` (no query or fragment), `iat`, `ath` (SHA-256 of the
//!   access token, on resource requests) and `nonce` (when the server gave
//!   one).
//! - [`Dpop`]: the key and the last nonce each server gave (per target
//!   URL), for proofs to the token endpoint and the resource alike.
//! - [`OAuthHttp`]: toolgate's HTTP client for rmcp's OAuth requests when
//!   DPoP is on (and for the JWT-bearer grant): the address rule of
//!   [`super::oauth`] applied to every resolved address, a proof on each
//!   token request, one retry on `use_dpop_nonce` (RFC 9449 section 8).
//! - [`learn_resource_nonce`]: rmcp's streamable HTTP client keeps only the
//!   `WWW-Authenticate` header of a 401, so a resource server's
//!   `use_dpop_nonce` challenge (RFC 9449 section 9) loses its `DPoP-Nonce`;
//!   one JSON-RPC `ping` sent here reads it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderName, HeaderValue};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, ThumbprintHash};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rmcp::transport::auth::{
    OAuthHttpClient, OAuthHttpClientError, OAuthHttpClientFuture, OAuthHttpRedirectPolicy,
    OAuthHttpRequest,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use url::Url;

use crate::config::Secret;
use crate::config::address::allowed;

/// The `DPoP` request header, and the `DPoP-Nonce` response header.
pub const DPOP_HEADER: &str = "dpop";
/// The response header carrying a server-provided nonce.
pub const DPOP_NONCE_HEADER: &str = "dpop-nonce";

/// How long one OAuth HTTP request may take (rmcp's default).
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest OAuth response body read (rmcp's bound).
const MAX_BODY: usize = 1024 * 1024;

/// Most redirects followed where rmcp asks for them (registration).
const MAX_REDIRECTS: usize = 10;

/// Longest nonce kept (longer ones are ignored).
const MAX_NONCE_LEN: usize = 1024;

/// Most target URLs whose nonce is kept (the oldest are dropped at once).
const MAX_NONCES: usize = 1024;

/// Why a proof could not be made.
#[derive(Debug, Clone, thiserror::Error)]
#[error("DPoP: {0}")]
pub struct DpopError(String);

/// A DPoP proof key: ES256 (P-256). `Debug` shows only its thumbprint.
pub struct DpopKey {
    encoding: EncodingKey,
    jwk: Jwk,
}

impl fmt::Debug for DpopKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DpopKey")
            .field("jkt", &self.thumbprint())
            .finish()
    }
}

/// A proof's claims (RFC 9449 section 4.2).
#[derive(Serialize)]
struct Claims<'a> {
    jti: String,
    htm: &'a str,
    htu: String,
    iat: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    ath: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nonce: Option<&'a str>,
}

impl DpopKey {
    /// A new random P-256 key.
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn generate() -> Result<Self, DpopError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &rng,
        )
        .map_err(|_| DpopError("cannot generate a P-256 key".into()))?;
        Self::from_encoding(EncodingKey::from_ec_der(pkcs8.as_ref()))
    }

    /// The P-256 private key of a PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`).
    ///
    /// # Errors
    /// Not a PKCS#8 PEM of a P-256 key.
    pub fn from_pem(pem: &str) -> Result<Self, DpopError> {
        let encoding = EncodingKey::from_ec_pem(pem.as_bytes())
            .map_err(|_| DpopError("the key is not a PKCS#8 PEM EC private key".into()))?;
        Self::from_encoding(encoding)
    }

    fn from_encoding(encoding: EncodingKey) -> Result<Self, DpopError> {
        let jwk = Jwk::from_encoding_key(&encoding, Algorithm::ES256)
            .map_err(|_| DpopError("the key is not a P-256 private key".into()))?;
        match &jwk.algorithm {
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {}
            _ => return Err(DpopError("the key is not a P-256 private key".into())),
        }
        Ok(Self { encoding, jwk })
    }

    /// The public key's JWK SHA-256 thumbprint (RFC 7638): the `jkt` a
    /// bound token's `cnf` names.
    pub fn thumbprint(&self) -> String {
        self.jwk
            .thumbprint(ThumbprintHash::SHA256)
            .unwrap_or_default()
    }

    /// A proof for one `method` request to `url`, bound to `access_token`
    /// (`ath`) when given, carrying `nonce` when given.
    ///
    /// # Errors
    /// `url` is not an absolute http(s) URL, or signing failed.
    pub fn proof(
        &self,
        method: &str,
        url: &str,
        access_token: Option<&str>,
        nonce: Option<&str>,
    ) -> Result<String, DpopError> {
        let mut header = Header::new(Algorithm::ES256);
        header.typ = Some("dpop+jwt".to_owned());
        header.jwk = Some(self.jwk.clone());
        let claims = Claims {
            jti: random_id()?,
            htm: method,
            htu: htu(url)?,
            iat: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            ath: access_token.map(|token| URL_SAFE_NO_PAD.encode(Sha256::digest(token))),
            nonce,
        };
        jsonwebtoken::encode(&header, &claims, &self.encoding)
            .map_err(|e| DpopError(format!("signing the proof failed: {e}")))
    }
}

/// 128 random bits, base64url: a proof's `jti`.
fn random_id() -> Result<String, DpopError> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| DpopError("the random source failed".into()))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// The `htu` of a request to `url`: the URL without query and fragment.
///
/// # Errors
/// `url` is not an absolute http(s) URL.
pub fn htu(url: &str) -> Result<String, DpopError> {
    let mut url = Url::parse(url).map_err(|_| DpopError("the target is not a URL".into()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(DpopError("the target is not an http(s) URL".into()));
    }
    url.set_query(None);
    url.set_fragment(None);
    Ok(url.into())
}

/// A client's DPoP key and the nonces servers gave it, per target URL
/// (`htu`). Shared by every token and resource request of one OAuth client.
#[derive(Debug)]
pub struct Dpop {
    key: DpopKey,
    nonces: Mutex<HashMap<String, String>>,
}

impl Dpop {
    /// Proofs signed with `key`.
    pub fn new(key: DpopKey) -> Self {
        Self {
            key,
            nonces: Mutex::default(),
        }
    }

    /// The key.
    pub fn key(&self) -> &DpopKey {
        &self.key
    }

    /// A proof for a `method` request to `url` (with the nonce its server
    /// gave last, if any), bound to `access_token` when given.
    ///
    /// # Errors
    /// As [`DpopKey::proof`].
    pub fn proof(
        &self,
        method: &str,
        url: &str,
        access_token: Option<&str>,
    ) -> Result<String, DpopError> {
        let nonce = self.nonce(url);
        self.key.proof(method, url, access_token, nonce.as_deref())
    }

    /// The nonce the server of `url` gave last.
    pub fn nonce(&self, url: &str) -> Option<String> {
        let target = htu(url).ok()?;
        self.lock().get(&target).cloned()
    }

    /// Keeps `nonce`, which the server of `url` sent (`DPoP-Nonce`), for
    /// the next proofs to `url`. A malformed or oversized value is ignored.
    pub fn remember_nonce(&self, url: &str, nonce: &str) {
        // RFC 9449 section 8.1: nonce = 1*NQCHAR.
        let valid = !nonce.is_empty()
            && nonce.len() <= MAX_NONCE_LEN
            && nonce
                .bytes()
                .all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\');
        let Ok(target) = htu(url) else { return };
        if !valid {
            return;
        }
        let mut nonces = self.lock();
        if nonces.len() >= MAX_NONCES && !nonces.contains_key(&target) {
            nonces.clear();
        }
        nonces.insert(target, nonce.to_owned());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.nonces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether a `WWW-Authenticate` challenge (`error="use_dpop_nonce"`), or a
/// token endpoint's `error` value, asks for a DPoP nonce.
pub fn is_use_dpop_nonce(challenge: &str) -> bool {
    let compact: String = challenge
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    compact == "use_dpop_nonce"
        || compact.contains("error=\"use_dpop_nonce\"")
        || compact.contains("error=use_dpop_nonce")
}

/// How a request to the resource server carries an access token.
#[derive(Clone)]
pub struct ResourceAuth {
    /// The `Authorization` value: `Bearer <token>`, or `DPoP <token>` for a
    /// DPoP-bound token.
    pub authorization: Secret,
    /// The `DPoP` header: a proof for this one request (bound tokens only).
    pub dpop: Option<String>,
}

impl fmt::Debug for ResourceAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceAuth")
            .field("authorization", &"***")
            .field("dpop", &self.dpop.as_ref().map(|_| "<proof>"))
            .finish()
    }
}

impl ResourceAuth {
    /// The two headers, values marked sensitive.
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut headers = Vec::with_capacity(2);
        if let Ok(mut value) = HeaderValue::from_str(self.authorization.expose()) {
            value.set_sensitive(true);
            headers.push((http::header::AUTHORIZATION, value));
        }
        if let Some(proof) = &self.dpop
            && let Ok(mut value) = HeaderValue::from_str(proof)
        {
            value.set_sensitive(true);
            headers.push((HeaderName::from_static(DPOP_HEADER), value));
        }
        headers
    }
}

/// Reads the DPoP nonce of the resource server at `url` after it answered
/// `use_dpop_nonce`: rmcp's streamable HTTP client hands over only the
/// challenge of a 401, not its `DPoP-Nonce` header. One JSON-RPC `ping`
/// (no side effects) is sent with `auth` (a fresh proof for this POST) and
/// `headers` (the session's: `Mcp-Session-Id`, `MCP-Protocol-Version`);
/// whatever the answer, its `DPoP-Nonce` is the nonce. `None` when the
/// server sent none.
pub async fn learn_resource_nonce(
    client: &reqwest::Client,
    url: &str,
    auth: &ResourceAuth,
    headers: &[(HeaderName, HeaderValue)],
) -> Option<String> {
    let mut request = client
        .post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, text/event-stream")
        .timeout(HTTP_TIMEOUT)
        .body(r#"{"jsonrpc":"2.0","id":"toolgate-dpop-nonce","method":"ping"}"#);
    for (name, value) in headers.iter().cloned().chain(auth.headers()) {
        request = request.header(name, value);
    }
    let response = request.send().await.ok()?;
    let nonce = response
        .headers()
        .get(DPOP_NONCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    drop(response);
    nonce
}

/// toolgate's HTTP client for rmcp's OAuth requests (`OAuthHttpClient`)
/// when DPoP is on, and for the JWT-bearer grant: every resolved address
/// (and IP-literal host, redirects included) passes the address rule of
/// [`super::oauth`]; a POST to a token endpoint carries a proof and is
/// retried once when the authorization server asks for a nonce.
pub struct OAuthHttp {
    follow: reqwest::Client,
    stop: reqwest::Client,
    allow_private: bool,
    dpop: Option<Arc<Dpop>>,
    token_endpoints: Mutex<HashSet<String>>,
}

impl fmt::Debug for OAuthHttp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthHttp")
            .field("allow_private", &self.allow_private)
            .field("dpop", &self.dpop.is_some())
            .finish()
    }
}

/// Whether `url`'s host is an IP literal the address rule refuses (names
/// are checked when they resolve).
fn literal_refused(url: &Url, allow_private: bool) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => !allowed(ip.into(), allow_private),
        Some(url::Host::Ipv6(ip)) => !allowed(ip.into(), allow_private),
        _ => false,
    }
}

/// A resolver that refuses names with an address the rule refuses.
struct Resolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if found.iter().any(|a| !allowed(a.ip(), allow_private)) {
                return Err(format!("{host} resolves to a private or reserved address").into());
            }
            Ok(Box::new(found.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[derive(Debug, thiserror::Error)]
enum HttpError {
    #[error("{0} is on a private or reserved address")]
    Refused(String),
    #[error("the response body exceeds {MAX_BODY} bytes")]
    TooLarge,
    #[error("DPoP: {0}")]
    Dpop(#[from] DpopError),
}

impl OAuthHttp {
    /// A client under the address rule (`allow_private`: private and
    /// loopback addresses allowed), with proofs from `dpop` when given.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(allow_private: bool, dpop: Option<Arc<Dpop>>) -> Result<Self, String> {
        let build = |redirect: reqwest::redirect::Policy| {
            reqwest::Client::builder()
                .timeout(HTTP_TIMEOUT)
                .redirect(redirect)
                .dns_resolver(Arc::new(Resolver { allow_private }))
                .build()
                .map_err(|e| e.to_string())
        };
        let follow = reqwest::redirect::Policy::custom(move |attempt| {
            if literal_refused(attempt.url(), allow_private) {
                let shown = attempt.url().origin().ascii_serialization();
                attempt.error(HttpError::Refused(shown))
            } else if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error("too many redirects")
            } else {
                attempt.follow()
            }
        });
        Ok(Self {
            follow: build(follow)?,
            stop: build(reqwest::redirect::Policy::none())?,
            allow_private,
            dpop,
            token_endpoints: Mutex::default(),
        })
    }

    /// The DPoP state, when proofs are on.
    pub fn dpop(&self) -> Option<&Arc<Dpop>> {
        self.dpop.as_ref()
    }

    /// Marks `url` as a token endpoint: POSTs to it carry a proof.
    pub fn add_token_endpoint(&self, url: &str) {
        if let Ok(target) = htu(url) {
            self.token_endpoints
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(target);
        }
    }

    fn is_token_endpoint(&self, url: &str) -> bool {
        htu(url).is_ok_and(|target| {
            self.token_endpoints
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&target)
        })
    }

    /// Sends `request` (following redirects when `follow`); a POST to a
    /// token endpoint gets a proof and, on `use_dpop_nonce` with a
    /// `DPoP-Nonce`, one more try with that nonce.
    ///
    /// # Errors
    /// The address rule refused the host, the request failed, or the body
    /// is too large.
    pub async fn send(
        &self,
        request: http::Request<Vec<u8>>,
        follow: bool,
    ) -> Result<http::Response<Vec<u8>>, OAuthHttpClientError> {
        let url = request.uri().to_string();
        let dpop = self
            .dpop
            .as_ref()
            .filter(|_| request.method() == http::Method::POST && self.is_token_endpoint(&url));
        let Some(dpop) = dpop else {
            return self.execute_once(request, follow).await;
        };
        let mut retried = false;
        loop {
            let mut attempt = request.clone();
            let proof = dpop.proof("POST", &url, None).map_err(HttpError::from)?;
            attempt.headers_mut().insert(
                HeaderName::from_static(DPOP_HEADER),
                HeaderValue::from_str(&proof).map_err(|e| Box::new(e) as OAuthHttpClientError)?,
            );
            let response = self.execute_once(attempt, follow).await?;
            let nonce = response
                .headers()
                .get(DPOP_NONCE_HEADER)
                .and_then(|v| v.to_str().ok());
            if let Some(nonce) = nonce {
                dpop.remember_nonce(&url, nonce);
            }
            let asks_nonce = response.status() == http::StatusCode::BAD_REQUEST
                && nonce.is_some()
                && serde_json::from_slice::<serde_json::Value>(response.body())
                    .ok()
                    .and_then(|v| v.get("error")?.as_str().map(is_use_dpop_nonce))
                    .unwrap_or(false);
            if !asks_nonce || retried {
                return Ok(response);
            }
            retried = true;
        }
    }

    async fn execute_once(
        &self,
        request: http::Request<Vec<u8>>,
        follow: bool,
    ) -> Result<http::Response<Vec<u8>>, OAuthHttpClientError> {
        let request = reqwest::Request::try_from(request)?;
        if literal_refused(request.url(), self.allow_private) {
            let shown = request.url().origin().ascii_serialization();
            return Err(Box::new(HttpError::Refused(shown)));
        }
        let client = if follow { &self.follow } else { &self.stop };
        let mut response = client.execute(request).await?;
        let mut builder = http::Response::builder()
            .status(response.status())
            .version(response.version());
        for (name, value) in response.headers() {
            builder = builder.header(name, value);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if chunk.len() > MAX_BODY - body.len() {
                return Err(Box::new(HttpError::TooLarge));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(builder.body(body)?)
    }
}

impl OAuthHttpClient for OAuthHttp {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        let follow = matches!(request.redirect_policy, OAuthHttpRedirectPolicy::Follow);
        Box::pin(self.send(request.request, follow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claims of a JWT, unverified.
    fn claims(jwt: &str) -> serde_json::Value {
        let payload = jwt.split('.').nth(1).expect("a payload");
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("base64url"))
            .expect("JSON claims")
    }

    fn header(jwt: &str) -> serde_json::Value {
        let header = jwt.split('.').next().expect("a header");
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64url"))
            .expect("JSON header")
    }

    #[test]
    fn proofs_carry_what_rfc_9449_asks_and_verify() {
        let key = DpopKey::generate().expect("a key");
        let proof = key
            .proof(
                "POST",
                "https://rs.example/mcp?x=1#f",
                Some("token"),
                Some("n-1"),
            )
            .expect("a proof");
        let h = header(&proof);
        assert_eq!(h["typ"], "dpop+jwt");
        assert_eq!(h["alg"], "ES256");
        assert_eq!(h["jwk"]["kty"], "EC");
        assert_eq!(h["jwk"]["crv"], "P-256");
        assert!(h["jwk"].get("d").is_none(), "no private key in the header");
        let c = claims(&proof);
        assert_eq!(c["htm"], "POST");
        assert_eq!(c["htu"], "https://rs.example/mcp");
        assert_eq!(c["nonce"], "n-1");
        assert_eq!(
            c["ath"],
            URL_SAFE_NO_PAD.encode(Sha256::digest(b"token")).as_str()
        );
        assert!(c["iat"].as_u64().is_some_and(|iat| iat > 0));
        // The signature verifies with the key in the header.
        let jwk: Jwk = serde_json::from_value(h["jwk"].clone()).expect("a JWK");
        let decoding = jsonwebtoken::DecodingKey::from_jwk(&jwk).expect("a decoding key");
        let mut validation = jsonwebtoken::Validation::new(Algorithm::ES256);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        jsonwebtoken::decode::<serde_json::Value>(&proof, &decoding, &validation)
            .expect("the proof verifies");
        // Fresh jti, no ath or nonce unless given.
        let other = claims(
            &key.proof("GET", "https://rs.example/mcp", None, None)
                .unwrap(),
        );
        assert_ne!(other["jti"], c["jti"]);
        assert!(other.get("ath").is_none() && other.get("nonce").is_none());
    }

    #[test]
    fn a_pem_key_is_used_and_its_thumbprint_is_stable() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &rng,
        )
        .expect("a key");
        let body = base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref());
        let pem = format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n");
        let a = DpopKey::from_pem(&pem).expect("a PEM key");
        let b = DpopKey::from_pem(&pem).expect("a PEM key");
        assert_eq!(a.thumbprint(), b.thumbprint());
        assert_ne!(
            a.thumbprint(),
            DpopKey::generate().expect("a key").thumbprint()
        );
        assert!(DpopKey::from_pem("not a key").is_err());
        assert!(format!("{a:?}").contains("jkt"));
    }

    #[test]
    fn nonces_are_kept_per_target_and_checked() {
        let dpop = Dpop::new(DpopKey::generate().expect("a key"));
        dpop.remember_nonce("https://as.example/token?q", "abc");
        assert_eq!(
            dpop.nonce("https://as.example/token").as_deref(),
            Some("abc")
        );
        assert_eq!(dpop.nonce("https://rs.example/mcp"), None);
        dpop.remember_nonce("https://rs.example/mcp", "bad\"nonce");
        dpop.remember_nonce("https://rs.example/mcp", "");
        assert_eq!(dpop.nonce("https://rs.example/mcp"), None);
        let proof = dpop
            .proof("POST", "https://as.example/token", None)
            .expect("a proof");
        assert_eq!(claims(&proof)["nonce"], "abc");
    }

    #[test]
    fn challenges_asking_for_a_nonce_are_recognised() {
        assert!(is_use_dpop_nonce(
            r#"DPoP error="use_dpop_nonce", resource_metadata="https://x""#
        ));
        assert!(is_use_dpop_nonce("use_dpop_nonce"));
        assert!(!is_use_dpop_nonce(r#"Bearer error="invalid_token""#));
        assert!(!is_use_dpop_nonce(
            r#"Bearer error="invalid_token", error_description="no use_dpop_nonce here""#
        ));
    }

    #[test]
    fn literal_hosts_follow_the_address_rule() {
        let url = |s: &str| Url::parse(s).expect("a URL");
        assert!(literal_refused(&url("http://127.0.0.1/token"), false));
        assert!(!literal_refused(&url("http://127.0.0.1/token"), true));
        assert!(literal_refused(&url("http://169.254.169.254/"), true));
        assert!(!literal_refused(&url("https://as.example/token"), false));
    }
}

#[cfg(test)]
mod address_rule_tests {
    use super::*;

    /// A request to `url` through a rule-bound client.
    async fn get(allow_private: bool, url: &str) -> Result<u16, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = OAuthHttp::new(allow_private, None).expect("a client");
        let request = http::Request::get(url).body(Vec::new()).expect("a request");
        http.send(request, false)
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| format!("{e:?}"))
    }

    #[tokio::test]
    async fn every_resolved_address_passes_the_rule() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        // A name that resolves to loopback is refused when it resolves,
        // whatever a check ahead saw; allowed with the setting.
        let by_name = format!("http://localhost:{port}/");
        assert!(get(false, &by_name).await.is_err());
        assert_eq!(get(true, &by_name).await, Ok(200));
        // Literal hosts: metadata and embedded forms refused even with the
        // setting.
        for host in [
            "169.254.169.254",
            "100.100.100.200",
            "[fd00:ec2::254]",
            "[64:ff9b::a9fe:a9fe]",
            "[2002:a9fe:a9fe::1]",
            "[::ffff:169.254.169.254]",
        ] {
            let err = get(true, &format!("http://{host}/")).await.unwrap_err();
            assert!(err.contains("Refused"), "{host}: {err}");
        }
    }
}
