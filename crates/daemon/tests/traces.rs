//! OpenTelemetry through the real daemon: this test is the OTLP collector (HTTP with protobuf
//! bodies, and gRPC, on loopback). A request carrying a W3C `traceparent` gets a request span that is the caller's
//! child, named by its route template (REST and E2B alike); the exec it runs is a child of that
//! whether awaited, streamed or in the background, and what the agent timed in the sandbox is
//! the exec's child, whose context the process got as `TRACEPARENT`.

mod common;
#[path = "support/otlp.rs"]
mod otlp;

use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use common::*;
use otlp::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// One trace per request kind, so each tree is found by its trace id.
const JSON_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SSE_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4737";
const BACKGROUND_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4738";
const CONTEXT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4739";
const E2B_CREATE_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e473a";
const E2B_RUN_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e473b";
const LIFECYCLE_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e473c";
const GRPC_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e473d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_exec_is_its_requests_child_with_an_in_sandbox_child() {
    let Some(()) = root_or_skip() else { return };
    let (spans, url) = collector().await;
    let config = format!("{BASE_CONFIG}[telemetry]\notlp_endpoint = \"{url}\"\n");
    let mut d = Daemon::start(&config).await;
    let sid = d.create(json!({})).await;
    let exec_path = format!("/v1/sandbox/sessions/{sid}/exec");

    let resp = d
        .req(Method::POST, &exec_path, KEY1)
        .header("traceparent", traceparent(JSON_TRACE))
        .json(&json!({"shell": COMMAND}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let awaited: Value = resp.json().await.unwrap();

    let resp = d
        .req(Method::POST, &exec_path, KEY1)
        .header("traceparent", traceparent(SSE_TRACE))
        .header("accept", "text/event-stream")
        .json(&json!({"shell": COMMAND}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let streamed = resp.text().await.unwrap();

    let resp = d
        .req(Method::POST, &exec_path, KEY1)
        .header("traceparent", traceparent(BACKGROUND_TRACE))
        .json(&json!({"shell": COMMAND, "background": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let exec_id = resp.json::<Value>().await.unwrap()["exec_id"]
        .as_str()
        .unwrap()
        .to_string();
    let background = wait_for_result(&d, &sid, &exec_id).await;

    let resp = d
        .req(
            Method::POST,
            &format!("/v1/sandbox/sessions/{sid}/contexts/default/run"),
            KEY1,
        )
        .header("traceparent", traceparent(CONTEXT_TRACE))
        .json(
            &json!({"code": "import os, time; time.sleep(0.3); print(os.environ['TRACEPARENT'])"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let context_run: Value = resp.json().await.unwrap();

    let (e2b_id, e2b_output) = e2b_commands_run(&d).await;

    // The requests in the Prometheus metrics, by route template, and the create by path.
    let metrics = d.metrics().await;
    for line in [
        "koder_http_requests_total{route=\"/v1/sandbox/sessions/{id}/exec\",status=\"200\"} 2",
        "koder_http_requests_total{route=\"/v1/sandbox/sessions/{id}/exec\",status=\"202\"} 1",
        "koder_http_requests_total{route=\"/v1/sandbox/sessions\",status=\"201\"} 1",
        "koder_http_request_duration_seconds_count{route=\"/v1/sandbox/sessions/{id}/exec\"} 3",
        "koder_session_create_seconds_count{source=\"cold\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }
    // Pause, resume, snapshot and destroy, each request traced.
    let lifecycle = [
        (
            Method::POST,
            format!("/v1/sandbox/sessions/{sid}/pause"),
            StatusCode::OK,
        ),
        (
            Method::POST,
            format!("/v1/sandbox/sessions/{sid}/resume"),
            StatusCode::OK,
        ),
        (
            Method::POST,
            format!("/v1/sandbox/sessions/{sid}/snapshot"),
            StatusCode::CREATED,
        ),
        (
            Method::DELETE,
            format!("/v1/sandbox/sessions/{sid}"),
            StatusCode::NO_CONTENT,
        ),
    ];
    for (method, path, want) in &lifecycle {
        let resp = d
            .req(method.clone(), path, KEY1)
            .header("traceparent", traceparent(LIFECYCLE_TRACE))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), *want, "{method} {path}");
    }
    // Stopping flushes what the batch exporter still holds.
    d.stop();

    let exec_route = "POST /v1/sandbox/sessions/{id}/exec";
    let tree = [exec_route, "exec", "sandbox.exec"];
    let all = spans_of(&spans, JSON_TRACE, &tree).await;
    let (exec, seen) = check_exec_tree(&all, JSON_TRACE, exec_route, (&sid, "awaited", "jail"));
    assert_eq!(
        awaited["stdout"].as_str().unwrap().trim(),
        seen,
        "TRACEPARENT"
    );
    assert_eq!(
        attr(&exec, "peak_memory_kib"),
        awaited["peak_memory_kib"].as_u64().map(|k| k.to_string()),
        "the exec's peak memory"
    );
    let request = named(&all, exec_route);
    assert_eq!(
        attr(request, "http.route").as_deref(),
        Some("/v1/sandbox/sessions/{id}/exec")
    );
    assert_eq!(
        attr(request, "http.response.status_code").as_deref(),
        Some("200")
    );

    let all = spans_of(&spans, SSE_TRACE, &tree).await;
    let (_, seen) = check_exec_tree(&all, SSE_TRACE, exec_route, (&sid, "streamed", "jail"));
    assert!(
        streamed.contains(&seen),
        "TRACEPARENT in the stream: {streamed}"
    );

    let all = spans_of(&spans, BACKGROUND_TRACE, &tree).await;
    let (_, seen) = check_exec_tree(
        &all,
        BACKGROUND_TRACE,
        exec_route,
        (&sid, "background", "jail"),
    );
    assert_eq!(background["stdout"].as_str().unwrap().trim(), seen);
    assert_eq!(
        attr(named(&all, exec_route), "http.response.status_code").as_deref(),
        Some("202")
    );

    // A context run: the exec span of an interpreter run, and its child the interpreter's work
    // on it, whose context the code saw as `TRACEPARENT`.
    let run_route = "POST /v1/sandbox/sessions/{id}/contexts/{cid}/run";
    let all = spans_of(&spans, CONTEXT_TRACE, &[run_route, "exec", "sandbox.run"]).await;
    let request = named(&all, run_route);
    let run = named(&all, "exec");
    assert_eq!(run.parent_span_id, request.span_id);
    assert_eq!(attr(run, "mode").as_deref(), Some("context"));
    assert_eq!(attr(run, "verdict").as_deref(), Some("ok"));
    assert_eq!(attr(run, "session").as_deref(), Some(sid.as_str()));
    assert!(attr(run, "duration_ms").unwrap().parse::<u64>().unwrap() >= 300);
    let inside = named(&all, "sandbox.run");
    assert_eq!(inside.parent_span_id, run.span_id);
    assert!(
        inside.start_time_unix_nano >= run.start_time_unix_nano
            && inside.end_time_unix_nano <= run.end_time_unix_nano,
        "the interpreter's work lies within its run"
    );
    let wall: u64 = attr(inside, "wall_us").unwrap().parse().unwrap();
    assert!(
        wall >= 300_000,
        "the interpreter's work took its sleep: {wall} µs"
    );
    assert!(inside.end_time_unix_nano - inside.start_time_unix_nano >= 300_000_000);
    assert_eq!(attr(inside, "execution_count").as_deref(), Some("1"));
    assert_eq!(
        context_run["stdout"].as_str().unwrap().trim(),
        format!("00-{CONTEXT_TRACE}-{}-01", hex(&inside.span_id)),
        "{context_run}"
    );

    // E2B: the control plane's create and envd's process start (what `commands.run` sends)
    // have request spans named by their routes, parents of the create and the exec.
    let all = spans_of(
        &spans,
        E2B_CREATE_TRACE,
        &["POST /sandboxes", "session.create"],
    )
    .await;
    let request = named(&all, "POST /sandboxes");
    assert_eq!(hex(&request.parent_span_id), CALLER_SPAN);
    assert_eq!(
        attr(request, "http.response.status_code").as_deref(),
        Some("201")
    );
    let create = named(&all, "session.create");
    assert_eq!(create.parent_span_id, request.span_id);
    assert_eq!(attr(create, "session").as_deref(), Some(e2b_id.as_str()));
    let start_route = "POST /process.Process/{method}";
    let all = spans_of(
        &spans,
        E2B_RUN_TRACE,
        &[start_route, "exec", "sandbox.exec"],
    )
    .await;
    let (_, seen) = check_exec_tree(
        &all,
        E2B_RUN_TRACE,
        start_route,
        (&e2b_id, "background", "jail"),
    );
    assert!(e2b_output.contains(&seen), "TRACEPARENT: {e2b_output}");

    // Each lifecycle step's span is its request's child, naming the session.
    let steps = [
        ("POST /v1/sandbox/sessions/{id}/pause", "session.pause"),
        ("POST /v1/sandbox/sessions/{id}/resume", "session.resume"),
        (
            "POST /v1/sandbox/sessions/{id}/snapshot",
            "session.snapshot",
        ),
        ("DELETE /v1/sandbox/sessions/{id}", "session.destroy"),
    ];
    let names: Vec<&str> = steps.iter().flat_map(|(r, s)| [*r, *s]).collect();
    let all = spans_of(&spans, LIFECYCLE_TRACE, &names).await;
    for (route, step) in steps {
        let request = named(&all, route);
        assert_eq!(hex(&request.parent_span_id), CALLER_SPAN, "{route}");
        let span = named(&all, step);
        assert_eq!(span.parent_span_id, request.span_id, "{step}");
        assert_eq!(
            attr(span, "session").as_deref(),
            Some(sid.as_str()),
            "{step}"
        );
    }

    // Lifecycle steps have spans of their own (the create's source recorded on it).
    let all = spans.lock().unwrap().clone();
    let create = all
        .iter()
        .find(|s| s.name == "session.create" && attr(s, "session").as_deref() == Some(&sid))
        .expect("a session.create span");
    assert_eq!(attr(create, "source").as_deref(), Some("cold"));
}

async fn wait_for_result(d: &Daemon, sid: &str, exec_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, v) = d
            .json(
                Method::GET,
                &format!("/v1/sandbox/sessions/{sid}/execs/{exec_id}"),
                Value::Null,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        if !v["result"].is_null() {
            return v["result"].clone();
        }
        assert!(Instant::now() < deadline, "the background exec did not end");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An E2B sandbox made through the control plane, and what envd's `process.Process/Start`
/// (the call behind the SDK's `commands.run`) printed, its stdout decoded.
async fn e2b_commands_run(d: &Daemon) -> (String, String) {
    let resp = d
        .http
        .post(format!("{}/sandboxes", d.base))
        .header("x-api-key", KEY1)
        .header("traceparent", traceparent(E2B_CREATE_TRACE))
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let created: Value = resp.json().await.unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-c", COMMAND]}}).to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&(start.len() as u32).to_be_bytes());
    body.extend_from_slice(start.as_bytes());
    let resp = d
        .http
        .post(format!("{}/process.Process/Start", d.base))
        .header("x-api-key", KEY1)
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", "49983")
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .header("traceparent", traceparent(E2B_RUN_TRACE))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let frames = resp.bytes().await.unwrap();
    let mut stdout = Vec::new();
    let mut rest = &frames[..];
    while rest.len() >= 5 {
        let n = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let msg: Value = serde_json::from_slice(&rest[5..5 + n]).unwrap();
        if let Some(data) = msg["event"]["data"]["stdout"].as_str() {
            stdout.extend(BASE64.decode(data).unwrap());
        }
        rest = &rest[5 + n..];
    }
    (id, String::from_utf8_lossy(&stdout).into_owned())
}

/// The same spans reach an OTLP/gRPC collector (`otlp_protocol = "grpc"`): a traced exec's
/// tree, from the caller's span to the in-sandbox one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_grpc_collector() {
    let Some(()) = root_or_skip() else { return };
    let (spans, url) = grpc_collector().await;
    let config =
        format!("{BASE_CONFIG}[telemetry]\notlp_endpoint = \"{url}\"\notlp_protocol = \"grpc\"\n");
    let mut d = Daemon::start(&config).await;
    let sid = d.create(json!({})).await;
    let resp = d
        .req(
            Method::POST,
            &format!("/v1/sandbox/sessions/{sid}/exec"),
            KEY1,
        )
        .header("traceparent", traceparent(GRPC_TRACE))
        .json(&json!({"shell": COMMAND}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let ran: Value = resp.json().await.unwrap();
    d.stop();
    let exec_route = "POST /v1/sandbox/sessions/{id}/exec";
    let all = spans_of(&spans, GRPC_TRACE, &[exec_route, "exec", "sandbox.exec"]).await;
    let (_, seen) = check_exec_tree(&all, GRPC_TRACE, exec_route, (&sid, "awaited", "jail"));
    assert_eq!(ran["stdout"].as_str().unwrap().trim(), seen, "{ran}");
}

/// What operators watch besides requests: pool takes by image (hit or miss), egress decisions
/// and quota rejections, scraped from `/metrics` after the actions that make them. No traffic
/// leaves the host: the one connection goes to a private address the SSRF guard refuses, and
/// names are answered from the (empty) configured hosts only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_pool_takes_egress_decisions_and_quota_rejections() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(
        "[sessions]\nreap_interval = 0.2\npool = { bash = 1 }\n[network]\nsystem_resolver = false\n\
         [tenants.t1]\nplan = \"standard\"\nmax_sessions = 2\n",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !d
        .metrics()
        .await
        .contains("koder_pool_ready{image=\"host\",language=\"bash\"} 1")
    {
        assert!(Instant::now() < deadline, "no warm sandbox within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.create(json!({"language": "bash"})).await;
    // With network: the egress lane's, empty until such creates come (a miss there).
    let open = d
        .create(json!({"language": "bash", "network": {"mode": "open"}}))
        .await;
    let (status, body) = d
        .json(
            Method::POST,
            "/v1/sandbox/sessions",
            json!({"language": "bash"}),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    // Both are refused by the daemon's policy (a private range, an unknown name): nothing
    // leaves the host; the exec's own outcome does not matter here.
    d.exec(
            &open,
            json!({"shell": "getent hosts nothing.test; exec 3<>/dev/tcp/10.255.255.1/80; echo x >&3; timeout 5 cat <&3"}),
        )
        .await;

    let metrics = d.metrics().await;
    let value = |series: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(
        value("koder_pool_takes_total{image=\"host\",language=\"bash\",result=\"hit\"}"),
        1,
        "{metrics}"
    );
    assert_eq!(
        value("koder_pool_takes_total{image=\"host\",language=\"bash\",result=\"miss\"}"),
        0,
        "{metrics}"
    );
    assert_eq!(
        value("koder_pool_egress_takes_total{image=\"host\",language=\"bash\",result=\"miss\"}"),
        1,
        "{metrics}"
    );
    assert_eq!(
        value("koder_quota_rejections_total{quota=\"sessions\"}"),
        1,
        "{metrics}"
    );
    // A lookup may be asked more than once (A, AAAA); each is a decision.
    assert!(value("koder_egress_decisions_total{decision=\"deny\",proto=\"dns\"}") >= 1);
    assert!(value("koder_egress_decisions_total{decision=\"deny\",proto=\"tcp\"}") >= 1);
    assert!(!metrics.contains("decision=\"allow\""), "{metrics}");
}
