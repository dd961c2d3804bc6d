//! `ListResources`: a tenant's resources and templates, read through from
//! its servers (per subject for per-user servers), filtered, under the
//! tenant's resource policy, paged with stateless tokens. `ReadResource`
//! is a call ([`crate::calls::ResourceRead`]).

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use globset::GlobSet;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tonic::{Request, Status};
use tracing::Instrument;

use super::Gateway;
use crate::callers::{Caller, Subject};
use crate::calls::CallError;
use crate::pb;
use crate::policy::ResourceUri;
use crate::registry::{SessionUnavailable, Tenant};
use crate::upstream::resources::{ListBounds, ResourceListing};
use crate::upstream::{Session, UpstreamError};

/// Resources in a page when the request sets no `page_size`.
const DEFAULT_PAGE_SIZE: usize = 100;
/// The most resources in one page.
const MAX_PAGE_SIZE: usize = 1000;
/// The version of page tokens this gateway makes.
const TOKEN_VERSION: u32 = 1;

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

/// Every resource and template of the tenant that `caller` sees, all
/// pages at once, with each server's status (MCP's gRPC transport has no
/// pagination; each server's listing stays bounded by
/// `limits.max_resources_per_server` and `limits.max_resource_list_bytes`).
/// Servers still connecting are not waited for: the caller settles first.
///
/// # Errors
/// A listing that changed between two of its pages (`PAGE_TOKEN_EXPIRED`).
pub(super) async fn everything(
    tenant: &Arc<Tenant>,
    caller: &Caller,
    subject: &Subject,
) -> Result<pb::ListResourcesResponse, CallError> {
    let request = pb::ListResourcesRequest {
        page_size: u32::try_from(MAX_PAGE_SIZE).unwrap_or(u32::MAX),
        ..Default::default()
    };
    let lister = Lister {
        tenant,
        caller,
        subject,
        filter: ResourceFilter::new(&request)
            .map_err(|status| CallError::InvalidFilter(status.message().to_owned()))?,
    };
    let mut all = lister.page(&request).await?;
    let mut token = std::mem::take(&mut all.next_page_token);
    while !token.is_empty() {
        let next = pb::ListResourcesRequest {
            page_token: token,
            ..request.clone()
        };
        let mut page = lister.page(&next).await?;
        all.resources.append(&mut page.resources);
        token = page.next_page_token;
    }
    Ok(all)
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
            digest: hex::encode(&hash.finalize()[..8]),
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
            let listed = listing.resources.iter().zip(&listing.resource_uris);
            for (position, (resource, uri)) in listed.enumerate() {
                if !self.visible(&server.name, uri) {
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
                for (template, uri) in listing.templates.iter().zip(&listing.template_uris) {
                    if self.visible(&server.name, uri) {
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

    /// Whether this caller sees `uri` (or a URI template) of `server`,
    /// in normal form: the filter and the tenant's policy.
    fn visible(&self, server: &str, uri: &ResourceUri) -> bool {
        self.filter.uri(uri.as_str())
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
}
