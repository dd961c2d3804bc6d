//! Raw configuration → validated [`Config`]. Collects every problem, each
//! with the path of its field, instead of stopping at the first.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::names;
use super::raw::{
    RawConfig, RawDefaults, RawGrpc, RawLimits, RawReconnect, RawServer, RawTenant,
    RawTenantLimits, RawToolFilter, RawValue,
};
use super::{
    Config, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_LISTEN,
    DEFAULT_MAX_CALL_TIMEOUT, DEFAULT_MAX_LIST_PAGES, DEFAULT_SHUTDOWN_DELAY,
    DEFAULT_SHUTDOWN_GRACE, Environment, FieldError, GrpcSettings, Secret, ServerConfig,
    TenantConfig, ToolFilter, Transport, ValueSource,
};
use super::{Lifecycle, Limits, Reconnect, TenantLimits};

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

/// Parses YAML into the raw types, naming the path of the first error.
///
/// The error names the path and what was expected, never the value found:
/// a secret written in the wrong shape (`tokens: "s3cret"` instead of a
/// list) must not reach the terminal or a log line. See [`without_values`].
pub(super) fn parse(text: &str) -> Result<RawConfig, FieldError> {
    let deserializer = yaml_serde::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
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
    })
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

/// Validates the whole configuration.
pub(super) fn validate(
    raw: RawConfig,
    base: &Path,
    env: &dyn Environment,
) -> Result<Config, Vec<FieldError>> {
    let mut errors = Errors(Vec::new());

    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen = match listen_text.parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            errors.push(
                "listen",
                format!("`{listen_text}` is not a socket address such as 127.0.0.1:50051"),
            );
            None
        }
    };
    let shutdown_delay = duration_or_zero(
        &mut errors,
        "shutdown_delay",
        raw.shutdown_delay.as_deref(),
        DEFAULT_SHUTDOWN_DELAY,
    );
    let metrics_listen = raw
        .metrics
        .as_ref()
        .and_then(|m| match m.listen.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                errors.push(
                    "metrics.listen",
                    format!(
                        "`{}` is not a socket address such as 0.0.0.0:9090",
                        m.listen
                    ),
                );
                None
            }
        });
    if let (Some(metrics), Some(grpc)) = (metrics_listen, listen)
        && metrics == grpc
        && metrics.port() != 0
    {
        errors.push("metrics.listen", "must differ from `listen`");
    }
    let grpc = grpc_settings(&mut errors, raw.grpc.unwrap_or_default());
    let limits = limits(&mut errors, raw.limits.unwrap_or_default());
    let max_live_sessions = match raw.sessions.and_then(|s| s.max_live) {
        Some(0) => {
            errors.push("sessions.max_live", "must be at least 1");
            None
        }
        other => other,
    };
    let shutdown_grace = duration(
        &mut errors,
        "shutdown_grace",
        raw.shutdown_grace.as_deref(),
        DEFAULT_SHUTDOWN_GRACE,
    );
    let defaults = defaults(&mut errors, raw.defaults.unwrap_or_default());
    let state = super::oauth::state(&mut errors, raw.state.unwrap_or_default(), base, env);
    let oauth = raw
        .oauth
        .and_then(|raw| super::oauth::listener(&mut errors, raw));
    let approvals = raw
        .approvals
        .and_then(|raw| super::approvals::approvals(&mut errors, raw, base));
    let audit = raw
        .audit
        .and_then(|raw| super::audit::audit(&mut errors, raw, base));
    let callers = super::callers::callers(&mut errors, raw.callers.unwrap_or_default(), base);

    if raw.tenants.is_empty() {
        errors.push("tenants", "at least one tenant is required");
    }
    let mut tenant_names: HashMap<String, usize> = HashMap::new();
    // Token digest → (tenant index, path), to find tokens shared by tenants
    // without keeping or printing the token itself.
    let mut token_owners: HashMap<[u8; 32], (usize, String)> = HashMap::new();
    let mut tenants = Vec::with_capacity(raw.tenants.len());
    for (index, tenant) in raw.tenants.into_iter().enumerate() {
        let path = format!("tenants[{index}]");
        // With JWT callers, a tenant may have no static token.
        if tenant.tokens.is_empty() && callers.jwt.is_empty() {
            errors.push(
                format!("{path}.tokens"),
                "at least one token is required (callers of this tenant could not authenticate; or configure callers.jwt)",
            );
        }
        if let Some(first) = tenant_names.insert(tenant.name.clone(), index) {
            errors.push(
                format!("{path}.name"),
                format!(
                    "duplicate tenant name `{}` (also tenants[{first}])",
                    tenant.name
                ),
            );
        }
        if let Some(t) = validate_tenant(
            &mut errors,
            &path,
            tenant,
            index,
            &mut token_owners,
            &defaults,
            base,
            env,
        ) {
            tenants.push(t);
        }
    }

    oauth_requirements(&mut errors, &tenants, &state, oauth.as_ref());
    super::approvals::requirements(&mut errors, &tenants, approvals.as_ref());
    if !errors.0.is_empty() {
        return Err(errors.0);
    }
    Ok(Config {
        listen: listen.expect("listen validated"),
        shutdown_delay,
        shutdown_grace,
        reflection: raw.reflection.unwrap_or(true),
        log_format: raw.log_format,
        metrics_listen,
        grpc,
        limits,
        max_live_sessions,
        state,
        oauth,
        approvals,
        callers,
        audit,
        tenants,
    })
}

