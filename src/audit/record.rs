//! The audit record (`Record`, one JSON line) and its parts, with the
//! helpers that fill it: times, durations, status code names, the outcome of
//! an error, an authorization event's record. Knows nothing of where records
//! are written.

use std::time::{Duration, SystemTime};

use super::chain::ChainMark;
use super::digest::DigestKey;
use crate::config::AuditArguments;
use crate::credentials::Redactor;
use serde::{Deserialize, Serialize};

/// The version of the record schema (`"v"` in every record). Version 2:
/// the arguments' digest is an HMAC (`arguments.hmac_sha256`, with
/// `arguments.key_id`) instead of a plain SHA-256 (`arguments.sha256`).
/// Version 3: records of kind `input` (questions handed to a worker, its
/// answers), with `round` and `input`. Version 4: records of
/// `ReadResource`, `GetPrompt`, `Complete` and `WatchResource`, with `uri`,
/// `prompt`, `uri_template` and `bytes`. Version 5: records of kind `admin`
/// (changes made through the admin API), with `secret`, `old_version`,
/// `new_version` and the caller kind `admin_token`. Version 6: the hash
/// chain: every record has `seq` and (but for an unlinked start) `prev`,
/// and the first record of each file `chain`. Version 7: `guards` (what
/// each guard did in a call) and, for a tool call a guard checked, `bytes`
/// (the size of what was handed out: a replacement's when a guard replaced
/// the result). Version 8: `idempotency` and `call_id` (calls with an
/// idempotency key), `cache` (the result cache), and `sent` false for a
/// call answered without reaching the server (a replay, a cache hit).
/// Within version 8 (a field added, no meaning changed, as the schema's
/// rules allow): records of `GetSkill`, with `skill` (and `uri`: the
/// skill's `SKILL.md`).
pub const SCHEMA_VERSION: u32 = 8;

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// An `InvokeTool` or `InvokeToolStream` call that reached the service
    /// (whatever became of it: served, refused by policy or limits,
    /// failed, cancelled).
    Call,
    /// A ToolGateway RPC the authentication layer refused (no tenant).
    Refusal,
    /// An upstream OAuth authorization event of a (tenant, subject,
    /// server).
    Authorization,
    /// A round of a server's questions handed to a call's worker
    /// (`event: input_asked`), or the worker's answers to one
    /// (`input_answered`).
    Input,
    /// An event of a task (SEP-2663) a worker follows: `task_created`,
    /// `task_updated`, `task_completed`, `task_failed`, `task_cancelled`.
    Task,
    /// An event of a call approval (a tool call a policy rule held for a
    /// person's decision): `call_approval_requested`,
    /// `call_approval_approved`, `call_approval_denied` (with who decided
    /// and why), `call_approval_expired`, `call_approval_spent` (by which
    /// call: its trace id), `call_approval_returned` (the call that spent
    /// it sent nothing), `call_approval_refused` (a call named it and could
    /// not use it, and why).
    CallApproval,
    /// A change made through the admin API (`PutTenant`, `DeleteTenant`,
    /// `PutSecret`, `DeleteSecret`): who, which tenant (and secret), the
    /// versions before and after; never a spec or a value.
    Admin,
}

/// How a call or event ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The tool ran and returned a result.
    Ok,
    /// The tool ran and reported an error (`isError`): still an OK RPC.
    ToolError,
    /// The gateway refused the call before sending anything upstream
    /// (credential, subject, policy, approval, limits, unknown tool, bad
    /// arguments, pins, consent needed).
    Refused,
    /// The call failed: nothing could be sent (server down, draining, state
    /// store down, audit sink down) or the upstream failed (`sent` says
    /// which).
    Failed,
    /// The caller went away before the call ended; the tool may have acted.
    Cancelled,
}

