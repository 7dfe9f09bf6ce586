//! Regression tests for issue 14 (security findings), daemon side, through the real daemon.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";

/// The agent pid files of every sandbox the daemon runs (`<data>/.../sandboxes/<id>/agent.pid`).
fn agent_pid_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.file_name().is_some_and(|n| n == "agent.pid") {
            found.push(path);
        } else if e.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink()) {
            found.extend(agent_pid_files(&path));
        }
    }
    found
}

/// SIGKILLs the agent of the daemon's only sandbox, as a crash inside it would; returns the
/// sandbox's directory.
fn kill_only_agent(d: &Daemon) -> PathBuf {
    let pids = agent_pid_files(&d.data_dir());
    assert_eq!(pids.len(), 1, "one sandbox expected: {pids:?}");
    let pid: i32 = std::fs::read_to_string(&pids[0])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid > 1);
    // SAFETY: plain syscall on a pid this test started; no memory is shared.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    pids[0].parent().unwrap().to_path_buf()
}

/// Polls the session until it is stopped; returns its view and how long that took.
async fn until_stopped(d: &Daemon, id: &str) -> (Value, Duration) {
    let began = Instant::now();
    loop {
        let (status, v) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        if v["state"] == "stopped" {
            return (v, began.elapsed());
        }
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "session still {} 3 s after its agent died",
            v["state"]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_dead_agent_stops_its_session_at_once_and_frees_its_sandbox() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "bash"})).await;
    assert_eq!(
        d.exec(&id, json!({"shell": "echo up"})).await["stdout"],
        "up\n"
    );
    assert!(!sandbox_cgroups(&d).is_empty());

    let sandbox_dir = kill_only_agent(&d);
    let (session, took) = until_stopped(&d, &id).await;
    assert!(
        took <= Duration::from_secs(1),
        "stopped only after {took:?}"
    );
    assert_eq!(session["end_reason"], "agent exited");

    // Every later operation fails at once with the typed error, not a hang or a 404.
    let probes = [
        (
            Method::POST,
            format!("{S}/{id}/exec"),
            json!({"shell": "true", "timeout_ms": 5000}),
        ),
        (
            Method::GET,
            format!("{S}/{id}/files?path=/tmp"),
            Value::Null,
        ),
        (Method::GET, format!("{S}/{id}/metrics"), Value::Null),
        (Method::POST, format!("{S}/{id}/contexts"), json!({})),
    ];
    for (method, path, body) in probes {
        let began = Instant::now();
        let (status, v) = tokio::time::timeout(Duration::from_secs(5), d.json(method, &path, body))
            .await
            .unwrap_or_else(|_| panic!("{path} hung on a dead session"));
        assert_eq!(
            (status, error_code(&v)),
            (StatusCode::GONE, "SANDBOX-SESSION-STOPPED"),
            "{path}: {v}"
        );
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agent exited"));
        assert!(began.elapsed() < Duration::from_secs(2), "{path} slow");
    }
    // Another tenant still cannot tell the session exists.
    let (status, v) = d
        .json_as(
            KEY2,
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": "true"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );

    assert!(
        !sandbox_dir.exists(),
        "sandbox dir left: {}",
        sandbox_dir.display()
    );
    assert_eq!(sandbox_cgroups(&d), Vec::<PathBuf>::new());
    assert!(d
        .metrics()
        .await
        .lines()
        .any(|l| l.contains("agent exited") && !l.ends_with(" 0")));
    // The quota slot came back: a new session works.
    let again = d.create(json!({"language": "bash"})).await;
    assert_eq!(
        d.exec(&again, json!({"shell": "echo ok"})).await["stdout"],
        "ok\n"
    );
}

#[tokio::test]
async fn an_exec_running_when_the_agent_dies_ends_at_once() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "bash"})).await;
    let running = {
        let (http, url) = (d.http.clone(), format!("{}{S}/{id}/exec", d.base));
        tokio::spawn(async move {
            let resp = http
                .post(url)
                .bearer_auth(KEY1)
                .json(&json!({"shell": "echo started; sleep 60", "timeout_ms": 120000}))
                .send()
                .await
                .unwrap();
            (resp.status(), resp.json::<Value>().await.unwrap())
        })
    };
    // The exec is running once its process is in the sandbox.
    let began = Instant::now();
    while !std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        std::fs::read_to_string(p.path().join("cmdline"))
            .is_ok_and(|c| c.starts_with("sleep\x0060\x00"))
    }) {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "exec never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill_only_agent(&d);
    let (status, v) = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the running exec hung after its agent died")
        .unwrap();
    // Output printed before the death is kept, and the exec says it was killed.
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["verdict"], "SANDBOX-EXEC-KILLED");
    assert_eq!(v["stdout"], "started\n");
    until_stopped(&d, &id).await;
}

