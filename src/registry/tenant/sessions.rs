//! A tenant's servers and their sessions: the shared session of a server,
//! and per-user sessions (each subject's own, with its own token).

use std::sync::Arc;

use super::Tenant;
use super::consent::delegation_admits;
use crate::config::ServerConfig;
use crate::registry::slot::SlotState;
use crate::upstream::Session;

/// Why a server's session could not be had for a call.
#[derive(Debug, Clone)]
pub enum SessionUnavailable {
    /// Still connecting after the caller's wait.
    Connecting,
    /// Not connected, for this reason.
    Down(String),
}

impl Tenant {
    /// Every configured server, in configuration order.
    pub fn servers(&self) -> impl Iterator<Item = &ServerConfig> {
        self.slots.iter().map(|s| &s.config)
    }

    /// The configuration of server `index`.
    pub fn server(&self, index: usize) -> &ServerConfig {
        &self.slots[index].config
    }

    /// The live session of server `index`.
    ///
    /// # Errors
    /// The server is not connected.
    pub fn session(&self, index: usize) -> Result<Arc<Session>, SessionUnavailable> {
        let Some(slot) = self.slots.get(index) else {
            return Err(SessionUnavailable::Down("no such server".to_owned()));
        };
        if slot.stop.is_cancelled() {
            return Err(SessionUnavailable::Down(
                "the server was removed or changed by a configuration reload".to_owned(),
            ));
        }
        match slot.state() {
            SlotState::Ready { session, .. } if !session.is_ended() => Ok(session),
            SlotState::Ready { .. } => {
                Err(SessionUnavailable::Down("the session ended".to_owned()))
            }
            SlotState::Connecting | SlotState::Idle => Err(SessionUnavailable::Connecting),
            SlotState::Failed { reason, .. } | SlotState::AuthorizationRequired { reason } => {
                Err(SessionUnavailable::Down(reason))
            }
        }
    }

    /// Whether calls to server `index` run on per-user sessions (an OAuth
    /// `authorization_code` server).
    pub fn is_per_user(&self, index: usize) -> bool {
        self.slots.get(index).is_some_and(|s| s.per_user())
    }

    /// The session of `subject` (possibly the tenant itself) on per-user
    /// server `index`: its own, with its own token, connected on first use.
    /// Sessions, tokens and consent URLs are kept by [`Subject::key`]
    /// (`crate::callers::Subject`), never by the bare id.
    /// A session connected for a subject wakes a server that waits for its
    /// first consent, so its tools get listed.
    ///
    /// # Errors
    /// The subject has not authorized the server (with the URL to consent
    /// at), the state store is down, or the server cannot be reached.
    pub async fn user_session(
        &self,
        index: usize,
        subject: &crate::callers::Subject,
    ) -> Result<Arc<Session>, crate::upstream::UpstreamError> {
        use crate::upstream::UpstreamError;
        let subject = subject.key();
        let slot = self
            .slots
            .get(index)
            .ok_or_else(|| UpstreamError::Handshake("no such server".to_owned()))?;
        if slot.stop.is_cancelled() {
            return Err(UpstreamError::Handshake(
                "the server was removed or changed by a configuration reload".to_owned(),
            ));
        }
        let client = match &slot.oauth {
            Ok(Some(client)) => client.clone(),
            Ok(None) => return Err(UpstreamError::Handshake("not an OAuth server".to_owned())),
            Err(reason) => return Err(UpstreamError::OAuthFailed(reason.clone())),
        };
        let spawner = &self.spawner;
        let label = crate::upstream::Label {
            tenant: self.name.clone(),
            server: slot.config.name.clone(),
        };
        let key = crate::state::TokenKey::new(&self.name, subject, &slot.config.name);
        if client.is_delegated() {
            // Refused before anything is exchanged or sent: only a JWT
            // caller's subject has a token to exchange.
            delegation_admits(&client, &key, &slot.config.name)?;
        }
        // A subject already sent to consent gets the same URL (no new
        // pending flow per call), with or without an open session, until
        // it has a token.
        if let Some(url) = slot.consent_url(subject)
            && client
                .store()
                .load_credentials(&key)
                .await
                .map_err(|e| UpstreamError::StateUnavailable(e.0))?
                .is_none()
        {
            return Err(UpstreamError::AuthorizationRequired { url });
        }
        let connect = async {
            let connected = crate::upstream::connect_with(
                &slot.config,
                &label,
                spawner.env(),
                spawner.max_result_bytes(),
                &self.redactor,
                crate::registry::oauth::options_for(&client, key),
            )
            .await
            .inspect_err(|e| {
                if let UpstreamError::AuthorizationRequired { url } = e {
                    slot.remember_consent_url(subject, url);
                }
            })?;
            if matches!(slot.state(), SlotState::AuthorizationRequired { .. }) {
                slot.wake.notify_one();
            }
            if let Some(events) = spawner.events() {
                events.connected(&self.name, &slot.config.name, Some(subject));
            }
            Ok(connected.session)
        };
        slot.users.get(subject, spawner.now_ms(), connect).await
    }

    /// Closes per-user sessions unused for the tenant's `idle_timeout`.
    pub(in crate::registry) fn close_idle_user_sessions(&self, now_ms: u64) -> usize {
        let idle = u64::try_from(self.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        let before = now_ms.saturating_sub(idle);
        self.slots
            .iter()
            .map(|slot| slot.users.close_idle(before))
            .sum()
    }
}
