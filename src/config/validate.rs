//! Raw configuration → validated [`Config`]. Collects every problem, each
//! with the path of its field, instead of stopping at the first. This room
//! walks the file in order and checks the gateway-wide sections (listen
//! addresses, shutdown, gRPC, limits, sessions) and what servers with
//! `oauth` need of the rest of the file; tenants are checked in
//! [`super::tenants`], their servers in [`super::servers`], other sections
//! in the room named after them.

use std::net::SocketAddr;
use std::path::Path;

use super::fields::{
    Errors, at_least_one, at_least_one_or_none, duration, duration_or_zero, socket_addr,
};
use super::listener_tls::listener_tls;
use super::raw::{RawConfig, RawGrpc, RawLimits, RawMetrics};
use super::{
    ClientAuth, Config, DEFAULT_LISTEN, DEFAULT_SHUTDOWN_DELAY, DEFAULT_SHUTDOWN_GRACE,
    Environment, FieldError, GrpcSettings, Limits, OAuthListener, StateConfig, TenantConfig,
};

/// Validates the whole configuration.
pub(super) fn validate(
    raw: RawConfig,
    base: &Path,
    env: &dyn Environment,
) -> Result<Config, Vec<FieldError>> {
    let mut errors = Errors(Vec::new());

    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen = socket_addr(&mut errors, "listen", listen_text, "127.0.0.1:50051");
    let shutdown_delay = duration_or_zero(
        &mut errors,
        "shutdown_delay",
        raw.shutdown_delay.as_deref(),
        DEFAULT_SHUTDOWN_DELAY,
    );
    let metrics_listen = metrics_listen(&mut errors, raw.metrics.as_ref(), listen);
    let metrics_tls = raw
        .metrics
        .and_then(|m| m.tls)
        .and_then(|tls| listener_tls(&mut errors, "metrics", tls, base));
    let grpc = grpc_settings(&mut errors, raw.grpc.unwrap_or_default(), base);
    let limits = limits(&mut errors, raw.limits.unwrap_or_default());
    let max_live_sessions = at_least_one_or_none(
        &mut errors,
        "sessions.max_live",
        raw.sessions.and_then(|s| s.max_live),
    );
    let shutdown_grace = duration(
        &mut errors,
        "shutdown_grace",
        raw.shutdown_grace.as_deref(),
        DEFAULT_SHUTDOWN_GRACE,
    );
    let defaults = super::servers::defaults(&mut errors, raw.defaults.unwrap_or_default());
    let state = super::oauth::state(&mut errors, raw.state.unwrap_or_default(), base, env);
    let oauth = raw
        .oauth
        .and_then(|raw| super::oauth::listener(&mut errors, raw, base));
    let approvals = raw
        .approvals
        .and_then(|raw| super::approvals::approvals(&mut errors, raw, base));
    let audit = raw
        .audit
        .and_then(|raw| super::audit::audit(&mut errors, raw, base, env));
    let callers = super::callers::callers(&mut errors, raw.callers.unwrap_or_default(), base);
    let admin = raw
        .admin
        .and_then(|raw| super::admin::admin(&mut errors, raw, listen, base, env));
    let tenant_store = (admin.is_some() || raw.tenant_store.is_some())
        .then(|| super::admin::tenant_store(&mut errors, raw.tenant_store.unwrap_or_default()));
    let tenants_dir = raw
        .tenants_dir
        .and_then(|raw| super::admin::tenants_dir(&mut errors, raw, base));
    let upstream_allow = super::address::upstream_allow(&mut errors, raw.upstream_allow);
    if tenant_store.is_some() && state.keys.is_empty() {
        errors.push(
            "state.keys",
            "required with admin: or tenant_store: (tenant specs and stored secrets are kept \
             encrypted; give one base64 32-byte key, e.g. from {env: TOOLGATE_STATE_KEY})",
        );
    }
    let guards = super::guards::guards(
        &mut errors,
        raw.guards,
        &super::sources::Sources::file(base, env),
    );
    let tenants = super::tenants::tenants(
        &mut errors,
        raw.tenants,
        !callers.jwt.is_empty() || !callers.mtls.is_empty(),
        tenant_store.is_some() || tenants_dir.is_some(),
        &defaults,
        &super::sources::Sources::file(base, env),
    );

    if !callers.mtls.is_empty() {
        match &grpc.tls {
            Some(tls) if tls.client_ca_file.is_some() && tls.client_auth != ClientAuth::None => {}
            Some(tls) if tls.client_ca_file.is_some() => errors.push(
                "callers.mtls",
                "`grpc.tls.client_auth` is `none`: no client certificate is asked for, so no \
                 entry could ever match (use `optional` or `required`)",
            ),
            _ => errors.push(
                "callers.mtls",
                "needs `grpc.tls` with `client_ca_file` (the CAs caller certificates are verified against)",
            ),
        }
    }
    for (t, tenant) in tenants.iter().enumerate() {
        super::guards::references(&mut errors, &format!("tenants[{t}]"), tenant, &guards);
        super::admin::tokens_not_admin(
            &mut errors,
            &format!("tenants[{t}]"),
            tenant,
            admin.as_ref(),
        );
    }
    oauth_requirements(&mut errors, &tenants, &state, oauth.as_ref(), &callers);
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
        metrics_tls,
        grpc,
        limits,
        max_live_sessions,
        state,
        oauth,
        approvals,
        callers,
        audit,
        tenants,
        guards,
        tenants_dir,
        upstream_allow: std::sync::Arc::new(upstream_allow),
        admin,
        tenant_store,
        spec_defaults: super::SpecDefaults(std::sync::Arc::new(defaults)),
    })
}

