//! What caller authentication puts into the request extensions: the
//! [`Subject`] a call acts for and the [`Caller`] (how it proved itself).
//!
//! # Subject keys
//! A subject is known by who vouched for it: [`Subject::key`] is the one
//! function that turns how the caller authenticated and the subject's id
//! into the key under which its upstream credentials are stored, its
//! per-user sessions kept and its consents matched:
//!
//! | caller | key |
//! | --- | --- |
//! | acting for the tenant itself (no subject) | `""` |
//! | a static token naming `x-toolgate-subject: alice` | `token:alice` |
//! | a JWT of issuer `https://issuer.example` whose subject is `alice` | `jwt:https://issuer.example alice` |
//! | a client certificate of SPIFFE trust domain `cluster.local` whose subject expression gives `spiffe://cluster.local/ns/acme/sa/worker` | `cert:cluster.local spiffe://cluster.local/ns/acme/sa/worker` |
//! | a client certificate without a SPIFFE ID whose subject expression gives `CN=worker` | `cert: CN=worker` |
//! | an approver token (`tenants[].call_approvals.approver_tokens`) naming `alice` | `approver:alice` |
//!
//! So a static token naming the subject a JWT issuer produces, or two
//! issuers mapped to one tenant producing the same id, never reach each
//! other's credentials. A certificate's subject is keyed under the trust
//! domain of the certificate's SPIFFE ID (the CA's SPIFFE namespace: two
//! trust domains may issue the same path), empty for a certificate
//! without one (any certificate `grpc.tls.client_ca_file` verifies); a
//! trust domain has no space, so the first space ends it. Every static token of a tenant is one principal
//! (`token:`): a token holder names any subject it likes, so telling the
//! tokens apart would separate nothing an attacker could not cross, and
//! rotating a token (two tokens configured for a while) must not lose
//! anyone's consent. An id is visible ASCII (no space), so the last space
//! of a JWT key separates the issuer (any string) from the id: no two
//! (issuer, id) pairs share a key. The tenant itself is one principal
//! whichever way it authenticated (a static token without the header, a
//! JWT whose subject expression gives `null`): the operator granted each
//! of them the tenant's own identity, and `client_credentials` servers
//! use its token. No named subject's key is empty, so no header reaches
//! the tenant's own credentials.

use std::sync::Arc;

/// The metadata key naming the end user a call acts for.
pub const SUBJECT_METADATA: &str = "x-toolgate-subject";

/// Longest subject accepted, in bytes.
pub const MAX_SUBJECT_LEN: usize = 256;

/// The key prefix of subjects named by a static-token caller.
const TOKEN_PREFIX: &str = "token:";
/// The key prefix of subjects a JWT names (then the issuer, a space, the id).
const JWT_PREFIX: &str = "jwt:";
/// The key prefix of subjects a client certificate names (then its trust
/// domain, a space, the id).
const CERT_PREFIX: &str = "cert:";
/// The key prefix of subjects an approver token names.
const APPROVER_PREFIX: &str = "approver:";

