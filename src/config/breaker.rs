//! A server's circuit breaker (`circuit_breaker:`, in `defaults` and per
//! server): how many breaking failures in a row open it, and how long it
//! stays open before a probe call goes through. A key a server leaves out
//! takes the value of `defaults.circuit_breaker`, and that the built-in
//! default.

use std::time::Duration;

use super::fields::{Errors, at_least_one, duration};
use super::raw::RawCircuitBreaker;

/// Breaking failures in a row that open a server's breaker, by default.
pub const DEFAULT_CIRCUIT_FAILURES: u32 = 5;
/// How long an opened breaker fails calls fast before a probe, by default.
pub const DEFAULT_CIRCUIT_COOL_DOWN: Duration = Duration::from_secs(30);
/// The longest cool-down a breaker that keeps reopening backs off to, by
/// default.
pub const DEFAULT_CIRCUIT_MAX_COOL_DOWN: Duration = Duration::from_secs(5 * 60);

/// A server's circuit breaker: after `failures` breaking failures in a row
/// (transport errors, timeouts of the server's own, HTTP 5xx, sessions that
/// cannot be established) calls fail at once for `cool_down`; then one probe
/// call goes through. Each reopening without a success in between doubles
/// the cool-down, up to `max_cool_down`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    /// Breaking failures in a row that open the breaker (at least 1).
    pub failures: u32,
    /// How long the breaker stays open after it first opens.
    pub cool_down: Duration,
    /// The longest cool-down (not below `cool_down`).
    pub max_cool_down: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            failures: DEFAULT_CIRCUIT_FAILURES,
            cool_down: DEFAULT_CIRCUIT_COOL_DOWN,
            max_cool_down: DEFAULT_CIRCUIT_MAX_COOL_DOWN,
        }
    }
}

impl CircuitBreaker {
    /// The cool-down of the `opens`-th opening in a row (1-based):
    /// `cool_down × 2^(opens-1)`, at most `max_cool_down`.
    #[must_use]
    pub fn cool_down_of(&self, opens: u32) -> Duration {
        let doublings = opens.saturating_sub(1).min(20);
        self.cool_down
            .saturating_mul(1 << doublings)
            .min(self.max_cool_down)
            .max(self.cool_down)
    }
}

/// Validates a `circuit_breaker` block at `path` over `default` (the
/// `defaults` block's, or the built-in one): `None` when switched off.
pub(super) fn circuit_breaker(
    errors: &mut Errors,
    path: &str,
    raw: Option<RawCircuitBreaker>,
    default: Option<CircuitBreaker>,
) -> Option<CircuitBreaker> {
    let Some(raw) = raw else {
        return default;
    };
    let base = default.unwrap_or_default();
    let failures = at_least_one(
        errors,
        &format!("{path}.failures"),
        raw.failures,
        base.failures,
    );
    let cool_down = duration(
        errors,
        &format!("{path}.cool_down"),
        raw.cool_down.as_deref(),
        base.cool_down,
    );
    // A `cool_down` set above the inherited maximum raises the maximum
    // with it, unless the maximum is set too.
    let max_default = if raw.max_cool_down.is_none() {
        base.max_cool_down.max(cool_down)
    } else {
        base.max_cool_down
    };
    let max_cool_down = duration(
        errors,
        &format!("{path}.max_cool_down"),
        raw.max_cool_down.as_deref(),
        max_default,
    );
    if max_cool_down < cool_down {
        errors.push(
            format!("{path}.max_cool_down"),
            format!(
                "must not be below `cool_down` ({})",
                humantime::format_duration(cool_down)
            ),
        );
    }
    let enabled = raw
        .enabled
        .unwrap_or(default.is_some() || raw_sets_any(&raw));
    enabled.then_some(CircuitBreaker {
        failures,
        cool_down,
        max_cool_down,
    })
}

/// Whether a block sets any setting (a block that tunes a breaker the
/// defaults switched off switches it on again).
fn raw_sets_any(raw: &RawCircuitBreaker) -> bool {
    raw.failures.is_some() || raw.cool_down.is_some() || raw.max_cool_down.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        raw: Option<RawCircuitBreaker>,
        default: Option<CircuitBreaker>,
    ) -> (Option<CircuitBreaker>, Vec<String>) {
        let mut errors = Errors(Vec::new());
        let breaker = circuit_breaker(&mut errors, "s.circuit_breaker", raw, default);
        let errors = errors
            .0
            .into_iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect();
        (breaker, errors)
    }

    #[test]
    fn unset_keys_take_the_defaults_and_a_block_can_switch_it_off() {
        let default = Some(CircuitBreaker::default());
        assert_eq!(check(None, default), (default, vec![]));
        let (tuned, errors) = check(
            Some(RawCircuitBreaker {
                failures: Some(2),
                ..RawCircuitBreaker::default()
            }),
            default,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            tuned,
            Some(CircuitBreaker {
                failures: 2,
                ..CircuitBreaker::default()
            })
        );
        let off = RawCircuitBreaker {
            enabled: Some(false),
            ..RawCircuitBreaker::default()
        };
        assert_eq!(check(Some(off), default).0, None);
        // Off in the defaults; a server that tunes it has one again.
        let tuned = RawCircuitBreaker {
            cool_down: Some("1s".to_owned()),
            ..RawCircuitBreaker::default()
        };
        assert_eq!(check(Some(tuned), None).0.unwrap().failures, 5);
    }

    #[test]
    fn errors_name_the_field() {
        let (_, errors) = check(
            Some(RawCircuitBreaker {
                failures: Some(0),
                cool_down: Some("1m".to_owned()),
                max_cool_down: Some("10s".to_owned()),
                ..RawCircuitBreaker::default()
            }),
            Some(CircuitBreaker::default()),
        );
        assert_eq!(
            errors,
            [
                "s.circuit_breaker.failures: must be at least 1",
                "s.circuit_breaker.max_cool_down: must not be below `cool_down` (1m)",
            ]
        );
        let (_, errors) = check(
            Some(RawCircuitBreaker {
                cool_down: Some("soon".to_owned()),
                ..RawCircuitBreaker::default()
            }),
            Some(CircuitBreaker::default()),
        );
        assert!(
            errors[0].starts_with("s.circuit_breaker.cool_down: `soon` is not a duration"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_long_cool_down_raises_the_inherited_maximum() {
        let (breaker, errors) = check(
            Some(RawCircuitBreaker {
                cool_down: Some("10m".to_owned()),
                ..RawCircuitBreaker::default()
            }),
            Some(CircuitBreaker::default()),
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(breaker.unwrap().max_cool_down, Duration::from_secs(600));
    }

    #[test]
    fn the_cool_down_doubles_per_reopening_up_to_the_maximum() {
        let breaker = CircuitBreaker::default();
        let secs = |opens| breaker.cool_down_of(opens).as_secs();
        assert_eq!(
            [
                secs(0),
                secs(1),
                secs(2),
                secs(3),
                secs(4),
                secs(5),
                secs(99)
            ],
            [30, 30, 60, 120, 240, 300, 300]
        );
    }
}
