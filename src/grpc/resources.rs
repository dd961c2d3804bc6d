//! `ListResources` and `ReadResource`: a tenant's resources, read through
//! from its servers (per subject for per-user servers), under the tenant's
//! resource policy, redaction and limits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use globset::GlobSet;
use rmcp::model::ResourceContents;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tonic::{Request, Status};
use tracing::Instrument;

use super::call_audit::{AuditedCall, Progress};
use super::error::{CallError, Feature, Target, quoted};
use super::{Gateway, caller_timeout, convert, deadline_margin, input_round, input_state};
use super::{questions, upstream_session};
use crate::callers::{Caller, Subject};
use crate::pb;
use crate::registry::{SessionUnavailable, Tenant};
use crate::upstream::resources::{ListBounds, ReadOutcome, ReadRequest, ResourceListing};
use crate::upstream::{InputKinds, Session, UpstreamError};

/// Resources in a page when the request sets no `page_size`.
const DEFAULT_PAGE_SIZE: usize = 100;
/// The most resources in one page.
const MAX_PAGE_SIZE: usize = 1000;
/// The version of page tokens this gateway makes.
const TOKEN_VERSION: u32 = 1;
/// The longest URI an audit record keeps.
const MAX_AUDIT_URI: usize = 1024;

/// `ListResources`.
pub(super) async fn list(
    gateway: &Gateway,
    request: Request<pb::ListResourcesRequest>,
) -> Result<pb::ListResourcesResponse, Status> {
    let (tenant, _busy) = gateway.listing_tenant(&request)?;
    let (caller, subject) = super::caller_of(&request);
    let span = super::rpc_span("ListResources", &tenant.name);
    crate::telemetry::trace::continue_caller_trace(&span, request.metadata());
    // Servers still connecting settle first (within the caller's
    // deadline, at most 10 s), as for ListTools.
    let wait = super::settle_wait(&request);
    tenant.settled_catalog(wait).instrument(span.clone()).await;
    let request = request.into_inner();
    let lister = Lister {
        tenant: &tenant,
        caller: &caller,
        subject: &subject,
        filter: ResourceFilter::new(&request)?,
    };
    lister
        .page(&request)
        .instrument(span)
        .await
        .map_err(Status::from)
}

/// A validated ListResourcesRequest filter.
struct ResourceFilter {
    servers: Vec<String>,
    uris: Option<GlobSet>,
    /// A digest of the filters, which a page token is bound to.
    digest: String,
}

impl ResourceFilter {
    fn new(request: &pb::ListResourcesRequest) -> Result<Self, Status> {
        let uris = super::listing::glob_set("uri_globs", &request.uri_globs)?;
        let mut hash = Sha256::new();
        for list in [&request.servers, &request.uri_globs] {
            hash.update((list.len() as u64).to_be_bytes());
            for item in list {
                hash.update((item.len() as u64).to_be_bytes());
                hash.update(item.as_bytes());
            }
        }
        Ok(Self {
            servers: request.servers.clone(),
            uris,
            digest: hash.finalize()[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        })
    }

    fn server(&self, name: &str) -> bool {
        self.servers.is_empty() || self.servers.iter().any(|s| s == name)
    }

    fn uri(&self, uri: &str) -> bool {
        self.uris.as_ref().is_none_or(|g| g.is_match(uri))
    }
}

/// Where a page continues: stateless, so any replica accepts it.
#[derive(Debug, Serialize, Deserialize)]
struct PageToken {
    /// [`TOKEN_VERSION`].
    v: u32,
    /// The configured index of the server the page ended in.
    s: usize,
    /// The position in that server's listing to go on from.
    o: usize,
    /// The version of that server's listing.
    l: String,
    /// The digest of the filters it was made for.
    f: String,
}

impl PageToken {
    fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(text: &str, filter: &ResourceFilter) -> Result<Self, CallError> {
        let invalid = |why: &str| CallError::InvalidPageToken(why.to_owned());
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| invalid("not a page token of this gateway"))?;
        let token: PageToken = serde_json::from_slice(&bytes)
            .map_err(|_| invalid("not a page token of this gateway"))?;
        if token.v != TOKEN_VERSION {
            return Err(invalid("a page token of another gateway version"));
        }
        if token.f != filter.digest {
            return Err(invalid(
                "made for other filters: pass the same servers and uri_globs as the first page",
            ));
        }
        Ok(token)
    }
}

/// One ListResources request being answered.
struct Lister<'a> {
    tenant: &'a Arc<Tenant>,
    caller: &'a Caller,
    subject: &'a Subject,
    filter: ResourceFilter,
}

/// What a server's session gave for a listing.
enum Listed {
    /// Its listing.
    Listing(Arc<ResourceListing>),
    /// It does not offer resources.
    Unsupported,
    /// Not listed, with the status that says why.
    Down(pb::ResourceServerStatus),
}

