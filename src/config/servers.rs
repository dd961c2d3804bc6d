//! A tenant's upstream servers: the `defaults:` every server starts from,
//! and each server's checks in named steps (name, credentials, transport
//! with its environment, headers and TLS, tool settings, timeouts,
//! connection). Knows nothing of tenants beyond the path it is given.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::fields::{Errors, at_least_one, duration, resolve};
use super::names;
use super::raw::{RawDefaults, RawOverride, RawReconnect, RawServer, RawToolFilter, RawValue};
use super::sources::Sources;
use super::tls::RawTls;
use super::{
    ConnectMode, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CALL_TIMEOUT, DEFAULT_MAX_LIST_PAGES, Lifecycle, Reconnect, ServerConfig,
    ServerOAuth, ToolFilter, ToolOverride, Transport,
};

/// Headers the MCP transport sets itself; configuring them is refused.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// Per-server settings that `defaults:` may set for every server.
#[derive(Debug)]
pub(super) struct Defaults {
    connect_timeout: Duration,
    call_timeout: Duration,
    max_call_timeout: Duration,
    max_list_pages: u32,
    reconnect: Reconnect,
    max_concurrent_calls: Option<usize>,
    lifecycle: Lifecycle,
    pub(super) connect: Option<ConnectMode>,
    pub(super) idle_timeout: Duration,
    circuit_breaker: Option<super::CircuitBreaker>,
}

/// Validates `defaults:`.
pub(super) fn defaults(errors: &mut Errors, raw: RawDefaults) -> Defaults {
    Defaults {
        connect_timeout: duration(
            errors,
            "defaults.connect_timeout",
            raw.connect_timeout.as_deref(),
            DEFAULT_CONNECT_TIMEOUT,
        ),
        call_timeout: duration(
            errors,
            "defaults.call_timeout",
            raw.call_timeout.as_deref(),
            DEFAULT_CALL_TIMEOUT,
        ),
        max_call_timeout: duration(
            errors,
            "defaults.max_call_timeout",
            raw.max_call_timeout.as_deref(),
            DEFAULT_MAX_CALL_TIMEOUT,
        ),
        max_list_pages: at_least_one(
            errors,
            "defaults.max_list_pages",
            raw.max_list_pages,
            DEFAULT_MAX_LIST_PAGES,
        ),
        reconnect: reconnect(
            errors,
            "defaults.reconnect",
            raw.reconnect,
            Reconnect::default(),
        ),
        max_concurrent_calls: max_concurrent_calls(
            errors,
            "defaults.max_concurrent_calls",
            raw.max_concurrent_calls,
        ),
        lifecycle: raw.lifecycle.unwrap_or_default(),
        connect: raw.connect,
        idle_timeout: duration(
            errors,
            "defaults.idle_timeout",
            raw.idle_timeout.as_deref(),
            DEFAULT_IDLE_TIMEOUT,
        ),
        circuit_breaker: super::breaker::circuit_breaker(
            errors,
            "defaults.circuit_breaker",
            raw.circuit_breaker,
            Some(super::CircuitBreaker::default()),
        ),
    }
}

/// Backoff between reconnects: `default` where `raw` is unset, the maximum
/// not below the initial.
fn reconnect(
    errors: &mut Errors,
    path: &str,
    raw: Option<RawReconnect>,
    default: Reconnect,
) -> Reconnect {
    let Some(raw) = raw else {
        return default;
    };
    let initial = duration(
        errors,
        &format!("{path}.initial_backoff"),
        raw.initial_backoff.as_deref(),
        default.initial,
    );
    let max = duration(
        errors,
        &format!("{path}.max_backoff"),
        raw.max_backoff.as_deref(),
        default.max,
    );
    if max < initial {
        errors.push(
            format!("{path}.max_backoff"),
            "must not be below `initial_backoff`",
        );
    }
    Reconnect { initial, max }
}

/// A `max_concurrent_calls` where it is set: at least 1.
fn max_concurrent_calls(errors: &mut Errors, path: &str, value: Option<usize>) -> Option<usize> {
    value.map(|n| at_least_one(errors, path, Some(n), 1))
}

