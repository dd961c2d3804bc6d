//! `ReadResource`: one resource of one server, read through (never
//! cached) on the tenant's session or the subject's own, with a call's
//! admission, policy, limits, redaction, audit and 2026-07-28 rounds of
//! questions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::ResourceContents;
use tonic::{Request, Status};
use tracing::Instrument;

use super::call_audit::{AuditedCall, Progress};
use super::error::{CallError, Feature, Target, quoted};
use super::{Gateway, caller_timeout, convert, deadline_margin, input_round, input_state};
use super::{questions, upstream_session};
use crate::callers::{Caller, Subject};
use crate::pb;
use crate::policy::{ResourceUri, UriError};
use crate::registry::Tenant;
use crate::upstream::resources::{ReadOutcome, ReadRequest};
use crate::upstream::{InputKinds, UpstreamError};

/// The longest URI an audit record keeps.
const MAX_AUDIT_URI: usize = 1024;

/// `ReadResource`.
pub(super) async fn read(
    gateway: &Gateway,
    request: Request<pb::ReadResourceRequest>,
) -> Result<pb::ReadResourceResponse, Status> {
    let (tenant, _busy) = gateway.tenant(&request)?;
    let started = Instant::now();
    let mut audited = AuditedCall::of(
        &gateway.audit,
        &request,
        &tenant,
        "ReadResource",
        started,
        None,
    );
    // The URI in its normal form: what the policy matches, the server is
    // sent and the record keeps (as asked, when it has none).
    let uri = ResourceUri::parse(&request.get_ref().uri);
    let redactor = tenant.redactor();
    let audit_uri = bounded(
        &redactor.redact(
            uri.as_ref()
                .map_or(request.get_ref().uri.as_str(), ResourceUri::as_str),
        ),
    );
    audited.describe(|record| record.uri = Some(audit_uri));
    let span = super::rpc_span("ReadResource", &tenant.name);
    crate::telemetry::trace::continue_caller_trace(&span, request.metadata());
    audited.trace(&span, request.metadata());
    let call_id = super::guarding::call_id(&span, request.metadata());
    let Some(_entered) = gateway.drain.enter() else {
        let refused = Err(CallError::Draining);
        audited.finish(&refused, Progress::none()).await;
        return refused.map_err(Status::from);
    };
    let deadline = caller_timeout(&request).map(|t| t.saturating_sub(deadline_margin(t)));
    let inherited_trace = crate::telemetry::trace::caller_context(request.metadata());
    let (caller, subject) = super::caller_of(&request);
    let request = request.into_inner();
    let mut sent = false;
    let reader = Reader {
        gateway,
        tenant: &tenant,
        caller: &caller,
        subject: &subject,
        deadline,
        started,
        inherited_trace,
        call_id,
    };
    let run = async {
        tokio::select! {
            result = reader.read(&request, uri, &mut audited, &mut sent) => result,
            () = gateway.abort.cancelled() => Err(CallError::ShuttingDown { sent: false, idempotent: true }),
        }
    };
    let mut result = run.instrument(span).await;
    let server = tenant
        .servers()
        .any(|s| s.name == request.server)
        .then_some(request.server.as_str());
    let progress = Progress {
        server,
        definition_hash: None,
        sent,
        idempotent: true,
    };
    if let Some(withheld) = audited.finish(&result, progress).await {
        result = Err(withheld);
    }
    gateway.metrics.request(
        &tenant.name,
        server,
        "ReadResource",
        match &result {
            Ok(_) => "ok",
            Err(error) => super::status::classify(error).1,
        },
    );
    result.map_err(Status::from)
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

/// One ReadResource being answered.
struct Reader<'a> {
    gateway: &'a Gateway,
    tenant: &'a Arc<Tenant>,
    caller: &'a Caller,
    subject: &'a Subject,
    deadline: Option<Duration>,
    started: Instant,
    inherited_trace: Vec<(String, String)>,
    /// toolgate's id of the call, as guards see it.
    call_id: String,
}

