//! OpenTelemetry tracing: OTLP export configured the standard way
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
//! `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, ...; off when no endpoint is
//! set), and W3C trace-context propagation: from the caller's gRPC metadata
//! into the RPC span, and from the upstream request span into the MCP
//! request's `_meta` (and, for HTTP servers, the `traceparent` header).

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The tracer provider, when an OTLP endpoint is configured.
pub(super) fn provider_from_env() -> Option<SdkTracerProvider> {
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    if !configured || disabled {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
    {
        Ok(exporter) => exporter,
        Err(e) => {
            eprintln!("toolgate: OTLP trace export disabled: {e}");
            return None;
        }
    };
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(
            std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "toolgate".to_owned()),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Some(provider)
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Makes `span` a child of the caller's trace when the request carries a
/// W3C `traceparent`.
pub fn continue_caller_trace(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    if metadata.get("traceparent").is_none() {
        return;
    }
    let context = TraceContextPropagator::new().extract(&MetadataExtractor(metadata));
    let _ = span.set_parent(context);
}

/// The caller's W3C trace-context fields (from [`caller_context`]), read
/// as a propagator reads headers.
struct FieldsExtractor<'a>(&'a [(String, String)]);

impl Extractor for FieldsExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// Makes `span` a child of the caller's trace when its trace-context
/// `fields` (from [`caller_context`]) carry a `traceparent`.
pub fn continue_trace(span: &tracing::Span, fields: &[(String, String)]) {
    if !fields.iter().any(|(k, _)| k == "traceparent") {
        return;
    }
    let context = TraceContextPropagator::new().extract(&FieldsExtractor(fields));
    let _ = span.set_parent(context);
}

/// The trace id of a call: the one of `span` when trace export is on,
/// else that of the caller's `traceparent` among its trace-context
/// `fields` (from [`caller_context`]).
pub fn trace_id(span: &tracing::Span, fields: &[(String, String)]) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    let context = span.context();
    let own = context.span().span_context().trace_id();
    if own != opentelemetry::trace::TraceId::INVALID {
        return Some(own.to_string());
    }
    fields
        .iter()
        .find(|(k, _)| k == "traceparent")
        .and_then(|(_, v)| traceparent_id(v))
}

struct MapInjector<'a>(&'a mut Vec<(String, String)>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

/// The W3C trace-context fields (`traceparent`, and `tracestate` when set)
/// of `span`, to send upstream. Empty when tracing export is off.
pub fn context_fields(span: &tracing::Span) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    let context = span.context();
    TraceContextPropagator::new().inject_context(&context, &mut MapInjector(&mut fields));
    fields
}

/// The caller's own W3C trace-context metadata, passed upstream unchanged
/// when trace export is off (the gateway is then transparent to tracing).
pub fn caller_context(metadata: &tonic::metadata::MetadataMap) -> Vec<(String, String)> {
    ["traceparent", "tracestate"]
        .iter()
        .filter_map(|key| {
            let value = metadata.get(*key)?.to_str().ok()?;
            Some(((*key).to_owned(), value.to_owned()))
        })
        .collect()
}

/// The trace id (32 lowercase hex digits) of a W3C `traceparent` value,
/// if it is well formed and not all zeros.
pub fn traceparent_id(traceparent: &str) -> Option<String> {
    let mut parts = traceparent.trim().split('-');
    let (_version, id) = (parts.next()?, parts.next()?);
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id.bytes().any(|b| b != b'0'))
        .then(|| id.to_ascii_lowercase())
}
