//! The latest verified JWT of each JWT caller (per tenant and subject
//! key), gateway-wide: what a delegated server's sessions exchange, again
//! when their stored token expires. Bounded, each dropped at its `exp`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::callers::SubjectToken;

/// Most subjects whose latest JWT is kept, gateway-wide.
pub const MAX_SUBJECT_TOKENS: usize = 10_000;

/// The latest verified JWT of each (tenant, subject key), gateway-wide:
/// bounded ([`MAX_SUBJECT_TOKENS`]), each dropped at its `exp`.
#[derive(Debug, Default)]
pub struct SubjectTokens {
    tokens: Mutex<HashMap<SubjectKey, SubjectToken>>,
}

/// (tenant, subject key).
type SubjectKey = (Arc<str>, Arc<str>);

impl SubjectTokens {
    /// An empty memory.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SubjectKey, SubjectToken>> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `token` as the latest of `subject` (a key) of `tenant`. When
    /// full, expired tokens go first, then the one expiring soonest.
    pub fn remember(&self, tenant: &str, subject: &str, token: &SubjectToken) {
        let now = SystemTime::now();
        if token.expired(now) {
            return;
        }
        let mut tokens = self.lock();
        let key = (Arc::from(tenant), Arc::from(subject));
        if !tokens.contains_key(&key) && tokens.len() >= MAX_SUBJECT_TOKENS {
            tokens.retain(|_, t| !t.expired(now));
            if tokens.len() >= MAX_SUBJECT_TOKENS
                && let Some(soonest) = tokens
                    .iter()
                    .min_by_key(|(_, t)| t.expires_at())
                    .map(|(k, _)| k.clone())
            {
                tokens.remove(&soonest);
            }
        }
        tokens.insert(key, token.clone());
    }

    /// The latest unexpired JWT of `subject` of `tenant`.
    pub fn latest(&self, tenant: &str, subject: &str) -> Option<SubjectToken> {
        let mut tokens = self.lock();
        let key: SubjectKey = (Arc::from(tenant), Arc::from(subject));
        match tokens.get(&key) {
            Some(token) if !token.expired(SystemTime::now()) => Some(token.clone()),
            Some(_) => {
                tokens.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Subjects kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::credentials::oauth::testing::jwt;

    #[test]
    fn the_memory_keeps_the_latest_and_drops_the_expired() {
        let memory = SubjectTokens::new();
        memory.remember("t", "jwt:i alice", &jwt(60, "i"));
        assert!(memory.latest("t", "jwt:i alice").is_some());
        assert!(memory.latest("t", "jwt:i bob").is_none());
        assert!(memory.latest("u", "jwt:i alice").is_none());
        memory.remember("t", "jwt:i alice", &jwt(-1, "i"));
        // An expired token is never kept; the previous one stays.
        assert!(memory.latest("t", "jwt:i alice").is_some());
        let memory = SubjectTokens::new();
        let short = SubjectToken::new(
            "a.b.c",
            "i",
            &serde_json::json!({"exp": SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("epoch")
                .as_secs() + 1}),
        );
        memory.remember("t", "s", &short);
        std::thread::sleep(Duration::from_millis(2100));
        assert!(memory.latest("t", "s").is_none());
        assert!(memory.is_empty());
    }
}
