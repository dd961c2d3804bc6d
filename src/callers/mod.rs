//! Caller authentication, as a tower layer in front of the ToolGateway
//! service: the caller's credential (`authorization: Bearer ...`) becomes
//! its [`Tenant`], the [`Subject`] the call acts for and the [`Caller`]
//! (how it proved itself, its verified claims), put into the request's
//! extensions.
//!
//! A credential is a tenant's static token (looked up by digest, compared
//! in constant time: [`crate::auth::TokenTable`]) or, when `callers.jwt`
//! is configured, a JWT from one of its issuers ([`JwtCallers`]). A static
//! token is tried first, so every static token works as it always did.
//!
//! The subject of a JWT caller is its issuer's subject expression. An
//! `x-toolgate-subject` sent with a JWT must name the same subject, else
//! the call is refused (INVALID_SUBJECT): a header cannot make a workload
//! act for someone its token does not name, and a client that means
//! another subject learns it at once instead of acting for the wrong one.

mod jwks;
mod jwt;
mod layer;

use std::sync::Arc;

pub use jwt::{JwtCallers, MAX_TOKEN_BYTES, TokenError, VerifiedJwt};
pub use layer::{AuthLayer, AuthService};

use crate::auth::{Caller, CallerIdentity, Subject, bearer};
use crate::error::CallError;
use crate::registry::{Registry, Tenant};

/// Who a request authenticated as: what goes into its extensions.
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// The caller's tenant.
    pub tenant: Arc<Tenant>,
    /// Whom the call acts for.
    pub subject: Subject,
    /// How the caller proved itself, and its claims.
    pub caller: Caller,
}

/// Whether `token` has the shape of a signed JWT (three dot-separated
/// parts): only such tokens are verified as JWTs.
fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|b| *b == b'.').count() == 2
}

/// Authenticates a request from its headers, against the registry's
/// current configuration.
///
/// # Errors
/// No or malformed `authorization`, an unknown static token, a refused
/// JWT ([`CallError::Token`]), or an invalid `x-toolgate-subject`.
pub async fn authenticate(
    registry: &Registry,
    headers: &http::HeaderMap,
) -> Result<Authenticated, CallError> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Err(CallError::Unauthenticated(
            "missing `authorization: Bearer <token>` metadata",
        ));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(bearer)
        .ok_or(CallError::Unauthenticated(
            "the `authorization` metadata is not `Bearer <token>`",
        ))?;
    let header_subject = Subject::from_headers(headers).map_err(CallError::InvalidSubject);
    if let Some((tenant, caller)) = registry.authenticate(token) {
        return Ok(Authenticated {
            tenant,
            subject: header_subject?,
            caller,
        });
    }
    let jwt = registry.jwt_callers();
    if jwt.is_empty() || !looks_like_jwt(token) {
        return Err(CallError::Unauthenticated("unknown token"));
    }
    let verified = jwt.verify(token).await.map_err(CallError::Token)?;
    let tenant = registry.tenant_named(&verified.tenant).ok_or_else(|| {
        CallError::Token(TokenError::TenantUnknown(format!(
            "the token names tenant `{}`, which is not configured",
            crate::error::quoted(&verified.tenant)
        )))
    })?;
    // The token names the subject; a header may only repeat it.
    let header_subject = header_subject?;
    if headers.contains_key(crate::auth::SUBJECT_METADATA) && header_subject != verified.subject {
        return Err(CallError::InvalidSubject(
            "the x-toolgate-subject metadata differs from the subject the caller's JWT names (send none, or the same)",
        ));
    }
    Ok(Authenticated {
        tenant,
        subject: verified.subject,
        caller: Caller {
            identity: CallerIdentity::Jwt {
                issuer: verified.issuer,
                subject: verified.sub,
            },
            claims: verified.claims,
        },
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
