//! A session's resource list (resources and templates), read through and
//! kept while fresh: `ttlMs` where the server gives one, until
//! `list_changed` where it declared it, bounded in entries and bytes.
//! Reads of resources are never cached.
//!
//! Freshness of a listing ([`ListingCache`]):
//! - the server gave `ttlMs`: reused for `min(ttlMs, MAX_LIST_AGE)`
//!   (`ttlMs: 0`: never reused, except by requests that arrived while it
//!   was being fetched), and, when it declared `listChanged`, only until
//!   it says the list changed;
//! - no `ttlMs`, and the server declared `resources.listChanged`: reused
//!   until the server says the list changed, or [`MAX_LIST_AGE`]. On a
//!   2026-07-28 session the notice comes on a `subscriptions/listen`
//!   stream this module opens on first use; while that stream is not open
//!   (reopening with backoff), nothing is reused;
//! - neither: reused for [`DEFAULT_LIST_TTL`].
//!
//! A failed re-list is an error, never the previous list.
//!
//! A listing is kept with its URIs and URI templates in normal form
//! ([`ResourceUri`]), so that what is listed is what the resource rules
//! match and what a read of it sends; an entry with none is left out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::{
    ClientRequest, InputRequiredResult, InputResponses, ListResourceTemplatesRequest,
    ListResourcesRequest, PaginatedRequestParams, ReadResourceRequest, ReadResourceRequestParams,
    ReadResourceResult, Resource, ResourceTemplate, ServerNotification, ServerResult,
    SubscriptionFilter,
};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::events::{ListKind, SessionEvents};
use super::{InputKinds, Request, Session, UpstreamError};
use crate::policy::ResourceUri;

/// How long a listing is reused at most, whatever the server says.
pub(crate) const MAX_LIST_AGE: Duration = Duration::from_secs(300);

/// How long a listing is reused when the server gives no `ttlMs` and did
/// not declare `resources.listChanged`.
pub(crate) const DEFAULT_LIST_TTL: Duration = Duration::from_secs(10);

/// The first wait before a `subscriptions/listen` stream that ended is
/// opened again; doubled after each failure up to [`LISTEN_BACKOFF_MAX`].
const LISTEN_BACKOFF: Duration = Duration::from_millis(500);

/// The longest wait before a listen stream is opened again.
const LISTEN_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// JSON-RPC "method not found".
const METHOD_NOT_FOUND: i32 = -32601;

/// How far a listing may go.
#[derive(Debug, Clone, Copy)]
pub struct ListBounds {
    /// Most pages of each list (`servers[].max_list_pages`).
    pub max_pages: u32,
    /// Most resources and templates together
    /// (`limits.max_resources_per_server`).
    pub max_entries: usize,
    /// Most bytes of URIs, names, titles, descriptions and MIME types
    /// (`limits.max_resource_list_bytes`).
    pub max_bytes: usize,
    /// How long each page may take.
    pub timeout: Duration,
}

/// Why a session's resources could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    /// The server failed a `resources/list` or `resources/templates/list`.
    #[error("{method}: {error}")]
    Upstream {
        /// Which list.
        method: &'static str,
        /// What failed.
        error: UpstreamError,
    },
    /// The server kept handing out cursors.
    #[error("{method}: more than {limit} pages (servers[].max_list_pages)")]
    TooManyPages {
        /// Which list.
        method: &'static str,
        /// The bound.
        limit: u32,
    },
    /// The server handed out a cursor it had handed out before.
    #[error("{method}: the server repeated a cursor")]
    RepeatedCursor {
        /// Which list.
        method: &'static str,
    },
    /// More resources and templates than the gateway keeps.
    #[error("more than {limit} resources and templates (limits.max_resources_per_server)")]
    TooMany {
        /// The bound.
        limit: usize,
    },
    /// A list larger than the gateway keeps.
    #[error("the resource list is over {limit} bytes (limits.max_resource_list_bytes)")]
    TooLarge {
        /// The bound.
        limit: usize,
    },
}

