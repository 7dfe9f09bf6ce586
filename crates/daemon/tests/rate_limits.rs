//! Per-tenant limits through the real daemon: request rate (429 `SANDBOX-RATE-LIMITED` with
//! `Retry-After` on the native and the E2B API, other tenants unaffected), concurrent execs,
//! and open WebSocket/SSE streams.

mod common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite;

const S: &str = "/v1/sandbox/sessions";

fn retry_after(headers: &reqwest::header::HeaderMap) -> u64 {
    headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_rate_is_refused_and_the_others_are_not() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[limits.plans.metered]\nrequests_per_second = 1\nburst = 3\n\
         [tenants.t1]\nplan = \"metered\"\n"
    ))
    .await;
    for i in 0..3 {
        let (status, v) = d.json(Method::GET, S, Value::Null).await;
        assert_eq!(status, StatusCode::OK, "request {i}: {v}");
    }
    let resp = d.req(Method::GET, S, KEY1).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!((1..=2).contains(&retry_after(resp.headers())));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(error_code(&body), "SANDBOX-RATE-LIMITED", "{body}");

    // t2 has no plan limits: its requests all pass while t1 is throttled.
    for _ in 0..20 {
        let (status, _) = d.json_as(KEY2, Method::GET, S, Value::Null).await;
        assert_eq!(status, StatusCode::OK);
    }
    // The E2B API draws on the same bucket and answers in its own shape.
    let e2b = |key: &str| {
        d.http
            .get(format!("{}/sandboxes", d.base))
            .header("x-api-key", key)
            .send()
    };
    let resp = e2b(KEY1).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(resp.headers()) >= 1);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], 429);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("SANDBOX-RATE-LIMITED"),
        "{body}"
    );
    assert_eq!(e2b(KEY2).await.unwrap().status(), StatusCode::OK);

    // The bucket refills at one request a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(d.json(Method::GET, S, Value::Null).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_execs_are_bounded_per_tenant() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!("{BASE_CONFIG}[limits]\nconcurrent_execs = 1\n")).await;
    let mine = d.create(json!({})).await;
    let (status, theirs) = d.json_as(KEY2, Method::POST, S, json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    let theirs = theirs["id"].as_str().unwrap().to_string();

    let long = d
        .req(Method::POST, &format!("{S}/{mine}/exec"), KEY1)
        .json(&json!({"shell": "sleep 2; echo done"}))
        .send();
    let long = tokio::spawn(long);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (status, v) = d
        .json(
            Method::POST,
            &format!("{S}/{mine}/exec"),
            json!({"shell": "true"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::TOO_MANY_REQUESTS, "SANDBOX-RATE-LIMITED"),
        "{v}"
    );
    // The other tenant's limit is its own.
    let (status, v) = d
        .json_as(
            KEY2,
            Method::POST,
            &format!("{S}/{theirs}/exec"),
            json!({"shell": "echo ok"}),
        )
        .await;
    assert_eq!(
        (status, v["stdout"].as_str()),
        (StatusCode::OK, Some("ok\n"))
    );
    // Reading is not an exec.
    assert_eq!(
        d.json(Method::GET, &format!("{S}/{mine}"), Value::Null)
            .await
            .0,
        StatusCode::OK
    );

    let first: Value = long.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(first["stdout"], "done\n");
    let again = d.exec(&mine, json!({"shell": "echo again"})).await;
    assert_eq!(again["stdout"], "again\n");
}

/// A terminal WebSocket as tenant t1, or the HTTP status that refused it.
async fn terminal(d: &Daemon, id: &str) -> Result<Socket, StatusCode> {
    use tungstenite::client::IntoClientRequest as _;
    let url = format!("{}{S}/{id}/terminal", d.base.replace("http://", "ws://"));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY1}").parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(resp)) => {
            Err(StatusCode::from_u16(resp.status().as_u16()).unwrap())
        }
        Err(e) => panic!("websocket: {e}"),
    }
}

fn streamed_exec(d: &Daemon, id: &str, shell: &str) -> reqwest::RequestBuilder {
    d.req(Method::POST, &format!("{S}/{id}/exec"), KEY1)
        .header("accept", "text/event-stream")
        .json(&json!({ "shell": shell }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_are_bounded_per_tenant() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[tenants.t1]\nplan = \"standard\"\nlimits = {{ streams = 1 }}\n"
    ))
    .await;
    let id = d.create(json!({})).await;

    // A terminal holds the one place: a second WebSocket and an SSE stream are refused.
    let mut ws = terminal(&d, &id).await.expect("first terminal");
    assert_eq!(
        terminal(&d, &id).await.err(),
        Some(StatusCode::TOO_MANY_REQUESTS)
    );
    let resp = streamed_exec(&d, &id, "echo hi").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(resp.headers()) >= 1);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(error_code(&body), "SANDBOX-RATE-LIMITED");
    // Plain requests are not streams.
    assert_eq!(d.json(Method::GET, S, Value::Null).await.0, StatusCode::OK);
    ws.close(None).await.unwrap();
    drop(ws);

    // Closed: the place comes back (once the daemon has seen the close).
    let deadline = Instant::now() + Duration::from_secs(10);
    let sse = loop {
        let resp = streamed_exec(&d, &id, "sleep 1; echo streamed")
            .send()
            .await
            .unwrap();
        if resp.status() == StatusCode::OK {
            break resp;
        }
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            Instant::now() < deadline,
            "the terminal's place never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // While the SSE stream runs it holds the place.
    assert_eq!(
        terminal(&d, &id).await.err(),
        Some(StatusCode::TOO_MANY_REQUESTS)
    );
    let events = read_sse(sse).await;
    assert_eq!(stdout_of(&events), "streamed\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match terminal(&d, &id).await {
            Ok(_) => break,
            Err(status) => assert_eq!(status, StatusCode::TOO_MANY_REQUESTS),
        }
        assert!(
            Instant::now() < deadline,
            "the stream's place never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
