//! Callers with workload identity: the top-level `callers:` block, its raw
//! serde types and their validation into [`CallersConfig`].
//!
//! Each entry of `callers.jwt` is an issuer whose JWTs the gateway accepts
//! as caller credentials, next to the tenants' static tokens: where its
//! keys come from (a JWKS URL or file), the audiences and algorithms it
//! may use, and two CEL expressions over the verified claims that name the
//! caller's tenant and subject. The expressions are compiled here, once
//! per configuration; a bad one is an error naming its path
//! (`callers.jwt[0].tenant`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use jsonwebtoken::Algorithm;
use serde::Deserialize;

use super::fields::{Errors, duration, duration_or_zero};

/// The subject expression when `subject` is not set: the `sub` claim.
pub const DEFAULT_SUBJECT_EXPRESSION: &str = "claims.sub";
/// The accepted clock difference when `clock_skew` is not set.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// The largest `clock_skew` accepted: more would accept long-expired tokens.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);
/// How old fetched keys may get before they are fetched again, by default.
pub const DEFAULT_JWKS_REFRESH_INTERVAL: Duration = Duration::from_secs(600);
/// The least time between two fetches of a JWKS URL, by default: an
/// unknown key id refetches the set at most this often.
pub const DEFAULT_JWKS_MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// The algorithms accepted when `algorithms` is not set: every asymmetric
/// one.
pub const DEFAULT_ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];
/// The only variable a claim expression may name.
const CLAIMS_VARIABLE: &str = "claims";
/// The only variable a `callers.mtls` expression may name.
const CERT_VARIABLE: &str = "cert";
/// The subject expression of a `callers.mtls` entry when `subject` is not
/// set: the certificate's SPIFFE ID, or the tenant itself without one.
pub const DEFAULT_CERT_SUBJECT_EXPRESSION: &str =
    "cert.spiffe_id != null ? cert.spiffe_id.id : null";

/// `callers:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCallers {
    #[serde(default)]
    pub(crate) jwt: Vec<RawJwtIssuer>,
    #[serde(default)]
    pub(crate) mtls: Vec<RawMtlsCaller>,
}

/// One `callers.mtls[]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMtlsCaller {
    pub(crate) trust_domain: Option<String>,
    pub(crate) tenant: String,
    pub(crate) subject: Option<String>,
}

/// One `callers.jwt[]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwtIssuer {
    pub(crate) issuer: String,
    #[serde(default)]
    pub(crate) audiences: Vec<String>,
    pub(crate) jwks: RawJwks,
    pub(crate) algorithms: Option<Vec<String>>,
    pub(crate) clock_skew: Option<String>,
    pub(crate) tenant: String,
    pub(crate) subject: Option<String>,
    pub(crate) admin: Option<String>,
}

/// `callers.jwt[].jwks` as written: a `url` (with its refresh settings) or
/// a `file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwks {
    pub(crate) url: Option<String>,
    pub(crate) file: Option<String>,
    pub(crate) refresh_interval: Option<String>,
    pub(crate) min_refresh_interval: Option<String>,
}

/// Who may call besides the tenants' static tokens.
#[derive(Debug, Clone, Default)]
pub struct CallersConfig {
    /// Issuers whose JWTs are accepted, in file order. Empty: static tokens
    /// only.
    pub jwt: Vec<JwtIssuer>,
    /// Callers identified by their client certificate on the gRPC port
    /// (verified against `grpc.tls.client_ca_file`), in file order: the
    /// first entry whose `trust_domain` matches decides.
    pub mtls: Vec<MtlsCaller>,
}

/// Callers identified by a verified client certificate (`callers.mtls[]`).
#[derive(Debug, Clone, PartialEq)]
pub struct MtlsCaller {
    /// Only certificates whose SPIFFE ID is of this trust domain match
    /// the entry (`cluster.local`); any verified certificate when unset.
    pub trust_domain: Option<String>,
    /// Names the caller's tenant: a CEL expression over `cert`.
    pub tenant: ClaimExpression,
    /// Names the subject: a CEL expression over `cert` that evaluates to a
    /// string, or `null` for the tenant itself
    /// ([`DEFAULT_CERT_SUBJECT_EXPRESSION`] by default).
    pub subject: ClaimExpression,
    /// Where the entry is in the file (`callers.mtls[0]`), for messages.
    pub path: String,
}

