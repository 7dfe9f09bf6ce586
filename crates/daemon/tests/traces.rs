//! OpenTelemetry through the real daemon: this test is the OTLP/HTTP collector (protobuf on
//! loopback). A request carrying a W3C `traceparent` gets a request span that is the caller's
//! child, named by its route template, and the exec it runs is a child of that.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use reqwest::{Method, StatusCode};
use serde_json::json;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

type Spans = Arc<Mutex<Vec<Span>>>;

async fn collector() -> (Spans, String) {
    let spans = Spans::default();
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(export))
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (spans, url)
}

async fn export(State(spans): State<Spans>, body: Bytes) -> Vec<u8> {
    let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
    let mut all = spans.lock().unwrap();
    for rs in req.resource_spans {
        for ss in rs.scope_spans {
            all.extend(ss.spans);
        }
    }
    // An empty ExportTraceServiceResponse.
    Vec::new()
}

fn attr(span: &Span, key: &str) -> Option<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_span_joins_the_callers_trace_and_parents_its_exec() {
    let Some(()) = root_or_skip() else { return };
    let (spans, url) = collector().await;
    let config = format!("{BASE_CONFIG}[telemetry]\notlp_endpoint = \"{url}\"\n");
    let mut d = Daemon::start(&config).await;
    let sid = d.create(json!({})).await;
    let resp = d
        .req(
            Method::POST,
            &format!("/v1/sandbox/sessions/{sid}/exec"),
            KEY1,
        )
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .json(&json!({"shell": "exit 7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // The same request in the Prometheus metrics, by route template, and the create by path.
    let metrics = d.metrics().await;
    for line in [
        "koder_http_requests_total{route=\"/v1/sandbox/sessions/{id}/exec\",status=\"200\"} 1",
        "koder_http_requests_total{route=\"/v1/sandbox/sessions\",status=\"201\"} 1",
        "koder_http_request_duration_seconds_count{route=\"/v1/sandbox/sessions/{id}/exec\"} 1",
        "koder_session_create_seconds_count{source=\"cold\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }
    // Stopping flushes what the batch exporter still holds.
    d.stop();

    let deadline = Instant::now() + Duration::from_secs(20);
    let (request, exec) = loop {
        let all = spans.lock().unwrap().clone();
        let in_trace: Vec<&Span> = all
            .iter()
            .filter(|s| hex(&s.trace_id) == TRACE_ID)
            .collect();
        let request = in_trace.iter().find(|s| s.name.ends_with("/exec")).cloned();
        let exec = in_trace.iter().find(|s| s.name == "exec").cloned();
        if let (Some(r), Some(e)) = (request, exec) {
            break (r.clone(), e.clone());
        }
        assert!(
            Instant::now() < deadline,
            "no request and exec spans in trace {TRACE_ID} within 20 s: {:?}",
            all.iter()
                .map(|s| (&s.name, hex(&s.trace_id)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(request.name, "POST /v1/sandbox/sessions/{id}/exec");
    assert_eq!(
        hex(&request.parent_span_id),
        CALLER_SPAN,
        "the caller's span is the parent"
    );
    assert_eq!(
        attr(&request, "http.route").as_deref(),
        Some("/v1/sandbox/sessions/{id}/exec")
    );
    assert_eq!(
        attr(&request, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(
        exec.parent_span_id, request.span_id,
        "the exec is the request's child"
    );
    assert_eq!(attr(&exec, "session").as_deref(), Some(sid.as_str()));
    assert_eq!(attr(&exec, "tenant").as_deref(), Some("t1"));
    assert_eq!(attr(&exec, "runtime").as_deref(), Some("jail"));
    assert_eq!(attr(&exec, "image").as_deref(), Some("host"));
    assert_eq!(attr(&exec, "verdict").as_deref(), Some("ok"));
    assert_eq!(attr(&exec, "exit_code").as_deref(), Some("7"));
    assert!(attr(&exec, "duration_ms").is_some());
    // Lifecycle steps have spans of their own (the create's source recorded on it).
    let all = spans.lock().unwrap().clone();
    let create = all
        .iter()
        .find(|s| s.name == "session.create")
        .expect("a session.create span");
    assert_eq!(attr(create, "source").as_deref(), Some("cold"));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
