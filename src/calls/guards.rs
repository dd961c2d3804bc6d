//! The guard steps of a call ([guards.md](../../docs/guards.md)): the
//! request phase over its arguments and the response phase over its
//! result, through the chain of (tenant, server), with what a guard is
//! told (the call's id, the trace context, the target), and a chain's stop
//! as the call's error.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Origin;
use super::error::CallError;
use super::routed::{Reached, Routed};
use crate::credentials::Redaction;
use crate::guards::Phase;
use crate::pb::guard as wire;
use crate::telemetry::{Metrics, trace};
use crate::upstream::Session;

/// toolgate's id of a call, as guards see it (`CheckRequest.call_id`): the
/// call's trace id when it is traced, else a random one (32 hex digits).
fn call_id(span: &tracing::Span, fields: &[(String, String)]) -> String {
    trace::trace_id(span, fields).unwrap_or_else(|| {
        let bytes: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        hex::encode(bytes)
    })
}

/// The W3C trace context sent to guards: the current span's when trace
/// export is on, else the caller's own (`inherited`).
pub(super) fn trace_fields(inherited: &[(String, String)]) -> Vec<(String, String)> {
    let own = trace::context_fields(&tracing::Span::current());
    if own.is_empty() {
        inherited.to_vec()
    } else {
        own
    }
}

/// The arguments as sent upstream when a request-phase guard replaced
/// them (for the audit record), else `None`.
fn replaced_arguments(acted: &[crate::guards::Acted], arguments: &JsonObject) -> Option<String> {
    acted
        .iter()
        .any(|a| {
            a.phase == crate::guards::Phase::Request && a.verdict == crate::guards::Verdict::Replace
        })
        .then(|| serde_json::to_string(arguments).unwrap_or_default())
}

/// The guards of one call: its chain and what each guard is told.
pub(super) struct Guarding<'a> {
    chain: crate::guards::Chain,
    kind: wire::TargetKind,
    server: &'a str,
    upstream_name: &'a str,
    name: &'a str,
    definition_hash: &'a str,
    origin: &'a Origin,
    /// toolgate's id of the call, the same in every check of the call.
    call_id: String,
    redaction: Redaction,
    metrics: &'a Arc<Metrics>,
    max_argument_bytes: usize,
    max_result_bytes: usize,
    /// How a stop is answered: the target, its server, whether a retry
    /// is safe.
    stop: (super::error::Target, bool),
}

impl<'a> Guarding<'a> {
    /// The guards of the call `routed` on `session`; `None` when no guard
    /// is asked about it (nothing of the call is prepared for them).
    pub(super) fn new<E>(
        kind: wire::TargetKind,
        routed: &'a Routed<E>,
        session: &Session,
        origin: &'a Origin,
        metrics: &'a Arc<Metrics>,
    ) -> Option<Self> {
        let chain = routed.tenant.guards(routed.index);
        if chain.skips(Phase::Request) && chain.skips(Phase::Response) {
            return None;
        }
        let limits = routed.tenant.limits();
        Some(Self {
            kind,
            server: &routed.server,
            upstream_name: &routed.upstream_name,
            name: &routed.target.name,
            definition_hash: &routed.definition_hash,
            origin,
            // In the call's span: its trace id when it is traced.
            call_id: call_id(&tracing::Span::current(), &origin.trace),
            chain,
            redaction: session.redaction().clone(),
            metrics,
            max_argument_bytes: limits.max_argument_bytes,
            max_result_bytes: limits.max_result_bytes,
            stop: (routed.target.clone(), routed.idempotent),
        })
    }

    /// Runs `phase` with what the guards are told of this call.
    async fn with_info<T>(&self, phase: impl AsyncFnOnce(&crate::guards::CallInfo<'_>) -> T) -> T {
        let redaction = self.redaction.clone();
        let redact = move |text: &str| redaction.redact(text).into_owned();
        let info = crate::guards::CallInfo {
            tenant: &self.origin.tenant.name,
            subject: &self.origin.subject,
            caller: Some(&self.origin.caller),
            target: wire::Target {
                kind: self.kind as i32,
                name: self.name.to_owned(),
                server: self.server.to_owned(),
                upstream_name: self.upstream_name.to_owned(),
                definition_hash: self.definition_hash.to_owned(),
            },
            call_id: self.call_id.clone(),
            trace: trace_fields(&self.origin.trace),
            redact: &redact,
            metrics: self.metrics,
        };
        phase(&info).await
    }

    /// A chain's stop as the call's error.
    fn stopped(&self, stop: crate::guards::GuardStop) -> CallError {
        CallError::guard(stop, self.stop.0.clone(), self.server, self.stop.1)
    }

    /// The request phase over `arguments`: what is sent, as the guards let
    /// it through (what they did, and a replacement, in `reached`).
    ///
    /// # Errors
    /// A guard denied the call, or failed closed.
    pub(super) async fn request(
        &self,
        arguments: JsonObject,
        reached: &mut Reached,
    ) -> Result<JsonObject, CallError> {
        if self.chain.skips(Phase::Request) {
            return Ok(arguments);
        }
        let checked = self
            .with_info(async |info| {
                self.chain
                    .request(
                        info,
                        arguments,
                        self.max_argument_bytes,
                        &mut reached.guards,
                    )
                    .await
            })
            .await
            .map_err(|stop| self.stopped(stop))?;
        reached.replaced_arguments = replaced_arguments(&reached.guards, &checked);
        Ok(checked)
    }

    /// The response phase over `result`: what is handed out.
    ///
    /// # Errors
    /// A guard denied the result, or failed closed.
    pub(super) async fn response<T: Serialize + DeserializeOwned + Send>(
        &self,
        result: T,
        reached: &mut Reached,
    ) -> Result<T, CallError> {
        if self.chain.skips(Phase::Response) {
            return Ok(result);
        }
        self.with_info(async |info| {
            self.chain
                .response(info, result, self.max_result_bytes, &mut reached.guards)
                .await
        })
        .await
        .map_err(|stop| self.stopped(stop))
    }
}
