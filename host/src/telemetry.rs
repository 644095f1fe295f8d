//! Traces for an OpenTelemetry collector.
//!
//! Every tool call is a span (`tools/call`, with the `claim`, `dispatch` and `finalize` phases
//! as children) whose fields are the metrics' labels: the routed tool, its connection and the
//! outcome class, never a key, an argument, a session id or a URL. A call whose `_meta`
//! carries a `traceparent` continues that trace.
//!
//! With the `otlp` cargo feature and `OTEL_EXPORTER_OTLP_ENDPOINT` set, the spans are exported
//! over OTLP/HTTP (JSON) by the official SDK (`OTEL_BSP_*` tune its batching); otherwise they
//! cost a disabled span each and go nowhere.

use crate::mcp::trace::TraceId;

/// The span of one tool call; `outcome` and the routed names are recorded when it ends.
pub fn call_span(trace: Option<&TraceId>) -> tracing::Span {
    let span = tracing::trace_span!(
        target: "obol::telemetry",
        "tools/call",
        tool = tracing::field::Empty,
        connection = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    if let Some(trace) = trace {
        continue_trace(&span, trace);
    }
    span
}

/// The span of one lifecycle phase, inside the call's.
pub fn phase_span(phase: &'static str) -> tracing::Span {
    tracing::trace_span!(target: "obol::telemetry", "phase", otel.name = phase)
}

/// Makes `span` a child of the client's span in the client's trace.
#[cfg(feature = "otlp")]
fn continue_trace(span: &tracing::Span, trace: &TraceId) {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId as OtelTraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let (Ok(trace_id), Ok(span_id)) = (
        OtelTraceId::from_hex(trace.as_str()),
        SpanId::from_hex(trace.parent_span()),
    ) else {
        return;
    };
    let remote = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}

#[cfg(not(feature = "otlp"))]
fn continue_trace(_span: &tracing::Span, _trace: &TraceId) {}

/// Flushes and stops the exporter when dropped (at exit).
#[cfg(feature = "otlp")]
pub struct Exporting(opentelemetry_sdk::trace::SdkTracerProvider);

#[cfg(feature = "otlp")]
impl Drop for Exporting {
    fn drop(&mut self) {
        let _ = self.0.shutdown();
    }
}

/// The exporting layer, boxed: its type names the SDK's internals.
#[cfg(feature = "otlp")]
pub type ExportLayer<S> = Box<dyn tracing_subscriber::Layer<S> + Send + Sync + 'static>;

/// The layer that exports the gateway's spans, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
/// Only `obol::telemetry` spans: no dependency's, and never the exporter's own requests.
#[cfg(feature = "otlp")]
pub fn otlp_layer<S>() -> anyhow::Result<Option<(ExportLayer<S>, Exporting)>>
where
    S: tracing::Subscriber
        + for<'span> tracing_subscriber::registry::LookupSpan<'span>
        + Send
        + Sync,
{
    use opentelemetry::trace::TracerProvider;
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    use tracing_subscriber::Layer;
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .build()?;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder_empty()
                .with_service_name("obol")
                .build(),
        )
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("obol"))
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("obol::telemetry", tracing::Level::TRACE),
        )
        .boxed();
    Ok(Some((layer, Exporting(provider))))
}

/// What the log lines take: what `levels` (`OBOL_LOG`) enables, except the crates whose lines
/// could carry a URL's secrets ([`crate::names::silenced`]). One filter with both conditions:
/// stacked as two, the outer one alone (which passes every span) would enable the lifecycle's
/// trace spans for the log lines, and each call would build them for no one.
pub fn log_filter<S>(
    levels: tracing_subscriber::EnvFilter,
) -> impl tracing_subscriber::layer::Filter<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use tracing_subscriber::filter::FilterExt;
    levels.and(tracing_subscriber::filter::filter_fn(|metadata| {
        !crate::names::silenced(metadata.target())
    }))
}

/// The process's subscriber: `logs`, and `exporter` when there is one. Without an exporter
/// nothing stands in for it: an empty `Option` layer enables nothing, but it keeps every
/// callsite asking on each use instead of being known as disabled once.
pub fn subscriber<L, E>(logs: L, exporter: Option<E>) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    L: tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
    E: tracing_subscriber::Layer<
            tracing_subscriber::layer::Layered<L, tracing_subscriber::Registry>,
        > + Send
        + Sync
        + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    let logging = tracing_subscriber::registry().with(logs);
    match exporter {
        Some(exporter) => Box::new(logging.with(exporter)),
        None => Box::new(logging),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{EnvFilter, Targets};

    fn logs() -> impl tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(log_filter(EnvFilter::new("info")))
    }

    /// The module's promise: with no exporter a call's spans are disabled (the log lines do not
    /// take trace spans at `info`), so nothing is built for them; an exporter takes them.
    #[test]
    fn without_an_exporter_a_calls_spans_are_disabled() {
        let none: Option<tracing_subscriber::layer::Identity> = None;
        tracing::subscriber::with_default(subscriber(logs(), none), || {
            assert!(call_span(None).is_disabled());
            assert!(phase_span("claim").is_disabled());
        });
        let exporter = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(Targets::new().with_target("obol::telemetry", tracing::Level::TRACE));
        tracing::subscriber::with_default(subscriber(logs(), Some(exporter)), || {
            assert!(!call_span(None).is_disabled());
            assert!(!phase_span("claim").is_disabled());
        });
    }
}
