//! The OAuth consent listener (`oauth.listen`): the redirect endpoints an
//! authorization server sends the end user's browser back to (one per
//! tenant × server), and the client ID metadata documents that name each
//! tenant's client to authorization servers that accept them.
//!
//! A callback may reach any replica: the pending flow it completes (PKCE
//! verifier, tenant, subject, server) is read from the state store by its
//! `state`, it must have arrived at that flow's own redirect URI, and the
//! credentials belong to the key the flow names, never one the callback
//! could choose. They are held until the tenant's application confirms them
//! for that subject (`CompleteAuthorization`, in the gRPC surface): the
//! browser is sent on to the tenant's `consent_return_url` with a one-time
//! code. Whoever opens a link is not trusted to be the subject it was made
//! for.
//!
//! The listener is public (browsers reach it): a callback that completes no
//! flow is counted and recorded with its peer's address only under a rate
//! ([`limit`]), so forged callbacks cannot fill the audit trail.

pub mod limit;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use tokio_util::sync::CancellationToken;

use crate::config::{OAuthListener, TenantConsent};
use crate::credentials::oauth::{
    Completed, ConsentCode, OAuthError, OAuthStore, PendingFlow, pending_flow,
};
use crate::registry::Registry;
use crate::state::TokenKey;

/// What the handlers share.
#[derive(Debug, Clone)]
struct Consent {
    registry: Arc<Registry>,
    store: Arc<dyn OAuthStore>,
    listener: OAuthListener,
    unmatched: Arc<limit::UnmatchedLimiter>,
}

/// The listener's routes, under the path of `oauth.public_url` (and at the
/// root as well, for proxies that strip that path).
pub fn router(
    registry: Arc<Registry>,
    store: Arc<dyn OAuthStore>,
    listener: OAuthListener,
) -> axum::Router {
    let prefix = listener.public_url.path().trim_end_matches('/').to_owned();
    let state = Consent {
        registry,
        store,
        listener,
        unmatched: Arc::default(),
    };
    let mut router = axum::Router::new();
    let mut prefixes = vec![String::new()];
    if !prefix.is_empty() {
        prefixes.push(prefix);
    }
    for prefix in prefixes {
        router = router
            .route(
                &format!("{prefix}/oauth/{{tenant}}/{{server}}/callback"),
                axum::routing::get(callback),
            )
            .route(
                &format!("{prefix}/oauth/{{tenant}}/{{server}}/client-metadata.json"),
                axum::routing::get(client_metadata),
            )
            // The one redirect URI of releases before per-server ones: its
            // flows cannot be told apart from a mix-up; they start again.
            .route(
                &format!("{prefix}/oauth/callback"),
                axum::routing::get(shared_callback),
            );
    }
    router.with_state(state)
}

/// Serves the consent listener until `stop` is cancelled, on a
/// `TcpListener` or (TLS) a `crate::listen::PeerAddrTlsListener` (both
/// give handlers the peer's `ConnectInfo<SocketAddr>`).
pub async fn serve<L>(listener: L, router: axum::Router, stop: CancellationToken)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
    for<'a> SocketAddr: axum::extract::connect_info::Connected<axum::serve::IncomingStream<'a, L>>,
{
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, service)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!(error = %e, "OAuth consent listener failed");
    }
}

