//! Resource governance with real cgroups: memory, CPU and pids limits end in clear verdicts,
//! tenants are held to their quotas, operators manage them through the admin API.

mod common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";
const ADMIN_KEY: &str = "admin-key-0123456789";

async fn session_metrics(d: &Daemon, id: &str) -> Value {
    let (status, m) = d
        .json(Method::GET, &format!("{S}/{id}/metrics"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{m}");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_gets_the_oom_verdict_with_a_peak_near_the_cap() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d
        .create(json!({"language": "python", "limits": {"memory_mib": 64}}))
        .await;
    let r = d
        .exec(&id, json!({"code": "import sys\nprint('allocating', flush=True)\nchunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))"}))
        .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-KILLED-OOM", "{r}");
    assert_eq!(r["signal"], 9);
    assert_eq!(
        r["stdout"], "allocating\n",
        "output before the kill is kept"
    );
    let peak = r["peak_memory_kib"].as_u64().unwrap();
    assert!(
        (56 * 1024..=66 * 1024).contains(&peak),
        "peak {peak} KiB not near the 64 MiB cap"
    );
    let m = session_metrics(&d, &id).await;
    assert_eq!(m["memory_limit_kib"], 64 * 1024);
    assert!(m["oom_kills"].as_u64().unwrap() >= 1, "{m}");
    // The session survives its exec's OOM.
    assert_eq!(
        d.exec(&id, json!({"code": "print('ok')"})).await["stdout"],
        "ok\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_spinner_is_throttled_to_its_quota() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d
        .create(json!({"language": "python", "limits": {"cpu_millis": 200}}))
        .await;
    let before = session_metrics(&d, &id).await["cpu_used_ms"]
        .as_u64()
        .unwrap();
    let started = Instant::now();
    let r = d
        .exec(
            &id,
            json!({"code": "import time\nend = time.time() + 2\nwhile time.time() < end: pass"}),
        )
        .await;
    let wall_ms = started.elapsed().as_millis() as u64;
    assert_eq!(r["exit_code"], 0, "{r}");
    let used = session_metrics(&d, &id).await["cpu_used_ms"]
        .as_u64()
        .unwrap()
        - before;
    // 200 millis = a fifth of a core; allow for period granularity and interpreter start.
    let share = used as f64 / wall_ms as f64;
    assert!(
        (0.1..=0.32).contains(&share),
        "used {used} ms of CPU in {wall_ms} ms wall ({share:.2})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_hits_pids_and_the_daemon_stays_responsive() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let bomb = d
        .create(json!({"language": "python", "limits": {"pids": 48}}))
        .await;
    let other = d.create(json!({})).await;
    let code = "import os, sys, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('forked', n, type(e).__name__)\n    sys.exit(3)";
    let (bomb_result, probes) = tokio::join!(
        d.exec(&bomb, json!({"code": code, "timeout_ms": 20000})),
        async {
            let mut worst = Duration::ZERO;
            for _ in 0..5 {
                let t = Instant::now();
                let r = d.exec(&other, json!({"shell": "echo pong"})).await;
                assert_eq!(r["stdout"], "pong\n");
                worst = worst.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            worst
        }
    );
    assert_eq!(
        bomb_result["verdict"], "SANDBOX-EXEC-KILLED-PIDS",
        "{bomb_result}"
    );
    let out = bomb_result["stdout"].as_str().unwrap();
    assert!(
        out.starts_with("forked ") && out.contains("BlockingIOError"),
        "{out}"
    );
    let forked: u64 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(forked < 48, "forked {forked} past a pids limit of 48");
    assert!(
        probes < Duration::from_secs(2),
        "another session waited {probes:?} during the bomb"
    );
    let m = session_metrics(&d, &bomb).await;
    assert!(m["pids_current"].as_u64().unwrap() <= 48, "{m}");
    let (status, _) = d
        .json(Method::DELETE, &format!("{S}/{bomb}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_quotas_and_the_admin_api() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[auth]\nadmin_keys = [\"{ADMIN_KEY}\"]\n[tenants.t1]\nplan = \"standard\"\nmax_sessions = 2\n"
    ))
    .await;
    let a = d.create(json!({})).await;
    d.create(json!({})).await;
    let (status, e) = d.json(Method::POST, S, json!({})).await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::TOO_MANY_REQUESTS, "SANDBOX-QUOTA-SESSIONS")
    );
    d.json(Method::DELETE, &format!("{S}/{a}"), Value::Null)
        .await;
    d.create(json!({})).await;

    // Admin endpoints: 401 without a key, 403 with a tenant key.
    let (status, e) = d
        .json_as("", Method::GET, "/v1/sandbox/admin/tenants", Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::UNAUTHORIZED, "SANDBOX-AUTH-001")
    );
    let (status, e) = d
        .json_as(KEY1, Method::GET, "/v1/sandbox/admin/tenants", Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::FORBIDDEN, "SANDBOX-PERMISSION-DENIED")
    );
    let (status, list) = d
        .json_as(
            ADMIN_KEY,
            Method::GET,
            "/v1/sandbox/admin/tenants",
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let t1 = list["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "t1")
        .unwrap()
        .clone();
    assert_eq!(
        (t1["live_sessions"].as_u64(), t1["max_sessions"].as_u64()),
        (Some(2), Some(2)),
        "{t1}"
    );

    // A tenant moved to a plan without sandboxes gets 402; one created by the admin gets a key.
    let (status, t2) = d
        .json_as(
            ADMIN_KEY,
            Method::PUT,
            "/v1/sandbox/admin/tenants/t2",
            json!({"plan": "none"}),
        )
        .await;
    assert_eq!(
        (status, t2["plan"].as_str()),
        (StatusCode::OK, Some("none")),
        "{t2}"
    );
    let (status, e) = d.json_as(KEY2, Method::POST, S, json!({})).await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::PAYMENT_REQUIRED, "SANDBOX-PLAN-REQUIRED")
    );
    let (status, _) = d
        .json_as(
            ADMIN_KEY,
            Method::PUT,
            "/v1/sandbox/admin/tenants/newco",
            json!({"plan": "standard", "max_sessions": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, issued) = d
        .json_as(
            ADMIN_KEY,
            Method::POST,
            "/v1/sandbox/admin/tenants/newco/keys",
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let key = issued["api_key"].as_str().unwrap();
    let (status, s) = d.json_as(key, Method::POST, S, json!({})).await;
    assert_eq!(
        (status, s["tenant_id"].as_str()),
        (StatusCode::CREATED, Some("newco")),
        "{s}"
    );
    let (status, e) = d
        .json_as(
            ADMIN_KEY,
            Method::POST,
            "/v1/sandbox/admin/tenants/ghost/keys",
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );
    let (status, _) = d
        .json_as(
            ADMIN_KEY,
            Method::PUT,
            "/v1/sandbox/admin/tenants/bad%2Fid",
            json!({"plan": "x"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_metrics_report_live_use() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d
        .create(json!({"limits": {"memory_mib": 128, "pids": 100}}))
        .await;
    d.exec(
        &id,
        json!({"shell": "head -c 3000000 /dev/urandom > /workspace/blob"}),
    )
    .await;
    let m = session_metrics(&d, &id).await;
    assert_eq!(
        (m["memory_limit_kib"].as_u64(), m["pids_limit"].as_u64()),
        (Some(128 * 1024), Some(100))
    );
    assert!(m["pids_current"].as_u64().unwrap() >= 1);
    assert!(m["memory_current_kib"].as_u64().unwrap() > 0);
    assert!(m["disk_used_kib"].as_u64().unwrap() >= 2900, "{m}");
    assert!(m["disk_total_kib"].as_u64().unwrap() > m["disk_used_kib"].as_u64().unwrap());
    let (status, e) = d
        .json_as(KEY2, Method::GET, &format!("{S}/{id}/metrics"), Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_filler_hits_the_quota_and_uploads_get_507() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"limits": {"disk_mib": 40}})).await;
    let r = d.exec(&id, json!({"shell": "dd if=/dev/zero of=/workspace/fill bs=1M count=100; stat -c %s /workspace/fill"})).await;
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{r}"
    );
    let filled: u64 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(filled < 40 * 1024 * 1024, "{filled}");
    let m = session_metrics(&d, &id).await;
    assert!(m["disk_used_kib"].as_u64().unwrap() * 1024 >= filled, "{m}");

    let f = format!("{S}/{id}/files");
    // Far beyond the agent's credit window (a refusal there once stalled the upload), and
    // answered before the body is read: its rest is drained, so the answer arrives.
    let resp = d
        .http
        .put(format!("{}{f}", d.base))
        .bearer_auth(KEY1)
        .query(&[("path", "/workspace/upload.bin")])
        .body(vec![7u8; 32 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(
        error_code(&resp.json().await.unwrap()),
        "SANDBOX-FS-QUOTA-EXCEEDED"
    );
    let ls = d.exec(&id, json!({"shell": "ls -A /workspace"})).await;
    assert_eq!(ls["stdout"], "fill\n", "partial upload left behind: {ls}");
    // The host keeps no mount of the sandbox's disk.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&d.dir.path().display().to_string()));
}
