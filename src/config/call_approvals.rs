//! `tenants[].call_approvals`: who may approve the tenant's tool calls held
//! by a `require_approval` rule (its approver tokens), how many requests one
//! subject may have pending, and the webhook told of each new request.
//! Not toolgate's `approvals:` of tool definitions ([`super::approvals`]).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::Secret;
use super::fields::{Errors, duration, resolve};
use super::raw::{RawCallApprovals, RawWebhook};
use super::sources::Sources;

/// Pending call approvals one subject may have at once, by default.
pub const DEFAULT_MAX_PENDING_PER_SUBJECT: u32 = 20;
/// The largest `max_pending_per_subject` accepted.
pub const MAX_PENDING_PER_SUBJECT_LIMIT: u32 = 10_000;
/// How long one webhook attempt may take, by default.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts of one webhook delivery, by default.
pub const DEFAULT_WEBHOOK_ATTEMPTS: u32 = 5;
/// The most attempts of one webhook delivery accepted.
pub const MAX_WEBHOOK_ATTEMPTS: u32 = 10;
/// The shortest webhook secret (HMAC key) accepted, in bytes.
pub const MIN_WEBHOOK_SECRET_BYTES: usize = 16;
/// The longest approver name accepted, in characters.
const MAX_APPROVER_NAME: usize = 64;

/// A tenant's call approvals (`tenants[].call_approvals`): tool calls a
/// `require_approval` policy rule holds until an approver approves them.
#[derive(Debug, Clone)]
pub struct CallApprovalsConfig {
    /// Static tokens that reach only the `CallApprovals` gRPC service, each
    /// as the approver it names.
    pub approver_tokens: Vec<ApproverToken>,
    /// Pending requests one subject of the tenant may have at once (1 to
    /// 10,000; 20 by default).
    pub max_pending_per_subject: u32,
    /// The webhook told of each new request, when configured.
    pub webhook: Option<WebhookConfig>,
}

impl Default for CallApprovalsConfig {
    fn default() -> Self {
        Self {
            approver_tokens: Vec::new(),
            max_pending_per_subject: DEFAULT_MAX_PENDING_PER_SUBJECT,
            webhook: None,
        }
    }
}

/// One approver's static token (`approver_tokens[]`).
#[derive(Debug, Clone)]
pub struct ApproverToken {
    /// The approver's name (visible ASCII, 1 to 64 characters, unique
    /// within the tenant): who approved, in records and logs.
    pub name: String,
    /// The bearer token; differs from every tenant token and every other
    /// approver token of the configuration.
    pub token: Secret,
}

/// Where new call approval requests are announced
/// (`call_approvals.webhook`). Its `Debug` shows the URL's scheme, host
/// and port only: a path or query may hold a token.
#[derive(Clone)]
pub struct WebhookConfig {
    /// `https` (`http` only to a loopback host).
    pub url: url::Url,
    /// The HMAC-SHA256 key deliveries are signed with (at least 16 bytes).
    pub secret: Secret,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// Attempts of one delivery (1 to 10).
    pub attempts: u32,
}

impl WebhookConfig {
    /// The URL's host (and port, when not the scheme's default): what logs
    /// and errors may name of it.
    pub fn host_for_logs(&self) -> String {
        let host = self.url.host_str().unwrap_or_default();
        match self.url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        }
    }
}

impl fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field(
                "url",
                &format_args!("{}://{}/…", self.url.scheme(), self.host_for_logs()),
            )
            .field("secret", &self.secret)
            .field("timeout", &self.timeout)
            .field("attempts", &self.attempts)
            .finish()
    }
}

