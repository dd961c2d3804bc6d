//! What the validation of every section shares: the error collector and
//! the field checks (secret sources, durations, counts, socket addresses),
//! each recording the path of the field it refuses. Knows nothing of which
//! section asks.

use std::net::SocketAddr;
use std::time::Duration;

use super::raw::RawValue;
use super::sources::Sources;
use super::{FieldError, Secret, ValueSource};

/// Collects errors while walking the raw config.
pub(super) struct Errors(pub(super) Vec<FieldError>);

impl Errors {
    pub(super) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// Reads a literal or a secret source (`{env: VAR}`, `{file: PATH}`, relative
/// to the base, `{stored: NAME}` for tenants of the admin API) within what
/// `src` allows; `None`, with the reason recorded, when it cannot be read.
pub(super) fn resolve(
    errors: &mut Errors,
    path: &str,
    value: &RawValue,
    src: &Sources<'_>,
) -> Option<Secret> {
    let source = match value {
        RawValue::Literal(text) => ValueSource::Literal(text.clone()),
        RawValue::Env(var) if var.is_empty() => {
            errors.push(path, "`env:` needs a variable name");
            return None;
        }
        RawValue::Env(var) => {
            if !src.allows_env(errors, path, var) {
                return None;
            }
            ValueSource::Env(var.clone())
        }
        RawValue::File(file) if file.is_empty() => {
            errors.push(path, "`file:` needs a path");
            return None;
        }
        RawValue::File(file) => ValueSource::File(src.host_path(errors, path, file)?),
        RawValue::Stored(name) => return src.stored(errors, path, name),
    };
    match source.resolve(src.env, src.base) {
        Ok(secret) => Some(secret),
        Err(e) => {
            errors.push(path, e.to_string());
            None
        }
    }
}

/// A duration greater than zero such as "20s"; `default` when unset or
/// refused.
pub(super) fn duration(
    errors: &mut Errors,
    path: &str,
    text: Option<&str>,
    default: Duration,
) -> Duration {
    parse_duration(errors, path, text, default, false)
}

/// A duration that may be zero ("0s" turns the stage off).
pub(super) fn duration_or_zero(
    errors: &mut Errors,
    path: &str,
    text: Option<&str>,
    default: Duration,
) -> Duration {
    parse_duration(errors, path, text, default, true)
}

fn parse_duration(
    errors: &mut Errors,
    path: &str,
    text: Option<&str>,
    default: Duration,
    zero_ok: bool,
) -> Duration {
    let Some(text) = text else {
        return default;
    };
    if zero_ok
        && text
            .trim()
            .trim_end_matches(|c: char| c.is_ascii_alphabetic())
            == "0"
    {
        return Duration::ZERO;
    }
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() && !zero_ok => {
            errors.push(path, "must be greater than zero");
            default
        }
        Ok(d) => d,
        Err(e) => {
            errors.push(
                path,
                format!("`{text}` is not a duration such as \"20s\" or \"1m30s\": {e}"),
            );
            default
        }
    }
}

/// A count that must be at least 1 where it is set; `None` when unset or
/// refused.
pub(super) fn at_least_one_or_none<T>(
    errors: &mut Errors,
    path: &str,
    value: Option<T>,
) -> Option<T>
where
    T: Copy + PartialEq + From<u8>,
{
    match value {
        Some(n) if n == T::from(0) => {
            errors.push(path, "must be at least 1");
            None
        }
        other => other,
    }
}

/// A count that must be at least 1 where it is set; `default` when unset or
/// refused.
pub(super) fn at_least_one<T>(errors: &mut Errors, path: &str, value: Option<T>, default: T) -> T
where
    T: Copy + PartialEq + From<u8>,
{
    at_least_one_or_none(errors, path, value).unwrap_or(default)
}

/// A listen address such as `example` (`127.0.0.1:50051`); `None` when
/// refused.
pub(super) fn socket_addr(
    errors: &mut Errors,
    path: &str,
    text: &str,
    example: &str,
) -> Option<SocketAddr> {
    match text.parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            errors.push(
                path,
                format!("`{text}` is not a socket address such as {example}"),
            );
            None
        }
    }
}