/// How the caller that names a subject authenticated: the namespace of
/// the subject's [key](Subject::key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace<'a> {
    /// A static token of the tenant (`x-toolgate-subject` names the id).
    Token,
    /// A JWT of this issuer (`iss`); its subject expression names the id.
    Jwt(&'a str),
    /// A client certificate whose SPIFFE ID is of this trust domain (empty
    /// without a SPIFFE ID); its `callers.mtls` entry names the id.
    Certificate(&'a str),
    /// An approver token of the tenant (one that decides call approvals,
    /// and reaches nothing else).
    Approver,
}

impl<'a> Namespace<'a> {
    /// Parses the namespace as written on the command line (`toolgate
    /// state migrate-subjects --as`, for rows stored before subject keys,
    /// which no certificate caller named): `token`, or `jwt:` and the issuer.
    ///
    /// # Errors
    /// Neither form, or an empty issuer.
    pub fn parse(text: &'a str) -> Result<Self, &'static str> {
        match text.strip_prefix(JWT_PREFIX) {
            Some("") => Err("`jwt:` needs the issuer after it (`jwt:https://issuer.example`)"),
            Some(issuer) => Ok(Namespace::Jwt(issuer)),
            None if text == "token" => Ok(Namespace::Token),
            None => Err("give `token` or `jwt:<issuer>`"),
        }
    }
}

/// The end user (or workload) a call acts for, and who vouched for it:
/// the `x-toolgate-subject` metadata of a static-token caller (an opaque
/// id trusted because the tenant's token is), or the subject a JWT's
/// issuer names. No subject means the tenant itself. Per-user upstream
/// credentials are kept per (tenant, [`Subject::key`], server); one
/// subject's never serves another, nor a subject of the same id that
/// another kind of caller or another issuer vouched for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    /// The id as named (`None`: the tenant itself).
    id: Option<Arc<str>>,
    /// The namespaced key (empty for the tenant itself).
    key: Arc<str>,
}

impl Default for Subject {
    fn default() -> Self {
        Self::tenant()
    }
}

impl Subject {
    /// The tenant itself (no end user).
    pub fn tenant() -> Self {
        Self {
            id: None,
            key: Arc::from(""),
        }
    }

    /// The subject `id`, vouched for by a caller that authenticated this
    /// way.
    ///
    /// # Errors
    /// The id is empty, longer than [`MAX_SUBJECT_LEN`] bytes, or has a
    /// byte outside visible ASCII (`!` to `~`).
    pub fn named(how: Namespace<'_>, id: &str) -> Result<Self, &'static str> {
        check_id(id)?;
        let key = match how {
            Namespace::Token => format!("{TOKEN_PREFIX}{id}"),
            Namespace::Jwt(issuer) => format!("{JWT_PREFIX}{issuer} {id}"),
            Namespace::Certificate(domain) => format!("{CERT_PREFIX}{domain} {id}"),
            Namespace::Approver => format!("{APPROVER_PREFIX}{id}"),
        };
        Ok(Self {
            id: Some(Arc::from(id)),
            key: Arc::from(key),
        })
    }

    /// The subject's id as named (by the header or the JWT); `None` for
    /// the tenant itself. Not a key: two callers may name the same id.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The key the subject's credentials, sessions and consents are kept
    /// under: `""` for the tenant itself, `token:<id>` for a subject a
    /// static token named, `jwt:<issuer> <id>` for one a JWT named,
    /// `cert:<trust domain> <id>` for one a client certificate named,
    /// `approver:<id>` for one an approver token named.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// [`Subject::key`], shared (a map keyed by subjects takes it without
    /// copying the text).
    pub fn shared_key(&self) -> Arc<str> {
        self.key.clone()
    }

    /// Whether a stored subject `key` has the form [`Subject::key`] gives
    /// (the tenant's own `""` included); a bare id stored by a release
    /// before subject keys does not (unless it happens to start with
    /// `token:`, which a static token could name then as now).
    pub fn is_key(key: &str) -> bool {
        key.is_empty()
            || key
                .strip_prefix(TOKEN_PREFIX)
                .is_some_and(|id| check_id(id).is_ok())
            || key
                .strip_prefix(JWT_PREFIX)
                .and_then(|rest| rest.rsplit_once(' '))
                .is_some_and(|(issuer, id)| !issuer.is_empty() && check_id(id).is_ok())
            || key
                .strip_prefix(CERT_PREFIX)
                .and_then(|rest| rest.split_once(' '))
                .is_some_and(|(_, id)| check_id(id).is_ok())
            || key
                .strip_prefix(APPROVER_PREFIX)
                .is_some_and(|id| check_id(id).is_ok())
    }

    /// The subject id `x-toolgate-subject` names in request metadata.
    ///
    /// # Errors
    /// The metadata is present but not a valid subject id.
    pub fn from_metadata(
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Option<&str>, &'static str> {
        Self::from_headers(metadata.as_ref())
    }

    /// The subject id `x-toolgate-subject` names in request headers
    /// (`None` when absent). Only the caller's credential says whose it
    /// is ([`Subject::named`]).
    ///
    /// # Errors
    /// The header is present but not a valid subject id.
    pub fn from_headers(headers: &http::HeaderMap) -> Result<Option<&str>, &'static str> {
        match headers.get(SUBJECT_METADATA) {
            None => Ok(None),
            Some(value) => {
                let id = value
                    .to_str()
                    .map_err(|_| "the x-toolgate-subject metadata must be visible ASCII")?;
                check_id(id)?;
                Ok(Some(id))
            }
        }
    }
}

/// Whether `id` may name a subject.
fn check_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() {
        return Err("the x-toolgate-subject metadata is empty");
    }
    if id.len() > MAX_SUBJECT_LEN {
        return Err("the x-toolgate-subject metadata is longer than 256 bytes");
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "the x-toolgate-subject metadata must be visible ASCII (no spaces or control characters)",
        );
    }
    Ok(())
}