/// Validates one server, step by step; `None` if any step found an error.
pub(super) fn validate_server(
    errors: &mut Errors,
    path: &str,
    server: RawServer,
    defaults: &Defaults,
    src: &Sources<'_>,
) -> Option<ServerConfig> {
    let before = errors.0.len();
    server_name(errors, path, &server.name);
    let oauth = credentials(errors, path, server.oauth, server.command.is_some(), src);
    let endpoint = Endpoint {
        command: server.command,
        cwd: server.cwd,
        env: server.env,
        url: server.url,
        headers: server.headers,
        tls: server.tls,
    };
    let transport = transport(errors, path, endpoint, src);
    let filter = server
        .tools
        .map(|f| tool_filter(errors, &format!("{path}.tools"), f))
        .unwrap_or_default();
    let timeouts = timeouts(
        errors,
        path,
        server.connect_timeout.as_deref(),
        server.call_timeout.as_deref(),
        server.max_list_pages,
        server.tool_timeouts,
        defaults,
    );
    let overrides = tool_overrides(errors, path, server.overrides);
    let reconnect = reconnect(
        errors,
        &format!("{path}.reconnect"),
        server.reconnect,
        defaults.reconnect,
    );
    let max_concurrent_calls = max_concurrent_calls(
        errors,
        &format!("{path}.max_concurrent_calls"),
        server.max_concurrent_calls,
    )
    .or(defaults.max_concurrent_calls);
    let lifecycle = server.lifecycle.unwrap_or(defaults.lifecycle);
    let input = super::input::input(errors, &format!("{path}.input"), server.input, lifecycle);
    let roots = super::input::roots(errors, &format!("{path}.roots"), server.roots);
    let circuit_breaker = super::breaker::circuit_breaker(
        errors,
        &format!("{path}.circuit_breaker"),
        server.circuit_breaker,
        defaults.circuit_breaker,
    );
    if errors.0.len() != before {
        return None;
    }
    Some(ServerConfig {
        name: server.name,
        transport: transport?,
        filter,
        bare: server.bare,
        connect_timeout: timeouts.connect,
        call_timeout: timeouts.call,
        max_call_timeout: timeouts.max_call,
        max_list_pages: timeouts.max_list_pages,
        tool_timeouts: timeouts.per_tool,
        reconnect,
        max_concurrent_calls,
        lifecycle,
        overrides,
        redact_results: server.redact_results.unwrap_or(true),
        cache_results: server.cache_results.unwrap_or(true),
        oauth: oauth.map(Box::new),
        definitions: server.definitions.unwrap_or_default(),
        input,
        roots,
        guards: server.guards,
        circuit_breaker,
    })
}

/// The server's name must be usable in the exposed tool names.
fn server_name(errors: &mut Errors, path: &str, name: &str) {
    if !names::is_valid_server_name(name) {
        errors.push(
            format!("{path}.name"),
            format!(
                "`{}` is not a valid server name (1 to 64 of a-z A-Z 0-9 _ -, \
                 without `{}`, which separates server and tool in exposed names)",
                name,
                names::DELIMITER
            ),
        );
    }
}

/// The server's own credentials: an `oauth` block, for `url` servers only.
fn credentials(
    errors: &mut Errors,
    path: &str,
    raw: Option<super::raw::RawServerOAuth>,
    is_stdio: bool,
    src: &Sources<'_>,
) -> Option<ServerOAuth> {
    match raw {
        Some(_) if is_stdio => {
            errors.push(
                format!("{path}.oauth"),
                "`oauth` applies to `url` servers only",
            );
            None
        }
        Some(raw) => super::oauth::server(errors, path, raw, src),
        None => None,
    }
}

/// How a server is reached, as written: `command` with `cwd` and `env`, or
/// `url` with `headers`; and `tls`.
struct Endpoint {
    command: Option<Vec<String>>,
    cwd: Option<String>,
    env: Option<BTreeMap<String, RawValue>>,
    url: Option<String>,
    headers: Option<BTreeMap<String, RawValue>>,
    tls: Option<RawTls>,
}