impl Lister<'_> {
    /// One page: resources in configuration order of their servers, from
    /// the token's place on; the first page also carries every template
    /// and each server's status.
    async fn page(
        &self,
        request: &pb::ListResourcesRequest,
    ) -> Result<pb::ListResourcesResponse, CallError> {
        let page_size = match request.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let token = if request.page_token.is_empty() {
            None
        } else {
            Some(PageToken::decode(&request.page_token, &self.filter)?)
        };
        if let Some(token) = &token
            && token.s >= self.tenant.servers().count()
        {
            return Err(CallError::InvalidPageToken(
                "names a server this tenant does not have".to_owned(),
            ));
        }
        let first = token.is_none();
        let mut response = pb::ListResourcesResponse::default();
        let mut next: Option<PageToken> = None;
        let servers: Vec<_> = self.tenant.servers().cloned().collect();
        for (index, server) in servers.iter().enumerate() {
            if !self.filter.server(&server.name) {
                continue;
            }
            // Past the page's end, only the first page goes on (templates,
            // statuses and counts of every server).
            if next.is_some() && !first {
                break;
            }
            let resume = match &token {
                Some(t) if index < t.s => continue,
                Some(t) if index == t.s => Some(t),
                _ => None,
            };
            let expired = || CallError::PageTokenExpired {
                server: server.name.clone(),
            };
            let listing = match self.listing(index, &server.name).await {
                Listed::Listing(listing) => listing,
                Listed::Unsupported if resume.is_some() => return Err(expired()),
                Listed::Unsupported => continue,
                Listed::Down(_) if resume.is_some() => return Err(expired()),
                Listed::Down(status) => {
                    if first {
                        response.servers.push(status);
                    }
                    continue;
                }
            };
            let start = match resume {
                Some(token) if token.l != listing.version => return Err(expired()),
                Some(token) => token.o,
                None => 0,
            };
            let mut count = 0u32;
            for (position, resource) in listing.resources.iter().enumerate() {
                if !self.visible(&server.name, &resource.uri) {
                    continue;
                }
                count += 1;
                if position < start || next.is_some() {
                    continue;
                }
                if response.resources.len() >= page_size {
                    next = Some(PageToken {
                        v: TOKEN_VERSION,
                        s: index,
                        o: position,
                        l: listing.version.clone(),
                        f: self.filter.digest.clone(),
                    });
                    if !first {
                        break;
                    }
                    continue;
                }
                response.resources.push(pb::Resource {
                    server: server.name.clone(),
                    uri: resource.uri.clone(),
                    name: resource.name.clone(),
                    title: resource.title.clone().unwrap_or_default(),
                    description: resource.description.clone().unwrap_or_default(),
                    mime_type: resource.mime_type.clone().unwrap_or_default(),
                    size: resource.size,
                });
            }
            if first {
                for template in &listing.templates {
                    if self.visible(&server.name, &template.uri_template) {
                        response.resource_templates.push(pb::ResourceTemplate {
                            server: server.name.clone(),
                            uri_template: template.uri_template.clone(),
                            name: template.name.clone(),
                            title: template.title.clone().unwrap_or_default(),
                            description: template.description.clone().unwrap_or_default(),
                            mime_type: template.mime_type.clone().unwrap_or_default(),
                        });
                    }
                }
                response.servers.push(pb::ResourceServerStatus {
                    name: server.name.clone(),
                    state: pb::ServerState::Connected.into(),
                    resource_count: count,
                    ..Default::default()
                });
            }
        }
        response.next_page_token = next.map(|t| t.encode()).unwrap_or_default();
        Ok(response)
    }

    /// Whether this caller sees `uri` (or a URI template) of `server`:
    /// the filter and the tenant's policy.
    fn visible(&self, server: &str, uri: &str) -> bool {
        self.filter.uri(uri)
            && self
                .tenant
                .policy()
                .is_none_or(|policy| policy.allows_resource(self.caller, self.subject, server, uri))
    }

    /// The listing of server `index` for this caller's subject.
    async fn listing(&self, index: usize, name: &str) -> Listed {
        let down = |state: pb::ServerState, error: String, url: String| {
            Listed::Down(pb::ResourceServerStatus {
                name: name.to_owned(),
                state: state.into(),
                error,
                authorization_url: url,
                resource_count: 0,
            })
        };
        let session = match resource_session(self.tenant, index, self.subject).await {
            Ok(session) => session,
            Err(SessionFailure::Connecting) => {
                return down(pb::ServerState::Connecting, String::new(), String::new());
            }
            Err(SessionFailure::Down(reason)) => {
                return down(pb::ServerState::Failed, reason, String::new());
            }
            Err(SessionFailure::Consent(url)) => {
                let error = if self.subject.id().is_none() {
                    "the tenant itself (no x-toolgate-subject) has not authorized this server: \
                     open authorization_url"
                } else {
                    "this subject has not authorized this server: open authorization_url"
                };
                return down(
                    pb::ServerState::AuthorizationRequired,
                    error.to_owned(),
                    url,
                );
            }
        };
        if session.server_capabilities().resources.is_none() {
            return Listed::Unsupported;
        }
        match session.resource_listing(&bounds(self.tenant, index)).await {
            Ok(listing) => Listed::Listing(listing),
            Err(error) => down(
                pb::ServerState::Connected,
                format!("its resources could not be listed: {error}"),
                String::new(),
            ),
        }
    }
}

