//! Resource URIs in the one form the resource rules match and servers
//! receive: a URI is normalized before anything decides on it, and what
//! would still read differently to a server than to a glob is refused.
//!
//! [`ResourceUri::parse`] (and [`ResourceUri::template`] for a URI
//! template) parses with the `url` crate (WHATWG: the scheme lowercased;
//! for `file`, `http`, `https`, `ws`, `wss` and `ftp` the host lowercased,
//! `file://localhost/` made `file:///`, `\` read as `/`, the default port
//! dropped; `.` and `..` segments removed, spelled `%2e` or not, in every
//! path that starts with `/`), then adds what WHATWG leaves out (RFC 3986
//! §6.2.2): any other scheme's host lowercased, percent-encoded unreserved
//! characters (`A-Z a-z 0-9 - . _ ~`) decoded, and the remaining escapes
//! in upper case. Refused, naming what: what is not an absolute URI; an
//! encoded separator (`%2F`, `%5C`) or a `\` left in the path; a `.` or
//! `..` segment left in the path (a path with no leading `/`, such as
//! `custom:a/../b`, is not resolved by WHATWG); a `file` URI naming a host
//! other than `localhost`.
//!
//! URIs with no `//` after the scheme (`mailto:`, `urn:`, `custom:x`) keep
//! their path as spelled but for the steps above: the scheme in lower case,
//! unreserved escapes decoded, no dot segment, no encoded separator. The
//! query and the fragment are normalized only by the decoding of escapes:
//! they are matched, but name no path.

use std::borrow::Cow;
use std::fmt;

use url::Url;

/// The schemes WHATWG parses as "special" (their hosts are domains).
const SPECIAL: [&str; 6] = ["ftp", "file", "http", "https", "ws", "wss"];

/// A resource URI (or URI template) in normal form: what the resource
/// rules match, and what is sent to the server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceUri(String);

/// Why a resource URI is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriError {
    /// Not an absolute URI (no scheme, a malformed host, ...).
    #[error("{what} `{uri}` is not an absolute URI: {reason}")]
    Invalid {
        /// `resource uri` or `resource uri template`.
        what: &'static str,
        /// The URI as given (quoted: cut when long).
        uri: String,
        /// The parser's reason.
        reason: String,
    },
    /// A percent-encoded `/` or `\` in the path: one segment to a glob,
    /// two to a server that decodes it.
    #[error("{what} `{uri}`: encoded path separator `{escape}` is refused")]
    EncodedSeparator {
        /// `resource uri` or `resource uri template`.
        what: &'static str,
        /// The URI as given (quoted).
        uri: String,
        /// The escape (`%2F`, `%5C`).
        escape: String,
    },
    /// A `\` in the path of a scheme for which WHATWG does not read it as
    /// `/`: a separator to some servers.
    #[error("{what} `{uri}`: a `\\` in the path is refused")]
    Backslash {
        /// `resource uri` or `resource uri template`.
        what: &'static str,
        /// The URI as given (quoted).
        uri: String,
    },
    /// A `.` or `..` segment left in the path (a path with no leading `/`
    /// is not resolved).
    #[error("{what} `{uri}`: dot segment `{segment}` is refused")]
    DotSegment {
        /// `resource uri` or `resource uri template`.
        what: &'static str,
        /// The URI as given (quoted).
        uri: String,
        /// `.` or `..`.
        segment: &'static str,
    },
    /// A `file` URI naming a remote host: its path is not this server's.
    #[error(
        "{what} `{uri}`: a file URI naming host `{host}` is refused (`file:///path` names a local file)"
    )]
    FileHost {
        /// `resource uri` or `resource uri template`.
        what: &'static str,
        /// The URI as given (quoted).
        uri: String,
        /// The host.
        host: String,
    },
    /// A URI template spelling a brace as an escape (`%7B`, `%7D`): it
    /// could not be told from an expression.
    #[error("{what} `{uri}`: an encoded brace (`%7B`, `%7D`) is refused")]
    EncodedBrace {
        /// `resource uri template`.
        what: &'static str,
        /// The template as given (quoted).
        uri: String,
    },
}