/// `GET /oauth/<tenant>/<server>/callback?code=...&state=...&iss=...`:
/// completes the flow the `state` names, when that flow is this tenant's
/// server's. The grant is held for the tenant's application to confirm
/// (the browser goes on to `consent_return_url` with a one-time code), or,
/// with `confirm_consent: false`, stored at once.
async fn callback(
    State(consent): State<Consent>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((tenant_name, server_name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let callback_url = format!(
        "{}?{}",
        consent.listener.redirect_uri(&tenant_name, &server_name),
        query.unwrap_or_default()
    );
    let flow = match pending_flow(consent.store.as_ref(), &callback_url).await {
        Ok(flow) => flow,
        Err(error) => {
            // No flow: nobody is known to be consenting (an expired or
            // forged link). Recorded only under the rate.
            return unmatched(&consent, peer, &error).await;
        }
    };
    // The flow's own client completes it; it refuses a callback that
    // arrived at another server's redirect URI.
    let tenant = consent
        .registry
        .tenants()
        .into_iter()
        .find(|t| t.name == flow.tenant);
    let Some((tenant, client)) =
        tenant.and_then(|t| t.oauth_client(&flow.server).map(|client| (t, client)))
    else {
        return page(
            StatusCode::NOT_FOUND,
            "Authorization not completed",
            "The server this authorization was for is no longer configured.",
        );
    };
    let hold = matches!(tenant.consent, TenantConsent::Confirmed(_));
    match client.complete(&callback_url, hold).await {
        Ok(done) => {
            // The client recorded `consent_completed` or `consent_held`:
            // written before the page leaves.
            if let Some(context) = consent.registry.oauth() {
                context.audit.flush().await;
            }
            match done {
                Completed::Stored(key) => {
                    tenant.consented(&key.server, &key.subject);
                    authorized(&key)
                }
                Completed::Held(key, code) => match &tenant.consent {
                    TenantConsent::Confirmed(Some(return_url)) => back_to(return_url, &code),
                    _ => {
                        tracing::error!(tenant = %key.tenant, server = %key.server, "no consent_return_url to send a held consent to");
                        page(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "Authorization not completed",
                            "The gateway has no address of your application to confirm this \
                             authorization with (tenants[].consent_return_url).",
                        )
                    }
                },
            }
        }
        Err(error) => {
            tracing::warn!(tenant = %flow.tenant, server = %flow.server, %error, "OAuth callback refused");
            consent_failed(&consent, Some(&flow), &error, peer).await;
            refused_for(&flow, &error)
        }
    }
}

/// `GET /oauth/callback`: the shared redirect URI of earlier releases.
/// Nothing completes there (a flow started before the upgrade starts
/// again); counted and limited like any callback that completes nothing.
async fn shared_callback(
    State(consent): State<Consent>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> Response {
    unmatched(&consent, peer, &OAuthError::UnknownState).await
}

/// The page of a grant stored at once (`confirm_consent: false`): whose
/// access was granted to whom, so a user who opened someone else's link
/// can tell.
fn authorized(key: &TokenKey) -> Response {
    let subject = subject_words(&key.subject);
    page(
        StatusCode::OK,
        "Authorized",
        &format!(
            "toolgate may now use the server <code>{}</code> for tenant <code>{}</code>, on \
             behalf of {subject}. If you did not start this from your own application, this \
             link was made for someone else: revoke the access at the authorization server. \
             You can close this window.",
            html_escape(&key.server),
            html_escape(&key.tenant),
        ),
    )
}

/// Sends the browser on to the tenant's application with the one-time
/// `code` of the held consent (303, so the callback is not re-posted).
fn back_to(return_url: &url::Url, code: &ConsentCode) -> Response {
    let mut url = return_url.clone();
    url.query_pairs_mut().append_pair("code", code.expose());
    (
        StatusCode::SEE_OTHER,
        [
            (axum::http::header::LOCATION, url.to_string()),
            (axum::http::header::CACHE_CONTROL, "no-store".to_owned()),
            (
                axum::http::header::REFERRER_POLICY,
                "no-referrer".to_owned(),
            ),
        ],
    )
        .into_response()
}

/// A callback that completed no flow: counted, and recorded with `peer`
/// while `peer` and all peers stay under the rate; past it, 429 with
/// nothing written. A store failure is not the caller's doing: it is
/// always recorded (and answered 503).
async fn unmatched(consent: &Consent, peer: SocketAddr, error: &OAuthError) -> Response {
    let verdict = match error {
        OAuthError::Store(_) => limit::Verdict::Record,
        _ => consent.unmatched.check(peer.ip()),
    };
    consent.registry.callback_unmatched(verdict.label());
    if verdict == limit::Verdict::Limited {
        return too_many();
    }
    consent_failed(consent, None, error, peer).await;
    refused(error)
}

/// Counts a failed callback (for the flow's server, when one was found)
/// and records it, with the peer's address, in the audit trail before the
/// page leaves.
async fn consent_failed(
    consent: &Consent,
    flow: Option<&PendingFlow>,
    error: &OAuthError,
    peer: SocketAddr,
) {
    let (tenant, subject, server) = flow.map_or(("", "", ""), |f| {
        (f.tenant.as_str(), f.subject.as_str(), f.server.as_str())
    });
    if flow.is_some() {
        consent
            .registry
            .oauth_event(tenant, server, "consent_failed");
    }
    if let Some(context) = consent.registry.oauth() {
        context.audit.authorization_from(
            tenant,
            subject,
            server,
            "consent_failed",
            Some(audit_reason(error)),
            Some(peer),
        );
        context.audit.flush().await;
    }
}

/// Why a consent failed, as the audit record says it (stable, secret-free).
fn audit_reason(error: &OAuthError) -> &'static str {
    match error {
        OAuthError::UnknownState => "unknown_state",
        OAuthError::Declined(_) => "declined",
        OAuthError::Callback(_) => "malformed_callback",
        OAuthError::Store(_) => "store_unavailable",
        OAuthError::Issuer(_) => "issuer_mismatch",
        OAuthError::RedirectMismatch => "redirect_mismatch",
        _ => "exchange_failed",
    }
}

/// The page for a callback that completes nothing (the error names no
/// secret: [`OAuthError`] never carries one).
fn refused(error: &OAuthError) -> Response {
    let (status, text) = refusal(error);
    page(status, "Authorization not completed", &html_escape(&text))
}

/// The status and words of a callback that completes nothing.
fn refusal(error: &OAuthError) -> (StatusCode, String) {
    match error {
        OAuthError::UnknownState => (
            StatusCode::BAD_REQUEST,
            "This authorization link has expired or was already used. Start again from your \
             application."
                .to_owned(),
        ),
        OAuthError::Declined(reason) => (
            StatusCode::BAD_REQUEST,
            format!("The authorization was declined ({reason})."),
        ),
        OAuthError::Callback(reason) => (
            StatusCode::BAD_REQUEST,
            format!("The callback is malformed: {reason}."),
        ),
        OAuthError::RedirectMismatch => (
            StatusCode::BAD_REQUEST,
            "This authorization answer arrived at the address of another server than the one \
             it was started for, so it was discarded (an authorization server may be trying to \
             obtain another server's access). Start again from your application."
                .to_owned(),
        ),
        OAuthError::Store(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The gateway's state store is unavailable; try again shortly.".to_owned(),
        ),
        other => (StatusCode::BAD_GATEWAY, other.to_string()),
    }
}

/// The page for a callback of a known flow that failed: [`refused`]'s
/// text, and whose authorization it was (tenant, server, subject), so a
/// user who opened someone else's link can tell.
fn refused_for(flow: &PendingFlow, error: &OAuthError) -> Response {
    let (status, text) = refusal(error);
    let body = format!(
        "{}</p><p>This authorization was for the server <code>{}</code> of tenant \
         <code>{}</code>, on behalf of {}.",
        html_escape(&text),
        html_escape(&flow.server),
        html_escape(&flow.tenant),
        subject_words(&flow.subject),
    );
    page(status, "Authorization not completed", &body)
}

/// The subject as a page names it.
fn subject_words(subject: &str) -> String {
    if subject.is_empty() {
        "the tenant itself (no subject)".to_owned()
    } else {
        format!("subject <code>{}</code>", html_escape(subject))
    }
}

/// The page for an unmatched callback over the rate.
fn too_many() -> Response {
    let mut response = page(
        StatusCode::TOO_MANY_REQUESTS,
        "Authorization not completed",
        "Too many authorization links that complete nothing came from your address. Start \
         again from your application in a minute.",
    );
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("60"),
    );
    response
}

fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title></head>\
         <body><h1>{title}</h1><p>{body}</p></body></html>"
    );
    (
        status,
        [(axum::http::header::CACHE_CONTROL, "no-store")],
        Html(html),
    )
        .into_response()
}

/// `GET /oauth/<tenant>/<server>/client-metadata.json`: the client ID
/// metadata document of one tenant's server (its URL is the client id where
/// authorization servers accept such documents). Each tenant × server is its
/// own client: its `client_name` names the tenant, and its only redirect
/// URI is that server's callback.
async fn client_metadata(
    State(consent): State<Consent>,
    Path((tenant_name, server_name)): Path<(String, String)>,
) -> Response {
    let known = consent.registry.tenants().into_iter().any(|t| {
        t.name == tenant_name
            && t.servers()
                .any(|s| s.name == server_name && s.oauth.as_ref().is_some_and(|o| o.per_user()))
    });
    if !known {
        return StatusCode::NOT_FOUND.into_response();
    }
    let listener = &consent.listener;
    let document = serde_json::json!({
        "client_id": listener.client_metadata_url(&tenant_name, &server_name),
        "client_name": crate::config::client_name(&tenant_name),
        "client_uri": listener.public_url.as_str(),
        "redirect_uris": [listener.redirect_uri(&tenant_name, &server_name)],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    });
    (
        [
            (axum::http::header::CONTENT_TYPE, "application/json"),
            (axum::http::header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        document.to_string(),
    )
        .into_response()
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
