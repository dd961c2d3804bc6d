//! Verifying a caller's JWT: the issuer it names selects a configured
//! entry, the entry's keys verify the signature, `jsonwebtoken` checks the
//! time, issuer and audience claims, and the entry's CEL expressions name
//! the tenant and the subject from the verified claims.

use std::collections::HashMap;
use std::sync::Arc;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};

use super::Subject;
use super::jwks::{KeyError, KeySet};
use crate::config::{CallersConfig, JwksSource, JwtIssuer};

/// Longest JWT accepted, in bytes.
pub const MAX_TOKEN_BYTES: usize = 16 << 10;

/// Why a JWT does not authenticate its caller. Never holds the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// `exp` is past (beyond the clock skew).
    #[error("the token has expired")]
    Expired,
    /// `nbf` is in the future (beyond the clock skew).
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    /// `aud` is missing or names none of the issuer's audiences.
    #[error(
        "the token is not meant for this gateway (its aud is not among callers.jwt[].audiences)"
    )]
    Audience,
    /// `iss` is missing or names no configured issuer.
    #[error("the token's issuer is not one this gateway accepts (callers.jwt[].issuer)")]
    Issuer,
    /// No key of the issuer has the token's key id (after a refresh).
    #[error("no key of issuer `{issuer}` matches the token's key id")]
    KeyUnknown {
        /// The issuer.
        issuer: String,
    },
    /// The token's algorithm is `none`, not accepted for its issuer, or
    /// does not fit its key.
    #[error("{0}")]
    Algorithm(String),
    /// The tenant expression names no configured tenant, or fails.
    #[error("{0}")]
    TenantUnknown(String),
    /// The subject expression fails, or names an invalid subject.
    #[error("{0}")]
    SubjectInvalid(String),
    /// Malformed, or the signature does not verify.
    #[error("the token is not valid: {0}")]
    Invalid(String),
    /// The issuer's keys cannot be loaded and the cached ones do not hold
    /// the token's key: nothing is known about the token yet, a retry may
    /// succeed.
    #[error("the keys of issuer `{issuer}` cannot be loaded ({reason}); retry")]
    KeysUnavailable {
        /// The issuer.
        issuer: String,
        /// Why (no secrets).
        reason: String,
    },
}

/// What a verified JWT says about its caller.
#[derive(Debug, Clone)]
pub struct VerifiedJwt {
    /// The issuer (`iss`).
    pub issuer: String,
    /// The `sub` claim (empty when absent).
    pub sub: String,
    /// The tenant name the tenant expression gave (not yet looked up).
    pub tenant: String,
    /// The subject the subject expression gave, keyed under the issuer.
    pub subject: Subject,
    /// Every verified claim.
    pub claims: Arc<serde_json::Value>,
}

/// One issuer: its configuration, its keys, and its validation rules
/// (one per accepted algorithm: `jsonwebtoken` checks a signature against
/// one algorithm family at a time).
#[derive(Debug)]
struct Verifier {
    config: JwtIssuer,
    keys: Arc<KeySet>,
    validations: HashMap<Algorithm, Validation>,
}

/// The JWT issuers of one configuration, by `iss`.
#[derive(Debug, Default, Clone)]
pub struct JwtCallers {
    by_issuer: Arc<HashMap<String, Verifier>>,
}

impl JwtCallers {
    /// The issuers of `config`. A key set of `previous` (the configuration
    /// before a reload) whose issuer and source are unchanged is kept, with
    /// the keys it cached.
    pub fn new(config: &CallersConfig, previous: Option<&JwtCallers>) -> Self {
        let by_issuer = config
            .jwt
            .iter()
            .map(|issuer| {
                let kept = previous
                    .and_then(|p| p.by_issuer.get(&issuer.issuer))
                    .filter(|v| *v.keys.source() == issuer.jwks)
                    .map(|v| v.keys.clone());
                let keys = kept.unwrap_or_else(|| KeySet::new(&issuer.issuer, issuer.jwks.clone()));
                let verifier = Verifier {
                    validations: issuer
                        .algorithms
                        .iter()
                        .map(|alg| (*alg, validation(issuer, *alg)))
                        .collect(),
                    config: issuer.clone(),
                    keys,
                };
                (issuer.issuer.clone(), verifier)
            })
            .collect();
        Self {
            by_issuer: Arc::new(by_issuer),
        }
    }

    /// Loads every issuer's keys now, in configuration order: each issuer
    /// with the number of keys it has, or why they cannot be loaded (what
    /// `toolgate check` reports).
    pub async fn probe(&self) -> Vec<(String, Result<usize, String>)> {
        let mut verifiers: Vec<&Verifier> = self.by_issuer.values().collect();
        verifiers.sort_by(|a, b| a.config.path.cmp(&b.config.path));
        let mut report = Vec::with_capacity(verifiers.len());
        for verifier in verifiers {
            report.push((verifier.config.issuer.clone(), verifier.keys.probe().await));
        }
        report
    }

    /// Whether no issuer is configured (static tokens only).
    pub fn is_empty(&self) -> bool {
        self.by_issuer.is_empty()
    }

