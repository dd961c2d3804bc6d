//! YAML text → the raw types, naming the path of the first error. The
//! error never shows the value found, only its kind: any field may hold a
//! secret written in the wrong place.

use super::FieldError;
use super::raw::RawConfig;

/// Parses YAML into the raw types, naming the path of the first error.
///
/// The error names the path and what was expected, never the value found:
/// a secret written in the wrong shape (`tokens: "s3cret"` instead of a
/// list) must not reach the terminal or a log line. See [`without_values`].
pub(super) fn parse(text: &str) -> Result<RawConfig, FieldError> {
    let deserializer = yaml_serde::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(field_error)
}

/// Parses YAML into a generic value (a tenant spec, before its name is
/// settled), naming the path of the first error without values.
pub(super) fn parse_value(text: &str) -> Result<yaml_serde::Value, FieldError> {
    let deserializer = yaml_serde::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(field_error)
}

/// A generic value into a raw type, naming the path of the first error
/// without values.
pub(super) fn from_value<T: serde::de::DeserializeOwned>(
    value: yaml_serde::Value,
) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(value).map_err(field_error)
}

/// A deserializer's error as a field error: its path, and its message
/// without the value it refused.
fn field_error<E: std::fmt::Display>(err: serde_path_to_error::Error<E>) -> FieldError {
    let tracked = err.path().to_string();
    let message = without_values(&err.into_inner().to_string());
    // The YAML library prefixes its own path ("tenants[0].servers[0]: ");
    // use it rather than print a path twice.
    match message.split_once(": ") {
        Some((head, rest)) if is_path(head) => FieldError {
            path: head.to_owned(),
            message: rest.to_owned(),
        },
        _ => FieldError {
            path: if tracked == "." {
                String::new()
            } else {
                tracked
            },
            message,
        },
    }
}

/// serde's messages quote the value they refused (`invalid type: string
/// "s3cret", expected a sequence`, ``unknown variant `x`, expected ...``).
/// Any field may hold a secret written in the wrong place, so the value is
/// replaced by its kind (`invalid type: a string, expected a sequence`);
/// the rest of the message (path, what was expected, line) stays.
fn without_values(message: &str) -> String {
    const INVALID: [&str; 2] = ["invalid type: ", "invalid value: "];
    const VARIANT: &str = "unknown variant `";
    // The first marker is serde's own: the path before it cannot hold one,
    // and the value it quotes comes after it.
    let found = INVALID
        .iter()
        .chain(std::iter::once(&VARIANT))
        .filter_map(|marker| message.find(marker).map(|at| (at, *marker)))
        .min();
    let Some((at, marker)) = found else {
        return message.to_owned();
    };
    let (head, tail) = message.split_at(at);
    let after = &tail[marker.len()..];
    if marker == VARIANT {
        // ``unknown variant `VALUE`, expected one of `a`, `b` `` or
        // ``..., there are no variants``; the last separator is serde's,
        // whatever the value contains.
        let rest = ["`, expected ", "`, there are no variants"]
            .iter()
            .filter_map(|end| after.rfind(end).map(|i| &after[i + 1..]))
            .min_by_key(|rest| rest.len())
            .unwrap_or("");
        return format!("{head}unknown variant{rest}");
    }
    let (kind, rest) = unexpected_kind(after);
    format!("{head}{marker}{kind}{rest}")
}

/// Splits serde's description of an unexpected value (`string "x"`,
/// ``integer `5` ``, `sequence`, ...) off `text`: its kind without the
/// value, and the text after it.
fn unexpected_kind(text: &str) -> (&'static str, &str) {
    if let Some(quoted) = text.strip_prefix("string \"") {
        // A `{:?}` string: `\` escapes the next character.
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => return ("a string", &quoted[i + 1..]),
                _ => {}
            }
        }
        return ("a string", "");
    }
    for (prefix, kind) in [
        ("boolean `", "a boolean"),
        ("integer `", "an integer"),
        ("floating point `", "a floating point number"),
        ("character `", "a character"),
    ] {
        if let Some(value) = text.strip_prefix(prefix) {
            // The value is never empty; a character may itself be "`".
            let start = value.chars().next().map_or(0, char::len_utf8);
            return match value[start..].find('`') {
                Some(end) => (kind, &value[start + end + 1..]),
                None => (kind, ""),
            };
        }
    }
    // Kinds serde prints without a value.
    for kind in [
        "byte array",
        "unit value",
        "Option value",
        "newtype struct",
        "sequence",
        "map",
        "enum",
        "unit variant",
        "newtype variant",
        "tuple variant",
        "struct variant",
    ] {
        if text.starts_with(kind) {
            return ("", text);
        }
    }
    // Anything else may be a value: keep only what was expected.
    match text.rfind(", expected ") {
        Some(i) => ("a value", &text[i..]),
        None => ("a value", ""),
    }
}

