//! The test's own OTLP collectors on loopback (HTTP with protobuf bodies, and gRPC) and checks
//! of the span trees they received: what `traces.rs` and the microVM tests share.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// The caller's span in every trace of these tests.
pub const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// What every traced exec runs: long enough to time, printing the context it was given.
pub const COMMAND: &str = "sleep 0.3; echo \"$TRACEPARENT\"; exit 3";

pub type Spans = Arc<Mutex<Vec<Span>>>;

pub async fn collector() -> (Spans, String) {
    let spans = Spans::default();
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(export))
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (spans, url)
}

/// An OTLP/gRPC collector on loopback: `(spans, its URL)`.
pub async fn grpc_collector() -> (Spans, String) {
    let spans = Spans::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = TraceServiceServer::new(GrpcCollector(spans.clone()));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    (spans, url)
}

struct GrpcCollector(Spans);

#[tonic::async_trait]
impl TraceService for GrpcCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn keep(spans: &Spans, req: ExportTraceServiceRequest) {
    let mut all = spans.lock().unwrap();
    for rs in req.resource_spans {
        for ss in rs.scope_spans {
            all.extend(ss.spans);
        }
    }
}

async fn export(State(spans): State<Spans>, body: Bytes) -> Vec<u8> {
    keep(
        &spans,
        ExportTraceServiceRequest::decode(body).expect("OTLP protobuf"),
    );
    // An empty ExportTraceServiceResponse.
    Vec::new()
}

pub fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    Some(match value.value.as_ref()? {
        Any::StringValue(s) => s.clone(),
        Any::IntValue(i) => i.to_string(),
        Any::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

pub fn traceparent(trace: &str) -> String {
    format!("00-{trace}-{CALLER_SPAN}-01")
}

/// The spans of `trace` once `names` are all there (the exporter batches; stopping the daemon
/// flushed it).
pub async fn spans_of(spans: &Spans, trace: &str, names: &[&str]) -> Vec<Span> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Vec<Span> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| hex(&s.trace_id) == trace)
            .cloned()
            .collect();
        if names.iter().all(|n| found.iter().any(|s| s.name == *n)) {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "trace {trace} lacks some of {names:?} after 20 s: {:?}",
            found.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let mut of = spans.iter().filter(|s| s.name == name);
    let span = of.next().unwrap_or_else(|| panic!("no {name} span"));
    assert!(of.next().is_none(), "one {name} span in its trace");
    span
}

/// The caller's span → the request span (`request_name`) → its `exec` span (whose attributes
/// are checked) → the in-sandbox span, placed inside it: the exec's whole tree in one trace.
/// Returns the exec span and the in-sandbox span's W3C context as the process saw it.
pub fn check_exec_tree(
    spans: &[Span],
    trace: &str,
    request_name: &str,
    (session, mode, runtime): (&str, &str, &str),
) -> (Span, String) {
    let request = named(spans, request_name);
    assert_eq!(
        hex(&request.parent_span_id),
        CALLER_SPAN,
        "{request_name}: the caller's span is the parent"
    );
    assert!(attr(request, "http.response.status_code").is_some());
    let exec = named(spans, "exec");
    assert_eq!(
        exec.parent_span_id, request.span_id,
        "{request_name}: the exec is the request's child"
    );
    for (key, value) in [
        ("mode", mode),
        ("session", session),
        ("tenant", "t1"),
        ("runtime", runtime),
        ("verdict", "ok"),
        ("exit_code", "3"),
    ] {
        assert_eq!(
            attr(exec, key).as_deref(),
            Some(value),
            "{request_name}: {key}"
        );
    }
    assert!(attr(exec, "image").is_some(), "{request_name}: image");
    let duration: u64 = attr(exec, "duration_ms").unwrap().parse().unwrap();
    assert!(duration >= 300, "{request_name}: the exec took its sleep");
    // The exec span lasts until the exec ends, whenever the HTTP answer began.
    assert!(
        exec.end_time_unix_nano - exec.start_time_unix_nano >= 300_000_000,
        "{request_name}: {} ns",
        exec.end_time_unix_nano - exec.start_time_unix_nano
    );

    let inside = named(spans, "sandbox.exec");
    assert_eq!(
        inside.parent_span_id, exec.span_id,
        "{request_name}: the in-sandbox span is the exec's child"
    );
    assert!(
        inside.start_time_unix_nano >= exec.start_time_unix_nano
            && inside.end_time_unix_nano <= exec.end_time_unix_nano,
        "{request_name}: the in-sandbox span lies within its exec"
    );
    // The agent's run time starts when its spawn call returns: on a loaded host the process
    // may have slept part of its 0.3 s before that, so only the two together must cover it.
    let micros = |name: &str| -> u64 {
        attr(inside, name)
            .unwrap_or_else(|| panic!("{request_name}: no {name}"))
            .parse()
            .unwrap()
    };
    assert!(
        micros("spawn_us") + micros("wall_us") >= 300_000,
        "{request_name}: the process's wall time"
    );
    assert_eq!(attr(inside, "exit_code").as_deref(), Some("3"));
    assert!(
        inside.end_time_unix_nano - inside.start_time_unix_nano >= 300_000_000,
        "{request_name}: the span covers the process's run"
    );
    let seen = format!("00-{trace}-{}-01", hex(&inside.span_id));
    (exec.clone(), seen)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