    /// Verifies `token` and evaluates its issuer's expressions.
    ///
    /// # Errors
    /// The token is refused: [`TokenError`] says why.
    pub async fn verify(&self, token: &str) -> Result<VerifiedJwt, TokenError> {
        let (verifier, claims) = self.verified_claims(token).await?;
        identify(verifier, claims)
    }

    /// Verifies `token` as an admin API caller's: its signature, time,
    /// issuer and audience as for any caller, then its issuer's `admin`
    /// expression (`callers.jwt[].admin`) over its claims instead of the
    /// tenant and subject expressions. Returns the issuer, the `sub` claim
    /// (empty when absent), and whether it is admitted: the expression
    /// gives `true` (not when the issuer has no `admin` expression, or it
    /// gives anything else or fails).
    ///
    /// # Errors
    /// The token is refused: [`TokenError`] says why.
    pub async fn verify_admin(&self, token: &str) -> Result<(String, String, bool), TokenError> {
        let (verifier, claims) = self.verified_claims(token).await?;
        let admitted = verifier
            .config
            .admin
            .as_ref()
            .is_some_and(|admin| matches!(admin.evaluate(&claims), Ok(cel::Value::Bool(true))));
        let sub = claims
            .get("sub")
            .and_then(|s| s.as_str())
            .unwrap_or_default()
            .to_owned();
        Ok((verifier.config.issuer.clone(), sub, admitted))
    }

    /// The issuer's verifier and the claims of `token`, verified.
    async fn verified_claims(
        &self,
        token: &str,
    ) -> Result<(&Verifier, serde_json::Value), TokenError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::Invalid(format!(
                "longer than {MAX_TOKEN_BYTES} bytes"
            )));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| header_error(token))?;
        // The issuer is read before the signature is checked, only to
        // choose whose keys check it; the verified `iss` must match too.
        #[derive(serde::Deserialize)]
        struct Routing {
            iss: Option<String>,
        }
        let routing: Routing = jsonwebtoken::dangerous::insecure_decode_claims(token)
            .map_err(|_| TokenError::Invalid("the claims are not a JSON object".to_owned()))?;
        let verifier = routing
            .iss
            .as_deref()
            .and_then(|iss| self.by_issuer.get(iss))
            .ok_or(TokenError::Issuer)?;
        let issuer = &verifier.config.issuer;
        let Some(validation) = verifier.validations.get(&header.alg) else {
            return Err(TokenError::Algorithm(format!(
                "algorithm {:?} is not accepted for issuer `{issuer}` ({}.algorithms)",
                header.alg, verifier.config.path
            )));
        };
        let key = verifier
            .keys
            .key(header.kid.as_deref(), header.alg)
            .await
            .map_err(|e| match e {
                KeyError::Unknown => TokenError::KeyUnknown {
                    issuer: issuer.clone(),
                },
                KeyError::Unavailable(reason) => TokenError::KeysUnavailable {
                    issuer: issuer.clone(),
                    reason,
                },
            })?;
        if !key.fits(header.alg) {
            return Err(TokenError::Algorithm(format!(
                "algorithm {:?} does not fit the key the token names",
                header.alg
            )));
        }
        let data = jsonwebtoken::decode::<serde_json::Value>(token, &key.decoding, validation)
            .map_err(|e| validation_error(e.kind()))?;
        let claims = data.claims;
        if !claims.is_object() {
            return Err(TokenError::Invalid(
                "the claims are not a JSON object".to_owned(),
            ));
        }
        Ok((verifier, claims))
    }

    /// Re-checks a caller this gateway verified earlier (by `issuer`, with
    /// these verified `claims`) against this configuration, without its
    /// token: the issuer is still configured with the same key source,
    /// `exp` and `nbf` hold now within its clock skew, `aud` names one of
    /// its audiences, and its expressions name a tenant and subject again.
    /// What a long-lived stream asks at every configuration change and
    /// before each message.
    ///
    /// # Errors
    /// The caller would be refused now: [`TokenError`] says why.
    pub fn recheck(
        &self,
        issuer: &str,
        source: &JwksSource,
        claims: &serde_json::Value,
    ) -> Result<VerifiedJwt, TokenError> {
        let verifier = self.by_issuer.get(issuer).ok_or(TokenError::Issuer)?;
        if verifier.keys.source() != source {
            return Err(TokenError::KeyUnknown {
                issuer: issuer.to_owned(),
            });
        }
        let now = unix_now();
        let leeway = verifier.config.clock_skew.as_secs();
        match claims.get("exp").and_then(serde_json::Value::as_u64) {
            Some(exp) if exp.saturating_add(leeway) > now => {}
            Some(_) => return Err(TokenError::Expired),
            None => {
                return Err(TokenError::Invalid(
                    "the `exp` claim is required".to_owned(),
                ));
            }
        }
        if claims
            .get("nbf")
            .and_then(serde_json::Value::as_u64)
            .is_some_and(|nbf| nbf > now.saturating_add(leeway))
        {
            return Err(TokenError::NotYetValid);
        }
        let audiences = &verifier.config.audiences;
        let names_audience = match claims.get("aud") {
            Some(serde_json::Value::String(aud)) => audiences.contains(aud),
            Some(serde_json::Value::Array(auds)) => auds
                .iter()
                .filter_map(serde_json::Value::as_str)
                .any(|aud| audiences.iter().any(|a| a == aud)),
            _ => false,
        };
        if !names_audience {
            return Err(TokenError::Audience);
        }
        identify(verifier, claims.clone())
    }

    /// Where the keys of `issuer` come from, if it is configured.
    pub fn key_source(&self, issuer: &str) -> Option<&JwksSource> {
        self.by_issuer.get(issuer).map(|v| v.keys.source())
    }

    /// When a token of `issuer` with these claims stops being accepted:
    /// its `exp` plus the issuer's clock skew (`None`: no such issuer, or
    /// no numeric `exp`).
    pub fn expires_at(
        &self,
        issuer: &str,
        claims: &serde_json::Value,
    ) -> Option<std::time::SystemTime> {
        let verifier = self.by_issuer.get(issuer)?;
        let exp = claims.get("exp").and_then(serde_json::Value::as_u64)?;
        std::time::UNIX_EPOCH
            .checked_add(std::time::Duration::from_secs(exp))?
            .checked_add(verifier.config.clock_skew)
    }
}