/// The transport: exactly one of `command` (stdio) or `url` (Streamable
/// HTTP), each with only its own settings; then the `tls` block.
fn transport(
    errors: &mut Errors,
    path: &str,
    raw: Endpoint,
    src: &Sources<'_>,
) -> Option<Transport> {
    let is_stdio = raw.command.is_some();
    let transport = match (raw.command, raw.url) {
        (Some(_), Some(_)) => {
            errors.push(
                path,
                "set either `command` (stdio) or `url` (Streamable HTTP), not both",
            );
            None
        }
        (None, None) => {
            errors.push(
                path,
                "set `command` (stdio) or `url` (Streamable HTTP); neither is set",
            );
            None
        }
        (Some(command), None) => {
            if !src.allows_stdio(errors, &format!("{path}.command")) {
                return None;
            }
            if raw.headers.is_some() {
                errors.push(
                    format!("{path}.headers"),
                    "`headers` apply to `url` servers only; a stdio server takes `env`",
                );
            }
            stdio(errors, path, command, raw.cwd, raw.env, src)
        }
        (None, Some(url)) => {
            if raw.env.is_some() {
                errors.push(
                    format!("{path}.env"),
                    "`env` applies to `command` servers only; an HTTP server takes `headers`",
                );
            }
            if raw.cwd.is_some() {
                errors.push(
                    format!("{path}.cwd"),
                    "`cwd` applies to `command` servers only",
                );
            }
            http(errors, path, &url, raw.headers, src)
        }
    };
    match (transport, raw.tls) {
        (transport, None) => transport,
        (Some(Transport::Http { url, headers, .. }), Some(raw)) => {
            super::tls::server_tls(errors, path, raw, Some(&url), false, src).map(|tls| {
                Transport::Http {
                    url,
                    headers,
                    tls: Some(tls),
                    reach: super::Reach::Any,
                }
            })
        }
        (_, Some(raw)) => {
            // A stdio server, or an HTTP one with errors: the block is
            // still checked, so every error shows at once.
            super::tls::server_tls(errors, path, raw, None, is_stdio, src);
            None
        }
    }
}

/// A stdio server: a program to start, its working directory (relative to
/// `base`) and its environment, with secret sources read.
fn stdio(
    errors: &mut Errors,
    path: &str,
    command: Vec<String>,
    cwd: Option<String>,
    raw_env: Option<BTreeMap<String, RawValue>>,
    src: &Sources<'_>,
) -> Option<Transport> {
    let before = errors.0.len();
    match command.first() {
        None => errors.push(
            format!("{path}.command"),
            "must name a program: [\"program\", \"arg\", ...]",
        ),
        Some(program) if program.is_empty() => errors.push(
            format!("{path}.command[0]"),
            "the program must not be empty",
        ),
        Some(_) => {}
    }
    let mut child_env = Vec::new();
    for (key, value) in raw_env.unwrap_or_default() {
        let var_path = format!("{path}.env.{key}");
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            errors.push(
                &var_path,
                "not a valid environment variable name (non-empty, no `=` or NUL)",
            );
            continue;
        }
        if let Some(secret) = resolve(errors, &var_path, &value, src) {
            if secret.expose().contains('\0') {
                errors.push(&var_path, "the value contains a NUL byte");
                continue;
            }
            child_env.push((key, secret));
        }
    }
    let cwd = match cwd {
        Some(dir) => Some(src.host_path(errors, &format!("{path}.cwd"), &dir)?),
        None => None,
    };
    (errors.0.len() == before).then_some(Transport::Stdio {
        command,
        cwd,
        env: child_env,
    })
}

/// A Streamable HTTP server: an http(s) URL without credentials, and
/// headers (not the transport's own), with secret sources read.
fn http(
    errors: &mut Errors,
    path: &str,
    url_text: &str,
    raw_headers: Option<BTreeMap<String, RawValue>>,
    src: &Sources<'_>,
) -> Option<Transport> {
    let before = errors.0.len();
    let url = match url::Url::parse(url_text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Some(url),
        Ok(url) => {
            errors.push(
                format!("{path}.url"),
                format!("`{}` is not an http(s) URL with a host", redact_url(&url)),
            );
            None
        }
        Err(e) => {
            errors.push(format!("{path}.url"), format!("not a valid URL: {e}"));
            None
        }
    };
    if let Some(url) = &url
        && (!url.username().is_empty() || url.password().is_some())
    {
        errors.push(
            format!("{path}.url"),
            "credentials in the URL are refused (they would show in logs); \
             put them in `headers` with a secret source",
        );
    }
    let mut headers = Vec::new();
    let mut seen: HashMap<http::HeaderName, String> = HashMap::new();
    for (key, value) in raw_headers.unwrap_or_default() {
        let header_path = format!("{path}.headers.{key}");
        let name = match http::HeaderName::from_bytes(key.as_bytes()) {
            Ok(name) => name,
            Err(_) => {
                errors.push(&header_path, "not a valid HTTP header name");
                continue;
            }
        };
        if let Some(first) = seen.insert(name.clone(), key.clone()) {
            errors.push(
                &header_path,
                format!("duplicate header (header names ignore case; also `{first}`)"),
            );
            continue;
        }
        if RESERVED_HEADERS.contains(&name.as_str()) {
            errors.push(
                &header_path,
                "this header is set by the MCP transport itself and cannot be configured",
            );
            continue;
        }
        if let Some(secret) = resolve(errors, &header_path, &value, src) {
            if http::HeaderValue::from_str(secret.expose()).is_err() {
                errors.push(
                    &header_path,
                    "the value is not a valid HTTP header value (control characters or newlines)",
                );
                continue;
            }
            headers.push((name, secret));
        }
    }
    if errors.0.len() != before {
        return None;
    }
    Some(Transport::Http {
        url: url?,
        headers,
        tls: None,
        reach: super::Reach::Any,
    })
}