impl ListingError {
    /// The upstream failure, when it is one.
    #[must_use]
    pub fn upstream(&self) -> Option<&UpstreamError> {
        match self {
            ListingError::Upstream { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// Everything a session's server lists: its resources and templates, as
/// read at `fetched`.
#[derive(Debug)]
pub struct ResourceListing {
    /// Every resource, all pages, in the server's order, its URI in
    /// normal form.
    pub resources: Vec<Resource>,
    /// The URI of each of `resources`, as the resource rules match it.
    pub resource_uris: Vec<ResourceUri>,
    /// Every resource template, all pages, its URI template in normal
    /// form.
    pub templates: Vec<ResourceTemplate>,
    /// The URI template of each of `templates`, as the resource rules
    /// match it.
    pub template_uris: Vec<ResourceUri>,
    /// A digest of the contents: equal listings have equal versions (page
    /// tokens carry it).
    pub version: String,
    /// When its fetch ended.
    finished: Instant,
    /// Until when it is reused, whatever else.
    fresh_until: Instant,
    /// The list generation when its fetch began, when the server declared
    /// `listChanged` (a notice ends reuse, `ttlMs` or not).
    generation: Option<u64>,
    /// Reused until a notice (no `ttlMs`): only while notices can arrive.
    until_notice: bool,
}

impl ResourceListing {
    /// The `size` the server listed for `uri`, when it did.
    #[must_use]
    pub fn size_of(&self, uri: &str) -> Option<u64> {
        self.resources
            .iter()
            .find(|r| r.uri == uri)
            .and_then(|r| r.size)
    }
}

/// The resource list of one session, as last read; one fetch at a time
/// (requests arriving during a fetch share its result).
#[derive(Debug, Default)]
pub(crate) struct ListingCache {
    last: tokio::sync::Mutex<Option<Arc<ResourceListing>>>,
    /// Whether a 2026-07-28 session's listen stream is open (only then can
    /// a listing be reused until `list_changed`).
    listening: Arc<AtomicBool>,
    /// The listen task, once started; stopped with the session.
    listen: std::sync::OnceLock<DropGuard>,
}

/// What a `resources/read` came back with.
#[derive(Debug)]
pub enum ReadOutcome {
    /// The contents (redacted when the server's results are).
    Complete(ReadResourceResult),
    /// A 2026-07-28 server needs answers first.
    InputRequired(InputRequiredResult),
}

/// One `resources/read`.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    /// The resource.
    pub uri: String,
    /// How long to wait.
    pub timeout: Duration,
    /// The kinds of question the worker answers.
    pub accepts: InputKinds,
    /// A retry's answers.
    pub input_responses: Option<InputResponses>,
    /// A retry's `requestState`, echoed.
    pub request_state: Option<String>,
    /// The caller's trace context.
    pub inherited_trace: Vec<(String, String)>,
}

impl Session {
    /// The session's resources and templates: the kept listing while it is
    /// fresh (see the module's documentation), else read again, all pages,
    /// within `bounds`. Requests arriving while a fetch runs wait for it
    /// and share it.
    ///
    /// # Errors
    /// The server failed a list request, or its list breaks a bound. The
    /// previous listing is never handed out instead.
    pub async fn resource_listing(
        &self,
        bounds: &ListBounds,
    ) -> Result<Arc<ResourceListing>, ListingError> {
        let asked = Instant::now();
        let list_changed = self
            .server_capabilities()
            .resources
            .and_then(|r| r.list_changed)
            .unwrap_or(false);
        if list_changed && self.is_stateless() {
            self.start_listening();
        }
        let generation = self.events().list_generation(ListKind::Resources);
        let mut last = self.resources.last.lock().await;
        if let Some(listing) = last.as_ref() {
            let now = Instant::now();
            let same_list = listing.generation.is_none_or(|g| g == *generation.borrow())
                && (!listing.until_notice || self.notices_arrive());
            // Fetched while this request waited (single flight): shared.
            if listing.finished >= asked || (now < listing.fresh_until && same_list) {
                return Ok(listing.clone());
            }
        }
        *last = None;
        let started = Instant::now();
        let at_generation = *generation.borrow();
        let (resources, resource_ttl) = self.list_resources(bounds).await?;
        let (templates, template_ttl) = self.list_templates(bounds).await?;
        check_bounds(&resources, &templates, bounds)?;
        let (resources, resource_uris, templates, template_uris) =
            self.normalized(resources, templates);
        let ttl = match (resource_ttl, template_ttl) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let reuse = match ttl {
            Some(ms) => Duration::from_millis(ms).min(MAX_LIST_AGE),
            None if list_changed => MAX_LIST_AGE,
            None => DEFAULT_LIST_TTL,
        };
        let listing = Arc::new(ResourceListing {
            version: version_of(&resources, &templates),
            resources,
            resource_uris,
            templates,
            template_uris,
            finished: Instant::now(),
            fresh_until: started + reuse,
            generation: list_changed.then_some(at_generation),
            until_notice: list_changed && ttl.is_none(),
        });
        *last = Some(listing.clone());
        Ok(listing)
    }

    /// The listing with each URI and URI template in its normal form
    /// ([`ResourceUri`]): what the resource rules match, and what a read
    /// of a listed URI sends. An entry that has none is left out (a read
    /// of it would be refused), with a warning.
    fn normalized(
        &self,
        resources: Vec<Resource>,
        templates: Vec<ResourceTemplate>,
    ) -> (
        Vec<Resource>,
        Vec<ResourceUri>,
        Vec<ResourceTemplate>,
        Vec<ResourceUri>,
    ) {
        let mut refused = Vec::new();
        let mut kept = Vec::with_capacity(resources.len());
        let mut resource_uris = Vec::with_capacity(resources.len());
        for mut resource in resources {
            match ResourceUri::parse(&resource.uri) {
                Ok(uri) => {
                    resource.uri = uri.as_str().to_owned();
                    kept.push(resource);
                    resource_uris.push(uri);
                }
                Err(error) => refused.push(error),
            }
        }
        let mut kept_templates = Vec::with_capacity(templates.len());
        let mut template_uris = Vec::with_capacity(templates.len());
        for mut template in templates {
            match ResourceUri::template(&template.uri_template) {
                Ok(uri) => {
                    template.uri_template = uri.as_str().to_owned();
                    kept_templates.push(template);
                    template_uris.push(uri);
                }
                Err(error) => refused.push(error),
            }
        }
        if let Some(first) = refused.first() {
            tracing::warn!(
                tenant = %self.label.tenant,
                server = %self.label.server,
                refused = refused.len(),
                first = %self.redaction.redact(&first.to_string()),
                "resources listed with URIs that have no normal form are left out of the listing"
            );
        }
        (kept, resource_uris, kept_templates, template_uris)
    }

    /// The listing kept now, fresh or not, without asking the server (a
    /// read checks a listed size against `max_result_bytes`).
    pub fn kept_listing(&self) -> Option<Arc<ResourceListing>> {
        self.resources
            .last
            .try_lock()
            .ok()
            .and_then(|last| last.clone())
    }

    /// Whether `list_changed` notices reach the session: always on a
    /// 2025-11-25 session, only while the listen stream is open on a
    /// 2026-07-28 one.
    fn notices_arrive(&self) -> bool {
        !self.is_stateless() || self.resources.listening.load(Ordering::Acquire)
    }

    /// Opens the session's `subscriptions/listen` stream for
    /// `resources_list_changed`, once; what it receives goes to
    /// [`Session::events`]. It is opened again with backoff when it ends,
    /// and stops with the session.
    fn start_listening(&self) {
        let cache = &self.resources;
        if cache.listen.get().is_some() {
            return;
        }
        let stop = CancellationToken::new();
        if cache.listen.set(stop.clone().drop_guard()).is_err() {
            return;
        }
        let peers = self.peers.clone();
        let events = self.client.events().clone();
        let listening = cache.listening.clone();
        let mut end = self.end.clone();
        let label = self.label.clone();
        tokio::spawn(async move {
            let run = listen_loop(&peers, &events, &listening, &label);
            tokio::select! {
                () = run => {}
                () = stop.cancelled() => {}
                _ = end.wait_for(|end| *end >= super::End::Ended) => {}
            }
            listening.store(false, Ordering::Release);
        });
    }

    /// Every page of `resources/list`, and the smallest `ttlMs` given.
    async fn list_resources(
        &self,
        bounds: &ListBounds,
    ) -> Result<(Vec<Resource>, Option<u64>), ListingError> {
        const METHOD: &str = "resources/list";
        let mut all = Vec::new();
        let ttl = self
            .pages(
                METHOD,
                bounds,
                |cursor| {
                    ClientRequest::ListResourcesRequest(match cursor {
                        Some(c) => ListResourcesRequest::with_param(
                            PaginatedRequestParams::default().with_cursor(Some(c)),
                        ),
                        None => ListResourcesRequest::default(),
                    })
                },
                |result| match result {
                    ServerResult::ListResourcesResult(page) => {
                        all.extend(page.resources);
                        Ok((page.next_cursor, page.ttl_ms))
                    }
                    // An empty page can parse as another empty list.
                    ServerResult::ListResourceTemplatesResult(page)
                        if page.resource_templates.is_empty() =>
                    {
                        Ok((page.next_cursor, page.ttl_ms))
                    }
                    _ => Err(()),
                },
            )
            .await?;
        Ok((all, ttl))
    }

    /// Every page of `resources/templates/list`, and the smallest `ttlMs`.
    async fn list_templates(
        &self,
        bounds: &ListBounds,
    ) -> Result<(Vec<ResourceTemplate>, Option<u64>), ListingError> {
        const METHOD: &str = "resources/templates/list";
        let mut all = Vec::new();
        let listed = self
            .pages(
                METHOD,
                bounds,
                |cursor| {
                    ClientRequest::ListResourceTemplatesRequest(match cursor {
                        Some(c) => ListResourceTemplatesRequest::with_param(
                            PaginatedRequestParams::default().with_cursor(Some(c)),
                        ),
                        None => ListResourceTemplatesRequest::default(),
                    })
                },
                |result| match result {
                    ServerResult::ListResourceTemplatesResult(page) => {
                        all.extend(page.resource_templates);
                        Ok((page.next_cursor, page.ttl_ms))
                    }
                    ServerResult::ListResourcesResult(page) if page.resources.is_empty() => {
                        Ok((page.next_cursor, page.ttl_ms))
                    }
                    _ => Err(()),
                },
            )
            .await;
        match listed {
            Ok(ttl) => Ok((all, ttl)),
            // Servers without templates may not serve the method at all
            // (mcp-server-sqlite): no templates.
            Err(ListingError::Upstream {
                error: UpstreamError::JsonRpc { code, .. },
                ..
            }) if code == METHOD_NOT_FOUND => Ok((Vec::new(), None)),
            Err(error) => Err(error),
        }
    }

    /// Follows `nextCursor` to the end within `bounds.max_pages`, refusing
    /// a cursor seen before; `take` keeps each page's items. Returns the
    /// smallest `ttlMs` of the pages.
    async fn pages(
        &self,
        method: &'static str,
        bounds: &ListBounds,
        request: impl Fn(Option<String>) -> ClientRequest,
        mut take: impl FnMut(ServerResult) -> Result<(Option<String>, Option<u64>), ()>,
    ) -> Result<Option<u64>, ListingError> {
        let mut cursor = None;
        let mut seen = std::collections::HashSet::new();
        let mut ttl: Option<u64> = None;
        for _ in 0..bounds.max_pages {
            let answer = self
                .request(&Request::new(request(cursor.take()), bounds.timeout))
                .await
                .map_err(|error| ListingError::Upstream { method, error })?;
            let (next, page_ttl) = take(answer).map_err(|()| ListingError::Upstream {
                method,
                error: UpstreamError::Protocol(format!("the answer to {method} is not a list")),
            })?;
            if let Some(page_ttl) = page_ttl {
                ttl = Some(ttl.map_or(page_ttl, |t| t.min(page_ttl)));
            }
            match next {
                None => return Ok(ttl),
                Some(next) => {
                    if !seen.insert(next.clone()) {
                        return Err(ListingError::RepeatedCursor { method });
                    }
                    cursor = Some(next);
                }
            }
        }
        Err(ListingError::TooManyPages {
            method,
            limit: bounds.max_pages,
        })
    }

    /// Reads resource `read.uri` from the server (what the call pipeline
    /// keeps of it is its own: `calls::cache`). Text contents (and URIs and `_meta`) are redacted when the
    /// server's results are (`redact_results`); blobs never are.
    ///
    /// # Errors
    /// As [`Session::request`]; an answer that is neither contents nor
    /// questions is a protocol error.
    pub async fn read_resource(&self, read: &ReadRequest) -> Result<ReadOutcome, UpstreamError> {
        let mut params = ReadResourceRequestParams::new(read.uri.clone());
        params.input_responses.clone_from(&read.input_responses);
        params.request_state.clone_from(&read.request_state);
        let mut request = Request::new(
            ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params)),
            read.timeout,
        );
        request.accepts = read.accepts;
        request.inherited_trace.clone_from(&read.inherited_trace);
        match self.request(&request).await? {
            ServerResult::ReadResourceResult(mut result) => {
                if self.redacts_results() {
                    redact_read(&mut result, self.redaction());
                }
                Ok(ReadOutcome::Complete(result))
            }
            ServerResult::InputRequiredResult(asked) => Ok(ReadOutcome::InputRequired(asked)),
            _ => Err(UpstreamError::Protocol(
                "the answer to resources/read is neither contents nor questions".to_owned(),
            )),
        }
    }
}

/// Opens `subscriptions/listen` for `resources_list_changed` and feeds
/// what arrives to `events`, again and again (with backoff) until the task
/// is stopped. While no stream is open, `listening` is false (listings are
/// then not reused), and each (re)opening counts as a change.
async fn listen_loop(
    peers: &super::lease::Peers,
    events: &SessionEvents,
    listening: &AtomicBool,
    label: &super::Label,
) {
    let mut backoff = LISTEN_BACKOFF;
    loop {
        let filter = SubscriptionFilter::builder()
            .resources_list_changed()
            .build();
        // Held while the stream is open: a stateless session's service
        // stays open with it.
        let listened = match peers.hold().await {
            Ok(live) => live.listen(filter).await.map(|s| (s, live)),
            Err(super::lease::OpenError::Service(error)) => Err(error),
            Err(super::lease::OpenError::Upstream(_)) => Err(rmcp::ServiceError::TransportClosed),
        };
        match listened {
            Ok((mut subscription, _live)) => {
                listening.store(true, Ordering::Release);
                // What changed before the stream was open was not heard.
                events.list_changed(ListKind::Resources);
                backoff = LISTEN_BACKOFF;
                while let Ok(Some(notification)) = subscription.next().await {
                    if let ServerNotification::ResourceListChangedNotification(_) = notification {
                        events.list_changed(ListKind::Resources);
                    }
                }
                listening.store(false, Ordering::Release);
                events.list_changed(ListKind::Resources);
                tracing::debug!(
                    tenant = %label.tenant,
                    server = %label.server,
                    end = ?subscription.end(),
                    "the resources/list_changed listen stream ended; opening it again"
                );
            }
            Err(error) => tracing::debug!(
                tenant = %label.tenant,
                server = %label.server,
                %error,
                "subscriptions/listen for resources/list_changed failed; trying again"
            ),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LISTEN_BACKOFF_MAX);
    }
}

/// Refuses a listing over `bounds` (entries, retained bytes).
fn check_bounds(
    resources: &[Resource],
    templates: &[ResourceTemplate],
    bounds: &ListBounds,
) -> Result<(), ListingError> {
    if resources.len() + templates.len() > bounds.max_entries {
        return Err(ListingError::TooMany {
            limit: bounds.max_entries,
        });
    }
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let bytes: usize = resources
        .iter()
        .map(|r| {
            r.uri.len() + r.name.len() + text(&r.title) + text(&r.description) + text(&r.mime_type)
        })
        .chain(templates.iter().map(|t| {
            t.uri_template.len()
                + t.name.len()
                + text(&t.title)
                + text(&t.description)
                + text(&t.mime_type)
        }))
        .sum();
    if bytes > bounds.max_bytes {
        return Err(ListingError::TooLarge {
            limit: bounds.max_bytes,
        });
    }
    Ok(())
}

/// The version of a listing: a digest of what a caller is shown of it.
fn version_of(resources: &[Resource], templates: &[ResourceTemplate]) -> String {
    let mut hash = Sha256::new();
    let mut field = |s: &str| {
        hash.update((s.len() as u64).to_be_bytes());
        hash.update(s.as_bytes());
    };
    let opt = |s: &Option<String>| s.clone().unwrap_or_default();
    for r in resources {
        field("r");
        field(&r.uri);
        field(&r.name);
        field(&opt(&r.title));
        field(&opt(&r.description));
        field(&opt(&r.mime_type));
        field(&r.size.map(|s| s.to_string()).unwrap_or_default());
    }
    for t in templates {
        field("t");
        field(&t.uri_template);
        field(&t.name);
        field(&opt(&t.title));
        field(&opt(&t.description));
        field(&opt(&t.mime_type));
    }
    hex::encode(&hash.finalize()[..12])
}

/// Takes configured credentials and live tokens out of a read's text
/// contents, URIs and `_meta`; blobs are left alone.
fn redact_read(result: &mut ReadResourceResult, redaction: &crate::credentials::Redaction) {
    if redaction.is_empty() {
        return;
    }
    for contents in &mut result.contents {
        super::redact::redact_contents(contents, redaction);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_follow_contents() {
        let a = vec![Resource::new("file:///a", "a")];
        let b = vec![Resource::new("file:///b", "a")];
        assert_eq!(version_of(&a, &[]), version_of(&a.clone(), &[]));
        assert_ne!(version_of(&a, &[]), version_of(&b, &[]));
        let t = vec![ResourceTemplate::new("file:///{p}", "p")];
        assert_ne!(version_of(&a, &[]), version_of(&a, &t));
    }

    #[test]
    fn bounds_count_resources_and_templates() {
        let bounds = ListBounds {
            max_pages: 1,
            max_entries: 2,
            max_bytes: 1000,
            timeout: Duration::from_secs(1),
        };
        let r = vec![
            Resource::new("file:///a", "a"),
            Resource::new("file:///b", "b"),
        ];
        let t = vec![ResourceTemplate::new("file:///{p}", "p")];
        assert!(check_bounds(&r, &[], &bounds).is_ok());
        assert!(matches!(
            check_bounds(&r, &t, &bounds),
            Err(ListingError::TooMany { limit: 2 })
        ));
        let small = ListBounds {
            max_bytes: 10,
            ..bounds
        };
        assert!(matches!(
            check_bounds(&r, &[], &small),
            Err(ListingError::TooLarge { limit: 10 })
        ));
    }
}
