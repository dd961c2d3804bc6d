//! Running a [`Chain`] over one phase of one call: each guard asked in
//! order, a replacement feeding the next, a denial stopping the chain, a
//! failure handled by the guard's `failure`; every check counted
//! (`toolgate_guard_checks_total`, `toolgate_guard_check_seconds`).

use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Chain, Guard, Phase, deny_reason};
use crate::config::GuardFailure;
use crate::pb::guard as wire;
use crate::pb::guard::check_response::Verdict as WireVerdict;
use crate::telemetry::Metrics;

/// What a guard did in a call, for the audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acted {
    /// The guard's name.
    pub guard: String,
    /// The phase it was asked about.
    pub phase: Phase,
    /// What came of it.
    pub verdict: Verdict,
}

/// What came of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The guard let the phase go on unchanged.
    Allow,
    /// The guard refused the call.
    Deny,
    /// The guard replaced the arguments or the result.
    Replace,
    /// The guard failed; `failure: open` let the call go on.
    FailedOpen,
    /// The guard failed; `failure: closed` stopped the call.
    FailedClosed,
}

impl Verdict {
    /// `allow`, `deny`, `replace`, `failed_open`, `failed_closed` (metric
    /// label and audit value).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Replace => "replace",
            Verdict::FailedOpen => "failed_open",
            Verdict::FailedClosed => "failed_closed",
        }
    }
}

/// Why a chain stopped a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardStop {
    /// A guard denied: its reason, bounded and redacted.
    Denied {
        /// The guard's name.
        guard: String,
        /// The phase.
        phase: Phase,
        /// Its reason as the worker sees it ([`deny_reason`]).
        reason: String,
    },
    /// A guard with `failure: closed` failed.
    Failed {
        /// The guard's name.
        guard: String,
        /// The phase.
        phase: Phase,
        /// What went wrong, in words (never a payload).
        error: String,
    },
}

/// What a check is about, the same for every guard and both phases.
pub struct CallInfo<'a> {
    /// The caller's tenant.
    pub tenant: &'a str,
    /// Whom the call acts for.
    pub subject: &'a crate::callers::Subject,
    /// How the caller authenticated (`None`: not known).
    pub caller: Option<&'a crate::callers::Caller>,
    /// What the call is about.
    pub target: wire::Target,
    /// toolgate's id of the call.
    pub call_id: String,
    /// W3C trace-context fields sent to the guards.
    pub trace: Vec<(String, String)>,
    /// Takes configured and live credentials out of a denial's reason.
    pub redact: &'a (dyn Fn(&str) -> String + Sync),
    /// Where checks are counted.
    pub metrics: &'a Metrics,
}

impl std::fmt::Debug for CallInfo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallInfo")
            .field("tenant", &self.tenant)
            .field("subject", &self.subject.key())
            .field("target", &self.target)
            .field("call_id", &self.call_id)
            .finish_non_exhaustive()
    }
}

impl CallInfo<'_> {
    /// The request to `guard` about `phase` with `payload` (the arguments
    /// or the result as JSON text).
    fn request(&self, guard: &Guard, phase: Phase, payload: &str) -> wire::CheckRequest {
        let caller = match self.caller.map(|c| &c.identity) {
            Some(crate::callers::CallerIdentity::Token { .. }) => wire::CallerKind::Token,
            Some(crate::callers::CallerIdentity::Jwt { .. }) => wire::CallerKind::Jwt,
            Some(crate::callers::CallerIdentity::Certificate { .. }) => {
                wire::CallerKind::Certificate
            }
            // An approver token calls no tool (it reaches the call
            // approvals service only), and the guard protocol has no kind
            // for it.
            Some(crate::callers::CallerIdentity::ApproverToken { .. }) | None => {
                wire::CallerKind::Unspecified
            }
        };
        let (arguments_json, result_json) = match phase {
            Phase::Request => (payload.to_owned(), String::new()),
            Phase::Response => (String::new(), payload.to_owned()),
        };
        wire::CheckRequest {
            phase: phase.wire() as i32,
            guard: guard.name().to_owned(),
            tenant: self.tenant.to_owned(),
            subject: Some(wire::Subject {
                id: self.subject.id().unwrap_or_default().to_owned(),
                key: self.subject.key().to_owned(),
                caller: caller as i32,
            }),
            target: Some(self.target.clone()),
            arguments_json,
            result_json,
            call_id: self.call_id.clone(),
        }
    }
}

impl Chain {
    /// The request phase: `arguments` as each guard of the request phase
    /// lets them through (a replacement must be a JSON object of at most
    /// `max_bytes`). What each guard did is added to `acted`.
    ///
    /// # Errors
    /// A denial, or a failure of a `failure: closed` guard.
    pub async fn request(
        &self,
        info: &CallInfo<'_>,
        arguments: rmcp::model::JsonObject,
        max_bytes: usize,
        acted: &mut Vec<Acted>,
    ) -> Result<rmcp::model::JsonObject, GuardStop> {
        self.run(Phase::Request, info, arguments, max_bytes, acted)
            .await
    }