impl Reader<'_> {
    /// The read in the order of docs/api.md: the URI's normal form,
    /// server, capability, policy (per-user servers: policy before the
    /// consent check), admission, a listed size over the bound, a retry's
    /// state, the audit place, the read, its contents.
    async fn read(
        &self,
        request: &pb::ReadResourceRequest,
        uri: Result<ResourceUri, UriError>,
        audited: &mut AuditedCall,
        sent: &mut bool,
    ) -> Result<pb::ReadResourceResponse, CallError> {
        let tenant = self.tenant;
        let name = &request.server;
        let normal = uri?;
        let uri = normal.as_str();
        let Some(index) = tenant.servers().position(|s| &s.name == name) else {
            return Err(CallError::ServerNotFound {
                server: quoted(name).into_owned(),
            });
        };
        let server = tenant.server(index);
        let target = Target::resource(uri);
        let permitted = || {
            if tenant
                .policy()
                .is_none_or(|p| p.allows_resource(self.caller, self.subject, name, &normal))
            {
                Ok(())
            } else {
                Err(CallError::NotPermitted {
                    server: name.clone(),
                    target: target.clone(),
                })
            }
        };
        let per_user = tenant.is_per_user(index);
        if per_user {
            // No consent is offered for what the caller may not read.
            permitted()?;
        }
        let session = upstream_session::session(tenant, index, self.subject, &target).await?;
        if session.server_capabilities().resources.is_none() {
            return Err(CallError::Unsupported {
                server: name.clone(),
                feature: Feature::Resources,
            });
        }
        if !per_user {
            permitted()?;
        }
        let _admission = tenant
            .limiter
            .admit(self.subject)
            .await
            .map_err(|shed| CallError::Shed(shed, None))?;
        let _server_slot = match tenant.server_limit(index) {
            None => None,
            Some(limit) => Some(
                limit
                    .acquire(tenant.limiter.queue_timeout())
                    .await
                    .ok_or_else(|| {
                        CallError::Shed(
                            crate::registry::limits::Shed::ServerConcurrency(limit.limit()),
                            Some(name.clone()),
                        )
                    })?,
            ),
        };
        let max_result = tenant.limits().max_result_bytes;
        if let Some(size) = session.kept_listing().and_then(|l| l.size_of(uri))
            && size > max_result as u64
        {
            // Listed over the bound: nothing is sent.
            return Err(self.upstream(name, &target, UpstreamError::TooLarge(max_result)));
        }
        let binding = input_state::Binding {
            method: input_state::Method::Read,
            tenant: tenant.name.clone(),
            subject: self.subject.key().to_owned(),
            server: name.clone(),
            upstream_tool: uri.to_owned(),
            exposed_name: uri.to_owned(),
            definition_hash: String::new(),
            args_sha256: input_state::arguments_digest(&rmcp::model::JsonObject::new()),
        };
        let keys = &self.gateway.request_keys;
        let metrics = &self.gateway.metrics;
        let retry = input_round::open_retry(
            (keys, &self.gateway.answered_rounds),
            tenant,
            server,
            (&request.request_state, &request.input_responses),
            &binding,
            // A read has no definition to change.
            || CallError::InputResponseInvalid {
                reason: "the request_state does not fit this read".to_owned(),
            },
        )
        .await?;
        // The guards' request phase (arguments `{}`): before anything is
        // sent; a replacement of them has nothing to replace.
        let chain = tenant.guards(index);
        let mut acted = Vec::new();
        let redaction = session.redaction().clone();
        let redact = move |text: &str| redaction.redact(text).into_owned();
        let guard_info = crate::guards::CallInfo {
            tenant: &tenant.name,
            subject: self.subject,
            caller: Some(self.caller),
            target: super::guarding::target(
                crate::pb::guard::TargetKind::Resource,
                uri,
                name,
                uri,
                "",
            ),
            call_id: self.call_id.clone(),
            trace: super::guarding::trace_fields(&self.inherited_trace),
            redact: &redact,
            metrics,
        };
        let stopped = |stop| CallError::guard(stop, target.clone(), name, true);
        let checked = chain
            .request(
                &guard_info,
                rmcp::model::JsonObject::new(),
                tenant.limits().max_argument_bytes,
                &mut acted,
            )
            .await;
        audited.guarded(&acted, None, || tenant.redactor());
        checked.map_err(stopped)?;
        audited.admit(true).await?;
        let (round, answered) =
            input_round::answered(retry, audited, metrics, &binding, tenant).await?;
        let remaining = self
            .deadline
            .map(|d| d.saturating_sub(self.started.elapsed()));
        if remaining.is_some_and(|r| r.is_zero()) {
            return Err(CallError::DeadlineExceeded {
                server: name.clone(),
                tool: target,
                after: self.started.elapsed(),
                sent: false,
            });
        }
        let timeout = remaining
            .unwrap_or(server.call_timeout)
            .min(server.max_call_timeout);
        let allowed = InputKinds {
            form: server.input.form,
            url: server.input.url,
            sampling: server.input.sampling,
        };
        let accepts = questions::accepts(request.accepts_input.as_ref()).and(allowed);
        let (input_responses, request_state) = match answered {
            Some((responses, state)) => (Some(responses), state),
            None => (None, None),
        };
        let read = ReadRequest {
            uri: uri.to_owned(),
            timeout,
            accepts,
            input_responses,
            request_state,
            inherited_trace: self.inherited_trace.clone(),
        };
        *sent = true;
        let result = session.read_resource(&read).await;
        let result = input_round::not_accepted(result, metrics, &binding)?;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(UpstreamError::Timeout(_))
                if remaining.is_some_and(|r| r <= server.max_call_timeout) =>
            {
                return Err(CallError::DeadlineExceeded {
                    server: name.clone(),
                    tool: target,
                    after: self.started.elapsed(),
                    sent: true,
                });
            }
            Err(error) => {
                if matches!(error, UpstreamError::Closed) || error.is_credential_failure() {
                    *sent = false;
                }
                return Err(self.failure(index, name, &target, error));
            }
        };
        let response = match outcome {
            ReadOutcome::Complete(result) => {
                // The guards' response phase, before conversion, the
                // record and the answer.
                let checked = chain
                    .response(&guard_info, result, max_result, &mut acted)
                    .await;
                audited.guarded(&acted, None, || tenant.redactor());
                let result = checked.map_err(stopped)?;
                let contents = result
                    .contents
                    .into_iter()
                    .map(resource_contents)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        self.upstream(name, &target, UpstreamError::Protocol(e.to_string()))
                    })?;
                pb::ReadResourceResponse {
                    contents,
                    input_required: None,
                }
            }
            ReadOutcome::InputRequired(asked) => {
                let questions = input_round::Questions {
                    keys,
                    metrics,
                    binding: &binding,
                    server,
                    accepts,
                    number: round,
                };
                let message = questions.hand_out(asked, audited, |reason| {
                    self.upstream(name, &target, UpstreamError::Protocol(reason))
                })?;
                pb::ReadResourceResponse {
                    contents: Vec::new(),
                    input_required: Some(message),
                }
            }
        };
        let size = prost::Message::encoded_len(&response);
        let limit = tenant.limits().max_message_bytes;
        if size > limit {
            return Err(CallError::ResponseTooLarge {
                server: name.clone(),
                tool: target,
                size,
                limit,
            });
        }
        Ok(response)
    }

    /// The server's failure of this read.
    fn upstream(&self, server: &str, target: &Target, error: UpstreamError) -> CallError {
        CallError::Upstream {
            server: server.to_owned(),
            tool: target.clone(),
            error,
            idempotent: true,
        }
    }

    /// The status of a failed read: no such resource (-32002; or -32602,
    /// which 2026-07-28 servers answer (SEP-2164) and so does the Python
    /// SDK on 2025-11-25: a read's only parameter is its URI), a consent
    /// to give, or the server's failure.
    fn failure(
        &self,
        index: usize,
        server: &str,
        target: &Target,
        error: UpstreamError,
    ) -> CallError {
        if let UpstreamError::JsonRpc { code, .. } = &error
            && (*code == RESOURCE_NOT_FOUND || *code == INVALID_PARAMS)
        {
            return CallError::ResourceNotFound {
                server: server.to_owned(),
                uri: target.name.clone(),
            };
        }
        match upstream_session::failure(self.tenant, index, server, target, self.subject, error) {
            CallError::Upstream {
                server,
                tool,
                error,
                ..
            } => CallError::Upstream {
                server,
                tool,
                error,
                idempotent: true,
            },
            other => other,
        }
    }
}