/// The URL without credentials, for error messages.
fn redact_url(url: &url::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_password(None);
    let _ = shown.set_username("");
    shown.to_string()
}

/// The server's `tools:` allow and deny globs.
fn tool_filter(errors: &mut Errors, path: &str, raw: RawToolFilter) -> ToolFilter {
    let allow = raw
        .allow
        .as_ref()
        .map(|globs| glob_set(errors, &format!("{path}.allow"), globs));
    let deny = (!raw.deny.is_empty()).then(|| glob_set(errors, &format!("{path}.deny"), &raw.deny));
    ToolFilter::new(allow, deny, (raw.allow, raw.deny))
}

/// One list of globs, each refused glob named by its index.
fn glob_set(errors: &mut Errors, path: &str, globs: &[String]) -> globset::GlobSet {
    let mut builder = globset::GlobSetBuilder::new();
    for (i, glob) in globs.iter().enumerate() {
        match globset::GlobBuilder::new(glob)
            .literal_separator(false)
            .build()
        {
            Ok(glob) => {
                builder.add(glob);
            }
            Err(e) => errors.push(format!("{path}[{i}]"), format!("invalid glob: {e}")),
        }
    }
    builder.build().unwrap_or_else(|e| {
        errors.push(path, format!("invalid globs: {e}"));
        globset::GlobSet::empty()
    })
}

/// The server's time limits: connect and call timeouts, how many
/// `tools/list` pages discovery reads, and per-tool timeouts; no call's
/// timeout above `defaults.max_call_timeout`.
struct Timeouts {
    connect: Duration,
    call: Duration,
    max_call: Duration,
    max_list_pages: u32,
    per_tool: HashMap<String, Duration>,
}

/// Validates the server's [`Timeouts`], `defaults` where unset.
fn timeouts(
    errors: &mut Errors,
    path: &str,
    connect_timeout: Option<&str>,
    call_timeout: Option<&str>,
    max_list_pages: Option<u32>,
    tool_timeouts: Option<BTreeMap<String, String>>,
    defaults: &Defaults,
) -> Timeouts {
    let connect = duration(
        errors,
        &format!("{path}.connect_timeout"),
        connect_timeout,
        defaults.connect_timeout,
    );
    let call = duration(
        errors,
        &format!("{path}.call_timeout"),
        call_timeout,
        defaults.call_timeout,
    );
    let max_list_pages = at_least_one(
        errors,
        &format!("{path}.max_list_pages"),
        max_list_pages,
        defaults.max_list_pages,
    );
    let max_call = defaults.max_call_timeout;
    if call > max_call {
        errors.push(
            format!("{path}.call_timeout"),
            format!(
                "{} exceeds defaults.max_call_timeout ({})",
                humantime::format_duration(call),
                humantime::format_duration(max_call)
            ),
        );
    }
    let mut per_tool = HashMap::new();
    for (tool, text) in tool_timeouts.unwrap_or_default() {
        let value = duration(
            errors,
            &format!("{path}.tool_timeouts.{tool}"),
            Some(&text),
            call,
        );
        if value > max_call {
            errors.push(
                format!("{path}.tool_timeouts.{tool}"),
                "exceeds defaults.max_call_timeout",
            );
        }
        per_tool.insert(tool, value);
    }
    Timeouts {
        connect,
        call,
        max_call,
        max_list_pages,
        per_tool,
    }
}