/// Who is calling, as proven by its credential: put into the request
/// extensions next to the tenant and the [`Subject`], for policy and
/// audit. Never holds the credential itself.
#[derive(Debug, Clone)]
pub struct Caller {
    /// How the caller proved who it is.
    pub identity: CallerIdentity,
    /// The verified claims of a JWT caller; an empty object for a static
    /// token.
    pub claims: Arc<serde_json::Value>,
}

impl Caller {
    /// The namespace of the subjects this caller names.
    pub fn namespace(&self) -> Namespace<'_> {
        match &self.identity {
            CallerIdentity::Token { .. } => Namespace::Token,
            CallerIdentity::Jwt { issuer, .. } => Namespace::Jwt(issuer),
            CallerIdentity::Certificate { trust_domain, .. } => {
                Namespace::Certificate(trust_domain)
            }
            CallerIdentity::ApproverToken { .. } => Namespace::Approver,
        }
    }

    /// A caller with a static token: `tokens[index]` of its tenant.
    pub fn static_token(index: usize) -> Self {
        Self {
            identity: CallerIdentity::Token { index },
            claims: Arc::new(serde_json::Value::Object(serde_json::Map::new())),
        }
    }

    /// A caller with the approver token named `name` of its tenant (empty
    /// claims).
    pub fn approver_token(name: &str) -> Self {
        Self {
            identity: CallerIdentity::ApproverToken {
                name: name.to_owned(),
            },
            claims: Arc::new(serde_json::Value::Object(serde_json::Map::new())),
        }
    }
}

/// How a caller proved who it is (never the credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerIdentity {
    /// A static bearer token: its position in the tenant's `tokens`.
    Token {
        /// The index in `tenants[].tokens`.
        index: usize,
    },
    /// A JWT from a configured issuer.
    Jwt {
        /// The `iss` claim.
        issuer: String,
        /// The `sub` claim.
        subject: String,
    },
    /// A client certificate the gRPC port verified, matched by a
    /// `callers.mtls` entry.
    Certificate {
        /// The trust domain of its SPIFFE ID (empty without one).
        trust_domain: String,
        /// Its SPIFFE ID, else its subject DN (RFC 4514).
        id: String,
        /// Lowercase hex SHA-256 of the certificate (DER).
        sha256: String,
    },
    /// An approver token of the tenant
    /// (`tenants[].call_approvals.approver_tokens`): it decides call
    /// approvals, and calls nothing.
    ApproverToken {
        /// The token's configured name.
        name: String,
    },
}