/// `metrics.listen`, when set: a socket address other than `listen`'s
/// (unless both take any free port).
fn metrics_listen(
    errors: &mut Errors,
    raw: Option<&RawMetrics>,
    listen: Option<SocketAddr>,
) -> Option<SocketAddr> {
    let metrics = socket_addr(errors, "metrics.listen", &raw?.listen, "0.0.0.0:9090")?;
    if listen == Some(metrics) && metrics.port() != 0 {
        errors.push("metrics.listen", "must differ from `listen`");
    }
    Some(metrics)
}

/// What servers with `oauth` need of the rest of the file: encryption keys
/// for the tokens kept, and a consent listener for per-user consent.
fn oauth_requirements(
    errors: &mut Errors,
    tenants: &[TenantConfig],
    state: &StateConfig,
    listener: Option<&OAuthListener>,
    callers: &super::CallersConfig,
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
        if oauth.needs_consent() && listener.is_none() {
            errors.push(
                format!("tenants[{t}].servers[{s}].oauth.grant"),
                "authorization_code needs the consent listener: set oauth.listen and oauth.public_url",
            );
        }
        delegation_requirements(
            errors,
            &format!("tenants[{t}].servers[{s}].oauth"),
            oauth,
            callers,
        );
    }
}

/// What a delegation grant needs of the rest of the file: JWT callers
/// (only their token can be exchanged), and for `identity_assertion` a
/// `callers.jwt` issuer that is its identity provider.
fn delegation_requirements(
    errors: &mut Errors,
    path: &str,
    oauth: &super::ServerOAuth,
    callers: &super::CallersConfig,
) {
    if !oauth.delegated() {
        return;
    }
    if callers.jwt.is_empty() {
        errors.push(
            format!("{path}.grant"),
            format!(
                "{} exchanges the caller's JWT: configure callers.jwt (static-token and \
                 certificate callers have none to exchange)",
                oauth.grant
            ),
        );
        return;
    }
    let configured = |issuer: &str| {
        callers
            .jwt
            .iter()
            .any(|jwt| jwt.issuer.trim_end_matches('/') == issuer.trim_end_matches('/'))
    };
    for (i, issuer) in oauth.subject_issuers.iter().enumerate() {
        if !configured(issuer) {
            errors.push(
                format!("{path}.subject_issuers[{i}]"),
                format!("`{issuer}` is not a callers.jwt issuer: only verified JWTs are exchanged"),
            );
        }
    }
    if oauth.grant == super::Grant::TokenExchange
        && oauth.token_endpoint.is_some()
        && oauth.subject_issuers.is_empty()
        && callers.jwt.len() > 1
    {
        errors.push(
            format!("{path}.subject_issuers"),
            format!(
                "required with token_endpoint when callers.jwt has {} issuers: name those whose \
                 JWTs may be sent to the token endpoint (a JWT of one issuer must not reach \
                 another's authorization server unless you say so)",
                callers.jwt.len()
            ),
        );
    }
    if let Some(idp) = &oauth.identity_provider
        && !configured(&idp.issuer)
    {
        errors.push(
            format!("{path}.identity_provider.issuer"),
            format!(
                "`{}` is not a callers.jwt issuer: the caller's ID token must come from the \
                 identity provider",
                idp.issuer
            ),
        );
    }
}

/// What one tenant of another source (`tenants_dir`, the state store)
/// needs of the file configuration, at `path` (`tenants[NAME]`): the
/// checks [`oauth_requirements`] and the approvals' requirements make of
/// the file's tenants.
pub(super) fn tenant_requirements(
    errors: &mut Errors,
    path: &str,
    tenant: &TenantConfig,
    state: &StateConfig,
    listener: Option<&OAuthListener>,
    approvals: Option<&super::ApprovalsConfig>,
    callers: &super::CallersConfig,
) {
    for (s, server) in tenant.servers.iter().enumerate() {
        if let Some(oauth) = &server.oauth {
            if state.keys.is_empty() {
                errors.push(
                    format!("{path}.servers[{s}].oauth"),
                    "needs state.keys in the file configuration (tokens are kept encrypted)",
                );
            }
            if oauth.needs_consent() && listener.is_none() {
                errors.push(
                    format!("{path}.servers[{s}].oauth.grant"),
                    "authorization_code needs the consent listener: set oauth.listen and \
                     oauth.public_url in the file configuration",
                );
            }
            delegation_requirements(
                errors,
                &format!("{path}.servers[{s}].oauth"),
                oauth,
                callers,
            );
        }
        if approvals.is_none() && server.needs_approval() {
            errors.push(
                format!("{path}.servers[{s}].definitions"),
                "`approved` needs the top-level `approvals: {file: PATH}` in the file \
                 configuration",
            );
        }
    }
}