impl UriError {
    /// What was wrong, as a stable word (the `refused` of the status's
    /// `ErrorInfo`): `not_absolute`, `encoded_separator`, `backslash`,
    /// `dot_segment`, `file_host`, `encoded_brace`.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            UriError::Invalid { .. } => "not_absolute",
            UriError::EncodedSeparator { .. } => "encoded_separator",
            UriError::Backslash { .. } => "backslash",
            UriError::DotSegment { .. } => "dot_segment",
            UriError::FileHost { .. } => "file_host",
            UriError::EncodedBrace { .. } => "encoded_brace",
        }
    }

    /// Whether it is a URI template's.
    #[must_use]
    pub fn of_template(&self) -> bool {
        let (UriError::Invalid { what, .. }
        | UriError::EncodedSeparator { what, .. }
        | UriError::Backslash { what, .. }
        | UriError::DotSegment { what, .. }
        | UriError::FileHost { what, .. }
        | UriError::EncodedBrace { what, .. }) = self;
        *what == Kind::Template.what()
    }
}

impl ResourceUri {
    /// `uri` in normal form (see the module's documentation).
    ///
    /// # Errors
    /// `uri` is not an absolute URI, or its normal form still carries an
    /// encoded separator, a `\`, a dot segment, or a remote `file` host.
    pub fn parse(uri: &str) -> Result<Self, UriError> {
        normalize(uri, Kind::Uri).map(Self)
    }

    /// URI template `template` (RFC 6570) in normal form: as a URI, with
    /// each `{expression}` kept as written (never lowercased, never
    /// percent-encoded).
    ///
    /// # Errors
    /// As [`ResourceUri::parse`]; also a brace spelled `%7B` or `%7D`.
    pub fn template(template: &str) -> Result<Self, UriError> {
        normalize(template, Kind::Template).map(Self)
    }

    /// The normal form.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The normal form, owned.
    #[must_use]
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for ResourceUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ResourceUri {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A URI or a URI template.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Uri,
    Template,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Uri => "resource uri",
            Kind::Template => "resource uri template",
        }
    }
}

/// The one normalization (see the module's documentation).
fn normalize(raw: &str, kind: Kind) -> Result<String, UriError> {
    let what = kind.what();
    let quoted = || crate::callers::quoted(raw).into_owned();
    // A template's expressions are carried through the parser as escapes
    // no literal can spell (a literal `%7B` is refused), then put back.
    let input: Cow<'_, str> = match kind {
        Kind::Uri => Cow::Borrowed(raw),
        Kind::Template => {
            if find_escape(raw, &["%7B", "%7D"]).is_some() {
                return Err(UriError::EncodedBrace {
                    what,
                    uri: quoted(),
                });
            }
            Cow::Owned(raw.replace('{', "%7B").replace('}', "%7D"))
        }
    };
    let mut url = Url::parse(&input).map_err(|e| UriError::Invalid {
        what,
        uri: quoted(),
        reason: e.to_string(),
    })?;
    let special = SPECIAL.contains(&url.scheme());
    if url.scheme() == "file"
        && let Some(host) = url.host_str()
        && !host.is_empty()
    {
        return Err(UriError::FileHost {
            what,
            uri: quoted(),
            host: crate::callers::quoted(&restore_braces(host, kind)).into_owned(),
        });
    }
    if !special && let Some(host) = url.host_str() {
        // WHATWG keeps an opaque host as spelled; RFC 3986 makes every
        // host case-insensitive.
        let lowered = lowercase_host(&decode_unreserved(host), kind);
        if lowered != host {
            url.set_host(Some(&lowered))
                .map_err(|e| UriError::Invalid {
                    what,
                    uri: quoted(),
                    reason: e.to_string(),
                })?;
        }
    }
    check_path(&decode_unreserved(url.path()), what, &quoted)?;
    let normal = decode_unreserved(url.as_str()).into_owned();
    Ok(restore_braces(&normal, kind).into_owned())
}

/// Refuses a path that still carries an encoded separator, a `\` or a dot
/// segment.
fn check_path(path: &str, what: &'static str, quoted: &dyn Fn() -> String) -> Result<(), UriError> {
    if let Some(escape) = find_escape(path, &["%2F", "%5C"]) {
        return Err(UriError::EncodedSeparator {
            what,
            uri: quoted(),
            escape: escape.to_owned(),
        });
    }
    if path.contains('\\') {
        return Err(UriError::Backslash {
            what,
            uri: quoted(),
        });
    }
    for segment in path.split('/') {
        let segment = match segment {
            "." => ".",
            ".." => "..",
            _ => continue,
        };
        return Err(UriError::DotSegment {
            what,
            uri: quoted(),
            segment,
        });
    }
    Ok(())
}

