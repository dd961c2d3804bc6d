//! Caller authentication: who is calling. The caller's credential
//! (`authorization: Bearer ...`) becomes its tenant, the [`Subject`] the
//! call acts for and the [`Caller`] (how it proved itself, its verified
//! claims). Everything that decides it lives here; the gRPC surface applies
//! it to every request as a tower layer (`grpc::AuthLayer`) and answers a
//! refusal through the one status table.
//!
//! A credential is a tenant's static token (looked up by digest, compared
//! in constant time: [`TokenTable`]) or, when `callers.jwt` is configured,
//! a JWT from one of its issuers ([`JwtCallers`]). A static token is tried
//! first, so every static token works as it always did.
//!
//! The subject of a JWT caller is its issuer's subject expression. An
//! `x-toolgate-subject` sent with a JWT must name the same subject, else
//! the call is refused (INVALID_SUBJECT): a header cannot make a workload
//! act for someone its token does not name, and a client that means
//! another subject learns it at once instead of acting for the wrong one.
//! A subject is keyed by who vouched for it ([`Subject::key`]): the same
//! id named by a static token and by a JWT, or by two issuers, are two
//! subjects.
//!
//! A call without a bearer token whose connection presented a verified
//! client certificate is authenticated by the certificate alone, when
//! `callers.mtls` is configured ([`CertCallers`]): the first entry whose
//! `trust_domain` matches names its tenant and subject. A call with a
//! token is authenticated by the token, exactly as without a
//! certificate; when its connection's certificate matches an entry, the
//! tenant that entry names must be the token's, else the call is refused
//! (CALLER_IDENTITY_CONFLICT): a stolen token is no use on a workload's
//! connection, and a workload cannot borrow another tenant's token. The
//! subject is then the token's. A certificate no entry matches leaves a
//! token caller as it was (the certificate only secured the connection).
//!
//! This room knows configuration and nothing above it: the tenants it
//! authenticates against come through the [`Directory`] trait, which the
//! registry implements.

mod cert;
mod expressions;
mod identity;
mod jwks;
mod jwt;
mod mtls;
mod subject_token;
mod tokens;

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

pub use cert::{PeerCertificate, SpiffeId, UnreadableCertificate, rfc4514};
pub use identity::{Caller, CallerIdentity, MAX_SUBJECT_LEN, Namespace, SUBJECT_METADATA, Subject};
pub use jwt::{JwtCallers, MAX_TOKEN_BYTES, TokenError, VerifiedJwt};
pub use mtls::{CertCallers, CertError, RECOGNIZED_CERTIFICATES, Recognized, VerifiedCert};
pub use subject_token::SubjectToken;
pub(crate) use tokens::bearer;
pub use tokens::{TokenDigest, TokenTable};

/// Most characters of a caller's string quoted in a status message or a
/// log line (a valid tool name always fits).
pub const MAX_QUOTED: usize = 64;

/// A caller's string as quoted in statuses and logs: at most
/// [`MAX_QUOTED`] characters, then how much was left out.
pub fn quoted(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(MAX_QUOTED) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!("{}… ({} bytes in all)", &text[..end], text.len())),
    }
}

/// Why a caller was refused.
#[derive(Debug, thiserror::Error)]
pub enum CallerError {
    /// No, malformed or unknown credential.
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),
    /// The `x-toolgate-subject` metadata is malformed, or differs from the
    /// subject the caller's JWT names.
    #[error("invalid subject: {0}")]
    InvalidSubject(&'static str),
    /// The caller's JWT is refused (or its issuer's keys cannot be loaded).
    #[error("unauthenticated: {0}")]
    Token(TokenError),
    /// The caller's client certificate is refused, or names another
    /// tenant than its token.
    #[error("unauthenticated: {0}")]
    Certificate(CertError),
    /// The credential is not one of a loaded tenant's, and the state store
    /// (tenants written through the admin API) cannot be asked: retryable.
    #[error("the tenant store cannot be reached: {0}")]
    TenantStoreUnavailable(String),
}

/// The tenants callers authenticate against: one generation of the
/// configuration (the registry's current one), and the tenants of the
/// state store, which are looked up (and loaded) when a caller first
/// names them. A lookup that needs the store may fail with it
/// unreachable ([`CallerError::TenantStoreUnavailable`]).
pub trait Directory: Sync {
    /// What a tenant is to the caller of [`authenticate`].
    type Tenant: Send;

