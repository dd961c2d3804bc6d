//! How the client verbs show a time: RFC 3339 (UTC, to the second) and,
//! coarsely, how far it is from now (`in 14m`, `3h 5m ago`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The latest time RFC 3339 can write (9999-12-31T23:59:59Z), in Unix
/// milliseconds.
const LAST_MS: i64 = 253_402_300_799_000;

/// Now, in Unix milliseconds.
#[must_use]
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `unix_ms` as RFC 3339 (`2026-05-01T12:00:00Z`); a time before 1970 or
/// after 9999 is written as the nearest one RFC 3339 has.
#[must_use]
pub(super) fn rfc3339(unix_ms: i64) -> String {
    let ms = u64::try_from(unix_ms.clamp(0, LAST_MS)).unwrap_or_default();
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A length of time in its two largest units, rounded down: `45s`,
/// `14m`, `2h 5m`, `3d 4h`.
#[must_use]
pub(super) fn span(ms: u64) -> String {
    let seconds = ms / 1000;
    let (days, hours, minutes) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h {m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d {h}h"),
    }
}

/// How far `at_ms` is from `now_ms`: `in 14m`, `3m ago`, or `now` (within
/// a second).
#[must_use]
pub(super) fn relative(at_ms: i64, now_ms: i64) -> String {
    let difference = at_ms.saturating_sub(now_ms);
    if difference.unsigned_abs() < 1000 {
        "now".to_owned()
    } else if difference > 0 {
        format!("in {}", span(difference.unsigned_abs()))
    } else {
        format!("{} ago", span(difference.unsigned_abs()))
    }
}

/// `2026-05-01T12:00:00Z (in 14m)`.
#[must_use]
pub(super) fn at(at_ms: i64, now_ms: i64) -> String {
    format!("{} ({})", rfc3339(at_ms), relative(at_ms, now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_and_relative() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_777_636_800_999), "2026-05-01T12:00:00Z");
        assert_eq!(rfc3339(-5), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(i64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(span(45_999), "45s");
        assert_eq!(span(14 * 60_000 + 59_000), "14m");
        assert_eq!(span(2 * 3_600_000), "2h");
        assert_eq!(span(2 * 3_600_000 + 5 * 60_000), "2h 5m");
        assert_eq!(span(3 * 86_400_000 + 4 * 3_600_000 + 1), "3d 4h");
        assert_eq!(span(86_400_000 + 60_000), "1d");
        let now = 1_777_636_800_000;
        assert_eq!(relative(now + 14 * 60_000, now), "in 14m");
        assert_eq!(relative(now - 3 * 60_000, now), "3m ago");
        assert_eq!(relative(now + 400, now), "now");
        assert_eq!(relative(i64::MIN, i64::MAX), relative(i64::MIN, i64::MAX));
        assert_eq!(at(now + 60_000, now), "2026-05-01T12:01:00Z (in 1m)");
    }
}
