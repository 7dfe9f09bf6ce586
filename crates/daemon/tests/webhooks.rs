//! Webhooks through the real daemon, delivering to receivers this test runs on loopback
//! (enabled with `[webhooks] allow_private`): signatures verify, a 500 is retried with the same
//! event id, a delivery pending at a restart arrives after it, private targets are refused
//! by default, and one tenant never sees another's endpoints.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const SECRET: &str = "test-secret-0123456789";
const CONFIG: &str = "[sessions]\nreap_interval = 0.2\npool = {}\n\
    [webhooks]\nallow_private = true\nbackoff_initial_ms = 200\nbackoff_max_s = 1\n";

/// How the receiver answers.
const FAIL_FIRST: u8 = 0;
const DOWN: u8 = 1;
const UP: u8 = 2;

#[derive(Debug, Clone)]
struct Got {
    answered: u16,
    signature: String,
    body: String,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("delivery body is JSON")
    }
}

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Got>>>,
    seen: Arc<Mutex<HashSet<String>>>,
    mode: Arc<AtomicU8>,
}

impl Receiver {
    /// Serves on a free loopback port; the URL to register.
    async fn start(mode: u8) -> (Receiver, String) {
        let r = Receiver::default();
        r.mode.store(mode, Ordering::SeqCst);
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (r, url)
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Accepted deliveries of `kind` (one per event id).
    fn accepted(&self, kind: &str) -> Vec<Value> {
        let mut ids = HashSet::new();
        self.got()
            .iter()
            .filter(|g| g.answered == 200)
            .map(Got::json)
            .filter(|v| v["type"] == kind && ids.insert(v["id"].to_string()))
            .collect()
    }

    async fn wait_accepted(&self, kind: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.accepted(kind);
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "no {n} accepted {kind} deliveries within 20 s: {:?}",
                self.got()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: String) -> AxumStatus {
    let id = serde_json::from_str::<Value>(&body).unwrap_or_default()["id"].to_string();
    let first = r.seen.lock().unwrap().insert(id);
    let status = match r.mode.load(Ordering::SeqCst) {
        FAIL_FIRST if first => AxumStatus::INTERNAL_SERVER_ERROR,
        DOWN => AxumStatus::SERVICE_UNAVAILABLE,
        _ => AxumStatus::OK,
    };
    let signature = headers
        .get("koder-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    r.got.lock().unwrap().push(Got {
        answered: status.as_u16(),
        signature,
        body,
    });
    status
}

async fn register(d: &Daemon, url: &str, events: Value) -> Value {
    let (status, v) = d
        .json(
            Method::POST,
            "/v1/sandbox/webhooks",
            json!({"url": url, "events": events, "secret": SECRET}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["secret"], SECRET, "the secret is shown at creation");
    v
}

async fn deliveries(d: &Daemon, hook: &str) -> Vec<Value> {
    let path = format!("/v1/sandbox/webhooks/{hook}/deliveries");
    let (status, v) = d.json(Method::GET, &path, Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["deliveries"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_signed_and_retried_after_a_500() {
    let Some(()) = root_or_skip() else { return };
    let (rx, url) = Receiver::start(FAIL_FIRST).await;
    let d = Daemon::start(CONFIG).await;
    let hook = register(&d, &url, json!([])).await;
    let hook_id = hook["id"].as_str().unwrap();

    let sid = d.create(json!({})).await;
    let r = d
        .exec(&sid, json!({"shell": "sleep 30", "timeout_ms": 300}))
        .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-TIMEOUT");
    d.exec(&sid, json!({"shell": "exit 3"})).await;
    let (status, _) = d
        .json(
            Method::DELETE,
            &format!("/v1/sandbox/sessions/{sid}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let created = rx.wait_accepted("session.created", 1).await;
    let verdicts = rx.wait_accepted("exec.verdict", 1).await;
    let stopped = rx.wait_accepted("session.stopped", 1).await;
    assert_eq!(created[0]["tenant"], "t1");
    assert_eq!(created[0]["data"]["session_id"], sid.as_str());
    assert_eq!(created[0]["data"]["source"], "cold");
    assert!(created[0]["created_at"].is_string());
    assert_eq!(
        verdicts.len(),
        1,
        "a normal exit (exit 3) is no event: {verdicts:?}"
    );
    assert_eq!(verdicts[0]["data"]["verdict"], "SANDBOX-EXEC-TIMEOUT");
    assert_eq!(stopped[0]["data"]["cause"], "deleted");

    let got = rx.got();
    for g in &got {
        let t = koder_webhooks::signature::verify(SECRET, &g.signature, g.body.as_bytes());
        assert!(t.is_some(), "bad signature {:?} on {}", g.signature, g.body);
        assert!(koder_webhooks::signature::verify(
            "wrong-secret-0000",
            &g.signature,
            g.body.as_bytes()
        )
        .is_none());
    }
    // Every event was refused once, then redelivered under the same id.
    let created_id = created[0]["id"].as_str().unwrap();
    let attempts: Vec<u16> = got
        .iter()
        .filter(|g| g.json()["id"] == created_id)
        .map(|g| g.answered)
        .collect();
    assert_eq!(attempts, [500, 200]);

    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = deliveries(&d, hook_id).await;
        if log.len() == 3 && log.iter().all(|e| e["state"] == "delivered")
            || Instant::now() > deadline
        {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(log.len(), 3, "{log:?}");
    for entry in &log {
        assert_eq!(entry["state"], "delivered", "{entry}");
        assert_eq!(entry["attempts"], 2, "{entry}");
        assert_eq!(entry["last_status"], 200, "{entry}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_pending_at_a_restart_arrives_after_it() {
    let Some(()) = root_or_skip() else { return };
    let (rx, url) = Receiver::start(DOWN).await;
    let mut d = Daemon::start(CONFIG).await;
    let hook = register(&d, &url, json!(["session.created", "session.stopped"])).await;
    let hook_id = hook["id"].as_str().unwrap().to_string();
    let sid = d.create(json!({})).await;

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = deliveries(&d, &hook_id).await;
        let tried = log
            .iter()
            .any(|e| e["event_type"] == "session.created" && e["attempts"].as_u64() >= Some(1));
        if tried {
            assert_eq!(log[0]["state"], "pending", "{log:?}");
            assert_eq!(log[0]["last_status"], 503, "{log:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no attempt within 20 s: {log:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.stop();
    assert!(rx.accepted("session.created").is_empty());
    rx.mode.store(UP, Ordering::SeqCst);
    d.launch().await;

    let created = rx.wait_accepted("session.created", 1).await;
    assert_eq!(created[0]["data"]["session_id"], sid.as_str());
    // The shutdown ended the session: that event was queued before the daemon went.
    let stopped = rx.wait_accepted("session.stopped", 1).await;
    assert_eq!(stopped[0]["data"]["session_id"], sid.as_str());
    assert_eq!(stopped[0]["data"]["cause"], "daemon_shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_targets_are_refused_unless_allowed() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/",
    ] {
        let (status, v) = d
            .json(Method::POST, "/v1/sandbox/webhooks", json!({"url": url}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{url}: {v}");
        assert_eq!(error_code(&v), "SANDBOX-WEBHOOK-URL-REFUSED", "{url}: {v}");
    }
    for body in [
        json!({"url": "ftp://example.com/"}),
        json!({"url": "http://8.8.8.8/", "events": ["session.exploded"]}),
        json!({"url": "http://8.8.8.8/", "secret": "short"}),
    ] {
        let (status, v) = d
            .json(Method::POST, "/v1/sandbox/webhooks", body.clone())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(error_code(&v), "SANDBOX-INVALID-ARGUMENT", "{body}: {v}");
    }
    let (_, v) = d
        .json(Method::GET, "/v1/sandbox/webhooks", Value::Null)
        .await;
    assert_eq!(v["webhooks"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_never_sees_another_tenants_webhooks() {
    let Some(()) = root_or_skip() else { return };
    let (_rx, url) = Receiver::start(UP).await;
    let d = Daemon::start(CONFIG).await;
    let hook = register(&d, &url, json!([])).await;
    let id = hook["id"].as_str().unwrap();

    let (status, v) = d
        .json_as(KEY2, Method::GET, "/v1/sandbox/webhooks", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["webhooks"], json!([]));
    let path = format!("/v1/sandbox/webhooks/{id}/deliveries");
    let (status, v) = d.json_as(KEY2, Method::GET, &path, Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let unknown = d
        .json_as(
            KEY2,
            Method::GET,
            "/v1/sandbox/webhooks/wh_nope/deliveries",
            Value::Null,
        )
        .await;
    assert_eq!(unknown.1, v, "a foreign id answers like an unknown one");
    let (status, _) = d
        .json_as(
            KEY2,
            Method::DELETE,
            &format!("/v1/sandbox/webhooks/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (_, v) = d
        .json(Method::GET, "/v1/sandbox/webhooks", Value::Null)
        .await;
    let listed = v["webhooks"].as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], id);
    assert!(
        listed[0].get("secret").is_none(),
        "the secret is never listed: {v}"
    );
    let (status, _) = d
        .json(
            Method::DELETE,
            &format!("/v1/sandbox/webhooks/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = d.json(Method::GET, &path, Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