    /// The tenant a static token selects, and the caller it proves.
    ///
    /// # Errors
    /// The token is not known here and the state store cannot be asked.
    fn by_token(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<(Self::Tenant, Caller)>, CallerError>> + Send;

    /// The tenant a static token with this digest selects now, among the
    /// tenants at hand (the re-check of a caller whose token is no longer
    /// at hand; a caller being re-checked holds its tenant loaded).
    fn by_token_digest(&self, digest: &TokenDigest) -> Option<Self::Tenant>;

    /// The JWT issuers of the configuration (`callers.jwt`).
    fn jwt_callers(&self) -> JwtCallers;

    /// The certificate callers of the configuration (`callers.mtls`).
    fn cert_callers(&self) -> CertCallers;

    /// The name of `tenant` (what a certificate's tenant expression is
    /// compared with).
    fn tenant_name<'t>(&self, tenant: &'t Self::Tenant) -> &'t str;

    /// The tenant named `name` (a JWT caller names its tenant), looked up
    /// in the state store when it is not at hand.
    ///
    /// # Errors
    /// The name is not known here and the state store cannot be asked.
    fn tenant_named(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Self::Tenant>, CallerError>> + Send;

    /// The tenant named `name` among the tenants at hand (the re-check).
    fn loaded_tenant_named(&self, name: &str) -> Option<Self::Tenant>;
}

/// Who a request authenticated as: what goes into its extensions.
#[derive(Debug, Clone)]
pub struct Authenticated<T> {
    /// The caller's tenant.
    pub tenant: T,
    /// Whom the call acts for.
    pub subject: Subject,
    /// How the caller proved itself, and its claims.
    pub caller: Caller,
    /// What [`recheck`] needs to ask a later configuration about the
    /// caller.
    pub presented: Presented,
    /// The caller's verified JWT, for a `callers.jwt` caller only: what
    /// the delegation grants exchange. Static-token and certificate
    /// callers have none.
    pub subject_token: Option<SubjectToken>,
}

/// What a caller presented, as much as a later re-check needs and never
/// the credential: the digest of a static token, or the key source of the
/// issuer that verified its JWT (the verified claims are the
/// [`Caller`]'s), or what was read of its client certificate; with the
/// certificate its token's connection presented, when one did.
#[derive(Debug, Clone)]
pub enum Presented {
    /// A static token, by digest.
    Token(TokenDigest),
    /// A JWT, verified with keys from this source.
    Jwt(crate::config::JwksSource),
    /// A client certificate alone (no token).
    Certificate(Arc<PeerCertificate>),
    /// A token (`Token` or `Jwt`) on a connection that presented a client
    /// certificate while `callers.mtls` was configured: an entry that
    /// matches the certificate must keep naming the token's tenant.
    TokenWithCertificate(Box<Presented>, Arc<PeerCertificate>),
}

/// Whether a caller authenticated earlier would still be accepted by the
/// directory's configuration now: its static token still selects a tenant,
/// or its JWT's issuer, claims (`exp` included) and expressions still name
/// a tenant and the same subject. The tenant it selects now; what a
/// long-lived stream asks at every configuration change and before each
/// message.
///
/// # Errors
/// The caller would be refused now.
pub fn recheck<D: Directory>(
    directory: &D,
    presented: &Presented,
    caller: &Caller,
    subject: &Subject,
) -> Result<D::Tenant, CallerError> {
    match (presented, &caller.identity) {
        (Presented::TokenWithCertificate(token, certificate), _) => {
            let tenant = recheck(directory, token, caller, subject)?;
            let identity = directory.cert_callers().identify(certificate);
            agree(directory, &tenant, certificate, &identity)?;
            Ok(tenant)
        }
        (Presented::Certificate(certificate), _) => {
            if certificate.not_after() <= std::time::SystemTime::now() {
                return Err(CallerError::Certificate(CertError::Expired(format!(
                    "the client certificate ({}) has expired (its notAfter passed)",
                    quoted(certificate.name())
                ))));
            }
            let verified = directory
                .cert_callers()
                .identify(certificate)
                .map_err(CallerError::Certificate)?;
            if verified.subject != *subject {
                return Err(CallerError::Certificate(CertError::SubjectInvalid(
                    format!("{}.subject names another subject now", verified.path),
                )));
            }
            directory
                .loaded_tenant_named(&verified.tenant)
                .ok_or_else(|| cert_tenant_unknown(&verified))
        }
        (Presented::Token(digest), _) => {
            directory
                .by_token_digest(digest)
                .ok_or(CallerError::Unauthenticated(
                    "the token is no longer configured (a configuration reload removed it)",
                ))
        }
        (Presented::Jwt(source), CallerIdentity::Jwt { issuer, .. }) => {
            let verified = directory
                .jwt_callers()
                .recheck(issuer, source, &caller.claims)
                .map_err(CallerError::Token)?;
            if verified.subject != *subject {
                return Err(CallerError::Token(TokenError::SubjectInvalid(
                    "the issuer's subject expression names another subject now".to_owned(),
                )));
            }
            directory
                .loaded_tenant_named(&verified.tenant)
                .ok_or_else(|| {
                    CallerError::Token(TokenError::TenantUnknown(format!(
                        "the token names tenant `{}`, which is not configured",
                        quoted(&verified.tenant)
                    )))
                })
        }
        (
            Presented::Jwt(_),
            CallerIdentity::Token { .. }
            | CallerIdentity::Certificate { .. }
            | CallerIdentity::ApproverToken { .. },
        ) => Err(CallerError::Unauthenticated("unknown token")),
    }
}

/// Whether `token` has the shape of a signed JWT (three dot-separated
/// parts): only such tokens are verified as JWTs.
fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|b| *b == b'.').count() == 2
}

