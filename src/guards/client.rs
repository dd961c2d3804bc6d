//! One guard's client: a lazily connected tonic channel (HTTP/2, TLS with
//! the configured CAs), its bearer token, the deadline of each `Check`.

use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::Phase;
use crate::config::{GuardConfig, GuardFailure, GuardPhases, Secret};
use crate::pb::guard::check_response::Verdict as WireVerdict;
use crate::pb::guard::guard_service_client::GuardServiceClient;

/// The longest text of a guard's error status kept for the log.
const MAX_ERROR_TEXT: usize = 200;

/// One configured guard.
pub struct Guard {
    name: String,
    timeout: Duration,
    failure: GuardFailure,
    phases: GuardPhases,
    token: Option<Secret>,
    /// The endpoint, or why it could not be built (every check fails).
    endpoint: Result<Endpoint, String>,
    /// Connected lazily on the first check (inside the runtime).
    channel: OnceLock<Channel>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .field("failure", &self.failure)
            .field("phases", &self.phases)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// The client of `config`.
    #[must_use]
    pub fn new(config: &GuardConfig) -> Self {
        let endpoint = endpoint(config);
        if let Err(reason) = &endpoint {
            tracing::error!(guard = %config.name, %reason, "guard client cannot be built: every check of it fails");
        }
        Self {
            name: config.name.clone(),
            timeout: config.timeout,
            failure: config.failure,
            phases: config.phases,
            token: config.token.clone(),
            endpoint,
            channel: OnceLock::new(),
        }
    }

    /// The configured name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What a call does when this guard fails.
    #[must_use]
    pub fn failure(&self) -> GuardFailure {
        self.failure
    }

    /// Whether the guard is asked about `phase`.
    #[must_use]
    pub fn asks(&self, phase: Phase) -> bool {
        match phase {
            Phase::Request => self.phases.request,
            Phase::Response => self.phases.response,
        }
    }

    /// Asks the guard about `request`, within its timeout, with `trace`
    /// (W3C trace-context fields) in the metadata.
    ///
    /// # Errors
    /// What went wrong, in words, without the payload: unreachable, an
    /// error status, no verdict within the timeout, an answer without one.
    pub async fn check(
        &self,
        request: crate::pb::guard::CheckRequest,
        trace: &[(String, String)],
    ) -> Result<WireVerdict, String> {
        let channel = match &self.endpoint {
            Ok(endpoint) => self
                .channel
                .get_or_init(|| endpoint.clone().connect_lazy())
                .clone(),
            Err(reason) => return Err(reason.clone()),
        };
        let mut request = tonic::Request::new(request);
        request.set_timeout(self.timeout);
        let metadata = request.metadata_mut();
        if let Some(token) = &self.token {
            let mut value = format!("Bearer {}", token.expose())
                .parse::<tonic::metadata::MetadataValue<_>>()
                .map_err(|_| "the configured token is not a valid header value".to_owned())?;
            value.set_sensitive(true);
            metadata.insert("authorization", value);
        }
        for (key, value) in trace {
            if let (Ok(key), Ok(value)) = (
                key.parse::<tonic::metadata::MetadataKey<_>>(),
                value.parse::<tonic::metadata::MetadataValue<_>>(),
            ) {
                metadata.insert(key, value);
            }
        }
        let mut client = GuardServiceClient::new(channel);
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(self.timeout, client.check(request)).await;
        let late = || {
            format!(
                "no verdict within its timeout ({})",
                humantime::format_duration(self.timeout)
            )
        };
        match answer {
            Err(_) => Err(late()),
            // The channel's own deadline (`grpc-timeout`) may end it first.
            Ok(Err(_)) if started.elapsed() >= self.timeout => Err(late()),
            Ok(Err(status)) => Err(format!(
                "answered {:?}: {}",
                status.code(),
                crate::credentials::bounded(status.message(), MAX_ERROR_TEXT)
            )),
            Ok(Ok(response)) => response
                .into_inner()
                .verdict
                .ok_or_else(|| "answered without a verdict".to_owned()),
        }
    }
}

/// The endpoint of `config`: its scheme and authority (h2c or TLS with
/// the configured CAs, the system's roots without), connect timeout the
/// guard's timeout.
fn endpoint(config: &GuardConfig) -> Result<Endpoint, String> {
    let origin = &config.url[..url::Position::BeforePath];
    let mut endpoint = Endpoint::from_shared(origin.to_owned())
        .map_err(|e| format!("url `{origin}`: {e}"))?
        .connect_timeout(config.timeout)
        .tcp_nodelay(true);
    if config.url.scheme() == "https" {
        let mut tls = ClientTlsConfig::new();
        tls = match &config.tls {
            Some(trust) => tls.ca_certificates(
                trust
                    .roots()
                    .iter()
                    .map(|der| Certificate::from_pem(pem(der.as_ref()))),
            ),
            None => tls.with_native_roots(),
        };
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("TLS settings: {e}"))?;
    }
    Ok(endpoint)
}

/// A certificate's DER as PEM (what tonic's `Certificate` reads).
fn pem(der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}
