//! The `request_state` of a unary or stream call's round of questions
//! (2026-07-28 servers): toolgate's own, sealed around the server's.
//!
//! When a server answers `input_required`, the worker gets the questions
//! and a `request_state`: `tgs1.` and the base64url (no padding) of a
//! value sealed with the state store's [`KeyRing`] (AES-256-GCM). Inside,
//! in JSON: whose call it is (tenant, subject), which call (server,
//! upstream tool, exposed name, definition hash, the arguments' SHA-256),
//! the questions asked (ids and kinds), the round, the expiry, a random
//! nonce and the server's own `requestState`. The worker can neither read
//! nor change it; its retry (same name and arguments, with its answers)
//! may reach any replica holding the key. Every check runs before anything
//! is sent upstream, each failure with its own reason. A round is answered
//! once: the nonce is claimed ([`FirstUse`](crate::state::FirstUse)) before
//! the answers go upstream, and a second answer is refused
//! (`REQUEST_STATE_USED`).

// Roots are deprecated by SEP-2577 but still part of 2026-07-28 rounds;
// toolgate answers them itself.
#![allow(deprecated)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use rmcp::model::{InputRequest, InputRequiredResult, InputResponses, JsonObject, ListRootsResult};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::calls::error::{CallError, StateRefusal, Target};
use crate::config::Root;
use crate::state::{KeyRing, OpenError};
use crate::upstream::{Answer, Asked, InputKinds, Question, QuestionKind};

/// The start of every state toolgate hands out (format 1).
const PREFIX: &str = "tgs1.";

/// The version of the sealed JSON (2: with a nonce, answered once).
const VERSION: u32 = 2;

/// The largest `requestState` of a server toolgate carries.
pub(crate) const MAX_SERVER_STATE: usize = 64 * 1024;

/// The most questions one round may ask.
const MAX_QUESTIONS: usize = super::answers::MAX_ANSWERS;

/// The longest question id (a server's key) toolgate carries.
const MAX_ID: usize = 128;

/// What a question was, as the state remembers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// A form.
    Form,
    /// A URL to open.
    Url,
    /// A completion.
    Sampling,
    /// `roots/list`: answered by toolgate from `servers[].roots`.
    Roots,
}

impl Kind {
    fn of(question: &Question) -> Self {
        match question.kind() {
            QuestionKind::Form => Self::Form,
            QuestionKind::Url => Self::Url,
            QuestionKind::Sampling => Self::Sampling,
        }
    }

    /// The kind's name in errors, metrics and audit records.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Form => "form",
            Self::Url => "url",
            Self::Sampling => "sampling",
            Self::Roots => "roots",
        }
    }

    /// A question of this kind, for checking an answer's shape (the
    /// server checks the values against its own schema).
    fn question(self) -> Option<Question> {
        Some(match self {
            Self::Form => Question::Form {
                message: String::new(),
                schema: serde_json::Value::Null,
            },
            Self::Url => Question::Url {
                message: String::new(),
                url: String::new(),
                elicitation_id: String::new(),
            },
            Self::Sampling => Question::Sampling {
                params: serde_json::Value::Null,
            },
            Self::Roots => return None,
        })
    }
}

/// One question of a round, as sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AskedId {
    /// The server's key.
    pub(crate) id: String,
    /// Its kind.
    pub(crate) kind: Kind,
}

/// The call a state is for: everything it is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binding {
    /// What the request is: a tool call, a resource read, a prompt get.
    pub(crate) method: Method,
    /// The caller's tenant.
    pub(crate) tenant: String,
    /// The subject's key (`""` for the tenant itself).
    pub(crate) subject: String,
    /// The tool's server.
    pub(crate) server: String,
    /// The tool's upstream name.
    pub(crate) upstream_tool: String,
    /// The name it was called by.
    pub(crate) exposed_name: String,
    /// The tool's definition hash.
    pub(crate) definition_hash: String,
    /// SHA-256 (hex) of the arguments ([`arguments_digest`]).
    pub(crate) args_sha256: String,
}

