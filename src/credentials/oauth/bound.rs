//! A stored token bound to the server it was obtained for: the server's URL
//! (and, once discovery named it, its authorization server's issuer) goes
//! into the token's JSON when it is saved, and a token read for a server
//! at another URL, or of another issuer, is not used. So neither a reload
//! that moves a server nor a tenant re-created under the same name carries
//! a token to a new address. Tokens saved before the binding existed carry
//! none and are used (they are bound at their next save).

use std::sync::Mutex;

use rmcp::transport::auth::StoredCredentials;

use crate::state::TokenKey;

/// The extra token-response field that names the server a token is for.
const RESOURCE_FIELD: &str = "toolgate_resource";

/// Where one OAuth client's tokens may be used.
#[derive(Debug)]
pub(super) struct Binding {
    /// The server's URL.
    resource: String,
    /// The authorization server's issuer, once discovery named it.
    issuer: Mutex<Option<String>>,
}

impl Binding {
    /// Tokens for the server at `resource`.
    pub(super) fn new(resource: &str) -> Self {
        Self {
            resource: resource.to_owned(),
            issuer: Mutex::new(None),
        }
    }

    /// Discovery named `issuer` as the server's authorization server.
    pub(super) fn note_issuer(&self, issuer: Option<&str>) {
        if let Some(issuer) = issuer {
            *self.issuer() = Some(issuer.to_owned());
        }
    }

    fn issuer(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.issuer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks `credentials` as this server's (and its issuer's, when they
    /// name none and discovery named one).
    pub(super) fn stamp(&self, credentials: &mut StoredCredentials) {
        if credentials.issuer.is_none() {
            credentials.issuer.clone_from(&self.issuer());
        }
        if let Some(response) = &mut credentials.token_response {
            let mut extra = response.extra_fields().clone();
            extra.0.insert(
                RESOURCE_FIELD.to_owned(),
                serde_json::Value::String(self.resource.clone()),
            );
            response.set_extra_fields(extra);
        }
    }

    /// Whether `credentials`, read for `key`, may be used here: obtained
    /// for this server's URL and of its issuer, as far as either is known.
    pub(super) fn admits(&self, key: &TokenKey, credentials: &StoredCredentials) -> bool {
        let resource = credentials
            .token_response
            .as_ref()
            .and_then(|r| r.extra_fields().0.get(RESOURCE_FIELD))
            .and_then(serde_json::Value::as_str);
        if let Some(resource) = resource
            && resource != self.resource
        {
            tracing::info!(tenant = %key.tenant, server = %key.server, stored_for = resource, now = %self.resource, "a stored token was obtained for another URL of this server: not used");
            return false;
        }
        let current = self.issuer();
        if let (Some(stored), Some(current)) = (credentials.issuer.as_deref(), current.as_deref())
            && stored.trim_end_matches('/') != current.trim_end_matches('/')
        {
            tracing::info!(tenant = %key.tenant, server = %key.server, stored_issuer = stored, issuer = current, "a stored token is of another authorization server: not used");
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use oauth2::TokenResponse as _;
    use rmcp::transport::auth::{OAuthTokenResponse, VendorExtraTokenFields};

    use super::*;

    fn credentials(access: &str) -> StoredCredentials {
        let response = OAuthTokenResponse::new(
            oauth2::AccessToken::new(access.to_owned()),
            oauth2::basic::BasicTokenType::Bearer,
            VendorExtraTokenFields::default(),
        );
        StoredCredentials::new("client".into(), Some(response), vec![], Some(1))
    }

    #[test]
    fn a_token_serves_only_the_url_and_issuer_it_was_obtained_for() {
        let key = TokenKey::tenant_wide("acme", "crm");
        let here = Binding::new("https://crm.example/mcp");
        here.note_issuer(Some("https://as.example"));
        let mut token = credentials("at-1");
        // Saved before the binding: used.
        assert!(here.admits(&key, &token));
        here.stamp(&mut token);
        assert_eq!(token.issuer.as_deref(), Some("https://as.example"));
        // The stamp survives the store's JSON.
        let token: StoredCredentials =
            serde_json::from_slice(&serde_json::to_vec(&token).unwrap()).unwrap();
        assert_eq!(
            token
                .token_response
                .as_ref()
                .unwrap()
                .access_token()
                .secret(),
            "at-1"
        );
        assert!(here.admits(&key, &token));
        let moved = Binding::new("https://evil.example/mcp");
        assert!(!moved.admits(&key, &token));
        let other_as = Binding::new("https://crm.example/mcp");
        assert!(other_as.admits(&key, &token), "issuer not known yet");
        other_as.note_issuer(Some("https://other-as.example/"));
        assert!(!other_as.admits(&key, &token));
    }
}
