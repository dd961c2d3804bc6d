//! Redaction of credentials from upstream text.
//!
//! An upstream can echo what it received (an `Authorization` header in an
//! error page, an API key or an OAuth token in a tool result). Every text
//! that comes from an upstream passes through a [`Redaction`]: the
//! [`Redactor`] of the configuration's credentials (built once per
//! configuration), and for an OAuth server the redactor of the live tokens
//! its client holds ([`LiveTokens`](super::oauth::LiveTokens)) and that of
//! the token the session sends now. Each value of [`MIN_REDACTED_LEN`]
//! characters or more is replaced by [`REDACTED`] (one Aho-Corasick pass
//! per redactor over the values' last [`ANCHOR_LEN`] bytes, each occurrence
//! widened to the whole value when it is there whole), then the text is cut
//! to a documented bound ([`bounded`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use arc_swap::ArcSwap;

use crate::config::{Config, Secret, Transport};

/// What replaces a credential value.
pub const REDACTED: &str = "[redacted]";

/// Credential values shorter than this are not redacted: short values
/// (`"1"`, `"true"`) would mangle ordinary text, and are not credentials.
pub const MIN_REDACTED_LEN: usize = 8;

/// Most bytes of upstream text quoted in a status message, a
/// `ServerStatus.error` or a log line.
pub const MAX_UPSTREAM_TEXT: usize = 1024;

/// Most bytes of a whole status message (upstream text included).
pub const MAX_STATUS_MESSAGE: usize = 2000;

/// A value is searched for by its last this many bytes (its *anchor*; a
/// shorter value is its own anchor): the automaton's size is bounded by
/// the number of values, not their length (a JWT access token is about a
/// kilobyte). An occurrence of an anchor is replaced with the whole value
/// before it when the value is there whole, else alone: a text that holds
/// only the end of a value loses that end too.
pub const ANCHOR_LEN: usize = 32;

/// Replaces every configured credential value in a text.
pub struct Redactor {
    /// The values, sorted and without duplicates.
    patterns: Vec<Box<str>>,
    /// The automaton over the anchors of `patterns`, built on the first
    /// redaction: with many tenants it is the largest single cost of
    /// applying a configuration (10,000 caller tokens: about a tenth of the
    /// start), and a gateway whose upstreams never fail may never need it.
    matcher: OnceLock<Matcher>,
}

/// The anchors' automaton, and for each anchor the values that end with
/// it (indices into `patterns`, the longest first).
struct Matcher {
    anchors: AhoCorasick,
    owners: Vec<Vec<usize>>,
}

/// The current configuration's redactor, replaced on reload.
pub type SharedRedactor = Arc<ArcSwap<Redactor>>;

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        f.debug_struct("Redactor")
            .field("patterns", &self.patterns.len())
            .finish()
    }
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new(std::iter::empty::<&str>())
    }
}