/// An issuer whose JWTs authenticate callers (`callers.jwt[]`).
#[derive(Debug, Clone)]
pub struct JwtIssuer {
    /// The exact `iss` claim of its tokens (unique in the file).
    pub issuer: String,
    /// A token's `aud` must name at least one of these.
    pub audiences: Vec<String>,
    /// Where the verification keys come from.
    pub jwks: JwksSource,
    /// Signature algorithms accepted (never `none`, never HMAC).
    pub algorithms: Vec<Algorithm>,
    /// How far `exp` and `nbf` may be off the gateway's clock.
    pub clock_skew: Duration,
    /// Names the caller's tenant: a CEL expression over `claims` that
    /// evaluates to a tenant name.
    pub tenant: ClaimExpression,
    /// Names the subject the caller acts for: a CEL expression over
    /// `claims` that evaluates to a string (or `null` for the tenant
    /// itself); `claims.sub` by default.
    pub subject: ClaimExpression,
    /// Whether a token of this issuer may call the admin API: a CEL
    /// expression over `claims` that evaluates to a boolean. Unset: no
    /// token of this issuer reaches the admin API.
    pub admin: Option<ClaimExpression>,
    /// Where the entry is in the file (`callers.jwt[0]`), for messages.
    pub path: String,
}

/// Where an issuer's verification keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A JWKS document fetched over HTTPS (HTTP only on loopback), cached,
    /// fetched again when older than `refresh_interval` and when a token
    /// names a key id the cache does not hold (at most once per
    /// `min_refresh_interval`).
    Url {
        /// The JWKS URL.
        url: url::Url,
        /// How old the cached keys may get before they are fetched again
        /// (in the background; the cached keys keep serving meanwhile).
        refresh_interval: Duration,
        /// The least time between two fetches.
        min_refresh_interval: Duration,
    },
    /// A JWKS document in a file (e.g. a mounted ConfigMap), read again
    /// when it changes.
    File {
        /// The file's path (relative paths resolved against the
        /// configuration file's directory).
        path: PathBuf,
    },
}

/// A CEL expression over a verified token's `claims` (or, for
/// `callers.mtls`, a verified certificate's fields, `cert`), compiled once
/// per configuration.
#[derive(Clone)]
pub struct ClaimExpression {
    source: String,
    program: Arc<cel::Program>,
    /// The one variable it may name: `claims` or `cert`.
    variable: &'static str,
}

impl std::fmt::Debug for ClaimExpression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ClaimExpression")
            .field(&self.source)
            .finish()
    }
}

impl PartialEq for ClaimExpression {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// The CEL environment expressions are compiled and run in (the standard
/// functions and macros, and the strings extension: `split`, `lowerAscii`,
/// `replace`, `substring`, ...), built once.
fn cel_env() -> &'static Arc<cel::Env> {
    static ENV: OnceLock<Arc<cel::Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = cel::Env::stdlib();
        env.add_extension(cel::extensions::strings)
            .expect("the strings extension registers on the standard environment");
        Arc::new(env)
    })
}

impl ClaimExpression {
    /// Compiles `source`.
    ///
    /// # Errors
    /// Not valid CEL, or names a variable other than `claims`.
    pub fn compile(source: &str) -> Result<Self, String> {
        Self::compile_over(source, CLAIMS_VARIABLE)
    }

    /// Compiles `source`, an expression over the verified certificate
    /// (`cert`) of a `callers.mtls` caller.
    ///
    /// # Errors
    /// Not valid CEL, or names a variable other than `cert`.
    pub fn compile_cert(source: &str) -> Result<Self, String> {
        Self::compile_over(source, CERT_VARIABLE)
    }