/// What servers with `oauth` need of the rest of the file: encryption keys
/// for the tokens kept, and a consent listener for per-user consent.
fn oauth_requirements(
    errors: &mut Errors,
    tenants: &[super::TenantConfig],
    state: &super::StateConfig,
    listener: Option<&super::OAuthListener>,
) {
    let oauth_servers = tenants.iter().enumerate().flat_map(|(t, tenant)| {
        tenant
            .servers
            .iter()
            .enumerate()
            .filter_map(move |(s, server)| Some((t, s, server.oauth.as_ref()?)))
    });
    let mut keys_missing = false;
    for (t, s, oauth) in oauth_servers {
        if state.keys.is_empty() && !keys_missing {
            keys_missing = true;
            errors.push(
                "state.keys",
                format!(
                    "required because tenants[{t}].servers[{s}] uses oauth: tokens are kept \
                     encrypted (give one base64 32-byte key, e.g. from {{env: TOOLGATE_STATE_KEY}})"
                ),
            );
        }
        if oauth.per_user() && listener.is_none() {
            errors.push(
                format!("tenants[{t}].servers[{s}].oauth.grant"),
                "authorization_code needs the consent listener: set oauth.listen and oauth.public_url",
            );
        }
    }
}

fn positive(errors: &mut Errors, path: &str, value: Option<usize>, default: usize) -> usize {
    match value {
        Some(0) => {
            errors.push(path, "must be at least 1");
            default
        }
        Some(n) => n,
        None => default,
    }
}

fn limits(errors: &mut Errors, raw: RawLimits) -> Limits {
    let d = Limits::default();
    Limits {
        max_argument_bytes: positive(
            errors,
            "limits.max_argument_bytes",
            raw.max_argument_bytes,
            d.max_argument_bytes,
        ),
        max_result_bytes: positive(
            errors,
            "limits.max_result_bytes",
            raw.max_result_bytes,
            d.max_result_bytes,
        ),
        max_message_bytes: positive(
            errors,
            "limits.max_message_bytes",
            raw.max_message_bytes,
            d.max_message_bytes,
        ),
        max_tools_per_server: positive(
            errors,
            "limits.max_tools_per_server",
            raw.max_tools_per_server,
            d.max_tools_per_server,
        ),
        max_schema_bytes: positive(
            errors,
            "limits.max_schema_bytes",
            raw.max_schema_bytes,
            d.max_schema_bytes,
        ),
        max_schema_depth: positive(
            errors,
            "limits.max_schema_depth",
            raw.max_schema_depth,
            d.max_schema_depth,
        ),
        max_description_chars: positive(
            errors,
            "limits.max_description_chars",
            raw.max_description_chars,
            d.max_description_chars,
        ),
    }
}