/// The tenant `verified` names is not configured.
fn cert_tenant_unknown(verified: &VerifiedCert) -> CallerError {
    CallerError::Certificate(CertError::TenantUnknown(format!(
        "{}.tenant names tenant `{}`, which is not configured",
        verified.path,
        quoted(&verified.tenant)
    )))
}

/// Whether a token caller of `tenant` may call on a connection that
/// presented `certificate`: no `callers.mtls` entry matches it, or the
/// matching entry names `tenant`.
///
/// # Errors
/// The entry names another tenant ([`CertError::Conflict`]), or fails on
/// the certificate.
fn agree<D: Directory>(
    directory: &D,
    tenant: &D::Tenant,
    certificate: &PeerCertificate,
    identity: &Result<VerifiedCert, CertError>,
) -> Result<(), CallerError> {
    let verified = match identity {
        Ok(verified) => verified,
        Err(CertError::Unmatched(_)) => return Ok(()),
        Err(error) => return Err(CallerError::Certificate(error.clone())),
    };
    let token_tenant = directory.tenant_name(tenant);
    if verified.tenant == token_tenant {
        return Ok(());
    }
    Err(CallerError::Certificate(CertError::Conflict(format!(
        "the connection's client certificate ({}) is of tenant `{}` ({}.tenant) but the token is of \
         tenant `{}`; a certificate and a token on one call must name the same tenant",
        quoted(certificate.name()),
        quoted(&verified.tenant),
        verified.path,
        quoted(token_tenant)
    ))))
}

/// Authenticates a request from its headers and the client certificate
/// its connection presented (the verified leaf, DER), against the
/// directory's tenants: by its bearer token when it sends one (the
/// certificate, when an entry matches it, must name the token's tenant),
/// else by its certificate (`callers.mtls`).
///
/// # Errors
/// No or malformed `authorization` and no certificate an entry accepts,
/// an unknown static token, a refused JWT ([`CallerError::Token`]), a
/// refused certificate or a token of another tenant than the
/// certificate's ([`CallerError::Certificate`]), an invalid
/// `x-toolgate-subject`, or a credential not known here while the state
/// store cannot be asked ([`CallerError::TenantStoreUnavailable`]).
pub async fn authenticate<D: Directory>(
    directory: &D,
    headers: &http::HeaderMap,
    peer_certificate: Option<&[u8]>,
) -> Result<Authenticated<D::Tenant>, CallerError> {
    let cert_callers = directory.cert_callers();
    let recognized = match peer_certificate {
        Some(der) if !cert_callers.is_empty() => Some(
            cert_callers
                .recognize(der)
                .map_err(CallerError::Certificate)?,
        ),
        _ => None,
    };
    if headers.get(http::header::AUTHORIZATION).is_none()
        && let Some(recognized) = recognized
    {
        return by_certificate(directory, headers, &recognized).await;
    }
    let mut authenticated = by_token(directory, headers).await?;
    if let Some(recognized) = recognized {
        agree(
            directory,
            &authenticated.tenant,
            &recognized.certificate,
            &recognized.identity,
        )?;
        authenticated.presented = Presented::TokenWithCertificate(
            Box::new(authenticated.presented),
            recognized.certificate.clone(),
        );
    }
    Ok(authenticated)
}

