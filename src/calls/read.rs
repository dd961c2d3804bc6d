//! `ReadResource` as an operation of the pipeline: one resource of one
//! server, read on the tenant's session or the subject's own (or answered
//! from the result cache while the server's `ttlMs` says the contents
//! are fresh), its URI in normal form (what the policy matches, the
//! server is sent and the record keeps).

use rmcp::model::{JsonObject, ReadResourceResult};

use super::Origin;
use super::error::{CallError, Feature, Target, quoted};
use super::pipeline::{Operation, Reached, Routed, Sending, Upstream};
use super::rounds::{InputFields, Method};
use crate::calls::classify::jsonrpc::{INVALID_PARAMS, RESOURCE_NOT_FOUND};
use crate::pb::guard::TargetKind;
use crate::policy::{ResourceUri, UriError};
use crate::upstream::resources::ReadRequest;
use crate::upstream::{Session, UpstreamError};

/// The longest URI an audit record keeps.
const MAX_AUDIT_URI: usize = 1024;

/// One resource to read.
#[derive(Debug)]
pub struct ResourceRead {
    /// The server's configured name.
    pub server: String,
    /// The URI as asked.
    pub uri: String,
    /// The URI in its normal form, or why it has none.
    normal: Result<ResourceUri, UriError>,
    /// Rounds of questions.
    pub input: InputFields,
    /// Why no server could be found for a URI that came without one (MCP's
    /// gRPC transport): the read is refused, on record, with it.
    unrouted: Option<String>,
}

impl ResourceRead {
    /// A read of `uri` of `server`.
    #[must_use]
    pub fn new(server: String, uri: String, input: InputFields) -> Self {
        let normal = ResourceUri::parse(&uri);
        Self {
            server,
            uri,
            normal,
            input,
            unrouted: None,
        }
    }

    /// A read of `uri` whose server could not be found, for `why`: it is
    /// refused (`MCP_REQUEST_INVALID`) and recorded like any read.
    #[must_use]
    pub fn unrouted(uri: String, why: String, input: InputFields) -> Self {
        Self {
            unrouted: Some(why),
            ..Self::new(String::new(), uri, input)
        }
    }
}

impl ResourceRead {
    /// The URI in its normal form (`INVALID_RESOURCE_URI` when it has none).
    fn normal(&self) -> Result<&ResourceUri, CallError> {
        self.normal.as_ref().map_err(|e| e.clone().into())
    }
}

/// `text` cut to [`MAX_AUDIT_URI`] characters, with a note of its length.
fn bounded(text: &str) -> String {
    let length = text.chars().count();
    if length <= MAX_AUDIT_URI {
        return text.to_owned();
    }
    let cut: String = text.chars().take(MAX_AUDIT_URI).collect();
    format!("{cut}… ({length} characters)")
}

impl Operation for ResourceRead {
    type Output = ReadResourceResult;
    type Extra = ();

    const FEATURE: Option<Feature> = Some(Feature::Resources);
    const GUARDED: Option<TargetKind> = Some(TargetKind::Resource);
    const ROUNDS: Option<Method> = Some(Method::Read);
    const IDEMPOTENT: bool = true;
    const CACHED_AS: Option<&'static str> = Some("resources/read");

    /// The 2026-07-28 result's own `ttlMs` and `cacheScope`.
    fn cache_hint(output: &ReadResourceResult) -> Option<super::cache::Hint> {
        super::cache::Hint::of(output.ttl_ms, output.cache_scope)
    }

    fn span(&self, tenant: &str) -> tracing::Span {
        super::rpc_span("ReadResource", tenant)
    }

    fn describe(&self, record: &mut crate::audit::Record, tenant: &crate::registry::Tenant) {
        // In its normal form (as asked, when it has none), redacted.
        let uri = self
            .normal
            .as_ref()
            .map_or(self.uri.as_str(), ResourceUri::as_str);
        record.uri = Some(bounded(&tenant.redactor().redact(uri)));
    }

