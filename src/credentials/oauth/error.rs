//! Why no token could be had ([`OAuthError`], [`StoreError`]), and rmcp's
//! errors described without the secrets in play.

use rmcp::transport::auth::AuthError;

/// Why the state store failed (it is unavailable, or a value is unreadable).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the OAuth state store failed: {0}")]
pub struct StoreError(pub String);

/// Why no token could be had. No variant carries a token, code, verifier
/// or client secret; texts from authorization servers are scrubbed of the
/// values in play and bounded.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OAuthError {
    /// The subject has not authorized the server (or its grant ended): the
    /// end user consents at `url`.
    #[error("the end user must authorize the server first")]
    AuthorizationRequired {
        /// The authorization URL (carries `state` and the PKCE challenge,
        /// never the verifier).
        url: String,
    },
    /// The server still refuses for lack of scope after the bounded step-ups.
    #[error("the server requires scope `{scope}`; {attempts} step-ups did not obtain it")]
    InsufficientScope {
        /// The scope the last challenge asked for.
        scope: String,
        /// Step-ups tried.
        attempts: u32,
    },
    /// The state store failed (retryable).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The authorization server or its metadata could not be reached
    /// (retryable).
    #[error("the authorization server is unreachable: {0}")]
    Unreachable(String),
    /// Discovery found no usable metadata (or metadata that fails its
    /// checks: issuer, resource, PKCE).
    #[error("OAuth discovery failed: {0}")]
    Discovery(String),
    /// An endpoint is on an address the gateway does not call.
    #[error("OAuth endpoint {0} is on a private or reserved address")]
    ForbiddenAddress(String),
    /// The authorization response's issuer is wrong or missing (RFC 9207).
    #[error("the authorization response failed the issuer check: {0}")]
    Issuer(String),
    /// The callback arrived at the redirect URI of another (tenant, server)
    /// than its flow's: a code meant for one server's flow delivered to
    /// another's (an authorization server mix-up). The flow is dropped and
    /// nothing is exchanged.
    #[error("this callback arrived at the redirect URI of another server than its flow's")]
    RedirectMismatch,
    /// The callback names no pending flow (unknown, used or expired).
    #[error("no pending authorization for this callback")]
    UnknownState,
    /// The end user or the authorization server declined (`error=` on the
    /// callback).
    #[error("the authorization was declined: {0}")]
    Declined(String),
    /// The callback URL lacks `code` or `state`.
    #[error("the callback is malformed: {0}")]
    Callback(String),
    /// The authorization server refused a token request.
    #[error("the authorization server refused: {0}")]
    Refused(String),
    /// The settings cannot work (a missing client id, key or redirect URI).
    #[error("OAuth settings: {0}")]
    Settings(String),
    /// Another task or replica holds the key's refresh lease and its token
    /// did not appear in time (retryable).
    #[error("another replica is renewing this token and has not finished")]
    RefreshInProgress,
    /// A delegation grant (`token_exchange`, `identity_assertion`) gave no
    /// token: no caller JWT, another issuer's, refused, or unavailable.
    #[error(transparent)]
    Delegation(super::DelegationError),
}

impl OAuthError {
    /// Whether trying again later may succeed without anyone acting.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            OAuthError::Store(_) | OAuthError::Unreachable(_) | OAuthError::RefreshInProgress
        ) || matches!(self, OAuthError::Delegation(e) if e.kind == super::DelegationFailure::Unavailable)
    }
}

/// rmcp's error, described without secrets: `secrets` (the values in play)
/// are cut out of any text an authorization server sent.
pub(super) fn from_auth(error: AuthError, secrets: &[&str]) -> OAuthError {
    let scrub = |text: String| scrubbed(text, secrets);
    match error {
        AuthError::CredentialStoreError(reason) => OAuthError::Store(StoreError(reason)),
        AuthError::HttpError(e) => OAuthError::Unreachable(scrub(e.without_url().to_string())),
        AuthError::DiscoveryRequestFailed { url, source } => {
            OAuthError::Unreachable(scrub(format!("{url}: {}", root_cause(source.as_ref()))))
        }
        e @ (AuthError::AuthorizationServerMismatch { .. }
        | AuthError::AuthorizationServerMissingIssuer { .. }
        | AuthError::ProtectedResourceMetadataInvalid { .. }
        | AuthError::AuthorizationServersUnavailable { .. }
        | AuthError::MetadataError(_)
        | AuthError::NoAuthorizationSupport
        | AuthError::PkceUnsupported
        | AuthError::UrlError(_)) => OAuthError::Discovery(scrub(e.to_string())),
        AuthError::AuthorizationRequired => {
            OAuthError::Refused("the authorization server requires a new authorization".into())
        }
        AuthError::TokenRefreshRejected(_) => {
            OAuthError::Refused("the refresh token was rejected".into())
        }
        other => OAuthError::Refused(scrub(other.to_string())),
    }
}

/// `text` from an authorization server with `secrets` (the values in play)
/// cut out, bounded.
pub(super) fn scrubbed(mut text: String, secrets: &[&str]) -> String {
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        text = text.replace(secret, crate::credentials::REDACTED);
    }
    crate::credentials::bounded(&text, crate::credentials::MAX_UPSTREAM_TEXT)
}

/// The innermost cause's text (reqwest puts the useful part there).
pub(super) fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_carry_the_values_in_play() {
        let error = from_auth(
            AuthError::TokenExchangeFailed("invalid_grant: code c0de-1234 is used".into()),
            &["c0de-1234"],
        );
        let text = error.to_string();
        assert!(!text.contains("c0de-1234"), "{text}");
        assert!(matches!(error, OAuthError::Refused(_)));
    }
}