/// The bounds of server `index`'s listing.
fn bounds(tenant: &Tenant, index: usize) -> ListBounds {
    let server = tenant.server(index);
    let limits = tenant.limits();
    ListBounds {
        max_pages: server.max_list_pages,
        max_entries: limits.max_resources_per_server,
        max_bytes: limits.max_resource_list_bytes,
        timeout: server.call_timeout,
    }
}

/// Why a listing has no session.
enum SessionFailure {
    Connecting,
    Down(String),
    Consent(String),
}

/// The session a listing of server `index` uses: the tenant's, or for a
/// per-user server the subject's own (so what a server lists privately
/// never reaches another subject).
async fn resource_session(
    tenant: &Tenant,
    index: usize,
    subject: &Subject,
) -> Result<Arc<Session>, SessionFailure> {
    if tenant.is_per_user(index) {
        return tenant
            .user_session(index, subject)
            .await
            .map_err(|error| match error {
                UpstreamError::AuthorizationRequired { url } => SessionFailure::Consent(url),
                error => SessionFailure::Down(error.to_string()),
            });
    }
    tenant.session(index).map_err(|e| match e {
        SessionUnavailable::Connecting => SessionFailure::Connecting,
        SessionUnavailable::Down(reason) => SessionFailure::Down(reason),
    })
}

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
    let uri = &request.get_ref().uri;
    let redactor = tenant.redactor();
    let audit_uri = bounded(&redactor.redact(uri));
    audited.describe(|record| record.uri = Some(audit_uri));
    let span = super::rpc_span("ReadResource", &tenant.name);
    crate::telemetry::trace::continue_caller_trace(&span, request.metadata());
    audited.trace(&span, request.metadata());
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
    };
    let run = async {
        tokio::select! {
            result = reader.read(&request, &mut audited, &mut sent) => result,
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
}

impl Reader<'_> {
    /// The read in the order of docs/api.md: server, capability, policy
    /// (per-user servers: policy before the consent check), admission,
    /// a listed size over the bound, a retry's state, the audit place,
    /// the read, its contents.
    async fn read(
        &self,
        request: &pb::ReadResourceRequest,
        audited: &mut AuditedCall,
        sent: &mut bool,
    ) -> Result<pb::ReadResourceResponse, CallError> {
        let tenant = self.tenant;
        let name = &request.server;
        let uri = &request.uri;
        let Some(index) = tenant.servers().position(|s| &s.name == name) else {
            return Err(CallError::ServerNotFound {
                server: quoted(name).into_owned(),
            });
        };
        let server = tenant.server(index);
        let target = Target::resource(uri.clone());
        let permitted = || {
            if tenant
                .policy()
                .is_none_or(|p| p.allows_resource(self.caller, self.subject, name, uri))
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
            .admit()
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
            upstream_tool: uri.clone(),
            exposed_name: uri.clone(),
            definition_hash: String::new(),
            args_sha256: input_state::arguments_digest(&rmcp::model::JsonObject::new()),
        };
        let keys = &self.gateway.request_keys;
        let metrics = &self.gateway.metrics;
        let retry = input_round::open_retry(
            keys,
            tenant,
            server,
            (&request.request_state, &request.input_responses),
            &binding,
            // A read has no definition to change.
            || CallError::InputResponseInvalid {
                reason: "the request_state does not fit this read".to_owned(),
            },
        )?;
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
            uri: uri.clone(),
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

    fn filter(globs: &[&str]) -> ResourceFilter {
        ResourceFilter::new(&pb::ListResourcesRequest {
            uri_globs: globs.iter().map(|g| (*g).to_owned()).collect(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn page_tokens_are_bound_to_their_filters() {
        let a = filter(&["file:///*"]);
        let token = PageToken {
            v: TOKEN_VERSION,
            s: 1,
            o: 7,
            l: "abc".to_owned(),
            f: a.digest.clone(),
        }
        .encode();
        let back = PageToken::decode(&token, &a).unwrap();
        assert_eq!((back.s, back.o, back.l.as_str()), (1, 7, "abc"));
        let other = filter(&["demo://*"]);
        assert!(matches!(
            PageToken::decode(&token, &other),
            Err(CallError::InvalidPageToken(_))
        ));
        assert!(matches!(
            PageToken::decode("not a token!", &a),
            Err(CallError::InvalidPageToken(_))
        ));
    }

    #[test]
    fn audit_uris_are_bounded() {
        assert_eq!(bounded("file:///a"), "file:///a");
        let long = "x".repeat(2000);
        let cut = bounded(&long);
        assert!(cut.ends_with("… (2000 characters)"), "{cut}");
        assert!(cut.chars().count() < 1100);
    }
}