/// The first of `escapes` (upper case) in `text`, in any case, as
/// spelled there.
fn find_escape<'t>(text: &'t str, escapes: &[&str]) -> Option<&'t str> {
    text.match_indices('%').find_map(|(at, _)| {
        let escape = text.get(at..at + 3)?;
        escapes
            .iter()
            .any(|e| e.eq_ignore_ascii_case(escape))
            .then_some(escape)
    })
}

/// `text` with every escape of an unreserved character decoded and every
/// other escape's hex digits in upper case (RFC 3986 §6.2.2.1, §6.2.2.2).
fn decode_unreserved(text: &str) -> Cow<'_, str> {
    if !text.contains('%') {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(high), Some(low)) = (
                bytes.get(i + 1).and_then(|b| hex(*b)),
                bytes.get(i + 2).and_then(|b| hex(*b)),
            )
        {
            let byte = high << 4 | low;
            let unreserved =
                byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~');
            // A hex digit decoded right after a stray `%` (or `%` and one
            // hex digit) would make an escape that was not there: kept as
            // an escape, so that a normal form is its own normal form.
            let tail = out.as_bytes();
            let completes_escape = byte.is_ascii_hexdigit()
                && (tail.last() == Some(&b'%')
                    || (tail.len() >= 2
                        && tail[tail.len() - 2] == b'%'
                        && hex(tail[tail.len() - 1]).is_some()));
            if unreserved && !completes_escape {
                out.push(char::from(byte));
            } else {
                out.push('%');
                out.push(char::from(bytes[i + 1].to_ascii_uppercase()));
                out.push(char::from(bytes[i + 2].to_ascii_uppercase()));
            }
            i += 3;
            continue;
        }
        // Copy up to the next `%` (never inside a UTF-8 sequence).
        let next = text[i + 1..].find('%').map_or(text.len(), |n| i + 1 + n);
        out.push_str(&text[i..next]);
        i = next;
    }
    Cow::Owned(out)
}