/// JSON-RPC "resource not found".
const RESOURCE_NOT_FOUND: i32 = -32002;
/// JSON-RPC "invalid params": "resource not found" on `resources/read`
/// from 2026-07-28 servers (SEP-2164), and from the Python SDK on both
/// revisions.
const INVALID_PARAMS: i32 = -32602;

/// One part of a resource's contents: text as it came, a blob decoded.
///
/// # Errors
/// A blob that is not valid base64.
fn resource_contents(
    contents: ResourceContents,
) -> Result<pb::ResourceContents, convert::InvalidContent> {
    use pb::resource_contents::Data;
    Ok(match contents {
        ResourceContents::TextResourceContents {
            uri,
            mime_type,
            text,
            ..
        } => pb::ResourceContents {
            uri,
            mime_type: mime_type.unwrap_or_default(),
            data: Some(Data::Text(text)),
        },
        ResourceContents::BlobResourceContents {
            uri,
            mime_type,
            blob,
            ..
        } => pb::ResourceContents {
            uri,
            mime_type: mime_type.unwrap_or_default(),
            data: Some(Data::Blob(convert::decode(&blob, "a resource blob")?)),
        },
        // Kinds of contents added to MCP after this gateway was built are
        // carried as their JSON text.
        #[allow(unreachable_patterns)]
        other => pb::ResourceContents {
            uri: String::new(),
            mime_type: "application/json".to_owned(),
            data: Some(Data::Text(
                serde_json::to_string(&other).unwrap_or_default(),
            )),
        },
    })
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