#[tokio::test]
async fn a_dead_warm_sandbox_is_discarded_never_handed_out() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start("[sessions]\nreap_interval = 0.2\npool = {bash = 1}\n").await;
    let began = Instant::now();
    while agent_pid_files(&d.data_dir()).len() != 1 {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "pool never filled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dead_dir = kill_only_agent(&d);
    // The pool drops it (its directory goes) and starts a replacement.
    let began = Instant::now();
    while dead_dir.exists() {
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "dead warm sandbox kept"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let id = d.create(json!({"language": "bash"})).await;
    assert_eq!(
        d.exec(&id, json!({"shell": "echo alive"})).await["stdout"],
        "alive\n"
    );
}

/// An E2B sandbox of the key's tenant: (id, envd access token).
async fn e2b_sandbox(d: &Daemon, key: &str, template: &str) -> (String, String) {
    let resp = d
        .http
        .post(format!("{}/v2/sandboxes", d.base))
        .header("X-API-KEY", key)
        .json(&json!({"templateID": template}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["trafficAccessToken"], v["envdAccessToken"]);
    (
        v["sandboxID"].as_str().unwrap().into(),
        v["envdAccessToken"].as_str().unwrap().into(),
    )
}

/// Every envd and interpreter route: (port, method, path, content type, body). `{cid}` is a
/// context of the sandbox.
const IN_SANDBOX_ROUTES: &[(&str, &str, &str, &str, &str)] = &[
    ("49983", "GET", "/health", "", ""),
    ("49983", "GET", "/files?path=/etc/hostname", "", ""),
    (
        "49983",
        "POST",
        "/files?path=/tmp/up.txt",
        "application/octet-stream",
        "data",
    ),
    (
        "49983",
        "POST",
        "/process.Process/List",
        "application/json",
        "{}",
    ),
    (
        "49983",
        "POST",
        "/filesystem.Filesystem/Stat",
        "application/json",
        r#"{"path":"/tmp"}"#,
    ),
    (
        "49983",
        "POST",
        "/filesystem.Filesystem/ListDir",
        "application/json",
        r#"{"path":"/tmp","depth":1}"#,
    ),
    ("49983", "GET", "/no-such-endpoint", "", ""),
    ("49999", "GET", "/health", "", ""),
    ("49999", "POST", "/contexts", "application/json", "{}"),
    ("49999", "GET", "/contexts", "", ""),
    ("49999", "POST", "/contexts/{cid}/restart", "", ""),
    (
        "49999",
        "POST",
        "/execute",
        "application/json",
        r#"{"code":"1+1"}"#,
    ),
    ("49999", "DELETE", "/contexts/{cid}", "", ""),
];

async fn in_sandbox(
    d: &Daemon,
    sandbox: &str,
    route: &(&str, &str, &str, &str, &str),
    cid: &str,
    credential: Option<(&str, &str)>,
) -> (StatusCode, String) {
    let (port, method, path, content_type, body) = *route;
    let mut rb = d
        .http
        .request(
            method.parse().unwrap(),
            format!("{}{}", d.base, path.replace("{cid}", cid)),
        )
        .header("E2b-Sandbox-Id", sandbox)
        .header("E2b-Sandbox-Port", port)
        .header("connect-protocol-version", "1");
    if !content_type.is_empty() {
        rb = rb
            .header("content-type", content_type)
            .body(body.to_string());
    }
    if let Some((name, value)) = credential {
        rb = rb.header(name, value);
    }
    let resp = rb.send().await.unwrap();
    (resp.status(), resp.text().await.unwrap())
}

/// A refusal carries E2B's error shape and nothing of the sandbox: at most the id the request
/// named itself (E2B's "not found" repeats it as `sandboxId`).
fn refused(status: StatusCode, body: &str, expected: StatusCode, asked: &str, what: &str) {
    assert_eq!(status, expected, "{what}: {body}");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{what}: {body}"));
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    match v.get("sandboxId") {
        Some(id) => {
            assert_eq!(keys, ["code", "message", "sandboxId"], "{what}: {body}");
            assert_eq!(id, asked, "{what}: {body}");
        }
        None => assert_eq!(keys, ["code", "message"], "{what}: {body}"),
    }
    assert_eq!(v["code"], expected.as_u16(), "{what}");
}

#[tokio::test]
async fn every_envd_and_interpreter_route_needs_the_sandboxes_credential() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let (mine, my_token) = e2b_sandbox(&d, KEY1, "code-interpreter-v1").await;
    let (_theirs, their_token) = e2b_sandbox(&d, KEY2, "base").await;
    // A context to aim the context routes at: refused requests must leave it alone.
    let (_, created) = in_sandbox(
        &d,
        &mine,
        &IN_SANDBOX_ROUTES[8],
        "",
        Some(("X-Access-Token", &my_token)),
    )
    .await;
    let cid = serde_json::from_str::<Value>(&created).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    for route in IN_SANDBOX_ROUTES {
        let what = format!("{} {} :{}", route.1, route.2, route.0);
        let denied: [(Option<(&str, &str)>, StatusCode); 5] = [
            (None, StatusCode::UNAUTHORIZED),
            (
                Some(("X-Access-Token", &their_token)),
                StatusCode::UNAUTHORIZED,
            ),
            (
                Some(("E2B-Traffic-Access-Token", "0000")),
                StatusCode::UNAUTHORIZED,
            ),
            (Some(("X-API-KEY", "not-a-key")), StatusCode::UNAUTHORIZED),
            // Another tenant's key: the sandbox does not exist for it.
            (Some(("X-API-KEY", KEY2)), StatusCode::BAD_GATEWAY),
        ];
        for (credential, expected) in denied {
            let (status, body) = in_sandbox(&d, &mine, route, &cid, credential).await;
            refused(
                status,
                &body,
                expected,
                &mine,
                &format!("{what} with {credential:?}"),
            );
        }
        for credential in [
            ("X-Access-Token", my_token.as_str()),
            ("E2B-Traffic-Access-Token", my_token.as_str()),
            ("X-API-KEY", KEY1),
        ] {
            let (status, body) = in_sandbox(&d, &mine, route, &cid, Some(credential)).await;
            let expected_missing = route.2 == "/no-such-endpoint"
                || (route.1 == "DELETE" && credential.0 != "X-Access-Token");
            if expected_missing {
                // Past authentication: the route itself answers (an unknown endpoint, or the
                // context the first credential's DELETE already removed).
                assert_eq!(
                    status,
                    StatusCode::NOT_FOUND,
                    "{what} with {credential:?}: {body}"
                );
            } else {
                assert!(
                    status.is_success(),
                    "{what} with {credential:?}: {status} {body}"
                );
            }
        }
    }
}

/// Answers every request with the headers it got, as JSON (stdlib only).
const HEADER_ECHO: &str = r#"
import http.server, json
class Echo(http.server.BaseHTTPRequestHandler):
    def reply(self):
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = reply
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Echo).serve_forever()
"#;

