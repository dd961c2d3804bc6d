//! Consents confirmed by the tenant's application: after the code exchange
//! the grant is *held* under a one-time code, the browser goes to the
//! tenant's `consent_return_url` with that code, and only a caller of the
//! same tenant naming the same subject makes it usable
//! ([`confirm`]). toolgate does not know who opened a link; the
//! application the user is logged in to does.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use rmcp::transport::auth::{AuthError, CredentialStore, StoredCredentials};
use serde::{Deserialize, Serialize};

use super::{OAuthStore, StoreError};
use crate::state::TokenKey;

/// How long a held grant waits for the application's confirmation.
pub const CONFIRM_TTL: Duration = Duration::from_secs(300);

/// A grant whose code was exchanged, waiting for the application to
/// confirm it for its subject. `Debug` never shows the credentials.
#[derive(Clone, Serialize, Deserialize)]
pub struct HeldGrant {
    /// The tenant the flow was started for.
    pub tenant: String,
    /// The subject the flow was started for (empty: the tenant itself).
    pub subject: String,
    /// The server's name in the tenant's configuration.
    pub server: String,
    /// The tokens the authorization server issued.
    pub credentials: StoredCredentials,
}

impl HeldGrant {
    /// Whose credential this grant becomes once confirmed.
    pub fn key(&self) -> TokenKey {
        TokenKey::new(&self.tenant, &self.subject, &self.server)
    }

    /// Whose grant this becomes when `tenant`'s `subject` confirms it: its
    /// key, when they are the flow's tenant and subject.
    ///
    /// # Errors
    /// [`NotYours`] when the flow was another tenant's or subject's.
    pub fn confirmed_by(&self, tenant: &str, subject: &str) -> Result<TokenKey, NotYours> {
        let key = self.key();
        if key.tenant != tenant || key.subject != subject {
            return Err(NotYours {
                other_tenant: key.tenant != tenant,
                flow: key,
            });
        }
        Ok(key)
    }
}

impl fmt::Debug for HeldGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldGrant")
            .field("tenant", &self.tenant)
            .field("server", &self.server)
            .field("credentials", &"***")
            .finish_non_exhaustive()
    }
}

/// The one-time code that names a held grant: 256 random bits,
/// base64url. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ConsentCode(String);

impl ConsentCode {
    /// A new random code.
    pub fn random() -> Self {
        let mut bytes = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .expect("the system's random source works");
        Self(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }

    /// The code as it travels (in the return URL, in the request).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ConsentCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConsentCode(***)")
    }
}

/// Why a confirmation made no grant usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    /// No held grant has this code: never issued, already used (confirmed
    /// or refused), or older than [`CONFIRM_TTL`].
    #[error("the consent code is unknown, expired or already used")]
    UnknownCode,
    /// The caller's tenant or subject is not the one the authorization link
    /// was made for; the held grant is dropped.
    #[error("{0}")]
    NotYours(NotYours),
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A refused confirmation: whose flow it was, and what did not match
/// (names only; the subjects are not in the text).
#[derive(Debug)]
pub struct NotYours {
    /// The held grant's key (tenant, subject, server of the flow).
    pub flow: TokenKey,
    /// The tenant differs too (a link of another tenant).
    pub other_tenant: bool,
}

impl fmt::Display for NotYours {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.other_tenant {
            f.write_str(
                "this consent was given through an authorization link of another tenant; it was \
                 discarded",
            )
        } else {
            f.write_str(
                "this consent was given through an authorization link made for another subject \
                 (x-toolgate-subject); it was discarded: the subject must open its own link",
            )
        }
    }
}

/// Holds `grant` under a new one-time code, for [`CONFIRM_TTL`].
///
/// # Errors
/// The store failed.
pub async fn hold(store: &dyn OAuthStore, grant: HeldGrant) -> Result<ConsentCode, StoreError> {
    let code = ConsentCode::random();
    store.hold_grant(code.expose(), grant).await?;
    Ok(code)
}

/// Confirms the grant held under `code` for the caller (`tenant`,
/// `subject`: the subject's stored key). The held grant is taken and, when
/// tenant and subject are the flow's, stored as the subject's new grant, in
/// one step ([`OAuthStore::confirm_held`]): of two confirmations with one
/// code at most one finds it, and a store that fails half-way leaves it
/// held (the code stays valid for a retry). A grant confirmed for another
/// tenant or subject is dropped.
///
/// # Errors
/// [`ConfirmError::UnknownCode`], [`ConfirmError::NotYours`] (the grant is
/// dropped), or the store failed (nothing changed).
pub async fn confirm(
    store: &dyn OAuthStore,
    code: &str,
    tenant: &str,
    subject: &str,
) -> Result<TokenKey, ConfirmError> {
    store.confirm_held(code, tenant, subject).await
}

/// rmcp's `CredentialStore` for a code exchange whose grant is held: what
/// rmcp saves stays in memory ([`Captured::take`]), nothing is written.
#[derive(Debug, Default, Clone)]
pub(super) struct Captured(Arc<Mutex<Option<StoredCredentials>>>);

impl Captured {
    /// The credentials rmcp saved, if it did.
    pub(super) fn take(&self) -> Option<StoredCredentials> {
        self.lock().take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<StoredCredentials>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait::async_trait]
impl CredentialStore for Captured {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        Ok(self.lock().clone())
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        *self.lock() = Some(credentials);
        Ok(())
    }

    async fn clear(&self) -> Result<(), AuthError> {
        *self.lock() = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::oauth::MemoryStore;

    fn grant(subject: &str) -> HeldGrant {
        HeldGrant {
            tenant: "acme".into(),
            subject: subject.into(),
            server: "drive".into(),
            credentials: StoredCredentials::new("client".into(), None, Vec::new(), None),
        }
    }

    #[tokio::test]
    async fn only_the_flows_tenant_and_subject_confirm_and_a_code_works_once() {
        let store = MemoryStore::new();
        let key = TokenKey::new("acme", "alice", "drive");

        let code = hold(&store, grant("alice")).await.unwrap();
        assert!(!format!("{code:?}").contains(code.expose()));
        assert_eq!(
            confirm(&store, code.expose(), "acme", "alice")
                .await
                .unwrap(),
            key
        );
        assert!(store.load_credentials(&key).await.unwrap().is_some());
        assert!(matches!(
            confirm(&store, code.expose(), "acme", "alice").await,
            Err(ConfirmError::UnknownCode)
        ));

        // Another subject: refused, and the held grant is gone for everyone.
        store.clear_credentials(&key).await.unwrap();
        let code = hold(&store, grant("alice")).await.unwrap();
        match confirm(&store, code.expose(), "acme", "mallory").await {
            Err(ConfirmError::NotYours(refused)) => {
                assert!(!refused.other_tenant);
                assert_eq!(refused.flow, key);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            confirm(&store, code.expose(), "acme", "alice").await,
            Err(ConfirmError::UnknownCode)
        ));
        assert!(store.load_credentials(&key).await.unwrap().is_none());

        // Another tenant, same subject name: refused.
        let code = hold(&store, grant("alice")).await.unwrap();
        match confirm(&store, code.expose(), "globex", "alice").await {
            Err(ConfirmError::NotYours(refused)) => assert!(refused.other_tenant),
            other => panic!("{other:?}"),
        }
        assert!(store.load_credentials(&key).await.unwrap().is_none());
    }

    #[test]
    fn codes_are_random_and_url_safe() {
        let a = ConsentCode::random();
        let b = ConsentCode::random();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 43);
        assert!(
            a.expose()
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
    }
}
