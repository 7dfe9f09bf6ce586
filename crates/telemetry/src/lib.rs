//! The daemon's tracing set-up: logs on stderr (text or JSON) and, with
//! `[telemetry] otlp_endpoint`, every span exported to an OpenTelemetry collector over
//! OTLP/HTTP (protobuf) or OTLP/gRPC (`otlp_protocol`). Incoming W3C `traceparent` headers make a request's span the child of
//! the caller's. Work done where the daemon's tracer cannot run (inside a sandbox) is exported
//! by the daemon on its behalf as a [`RemoteChild`].

use std::io::IsTerminal as _;
use std::time::SystemTime;

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{
    Span as _, SpanId, SpanKind, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator, SdkTracerProvider};
use serde::Deserialize;
use tracing::Level;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

/// `[telemetry]` of the daemon config.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's base URL: OTLP/HTTP's (`http://collector:4318`; spans go to
    /// `<base>/v1/traces`) or OTLP/gRPC's (`http://collector:4317`); empty (the default): no
    /// spans leave the daemon.
    pub otlp_endpoint: String,
    /// How spans travel to `otlp_endpoint`, as `OTEL_EXPORTER_OTLP_PROTOCOL` names it.
    pub otlp_protocol: OtlpProtocol,
    /// `service.name` of the exported spans.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            otlp_protocol: OtlpProtocol::HttpProtobuf,
            service_name: "koder-sandbox".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies.
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC.
    #[serde(rename = "grpc")]
    Grpc,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("[telemetry] otlp_endpoint: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The installed set-up; [`Telemetry::shutdown`] sends what is still buffered.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn shutdown(&self) {
        if let Some(p) = &self.provider {
            if let Err(e) = p.shutdown() {
                eprintln!("koder-sandbox: flushing spans at shutdown: {e}");
            }
        }
    }
}

/// Installs the global subscriber: `filter` (or `RUST_LOG`) for logs, JSON logs when `json`,
/// and the OTLP exporter when configured. A subscriber set up earlier by the host process is
/// kept.
pub fn init(cfg: &TelemetryConfig, filter: &str, json: bool) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    // Colour only for a person at a terminal: a log file or journald would keep the escape
    // codes as text (and formatting them is work on every request's span).
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let fmt = if json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let fmt = fmt.with_filter(filter);
    let provider = match cfg.otlp_endpoint.is_empty() {
        true => None,
        false => Some(provider(cfg)?),
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("koder-sandbox"))
            .with_filter(span_filter())
    });
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    if let Some(p) = &provider {
        // For spans the daemon exports on a sandbox's behalf (`RemoteChild`).
        opentelemetry::global::set_tracer_provider(p.clone());
    }
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(Telemetry { provider })
}

/// The daemon's own spans whatever the log level (never the HTTP client's: the exporter's own
/// requests would be traced and exported in turn).
fn span_filter() -> Targets {
    Targets::new().with_target("koder", Level::INFO)
}

/// Builds the exporter, for gRPC inside the caller's Tokio runtime: the channel's worker runs
/// there, so the batch processor's own thread can export through it.
fn provider(cfg: &TelemetryConfig) -> Result<SdkTracerProvider, TelemetryError> {
    let base = cfg.otlp_endpoint.trim_end_matches('/');
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match cfg.otlp_protocol {
        OtlpProtocol::HttpProtobuf => {
            let endpoint = match base.ends_with("/v1/traces") {
                true => base.to_string(),
                false => format!("{base}/v1/traces"),
            };
            builder
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(endpoint)
                .build()?
        }
        OtlpProtocol::Grpc => builder.with_tonic().with_endpoint(base).build()?,
    };
    let resource = opentelemetry_sdk::Resource::builder_empty()
        .with_service_name(cfg.service_name.clone())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The span of one API request (`route` is the matched template, not the path, so ids stay
/// out of span names), the child of the caller's trace when `headers` carry a `traceparent`.
pub fn request_span(method: &str, route: &str, headers: &http::HeaderMap) -> tracing::Span {
    server_span(method, route, Some(route), headers)
}

/// A [`request_span`] made before routing (`surface` names what the request reached until
/// [`record_route`] names its route).
pub fn surface_span(method: &str, surface: &str, headers: &http::HeaderMap) -> tracing::Span {
    server_span(method, surface, None, headers)
}

/// Names a [`surface_span`] by the route its router matched.
pub fn record_route(span: &tracing::Span, method: &str, route: &str) {
    span.record("http.route", route);
    // Recording `otel.name` renames the span only while tracing-opentelemetry still holds it as
    // a builder; once anything asked for its context (its parent was set from the request's
    // `traceparent`), the span is started and only a rename on the span itself takes effect.
    span.context()
        .span()
        .update_name(format!("{method} {route}"));
}

fn server_span(
    method: &str,
    name: &str,
    route: Option<&str>,
    headers: &http::HeaderMap,
) -> tracing::Span {
    let span = tracing::info_span!(
        target: "koder_http",
        "request",
        otel.name = format!("{method} {name}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(route) = route {
        span.record("http.route", route);
    }
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
    // Fails only when no OpenTelemetry layer is installed: then there is no trace to join.
    let _ = span.set_parent(parent);
    span
}

/// Records the answer's status on a [`request_span`].
pub fn record_status(span: &tracing::Span, status: u16) {
    span.record("http.response.status_code", status);
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A span for work done outside the daemon (a process in a sandbox), a child of a daemon span:
/// its id is made here and handed over (as a W3C trace context) before the work starts, so what
/// runs there can join the trace under it; the daemon exports it once the work reports its
/// timing.
pub struct RemoteChild {
    parent: opentelemetry::Context,
    span_id: SpanId,
}

impl RemoteChild {
    /// A child of `parent`, or none when `parent` is not exported (no collector, or not
    /// sampled): then nothing is handed to the sandbox either.
    pub fn of(parent: &tracing::Span) -> Option<Self> {
        let parent = parent.context();
        let sc = parent.span().span_context().clone();
        if !sc.is_valid() || !sc.is_sampled() {
            return None;
        }
        Some(Self {
            parent,
            span_id: RandomIdGenerator::default().new_span_id(),
        })
    }

    /// `(trace id, this span's id)` for the work's own trace context (always sampled).
    pub fn ids(&self) -> ([u8; 16], [u8; 8]) {
        let trace_id = self.parent.span().span_context().trace_id();
        (trace_id.to_bytes(), self.span_id.to_bytes())
    }

    /// Exports the span over `start..end` (daemon clock), with integer attributes.
    pub fn export(
        self,
        name: &'static str,
        (start, end): (SystemTime, SystemTime),
        attrs: &[(&'static str, i64)],
    ) {
        let tracer = opentelemetry::global::tracer("koder-sandbox");
        let mut span = tracer
            .span_builder(name)
            .with_span_id(self.span_id)
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attrs.iter().map(|(k, v)| KeyValue::new(*k, *v)))
            .start_with_context(&tracer, &self.parent);
        span.end_with_timestamp(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_is_named_as_otel_names_it() {
        let parse = |text: &str| toml::from_str::<TelemetryConfig>(text);
        let cfg = parse("otlp_endpoint = \"http://c:4317\"\notlp_protocol = \"grpc\"").unwrap();
        assert_eq!(cfg.otlp_protocol, OtlpProtocol::Grpc);
        let cfg = parse("otlp_endpoint = \"http://c:4318\"").unwrap();
        assert_eq!(cfg.otlp_protocol, OtlpProtocol::HttpProtobuf);
        assert!(parse("otlp_protocol = \"http/json\"").is_err());
    }
}
