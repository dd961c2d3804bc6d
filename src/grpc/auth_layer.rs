//! The authentication layer: a tower [`Layer`] around the ToolGateway
//! service that applies [`crate::callers::authenticate`] to every request,
//! against the registry's current tenants. Authentication may wait (a JWT
//! whose key must be fetched), so it is an async service rather than a
//! tonic interceptor; a refused call is answered here with its gRPC status
//! (through the one status table), and the inner service never sees it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};

use crate::registry::Registry;

/// Authenticates every request before the inner service runs (see
/// [`crate::callers::authenticate`]). It reads the registry's current
/// configuration, so a reload applies to the next call.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    registry: Arc<Registry>,
    approvers: bool,
}

impl AuthLayer {
    /// A layer over the registry's tenants and callers.
    pub fn new(registry: Arc<Registry>) -> Self {
        Self {
            registry,
            approvers: false,
        }
    }

    /// The same, also accepting the tenants' approver tokens
    /// (`call_approvals.approver_tokens`): the CallApprovalsService's
    /// layer. An approver token reaches no other service.
    #[must_use]
    pub fn for_approvers(mut self) -> Self {
        self.approvers = true;
        self
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            registry: self.registry.clone(),
            approvers: self.approvers,
        }
    }
}

/// The service [`AuthLayer`] makes: on success the request goes on with
/// `Arc<Tenant>`, [`crate::callers::Subject`] and [`crate::callers::Caller`] in
/// its extensions and without its `authorization` header (the client
/// certificate, when the connection presented one, is read from its
/// `TlsConnectInfo<TcpConnectInfo>`); on failure the
/// answer is the gRPC status (`Status::into_http`).
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    registry: Arc<Registry>,
    approvers: bool,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for AuthService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        // The service that was polled ready serves this request; a clone
        // takes its place for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let registry = self.registry.clone();
        let approvers = self.approvers;
        Box::pin(async move {
            let approver = if approvers {
                match approver_token(&registry, request.headers()).await {
                    Ok(found) => found,
                    Err(error) => {
                        let error = super::CallError::from(error);
                        return Ok(tonic::Status::from(error).into_http());
                    }
                }
            } else {
                None
            };
            if let Some((tenant, name)) = approver {
                // One of the tenant's approver tokens: it reaches this
                // service only, as the approver it names.
                request.headers_mut().remove(http::header::AUTHORIZATION);
                let Ok(subject) =
                    crate::callers::Subject::named(crate::callers::Namespace::Approver, &name)
                else {
                    let error = super::CallError::Unauthenticated(
                        "an approver token's name is not a subject",
                    );
                    return Ok(tonic::Status::from(error).into_http());
                };
                let extensions = request.extensions_mut();
                extensions.insert(tenant);
                extensions.insert(subject);
                extensions.insert(crate::callers::Caller::approver_token(&name));
                return inner.call(request).await;
            }
            // The leaf of the verified chain the connection presented (a
            // TLS listener with client certificates only).
            let peer_certs = request
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(TlsConnectInfo::peer_certs);
            let leaf = peer_certs
                .as_deref()
                .and_then(|chain| chain.first())
                .map(|der| der.as_ref());
            match crate::callers::authenticate(&registry, request.headers(), leaf).await {
                Ok(authenticated) => {
                    // The caller's credential goes no further than this layer.
                    request.headers_mut().remove(http::header::AUTHORIZATION);
                    if let Some(token) = &authenticated.subject_token {
                        authenticated
                            .tenant
                            .remember_subject_token(&authenticated.subject, token);
                    }
                    let extensions = request.extensions_mut();
                    if let Some(token) = authenticated.subject_token {
                        extensions.insert(token);
                    }
                    extensions.insert(authenticated.tenant);
                    extensions.insert(authenticated.subject);
                    extensions.insert(authenticated.caller);
                    extensions.insert(Standing {
                        registry: registry.clone(),
                        presented: authenticated.presented,
                    });
                    inner.call(request).await
                }
                Err(error) => {
                    let error = super::CallError::from(error);
                    let (_, reason) = crate::calls::classify(&error);
                    tracing::debug!(reason, %error, "caller refused");
                    Ok(tonic::Status::from(error).into_http())
                }
            }
        })
    }
}

/// The tenant and name of the approver token `headers` present, if it is
/// one (a store tenant's is loaded).
///
/// # Errors
/// The token is not known here and the state store cannot be asked.
async fn approver_token(
    registry: &Arc<Registry>,
    headers: &http::HeaderMap,
) -> Result<Option<(Arc<crate::registry::Tenant>, String)>, crate::callers::CallerError> {
    let Some(token) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::callers::bearer)
    else {
        return Ok(None);
    };
    registry.approver_loading(token).await
}

/// What a long-lived stream re-checks its caller with (in the request's
/// extensions): the registry whose configuration it asks, and what the
/// caller presented (a digest, never the credential).
#[derive(Debug, Clone)]
pub(crate) struct Standing {
    /// The registry, whose current configuration decides.
    pub(crate) registry: Arc<Registry>,
    /// What the caller presented.
    pub(crate) presented: crate::callers::Presented,
}

impl Standing {
    /// The caller's tenant under the current configuration, if it is still
    /// accepted there ([`crate::callers::recheck`]).
    pub(crate) fn recheck(
        &self,
        caller: &crate::callers::Caller,
        subject: &crate::callers::Subject,
    ) -> Result<Arc<crate::registry::Tenant>, crate::callers::CallerError> {
        crate::callers::recheck(&self.registry, &self.presented, caller, subject)
    }

    /// When the caller's JWT stops being accepted (`exp` plus its issuer's
    /// clock skew), or the client certificate of a caller without a token
    /// expires (its notAfter); `None` for a static token.
    pub(crate) fn expires_at(
        &self,
        caller: &crate::callers::Caller,
    ) -> Option<std::time::SystemTime> {
        if let crate::callers::Presented::Certificate(certificate) = &self.presented {
            return Some(certificate.not_after());
        }
        match &caller.identity {
            crate::callers::CallerIdentity::Jwt { issuer, .. } => self
                .registry
                .jwt_callers()
                .expires_at(issuer, &caller.claims),
            crate::callers::CallerIdentity::Token { .. }
            | crate::callers::CallerIdentity::Certificate { .. }
            | crate::callers::CallerIdentity::ApproverToken { .. } => None,
        }
    }
}

impl<S: NamedService> NamedService for AuthService<S> {
    const NAME: &'static str = S::NAME;
}
