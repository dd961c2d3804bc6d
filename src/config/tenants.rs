//! `tenants:`: each tenant's name, tokens (no token shared by two
//! tenants, none printed), servers (names unique within the tenant, each
//! checked by [`super::servers`]), limits, connection settings and policy.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::fields::{Errors, at_least_one_or_none, duration, duration_or_zero, resolve};
use super::names;
use super::raw::{RawServer, RawTenant, RawTenantLimits, RawValue};
use super::servers::{Defaults, validate_server};
use super::sources::Sources;
use super::{Secret, ServerConfig, SubjectLimits, TenantConfig, TenantConsent, TenantLimits};

/// Token digest → (tenant index, path, whether an approver token), to find
/// tokens shared by tenants, or by a tenant and an approver, without
/// keeping or printing the token itself.
type TokenOwners = HashMap<[u8; 32], (usize, String, bool)>;

/// Validates `tenants:`; `jwt_callers` says whether `callers.jwt` or
/// `callers.mtls` lets a tenant go without static tokens.
pub(super) fn tenants(
    errors: &mut Errors,
    raw: Vec<RawTenant>,
    jwt_callers: bool,
    other_sources: bool,
    defaults: &Defaults,
    src: &Sources<'_>,
) -> Vec<TenantConfig> {
    if raw.is_empty() && !other_sources {
        errors.push(
            "tenants",
            "at least one tenant is required (or tenants from tenants_dir or the admin API)",
        );
    }
    let mut tenant_names: HashMap<String, usize> = HashMap::new();
    let mut token_owners = TokenOwners::new();
    let mut tenants = Vec::with_capacity(raw.len());
    for (index, tenant) in raw.into_iter().enumerate() {
        let path = format!("tenants[{index}]");
        // With JWT callers, a tenant may have no static token.
        if tenant.tokens.is_empty() && !jwt_callers {
            errors.push(
                format!("{path}.tokens"),
                "at least one token is required (callers of this tenant could not authenticate; or configure callers.jwt or callers.mtls)",
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
            errors,
            &path,
            tenant,
            index,
            &mut token_owners,
            defaults,
            src,
        ) {
            tenants.push(t);
        }
    }
    tenants
}

/// Validates one tenant of another source (`tenants_dir`, the state
/// store) at `path` (`tenants[NAME]`); `None` if anything in it is
/// refused. Token collisions with other tenants are not its to find.
pub(super) fn validate_one(
    errors: &mut Errors,
    path: &str,
    tenant: RawTenant,
    jwt_callers: bool,
    defaults: &Defaults,
    src: &Sources<'_>,
) -> Option<TenantConfig> {
    if tenant.tokens.is_empty() && !jwt_callers {
        errors.push(
            format!("{path}.tokens"),
            "at least one token is required (callers of this tenant could not authenticate; or configure callers.jwt or callers.mtls)",
        );
    }
    validate_tenant(
        errors,
        path,
        tenant,
        0,
        &mut TokenOwners::new(),
        defaults,
        src,
    )
}

/// Validates one tenant; `None` if anything in it is refused.
#[allow(clippy::too_many_arguments)]
fn validate_tenant(
    errors: &mut Errors,
    path: &str,
    tenant: RawTenant,
    index: usize,
    token_owners: &mut TokenOwners,
    defaults: &Defaults,
    src: &Sources<'_>,
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
    let tokens = tokens(errors, path, &tenant.tokens, index, token_owners, src);
    let (call_approvals, approver_paths) = super::call_approvals::call_approvals(
        errors,
        &format!("{path}.call_approvals"),
        tenant.call_approvals,
        src,
    );
    for (approver, token_path) in call_approvals.approver_tokens.iter().zip(&approver_paths) {
        claim(
            errors,
            token_path,
            &approver.token,
            index,
            true,
            token_owners,
        );
    }
    let idempotency =
        super::idempotency::idempotency(errors, &format!("{path}.idempotency"), tenant.idempotency);
    let servers = servers(errors, path, tenant.servers, defaults, src);
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
    let consent = consent(
        errors,
        path,
        tenant.consent_return_url.as_deref(),
        tenant.confirm_consent,
        &servers,
    );
    (errors.0.len() == before).then_some(TenantConfig {
        name: tenant.name,
        tokens,
        servers,
        limits,
        connect,
        idle_timeout,
        policy,
        consent,
        origin: super::TenantOrigin::File,
        guards: tenant.guards,
        call_approvals,
        idempotency,
    })
}

/// `consent_return_url` and `confirm_consent`: a tenant with a per-user
/// server confirms consents through its application unless it opts out.
fn consent(
    errors: &mut Errors,
    path: &str,
    return_url: Option<&str>,
    confirm: Option<bool>,
    servers: &[ServerConfig],
) -> TenantConsent {
    let per_user = servers.iter().find(|s| {
        s.oauth
            .as_ref()
            .is_some_and(|o| o.grant == super::Grant::AuthorizationCode)
    });
    let field = format!("{path}.consent_return_url");
    if confirm == Some(false) {
        if return_url.is_some() {
            errors.push(
                field,
                "is not used with confirm_consent: false (remove one of them)",
            );
        }
        return TenantConsent::Unconfirmed;
    }
    let Some(text) = return_url else {
        if let Some(server) = per_user {
            errors.push(
                field,
                format!(
                    "is required: server `{}` is per-user (grant: authorization_code), and its \
                     consents are confirmed by the application behind this URL \
                     (CompleteAuthorization); or set confirm_consent: false to make a consent \
                     usable by whoever opens the link",
                    server.name
                ),
            );
        }
        return TenantConsent::Confirmed(None);
    };
    match url::Url::parse(text) {
        Ok(url) if url.fragment().is_some() => {
            errors.push(field, "must not have a #fragment");
        }
        Ok(url)
            if url.scheme() == "https" || (url.scheme() == "http" && super::is_loopback(&url)) =>
        {
            return TenantConsent::Confirmed(Some(url));
        }
        Ok(url) => errors.push(
            field,
            format!(
                "must be https (the one-time code travels in it; http only on loopback), not `{}`",
                url.scheme()
            ),
        ),
        Err(e) => errors.push(field, format!("is not an absolute URL: {e}")),
    }
    TenantConsent::Confirmed(None)
}

/// The tenant's tokens: read, not empty, and each selecting this tenant
/// only (recorded in `token_owners`).
fn tokens(
    errors: &mut Errors,
    path: &str,
    raw: &[RawValue],
    index: usize,
    token_owners: &mut TokenOwners,
    src: &Sources<'_>,
) -> Vec<Secret> {
    let mut tokens = Vec::with_capacity(raw.len());
    for (t, value) in raw.iter().enumerate() {
        let token_path = format!("{path}.tokens[{t}]");
        let Some(secret) = resolve(errors, &token_path, value, src) else {
            continue;
        };
        if secret.expose().is_empty() {
            errors.push(&token_path, "a token must not be empty");
            continue;
        }
        claim(errors, &token_path, &secret, index, false, token_owners);
        tokens.push(secret);
    }
    tokens
}

/// Records `token` (at `path`, of tenant `index`; an approver token when
/// `approver`) in `token_owners`, refusing it when another path has it: a
/// tenant token selects one tenant, an approver token is a token of its
/// own. Messages name the other path, never the token.
fn claim(
    errors: &mut Errors,
    path: &str,
    token: &Secret,
    index: usize,
    approver: bool,
    token_owners: &mut TokenOwners,
) {
    let digest: [u8; 32] = Sha256::digest(token.expose().as_bytes()).into();
    match token_owners.get(&digest) {
        Some((_, other_path, other_approver)) if approver || *other_approver => errors.push(
            path,
            format!(
                "the same token is configured as {other_path}; an approver token reaches only \
                 the call approvals service and must differ from every tenant token and every \
                 other approver token"
            ),
        ),
        Some((owner, other_path, _)) if *owner != index => errors.push(
            path,
            format!(
                "the same token is configured for another tenant ({other_path}); \
                 a token must select exactly one tenant"
            ),
        ),
        Some((_, other_path, _)) => {
            errors.push(path, format!("duplicate token (same as {other_path})"));
        }
        None => {
            token_owners.insert(digest, (index, path.to_owned(), approver));
        }
    }
}

/// The tenant's servers, their names unique within it; only those without
/// errors are returned.
#[expect(clippy::vec_box, reason = "as parsed: see `RawTenant::servers`")]
fn servers(
    errors: &mut Errors,
    path: &str,
    raw: Vec<Box<RawServer>>,
    defaults: &Defaults,
    src: &Sources<'_>,
) -> Vec<ServerConfig> {
    let mut server_names: HashMap<String, usize> = HashMap::new();
    let mut servers = Vec::with_capacity(raw.len());
    for (s, server) in raw.into_iter().enumerate() {
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
        if let Some(server) = validate_server(errors, &server_path, *server, defaults, src) {
            servers.push(server);
        }
    }
    servers
}

/// The tenant's call limits: concurrency with its queue timeout, and a
/// rate with its burst.
fn tenant_limits(errors: &mut Errors, path: &str, raw: RawTenantLimits) -> TenantLimits {
    let (rate_per_second, burst) = rate(errors, path, raw.rate_per_second, raw.burst);
    let max_concurrent_calls = at_least_one_or_none(
        errors,
        &format!("{path}.max_concurrent_calls"),
        raw.max_concurrent_calls,
    );
    let per_subject = raw.per_subject.map(|raw| {
        let path = format!("{path}.per_subject");
        let (rate_per_second, burst) = rate(errors, &path, raw.rate_per_second, raw.burst);
        SubjectLimits {
            max_concurrent_calls: at_least_one_or_none(
                errors,
                &format!("{path}.max_concurrent_calls"),
                raw.max_concurrent_calls,
            ),
            rate_per_second,
            burst,
        }
    });
    TenantLimits {
        max_concurrent_calls,
        queue_timeout: duration_or_zero(
            errors,
            &format!("{path}.queue_timeout"),
            raw.queue_timeout.as_deref(),
            Duration::from_millis(100),
        ),
        rate_per_second,
        burst,
        per_subject,
    }
}

/// `rate_per_second` and its `burst` (which needs the rate) of a limits
/// block at `path`.
fn rate(
    errors: &mut Errors,
    path: &str,
    rate_per_second: Option<u32>,
    burst: Option<u32>,
) -> (Option<NonZeroU32>, Option<NonZeroU32>) {
    let rate_per_second =
        at_least_one_or_none(errors, &format!("{path}.rate_per_second"), rate_per_second)
            .and_then(NonZeroU32::new);
    let burst =
        at_least_one_or_none(errors, &format!("{path}.burst"), burst).and_then(NonZeroU32::new);
    if burst.is_some() && rate_per_second.is_none() {
        errors.push(format!("{path}.burst"), "set `rate_per_second` too");
    }
    (rate_per_second, burst)
}

#[cfg(test)]
mod tests {
    use crate::config::validate::testing::{has, messages};

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
            has(
                &errors,
                "tenants[0].servers[1].name: duplicate server name `s`"
            ),
            "{errors:?}"
        );
        assert!(
            has(&errors, "tenants[1].name: duplicate tenant name `acme`"),
            "{errors:?}"
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
            has(&errors, "tenants[0].tokens[2]: cannot read file"),
            "{errors:?}"
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
}