/// The value of hex digit `b`.
fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// An opaque host in lower case but for its escapes (already upper case)
/// and, in a template, its expressions.
fn lowercase_host(host: &str, kind: Kind) -> String {
    let mut out = String::with_capacity(host.len());
    let mut rest = host;
    while !rest.is_empty() {
        if kind == Kind::Template && rest.starts_with("%7B") {
            let end = rest.find("%7D").map_or(rest.len(), |e| e + 3);
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else if rest.starts_with('%') && rest.len() >= 3 {
            out.push_str(&rest[..3]);
            rest = &rest[3..];
        } else {
            let c = rest.chars().next().unwrap_or_default();
            out.push(c.to_ascii_lowercase());
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// A template's expressions as written again.
fn restore_braces(text: &str, kind: Kind) -> Cow<'_, str> {
    if kind == Kind::Template && text.contains("%7") {
        Cow::Owned(text.replace("%7B", "{").replace("%7D", "}"))
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// URI-shaped text: a scheme in either case, an authority or not, and
    /// a tail of the characters that make dot segments, escapes,
    /// separators, hosts and template expressions.
    fn uri_like() -> impl Strategy<Value = String> {
        (
            "(file|FILE|File|demo|DEMO|http|HTTPS|custom|urn|wiki)",
            "(:|://|:///|://localhost/|://LocalHost|://Ab@Host:80/)",
            proptest::collection::vec(
                "(/|\\.|\\.\\.|%2e|%2E|%2f|%5C|%41|%7e|%c3%a9|%|a|B|\\\\|\\{|\\}|\\?|#|@|:| |é|~|-)",
                0..14,
            ),
        )
            .prop_map(|(scheme, authority, tail)| format!("{scheme}{authority}{}", tail.concat()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// A normal form is its own normal form, and carries nothing the
        /// normalizer refuses: the rules and the server see one string.
        #[test]
        fn a_normal_form_is_stable(text in uri_like()) {
            if let Ok(normal) = ResourceUri::parse(&text) {
                prop_assert_eq!(ResourceUri::parse(normal.as_str()), Ok(normal.clone()), "{}", text);
            }
            if let Ok(normal) = ResourceUri::template(&text) {
                prop_assert_eq!(ResourceUri::template(normal.as_str()), Ok(normal.clone()), "{}", text);
            }
        }
    }

    fn normal(uri: &str) -> String {
        ResourceUri::parse(uri)
            .unwrap_or_else(|e| panic!("{uri}: {e}"))
            .into_string()
    }

    fn refused(uri: &str) -> UriError {
        ResourceUri::parse(uri).expect_err(uri)
    }

    #[test]
    fn each_bypass_spelling_of_the_issue_is_normalized_or_refused() {
        let secret = "file:///srv/secret/key";
        // Dot segments, plain and percent-encoded (in either case, half
        // encoded), are resolved.
        for spelled in [
            "file:///srv/public/../secret/key",
            "file:///srv/public/%2e%2e/secret/key",
            "file:///srv/public/%2E%2E/secret/key",
            "file:///srv/public/.%2e/secret/key",
            "file:///srv/public/%2e./secret/key",
            "file:///srv/public/./../secret/./key",
            "file:///srv/public/sub/%2e%2e/%2E%2E/secret/key",
            // `\` is `/` in a file URI (WHATWG).
            "file:///srv/public\\..\\secret\\key",
            // The host `localhost` is the local one; scheme and host
            // case.
            "file://localhost/srv/secret/key",
            "file://LocalHost/srv/secret/key",
            "FILE:///srv/secret/key",
            "File://LOCALHOST/srv/public/../secret/key",
            // Unreserved characters percent-encoded.
            "file:///srv/%73ecret/%6B%65%79",
            "file:///srv/public/%2E%2e/%73ecret/key",
        ] {
            assert_eq!(normal(spelled), secret, "{spelled}");
        }
        // `..%2f` hides a separator from the glob: refused, naming it.
        for (spelled, escape) in [
            ("file:///srv/public/..%2fsecret/key", "%2F"),
            ("file:///srv/public/..%2Fsecret/key", "%2F"),
            ("file:///srv/public/%2e%2e%2fsecret/key", "%2F"),
            ("file:///srv/public/..%5csecret%5ckey", "%5C"),
            ("demo://host/a%2Fb", "%2F"),
        ] {
            let error = refused(spelled);
            assert_eq!(
                error,
                UriError::EncodedSeparator {
                    what: "resource uri",
                    uri: spelled.to_owned(),
                    escape: escape.to_owned(),
                },
                "{spelled}"
            );
            assert_eq!(
                error.to_string(),
                format!("resource uri `{spelled}`: encoded path separator `{escape}` is refused")
            );
        }
    }

    #[test]
    fn whatwg_claims_hold() {
        // Scheme lowercased; special hosts lowercased, default port
        // dropped.
        assert_eq!(
            normal("HTTPS://Example.COM:443/A/b"),
            "https://example.com/A/b"
        );
        // `file://localhost/` is `file:///`.
        assert_eq!(normal("file://localhost/etc/x"), "file:///etc/x");
        // `%2e` segments are dot segments in special and other schemes
        // with a hierarchical path.
        assert_eq!(normal("demo://resource/a/%2e%2e/b"), "demo://resource/b");
        assert_eq!(normal("demo://resource/a/%2E/b"), "demo://resource/a/b");
        assert_eq!(normal("custom:/a/../b"), "custom:/b");
        // Paths stay case-sensitive.
        assert_eq!(normal("file:///Srv/Key"), "file:///Srv/Key");
        // Spaces and non-ASCII are percent-encoded in the path.
        assert_eq!(normal("file:///a b/é"), "file:///a%20b/%C3%A9");
        // Leading `..` cannot climb above the root.
        assert_eq!(normal("file:///../../etc/x"), "file:///etc/x");
        assert_eq!(normal("file:///C:/x/../y"), "file:///C:/y");
    }

    #[test]
    fn other_schemes_get_what_whatwg_leaves_out() {
        // Hosts of other schemes in lower case (WHATWG keeps them).
        assert_eq!(normal("MEMO://Insights/A"), "memo://insights/A");
        assert_eq!(normal("wiki://PRIVATE/x"), "wiki://private/x");
        assert_eq!(normal("demo://%50rivate/x"), "demo://private/x");
        // Unreserved escapes decoded everywhere; others in upper case.
        assert_eq!(
            normal("demo://h/%7e%41%2d?q=%2a%61#%5f"),
            "demo://h/~A-?q=%2Aa#_"
        );
        assert_eq!(normal("file:///a%c3%a9"), "file:///a%C3%A9");
        // Double encoding is one escape of `%`: kept.
        assert_eq!(
            normal("file:///srv/%252e%252e/x"),
            "file:///srv/%252e%252e/x"
        );
        // Query and fragment name no path.
        assert_eq!(normal("demo://h/x?p=a/../b%2F"), "demo://h/x?p=a/../b%2F");
        // Already normal: unchanged.
        for uri in [
            "fixture://text",
            "num://item/3",
            "demo://resource/static/document/architecture.md",
            "file:///srv/public/readme.txt",
            "memo://insights",
        ] {
            assert_eq!(normal(uri), uri);
        }
    }

    #[test]
    fn uris_without_a_hierarchy_keep_their_path() {
        assert_eq!(normal("MAILTO:Bob@Example.COM"), "mailto:Bob@Example.COM");
        assert_eq!(normal("urn:isbn:0451450523"), "urn:isbn:0451450523");
        assert_eq!(normal("custom:a%2db"), "custom:a-b");
        // Not resolved by WHATWG: refused.
        for (uri, segment) in [
            ("custom:a/../b", ".."),
            ("custom:a/%2e%2e/b", ".."),
            ("custom:./b", "."),
            ("custom:..", ".."),
        ] {
            assert_eq!(
                refused(uri),
                UriError::DotSegment {
                    what: "resource uri",
                    uri: uri.to_owned(),
                    segment
                },
                "{uri}"
            );
        }
        assert!(matches!(
            refused("custom:a%2fb"),
            UriError::EncodedSeparator { .. }
        ));
    }

    #[test]
    fn what_is_refused_is_named() {
        assert!(matches!(
            refused("/srv/secret/key"),
            UriError::Invalid { .. }
        ));
        assert!(matches!(refused(""), UriError::Invalid { .. }));
        assert_eq!(
            refused("demo://h/a\\..\\b"),
            UriError::Backslash {
                what: "resource uri",
                uri: "demo://h/a\\..\\b".to_owned()
            }
        );
        let remote = refused("file://evil/etc/passwd");
        assert_eq!(
            remote,
            UriError::FileHost {
                what: "resource uri",
                uri: "file://evil/etc/passwd".to_owned(),
                host: "evil".to_owned(),
            }
        );
        assert!(remote.to_string().contains("host `evil`"), "{remote}");
        // A long URI is quoted cut.
        let long = format!("file:///{}%2F", "a".repeat(500));
        let message = refused(&long).to_string();
        assert!(message.len() < 200, "{message}");
    }

    #[test]
    fn normalizing_twice_changes_nothing() {
        for uri in [
            "File://LOCALHOST/srv/public/../secret/key",
            "MEMO://Insights/%7e/x?q=%2a",
            "demo://h/a%20b/%C3%A9",
            "file:///a b",
            "mailto:Bob@Example.COM",
            "http://EXAMPLE.com:80/a/./b/../c",
        ] {
            let once = normal(uri);
            assert_eq!(normal(&once), once, "{uri}");
        }
    }

    #[test]
    fn templates_keep_their_expressions() {
        let template = |t: &str| {
            ResourceUri::template(t)
                .unwrap_or_else(|e| panic!("{t}: {e}"))
                .into_string()
        };
        for kept in [
            "demo://resource/dynamic/text/{resourceId}",
            "fixture://greet/{name}",
            "file:///srv/{+path}",
            "file:///search{?q,lang}",
            "users://{userId}/profile",
            "file:///a/{x}{/rest*}",
        ] {
            assert_eq!(template(kept), kept);
        }
        assert_eq!(
            template("FILE://localhost/srv/public/../secret/{name}"),
            "file:///srv/secret/{name}"
        );
        assert_eq!(template("USERS://Acme/{userId}"), "users://acme/{userId}");
        assert_eq!(
            template("Users://{userId}.Acme/x"),
            "users://{userId}.acme/x"
        );
        assert!(matches!(
            ResourceUri::template("file:///srv/%7Bname%7D"),
            Err(UriError::EncodedBrace { .. })
        ));
        assert!(matches!(
            ResourceUri::template("file:///srv/..%2F{name}"),
            Err(UriError::EncodedSeparator { .. })
        ));
        assert!(matches!(
            ResourceUri::template("custom:{a}/../b"),
            Err(UriError::DotSegment { .. })
        ));
    }
}