fn tenant_limits(errors: &mut Errors, path: &str, raw: RawTenantLimits) -> TenantLimits {
    let nonzero = |errors: &mut Errors, key: &str, value: Option<u32>| match value {
        Some(0) => {
            errors.push(format!("{path}.{key}"), "must be at least 1");
            None
        }
        Some(n) => std::num::NonZeroU32::new(n),
        None => None,
    };
    let rate_per_second = nonzero(errors, "rate_per_second", raw.rate_per_second);
    let burst = nonzero(errors, "burst", raw.burst);
    if burst.is_some() && rate_per_second.is_none() {
        errors.push(format!("{path}.burst"), "set `rate_per_second` too");
    }
    if raw.max_concurrent_calls == Some(0) {
        errors.push(format!("{path}.max_concurrent_calls"), "must be at least 1");
    }
    TenantLimits {
        max_concurrent_calls: raw.max_concurrent_calls.filter(|n| *n > 0),
        queue_timeout: duration_or_zero(
            errors,
            &format!("{path}.queue_timeout"),
            raw.queue_timeout.as_deref(),
            Duration::from_millis(100),
        ),
        rate_per_second,
        burst,
    }
}

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

fn grpc_settings(errors: &mut Errors, raw: RawGrpc) -> GrpcSettings {
    let defaults = GrpcSettings::default();
    let max_concurrent_streams = match raw.max_concurrent_streams {
        Some(0) => {
            errors.push("grpc.max_concurrent_streams", "must be at least 1");
            defaults.max_concurrent_streams
        }
        Some(n) => n,
        None => defaults.max_concurrent_streams,
    };
    GrpcSettings {
        keepalive_interval: duration(
            errors,
            "grpc.keepalive_interval",
            raw.keepalive_interval.as_deref(),
            defaults.keepalive_interval,
        ),
        keepalive_timeout: duration(
            errors,
            "grpc.keepalive_timeout",
            raw.keepalive_timeout.as_deref(),
            defaults.keepalive_timeout,
        ),
        tcp_keepalive: duration(
            errors,
            "grpc.tcp_keepalive",
            raw.tcp_keepalive.as_deref(),
            defaults.tcp_keepalive,
        ),
        max_concurrent_streams,
    }
}

/// Per-server settings that `defaults:` may set for every server.
struct Defaults {
    connect_timeout: Duration,
    call_timeout: Duration,
    max_call_timeout: Duration,
    max_list_pages: u32,
    reconnect: Reconnect,
    max_concurrent_calls: Option<usize>,
    lifecycle: Lifecycle,
    connect: Option<super::ConnectMode>,
    idle_timeout: Duration,
}