impl Redactor {
    /// A redactor of `values` (those shorter than [`MIN_REDACTED_LEN`]
    /// characters are skipped).
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        let mut patterns: Vec<Box<str>> = values
            .into_iter()
            .filter(|v| v.chars().count() >= MIN_REDACTED_LEN)
            .map(Box::from)
            .collect();
        patterns.sort_unstable();
        patterns.dedup();
        Self {
            patterns,
            matcher: OnceLock::new(),
        }
    }

    /// The automaton, built on first use; `None` when nothing is redacted.
    fn matcher(&self) -> Option<&Matcher> {
        if self.patterns.is_empty() {
            return None;
        }
        Some(self.matcher.get_or_init(|| {
            let mut ids: HashMap<&str, usize> = HashMap::new();
            let mut anchors: Vec<&str> = Vec::new();
            let mut owners: Vec<Vec<usize>> = Vec::new();
            for (index, value) in self.patterns.iter().enumerate() {
                let anchor = anchor_of(value);
                let id = *ids.entry(anchor).or_insert_with(|| {
                    anchors.push(anchor);
                    owners.push(Vec::new());
                    anchors.len() - 1
                });
                owners[id].push(index);
            }
            for owned in &mut owners {
                owned.sort_by_key(|&index| std::cmp::Reverse(self.patterns[index].len()));
            }
            let anchors = AhoCorasickBuilder::new()
                .match_kind(MatchKind::Standard)
                .build(anchors)
                .expect("literal patterns of bounded count always build");
            Matcher { anchors, owners }
        }))
    }

    /// Where values are in `text`: for each occurrence of an anchor, the
    /// longest value that ends there whole, else the anchor alone;
    /// overlapping places merged, in order.
    fn places(&self, matcher: &Matcher, text: &str) -> Vec<(usize, usize)> {
        let mut places: Vec<(usize, usize)> = matcher
            .anchors
            .find_overlapping_iter(text)
            .map(|found| {
                let end = found.end();
                let start = matcher.owners[found.pattern().as_usize()]
                    .iter()
                    .map(|&index| &*self.patterns[index])
                    .find_map(|value| {
                        let start = end.checked_sub(value.len())?;
                        (text.get(start..end) == Some(value)).then_some(start)
                    })
                    .unwrap_or(found.start());
                (start, end)
            })
            .collect();
        places.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(places.len());
        for (start, end) in places {
            match merged.last_mut() {
                Some((_, last_end)) if start < *last_end => *last_end = (*last_end).max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }

    /// The redactor of every credential in `config`: each caller token,
    /// each HTTP header value, each stdio environment value read from a
    /// secret source (`{env:}`, `{file:}`), each OAuth client secret and
    /// private key, the state store's URL and keys, and each guard's token.
    pub fn for_config(config: &Config) -> Self {
        let mut values: Vec<&Secret> = Vec::new();
        values.extend(config.state.url.iter());
        values.extend(config.state.keys.iter());
        if let Some(admin) = &config.admin {
            values.extend(admin.tokens.iter());
        }
        // The guards' bearer tokens (`guards[].token`).
        values.extend(config.guards.iter().filter_map(|g| g.token.as_ref()));
        for tenant in &config.tenants {
            tenant_values(tenant, &mut values);
        }
        Self::of_values(values)
    }

    /// The redactor of one tenant's own credentials (as
    /// [`Redactor::for_config`] takes them of every tenant of the file): for
    /// a tenant of `tenants_dir` or of the state store, whose credentials
    /// the configuration's redactor does not hold. A stored secret
    /// (`{stored: NAME}`) counts as read from a secret source.
    pub fn for_tenant(tenant: &crate::config::TenantConfig) -> Self {
        let mut values = Vec::new();
        tenant_values(tenant, &mut values);
        Self::of_values(values)
    }

    /// A redactor of this one's values and `other`'s.
    pub fn merged(&self, other: &Redactor) -> Self {
        Self::new(
            self.patterns
                .iter()
                .chain(other.patterns.iter())
                .map(|p| &**p),
        )
    }

    fn of_values(values: Vec<&Secret>) -> Self {
        let mut exposed: Vec<&str> = Vec::with_capacity(values.len() * 2);
        for value in values {
            let text = value.expose();
            exposed.push(text);
            // `Authorization: Bearer <token>`: the token alone is as secret
            // as the whole value, and is what a server echoes most often.
            if let Some((_, rest)) = text.split_once(' ') {
                exposed.push(rest.trim());
            }
        }
        Self::new(exposed)
    }

    /// A handle that can be swapped on reload.
    pub fn shared(self) -> SharedRedactor {
        Arc::new(ArcSwap::from_pointee(self))
    }

    /// Whether any value is redacted.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// `text` with every credential value replaced by [`REDACTED`]
    /// (overlapping values as one).
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let matcher = match self.matcher() {
            Some(matcher) if matcher.anchors.is_match(text) => matcher,
            _ => return Cow::Borrowed(text),
        };
        let mut redacted = String::with_capacity(text.len());
        let mut done = 0;
        for (start, end) in self.places(matcher, text) {
            redacted.push_str(&text[done..start]);
            redacted.push_str(REDACTED);
            done = end;
        }
        redacted.push_str(&text[done..]);
        Cow::Owned(redacted)
    }

    /// Redacts `text` in place; returns whether anything was replaced.
    pub fn redact_in_place(&self, text: &mut String) -> bool {
        match self.redact(text) {
            Cow::Borrowed(_) => false,
            Cow::Owned(redacted) => {
                *text = redacted;
                true
            }
        }
    }

    /// Redacts every string (keys and values) of a JSON value in place.
    pub fn redact_json(&self, value: &mut serde_json::Value) {
        if self.is_empty() {
            return;
        }
        match value {
            serde_json::Value::String(text) => {
                self.redact_in_place(text);
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    self.redact_json(item);
                }
            }
            serde_json::Value::Object(map) => {
                let keys: Vec<String> = map.keys().cloned().collect();
                for key in keys {
                    let Some(mut item) = map.remove(&key) else {
                        continue;
                    };
                    self.redact_json(&mut item);
                    map.insert(self.redact(&key).into_owned(), item);
                }
            }
            _ => {}
        }
    }

    /// Upstream text on its way to a status message, a `ServerStatus` or a
    /// log line: redacted first, then cut to [`MAX_UPSTREAM_TEXT`] bytes.
    pub fn upstream_text(&self, text: &str) -> String {
        bounded(&self.redact(text), MAX_UPSTREAM_TEXT)
    }
}

