//! Who may call the admin API: a bearer token that is one of
//! `admin.tokens` (kept as SHA-256 digests, every one compared in constant
//! time), or a JWT of a `callers.jwt` issuer whose `admin` expression is
//! `true` for its claims. A tenant's static token is no admin credential:
//! it is refused like any unknown token (UNAUTHENTICATED), as is no token.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AdminError;
use crate::callers::{JwtCallers, bearer};
use crate::config::AdminConfig;

/// An admitted admin caller, as its audit record names it: never the
/// credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCaller {
    /// `admin.tokens[index]`.
    Token {
        /// Its index in `admin.tokens`.
        index: usize,
    },
    /// A JWT: its issuer and `sub`.
    Jwt {
        /// The `iss` claim.
        issuer: String,
        /// The `sub` claim (empty when absent).
        subject: String,
    },
}

impl std::fmt::Display for AdminCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminCaller::Token { index } => write!(f, "admin.tokens[{index}]"),
            AdminCaller::Jwt { issuer, subject } => write!(f, "jwt {issuer} {subject}"),
        }
    }
}

/// The index of the admin token `presented` is, comparing its digest with
/// every configured token's in constant time (all of them, whatever
/// matches).
fn admin_token(config: &AdminConfig, presented: &str) -> Option<usize> {
    let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
    let mut found = None;
    for (index, token) in config.tokens.iter().enumerate() {
        let known: [u8; 32] = Sha256::digest(token.expose().as_bytes()).into();
        if bool::from(known.ct_eq(&presented)) && found.is_none() {
            found = Some(index);
        }
    }
    found
}

/// Authenticates an admin request from its metadata.
///
/// # Errors
/// No or malformed `authorization`, a token that is neither an admin
/// token nor a JWT (UNAUTHENTICATED), a JWT that does not verify, or one
/// whose issuer does not admit it (PERMISSION_DENIED).
pub async fn authenticate(
    config: &AdminConfig,
    jwt: &JwtCallers,
    metadata: &tonic::metadata::MetadataMap,
) -> Result<AdminCaller, AdminError> {
    let value = metadata
        .get("authorization")
        .ok_or(AdminError::Unauthenticated(
            "missing `authorization: Bearer <token>` metadata",
        ))?;
    let token = value
        .to_str()
        .ok()
        .and_then(bearer)
        .ok_or(AdminError::Unauthenticated(
            "the `authorization` metadata is not `Bearer <token>`",
        ))?;
    if let Some(index) = admin_token(config, token) {
        return Ok(AdminCaller::Token { index });
    }
    if jwt.is_empty() || token.bytes().filter(|b| *b == b'.').count() != 2 {
        return Err(AdminError::Unauthenticated(
            "not an admin token (admin.tokens) nor a JWT of callers.jwt",
        ));
    }
    match jwt.verify_admin(token).await {
        Ok((issuer, subject, true)) => Ok(AdminCaller::Jwt { issuer, subject }),
        Ok((issuer, _, false)) => Err(AdminError::NotAdmin { issuer }),
        Err(error) => Err(AdminError::Token(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostSecrets, Secret};

    fn config(tokens: &[&str]) -> AdminConfig {
        AdminConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            tokens: tokens.iter().map(|t| Secret::new(*t)).collect(),
            allow_stdio_servers: false,
            host_secrets: HostSecrets::default(),
            tls: None,
            write_rate: crate::config::DEFAULT_ADMIN_WRITE_RATE,
            write_burst: crate::config::DEFAULT_ADMIN_WRITE_BURST,
        }
    }

    fn metadata(value: Option<&str>) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        if let Some(v) = value {
            m.insert("authorization", v.parse().unwrap());
        }
        m
    }

    #[tokio::test]
    async fn admin_tokens_by_index_others_refused() {
        let config = config(&["first-admin", "second-admin"]);
        let jwt = JwtCallers::default();
        for (value, expected) in [
            (
                Some("Bearer second-admin"),
                Ok(AdminCaller::Token { index: 1 }),
            ),
            (
                Some("Bearer first-admin"),
                Ok(AdminCaller::Token { index: 0 }),
            ),
            (Some("Bearer first-admi"), Err(())),
            (Some("Bearer a.b.c"), Err(())),
            (Some("Basic first-admin"), Err(())),
            (None, Err(())),
        ] {
            let got = authenticate(&config, &jwt, &metadata(value)).await;
            match expected {
                Ok(caller) => assert_eq!(got.unwrap(), caller),
                Err(()) => assert!(
                    matches!(got, Err(AdminError::Unauthenticated(_))),
                    "{value:?}: {got:?}"
                ),
            }
        }
        assert_eq!(
            AdminCaller::Token { index: 1 }.to_string(),
            "admin.tokens[1]"
        );
    }
}