/// Validates `limits:`; each limit at least 1.
fn limits(errors: &mut Errors, raw: RawLimits) -> Limits {
    let d = Limits::default();
    Limits {
        max_argument_bytes: at_least_one(
            errors,
            "limits.max_argument_bytes",
            raw.max_argument_bytes,
            d.max_argument_bytes,
        ),
        max_result_bytes: at_least_one(
            errors,
            "limits.max_result_bytes",
            raw.max_result_bytes,
            d.max_result_bytes,
        ),
        max_message_bytes: at_least_one(
            errors,
            "limits.max_message_bytes",
            raw.max_message_bytes,
            d.max_message_bytes,
        ),
        max_tools_per_server: at_least_one(
            errors,
            "limits.max_tools_per_server",
            raw.max_tools_per_server,
            d.max_tools_per_server,
        ),
        max_schema_bytes: at_least_one(
            errors,
            "limits.max_schema_bytes",
            raw.max_schema_bytes,
            d.max_schema_bytes,
        ),
        max_schema_depth: at_least_one(
            errors,
            "limits.max_schema_depth",
            raw.max_schema_depth,
            d.max_schema_depth,
        ),
        max_description_chars: at_least_one(
            errors,
            "limits.max_description_chars",
            raw.max_description_chars,
            d.max_description_chars,
        ),
        max_prompts_per_server: at_least_one(
            errors,
            "limits.max_prompts_per_server",
            raw.max_prompts_per_server,
            d.max_prompts_per_server,
        ),
        max_resources_per_server: at_least_one(
            errors,
            "limits.max_resources_per_server",
            raw.max_resources_per_server,
            d.max_resources_per_server,
        ),
        max_resource_list_bytes: at_least_one(
            errors,
            "limits.max_resource_list_bytes",
            raw.max_resource_list_bytes,
            d.max_resource_list_bytes,
        ),
        max_watches: at_least_one(errors, "limits.max_watches", raw.max_watches, d.max_watches),
        max_cache_entries: at_least_one(
            errors,
            "limits.max_cache_entries",
            raw.max_cache_entries,
            d.max_cache_entries,
        ),
        max_cache_bytes: at_least_one(
            errors,
            "limits.max_cache_bytes",
            raw.max_cache_bytes,
            d.max_cache_bytes,
        ),
    }
}

/// Validates `grpc:`.
fn grpc_settings(errors: &mut Errors, raw: RawGrpc, base: &Path) -> GrpcSettings {
    let defaults = GrpcSettings::default();
    let max_concurrent_streams = at_least_one(
        errors,
        "grpc.max_concurrent_streams",
        raw.max_concurrent_streams,
        defaults.max_concurrent_streams,
    );
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
        mcp_transport: raw.mcp_transport.unwrap_or(defaults.mcp_transport),
        tls: raw
            .tls
            .and_then(|tls| listener_tls(errors, "grpc", tls, base)),
    }
}

/// Loading YAML in the tests of the validation rooms.
#[cfg(test)]
pub(super) mod testing {
    use std::collections::HashMap;
    use std::path::Path;

    use crate::config::{Config, ConfigError};

    /// The environment the tests' secret sources read.
    pub(crate) fn env() -> HashMap<String, String> {
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

    /// Loads `yaml` against [`env`], relative paths from `.`.
    pub(crate) fn load(yaml: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(yaml, "test.yaml", Path::new("."), &env())
    }

    /// The errors of an invalid `yaml`, each as `path: message`.
    pub(crate) fn messages(yaml: &str) -> Vec<String> {
        load(yaml)
            .expect_err("config should be invalid")
            .field_errors()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The errors of a file with one tenant `acme` (token `t`) whose
    /// `servers:` list is `servers`.
    pub(crate) fn server_messages(servers: &str) -> Vec<String> {
        messages(&format!(
            "tenants:\n  - name: acme\n    tokens: [t]\n    servers:\n{servers}"
        ))
    }

    /// Whether one of `errors` starts with `prefix`.
    pub(crate) fn has(errors: &[String], prefix: &str) -> bool {
        errors.iter().any(|e| e.starts_with(prefix))
    }

    /// A valid file with a stdio and an HTTP server.
    pub(crate) const GOOD: &str = r#"
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
}

#[cfg(test)]
mod tests {
    use super::testing::{GOOD, has, load, messages};

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
            assert!(has(&errors, expected), "missing {expected} in {errors:?}");
        }
    }
}