    fn compile_over(source: &str, variable: &'static str) -> Result<Self, String> {
        let what = if variable == CERT_VARIABLE {
            "the verified client certificate"
        } else {
            "the verified token's claims"
        };
        let program = cel_env()
            .compile(source)
            .map_err(|e| format!("not a valid CEL expression: {}", one_line(&e.to_string())))?;
        let references = program.references();
        if let Some(unknown) = references.variables().into_iter().find(|v| *v != variable) {
            return Err(format!(
                "names the variable `{unknown}`; the only variable is `{variable}` ({what})"
            ));
        }
        Ok(Self {
            source: source.to_owned(),
            program: Arc::new(program),
            variable,
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the expression with its variable (`claims` or `cert`) bound to
    /// `value`.
    ///
    /// # Errors
    /// The expression fails on this value (a missing key, a wrong type):
    /// CEL's message.
    pub fn evaluate(&self, value: &serde_json::Value) -> Result<cel::Value, String> {
        let mut context = cel::Context::with_env(cel_env().clone());
        context
            .add_variable(self.variable, value)
            .map_err(|e| format!("the {} cannot be read by CEL: {e}", self.variable))?;
        self.program.execute(&context).map_err(|e| e.to_string())
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Validates `callers:`.
pub(super) fn callers(errors: &mut Errors, raw: RawCallers, base: &Path) -> CallersConfig {
    let mut jwt: Vec<JwtIssuer> = Vec::with_capacity(raw.jwt.len());
    let mut seen: std::collections::HashMap<String, String> = Default::default();
    for (index, entry) in raw.jwt.into_iter().enumerate() {
        let path = format!("callers.jwt[{index}]");
        if let Some(first) = seen.insert(entry.issuer.clone(), path.clone()) {
            errors.push(
                format!("{path}.issuer"),
                format!(
                    "issuer `{}` is configured twice (also {first}); a token's `iss` must select one entry",
                    entry.issuer
                ),
            );
        }
        if let Some(issuer) = jwt_issuer(errors, &path, entry, base) {
            jwt.push(issuer);
        }
    }
    let mtls = raw
        .mtls
        .into_iter()
        .enumerate()
        .filter_map(|(index, entry)| mtls_caller(errors, &format!("callers.mtls[{index}]"), entry))
        .collect();
    CallersConfig { jwt, mtls }
}

/// Validates one `callers.mtls[]` entry.
fn mtls_caller(errors: &mut Errors, path: &str, raw: RawMtlsCaller) -> Option<MtlsCaller> {
    let before = errors.0.len();
    if let Some(domain) = &raw.trust_domain
        && !is_trust_domain(domain)
    {
        errors.push(
            format!("{path}.trust_domain"),
            format!(
                "`{domain}` is not a SPIFFE trust domain (lowercase letters, digits, `.`, `-` and `_`, \
                 without `spiffe://`), e.g. cluster.local"
            ),
        );
    }
    let mut compile = |field: &str, source: &str| match ClaimExpression::compile_cert(source) {
        Ok(expression) => Some(expression),
        Err(message) => {
            errors.push(format!("{path}.{field}"), message);
            None
        }
    };
    let tenant = compile("tenant", &raw.tenant);
    let subject = compile(
        "subject",
        raw.subject
            .as_deref()
            .unwrap_or(DEFAULT_CERT_SUBJECT_EXPRESSION),
    );
    (errors.0.len() == before).then(|| MtlsCaller {
        trust_domain: raw.trust_domain,
        tenant: tenant.expect("compiled"),
        subject: subject.expect("compiled"),
        path: path.to_owned(),
    })
}

/// Whether `text` is a SPIFFE trust domain name (the SPIFFE ID standard:
/// lowercase letters, digits, dots, dashes and underscores).
fn is_trust_domain(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 255
        && text.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        })
}

fn jwt_issuer(
    errors: &mut Errors,
    path: &str,
    raw: RawJwtIssuer,
    base: &Path,
) -> Option<JwtIssuer> {
    let before = errors.0.len();
    if raw.issuer.trim().is_empty() {
        errors.push(format!("{path}.issuer"), "must not be empty");
    }
    if raw.audiences.is_empty() {
        errors.push(
            format!("{path}.audiences"),
            "at least one audience is required (e.g. `toolgate`): a token must be meant for this gateway",
        );
    }
    for (i, audience) in raw.audiences.iter().enumerate() {
        if audience.trim().is_empty() {
            errors.push(format!("{path}.audiences[{i}]"), "must not be empty");
        }
    }
    let jwks = jwks(errors, &format!("{path}.jwks"), raw.jwks, base);
    let algorithms = match raw.algorithms {
        None => DEFAULT_ALGORITHMS.to_vec(),
        Some(names) => algorithms(errors, &format!("{path}.algorithms"), &names),
    };
    let clock_skew = duration_or_zero(
        errors,
        &format!("{path}.clock_skew"),
        raw.clock_skew.as_deref(),
        DEFAULT_CLOCK_SKEW,
    );
    if clock_skew > MAX_CLOCK_SKEW {
        errors.push(
            format!("{path}.clock_skew"),
            format!(
                "at most {} (more would accept tokens long expired)",
                humantime::format_duration(MAX_CLOCK_SKEW)
            ),
        );
    }
    let mut expression = |key: &str, source: &str| {
        ClaimExpression::compile(source)
            .map_err(|message| errors.push(format!("{path}.{key}"), message))
            .ok()
    };
    let tenant = expression("tenant", &raw.tenant);
    let subject = expression(
        "subject",
        raw.subject.as_deref().unwrap_or(DEFAULT_SUBJECT_EXPRESSION),
    );
    let admin = raw
        .admin
        .as_deref()
        .map(|source| expression("admin", source));
    if errors.0.len() != before {
        return None;
    }
    Some(JwtIssuer {
        issuer: raw.issuer,
        audiences: raw.audiences,
        jwks: jwks?,
        algorithms,
        clock_skew,
        tenant: tenant?,
        subject: subject?,
        admin: admin.map(|a| a.expect("checked with the other errors")),
        path: path.to_owned(),
    })
}

fn algorithms(errors: &mut Errors, path: &str, names: &[String]) -> Vec<Algorithm> {
    if names.is_empty() {
        errors.push(
            path,
            "at least one algorithm is required (or leave it unset for every asymmetric one)",
        );
    }
    let mut accepted = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if name.eq_ignore_ascii_case("none") {
            errors.push(at, "`none` (an unsigned token) is never accepted");
            continue;
        }
        match name.parse::<Algorithm>() {
            Ok(alg) if DEFAULT_ALGORITHMS.contains(&alg) => {
                if !accepted.contains(&alg) {
                    accepted.push(alg);
                }
            }
            Ok(_) => errors.push(
                at,
                format!(
                    "`{name}` is symmetric (HMAC): its key would be a shared secret, not a published key; use an asymmetric algorithm"
                ),
            ),
            Err(_) => errors.push(
                at,
                format!(
                    "`{name}` is not an algorithm toolgate verifies (one of RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA)"
                ),
            ),
        }
    }
    accepted
}

fn jwks(errors: &mut Errors, path: &str, raw: RawJwks, base: &Path) -> Option<JwksSource> {
    match (raw.url, raw.file) {
        (Some(_), Some(_)) | (None, None) => {
            errors.push(path, "give exactly one of `url` or `file`");
            None
        }
        (Some(text), None) => {
            let refresh_interval = duration(
                errors,
                &format!("{path}.refresh_interval"),
                raw.refresh_interval.as_deref(),
                DEFAULT_JWKS_REFRESH_INTERVAL,
            );
            let min_refresh_interval = duration_or_zero(
                errors,
                &format!("{path}.min_refresh_interval"),
                raw.min_refresh_interval.as_deref(),
                DEFAULT_JWKS_MIN_REFRESH_INTERVAL,
            );
            let url = match url::Url::parse(&text) {
                Ok(url) if url.scheme() == "https" => url,
                Ok(url) if url.scheme() == "http" && super::is_loopback(&url) => url,
                Ok(url) if url.scheme() == "http" => {
                    errors.push(
                        format!("{path}.url"),
                        "must be https (keys fetched over plain HTTP could be replaced on the way); http only on loopback",
                    );
                    return None;
                }
                Ok(_) | Err(_) => {
                    errors.push(
                        format!("{path}.url"),
                        format!("`{text}` is not an https:// URL"),
                    );
                    return None;
                }
            };
            Some(JwksSource::Url {
                url,
                refresh_interval,
                min_refresh_interval,
            })
        }
        (None, Some(file)) => {
            for (key, set) in [
                ("refresh_interval", raw.refresh_interval.is_some()),
                ("min_refresh_interval", raw.min_refresh_interval.is_some()),
            ] {
                if set {
                    errors.push(
                        format!("{path}.{key}"),
                        "only with `url` (a file is read again whenever it changes)",
                    );
                }
            }
            if file.is_empty() {
                errors.push(format!("{path}.file"), "needs a path");
                return None;
            }
            let path_buf = base.join(&file);
            match std::fs::read(&path_buf) {
                Ok(bytes) => match serde_json::from_slice::<jsonwebtoken::jwk::JwkSet>(&bytes) {
                    Ok(set) if set.keys.is_empty() => errors.push(
                        format!("{path}.file"),
                        format!("{} holds no keys", path_buf.display()),
                    ),
                    Ok(_) => {}
                    Err(e) => errors.push(
                        format!("{path}.file"),
                        format!(
                            "{} is not a JWKS document ({{\"keys\": [...]}}): {e}",
                            path_buf.display()
                        ),
                    ),
                },
                Err(e) => errors.push(
                    format!("{path}.file"),
                    format!("cannot read {}: {e}", path_buf.display()),
                ),
            }
            Some(JwksSource::File { path: path_buf })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_compile_once_and_read_claims() {
        let tenant = ClaimExpression::compile(r#"claims["kubernetes.io"].namespace"#).unwrap();
        let claims = serde_json::json!({"kubernetes.io": {"namespace": "acme"}, "sub": "x"});
        assert_eq!(tenant.evaluate(&claims).unwrap(), cel::Value::from("acme"));
        let subject = ClaimExpression::compile(DEFAULT_SUBJECT_EXPRESSION).unwrap();
        assert_eq!(subject.evaluate(&claims).unwrap(), cel::Value::from("x"));
        assert!(tenant.evaluate(&serde_json::json!({})).is_err());
        let composed =
            ClaimExpression::compile(r#"has(claims.team) ? claims.team : "default""#).unwrap();
        assert_eq!(
            composed.evaluate(&serde_json::json!({})).unwrap(),
            cel::Value::from("default")
        );
    }

    #[test]
    fn the_documented_examples_work() {
        let claims = serde_json::json!({
            "sub": "ci-runner",
            "tid": "42",
            "team": "acme",
            "email": "ada@example.com",
            "act": {"sub": "user-7"},
            "kubernetes.io": {"namespace": "globex"},
        });
        let run = |source: &str| {
            ClaimExpression::compile(source)
                .unwrap()
                .evaluate(&claims)
                .unwrap()
        };
        assert_eq!(run("claims.team"), cel::Value::from("acme"));
        assert_eq!(
            run(r#""tools-" + claims.tid"#),
            cel::Value::from("tools-42")
        );
        assert_eq!(
            run(r#"claims.sub.startsWith("ci-") ? "ci" : "default""#),
            cel::Value::from("ci")
        );
        assert_eq!(
            run("has(claims.act) ? claims.act.sub : claims.sub"),
            cel::Value::from("user-7")
        );
        assert_eq!(run("null"), cel::Value::Null);
        let admitted = r#"claims["kubernetes.io"].namespace in ["acme", "globex"] ? claims["kubernetes.io"].namespace : """#;
        assert_eq!(run(admitted), cel::Value::from("globex"));
        let other = serde_json::json!({"kubernetes.io": {"namespace": "initech"}});
        assert_eq!(
            ClaimExpression::compile(admitted)
                .unwrap()
                .evaluate(&other)
                .unwrap(),
            cel::Value::from("")
        );
    }

    #[test]
    fn expressions_name_only_claims() {
        assert!(
            ClaimExpression::compile("request.tenant")
                .unwrap_err()
                .contains("`request`")
        );
        assert!(
            ClaimExpression::compile("claims.")
                .unwrap_err()
                .starts_with("not a valid CEL expression")
        );
    }
}
