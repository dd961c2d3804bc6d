//! What stored credentials say about their access token: whether it has
//! life left, and whether it is another than a stale one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oauth2::TokenResponse as _;
use rmcp::transport::auth::{OAuthTokenResponse, StoredCredentials};

use crate::config::Secret;

/// A token is renewed once less than this much of its life is left (or half
/// its lifetime, when that is shorter).
const REFRESH_MARGIN: Duration = Duration::from_secs(30);

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The access token of `credentials` if it has life left (a token without
/// an expiry is taken as valid until a server refuses it).
pub(super) fn fresh_token(credentials: &StoredCredentials) -> Option<Secret> {
    let token = credentials.token_response.as_ref()?;
    if let (Some(expires_in), Some(received)) = (token.expires_in(), credentials.token_received_at)
    {
        let left = expires_in
            .as_secs()
            .saturating_sub(now_secs().saturating_sub(received));
        let margin = REFRESH_MARGIN
            .as_secs()
            .min(expires_in.as_secs() / 2)
            .max(1);
        if left < margin {
            return None;
        }
    }
    Some(Secret::new(token.access_token().secret()))
}

pub(super) fn access_of(credentials: &StoredCredentials) -> Option<&str> {
    credentials
        .token_response
        .as_ref()
        .map(|t| t.access_token().secret().as_str())
}

/// The access token of `credentials` when it is not `stale` (when given)
/// and has life left: a token someone else renewed.
pub(super) fn renewed(credentials: &StoredCredentials, stale: Option<&str>) -> Option<Secret> {
    if stale.is_some() && access_of(credentials) == stale {
        return None;
    }
    fresh_token(credentials)
}

/// Credentials for a token just obtained from `issuer` by `client_id`,
/// with its `scopes`, received now.
pub(super) fn obtained(
    client_id: String,
    token: OAuthTokenResponse,
    scopes: Vec<String>,
    issuer: Option<String>,
) -> StoredCredentials {
    StoredCredentials::new(client_id, Some(token), scopes, Some(now_secs())).with_issuer(issuer)
}