impl std::fmt::Display for CallerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallerIdentity::Token { index } => write!(f, "token[{index}]"),
            CallerIdentity::Jwt { issuer, subject } => write!(f, "jwt {issuer} {subject}"),
            CallerIdentity::Certificate { id, sha256, .. } => {
                write!(f, "cert {id} sha256:{sha256}")
            }
            CallerIdentity::ApproverToken { name } => write!(f, "approver_token {name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_bounded_visible_ascii() {
        let named = |id: &str| Subject::named(Namespace::Token, id);
        assert_eq!(
            named("user-42@example").unwrap().id(),
            Some("user-42@example")
        );
        assert!(named("").is_err());
        assert!(named("a b").is_err());
        assert!(named(&"x".repeat(257)).is_err());
        assert!(named(&"x".repeat(256)).is_ok());
        assert_eq!(Subject::tenant().key(), "");
        assert_eq!(Subject::tenant().id(), None);
    }

    #[test]
    fn keys_say_who_vouched_for_the_subject() {
        let worker = "system:serviceaccount:acme:worker";
        let by_token = Subject::named(Namespace::Token, worker).unwrap();
        let by_k8s =
            Subject::named(Namespace::Jwt("https://kubernetes.default.svc"), worker).unwrap();
        let by_other = Subject::named(Namespace::Jwt("https://other.example"), worker).unwrap();
        assert_eq!(by_token.key(), "token:system:serviceaccount:acme:worker");
        assert_eq!(
            by_k8s.key(),
            "jwt:https://kubernetes.default.svc system:serviceaccount:acme:worker"
        );
        assert_eq!(by_token.id(), by_k8s.id());
        assert_ne!(by_token, by_k8s);
        assert_ne!(by_k8s.key(), by_other.key());
        // An issuer that is another's prefix plus `:` does not make keys
        // meet (the id has no space; the issuer ends at the last one).
        let a = Subject::named(Namespace::Jwt("https://a.example"), "8443:x").unwrap();
        let b = Subject::named(Namespace::Jwt("https://a.example:8443"), "x").unwrap();
        assert_ne!(a.key(), b.key());
        // Nothing a caller names is the tenant itself.
        assert!(!by_token.key().is_empty());
    }

    #[test]
    fn stored_keys_are_told_from_bare_ids() {
        for key in [
            "",
            "token:alice",
            "jwt:https://issuer.example alice",
            "jwt:an issuer with spaces alice",
            "cert:cluster.local spiffe://cluster.local/ns/a/sa/b",
            "cert: CN=worker",
            "approver:alice",
        ] {
            assert!(Subject::is_key(key), "{key}");
        }
        for bare in [
            "alice",
            "system:serviceaccount:acme:worker",
            "jwt:x",
            "token:",
            "jwt: alice",
            "cert:cluster.local",
            "cert:a b c",
            "approver:",
            "approver:a b",
        ] {
            assert!(!Subject::is_key(bare), "{bare}");
        }
    }

    #[test]
    fn namespaces_parse_from_the_command_line() {
        assert_eq!(Namespace::parse("token"), Ok(Namespace::Token));
        assert_eq!(
            Namespace::parse("jwt:https://issuer.example"),
            Ok(Namespace::Jwt("https://issuer.example"))
        );
        assert!(Namespace::parse("jwt:").is_err());
        assert!(Namespace::parse("cert:cluster.local").is_err());
        assert!(Namespace::parse("tokens").is_err());
    }

    #[test]
    fn approver_tokens_name_subjects_of_their_own() {
        let approver = Caller::approver_token("finance");
        assert_eq!(approver.namespace(), Namespace::Approver);
        assert_eq!(approver.identity.to_string(), "approver_token finance");
        assert_eq!(approver.claims.as_object().map(|c| c.len()), Some(0));
        let alice = Subject::named(approver.namespace(), "alice").unwrap();
        assert_eq!(alice.key(), "approver:alice");
        assert_ne!(
            alice.key(),
            Subject::named(Namespace::Token, "alice").unwrap().key()
        );
    }
}