#[tokio::test]
async fn the_preview_proxy_forwards_no_credential_to_sandbox_code() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    let resp = d
        .req(Method::PUT, &format!("{S}/{id}/files"), KEY1)
        .query(&[("path", "/tmp/echo.py")])
        .body(HEADER_ECHO)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let (status, _) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"cmd": ["/usr/bin/python3", "/tmp/echo.py"], "background": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let began = Instant::now();
    while d
        .json(Method::GET, &format!("{S}/{id}/upstream"), Value::Null)
        .await
        .0
        != StatusCode::OK
    {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "echo server never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let resp = d
        .req(Method::GET, &format!("{S}/{id}/preview/page"), KEY1)
        .header("X-API-KEY", KEY1)
        .header("X-Access-Token", "secret-token")
        .header("E2B-Traffic-Access-Token", "secret-token")
        .header("Cookie", "daemon_session=secret")
        .header("Proxy-Authorization", "Basic c2VjcmV0Og==")
        .header("Connection", "keep-alive, x-hop-secret")
        .header("X-Hop-Secret", "secret")
        .header("X-App-Header", "kept")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let seen: Value = resp.json().await.unwrap();
    assert_eq!(seen["x-app-header"], "kept", "{seen}");
    let leaked: Vec<(&String, &Value)> = seen
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, v)| {
            ["authorization", "x-hop-secret", "connection"].contains(&k.as_str())
                || koder_http::credentials::ALL.contains(&k.as_str())
                || v.as_str()
                    .is_some_and(|v| v.contains("secret") || v.contains(KEY1))
        })
        .collect();
    assert!(leaked.is_empty(), "reached the sandbox: {leaked:?}");
}