fn defaults(errors: &mut Errors, raw: RawDefaults) -> Defaults {
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
        max_list_pages: pages(
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
        max_concurrent_calls: raw
            .max_concurrent_calls
            .map(|n| positive(errors, "defaults.max_concurrent_calls", Some(n), 1)),
        lifecycle: raw.lifecycle.unwrap_or_default(),
        connect: raw.connect,
        idle_timeout: duration(
            errors,
            "defaults.idle_timeout",
            raw.idle_timeout.as_deref(),
            DEFAULT_IDLE_TIMEOUT,
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn validate_tenant(
    errors: &mut Errors,
    path: &str,
    tenant: RawTenant,
    index: usize,
    token_owners: &mut HashMap<[u8; 32], (usize, String)>,
    defaults: &Defaults,
    base: &Path,
    env: &dyn Environment,
) -> Option<TenantConfig> {
    let before = errors.0.len();
    if !names::is_valid_tenant_name(&tenant.name) {
        errors.push(
            format!("{path}.name"),
            format!(
                "`{}` is not a valid tenant name (1 to 64 of a-z A-Z 0-9 . _ -)",
                tenant.name
            ),
        );
    }
    let mut tokens = Vec::with_capacity(tenant.tokens.len());
    for (t, value) in tenant.tokens.iter().enumerate() {
        let token_path = format!("{path}.tokens[{t}]");
        let Some(secret) = resolve(errors, &token_path, value, base, env) else {
            continue;
        };
        if secret.expose().is_empty() {
            errors.push(&token_path, "a token must not be empty");
            continue;
        }
        let digest: [u8; 32] = Sha256::digest(secret.expose().as_bytes()).into();
        match token_owners.get(&digest) {
            Some((owner, other_path)) if *owner != index => errors.push(
                &token_path,
                format!(
                    "the same token is configured for another tenant ({other_path}); \
                     a token must select exactly one tenant"
                ),
            ),
            Some((_, other_path)) => errors.push(
                &token_path,
                format!("duplicate token (same as {other_path})"),
            ),
            None => {
                token_owners.insert(digest, (index, token_path.clone()));
            }
        }
        tokens.push(secret);
    }

    let mut server_names: HashMap<String, usize> = HashMap::new();
    let mut servers = Vec::with_capacity(tenant.servers.len());
    for (s, server) in tenant.servers.into_iter().enumerate() {
        let server_path = format!("{path}.servers[{s}]");
        if let Some(first) = server_names.insert(server.name.clone(), s) {
            errors.push(
                format!("{server_path}.name"),
                format!(
                    "duplicate server name `{}` (also {path}.servers[{first}])",
                    server.name
                ),
            );
        }
        if let Some(server) = validate_server(errors, &server_path, server, defaults, base, env) {
            servers.push(server);
        }
    }

    let limits = tenant_limits(
        errors,
        &format!("{path}.limits"),
        tenant.limits.unwrap_or_default(),
    );
    let connect = tenant.connect.or(defaults.connect).unwrap_or_default();
    let idle_timeout = duration(
        errors,
        &format!("{path}.idle_timeout"),
        tenant.idle_timeout.as_deref(),
        defaults.idle_timeout,
    );
    let policy = super::policy::policy(errors, &format!("{path}.policy"), tenant.policy);
    (errors.0.len() == before).then_some(TenantConfig {
        name: tenant.name,
        tokens,
        servers,
        limits,
        connect,
        idle_timeout,
        policy,
    })
}

fn validate_server(
    errors: &mut Errors,
    path: &str,
    server: RawServer,
    defaults: &Defaults,
    base: &Path,
    env: &dyn Environment,
) -> Option<ServerConfig> {
    let before = errors.0.len();
    if !names::is_valid_server_name(&server.name) {
        errors.push(
            format!("{path}.name"),
            format!(
                "`{}` is not a valid server name (1 to 64 of a-z A-Z 0-9 _ -, \
                 without `{}`, which separates server and tool in exposed names)",
                server.name,
                names::DELIMITER
            ),
        );
    }

    let oauth = match server.oauth {
        Some(_) if server.command.is_some() => {
            errors.push(
                format!("{path}.oauth"),
                "`oauth` applies to `url` servers only",
            );
            None
        }
        Some(raw) => super::oauth::server(errors, path, raw, base, env),
        None => None,
    };
    let is_stdio = server.command.is_some();
    let transport = match (server.command, server.url) {
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
            if server.headers.is_some() {
                errors.push(
                    format!("{path}.headers"),
                    "`headers` apply to `url` servers only; a stdio server takes `env`",
                );
            }
            stdio(errors, path, command, server.cwd, server.env, base, env)
        }
        (None, Some(url)) => {
            if server.env.is_some() {
                errors.push(
                    format!("{path}.env"),
                    "`env` applies to `command` servers only; an HTTP server takes `headers`",
                );
            }
            if server.cwd.is_some() {
                errors.push(
                    format!("{path}.cwd"),
                    "`cwd` applies to `command` servers only",
                );
            }
            http(errors, path, &url, server.headers, base, env)
        }
    };
    let transport = match (transport, server.tls) {
        (transport, None) => transport,
        (Some(Transport::Http { url, headers, .. }), Some(raw)) => {
            super::tls::server_tls(errors, path, raw, Some(&url), false, base).map(|tls| {
                Transport::Http {
                    url,
                    headers,
                    tls: Some(tls),
                }
            })
        }
        (_, Some(raw)) => {
            // A stdio server, or an HTTP one with errors: the block is
            // still checked, so every error shows at once.
            super::tls::server_tls(errors, path, raw, None, is_stdio, base);
            None
        }
    };

    let filter = server
        .tools
        .map(|f| tool_filter(errors, &format!("{path}.tools"), f))
        .unwrap_or_default();

    let connect_timeout = duration(
        errors,
        &format!("{path}.connect_timeout"),
        server.connect_timeout.as_deref(),
        defaults.connect_timeout,
    );
    let call_timeout = duration(
        errors,
        &format!("{path}.call_timeout"),
        server.call_timeout.as_deref(),
        defaults.call_timeout,
    );
    let max_list_pages = pages(
        errors,
        &format!("{path}.max_list_pages"),
        server.max_list_pages,
        defaults.max_list_pages,
    );
    let max_call_timeout = defaults.max_call_timeout;
    if call_timeout > max_call_timeout {
        errors.push(
            format!("{path}.call_timeout"),
            format!(
                "{} exceeds defaults.max_call_timeout ({})",
                humantime::format_duration(call_timeout),
                humantime::format_duration(max_call_timeout)
            ),
        );
    }

    let mut tool_timeouts = HashMap::new();
    for (tool, text) in server.tool_timeouts.unwrap_or_default() {
        let value = duration(
            errors,
            &format!("{path}.tool_timeouts.{tool}"),
            Some(&text),
            call_timeout,
        );
        if value > max_call_timeout {
            errors.push(
                format!("{path}.tool_timeouts.{tool}"),
                "exceeds defaults.max_call_timeout",
            );
        }
        tool_timeouts.insert(tool, value);
    }
    let mut overrides = HashMap::new();
    for (tool, raw) in server.overrides.unwrap_or_default() {
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
            super::ToolOverride {
                description: raw.description,
                title: raw.title,
                hide_defaults: raw.hide_defaults,
            },
        );
    }
    let reconnect = reconnect(
        errors,
        &format!("{path}.reconnect"),
        server.reconnect,
        defaults.reconnect,
    );
    let max_concurrent_calls = match server.max_concurrent_calls {
        Some(n) => Some(positive(
            errors,
            &format!("{path}.max_concurrent_calls"),
            Some(n),
            1,
        )),
        None => defaults.max_concurrent_calls,
    };
    if errors.0.len() != before {
        return None;
    }
    Some(ServerConfig {
        name: server.name,
        transport: transport?,
        filter,
        bare: server.bare,
        connect_timeout,
        call_timeout,
        max_call_timeout,
        max_list_pages,
        tool_timeouts,
        reconnect,
        max_concurrent_calls,
        lifecycle: server.lifecycle.unwrap_or(defaults.lifecycle),
        overrides,
        redact_results: server.redact_results.unwrap_or(true),
        oauth,
        definitions: server.definitions.unwrap_or_default(),
    })
}

fn stdio(
    errors: &mut Errors,
    path: &str,
    command: Vec<String>,
    cwd: Option<String>,
    raw_env: Option<std::collections::BTreeMap<String, RawValue>>,
    base: &Path,
    env: &dyn Environment,
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
        if let Some(secret) = resolve(errors, &var_path, &value, base, env) {
            if secret.expose().contains('\0') {
                errors.push(&var_path, "the value contains a NUL byte");
                continue;
            }
            child_env.push((key, secret));
        }
    }
    let cwd = cwd.map(|dir| base.join(dir));
    (errors.0.len() == before).then_some(Transport::Stdio {
        command,
        cwd,
        env: child_env,
    })
}