/// Authenticates a caller without a token by its client certificate.
async fn by_certificate<D: Directory>(
    directory: &D,
    headers: &http::HeaderMap,
    recognized: &Recognized,
) -> Result<Authenticated<D::Tenant>, CallerError> {
    let verified = recognized
        .identity
        .clone()
        .map_err(CallerError::Certificate)?;
    let tenant = directory
        .tenant_named(&verified.tenant)
        .await?
        .ok_or_else(|| cert_tenant_unknown(&verified))?;
    // The entry names the subject; a header may only repeat it.
    if let Some(id) = Subject::from_headers(headers).map_err(CallerError::InvalidSubject)?
        && Some(id) != verified.subject.id()
    {
        return Err(CallerError::InvalidSubject(
            "the x-toolgate-subject metadata differs from the subject the caller's certificate names (send none, or the same)",
        ));
    }
    Ok(Authenticated {
        tenant,
        subject: verified.subject,
        caller: Caller {
            identity: verified.identity,
            claims: recognized.claims.clone(),
        },
        presented: Presented::Certificate(recognized.certificate.clone()),
        subject_token: None,
    })
}

/// Authenticates a caller by its bearer token (static or JWT).
async fn by_token<D: Directory>(
    directory: &D,
    headers: &http::HeaderMap,
) -> Result<Authenticated<D::Tenant>, CallerError> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Err(CallerError::Unauthenticated(
            "missing `authorization: Bearer <token>` metadata",
        ));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(bearer)
        .ok_or(CallerError::Unauthenticated(
            "the `authorization` metadata is not `Bearer <token>`",
        ))?;
    let header_subject = Subject::from_headers(headers).map_err(CallerError::InvalidSubject);
    if let Some((tenant, caller)) = directory.by_token(token).await? {
        // The tenant's token vouches for the subject it names, in the
        // namespace of static tokens.
        let subject = match header_subject? {
            Some(id) => {
                Subject::named(caller.namespace(), id).map_err(CallerError::InvalidSubject)?
            }
            None => Subject::tenant(),
        };
        return Ok(Authenticated {
            tenant,
            subject,
            caller,
            presented: Presented::Token(TokenDigest::of(token)),
            subject_token: None,
        });
    }
    let jwt = directory.jwt_callers();
    if jwt.is_empty() || !looks_like_jwt(token) {
        return Err(CallerError::Unauthenticated("unknown token"));
    }
    let verified = jwt.verify(token).await.map_err(CallerError::Token)?;
    let source = jwt
        .key_source(&verified.issuer)
        .cloned()
        .ok_or(CallerError::Token(TokenError::Issuer))?;
    let tenant = directory
        .tenant_named(&verified.tenant)
        .await?
        .ok_or_else(|| {
            CallerError::Token(TokenError::TenantUnknown(format!(
                "the token names tenant `{}`, which is not configured",
                quoted(&verified.tenant)
            )))
        })?;
    // The token names the subject; a header may only repeat it.
    if let Some(id) = header_subject?
        && Some(id) != verified.subject.id()
    {
        return Err(CallerError::InvalidSubject(
            "the x-toolgate-subject metadata differs from the subject the caller's JWT names (send none, or the same)",
        ));
    }
    let subject_token = SubjectToken::new(token, &verified.issuer, &verified.claims);
    Ok(Authenticated {
        tenant,
        subject: verified.subject,
        subject_token: Some(subject_token),
        caller: Caller {
            identity: CallerIdentity::Jwt {
                issuer: verified.issuer,
                subject: verified.sub,
            },
            claims: verified.claims,
        },
        presented: Presented::Jwt(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_three_part_tokens_are_jwts() {
        assert!(looks_like_jwt("a.b.c"));
        assert!(!looks_like_jwt("static-token"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c.d.e"));
    }
}
