//! OAuth for the registry: the state store and consent listener a gateway
//! was started with, the OAuth client of each OAuth server, and whose token
//! a server's own session (the one that lists its tools) uses.
//!
//! - `client_credentials` servers: the tenant's own token (subject `""`),
//!   for the listing session and every call.
//! - `authorization_code` servers (per user): calls run on a session of the
//!   call's subject, with that subject's token ([`super::users`]). The tools
//!   are listed with the tenant's own token when the tenant itself has
//!   consented (a call without `x-toolgate-subject`), else with the token of
//!   the subject that consented first; until someone consents, the server
//!   is `AUTHORIZATION_REQUIRED` and lists nothing.
//! - `token_exchange` and `identity_assertion` servers (per user, no
//!   consent): as `authorization_code`, but a subject's token is its
//!   latest verified JWT exchanged ([`OAuthContext::subject_tokens`]); only
//!   JWT callers may call them, and until one has, nothing is listed.

use std::sync::Arc;

use crate::config::{OAuthListener, ServerConfig, Transport};
use crate::credentials::OAuthTokens;
use crate::credentials::oauth::{EventSink, OAuthClient, OAuthSettings, OAuthStore, SubjectTokens};
use crate::state::{StateStore, TokenKey};
use crate::telemetry::Metrics;
use crate::upstream::{Bearer, SessionOptions};

/// Subjects tried, oldest consent first, for the listing session.
const LISTING_CANDIDATES: usize = 8;

/// What OAuth servers share: the state store (tokens, clients, pending
/// consents) and the consent listener's settings.
#[derive(Debug, Clone)]
pub struct OAuthContext {
    /// The state store.
    pub state: StateStore,
    /// The OAuth view of the state store.
    pub store: Arc<dyn OAuthStore>,
    /// The consent listener (`oauth:`), when configured.
    pub listener: Option<OAuthListener>,
    /// Where authorization events are recorded (consent started,
    /// completed, failed; authorization required; tokens exchanged).
    pub audit: crate::audit::Audit,
    /// The latest verified JWT of each JWT caller of a tenant with a
    /// delegated server (`token_exchange`, `identity_assertion`): what its
    /// sessions exchange, again when their token expires.
    pub subject_tokens: Arc<SubjectTokens>,
}

/// The OAuth client of `server`, when it has `oauth:`.
///
/// # Errors
/// A reason, in words, when the client cannot be built (no state store
/// open, not an HTTP server, settings that cannot work).
pub(super) fn client_for(
    tenant: &str,
    server: &ServerConfig,
    context: Option<&OAuthContext>,
    metrics: &Arc<Metrics>,
) -> Result<Option<Arc<OAuthClient>>, String> {
    let Some(oauth) = &server.oauth else {
        return Ok(None);
    };
    let Some(context) = context else {
        return Err(
            "OAuth needs the state store, which is opened at start: restart the gateway to add \
             the first OAuth server"
                .to_owned(),
        );
    };
    let Transport::Http { url, .. } = &server.transport else {
        return Err("OAuth applies to HTTP servers only".to_owned());
    };
    let settings = OAuthSettings::from_config(
        url.clone(),
        oauth,
        context.listener.as_ref(),
        (tenant, &server.name),
    );
    let metrics = metrics.clone();
    let audit = context.audit.clone();
    let events = EventSink::new(move |key, event, reason| {
        metrics.oauth_event(&key.tenant, &key.server, event);
        audit.authorization(&key.tenant, &key.subject, &key.server, event, reason);
    });
    OAuthClient::new(settings, context.store.clone())
        .map(|client| {
            let client = client
                .with_events(events)
                .with_subject_tokens(context.subject_tokens.clone());
            Some(Arc::new(client))
        })
        .map_err(|e| e.to_string())
}

/// Session options carrying the tokens of `key`.
pub(super) fn options_for(client: &Arc<OAuthClient>, key: TokenKey) -> SessionOptions {
    SessionOptions {
        bearer: Some(Bearer::new(Arc::new(OAuthTokens::new(client.clone(), key)))),
        ..SessionOptions::default()
    }
}

/// Whose tokens may list a per-user server's tools, in the order to try:
/// the tenant itself when it has consented, then subjects by the least
/// recently written token (one query; no token is opened).
///
/// # Errors
/// The state store cannot be read.
pub(super) async fn listing_candidates(
    context: &OAuthContext,
    tenant: &str,
    server: &str,
) -> Result<Vec<TokenKey>, String> {
    let subjects = context
        .state
        .subjects(tenant, server, LISTING_CANDIDATES)
        .await
        .map_err(|e| e.to_string())?;
    Ok(subjects
        .into_iter()
        .map(|subject| TokenKey::new(tenant, subject, server))
        .collect())
}
