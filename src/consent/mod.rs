//! The OAuth consent listener (`oauth.listen`): the redirect endpoint an
//! authorization server sends the end user's browser back to, and the
//! client ID metadata document that names the gateway to authorization
//! servers that accept one.
//!
//! A callback may reach any replica: the pending flow it completes (PKCE
//! verifier, tenant, subject, server) is read from the state store by its
//! `state`, and the credentials are stored under the key the flow names,
//! never one the callback could choose.
//!
//! The listener is public (browsers reach it): a callback that completes no
//! flow is counted and recorded with its peer's address only under a rate
//! ([`limit`]), so forged callbacks cannot fill the audit trail.

pub mod limit;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::OAuthListener;
use crate::credentials::oauth::{OAuthError, OAuthStore, PendingFlow, pending_flow};
use crate::registry::Registry;

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
                &format!("{prefix}/oauth/callback"),
                axum::routing::get(callback),
            )
            .route(
                &format!("{prefix}/oauth/client-metadata.json"),
                axum::routing::get(client_metadata),
            );
    }
    router.with_state(state)
}

/// Serves the consent listener until `stop` is cancelled.
pub async fn serve(listener: TcpListener, router: axum::Router, stop: CancellationToken) {
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, service)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!(error = %e, "OAuth consent listener failed");
    }
}

/// `GET /oauth/callback?code=...&state=...&iss=...`: completes the flow the
/// `state` names.
async fn callback(
    State(consent): State<Consent>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(query): RawQuery,
) -> Response {
    let callback_url = format!(
        "{}?{}",
        consent.listener.redirect_uri(),
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
    match client.complete(&callback_url).await {
        Ok(key) => {
            tenant.consented(&key.server, &key.subject);
            // The client recorded `consent_completed`: written before the
            // page leaves.
            if let Some(context) = consent.registry.oauth() {
                context.audit.flush().await;
            }
            page(
                StatusCode::OK,
                "Authorized",
                &format!(
                    "toolgate may now use {} on your behalf. You can close this window and \
                     return to your application.",
                    html_escape(&key.server)
                ),
            )
        }
        Err(error) => {
            tracing::warn!(tenant = %flow.tenant, server = %flow.server, %error, "OAuth callback refused");
            consent_failed(&consent, Some(&flow), &error, peer).await;
            refused(&error)
        }
    }
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
        _ => "exchange_failed",
    }
}

/// The page for a callback that completes nothing (the error names no
/// secret: [`OAuthError`] never carries one).
fn refused(error: &OAuthError) -> Response {
    let (status, text) = match error {
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
        OAuthError::Store(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The gateway's state store is unavailable; try again shortly.".to_owned(),
        ),
        other => (StatusCode::BAD_GATEWAY, other.to_string()),
    };
    page(status, "Authorization not completed", &html_escape(&text))
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

/// `GET /oauth/client-metadata.json`: the gateway's client ID metadata
/// document (its URL is the client id where authorization servers accept
/// such documents).
async fn client_metadata(State(consent): State<Consent>) -> Response {
    let document = serde_json::json!({
        "client_id": consent.listener.client_metadata_url(),
        "client_name": crate::credentials::oauth::DEFAULT_CLIENT_NAME,
        "client_uri": consent.listener.public_url.as_str(),
        "redirect_uris": [consent.listener.redirect_uri()],
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