/// How the caller proved who it is: never the credential itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallerRecord {
    /// A static token: its position in `tenants[].tokens`.
    Token {
        /// The index in the tenant's `tokens`.
        token_index: usize,
    },
    /// An admin API caller's token: its position in `admin.tokens`.
    AdminToken {
        /// The index in `admin.tokens`.
        admin_token_index: usize,
    },
    /// A JWT: its issuer and subject.
    Jwt {
        /// The `iss` claim.
        issuer: String,
        /// The `sub` claim.
        subject: String,
    },
    /// A client certificate (`callers.mtls`): its SPIFFE ID or subject
    /// DN, and its fingerprint (never the certificate).
    Cert {
        /// The trust domain of its SPIFFE ID (empty without one).
        trust_domain: String,
        /// Its SPIFFE ID, else its subject DN (RFC 4514).
        id: String,
        /// Lowercase hex SHA-256 of the certificate (DER).
        sha256: String,
    },
    /// An approver token of the tenant
    /// (`tenants[].call_approvals.approver_tokens`): its name.
    ApproverToken {
        /// The token's configured name.
        name: String,
    },
}

impl From<&crate::callers::CallerIdentity> for CallerRecord {
    fn from(identity: &crate::callers::CallerIdentity) -> Self {
        match identity {
            crate::callers::CallerIdentity::Token { index } => CallerRecord::Token {
                token_index: *index,
            },
            crate::callers::CallerIdentity::Jwt { issuer, subject } => CallerRecord::Jwt {
                issuer: issuer.clone(),
                subject: subject.clone(),
            },
            crate::callers::CallerIdentity::Certificate {
                trust_domain,
                id,
                sha256,
            } => CallerRecord::Cert {
                trust_domain: trust_domain.clone(),
                id: id.clone(),
                sha256: sha256.clone(),
            },
            crate::callers::CallerIdentity::ApproverToken { name } => {
                CallerRecord::ApproverToken { name: name.clone() }
            }
        }
    }
}

/// What a record keeps of a call's arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArgumentsRecord {
    /// Lowercase hex HMAC-SHA-256 of `arguments_json` exactly as received
    /// (of the empty string when none were sent), keyed with
    /// `audit.digest_key`.
    pub hmac_sha256: String,
    /// The id of the key `hmac_sha256` is keyed with (16 hex characters;
    /// the same key has the same id in every process).
    pub key_id: String,
    /// The size of `arguments_json` in bytes.
    pub bytes: usize,
    /// `arguments: full` only: the arguments, every configured credential
    /// value replaced by `[redacted]`; a JSON string (redacted too) when
    /// they are not valid JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

impl ArgumentsRecord {
    /// The record of `text` in `mode` (`None` in mode `none`), its digest
    /// keyed with `key`; `full` mode redacts with `redactor`.
    pub fn of(
        mode: AuditArguments,
        text: &str,
        key: &DigestKey,
        redactor: &Redactor,
    ) -> Option<Self> {
        let value = match mode {
            AuditArguments::None => return None,
            AuditArguments::Digest => None,
            AuditArguments::Full => {
                let mut value = match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(value) => value,
                    Err(_) => serde_json::Value::String(text.to_owned()),
                };
                redactor.redact_json(&mut value);
                Some(value)
            }
        };
        Some(Self {
            hmac_sha256: key.hmac_hex(text.as_bytes()),
            key_id: key.id().to_owned(),
            bytes: text.len(),
            value,
        })
    }
}

/// What one guard did in a call (`guards` of a call record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardRecord {
    /// The guard's configured name.
    pub guard: String,
    /// `request` or `response`.
    pub phase: String,
    /// `allow`, `deny`, `replace`, `failed_open` or `failed_closed`.
    pub verdict: String,
    /// On the last `replace` of the request phase: what the record keeps of
    /// the arguments sent upstream in place of those received (as
    /// `arguments` keeps those).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<ArgumentsRecord>,
}

/// One question handed to a worker, or its answer, in an `input` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputItem {
    /// The question's id (the server's key).
    pub id: String,
    /// `form`, `url` or `sampling` (`unknown` for an answer to no question
    /// of the round, which is refused).
    pub kind: String,
    /// Answers only: `accept`, `decline` or `cancel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Answers only, with content: what the record keeps of
    /// `content_json`, as of arguments (`audit.arguments`: a keyed digest,
    /// nothing, or the redacted value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<ArgumentsRecord>,
}

