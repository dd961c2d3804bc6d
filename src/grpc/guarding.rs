//! What the guard steps of the RPCs share: a call's id, the trace context
//! sent to guards, the target a guard is told about, and a chain's stop as
//! the RPC's error ([guards.md](../../docs/guards.md)).

use crate::pb::guard as wire;
use crate::telemetry::trace;

/// toolgate's id of a call, as guards see it (`CheckRequest.call_id`): the
/// call's trace id when it is traced, else a random one (32 hex digits).
pub(super) fn call_id(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) -> String {
    trace::trace_id(span, metadata).unwrap_or_else(|| {
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

/// What a guard is told a call is about.
pub(super) fn target(
    kind: wire::TargetKind,
    name: &str,
    server: &str,
    upstream_name: &str,
    definition_hash: &str,
) -> wire::Target {
    wire::Target {
        kind: kind as i32,
        name: name.to_owned(),
        server: server.to_owned(),
        upstream_name: upstream_name.to_owned(),
        definition_hash: definition_hash.to_owned(),
    }
}

/// The arguments as sent upstream when a request-phase guard replaced
/// them (for the audit record), else `None`.
pub(super) fn replaced_arguments(
    acted: &[crate::guards::Acted],
    arguments: &rmcp::model::JsonObject,
) -> Option<String> {
    acted
        .iter()
        .any(|a| {
            a.phase == crate::guards::Phase::Request && a.verdict == crate::guards::Verdict::Replace
        })
        .then(|| serde_json::to_string(arguments).unwrap_or_default())
}