/// A tenant's credentials: its tokens, each HTTP header value, each stdio
/// environment value read from a secret source, each OAuth client secret
/// and private key.
fn tenant_values<'a>(tenant: &'a crate::config::TenantConfig, values: &mut Vec<&'a Secret>) {
    values.extend(tenant.tokens.iter());
    for server in &tenant.servers {
        match &server.transport {
            Transport::Http { headers, .. } => {
                values.extend(headers.iter().map(|(_, v)| v));
            }
            Transport::Stdio { env, .. } => {
                values.extend(env.iter().map(|(_, v)| v).filter(|v| v.is_sourced()));
            }
        }
        if let Some(oauth) = &server.oauth {
            values.extend(oauth.client_secret.iter());
            values.extend(oauth.private_key.iter());
        }
    }
}

/// Everything taken out of one session's text: the configuration's
/// credentials, and for an OAuth server the live tokens of its client (every
/// subject's) and the token the session sends now. Each part is a
/// [`SharedRedactor`], read at each use, so a reload or a new token applies
/// at once; its automaton is built once per change, not per text. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Redaction {
    /// The configuration's redactor first, then the others.
    layers: Vec<SharedRedactor>,
}

impl Redaction {
    /// The redaction of the configuration's credentials alone.
    pub fn new(configured: SharedRedactor) -> Self {
        Self {
            layers: vec![configured],
        }
    }

    /// Also takes out what `layer` redacts.
    #[must_use]
    pub fn with(mut self, layer: SharedRedactor) -> Self {
        self.layers.push(layer);
        self
    }

    /// Whether nothing is redacted now.
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(|layer| layer.load().is_empty())
    }

    /// `text` with every credential value replaced by [`REDACTED`].
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for layer in &self.layers {
            let redacted = match layer.load().redact(&text) {
                Cow::Owned(redacted) => redacted,
                Cow::Borrowed(_) => continue,
            };
            text = Cow::Owned(redacted);
        }
        text
    }

    /// Redacts `text` in place; returns whether anything was replaced.
    pub fn redact_in_place(&self, text: &mut String) -> bool {
        let mut replaced = false;
        for layer in &self.layers {
            replaced |= layer.load().redact_in_place(text);
        }
        replaced
    }

    /// Redacts every string (keys and values) of a JSON value in place.
    pub fn redact_json(&self, value: &mut serde_json::Value) {
        for layer in &self.layers {
            layer.load().redact_json(value);
        }
    }

    /// Upstream text on its way to a status message, a `ServerStatus` or a
    /// log line: redacted first, then cut to [`MAX_UPSTREAM_TEXT`] bytes.
    pub fn upstream_text(&self, text: &str) -> String {
        bounded(&self.redact(text), MAX_UPSTREAM_TEXT)
    }
}

/// The last [`ANCHOR_LEN`] bytes of `value` (fewer when that would split
/// a character), or all of it when shorter.
fn anchor_of(value: &str) -> &str {
    let mut start = value.len().saturating_sub(ANCHOR_LEN);
    while !value.is_char_boundary(start) {
        start += 1;
    }
    &value[start..]
}