/// One audit record: a JSON object on one line. Fields that do not apply
/// are left out (see `docs/governance.md`, "Audit trail", for when each is
/// present).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The schema version ([`SCHEMA_VERSION`]).
    pub v: u32,
    /// The record's place in this replica's chain (1, 2, ...): set by the
    /// writer as it writes the line, never by whoever makes the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Lowercase hex SHA-256 of the line written before this one (as
    /// written, without its newline; in the previous file for a file's
    /// first record); absent only where a chain starts with nothing to link
    /// to. Set by the writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<String>,
    /// On the first record of each file the writer opened: why it opened
    /// it. Set by the writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainMark>,
    /// When the call ended or the event happened: RFC 3339, UTC,
    /// milliseconds (`2025-06-01T12:00:00.123Z`).
    pub time: String,
    /// What the record is about.
    pub kind: RecordKind,
    /// The gRPC method (`InvokeTool`, `InvokeToolStream`, ...) of a call or
    /// refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc: Option<String>,
    /// The caller's tenant (or the event's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The key of the end user the call acted for, which says who vouched
    /// for it (`token:<id>` for `x-toolgate-subject` with a static token,
    /// `jwt:<issuer> <id>` for a JWT's subject expression: the
    /// `callers::Subject::key` its tokens are stored under); absent when the
    /// tenant acted for itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// How the caller proved who it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<CallerRecord>,
    /// The caller's address (`ip:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The tool name the caller asked for (at most 64 characters, then a
    /// note of the length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The server the name resolved to (or whose namespace it is in; the
    /// server a resource RPC named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// `ReadResource`, `WatchResource`: the resource's URI (credentials
    /// redacted; at most 1,024 characters, then a note of the length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// `GetPrompt`, and `Complete` of a prompt's argument: the exposed
    /// prompt name the caller asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// `GetSkill`: the exposed skill name the caller asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// `Complete` of a resource template's argument: the URI template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri_template: Option<String>,
    /// `ReadResource`, `GetPrompt`, and a tool call a guard checked: the
    /// size of what was handed out (the encoded response, in bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The definition hash of the tool that was resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition_hash: Option<String>,
    /// What the record keeps of the arguments (absent with `arguments:
    /// none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<ArgumentsRecord>,
    /// Calls a guard checked: what each guard did, in order (request phase
    /// first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guards: Option<Vec<GuardRecord>>,
    /// The authorization event (`consent_started`, `consent_completed`,
    /// `consent_failed`, `authorization_required`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// `input` records: the round of questions (1 for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
    /// `input` records: the questions asked, or the answers given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Vec<InputItem>>,
    /// `call_approval` records, and the record of a call that spent or
    /// asked for one: the approval's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_approval: Option<String>,
    /// The record of a call that carried an idempotency key: what the key
    /// did (`claimed`: the call ran under it; `replayed`: the recorded
    /// response answered, nothing was sent; `in_progress`, `in_doubt`,
    /// `reused`, `not_kept`, `limit`: refused, nothing sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<String>,
    /// With `idempotency`: the id of the call that claimed the key (this
    /// call's own when `claimed`), the same in both records of a replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// `call_approval` records: the policy rule that asked for approval
    /// (`tenants[0].policy[2]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// `call_approval` records of a decision: the approver's reason (at
    /// most 1024 characters, redacted like arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A task's record: the first 16 hex digits of the SHA-256 of its
    /// task id (never the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// `admin` records of `PutSecret` and `DeleteSecret`: the secret's
    /// name (never its value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// `admin` records: the tenant's version before the change (absent for
    /// a create, or a secret of a tenant not stored yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_version: Option<i64>,
    /// `admin` records: the tenant's version after the change (absent for
    /// a delete); for `PutSecret`, the tenant's new version when it is
    /// stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_version: Option<i64>,
    /// A summary of refusals (`event: refusals_summarized`): how many
    /// refusals it stands for (none of them written one by one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// A summary of refusals: when the first it counts happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_time: Option<String>,
    /// A summary of refusals: when the last it counts happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_time: Option<String>,
    /// A summary of refusals: how many of each reason (the `ErrorInfo`
    /// reason, else the status code's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<std::collections::BTreeMap<String, u64>>,
    /// How it ended.
    pub outcome: Outcome,
    /// Whether the request was handed to the upstream server (calls only):
    /// when true, the tool may have acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<bool>,
    /// Calls whose results the result cache keeps: `hit` (answered from
    /// the cache; nothing was sent, `sent: false`) or `stored` (the
    /// server's result was kept for later calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// The gRPC status code name answered (`OK`, `PERMISSION_DENIED`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The `ErrorInfo` reason of an error status, or why an authorization
    /// event failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How long the call took, in milliseconds (microsecond precision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// The W3C trace id of the call (the caller's `traceparent`, or the
    /// gateway's own span when trace export is on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The replica that wrote the record (`POD_NAME`, else `HOSTNAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