/// Whether `text` looks like a field path such as `tenants[0].servers[1]`.
fn is_path(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'[' | b']'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate::testing::{messages, server_messages};

    #[test]
    fn unknown_keys_name_their_path() {
        let errors = server_messages(
            r#"
      - name: a
        urll: "http://x"
"#,
        );
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("tenants[0].servers[0]"), "{errors:?}");
        assert!(errors[0].contains("urll"), "{errors:?}");
    }

    /// A secret written in the wrong shape, in any field: the error names
    /// the path and what was expected, never the value.
    #[test]
    fn shape_errors_never_echo_the_value() {
        const SECRET: &str = "super-secret-value";
        for (yaml, path, expected) in [
            (
                "tenants:\n  - name: acme\n    tokens: \"super-secret-value\"\n",
                "tenants[0].tokens",
                "invalid type: a string, expected a sequence",
            ),
            (
                "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: a\n        url: \"http://127.0.0.1/\"\n        headers: \"Bearer super-secret-value\"\n",
                "tenants[0].servers[0].headers",
                "invalid type: a string, expected a map",
            ),
            (
                "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: a\n        command: [x]\n        env: [\"API_KEY=super-secret-value\"]\n",
                "tenants[0].servers[0].env",
                "expected a map",
            ),
            (
                "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n      - name: a\n        url: \"http://127.0.0.1/\"\n        headers:\n          Authorization: { Bearer super-secret-value }\n",
                "tenants[0].servers[0].headers.Authorization",
                "a secret source takes `env`, `file` or `stored`",
            ),
            (
                "tenants:\n  - name: acme\n    tokens: [{ Bearer super-secret-value: x }]\n",
                "tenants[0].tokens[0]",
                "a secret source takes `env`, `file` or `stored`",
            ),
            (
                "tenants:\n  - name: acme\n    tokens: [{ env: { name: super-secret-value } }]\n",
                "tenants[0].tokens[0].env",
                "invalid type: map, expected a string",
            ),
            (
                "reflection: super-secret-value\ntenants: []\n",
                "reflection",
                "invalid type: a string, expected a boolean",
            ),
            (
                "defaults:\n  lifecycle: super-secret-value\ntenants: []\n",
                "defaults.lifecycle",
                "unknown variant, expected one of `initialize`, `discover`, `auto`",
            ),
            (
                "limits:\n  max_argument_bytes: super-secret-value\ntenants: []\n",
                "limits.max_argument_bytes",
                "invalid type: a string, expected usize",
            ),
        ] {
            let error = parse(yaml).expect_err(yaml);
            assert!(!error.to_string().contains(SECRET), "{error}");
            assert_eq!(error.path, path, "{error}");
            assert!(error.message.contains(expected), "{expected} in {error}");
        }
        // Numbers are values too.
        let error = parse("limits:\n  max_schema_depth: -738291\ntenants: []\n").unwrap_err();
        assert!(!error.to_string().contains("738291"), "{error}");
        assert!(
            error.message.contains("an integer, expected usize"),
            "{error}"
        );
    }

    #[test]
    fn without_values_survives_values_that_look_like_the_message() {
        for (message, shown) in [
            (
                r#"invalid type: string "a\", expected x", expected a sequence at line 3 column 13"#,
                "invalid type: a string, expected a sequence at line 3 column 13",
            ),
            (
                "tenants[0]: invalid value: character `\u{60}`, expected a digit",
                "tenants[0]: invalid value: a character, expected a digit",
            ),
            (
                "invalid value: floating point `1.5`, expected u32",
                "invalid value: a floating point number, expected u32",
            ),
            (
                "unknown variant `x`, expected one of `a`, there are no variants`, expected `a` or `b`",
                "unknown variant, expected `a` or `b`",
            ),
            (
                "unknown variant `x`, expected y`, there are no variants",
                "unknown variant, there are no variants",
            ),
            (
                "invalid type: sequence, expected a string",
                "invalid type: sequence, expected a string",
            ),
            (
                "invalid type: something new 's3cret', expected a string",
                "invalid type: a value, expected a string",
            ),
            (
                "unknown field `urll`, expected `url`",
                "unknown field `urll`, expected `url`",
            ),
        ] {
            assert_eq!(without_values(message), shown);
        }
    }

    #[test]
    fn secret_source_shape_errors_name_the_path() {
        let errors = messages(
            r#"
tenants:
  - name: acme
    tokens: [{ vault: x }]
"#,
        );
        assert!(errors[0].starts_with("tenants[0].tokens[0]"), "{errors:?}");
        assert!(errors[0].contains("vault"));
    }
}
