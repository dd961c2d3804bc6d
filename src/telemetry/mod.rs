//! Telemetry: structured logs, OpenTelemetry traces over OTLP, and
//! Prometheus metrics. Business code only creates `tracing` spans and calls
//! [`Metrics`]; this module decides where they go.

mod logs;
pub mod metrics;
pub mod trace;

pub use logs::{TelemetryGuard, init};
pub use metrics::Metrics;