impl Record {
    /// Marks the record of a call that carried an idempotency key: what
    /// the key did (`claimed`, `replayed`) and the id of the call that
    /// claimed it.
    pub fn keyed(&mut self, what: &str, call_id: &str) {
        self.idempotency = Some(what.to_owned());
        self.call_id = Some(call_id.to_owned());
    }

    /// A record of `kind` and `outcome` at the current time; every other
    /// field empty.
    pub fn new(kind: RecordKind, outcome: Outcome) -> Self {
        Self {
            v: SCHEMA_VERSION,
            seq: None,
            prev: None,
            chain: None,
            time: now(),
            kind,
            rpc: None,
            tenant: None,
            subject: None,
            caller: None,
            peer: None,
            tool: None,
            server: None,
            uri: None,
            prompt: None,
            skill: None,
            uri_template: None,
            bytes: None,
            definition_hash: None,
            arguments: None,
            guards: None,
            event: None,
            round: None,
            input: None,
            call_approval: None,
            idempotency: None,
            call_id: None,
            rule: None,
            note: None,
            task: None,
            secret: None,
            old_version: None,
            new_version: None,
            count: None,
            first_time: None,
            last_time: None,
            reasons: None,
            outcome,
            sent: None,
            cache: None,
            code: None,
            reason: None,
            duration_ms: None,
            trace_id: None,
            replica: None,
        }
    }
}

/// The current time as RFC 3339, UTC, with milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// A duration in milliseconds, to the microsecond.
pub fn millis(duration: Duration) -> f64 {
    (duration.as_micros() as f64) / 1000.0
}

/// The canonical name of a gRPC status code (`PERMISSION_DENIED`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The outcome of a call that ended with `code`: an error with nothing
/// sent upstream is a refusal when its code says the request itself was
/// refused (credential, permission, argument, name, limit, precondition),
/// else a failure.
pub fn error_outcome(code: tonic::Code, sent: bool) -> Outcome {
    use tonic::Code;
    let refusal = matches!(
        code,
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::NotFound
            | Code::ResourceExhausted
            | Code::FailedPrecondition
    );
    if refusal && !sent {
        Outcome::Refused
    } else {
        Outcome::Failed
    }
}

/// A record of an authorization `event`, if it is one that is audited.
pub(super) fn authorization_record(
    tenant: &str,
    subject: &str,
    server: &str,
    event: &str,
    reason: Option<&str>,
) -> Option<Record> {
    let outcome = match event {
        "consent_started" | "authorization_required" | "consent_rejected" => Outcome::Refused,
        "consent_completed" | "consent_held" => Outcome::Ok,
        "consent_failed" => Outcome::Failed,
        // Issue 23, delegation: the caller's JWT exchanged, or not.
        "token_exchanged" | "identity_assertion_obtained" => Outcome::Ok,
        "token_exchange_refused" | "identity_assertion_refused" => Outcome::Refused,
        "token_exchange_failed" | "identity_assertion_failed" => Outcome::Failed,
        _ => return None,
    };
    let mut record = Record::new(RecordKind::Authorization, outcome);
    record.tenant = (!tenant.is_empty()).then(|| tenant.to_owned());
    record.subject = (!subject.is_empty()).then(|| subject.to_owned());
    record.server = (!server.is_empty()).then(|| server.to_owned());
    record.event = Some(event.to_owned());
    record.reason = reason.map(str::to_owned);
    Some(record)
}

