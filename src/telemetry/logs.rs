//! The global `tracing` subscriber: log lines on stderr (human-readable on
//! a terminal, or JSON), filtered by `RUST_LOG`, plus the OpenTelemetry
//! layer when an OTLP endpoint is configured.

use std::io::IsTerminal;

use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFormat;

/// Flushes and stops trace export when dropped or shut down.
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Flushes pending spans and stops the exporter (bounded by the SDK's
    /// own export timeout).
    pub async fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

/// Installs the global subscriber. Call once, inside the Tokio runtime
/// (the OTLP exporter needs it). `default_filter` applies when `RUST_LOG`
/// is unset.
pub fn init(format: LogFormat, default_filter: &str) -> TelemetryGuard {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let provider = super::trace::provider_from_env();
    let otel = provider.as_ref().map(|provider| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer().with_tracer(provider.tracer("toolgate"))
    });
    let ansi = std::io::stderr().is_terminal();
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    let result = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(ansi),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    if result.is_err() {
        // A subscriber is already installed (tests): keep it.
    }
    TelemetryGuard { provider }
}
