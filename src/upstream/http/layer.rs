//! The one implementation of rmcp's `StreamableHttpClient`: rmcp's own
//! reqwest client, with an [`HttpLayer`] around each of its requests (which
//! headers and token it sends, whether it is retried, how its errors are
//! cleaned). The gateway's sessions use it with their trace-header layer;
//! `toolgate conformance-client` with its OAuth layer. It knows nothing of
//! what a layer adds.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;

/// The error of a request, as rmcp's reqwest client reports it.
pub(crate) type HttpError = StreamableHttpError<reqwest::Error>;

/// The extra headers of a request.
pub(crate) type Headers = HashMap<HeaderName, HeaderValue>;

/// One request of rmcp's transport, as a layer sees it before sending.
#[derive(Debug)]
pub(crate) struct Request<'a, M> {
    /// `POST` (a message), `GET` (an SSE stream) or `DELETE` (the session).
    pub(crate) method: http::Method,
    pub(crate) uri: &'a str,
    pub(crate) session_id: Option<&'a str>,
    /// What a `POST` carries; `()` for the others.
    pub(crate) message: M,
    /// The bearer token rmcp would send (its configured `auth_header`).
    pub(crate) auth_header: Option<String>,
    /// The headers rmcp would send (its configured `custom_headers`).
    pub(crate) headers: Headers,
}

/// What a request carries: a JSON-RPC message (`POST`) or nothing.
pub(crate) trait Body: Clone + Send + Sync {
    /// The JSON-RPC message, if any.
    fn message(&self) -> Option<&ClientJsonRpcMessage>;
}

impl Body for ClientJsonRpcMessage {
    fn message(&self) -> Option<&ClientJsonRpcMessage> {
        Some(self)
    }
}

impl Body for () {
    fn message(&self) -> Option<&ClientJsonRpcMessage> {
        None
    }
}

/// One try at sending a request: called with the body, the bearer token
/// and the headers to send, it sends them with rmcp's client.
pub(crate) trait Attempt<M, T>:
    Fn(M, Option<String>, Headers) -> <Self as Attempt<M, T>>::Sent + Send + Sync
{
    /// The answer to come.
    type Sent: Future<Output = Result<T, HttpError>> + Send;
}

impl<M, T, F, Fut> Attempt<M, T> for F
where
    F: Fn(M, Option<String>, Headers) -> Fut + Send + Sync,
    Fut: Future<Output = Result<T, HttpError>> + Send,
{
    type Sent = Fut;
}

/// What is done around each request of a [`Layered`] client.
pub(crate) trait HttpLayer: Clone + Send + Sync + 'static {
    /// Sends `request` by calling `attempt` (once, or more for a layer that
    /// retries) with the body, the bearer token and the headers to send.
    fn send<M: Body, T: Send>(
        &self,
        request: Request<'_, M>,
        attempt: impl Attempt<M, T>,
    ) -> impl Future<Output = Result<T, HttpError>> + Send;
}

/// rmcp's reqwest client with `layer` around each request.
#[derive(Clone, Debug)]
pub(crate) struct Layered<L> {
    client: Arc<reqwest::Client>,
    layer: L,
}

impl<L> Layered<L> {
    /// `client` with `layer` around each of its requests.
    pub(crate) fn new(client: Arc<reqwest::Client>, layer: L) -> Self {
        Self { client, layer }
    }
}

impl<L: HttpLayer> StreamableHttpClient for Layered<L> {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        // rmcp's reqwest client does the same.
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let request = Request {
            method: http::Method::POST,
            uri: &uri,
            session_id: session_id.as_deref(),
            message,
            auth_header,
            headers: custom_headers,
        };
        let post = |message, token, headers| {
            let (uri, session_id) = (uri.clone(), session_id.clone());
            self.client
                .post_message_with_response_limits(uri, message, session_id, token, headers, limits)
        };
        self.layer.send(request, post).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<(), HttpError> {
        let request = Request {
            method: http::Method::DELETE,
            uri: &uri,
            session_id: Some(&session_id),
            message: (),
            auth_header,
            headers: custom_headers,
        };
        let delete = |(), token, headers| {
            let (uri, session_id) = (uri.clone(), session_id.clone());
            self.client.delete_session(uri, session_id, token, headers)
        };
        self.layer.send(request, delete).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        // rmcp's reqwest client does the same.
        let max = StreamableHttpResponseLimits::default().max_sse_event_size;
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: Headers,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        let request = Request {
            method: http::Method::GET,
            uri: &uri,
            session_id: session_id.as_deref(),
            message: (),
            auth_header,
            headers: custom_headers,
        };
        let get = |(), token, headers| {
            let (uri, session_id) = (uri.clone(), session_id.clone());
            self.client.get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id.clone(),
                token,
                headers,
                max_sse_event_size,
            )
        };
        self.layer.send(request, get).await
    }
}
