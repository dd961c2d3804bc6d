//! The Streamable HTTP transport, carrying the configured headers on every
//! request. Header values are marked sensitive so the HTTP stack never
//! prints them.

use std::collections::HashMap;

use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::config::Secret;

/// Installs the process-wide TLS crypto provider (ring) once.
fn ensure_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Fails only if another provider is installed already: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Builds the transport for `url` with `headers`.
pub(super) fn transport(
    url: &url::Url,
    headers: &[(http::HeaderName, Secret)],
) -> StreamableHttpClientTransport<reqwest::Client> {
    ensure_crypto_provider();
    let mut custom = HashMap::new();
    for (name, value) in headers {
        // Validated at config load.
        if let Ok(mut value) = http::HeaderValue::from_str(value.expose()) {
            value.set_sensitive(true);
            custom.insert(name.clone(), value);
        }
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
    StreamableHttpClientTransport::from_config(config)
}