/// The request a state is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Method {
    /// `tools/call`: `upstream_tool` and `exposed_name` are the tool's.
    #[default]
    Call,
    /// `resources/read`: `upstream_tool` and `exposed_name` are the URI.
    Read,
    /// `prompts/get`: the prompt's upstream and exposed names.
    GetPrompt,
}

impl Method {
    /// As sealed (empty for a tool call, as before other requests had
    /// rounds).
    fn as_str(self) -> &'static str {
        match self {
            Method::Call => "",
            Method::Read => "resources/read",
            Method::GetPrompt => "prompts/get",
        }
    }
}

impl Binding {
    /// What the request named, for its errors.
    pub(crate) fn target(&self) -> Target {
        match self.method {
            Method::Call => self.exposed_name.clone().into(),
            Method::Read => Target::resource(self.exposed_name.clone()),
            Method::GetPrompt => Target::prompt(self.exposed_name.clone()),
        }
    }
}

/// The sealed content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Sealed {
    v: u32,
    /// [`Method::as_str`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    method: String,
    tenant: String,
    subject: String,
    server: String,
    upstream_tool: String,
    exposed_name: String,
    definition_hash: String,
    args_sha256: String,
    asked: Vec<AskedId>,
    round: u32,
    exp_ms: u64,
    /// Random, hex: what a use of the state claims.
    nonce: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    server_state: Option<String>,
}

/// A round of questions for the worker.
#[derive(Debug)]
pub(crate) struct Round {
    /// The questions for the worker (roots left out).
    pub(crate) asked: Vec<Asked>,
    /// Every request of the round, as sealed.
    pub(crate) ids: Vec<AskedId>,
    /// The server's own state.
    pub(crate) server_state: Option<String>,
}

/// An opened and checked state: what the retry sends.
#[derive(Debug)]
pub(crate) struct Retry {
    /// The round the answers are for (1 for the first).
    pub(crate) round: u32,
    /// The questions the answers are for.
    pub(crate) asked: Vec<AskedId>,
    /// The server's own state, to echo.
    pub(crate) server_state: Option<String>,
    /// The state's nonce, claimed once before the answers are sent.
    pub(crate) nonce: String,
    /// When the state expires (Unix milliseconds): how long the claim is
    /// kept.
    pub(crate) exp_ms: u64,
}

/// A fresh nonce: 16 random bytes, hex.
fn nonce() -> String {
    use aes_gcm::aead::OsRng;
    use aes_gcm::aead::rand_core::RngCore as _;
    let mut bytes = [0u8; 16];
    OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// SHA-256 (hex) of `arguments` in canonical form: object keys sorted,
/// no whitespace, so that the same arguments written differently match.
pub(crate) fn arguments_digest(arguments: &JsonObject) -> String {
    let mut text = Vec::new();
    canonical_object(arguments, &mut text);
    hex::encode(Sha256::digest(&text))
}

/// An object in canonical form (keys sorted), without copying it.
fn canonical_object(map: &JsonObject, out: &mut Vec<u8>) {
    let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key).expect("a string serializes into memory");
        out.push(b':');
        canonical(value, out);
    }
    out.push(b'}');
}