async fn context_run(d: &Daemon, id: &str, cid: &str, code: &str) -> Value {
    let path = format!("{S}/{id}/contexts/{cid}/run");
    let (status, r) = d.json(Method::POST, &path, json!({ "code": code })).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_processes_recovers_a_fork_bombed_session_and_keeps_it() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d
        .create(json!({"language": "python", "limits": {"pids": 48}}))
        .await;
    let (status, ctx) = d
        .json(Method::POST, &format!("{S}/{id}/contexts"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ctx}");
    let cid = ctx["context_id"].as_str().unwrap().to_string();
    assert!(context_run(&d, &id, &cid, "x = 41").await["error"].is_null());
    let (status, bg) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"cmd": ["sleep", "600"], "background": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{bg}");
    let exec_id = bg["exec_id"].as_str().unwrap().to_string();

    let started = d
        .exec(
            &id,
            json!({"shell": "setsid bash -c 'f(){ f | f & }; f' </dev/null >/dev/null 2>&1 & echo started"}),
        )
        .await;
    assert_eq!(started["stdout"], "started\n");
    // Saturated: the workload holds as many tasks as its pids limit allows (the agent, in a leaf
    // of its own, can still start a process there, but nothing in it can fork any more).
    let began = Instant::now();
    loop {
        let (status, m) = d
            .json(Method::GET, &format!("{S}/{id}/metrics"), Value::Null)
            .await;
        assert_eq!(status, StatusCode::OK, "{m}");
        if m["pids_current"].as_u64() >= m["pids_limit"].as_u64() {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the fork bomb never saturated pids: {m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A bomb task that fails to fork exits and frees its slot for a moment, so a fork of ours
    // may win one: EAGAIN must come within a few attempts.
    let fork =
        "import os\ntry:\n    os.fork() or os._exit(0)\nexcept OSError as e:\n    print(e.errno)";
    let refused = async {
        for _ in 0..50 {
            let out = d
                .exec(&id, json!({"cmd": ["/usr/bin/python3", "-c", fork]}))
                .await;
            if out["stdout"] == "11\n" {
                return true;
            }
        }
        false
    };
    assert!(
        refused.await,
        "forks in the saturated session kept succeeding"
    );

    // Another tenant can neither kill them nor learn the session exists.
    let (status, v) = d
        .json_as(
            KEY2,
            Method::POST,
            &format!("{S}/{id}/kill-processes"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );

    let (status, v) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/kill-processes"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["killed"].as_u64().unwrap() >= 10, "{v}");

    assert_eq!(
        d.exec(&id, json!({"shell": "echo back"})).await["stdout"],
        "back\n"
    );
    let (_, session) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!(session["state"], "running");
    // The followed exec ended, as killed.
    let began = Instant::now();
    let status = loop {
        let (_, st) = d
            .json(
                Method::GET,
                &format!("{S}/{id}/execs/{exec_id}"),
                Value::Null,
            )
            .await;
        if st["state"] == "exited" {
            break st;
        }
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "followed exec still running: {st}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        status["result"]["verdict"], "SANDBOX-EXEC-KILLED",
        "{status}"
    );
    // The interpreter died with the rest and comes back, without its state.
    let again = context_run(&d, &id, &cid, "print('x' in globals())").await;
    assert_eq!(again["stdout"], "False\n", "{again}");

    // The E2B control-plane extension does the same, with the tenant's key only.
    let e2b = |key: &str| {
        d.http
            .post(format!("{}/sandboxes/{id}/kill-processes", d.base))
            .header("X-API-KEY", key)
            .send()
    };
    let resp = e2b(KEY2).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = e2b(KEY1).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = resp.json().await.unwrap();
    assert!(v["killed"].is_u64(), "{v}");
    assert_eq!(
        d.exec(&id, json!({"shell": "echo still"})).await["stdout"],
        "still\n"
    );
}