    /// The response phase: `result` (the MCP result of the target's kind)
    /// as each guard of the response phase lets it through (a replacement
    /// must parse as `T` and be at most `max_bytes`). What each guard did is
    /// added to `acted`.
    ///
    /// # Errors
    /// A denial, or a failure of a `failure: closed` guard.
    pub async fn response<T: Serialize + DeserializeOwned>(
        &self,
        info: &CallInfo<'_>,
        result: T,
        max_bytes: usize,
        acted: &mut Vec<Acted>,
    ) -> Result<T, GuardStop> {
        self.run(Phase::Response, info, result, max_bytes, acted)
            .await
    }

    /// One phase over the chain: `value` as each guard asked about `phase`
    /// lets it through, a replacement (at most `max_bytes`, parsed as `T`)
    /// feeding the next guard.
    async fn run<T: Serialize + DeserializeOwned>(
        &self,
        phase: Phase,
        info: &CallInfo<'_>,
        value: T,
        max_bytes: usize,
        acted: &mut Vec<Acted>,
    ) -> Result<T, GuardStop> {
        if self.skips(phase) {
            return Ok(value);
        }
        let (what, limit, shape) = match phase {
            Phase::Request => ("arguments", "limits.max_argument_bytes", "a JSON object"),
            Phase::Response => (
                "result",
                "limits.max_result_bytes",
                "the MCP result of the target",
            ),
        };
        let mut current = Payload::new(value);
        for guard in self.guards.iter().filter(|g| g.asks(phase)) {
            let text = current.text();
            let started = Instant::now();
            let verdict = guard
                .check(info.request(guard, phase, &text), &info.trace)
                .await;
            let elapsed = started.elapsed();
            let replaced = |json: String| -> Result<Payload<T>, String> {
                if json.len() > max_bytes {
                    return Err(format!(
                        "replaced the {what} with {} bytes, over {limit} ({max_bytes})",
                        json.len()
                    ));
                }
                let value = serde_json::from_str::<T>(&json).map_err(|e| {
                    format!("replaced the {what} with something that is not {shape} ({e})")
                })?;
                Ok(Payload::replaced(value, json))
            };
            current = judge(
                guard, phase, verdict, elapsed, info, acted, current, replaced,
            )?;
        }
        Ok(current.value)
    }
}

/// A value on its way through the chain, with its JSON text once known.
struct Payload<T> {
    value: T,
    text: Option<String>,
}

impl<T: Serialize> Payload<T> {
    fn new(value: T) -> Self {
        Self { value, text: None }
    }

    fn replaced(value: T, text: String) -> Self {
        Self {
            value,
            text: Some(text),
        }
    }

    /// The JSON text (serialised once, until a replacement brings its own).
    fn text(&mut self) -> String {
        self.text
            .get_or_insert_with(|| serde_json::to_string(&self.value).unwrap_or_default())
            .clone()
    }
}

/// What one guard's answer does to the call: `current` unchanged (allow,
/// or a failure let through by `failure: open`), its replacement (checked
/// by `replaced`), or the call stopped. Counts the check and adds it to
/// `acted`.
#[allow(clippy::too_many_arguments)]
fn judge<T>(
    guard: &Guard,
    phase: Phase,
    answer: Result<WireVerdict, String>,
    elapsed: std::time::Duration,
    info: &CallInfo<'_>,
    acted: &mut Vec<Acted>,
    current: Payload<T>,
    replaced: impl FnOnce(String) -> Result<Payload<T>, String>,
) -> Result<Payload<T>, GuardStop> {
    let mut record = |verdict: Verdict| {
        info.metrics
            .guards()
            .check(guard.name(), phase.as_str(), verdict.as_str(), elapsed);
        acted.push(Acted {
            guard: guard.name().to_owned(),
            phase,
            verdict,
        });
    };
    let error = match answer {
        Ok(WireVerdict::Allow(_)) => {
            record(Verdict::Allow);
            return Ok(current);
        }
        Ok(WireVerdict::Deny(deny)) => {
            record(Verdict::Deny);
            return Err(GuardStop::Denied {
                guard: guard.name().to_owned(),
                phase,
                reason: deny_reason(&deny.reason, info.redact),
            });
        }
        Ok(WireVerdict::Replace(replace)) => {
            let (wanted, other, field) = match phase {
                Phase::Request => (
                    replace.arguments_json,
                    replace.result_json,
                    "arguments_json",
                ),
                Phase::Response => (replace.result_json, replace.arguments_json, "result_json"),
            };
            if !other.is_empty() || wanted.is_empty() {
                format!("answered replace without only `{field}` (the field of the {phase} phase)")
            } else {
                match replaced(wanted) {
                    Ok(payload) => {
                        record(Verdict::Replace);
                        return Ok(payload);
                    }
                    Err(error) => error,
                }
            }
        }
        Err(error) => error,
    };
    // A guard's error text (its status message) may echo what it was sent
    // or its own token: redacted like a denial's reason, before it is
    // logged or told to the worker.
    let error = (info.redact)(&error);
    match guard.failure() {
        GuardFailure::Open => {
            record(Verdict::FailedOpen);
            tracing::warn!(guard = %guard.name(), phase = %phase, %error, "guard failed; failure: open, the call goes on as if it allowed");
            Ok(current)
        }
        GuardFailure::Closed => {
            record(Verdict::FailedClosed);
            tracing::warn!(guard = %guard.name(), phase = %phase, %error, "guard failed; failure: closed, the call stops");
            Err(GuardStop::Failed {
                guard: guard.name().to_owned(),
                phase,
                error,
            })
        }
    }
}