/// `record` as one JSON line, newline included.
pub(super) fn serialise(record: &Record) -> Vec<u8> {
    let mut line = serde_json::to_vec(record).expect("a record always serialises");
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tool: &str) -> Record {
        let mut record = Record::new(RecordKind::Call, Outcome::Ok);
        record.tool = Some(tool.to_owned());
        record
    }

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        let time = now();
        assert_eq!(time.len(), "2025-06-01T12:00:00.123Z".len(), "{time}");
        assert!(time.ends_with('Z') && time.as_bytes()[19] == b'.', "{time}");
    }

    #[test]
    fn digests_are_keyed_and_of_the_text_as_received() {
        let key = DigestKey::new(None);
        let record = ArgumentsRecord::of(
            AuditArguments::Digest,
            "{\"a\": 1}",
            &key,
            &Redactor::default(),
        )
        .unwrap();
        assert_eq!(record.hmac_sha256, key.hmac_hex(b"{\"a\": 1}"));
        assert_eq!(record.key_id, key.id());
        assert_eq!(record.bytes, 8);
        assert!(record.value.is_none());
        assert!(
            ArgumentsRecord::of(AuditArguments::None, "{}", &key, &Redactor::default()).is_none()
        );
        let redactor = Redactor::new(["very-secret-value"]);
        let full = ArgumentsRecord::of(
            AuditArguments::Full,
            "{\"q\": \"x very-secret-value\"}",
            &key,
            &redactor,
        )
        .unwrap();
        assert_eq!(full.value, Some(serde_json::json!({"q": "x [redacted]"})));
        let text = ArgumentsRecord::of(
            AuditArguments::Full,
            "not json very-secret-value",
            &key,
            &redactor,
        )
        .unwrap();
        assert_eq!(text.value, Some(serde_json::json!("not json [redacted]")));
    }

    #[test]
    fn absent_fields_are_left_out_and_read_back() {
        let mut record = call("t__echo");
        record.caller = Some(CallerRecord::Token { token_index: 2 });
        let text = String::from_utf8(serialise(&record)).unwrap();
        assert!(text.ends_with('\n') && !text.trim_end().contains('\n'));
        assert!(!text.contains("null"), "{text}");
        assert!(
            text.contains(r#""caller":{"kind":"token","token_index":2}"#),
            "{text}"
        );
        let back: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn callers_are_named_never_their_credential() {
        let jwt = crate::callers::CallerIdentity::Jwt {
            issuer: "https://issuer.example".to_owned(),
            subject: "system:serviceaccount:acme:worker".to_owned(),
        };
        let mut record = call("t__echo");
        record.caller = Some(CallerRecord::from(&jwt));
        let text = String::from_utf8(serialise(&record)).unwrap();
        assert!(
            text.contains(
                r#""caller":{"kind":"jwt","issuer":"https://issuer.example","subject":"system:serviceaccount:acme:worker"}"#
            ),
            "{text}"
        );
        let cert = crate::callers::CallerIdentity::Certificate {
            trust_domain: "cluster.local".to_owned(),
            id: "spiffe://cluster.local/ns/acme/sa/worker".to_owned(),
            sha256: "ab".repeat(32),
        };
        record.caller = Some(CallerRecord::from(&cert));
        let text = String::from_utf8(serialise(&record)).unwrap();
        let expected = format!(
            r#""caller":{{"kind":"cert","trust_domain":"cluster.local","id":"spiffe://cluster.local/ns/acme/sa/worker","sha256":"{}"}}"#,
            "ab".repeat(32)
        );
        assert!(text.contains(&expected), "{text}");
    }

    #[test]
    fn authorization_events_that_are_not_decisions_are_not_recorded() {
        assert!(authorization_record("t", "u", "s", "token_refreshed", None).is_none());
        let record = authorization_record("t", "", "s", "consent_completed", None).unwrap();
        assert_eq!(record.outcome, Outcome::Ok);
        assert_eq!(record.subject, None);
    }
}