    fn audited_arguments(&self) -> Option<std::borrow::Cow<'_, str>> {
        None
    }

    fn check(&self) -> Result<(), CallError> {
        if let Some(why) = &self.unrouted {
            return Err(CallError::McpRequestInvalid(why.clone()));
        }
        self.normal().map(|_| ())
    }

    async fn resolve(
        &self,
        origin: &Origin,
        reached: &mut Reached,
    ) -> Result<Routed<()>, CallError> {
        let tenant = &origin.tenant;
        let name = &self.server;
        let Some(index) = tenant.servers().position(|s| &s.name == name) else {
            return Err(CallError::ServerNotFound {
                server: quoted(name).into_owned(),
            });
        };
        reached.server = Some(name.clone());
        let normal = self.normal()?;
        let target = Target::resource(normal.as_str());
        // Policy before the session: no consent is offered for what the
        // caller may not read.
        if !tenant
            .policy()
            .is_none_or(|p| p.allows_resource(&origin.caller, &origin.subject, name, normal))
        {
            return Err(CallError::NotPermitted {
                server: name.clone(),
                target,
            });
        }
        Ok(Routed {
            tenant: tenant.clone(),
            index,
            server: name.clone(),
            upstream_name: normal.as_str().to_owned(),
            target,
            definition_hash: String::new(),
            // A read acts on nothing: a retry is safe.
            idempotent: true,
            kind: (),
        })
    }

    fn arguments(&self, _routed: &Routed<()>, _limit: usize) -> Result<JsonObject, CallError> {
        // A read's only parameter is its URI: the guards see `{}`.
        Ok(JsonObject::new())
    }

    fn input(&self) -> Option<&InputFields> {
        Some(&self.input)
    }

    async fn ready(
        &self,
        routed: &Routed<()>,
        session: &Session,
        _calls: &super::Calls,
    ) -> Result<(), CallError> {
        let max_result = routed.tenant.limits().max_result_bytes;
        if let Some(size) = session
            .kept_listing()
            .and_then(|l| l.size_of(&routed.upstream_name))
            && size > max_result as u64
        {
            // Listed over the bound: nothing is sent.
            return Err(routed.upstream(UpstreamError::TooLarge(max_result)));
        }
        Ok(())
    }

    async fn send(
        &self,
        sending: Sending<'_, ()>,
    ) -> Result<Result<Upstream<ReadResourceResult>, UpstreamError>, CallError> {
        let mut sending = sending;
        let (input_responses, request_state) = sending.take_answers();
        let read = ReadRequest {
            uri: sending.routed.upstream_name.clone(),
            timeout: sending.timeout,
            accepts: sending.accepts,
            input_responses,
            request_state,
            inherited_trace: sending.origin.trace.clone(),
        };
        Ok(sending
            .session
            .read_resource(&read)
            .await
            .map(Upstream::from))
    }

    /// No such resource (-32002; or -32602, which 2026-07-28 servers
    /// answer (SEP-2164) and so does the Python SDK on 2025-11-25: a
    /// read's only parameter is its URI), a consent to give, or the
    /// server's failure.
    fn failure(&self, routed: &Routed<()>, origin: &Origin, error: UpstreamError) -> CallError {
        if let UpstreamError::JsonRpc { code, .. } = &error
            && (*code == RESOURCE_NOT_FOUND || *code == INVALID_PARAMS)
        {
            return CallError::ResourceNotFound {
                server: routed.server.clone(),
                uri: routed.target.name.clone(),
            };
        }
        super::pipeline::failure_of(routed, origin, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_uris_are_bounded() {
        assert_eq!(bounded("file:///a"), "file:///a");
        let long = "x".repeat(2000);
        let cut = bounded(&long);
        assert!(cut.ends_with("… (2000 characters)"), "{cut}");
        assert!(cut.chars().count() < 1100);
    }
}