fn canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    match value {
        serde_json::Value::Object(map) => canonical_object(map, out),
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

/// The associated data of every state: its use, so that no other sealed
/// value of the store opens as one.
fn aad() -> Vec<u8> {
    crate::state::aad("request-state", &[])
}

/// Milliseconds since the Unix epoch.
fn now_ms(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The questions of an `input_required` result: the worker's (in the
/// server's order), and every request with its kind. Roots are kept for
/// toolgate to answer.
///
/// # Errors
/// A question of a kind the call does not accept (`INPUT_NOT_ACCEPTED`,
/// naming every such kind), or a round toolgate cannot carry (too many
/// questions, an id too long, an unknown kind, a server state over
/// [`MAX_SERVER_STATE`]): the server's protocol error.
pub(crate) fn round(
    result: InputRequiredResult,
    accepts: InputKinds,
    not_accepted: impl FnOnce(Vec<&'static str>) -> CallError,
    protocol: impl Fn(String) -> CallError,
) -> Result<Round, CallError> {
    let requests = result.input_requests.unwrap_or_default();
    if requests.len() > MAX_QUESTIONS {
        return Err(protocol(format!(
            "an input_required result with {} requests, over {MAX_QUESTIONS}",
            requests.len()
        )));
    }
    if let Some(state) = &result.request_state
        && state.len() > MAX_SERVER_STATE
    {
        return Err(protocol(format!(
            "a requestState of {} bytes, over {MAX_SERVER_STATE}",
            state.len()
        )));
    }
    let mut asked = Vec::new();
    let mut ids = Vec::new();
    let mut refused: Vec<&'static str> = Vec::new();
    for (id, request) in requests {
        if id.is_empty() || id.len() > MAX_ID {
            return Err(protocol(format!(
                "an input request key of {} bytes (1 to {MAX_ID})",
                id.len()
            )));
        }
        let kind = match (&request, Question::from_input_request(&request)) {
            (InputRequest::ListRoots(_), _) => Kind::Roots,
            (_, Some(question)) => {
                let kind = Kind::of(&question);
                if !accepts.accepts(&question) && !refused.contains(&kind.as_str()) {
                    refused.push(kind.as_str());
                }
                asked.push(Asked {
                    id: id.clone(),
                    question,
                });
                kind
            }
            (_, None) => {
                return Err(protocol(
                    "an input request of a kind toolgate does not know".into(),
                ));
            }
        };
        ids.push(AskedId { id, kind });
    }
    if !refused.is_empty() {
        return Err(not_accepted(refused));
    }
    if asked.is_empty() {
        // Rounds of roots only (or of the server's state only) are
        // retried by the session itself; one reaching here cannot be
        // put to the worker.
        return Err(protocol(
            "an input_required result with no question for the worker".into(),
        ));
    }
    Ok(Round {
        asked,
        ids,
        server_state: result.request_state,
    })
}

/// Seals round `round` of the call `binding`, valid for `ttl` from `now`.
pub(crate) fn seal(
    keys: &KeyRing,
    binding: &Binding,
    round: &Round,
    number: u32,
    ttl: Duration,
    now: SystemTime,
) -> String {
    let sealed = Sealed {
        v: VERSION,
        method: binding.method.as_str().to_owned(),
        tenant: binding.tenant.clone(),
        subject: binding.subject.clone(),
        server: binding.server.clone(),
        upstream_tool: binding.upstream_tool.clone(),
        exposed_name: binding.exposed_name.clone(),
        definition_hash: binding.definition_hash.clone(),
        args_sha256: binding.args_sha256.clone(),
        asked: round.ids.clone(),
        round: number,
        exp_ms: now_ms(now).saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
        nonce: nonce(),
        server_state: round.server_state.clone(),
    };
    let json = serde_json::to_vec(&sealed).expect("a state always serialises");
    let bytes = keys.seal(&json, &aad());
    format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// Opens `text` and checks it against the call `binding` at `now`, in
/// this order: a state toolgate made (`REQUEST_STATE_INVALID`), with a
/// key it has (`REQUEST_STATE_KEY_RETIRED`), of this tenant and subject
/// (`REQUEST_STATE_FOREIGN`), for this server, tool and arguments
/// (`REQUEST_STATE_OTHER_CALL`), of this definition
/// (`definition_changed`), not expired (`REQUEST_STATE_EXPIRED`).
///
/// # Errors
/// The first check that fails.
pub(crate) fn open(
    keys: &KeyRing,
    text: &str,
    binding: &Binding,
    now: SystemTime,
    definition_changed: impl FnOnce() -> CallError,
) -> Result<Retry, CallError> {
    let refuse = |refusal, detail: &str| CallError::RequestStateRefused {
        tool: binding.target(),
        refusal,
        detail: detail.to_owned(),
    };
    let invalid = || {
        refuse(
            StateRefusal::Invalid,
            "it is not a request_state this gateway handed out (pass it back unchanged)",
        )
    };
    let bytes = text
        .strip_prefix(PREFIX)
        .and_then(|b| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(b)
                .ok()
        })
        .ok_or_else(invalid)?;
    let plain = keys.open(&bytes, &aad()).map_err(|e| match e {
        OpenError::UnknownKey { .. } => refuse(
            StateRefusal::KeyRetired,
            "it was sealed with a key this gateway does not have (a key rotated out of \
             state.keys, or a replica without shared state.keys): call again without \
             request_state and input_responses to start over",
        ),
        _ => invalid(),
    })?;
    let sealed: Sealed = serde_json::from_slice(&plain).map_err(|_| {
        refuse(
            StateRefusal::Invalid,
            "it is not a request_state of this release (one handed out before an upgrade): \
             call again without request_state and input_responses to start over",
        )
    })?;
    if sealed.v != VERSION {
        return Err(invalid());
    }
    if sealed.tenant != binding.tenant || sealed.subject != binding.subject {
        return Err(refuse(
            StateRefusal::Foreign,
            "it was handed to another tenant or subject",
        ));
    }
    if sealed.method != binding.method.as_str()
        || sealed.server != binding.server
        || sealed.upstream_tool != binding.upstream_tool
        || sealed.exposed_name != binding.exposed_name
    {
        return Err(refuse(
            StateRefusal::OtherCall,
            "it was handed out for another tool: retry the call it came from",
        ));
    }
    if sealed.args_sha256 != binding.args_sha256 {
        return Err(refuse(
            StateRefusal::OtherCall,
            "it was handed out for other arguments: retry with the arguments of the call it came from",
        ));
    }
    if sealed.definition_hash != binding.definition_hash {
        return Err(definition_changed());
    }
    if now_ms(now) >= sealed.exp_ms {
        return Err(refuse(
            StateRefusal::Expired,
            "it expired (servers[].input.state_ttl): call again without request_state and \
             input_responses to start over",
        ));
    }
    Ok(Retry {
        round: sealed.round,
        asked: sealed.asked,
        server_state: sealed.server_state,
        nonce: sealed.nonce,
        exp_ms: sealed.exp_ms,
    })
}

impl Retry {
    /// The `inputResponses` of `answers` to this round's questions, with
    /// toolgate's own answer to every `roots/list` of the round (`roots`).
    ///
    /// # Errors
    /// `INPUT_RESPONSE_INVALID`: an answer to no question of the round, a
    /// question answered twice, content that does not fit its kind.
    pub(crate) fn responses(
        &self,
        answers: &[Answer],
        roots: &[Root],
    ) -> Result<InputResponses, CallError> {
        let invalid = |reason: String| CallError::InputResponseInvalid { reason };
        let mut responses = InputResponses::new();
        for answer in answers {
            let id = crate::callers::quoted(&answer.id);
            let Some(asked) = self.asked.iter().find(|a| a.id == answer.id) else {
                return Err(invalid(format!(
                    "response `{id}` names no question of this round"
                )));
            };
            let Some(question) = asked.kind.question() else {
                return Err(invalid(format!(
                    "response `{id}` answers a roots request, which toolgate answers itself"
                )));
            };
            if responses.contains_key(&answer.id)
                || answers.iter().filter(|a| a.id == answer.id).count() > 1
            {
                return Err(invalid(format!("question `{id}` is answered twice")));
            }
            if let Some(value) = answer
                .to_input_response(&question)
                .map_err(|e| invalid(e.to_string()))?
            {
                responses.insert(answer.id.clone(), value);
            }
        }
        for asked in self.asked.iter().filter(|a| a.kind == Kind::Roots) {
            let listed = ListRootsResult::new(
                roots
                    .iter()
                    .map(|r| {
                        let root = rmcp::model::Root::new(r.uri.clone());
                        match &r.name {
                            Some(name) => root.with_name(name.clone()),
                            None => root,
                        }
                    })
                    .collect(),
            );
            responses.insert(
                asked.id.clone(),
                serde_json::to_value(listed).unwrap_or_default(),
            );
        }
        Ok(responses)
    }

    /// The kinds of the questions the answers name, for metrics and audit.
    pub(crate) fn kind_of(&self, id: &str) -> Option<Kind> {
        self.asked.iter().find(|a| a.id == id).map(|a| a.kind)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::upstream::Action;

    fn binding() -> Binding {
        Binding {
            method: Method::Call,
            tenant: "acme".into(),
            subject: "token:alice".into(),
            server: "py".into(),
            upstream_tool: "book_table".into(),
            exposed_name: "py__book_table".into(),
            definition_hash: "h1".into(),
            args_sha256: arguments_digest(json!({"restaurant": "Chez Rust"}).as_object().unwrap()),
        }
    }

    fn a_round() -> Round {
        Round {
            asked: Vec::new(),
            ids: vec![
                AskedId {
                    id: "q".into(),
                    kind: Kind::Form,
                },
                AskedId {
                    id: "r".into(),
                    kind: Kind::Roots,
                },
            ],
            server_state: Some("v1.server".into()),
        }
    }

    fn changed() -> CallError {
        CallError::InvalidFilter("definition changed".into())
    }

    fn refusal(result: Result<Retry, CallError>) -> String {
        match result.unwrap_err() {
            CallError::RequestStateRefused { refusal, .. } => format!("{refusal:?}"),
            other => format!("{other}"),
        }
    }

    const TTL: Duration = Duration::from_secs(600);

    #[test]
    fn a_state_opens_for_its_own_call_only() {
        let keys = KeyRing::ephemeral();
        let now = SystemTime::now();
        let text = seal(&keys, &binding(), &a_round(), 1, TTL, now);
        assert!(text.starts_with("tgs1."), "{text}");
        assert!(!text.contains("server"), "sealed, not encoded");
        let retry = open(&keys, &text, &binding(), now, changed).expect("opens");
        assert_eq!(retry.round, 1);
        assert_eq!(retry.server_state.as_deref(), Some("v1.server"));
        assert_eq!(retry.asked, a_round().ids);

        let other = |f: fn(&mut Binding)| {
            let mut b = binding();
            f(&mut b);
            refusal(open(&keys, &text, &b, now, changed))
        };
        assert_eq!(other(|b| b.tenant = "other".into()), "Foreign");
        assert_eq!(other(|b| b.subject = String::new()), "Foreign");
        assert_eq!(other(|b| b.server = "py2".into()), "OtherCall");
        assert_eq!(other(|b| b.upstream_tool = "echo".into()), "OtherCall");
        assert_eq!(other(|b| b.args_sha256 = "x".into()), "OtherCall");
        assert_eq!(
            other(|b| b.definition_hash = "h2".into()),
            "invalid filter: definition changed"
        );
        let later = now + TTL;
        assert_eq!(
            refusal(open(&keys, &text, &binding(), later, changed)),
            "Expired"
        );
    }

    #[test]
    fn forged_tampered_and_foreign_keys_are_told_apart() {
        let keys = KeyRing::ephemeral();
        let now = SystemTime::now();
        let text = seal(&keys, &binding(), &a_round(), 1, TTL, now);
        let b = binding();
        for forged in ["", "tgs1.", "tgs1.!!", "v1.abc", &text[5..]] {
            assert_eq!(refusal(open(&keys, forged, &b, now, changed)), "Invalid");
        }
        // One bit of the ciphertext flipped.
        let mut bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&text[5..])
            .unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let tampered = format!(
            "tgs1.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes)
        );
        assert_eq!(refusal(open(&keys, &tampered, &b, now, changed)), "Invalid");
        let elsewhere = KeyRing::ephemeral();
        assert_eq!(
            refusal(open(&elsewhere, &text, &b, now, changed)),
            "KeyRetired"
        );
    }

    fn input_required(value: serde_json::Value) -> InputRequiredResult {
        serde_json::from_value(value).expect("an input_required result")
    }

    fn booking_and_roots() -> InputRequiredResult {
        input_required(json!({
            "resultType": "input_required",
            "inputRequests": {
                "m:ask": {"method": "elicitation/create", "params": {
                    "mode": "form", "message": "Book?",
                    "requestedSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}
                }},
                "m:roots": {"method": "roots/list"},
            },
            "requestState": "v1.server",
        }))
    }

    #[test]
    fn a_round_is_put_to_the_worker_only_when_it_accepts_every_kind() {
        let form = InputKinds {
            form: true,
            ..InputKinds::default()
        };
        let not_accepted = |kinds: Vec<&'static str>| CallError::InvalidFilter(kinds.join(","));
        let protocol = CallError::InvalidFilter;
        let round = round(booking_and_roots(), form, not_accepted, protocol).expect("a round");
        assert_eq!(round.asked.len(), 1, "roots are not the worker's");
        assert_eq!(round.asked[0].id, "m:ask");
        assert_eq!(round.ids.len(), 2);
        assert!(round.ids.iter().any(|a| a.kind == Kind::Roots));
        assert_eq!(round.server_state.as_deref(), Some("v1.server"));
        let sampling_only = InputKinds {
            sampling: true,
            ..InputKinds::default()
        };
        match super::round(booking_and_roots(), sampling_only, not_accepted, protocol) {
            Err(CallError::InvalidFilter(kinds)) => assert_eq!(kinds, "form"),
            other => panic!("{other:?}"),
        }
        let roots_only = input_required(json!({
            "resultType": "input_required",
            "inputRequests": {"r": {"method": "roots/list"}},
        }));
        assert!(super::round(roots_only, form, not_accepted, protocol).is_err());
        let big = input_required(json!({
            "resultType": "input_required",
            "requestState": "x".repeat(MAX_SERVER_STATE + 1),
        }));
        assert!(super::round(big, form, not_accepted, protocol).is_err());
    }

    #[test]
    fn arguments_match_however_they_are_written() {
        let a = json!({"b": 1, "a": [1, {"y": 2, "x": "s"}]});
        let b: serde_json::Value =
            serde_json::from_str(r#"{ "a": [1, {"x": "s", "y": 2}], "b": 1 }"#).unwrap();
        assert_eq!(
            arguments_digest(a.as_object().unwrap()),
            arguments_digest(b.as_object().unwrap())
        );
        let c = json!({"b": 2, "a": [1, {"y": 2, "x": "s"}]});
        assert_ne!(
            arguments_digest(a.as_object().unwrap()),
            arguments_digest(c.as_object().unwrap())
        );
    }

    #[test]
    fn answers_become_input_responses_and_roots_are_answered_by_toolgate() {
        let retry = Retry {
            round: 1,
            asked: a_round().ids,
            server_state: None,
            nonce: nonce(),
            exp_ms: u64::MAX,
        };
        let roots = [Root {
            uri: "file:///work".into(),
            name: Some("work".into()),
        }];
        let accept = Answer {
            id: "q".into(),
            action: Action::Accept,
            content: Some(json!({"party_size": 2})),
        };
        let responses = retry
            .responses(std::slice::from_ref(&accept), &roots)
            .unwrap();
        assert_eq!(responses["q"]["action"], "accept");
        assert_eq!(responses["q"]["content"]["party_size"], 2);
        assert_eq!(responses["r"]["roots"][0]["uri"], "file:///work");
        for bad in [
            Answer {
                id: "nope".into(),
                ..accept.clone()
            },
            Answer {
                id: "r".into(),
                ..accept.clone()
            },
            Answer {
                content: None,
                ..accept.clone()
            },
        ] {
            assert!(matches!(
                retry.responses(&[bad], &roots),
                Err(CallError::InputResponseInvalid { .. })
            ));
        }
        assert!(retry.responses(&[accept.clone(), accept], &roots).is_err());
    }

    #[test]
    fn a_state_of_one_method_does_not_open_for_another() {
        let keys = KeyRing::ephemeral();
        let call = binding();
        let mut read = binding();
        read.method = Method::Read;
        let now = SystemTime::now();
        let sealed = seal(&keys, &read, &a_round(), 1, Duration::from_secs(60), now);
        assert!(open(&keys, &sealed, &read, now, changed).is_ok());
        let refused = open(&keys, &sealed, &call, now, changed).unwrap_err();
        assert!(
            matches!(
                refused,
                CallError::RequestStateRefused {
                    refusal: StateRefusal::OtherCall,
                    ..
                }
            ),
            "{refused:?}"
        );
    }
}