/// Seconds since the Unix epoch, now.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Who verified `claims` name: the issuer's tenant and subject
/// expressions evaluated over them.
fn identify(verifier: &Verifier, claims: serde_json::Value) -> Result<VerifiedJwt, TokenError> {
    let issuer = &verifier.config.issuer;
    {
        let path = &verifier.config.path;
        let tenant = super::expressions::tenant(&verifier.config.tenant, &claims, path, "token")
            .map_err(TokenError::TenantUnknown)?;
        let subject = super::expressions::subject(
            &verifier.config.subject,
            &claims,
            path,
            "token",
            super::Namespace::Jwt(issuer),
        )
        .map_err(TokenError::SubjectInvalid)?;
        Ok(VerifiedJwt {
            issuer: issuer.clone(),
            sub: claims
                .get("sub")
                .and_then(|s| s.as_str())
                .unwrap_or_default()
                .to_owned(),
            tenant,
            subject,
            claims: Arc::new(claims),
        })
    }
}

/// The checks `jsonwebtoken` makes of a token signed with `alg`: the
/// signature; `exp`, `iss` and `aud` required; `exp` and `nbf` within the
/// clock skew; the issuer; one of the audiences.
fn validation(issuer: &JwtIssuer, alg: Algorithm) -> Validation {
    let mut validation = Validation::new(alg);
    validation.leeway = issuer.clock_skew.as_secs();
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.validate_aud = true;
    validation.set_issuer(&[&issuer.issuer]);
    validation.set_audience(&issuer.audiences);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    validation
}

/// Why a header `jsonwebtoken` cannot read is refused: an algorithm it
/// does not know (`none` above all) is an algorithm error, anything else
/// a malformed token.
fn header_error(token: &str) -> TokenError {
    use base64::Engine as _;
    #[derive(serde::Deserialize)]
    struct Alg {
        alg: String,
    }
    let alg = token
        .split('.')
        .next()
        .and_then(|h| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h)
                .ok()
        })
        .and_then(|bytes| serde_json::from_slice::<Alg>(&bytes).ok());
    match alg {
        Some(Alg { alg }) if alg.eq_ignore_ascii_case("none") => TokenError::Algorithm(
            "the token is unsigned (alg none); unsigned tokens are never accepted".to_owned(),
        ),
        Some(Alg { alg }) if alg.parse::<Algorithm>().is_err() => TokenError::Algorithm(format!(
            "algorithm `{}` is not one toolgate verifies",
            super::quoted(&alg)
        )),
        _ => TokenError::Invalid("the header is not a JWT header".to_owned()),
    }
}

fn validation_error(kind: &ErrorKind) -> TokenError {
    match kind {
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::ImmatureSignature => TokenError::NotYetValid,
        ErrorKind::InvalidAudience => TokenError::Audience,
        ErrorKind::InvalidIssuer => TokenError::Issuer,
        ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => TokenError::Audience,
        ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => TokenError::Issuer,
        ErrorKind::MissingRequiredClaim(claim) => {
            TokenError::Invalid(format!("the `{claim}` claim is required"))
        }
        ErrorKind::InvalidClaimFormat(claim) => {
            TokenError::Invalid(format!("the `{claim}` claim is malformed"))
        }
        ErrorKind::InvalidAlgorithm
        | ErrorKind::MissingAlgorithm
        | ErrorKind::UnsupportedAlgorithm
        | ErrorKind::InvalidAlgorithmName => {
            TokenError::Algorithm("the token's algorithm does not fit its key".to_owned())
        }
        ErrorKind::InvalidSignature => {
            TokenError::Invalid("the signature does not verify".to_owned())
        }
        _ => TokenError::Invalid("malformed".to_owned()),
    }
}