fn http(
    errors: &mut Errors,
    path: &str,
    url_text: &str,
    raw_headers: Option<std::collections::BTreeMap<String, RawValue>>,
    base: &Path,
    env: &dyn Environment,
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
        if let Some(secret) = resolve(errors, &header_path, &value, base, env) {
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
    })
}

/// The URL without credentials, for error messages.
fn redact_url(url: &url::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_password(None);
    let _ = shown.set_username("");
    shown.to_string()
}

fn tool_filter(errors: &mut Errors, path: &str, raw: RawToolFilter) -> ToolFilter {
    let allow = raw
        .allow
        .as_ref()
        .map(|globs| glob_set(errors, &format!("{path}.allow"), globs));
    let deny = (!raw.deny.is_empty()).then(|| glob_set(errors, &format!("{path}.deny"), &raw.deny));
    ToolFilter::new(allow, deny, (raw.allow, raw.deny))
}

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

pub(super) fn resolve(
    errors: &mut Errors,
    path: &str,
    value: &RawValue,
    base: &Path,
    env: &dyn Environment,
) -> Option<Secret> {
    let source = match value {
        RawValue::Literal(text) => ValueSource::Literal(text.clone()),
        RawValue::Env(var) if var.is_empty() => {
            errors.push(path, "`env:` needs a variable name");
            return None;
        }
        RawValue::Env(var) => ValueSource::Env(var.clone()),
        RawValue::File(file) if file.is_empty() => {
            errors.push(path, "`file:` needs a path");
            return None;
        }
        RawValue::File(file) => ValueSource::File(PathBuf::from(file)),
    };
    match source.resolve(env, base) {
        Ok(secret) => Some(secret),
        Err(e) => {
            errors.push(path, e.to_string());
            None
        }
    }
}

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

