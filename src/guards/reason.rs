//! A denial's reason as the worker sees it: control characters out,
//! credentials redacted, at most [`MAX_DENY_REASON`] bytes.

/// The most bytes of a guard's deny reason a worker sees.
pub const MAX_DENY_REASON: usize = 256;

/// `reason` without control characters, redacted with `redact`, then cut
/// to [`MAX_DENY_REASON`] bytes on a character boundary (redacted before it
/// is cut, so a credential cannot survive in part).
pub fn deny_reason(reason: &str, redact: &(dyn Fn(&str) -> String + Sync)) -> String {
    let clean: String = reason.chars().filter(|c| !c.is_control()).collect();
    let redacted = redact(&clean);
    let mut end = redacted.len().min(MAX_DENY_REASON);
    while !redacted.is_char_boundary(end) {
        end -= 1;
    }
    redacted[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(text: &str) -> String {
        text.to_owned()
    }

    #[test]
    fn control_characters_go_and_the_rest_stays() {
        assert_eq!(deny_reason("a\u{1b}[31mb\nc\td", &same), "a[31mbcd");
    }

    #[test]
    fn a_long_reason_is_cut_on_a_char_boundary() {
        let reason = "é".repeat(200);
        let cut = deny_reason(&reason, &same);
        assert!(cut.len() <= MAX_DENY_REASON);
        assert_eq!(cut.len(), 256);
        let odd = format!("x{}", "é".repeat(200));
        let cut = deny_reason(&odd, &same);
        assert_eq!(cut.len(), 255);
        assert!(cut.chars().all(|c| c == 'x' || c == 'é'));
    }

    #[test]
    fn credentials_are_redacted_before_the_cut() {
        let redactor = crate::credentials::Redactor::new(["s3cret-value"]);
        let redact = |text: &str| redactor.redact(text).into_owned();
        let reason = format!("{}s3cret-value", "x".repeat(250));
        let cut = deny_reason(&reason, &redact);
        assert!(!cut.contains("s3cret"), "{cut}");
        assert!(cut.starts_with(&"x".repeat(250)));
    }
}
