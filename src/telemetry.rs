//! OpenTelemetry traces over OTLP/gRPC (DESIGN §11), off unless
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is
//! set. The SDK reads the other standard variables itself
//! (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`
//! and `_ARG`, `OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`).
//!
//! Spans are `tracing` spans with the target [`TARGET`], made with
//! [`span!`](crate::trace_span): only the OpenTelemetry layer is interested
//! in them. While traces are off the macro makes no span at all (one
//! relaxed load): the subscriber alone would still make one, since a layer
//! stack whose trace layer is absent answers "always" for every callsite.
//!
//! The W3C `traceparent` links the pieces: the caller's arrives in gRPC
//! metadata and becomes the server span's parent; the server span's context
//! is stored with the outbox event (or, with traces off, the caller's as
//! received), and every sink sends it, so a downstream consumer continues
//! the trace.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of every span meant for the trace exporter.
pub const TARGET: &str = "oncegate::trace";

/// A span for the trace exporter: `trace_span!("name", field = value, …)`.
/// Disabled (and free: no span is made) while traces are off.
#[macro_export]
macro_rules! trace_span {
    ($name:expr $(, $($fields:tt)*)?) => {
        if $crate::telemetry::exporting() {
            tracing::info_span!(target: "oncegate::trace", $name $(, $($fields)*)?)
        } else {
            tracing::Span::none()
        }
    };
}

/// Set once the trace layer is built: from then on [`trace_span!`] makes spans.
static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether traces are exported (an [`Exporter`]'s layer is installed).
pub fn exporting() -> bool {
    EXPORTING.load(std::sync::atomic::Ordering::Relaxed)
}

/// True when traces are to be exported: an OTLP endpoint is configured and
/// the SDK is not disabled (`OTEL_SDK_DISABLED=true`).
pub fn configured(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The exporter's provider: [`Exporter::shutdown`] flushes what is buffered.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// The OTLP/gRPC exporter, batching, configured by the standard
    /// variables. Must be called inside a Tokio runtime (the gRPC client
    /// lives on it).
    pub fn start() -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .context("configuring the OTLP trace exporter (OTEL_EXPORTER_OTLP_*)")?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service_name())
                    .build(),
            )
            .build();
        Ok(Self { provider })
    }

    /// The layer that turns [`TARGET`] spans into OpenTelemetry spans; it
    /// sees nothing else (no log events, no other spans).
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        use tracing_subscriber::Layer;
        EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("oncegate"))
            .with_threads(false)
            .with_location(false)
            .with_tracked_inactivity(false)
            .with_filter(
                tracing_subscriber::filter::filter_fn(is_trace_span)
                    .with_max_level_hint(tracing_subscriber::filter::LevelFilter::INFO),
            )
    }

    /// Exports what is buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("warning: flushing the trace exporter: {e}");
        }
    }
}

/// `OTEL_SERVICE_NAME` if set, else `oncegate` (not the SDK's
/// `unknown_service`).
fn service_name() -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "oncegate".to_string())
}

/// A span meant for the trace exporter (and nothing else is).
pub fn is_trace_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.target() == TARGET
}

struct One<'a>(&'a str);

impl Extractor for One<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0)
    }
    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

#[derive(Default)]
struct Captured(Option<String>);

impl Injector for Captured {
    fn set(&mut self, key: &str, value: String) {
        if key == "traceparent" {
            self.0 = Some(value);
        }
    }
}

/// The span context a W3C `traceparent` names, if it is well formed.
pub fn parse(traceparent: &str) -> Option<SpanContext> {
    let cx = TraceContextPropagator::new().extract(&One(traceparent));
    let span = cx.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// The `traceparent` of a span context.
pub fn format(span: &SpanContext) -> Option<String> {
    if !span.is_valid() {
        return None;
    }
    let cx = Context::new().with_remote_span_context(span.clone());
    let mut out = Captured::default();
    TraceContextPropagator::new().inject_context(&cx, &mut out);
    out.0
}

/// A received `traceparent` in its canonical form, or `None` if malformed
/// (what is stored and sent on is always well formed).
pub fn canonical(traceparent: &str) -> Option<String> {
    parse(traceparent).as_ref().and_then(format)
}

/// Makes `traceparent` the parent of `span` (a no-op while traces are off or
/// when it is malformed).
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    if let Some(parent) = traceparent.and_then(parse) {
        let _ = span.set_parent(Context::new().with_remote_span_context(parent));
    }
}

/// Links `span` to the span a `traceparent` names (a no-op while traces are
/// off).
pub fn add_link(span: &tracing::Span, traceparent: &str) {
    if span.is_disabled() {
        return;
    }
    if let Some(linked) = parse(traceparent) {
        span.add_link(linked);
    }
}

/// The `traceparent` of `span` when it is exported, else `None`.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    format(span.context().span().span_context())
}

/// What an outbox event carries: the current exported span's context, else
/// the caller's as received (well formed only), else nothing.
pub fn for_outbox(caller: Option<&str>) -> Option<String> {
    traceparent_of(&tracing::Span::current()).or_else(|| caller.and_then(canonical))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_round_trip_and_malformed_ones_are_refused() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(canonical(tp).as_deref(), Some(tp));
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(canonical(unsampled).as_deref(), Some(unsampled));
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(canonical(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_an_endpoint_turns_traces_on() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert!(!configured(env(&[])));
        assert!(!configured(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        assert!(configured(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://c:4317"
        )])));
        assert!(configured(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4317"
        )])));
        assert!(!configured(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_SDK_DISABLED", "true"),
        ])));
    }

    /// Traces off: no span is made, even under a subscriber that takes
    /// every span (as a layer stack whose trace layer is absent does).
    #[test]
    fn with_traces_off_no_trace_span_is_made() {
        tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            assert!(!tracing::info_span!(target: TARGET, "control").is_disabled());
            assert!(crate::trace_span!("rpc", rpc.system = "grpc").is_disabled());
        });
    }
}