fn pages(errors: &mut Errors, path: &str, value: Option<u32>, default: u32) -> u32 {
    match value {
        Some(0) => {
            errors.push(path, "must be at least 1");
            default
        }
        Some(n) => n,
        None => default,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    fn env() -> HashMap<String, String> {
        [
            ("ACME_TOKEN".to_string(), "acme-secret-token".to_string()),
            (
                "GLOBEX_TOKEN".to_string(),
                "globex-secret-token".to_string(),
            ),
            (
                "DOCS_AUTH".to_string(),
                "Bearer upstream-secret".to_string(),
            ),
            ("EMPTY".to_string(), String::new()),
        ]
        .into()
    }

    fn load(yaml: &str) -> Result<Config, super::super::ConfigError> {
        Config::from_yaml(yaml, "test.yaml", Path::new("."), &env())
    }

    fn messages(yaml: &str) -> Vec<String> {
        load(yaml)
            .expect_err("config should be invalid")
            .field_errors()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    const GOOD: &str = r#"
listen: "127.0.0.1:0"
tenants:
  - name: acme
    tokens: [{ env: ACME_TOKEN }]
    servers:
      - name: repo
        command: ["python3", "server.py"]
        env:
          LOG_LEVEL: debug
          API_KEY: { env: DOCS_AUTH }
      - name: docs
        url: "http://127.0.0.1:8080/mcp"
        headers:
          Authorization: { env: DOCS_AUTH }
        tools:
          allow: ["search*"]
          deny: ["search_admin"]
"#;

    #[test]
    fn accepts_the_documented_shape() {
        let config = load(GOOD).unwrap();
        assert_eq!(config.tenants.len(), 1);
        let servers = &config.tenants[0].servers;
        assert_eq!(servers[0].transport.kind(), "stdio");
        assert!(servers[1].filter.allows("search_docs"));
        assert!(!servers[1].filter.allows("search_admin"));
        assert!(!servers[1].filter.allows("delete"));
        // No secret value appears in Debug output.
        let debug = format!("{config:?}");
        assert!(!debug.contains("acme-secret-token"));
        assert!(!debug.contains("upstream-secret"));
    }

    #[test]
    fn unknown_keys_name_their_path() {
        let errors = messages(
            r#"
tenants:
  - name: acme
    tokens: [x]
    servers:
      - name: a
        urll: "http://x"
"#,
        );
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("tenants[0].servers[0]"), "{errors:?}");
        assert!(errors[0].contains("urll"), "{errors:?}");
    }

    #[test]
    fn both_or_neither_transport_is_refused() {
        let errors = messages(
            r#"
tenants:
  - name: acme
    tokens: [x]
    servers:
      - name: a
        command: ["x"]
        url: "http://127.0.0.1/"
      - name: b
"#,
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("tenants[0].servers[0]: set either"))
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("tenants[0].servers[1]: set `command`"))
        );
    }

    #[test]
    fn duplicate_names_are_refused() {
        let errors = messages(
            r#"
tenants:
  - name: acme
    tokens: [a]
    servers:
      - { name: s, url: "http://127.0.0.1/" }
      - { name: s, url: "http://127.0.0.1/" }
  - name: acme
    tokens: [b]
"#,
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("tenants[0].servers[1].name: duplicate server name `s`"))
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("tenants[1].name: duplicate tenant name `acme`"))
        );
    }

    #[test]
    fn missing_or_empty_secret_sources_are_refused() {
        let errors = messages(
            r#"
tenants:
  - name: acme
    tokens: [{ env: NOT_SET }, { env: EMPTY }, { file: /nonexistent/token }]
"#,
        );
        assert!(errors.contains(
            &"tenants[0].tokens[0]: environment variable NOT_SET is not set".to_string()
        ));
        assert!(
            errors
                .contains(&"tenants[0].tokens[1]: environment variable EMPTY is empty".to_string())
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("tenants[0].tokens[2]: cannot read file"))
        );
    }

    #[test]
    fn a_token_shared_by_two_tenants_is_refused_without_showing_it() {
        let errors = messages(
            r#"
tenants:
  - name: acme
    tokens: [{ env: ACME_TOKEN }]
  - name: globex
    tokens: [acme-secret-token]
"#,
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("tenants[1].tokens[0]: the same token"));
        assert!(errors[0].contains("tenants[0].tokens[0]"));
        assert!(!errors[0].contains("acme-secret-token"));
    }

    #[test]
    fn bad_values_are_reported_together() {
        let errors = messages(
            r#"
listen: "nowhere"
shutdown_grace: "soon"
tenants:
  - name: "bad name"
    tokens: [t]
    servers:
      - name: "a__b"
        url: "ftp://127.0.0.1/"
        headers:
          Accept: "x"
          "bad header": "y"
        call_timeout: "0s"
"#,
        );
        for expected in [
            "listen:",
            "shutdown_grace:",
            "tenants[0].name:",
            "tenants[0].servers[0].name:",
            "tenants[0].servers[0].url:",
            "tenants[0].servers[0].headers.Accept:",
            "tenants[0].servers[0].headers.bad header:",
            "tenants[0].servers[0].call_timeout:",
        ] {
            assert!(
                errors.iter().any(|e| e.starts_with(expected)),
                "missing {expected} in {errors:?}"
            );
        }
    }

    #[test]
    fn credentials_in_urls_are_refused_and_not_echoed() {
        let errors = messages(
            r#"
tenants:
  - name: acme
    tokens: [t]
    servers:
      - { name: a, url: "https://user:pa55word@127.0.0.1/mcp" }
"#,
        );
        assert_eq!(errors.len(), 1);
        assert!(!errors[0].contains("pa55word"));
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
                "a secret source takes `env` or `file`",
            ),
            (
                "tenants:\n  - name: acme\n    tokens: [{ Bearer super-secret-value: x }]\n",
                "tenants[0].tokens[0]",
                "a secret source takes `env` or `file`",
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
