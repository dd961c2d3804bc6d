//! What the OAuth unit tests share: credentials, settings, clients, and
//! another replica's renewal.

use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::auth::{OAuthTokenResponse, StoredCredentials, VendorExtraTokenFields};
use url::Url;

use super::freshness::now_secs;
use super::{MemoryStore, OAuthClient, OAuthSettings, OAuthStore, WorkloadAssertion};
use crate::config::{Grant, Secret};
use crate::state::TokenKey;

/// The workload assertion of [`workload_settings`].
pub(super) const ASSERTION: &str = "eyJhbGciOiJFUzI1NiJ9.e30.sig";

fn token_credentials(access: &str, expires_in: u64, received: u64) -> StoredCredentials {
    let mut response = OAuthTokenResponse::new(
        oauth2::AccessToken::new(access.to_owned()),
        oauth2::basic::BasicTokenType::Bearer,
        VendorExtraTokenFields::default(),
    );
    response.set_expires_in(Some(&Duration::from_secs(expires_in)));
    response.set_refresh_token(Some(oauth2::RefreshToken::new("refresh-1".into())));
    StoredCredentials::new("client".into(), Some(response), Vec::new(), Some(received))
}

/// Credentials whose token `access` ran out an hour ago.
pub(super) fn expired(access: &str) -> StoredCredentials {
    token_credentials(access, 60, now_secs() - 3600)
}

/// Credentials whose token `access` has an hour left.
pub(super) fn live(access: &str) -> StoredCredentials {
    token_credentials(access, 3600, now_secs())
}

/// A client whose server and authorization server cannot be reached
/// (a discard port): any network request fails at once.
pub(super) fn unreachable_client(grant: Grant, store: Arc<MemoryStore>) -> OAuthClient {
    let url = Url::parse("http://127.0.0.1:9/mcp").expect("url");
    let mut settings = OAuthSettings::new(url, grant);
    settings.client_id = Some("client".into());
    settings.client_secret = Some(Secret::new("client-secret"));
    settings.redirect_uri = Some("https://gw.example/callback".into());
    settings.allow_private_addresses = true;
    OAuthClient::new(settings, store).expect("valid settings")
}

/// A store holding `stored` for alice, and an [`unreachable_client`] of
/// `grant` over it.
pub(super) fn alice_with(
    grant: Grant,
    stored: StoredCredentials,
) -> (Arc<MemoryStore>, OAuthClient, TokenKey) {
    let store = Arc::new(MemoryStore::new());
    let client = unreachable_client(grant, store.clone());
    let key = TokenKey::new("t", "alice", "s");
    store.set_credentials(&key, Some(stored));
    (store, client, key)
}

/// What another replica holding `key`'s refresh lease does after
/// `after_ms`: stores its `credentials`, or, with `None`, gives up (drops
/// the credentials and gives the lease back).
pub(super) fn stored_later(
    store: &Arc<MemoryStore>,
    key: &TokenKey,
    after_ms: u64,
    credentials: Option<StoredCredentials>,
) -> tokio::task::JoinHandle<()> {
    let store = store.clone();
    let key = key.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        let gave_up = credentials.is_none();
        store.set_credentials(&key, credentials);
        if gave_up {
            store.unlock_refresh(&key).await.unwrap();
        }
    })
}

/// A client-credentials server's settings whose tokens come from the
/// JWT-bearer grant with [`ASSERTION`], as the public client `workload`.
pub(super) fn workload_settings() -> OAuthSettings {
    let url = Url::parse("https://mcp.example/mcp").expect("url");
    let mut settings = OAuthSettings::new(url, Grant::ClientCredentials);
    settings.client_id = Some("workload".into());
    settings.jwt_bearer_assertion = Some(WorkloadAssertion::Value(Secret::new(ASSERTION)));
    settings
}

/// Credentials whose token `access` is of `token_type`, an hour left.
pub(super) fn dpop_credentials(access: &str, token_type: &str) -> StoredCredentials {
    let response: OAuthTokenResponse = serde_json::from_value(serde_json::json!({
        "access_token": access,
        "token_type": token_type,
        "expires_in": 3600,
    }))
    .expect("a token response");
    StoredCredentials::new(
        "client".into(),
        Some(response),
        Vec::new(),
        Some(now_secs()),
    )
}

/// The claims of a JWT, unverified.
pub(super) fn jwt_claims(jwt: &str) -> serde_json::Value {
    use base64::Engine as _;
    let payload = jwt.split('.').nth(1).expect("a payload");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON")
}

/// A caller's verified JWT of `issuer` (its text a fixed stand-in) that
/// expires `exp_in` seconds from now (in the past when negative).
pub(crate) fn jwt(exp_in: i64, issuer: &str) -> crate::callers::SubjectToken {
    let exp = now_secs().saturating_add_signed(exp_in);
    crate::callers::SubjectToken::new(
        "eyJh.caller-jwt-part.sig",
        issuer,
        &serde_json::json!({"exp": exp}),
    )
}
