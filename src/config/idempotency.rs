//! `tenants[].idempotency`: how long the idempotency keys of the tenant's
//! tool calls are kept, how many may be live at once, and the largest
//! response kept for a retry.

use std::time::Duration;

use super::fields::{Errors, duration};
use super::raw::RawIdempotency;

/// How long a key is kept after its call, by default.
pub const DEFAULT_KEY_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest `ttl` accepted.
pub(super) const MAX_KEY_TTL: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// Live keys of one tenant at once, by default.
pub const DEFAULT_MAX_KEYS: u64 = 100_000;
/// The largest `max_keys` accepted.
pub(super) const MAX_KEYS_LIMIT: u64 = 100_000_000;
/// The largest response kept for a retry, by default.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// The largest `max_response_bytes` accepted.
pub(super) const MAX_RESPONSE_BYTES_LIMIT: usize = 16 * 1024 * 1024;

/// A tenant's idempotency keys (`tenants[].idempotency`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyConfig {
    /// How long a key is kept from its first call (1 second to 30 days;
    /// 24 hours by default); purged after.
    pub ttl: Duration,
    /// Live keys of the tenant at once (1 to 100,000,000; 100,000 by
    /// default): a call with a new key past it is `RESOURCE_EXHAUSTED`.
    pub max_keys: u64,
    /// The largest response kept for a retry, as the JSON of the result
    /// (1 KiB to 16 MiB; 1 MiB by default); a larger one keeps its
    /// status only.
    pub max_response_bytes: usize,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_KEY_TTL,
            max_keys: DEFAULT_MAX_KEYS,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

/// Validates `idempotency` at `path` (`tenants[0].idempotency`).
pub(super) fn idempotency(
    errors: &mut Errors,
    path: &str,
    raw: Option<RawIdempotency>,
) -> IdempotencyConfig {
    let Some(raw) = raw else {
        return IdempotencyConfig::default();
    };
    let defaults = IdempotencyConfig::default();
    let ttl_path = format!("{path}.ttl");
    let ttl = duration(errors, &ttl_path, raw.ttl.as_deref(), DEFAULT_KEY_TTL);
    let ttl = if (Duration::from_secs(1)..=MAX_KEY_TTL).contains(&ttl) {
        ttl
    } else {
        errors.push(ttl_path, "must be 1s to 30d");
        DEFAULT_KEY_TTL
    };
    let max_keys = match raw.max_keys {
        None => defaults.max_keys,
        Some(n) if (1..=MAX_KEYS_LIMIT).contains(&n) => n,
        Some(_) => {
            errors.push(
                format!("{path}.max_keys"),
                format!("must be 1 to {MAX_KEYS_LIMIT}"),
            );
            defaults.max_keys
        }
    };
    let max_response_bytes = match raw.max_response_bytes {
        None => defaults.max_response_bytes,
        Some(n) if (1024..=MAX_RESPONSE_BYTES_LIMIT).contains(&n) => n,
        Some(_) => {
            errors.push(
                format!("{path}.max_response_bytes"),
                format!("must be 1024 to {MAX_RESPONSE_BYTES_LIMIT}"),
            );
            defaults.max_response_bytes
        }
    };
    IdempotencyConfig {
        ttl,
        max_keys,
        max_response_bytes,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::validate::testing::{has, load, messages};

    const TENANT: &str = "tenants:\n  - name: acme\n    tokens: [{ env: ACME_TOKEN }]\n";

    #[test]
    fn defaults_and_the_documented_shape_load() {
        let config = load(TENANT).unwrap();
        assert_eq!(
            config.tenants[0].idempotency,
            super::IdempotencyConfig::default()
        );
        let config = load(&format!(
            "{TENANT}    idempotency: {{ ttl: 2h, max_keys: 50, max_response_bytes: 4096 }}\n"
        ))
        .unwrap();
        let keys = &config.tenants[0].idempotency;
        assert_eq!(keys.ttl, std::time::Duration::from_secs(7200));
        assert_eq!((keys.max_keys, keys.max_response_bytes), (50, 4096));
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let errors = messages(&format!(
            "{TENANT}    idempotency: {{ ttl: 0s, max_keys: 0, max_response_bytes: 10 }}\n"
        ));
        assert!(has(&errors, "tenants[0].idempotency.ttl"), "{errors:?}");
        assert!(
            has(&errors, "tenants[0].idempotency.max_keys: must be 1 to"),
            "{errors:?}"
        );
        assert!(
            has(
                &errors,
                "tenants[0].idempotency.max_response_bytes: must be 1024 to"
            ),
            "{errors:?}"
        );
        let errors = messages(&format!("{TENANT}    idempotency: {{ keep: 1h }}\n"));
        assert!(!errors.is_empty());
    }
}