/// Validates `call_approvals` at `path` (`tenants[0].call_approvals`). The
/// approver tokens are returned with their paths, for the checks that
/// compare them with the other tokens of the configuration.
pub(super) fn call_approvals(
    errors: &mut Errors,
    path: &str,
    raw: Option<RawCallApprovals>,
    src: &Sources<'_>,
) -> (CallApprovalsConfig, Vec<String>) {
    let Some(raw) = raw else {
        return (CallApprovalsConfig::default(), Vec::new());
    };
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut approver_tokens = Vec::with_capacity(raw.approver_tokens.len());
    let mut paths = Vec::with_capacity(raw.approver_tokens.len());
    for (i, entry) in raw.approver_tokens.into_iter().enumerate() {
        let at = format!("{path}.approver_tokens[{i}]");
        let name_ok = (1..=MAX_APPROVER_NAME).contains(&entry.name.len())
            && entry.name.bytes().all(|b| b.is_ascii_graphic());
        if !name_ok {
            errors.push(
                format!("{at}.name"),
                format!(
                    "is not a valid approver name (1 to {MAX_APPROVER_NAME} visible ASCII \
                     characters, no spaces)"
                ),
            );
        } else if let Some(first) = names.insert(entry.name.clone(), i) {
            errors.push(
                format!("{at}.name"),
                format!(
                    "duplicate approver name `{}` (also {path}.approver_tokens[{first}])",
                    entry.name
                ),
            );
        }
        let token_path = format!("{at}.token");
        let Some(token) = resolve(errors, &token_path, &entry.token, src) else {
            continue;
        };
        if token.expose().is_empty() {
            errors.push(&token_path, "a token must not be empty");
            continue;
        }
        approver_tokens.push(ApproverToken {
            name: entry.name,
            token,
        });
        paths.push(token_path);
    }
    let max_pending_per_subject = match raw.max_pending_per_subject {
        None => DEFAULT_MAX_PENDING_PER_SUBJECT,
        Some(n) if (1..=MAX_PENDING_PER_SUBJECT_LIMIT).contains(&n) => n,
        Some(_) => {
            errors.push(
                format!("{path}.max_pending_per_subject"),
                format!("must be 1 to {MAX_PENDING_PER_SUBJECT_LIMIT}"),
            );
            DEFAULT_MAX_PENDING_PER_SUBJECT
        }
    };
    let webhook = raw
        .webhook
        .and_then(|raw| webhook(errors, &format!("{path}.webhook"), raw, src));
    (
        CallApprovalsConfig {
            approver_tokens,
            max_pending_per_subject,
            webhook,
        },
        paths,
    )
}