/// The operator's overrides of tool definitions; a description, where
/// given, must not be blank.
fn tool_overrides(
    errors: &mut Errors,
    path: &str,
    raw: Option<BTreeMap<String, RawOverride>>,
) -> HashMap<String, ToolOverride> {
    let mut overrides = HashMap::new();
    for (tool, raw) in raw.unwrap_or_default() {
        if raw
            .description
            .as_deref()
            .is_some_and(|d| d.trim().is_empty())
        {
            errors.push(
                format!("{path}.overrides.{tool}.description"),
                "must not be empty (an empty description misleads a model)",
            );
        }
        overrides.insert(
            tool,
            ToolOverride {
                description: raw.description,
                title: raw.title,
                hide_defaults: raw.hide_defaults,
            },
        );
    }
    overrides
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use crate::config::Config;
    use crate::config::validate::testing::{GOOD, has, load, server_messages};

    #[test]
    fn both_or_neither_transport_is_refused() {
        let errors = server_messages(
            r#"
      - name: a
        command: ["x"]
        url: "http://127.0.0.1/"
      - name: b
"#,
        );
        assert!(
            has(&errors, "tenants[0].servers[0]: set either"),
            "{errors:?}"
        );
        assert!(
            has(&errors, "tenants[0].servers[1]: set `command`"),
            "{errors:?}"
        );
    }

    #[test]
    fn credentials_in_urls_are_refused_and_not_echoed() {
        let errors = server_messages(
            r#"
      - { name: a, url: "https://user:pa55word@127.0.0.1/mcp" }
"#,
        );
        assert_eq!(errors.len(), 1);
        assert!(!errors[0].contains("pa55word"));
    }

    /// Values the validation step refuses are not echoed either.
    #[test]
    fn invalid_secret_values_are_refused_without_showing_them() {
        let env: HashMap<String, String> = [
            ("HEADER".to_string(), "Bearer s3cret\nX-Evil: 1".to_string()),
            ("NUL".to_string(), "s3cret\0tail".to_string()),
        ]
        .into();
        let errors = Config::from_yaml(
            r#"
tenants:
  - name: acme
    tokens: [t]
    servers:
      - name: a
        url: "http://127.0.0.1/"
        headers:
          Authorization: { env: HEADER }
          X-Literal: "s3cret\u0007"
      - name: b
        command: [x]
        env:
          KEY: { env: NUL }
"#,
            "test.yaml",
            Path::new("."),
            &env,
        )
        .unwrap_err()
        .to_string();
        for path in [
            "tenants[0].servers[0].headers.Authorization",
            "tenants[0].servers[0].headers.X-Literal",
            "tenants[0].servers[1].env.KEY",
        ] {
            assert!(errors.contains(path), "{path} in {errors}");
        }
        assert!(!errors.contains("s3cret"), "{errors}");
    }

    #[test]
    fn plain_http_to_a_remote_host_is_a_warning() {
        let config = load(
            r#"
tenants:
  - name: acme
    tokens: [t]
    servers:
      - { name: local, url: "http://127.0.0.1:8080/mcp" }
      - name: crm
        url: "http://example.com/mcp"
        headers:
          Authorization: { env: DOCS_AUTH }
      - { name: loop, url: "http://127.1.2.3/mcp" }
      - { name: six, url: "http://[::1]:8080/mcp" }
      - { name: name, url: "http://LocalHost:8080/mcp" }
      - { name: tls, url: "https://example.com/mcp" }
      - { name: stdio, command: [x] }
  - name: globex
    tokens: [u]
    servers:
      - { name: open, url: "http://10.0.0.7:8080/mcp" }
"#,
        )
        .unwrap();
        let warnings: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
        assert_eq!(
            warnings,
            [
                "tenants[0].servers[1] (tenant `acme`, server `crm`): url uses plain http:// \
                 to a non-loopback host (example.com); configured headers travel unencrypted",
                "tenants[1].servers[0] (tenant `globex`, server `open`): url uses plain http:// \
                 to a non-loopback host (10.0.0.7); tool arguments and results travel unencrypted",
            ]
        );
        assert!(load(GOOD).unwrap().warnings().is_empty());
    }
}