/// `text` cut to at most `max` bytes (on a character boundary), with a note
/// of how much was cut. Control characters other than newline and tab are
/// shown escaped, so upstream text cannot forge log lines.
pub fn bounded(text: &str, max: usize) -> String {
    let clean: Cow<'_, str> = if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        Cow::Owned(
            text.chars()
                .map(|c| {
                    if c.is_control() && c != '\n' && c != '\t' {
                        ' '
                    } else {
                        c
                    }
                })
                .collect(),
        )
    } else {
        Cow::Borrowed(text)
    };
    if clean.len() <= max {
        return clean.into_owned();
    }
    let note = format!("… [{} more bytes cut]", clean.len());
    let keep = max.saturating_sub(note.len() + 8);
    let mut end = keep.min(clean.len());
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes cut]", &clean[..end], clean.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_every_value_in_one_pass() {
        let redactor = Redactor::new([
            "Bearer s3cr3t-token-1",
            "s3cr3t-token-1",
            "api-key-42424242",
        ]);
        let text = "header was: Bearer s3cr3t-token-1; key api-key-42424242 and s3cr3t-token-1";
        assert_eq!(
            redactor.redact(text),
            "header was: [redacted]; key [redacted] and [redacted]"
        );
    }

    #[test]
    fn long_values_are_found_by_their_end_and_replaced_whole() {
        let jwt = format!(
            "eyJhbGciOiJSUzI1NiJ9.{}.{}",
            "p".repeat(600),
            "s1gnature".repeat(8)
        );
        let other = format!(
            "eyJhbGciOiJSUzI1NiJ9.{}.{}",
            "p".repeat(600),
            "0ther-sig".repeat(8)
        );
        let redactor = Redactor::new([jwt.as_str(), other.as_str(), "short-one"]);
        // Whole: one marker for the whole value.
        let text = format!("bad token {jwt}; also {other}!");
        assert_eq!(
            redactor.redact(&text),
            "bad token [redacted]; also [redacted]!"
        );
        // Only the end of a value (the start cut off): that end goes.
        let tail = &jwt[jwt.len() - 40..];
        let redacted = redactor.redact(tail);
        assert!(
            !redacted.contains(&jwt[jwt.len() - ANCHOR_LEN..]),
            "{redacted}"
        );
        assert!(redacted.ends_with(REDACTED));
        // A short value inside a long one's start, the long one whole: one
        // place, nothing of either left.
        let long = format!("xshort-one{}", "z".repeat(40));
        let redactor = Redactor::new([long.as_str(), "short-one"]);
        assert_eq!(redactor.redact(&format!("<{long}>")), "<[redacted]>");
        // Multi-byte characters at the anchor's edge.
        let accented = format!("{}{}", "é".repeat(20), "a".repeat(3));
        let redactor = Redactor::new([accented.as_str()]);
        assert_eq!(redactor.redact(&format!("[{accented}]")), "[[redacted]]");
    }

    #[test]
    fn short_values_are_left_alone() {
        let redactor = Redactor::new(["true", "1234567"]);
        assert!(redactor.is_empty());
        assert_eq!(redactor.redact("true 1234567"), "true 1234567");
    }

    #[test]
    fn json_strings_and_keys_are_redacted() {
        let redactor = Redactor::new(["very-secret-value"]);
        let mut value = serde_json::json!({
            "a": ["x very-secret-value y", 3],
            "very-secret-value": {"b": "very-secret-value"}
        });
        redactor.redact_json(&mut value);
        let text = value.to_string();
        assert!(!text.contains("very-secret-value"), "{text}");
        assert!(text.contains("[redacted]"));
    }

    #[test]
    fn bounded_cuts_on_a_char_boundary_and_says_so() {
        let long = "é".repeat(5000);
        let cut = bounded(&long, MAX_UPSTREAM_TEXT);
        assert!(cut.len() <= MAX_UPSTREAM_TEXT, "{}", cut.len());
        assert!(cut.ends_with("more bytes cut]"));
        assert_eq!(bounded("short", 100), "short");
        assert_eq!(bounded("a\u{1b}[31mb", 100), "a [31mb");
    }

    #[test]
    fn a_redaction_applies_every_layer_as_it_is_now() {
        let configured = Redactor::new(["configured-secret"]).shared();
        let live = Redactor::default().shared();
        let redaction = Redaction::new(configured).with(live.clone());
        let text = "configured-secret and live-token-1";
        assert_eq!(redaction.redact(text), "[redacted] and live-token-1");
        // A new live token applies at once, without a new `Redaction`.
        live.store(Arc::new(Redactor::new(["live-token-1"])));
        assert_eq!(redaction.redact(text), "[redacted] and [redacted]");
        let mut owned = text.to_owned();
        assert!(redaction.redact_in_place(&mut owned));
        assert_eq!(owned, "[redacted] and [redacted]");
        let mut value = serde_json::json!({"live-token-1": ["configured-secret"]});
        redaction.redact_json(&mut value);
        assert_eq!(value, serde_json::json!({"[redacted]": ["[redacted]"]}));
        assert!(!redaction.is_empty());
        assert!(Redaction::new(Redactor::default().shared()).is_empty());
    }

    #[test]
    fn debug_never_shows_values() {
        let redactor = Redactor::new(["very-secret-value"]);
        assert!(!format!("{redactor:?}").contains("very-secret"));
    }
}