/// Validates `call_approvals.webhook` at `path`; `None` when refused.
/// Errors never show the URL (its path or query may hold a token) nor the
/// secret.
fn webhook(
    errors: &mut Errors,
    path: &str,
    raw: RawWebhook,
    src: &Sources<'_>,
) -> Option<WebhookConfig> {
    let before = errors.0.len();
    let url_path = format!("{path}.url");
    let url = match url::Url::parse(&raw.url) {
        Ok(url) if !url.username().is_empty() || url.password().is_some() => {
            errors.push(
                url_path,
                "credentials in the URL are refused (the secret signs each delivery; a \
                 receiver's own token may go in the path or query)",
            );
            None
        }
        Ok(url) if url.host_str().is_none_or(str::is_empty) => {
            errors.push(url_path, "needs a host");
            None
        }
        Ok(url)
            if url.scheme() == "https" || (url.scheme() == "http" && super::is_loopback(&url)) =>
        {
            Some(url)
        }
        Ok(url) if url.scheme() == "http" => {
            errors.push(
                url_path,
                "must be https (the request's details travel in it; http only to a loopback \
                 host)",
            );
            None
        }
        Ok(url) => {
            errors.push(
                url_path,
                format!("must be an https URL, not `{}`", url.scheme()),
            );
            None
        }
        Err(e) => {
            errors.push(url_path, format!("is not an absolute URL: {e}"));
            None
        }
    };
    let secret_path = format!("{path}.secret");
    let secret = resolve(errors, &secret_path, &raw.secret, src);
    if let Some(secret) = &secret
        && secret.expose().len() < MIN_WEBHOOK_SECRET_BYTES
    {
        errors.push(
            secret_path,
            format!(
                "must be at least {MIN_WEBHOOK_SECRET_BYTES} bytes (the key receivers check each \
                 delivery's signature with)"
            ),
        );
    }
    let timeout = duration(
        errors,
        &format!("{path}.timeout"),
        raw.timeout.as_deref(),
        DEFAULT_WEBHOOK_TIMEOUT,
    );
    let attempts = match raw.attempts {
        None => DEFAULT_WEBHOOK_ATTEMPTS,
        Some(n) if (1..=MAX_WEBHOOK_ATTEMPTS).contains(&n) => n,
        Some(_) => {
            errors.push(
                format!("{path}.attempts"),
                format!("must be 1 to {MAX_WEBHOOK_ATTEMPTS}"),
            );
            DEFAULT_WEBHOOK_ATTEMPTS
        }
    };
    if errors.0.len() != before {
        return None;
    }
    Some(WebhookConfig {
        url: url?,
        secret: secret?,
        timeout,
        attempts,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::validate::testing::{has, load, messages};

    const TENANT: &str = "tenants:\n  - name: acme\n    tokens: [{ env: ACME_TOKEN }]\n";

    fn with(section: &str) -> String {
        format!("{TENANT}    call_approvals:\n{section}")
    }

    #[test]
    fn the_documented_shape_loads_with_its_defaults() {
        let config = load(&with(
            "      approver_tokens:\n        - { name: alice, token: { env: GLOBEX_TOKEN } }\n      \
             webhook:\n        url: \"https://chat.example/hooks/toolgate?key=in-the-query\"\n        \
             secret: a-webhook-secret-of-enough-bytes\n",
        ))
        .unwrap();
        let calls = &config.tenants[0].call_approvals;
        assert_eq!(calls.approver_tokens[0].name, "alice");
        assert_eq!(
            calls.approver_tokens[0].token.expose(),
            "globex-secret-token"
        );
        assert_eq!(calls.max_pending_per_subject, 20);
        let webhook = calls.webhook.as_ref().unwrap();
        assert_eq!(webhook.timeout, std::time::Duration::from_secs(5));
        assert_eq!(webhook.attempts, 5);
        let debug = format!("{config:?}");
        for hidden in [
            "globex-secret-token",
            "a-webhook-secret-of-enough-bytes",
            "in-the-query",
            "hooks",
        ] {
            assert!(!debug.contains(hidden), "{hidden} in {debug}");
        }
        assert!(debug.contains("chat.example"));
        // Without the section: no approvers, the default limit.
        let config = load(TENANT).unwrap();
        assert!(config.tenants[0].call_approvals.approver_tokens.is_empty());
        assert_eq!(config.tenants[0].call_approvals.max_pending_per_subject, 20);
    }

    #[test]
    fn bad_values_are_refused_naming_their_paths_without_secrets() {
        let errors = messages(&with(
            "      approver_tokens:\n        - { name: \"al ice\", token: a }\n        \
             - { name: bob, token: \"\" }\n        - { name: bob, token: { env: NOT_SET } }\n      \
             max_pending_per_subject: 0\n      webhook:\n        \
             url: \"http://chat.example/hooks/secret-path\"\n        secret: short-secret\n        \
             timeout: 0s\n        attempts: 11\n",
        ));
        let at = "tenants[0].call_approvals";
        for expected in [
            format!("{at}.approver_tokens[0].name: is not a valid approver name"),
            format!("{at}.approver_tokens[1].token: a token must not be empty"),
            format!("{at}.approver_tokens[2].name: duplicate approver name `bob`"),
            format!("{at}.approver_tokens[2].token: environment variable NOT_SET"),
            format!("{at}.max_pending_per_subject: must be 1 to 10000"),
            format!("{at}.webhook.url: must be https"),
            format!("{at}.webhook.secret: must be at least 16 bytes"),
            format!("{at}.webhook.timeout: must be greater than zero"),
            format!("{at}.webhook.attempts: must be 1 to 10"),
        ] {
            assert!(has(&errors, &expected), "missing {expected} in {errors:?}");
        }
        for e in &errors {
            assert!(
                !e.contains("secret-path") && !e.contains("short-secret"),
                "{e}"
            );
        }
        // http to loopback is accepted; other schemes are not.
        load(&with(
            "      webhook: { url: \"http://127.0.0.1:9/h\", secret: a-webhook-secret-of-enough-bytes }\n",
        ))
        .unwrap();
        let errors = messages(&with(
            "      webhook: { url: \"ftp://x.example/h\", secret: a-webhook-secret-of-enough-bytes }\n",
        ));
        assert!(has(
            &errors,
            &format!("{at}.webhook.url: must be an https URL")
        ));
        let errors = messages(&with("      max_pending_per_subject: 10001\n"));
        assert!(has(&errors, &format!("{at}.max_pending_per_subject")));
    }

    #[test]
    fn an_approver_token_is_a_token_of_its_own() {
        let errors = messages(
            r#"
tenants:
  - name: acme
    tokens: [{ env: ACME_TOKEN }]
    call_approvals:
      approver_tokens:
        - { name: alice, token: acme-secret-token }
        - { name: bob, token: bob-approver-token }
        - { name: carol, token: bob-approver-token }
  - name: globex
    tokens: [bob-approver-token]
    call_approvals:
      approver_tokens:
        - { name: dave, token: { env: GLOBEX_TOKEN } }
        - { name: erin, token: carol-approver-token }
  - name: initech
    tokens: [i-token]
    call_approvals:
      approver_tokens:
        - { name: frank, token: carol-approver-token }
"#,
        );
        let at =
            |t: usize, i: usize| format!("tenants[{t}].call_approvals.approver_tokens[{i}].token");
        for (path, other) in [
            (at(0, 0), "tenants[0].tokens[0]".to_owned()),
            (at(0, 2), at(0, 1)),
            ("tenants[1].tokens[0]".to_owned(), at(0, 1)),
            (at(2, 0), at(1, 1)),
        ] {
            assert!(
                errors
                    .iter()
                    .any(|e| e.starts_with(&format!("{path}:")) && e.contains(&other)),
                "{path} (same as {other}) in {errors:?}"
            );
        }
        // dave's token is nobody else's.
        assert_eq!(errors.len(), 4, "{errors:?}");
        for e in &errors {
            for secret in [
                "acme-secret-token",
                "bob-approver-token",
                "carol-approver-token",
            ] {
                assert!(!e.contains(secret), "{e}");
            }
        }
    }

    #[test]
    fn a_tenant_spec_takes_the_section_with_the_same_checks() {
        let config = load(TENANT).unwrap();
        let spec = crate::config::TenantSpec::parse(
            "tokens: [spec-token]\ncall_approvals:\n  approver_tokens:\n    \
             - { name: alice, token: { stored: alice } }\n    \
             - { name: bob, token: spec-token }\n  webhook:\n    \
             url: \"https://hooks.example/h\"\n    secret: { stored: hook }\n",
            Some("initech"),
        )
        .unwrap();
        let stored: Vec<String> = spec.stored_references().into_iter().collect();
        assert_eq!(stored, ["alice", "hook"]);
        let spec = crate::config::TenantSpec::parse(
            "tokens: [spec-token]\ncall_approvals:\n  approver_tokens:\n    \
             - { name: bob, token: spec-token }\n  max_pending_per_subject: 0\n",
            Some("initech"),
        )
        .unwrap();
        let env = crate::config::validate::testing::env();
        let errors: Vec<String> = config
            .validate_tenant(
                spec,
                crate::config::SpecSource::Dir {
                    file: std::path::Path::new("tenants.d/initech.yaml"),
                },
                &env,
            )
            .unwrap_err()
            .errors
            .iter()
            .map(ToString::to_string)
            .collect();
        let at = "tenants[initech].call_approvals";
        assert!(
            has(
                &errors,
                &format!(
                    "{at}.approver_tokens[0].token: the same token is configured as tenants[initech].tokens[0]"
                )
            ),
            "{errors:?}"
        );
        assert!(
            has(&errors, &format!("{at}.max_pending_per_subject")),
            "{errors:?}"
        );
        assert!(
            errors.iter().all(|e| !e.contains("spec-token")),
            "{errors:?}"
        );
    }
}
