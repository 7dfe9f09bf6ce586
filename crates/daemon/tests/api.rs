//! The REST API of the real daemon, endpoint by endpoint and error code by error code.

mod common;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lifecycle() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let (status, s) = d
        .json(Method::POST, S, json!({"language": "python", "timeout_s": 120, "limits": {"memory_mib": 256}, "metadata": {"owner": "tëst"}}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = s["id"].as_str().unwrap();
    assert_eq!(s["state"], "running");
    assert_eq!(s["tenant_id"], "t1");
    assert_eq!(s["language"], "python");
    assert_eq!(s["image"], "host");
    assert_eq!(s["runtime"], "jail");
    assert_eq!(
        s["limits"],
        json!({"cpu_millis": 1000, "memory_mib": 256, "disk_mib": 1024, "pids": 256})
    );
    assert_eq!(s["network"], json!({"mode": "none"}));
    assert_eq!(s["metadata"]["owner"], "tëst");
    let created = chrono::DateTime::parse_from_rfc3339(s["created_at"].as_str().unwrap()).unwrap();
    let expires = chrono::DateTime::parse_from_rfc3339(s["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!((expires - created).num_seconds(), 120);

    let (status, list) = d.json(Method::GET, S, Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1);
    let (status, got) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!((status, &got["id"]), (StatusCode::OK, &s["id"]));

    let (status, t) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/timeout"),
            json!({"timeout_s": 3600}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{t}");
    let new_expiry =
        chrono::DateTime::parse_from_rfc3339(t["expires_at"].as_str().unwrap()).unwrap();
    assert!((new_expiry - chrono::Utc::now().fixed_offset()).num_seconds() > 3500);

    let (status, _) = d
        .json(Method::DELETE, &format!("{S}/{id}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, gone) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!(
        (status, gone["state"].as_str()),
        (StatusCode::OK, Some("stopped"))
    );
    let (_, list) = d.json(Method::GET, S, Value::Null).await;
    assert!(list["sessions"].as_array().unwrap().is_empty());
    let (status, _) = d
        .json(Method::DELETE, &format!("{S}/{id}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "delete is idempotent");
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": "true"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/timeout"),
            json!({"timeout_s": 10}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::CONFLICT, "SANDBOX-CONFLICT")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_forms_and_results() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!("{BASE_CONFIG}output_limit_bytes = 1000\n")).await;
    let id = d
        .create(json!({"language": "python", "env": {"FROM_SESSION": "s", "BOTH": "session"}}))
        .await;
    let p = format!("{S}/{id}/exec");

    let r = d.exec(&id, json!({"cmd": ["echo", "a b", "$HOME"]})).await;
    assert_eq!(r["stdout"], "a b $HOME\n", "argv form: no shell expansion");
    assert_eq!(r["exit_code"], 0);
    assert!(r["verdict"].is_null() && r["signal"].is_null());
    assert!(r["exec_id"].as_str().unwrap().len() >= 16);

    let r = d.exec(&id, json!({"shell": "echo $FROM_SESSION $BOTH $ONLY; pwd; exit 7", "env": {"BOTH": "exec", "ONLY": "x"}, "cwd": "/tmp"})).await;
    assert_eq!(r["stdout"], "s exec x\n/tmp\n");
    assert_eq!(r["exit_code"], 7);

    let r = d
        .exec(
            &id,
            json!({"code": "import sys; print(sys.stdin.read().upper())", "stdin": "piped"}),
        )
        .await;
    assert_eq!(r["stdout"], "PIPED\n", "{r}");
    let r = d
        .exec(
            &id,
            json!({"code": "console.log([1,2].map(x => x * 21).join(','))", "language": "node"}),
        )
        .await;
    assert_eq!(r["stdout"], "21,42\n", "{r}");
    let r = d
        .exec(&id, json!({"code": "raise SystemExit('boom')"}))
        .await;
    assert_eq!(
        (r["exit_code"].as_i64(), r["stderr"].as_str()),
        (Some(1), Some("boom\n"))
    );
    assert!(r["peak_memory_kib"].as_u64().unwrap() > 100, "{r}");

    let r = d
        .exec(
            &id,
            json!({"shell": "echo partial; sleep 30", "timeout_ms": 300}),
        )
        .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-TIMEOUT");
    assert_eq!(r["stdout"], "partial\n");
    assert_eq!(r["signal"], 9);

    let r = d
        .exec(
            &id,
            json!({"shell": "head -c 5000 /dev/zero | tr '\\0' x; echo tiny >&2"}),
        )
        .await;
    assert_eq!(r["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(
        (
            r["stdout_truncated"].as_bool(),
            r["stderr_truncated"].as_bool()
        ),
        (Some(true), Some(false))
    );

    for (body, why) in [
        (json!({}), "no form"),
        (json!({"cmd": ["ls"], "shell": "ls"}), "two forms"),
        (json!({"cmd": []}), "empty argv"),
        (
            json!({"cmd": ["ls"], "language": "python"}),
            "language without code",
        ),
        (
            json!({"code": "x", "language": "cobol"}),
            "unknown language",
        ),
        (json!({"shell": "true", "timeout_ms": 0}), "zero timeout"),
        (
            json!({"shell": "true", "env": {"A=B": "x"}}),
            "bad env name",
        ),
        (json!({"shell": "true", "cwd": "a\u{0}b"}), "NUL in cwd"),
        (json!({"cmd": "ls"}), "cmd of the wrong type"),
    ] {
        let (status, e) = d.json(Method::POST, &p, body).await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT"),
            "{why}: {e}"
        );
    }
    let (status, e) = d
        .json(Method::POST, &p, json!({"cmd": ["/no/such/program"]}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_and_errors() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!("{BASE_CONFIG}max_file_bytes = 8388608\n")).await;
    let id = d.create(json!({})).await;
    let f = format!("{S}/{id}/files");

    let payload: Vec<u8> = (0..5 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        payload.chunks(100_000).map(|c| Ok(c.to_vec())).collect();
    let resp = d
        .req(Method::PUT, &f, KEY1)
        .query(&[("path", "/workspace/dir/big.bin")])
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let entry: Value = resp.json().await.unwrap();
    assert_eq!(
        (entry["uid"].as_u64(), entry["gid"].as_u64()),
        (Some(0), Some(0)),
        "owned by the sandbox's root: {entry}"
    );
    assert_eq!(
        (entry["type"].as_str(), entry["size"].as_u64()),
        (Some("file"), Some(payload.len() as u64))
    );
    let resp = d
        .req(Method::GET, &f, KEY1)
        .query(&[("path", "/workspace/dir/big.bin")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/octet-stream");
    assert!(
        resp.bytes().await.unwrap() == payload,
        "download differs from upload"
    );

    let (status, e) = d
        .json(
            Method::POST,
            &format!("{f}/mkdir"),
            json!({"path": "/workspace/a/b/c"}),
        )
        .await;
    assert_eq!(
        (status, e["type"].as_str()),
        (StatusCode::CREATED, Some("dir")),
        "{e}"
    );
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{f}/move"),
            json!({"from": "/workspace/dir/big.bin", "to": "/workspace/a/big.bin"}),
        )
        .await;
    assert_eq!(
        (status, e["path"].as_str()),
        (StatusCode::OK, Some("/workspace/a/big.bin")),
        "{e}"
    );
    let resp = d
        .req(Method::GET, &format!("{f}/list"), KEY1)
        .query(&[("path", "/workspace/a"), ("depth", "2")])
        .send()
        .await
        .unwrap();
    let list: Value = resp.json().await.unwrap();
    let paths: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["/workspace/a/b", "/workspace/a/b/c", "/workspace/a/big.bin"]
    );

    // One entry by path; a symlink is described, not followed; missing and hostile paths.
    d.exec(&id, json!({"shell": "ln -s /etc/passwd /tmp/link"}))
        .await;
    for (path, status, kind) in [
        ("/workspace/a/big.bin", StatusCode::OK, Some("file")),
        ("/workspace/a", StatusCode::OK, Some("dir")),
        ("/tmp/link", StatusCode::OK, Some("symlink")),
        ("/workspace/none", StatusCode::NOT_FOUND, None),
        ("/../../../etc/gshadow", StatusCode::NOT_FOUND, None),
        ("", StatusCode::BAD_REQUEST, None),
    ] {
        let resp = d
            .req(Method::GET, &format!("{f}/stat"), KEY1)
            .query(&[("path", path)])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{path}");
        let e: Value = resp.json().await.unwrap();
        assert_eq!(e["type"].as_str(), kind, "{path}: {e}");
    }
    let (s, e) = d
        .json_as(
            KEY2,
            Method::GET,
            &format!("{f}/stat?path=/workspace/a"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );

    let del = |path: &'static str, recursive: &'static str| {
        d.req(Method::DELETE, &f, KEY1)
            .query(&[("path", path), ("recursive", recursive)])
            .send()
    };
    let resp = del("/workspace/a", "false").await.unwrap();
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(
        del("/workspace/a", "true").await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let resp = d
        .req(Method::GET, &f, KEY1)
        .query(&[("path", "/workspace/a/big.bin")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(&resp.json().await.unwrap()), "SANDBOX-NOT-FOUND");

    // Over the size limit, announced or not: 413 and nothing left behind.
    // An announced oversize is refused before any byte of the body is read.
    let head = format!(
        "PUT {f}?path=too-big HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY1}\r\ncontent-length: {}\r\n\r\n",
        9 * 1024 * 1024
    );
    let mut conn = tokio::net::TcpStream::connect(d.base.trim_start_matches("http://"))
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut conn, head.as_bytes())
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::io::AsyncReadExt::read(&mut conn, &mut answer)
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("SANDBOX-PAYLOAD-TOO-LARGE"), "{answer}");
    let stream =
        futures::stream::iter((0..90).map(|_| Ok::<_, std::io::Error>(vec![1u8; 100_000])));
    // Own client: the refused connection is closed by the server and must not be reused.
    let resp = reqwest::Client::new()
        .put(format!("{}{f}", d.base))
        .bearer_auth(KEY1)
        .query(&[("path", "too-big")])
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        error_code(&resp.json().await.unwrap()),
        "SANDBOX-PAYLOAD-TOO-LARGE"
    );
    let ls = d.exec(&id, json!({"shell": "ls -A /workspace"})).await;
    assert_eq!(ls["stdout"], "dir\n", "partial upload left behind: {ls}");

    // Hostile paths.
    for (path, want) in [
        ("a\u{0}b", StatusCode::BAD_REQUEST),
        ("", StatusCode::BAD_REQUEST),
        ("/../../etc/gshadow", StatusCode::NOT_FOUND),
    ] {
        let resp = d
            .req(Method::GET, &f, KEY1)
            .query(&[("path", path)])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), want, "{path:?}");
    }
    let long = "x/".repeat(3000);
    let resp = d
        .req(Method::GET, &f, KEY1)
        .query(&[("path", long.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = d
        .req(Method::PUT, &f, KEY1)
        .query(&[("path", "/usr/bin/evil")])
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::FORBIDDEN,
        "image must be read-only"
    );
    let resp = d.req(Method::GET, &f, KEY1).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "missing path");
    let resp = d
        .req(Method::GET, &format!("{f}/list"), KEY1)
        .query(&[("path", "/"), ("depth", "0")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_tenancy() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;

    let resp = d.http.get(format!("{}{S}", d.base)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&resp.json().await.unwrap()), "SANDBOX-AUTH-001");
    let (status, e) = d
        .json_as("wrong-key-123", Method::GET, S, Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::UNAUTHORIZED, "SANDBOX-AUTH-001")
    );

    // Tenant 2 sees tenant 1's session exactly like an unknown id.
    let unknown = "0123456789abcdef0123456789abcdef";
    for (method, suffix, body) in [
        (Method::GET, "", Value::Null),
        (Method::DELETE, "", Value::Null),
        (Method::POST, "/exec", json!({"shell": "id"})),
        (Method::POST, "/timeout", json!({"timeout_s": 5})),
        (Method::GET, "/files/list?path=/", Value::Null),
        (
            Method::POST,
            "/files/mkdir",
            json!({"path": "/workspace/x"}),
        ),
    ] {
        let theirs = d
            .json_as(
                KEY2,
                method.clone(),
                &format!("{S}/{id}{suffix}"),
                body.clone(),
            )
            .await;
        let none = d
            .json_as(
                KEY2,
                method.clone(),
                &format!("{S}/{unknown}{suffix}"),
                body,
            )
            .await;
        assert_eq!(
            theirs.0,
            StatusCode::NOT_FOUND,
            "{method} {suffix}: {:?}",
            theirs.1
        );
        assert_eq!(
            theirs, none,
            "{method} {suffix} distinguishes foreign from unknown"
        );
    }
    let (_, list) = d.json_as(KEY2, Method::GET, S, Value::Null).await;
    assert!(list["sessions"].as_array().unwrap().is_empty());
    // ...and tenant 1's session is untouched.
    let r = d.exec(&id, json!({"shell": "echo still here"})).await;
    assert_eq!(r["stdout"], "still here\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_typed_errors() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let raw = |body: &'static str, ct: Option<&'static str>| {
        let mut rb = d.req(Method::POST, S, KEY1).body(body);
        if let Some(ct) = ct {
            rb = rb.header("content-type", ct);
        }
        rb.send()
    };
    for (body, ct, want) in [
        (
            "{not json",
            Some("application/json"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "{\"language\": 5}",
            Some("application/json"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "{\"lang\": \"python\"}",
            Some("application/json"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "{\"timeout_s\": -1}",
            Some("application/json"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "{\"language\": \"python\"}",
            None,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
    ] {
        let resp = raw(body, ct).await.unwrap();
        assert_eq!(resp.status(), want, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert!(error_code(&v).starts_with("SANDBOX-"), "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    // A path segment that is not percent-encoded UTF-8 is bad input like any other.
    for (method, path) in [
        (Method::GET, format!("{S}/%FF")),
        (Method::POST, format!("{S}/%C3%28/exec")),
        (Method::GET, format!("{S}/%FF/execs/%FE")),
    ] {
        let resp = d.req(method, &path, KEY1).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{path}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(error_code(&v), "SANDBOX-INVALID-ARGUMENT", "{path}: {v}");
    }
    let big = format!(
        "{{\"metadata\": {{\"k\": \"{}\"}}}}",
        "x".repeat(2 * 1024 * 1024)
    );
    // Its own client: the server answers 413 without reading the body and closes that
    // connection, which must not be reused for the requests after it.
    let resp = reqwest::Client::new()
        .post(format!("{}{S}", d.base))
        .bearer_auth(KEY1)
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        error_code(&resp.json().await.unwrap()),
        "SANDBOX-PAYLOAD-TOO-LARGE"
    );

    for (body, status, code) in [
        (
            json!({"language": "cobol"}),
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
        (json!({"image": "nope"}), 404, "SANDBOX-IMAGE-NOT-FOUND"),
        (
            json!({"runtime": "vmware"}),
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
        (
            json!({"limits": {"memory_mib": 1_000_000}}),
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
        (
            json!({"limits": {"pids": 0}}),
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
        (json!({"timeout_s": 0}), 400, "SANDBOX-INVALID-ARGUMENT"),
        (
            json!({"timeout_s": 10_000_000}),
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
        (json!({"env": {"": "x"}}), 400, "SANDBOX-INVALID-ARGUMENT"),
        (
            json!({"runtime": "microvm"}),
            503,
            "SANDBOX-RUNTIME-UNAVAILABLE-001",
        ),
        (
            json!({"network": {"mode": "none", "allow": ["example.com"]}}),
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
        (
            json!({"network": {"mode": "allowlist", "allow": ["not a host!"]}}),
            400,
            "SANDBOX-NETWORK-RULE",
        ),
        (
            json!({"network": {"mode": "sideways"}}),
            400,
            "SANDBOX-INVALID-ARGUMENT",
        ),
    ] {
        let (s, v) = d.json(Method::POST, S, body.clone()).await;
        assert_eq!((s.as_u16(), error_code(&v)), (status, code), "{body}");
    }
    let resp = d
        .req(Method::GET, "/v1/sandbox/nothing-here", KEY1)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(&resp.json().await.unwrap()), "SANDBOX-NOT-FOUND");
    let resp = d.req(Method::PATCH, S, KEY1).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(error_code(&resp.json().await.unwrap()).starts_with("SANDBOX-"));
    let (_, list) = d.json(Method::GET, S, Value::Null).await;
    assert!(
        list["sessions"].as_array().unwrap().is_empty(),
        "a refused create left a session"
    );
}

/// A timeout ends its session when it passes, not at the reaper's next tick: here the tick
/// (10 minutes) never comes during the test, so only the wake at the timeout can end them —
/// one created with a short timeout, one whose timeout is shortened while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_sessions_are_destroyed_when_their_timeout_passes() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start("[sessions]\nreap_interval = 600\npool = {}\n").await;
    // The first tick has passed once the daemon answers; a create then wakes the reaper.
    let short = d.create(json!({"timeout_s": 1})).await;
    let long = d.create(json!({"timeout_s": 3600})).await;
    let sandboxes = d.data_dir().join("jail/sandboxes");
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 2);
    let (status, v) = d
        .json(
            Method::POST,
            &format!("{S}/{long}/timeout"),
            json!({"timeout_s": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    for id in [&short, &long] {
        let mut state = Value::Null;
        for _ in 0..100 {
            let (_, s) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
            state = s["state"].clone();
            if state == "stopped" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(state, "stopped", "{id} outlived its timeout by 8 s");
    }
    assert_eq!(
        std::fs::read_dir(&sandboxes).unwrap().count(),
        0,
        "expired sandbox still on disk"
    );
    assert!(d
        .metrics()
        .await
        .contains("koder_sessions_ended_total{reason=\"expired\"} 2"));
}

/// Host pids in the daemon's sandbox cgroups (every leaf of every hierarchy).
fn sandbox_pids(d: &Daemon) -> Vec<i32> {
    fn procs_below(dir: &std::path::Path, into: &mut Vec<i32>) {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        into.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                procs_below(&e.path(), into);
            }
        }
    }
    let mut pids = Vec::new();
    for group in sandbox_cgroups(d) {
        procs_below(&group, &mut pids);
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// A DELETE answers once nothing of the session runs any more (the rest of the teardown
/// finishes after it): every process is gone when it answers, its sandbox's cgroups and files
/// go shortly after, and its tenant's session slot is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_answers_with_every_process_gone_and_the_rest_follows() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}[tenants.t1]\nplan = \"standard\"\nmax_sessions = 1\n"
    ))
    .await;
    let id = d.create(json!({})).await;
    let out = d
        .exec(
            &id,
            json!({"shell": "nohup sleep 300 >/dev/null 2>&1 & setsid sleep 301 >/dev/null 2>&1 & echo ok"}),
        )
        .await;
    assert_eq!(out["stdout"], "ok\n", "{out}");
    let pids = sandbox_pids(&d);
    assert!(pids.len() >= 3, "agent and two sleeps expected: {pids:?}");

    let (status, v) = d
        .json(Method::DELETE, &format!("{S}/{id}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let left: Vec<i32> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert_eq!(
        left,
        Vec::<i32>::new(),
        "processes still running after DELETE"
    );
    let (_, v) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!(v["state"], "stopped", "{v}");
    // The tenant's one slot is free now, not after the teardown.
    let again = d.json(Method::POST, S, json!({})).await;
    assert_eq!(again.0, StatusCode::CREATED, "{}", again.1);
    let again = again.1["id"].as_str().unwrap().to_string();
    d.json(Method::DELETE, &format!("{S}/{again}"), Value::Null)
        .await;

    let sandboxes = d.data_dir().join("jail/sandboxes");
    let left = || {
        (
            std::fs::read_dir(&sandboxes).map_or(0, |r| r.count()),
            sandbox_cgroups(&d).len(),
        )
    };
    assert!(
        comes_true(|| left() == (0, 0)).await,
        "(sandbox dirs, cgroups) left 5 s after DELETE: {:?}",
        left()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_openapi() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    for path in ["/healthz", "/readyz"] {
        let resp = d
            .http
            .get(format!("{}{path}", d.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
    let id = d.create(json!({})).await;
    d.exec(&id, json!({"shell": "true"})).await;
    let m = d.metrics().await;
    for needle in [
        "koder_sessions_active 1",
        "koder_execs_total{verdict=\"ok\"} 1",
        "koder_exec_duration_seconds_count 1",
        "koder_session_create_seconds_count{source=\"cold\"} 1",
    ] {
        assert!(m.contains(needle), "metrics lack {needle:?}:\n{m}");
    }
    let spec: Value = d
        .http
        .get(format!("{}/openapi.json", d.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/sandbox/sessions",
        "/v1/sandbox/sessions/{id}/exec",
        "/v1/sandbox/sessions/{id}/files",
        "/v1/sandbox/sessions/{id}/files/move",
    ] {
        assert!(spec["paths"][path].is_object(), "openapi lacks {path}");
    }
    assert!(spec["components"]["schemas"]["CreateSession"].is_object());
}

/// A bound of the served document: `key` (`minimum`, `maxLength`, ...) of the schema at `at`.
fn bound(spec: &Value, at: &str, key: &str) -> u64 {
    spec.pointer(&format!("{at}/{key}"))
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("the document states no {key} at {at}"))
}

/// The schema of query parameter `name` of `GET path`, as a JSON pointer.
fn query_param(spec: &Value, path: &str, name: &str) -> String {
    let params = spec["paths"][path]["get"]["parameters"]
        .as_array()
        .unwrap_or_else(|| panic!("GET {path} has no parameters"));
    let i = params
        .iter()
        .position(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("GET {path} has no parameter {name}"));
    format!(
        "/paths/{}/get/parameters/{i}/schema",
        path.replace('/', "~1")
    )
}

/// A client that trusts the served document gets no 400 at its bounds and a 400 just past
/// them: the bounds stated (the configured maxima included) are the ones enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_states_the_bounds_the_daemon_enforces() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(
        "[sessions]\nreap_interval = 0.2\npool = {}\nmax_timeout_s = 600\nmax_exec_timeout_ms = 5000\n",
    )
    .await;
    let (_, spec) = d.json(Method::GET, "/openapi.json", Value::Null).await;
    let schemas = "/components/schemas";

    let at = format!("{schemas}/CreateSession/properties/timeout_s");
    let (low, high) = (bound(&spec, &at, "minimum"), bound(&spec, &at, "maximum"));
    assert_eq!((low, high), (1, 600), "the configured maximum is served");
    for (timeout, want) in [(low - 1, 400), (high + 1, 400), (high, 201)] {
        let (status, v) = d.json(Method::POST, S, json!({"timeout_s": timeout})).await;
        assert_eq!(status.as_u16(), want, "timeout_s {timeout}: {v}");
    }
    let id = d.create(json!({})).await;

    let at = format!("{schemas}/SetTimeout/properties/timeout_s");
    let high = bound(&spec, &at, "maximum");
    for (timeout, want) in [(high + 1, 400), (high, 200)] {
        let (status, v) = d
            .json(
                Method::POST,
                &format!("{S}/{id}/timeout"),
                json!({"timeout_s": timeout}),
            )
            .await;
        assert_eq!(status.as_u16(), want, "set timeout_s {timeout}: {v}");
    }

    let at = format!("{schemas}/ExecRequest/properties/timeout_ms");
    let high = bound(&spec, &at, "maximum");
    assert_eq!(high, 5000);
    for (timeout, want) in [(high + 1, 400), (high, 200)] {
        let (status, v) = d
            .json(
                Method::POST,
                &format!("{S}/{id}/exec"),
                json!({"cmd": ["true"], "timeout_ms": timeout}),
            )
            .await;
        assert_eq!(status.as_u16(), want, "exec timeout_ms {timeout}: {v}");
    }

    // A path at its longest is looked up (and not found); one byte more is refused.
    let at = query_param(&spec, "/v1/sandbox/sessions/{id}/files/stat", "path");
    let (shortest, longest) = (
        bound(&spec, &at, "minLength"),
        bound(&spec, &at, "maxLength"),
    );
    let d = &d;
    let stat = |path: String| {
        let url = format!("{S}/{id}/files/stat?path={path}");
        async move { d.json(Method::GET, &url, Value::Null).await }
    };
    assert_eq!(shortest, 1);
    assert_eq!(stat(String::new()).await.0, StatusCode::BAD_REQUEST);
    // `/` and 99 `a`s, over and over: no name is over the kernel's NAME_MAX.
    let long = |n: u64| {
        (0..n)
            .map(|i| if i % 100 == 0 { '/' } else { 'a' })
            .collect::<String>()
    };
    let (status, v) = stat(long(longest)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(stat(long(longest + 1)).await.0, StatusCode::BAD_REQUEST);

    let at = query_param(&spec, "/v1/sandbox/sessions/{id}/files/list", "depth");
    let deepest = bound(&spec, &at, "maximum");
    for (depth, want) in [(deepest + 1, 400), (deepest, 200), (0, 400)] {
        let (status, v) = d
            .json(
                Method::GET,
                &format!("{S}/{id}/files/list?path=/tmp&depth={depth}"),
                Value::Null,
            )
            .await;
        assert_eq!(status.as_u16(), want, "depth {depth}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_pool_hands_out_and_refills() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start("[sessions]\nreap_interval = 0.2\npool = { python = 1 }\n").await;
    let ready = "koder_pool_ready{image=\"host\",language=\"python\"} 1";
    for _ in 0..100 {
        if d.metrics().await.contains(ready) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d.metrics().await.contains(ready), "pool never filled");
    let a = d
        .create(json!({"language": "python", "limits": {"memory_mib": 128}}))
        .await;
    // An empty pool still serves creates.
    let b = d.create(json!({"language": "python"})).await;
    let m = d.metrics().await;
    assert!(
        m.contains("koder_sessions_created_total{source=\"pool\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("koder_sessions_created_total{source=\"cold\"} 1"),
        "{m}"
    );
    // The pooled sandbox took the session's limits at hand-out.
    let r = d
        .exec(
            &a,
            json!({"code": "print(open('/proc/self/cgroup').read() != '')"}),
        )
        .await;
    assert_eq!(r["stdout"], "True\n");
    let r = d
        .exec(
            &a,
            json!({"code": "x = bytearray(300 * 1024 * 1024); print('survived')"}),
        )
        .await;
    assert_eq!(
        r["verdict"], "SANDBOX-EXEC-KILLED-OOM",
        "128 MiB limit not applied: {r}"
    );
    assert_eq!(
        d.exec(&b, json!({"code": "print(2)"})).await["stdout"],
        "2\n"
    );
    for _ in 0..100 {
        if d.metrics().await.contains(ready) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pool did not refill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_tenant_key_is_created_and_kept() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start_with(BASE_CONFIG, false).await;
    let key = std::fs::read_to_string(d.data_dir().join("dev-api-key"))
        .unwrap()
        .trim()
        .to_string();
    let (status, s) = d.json_as(&key, Method::POST, S, json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(s["tenant_id"], "dev");
    d.stop();
    d.launch().await;
    let again = std::fs::read_to_string(d.data_dir().join("dev-api-key"))
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(key, again);
    let (status, _) = d.json_as(&key, Method::GET, S, Value::Null).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_the_user_account() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    d.exec(&id, json!({"shell": "nohup sh -c 'while :; do echo x >> /tmp/tick; sleep 0.05; done' >/dev/null 2>&1 &"})).await;
    // The loop runs once it has ticked: a pause before that would test nothing of a resume.
    let started = d
        .exec(&id, json!({"shell": "until [ -s /tmp/tick ]; do sleep 0.01; done; echo started", "timeout_ms": 10000}))
        .await;
    assert_eq!(started["stdout"], "started\n", "{started}");
    let (status, s) = d
        .json(Method::POST, &format!("{S}/{id}/pause"), Value::Null)
        .await;
    assert_eq!(
        (status, s["state"].as_str()),
        (StatusCode::OK, Some("paused")),
        "{s}"
    );
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": "true"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::CONFLICT, "SANDBOX-CONFLICT")
    );
    let (_, listed) = d.json(Method::GET, S, Value::Null).await;
    assert_eq!(listed["sessions"][0]["state"], "paused");
    let (status, s) = d
        .json(Method::POST, &format!("{S}/{id}/resume"), Value::Null)
        .await;
    assert_eq!(
        (status, s["state"].as_str()),
        (StatusCode::OK, Some("running"))
    );
    let r = d.exec(&id, json!({"shell": "a=$(wc -l < /tmp/tick); sleep 0.3; b=$(wc -l < /tmp/tick); [ $b -gt $a ] && echo ticking"})).await;
    assert_eq!(
        r["stdout"], "ticking\n",
        "background loop did not resume: {r}"
    );

    let r = d.exec(&id, json!({"shell": "id -u; echo $HOME; touch ~/mine && stat -c %u ~/mine", "user": "user"})).await;
    assert_eq!(r["stdout"], "1000\n/home/user\n1000\n", "{r}");
    let r = d
        .exec(&id, json!({"shell": "touch /root/x", "user": "user"}))
        .await;
    assert_ne!(r["exit_code"], 0, "user wrote into /root");
    let (status, _) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": "id", "user": "admin"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Any account of the sandbox's /etc/passwd, with its group and home; a number as Docker's.
    let r = d
        .exec(
            &id,
            json!({"shell": "id -un; id -g; echo $HOME $USER", "user": "nobody"}),
        )
        .await;
    assert_eq!(r["stdout"], "nobody\n65534\n/nonexistent nobody\n", "{r}");
    let r = d
        .exec(&id, json!({"shell": "id -u; id -g", "user": "4321"}))
        .await;
    assert_eq!(r["stdout"], "4321\n4321\n", "{r}");
    let long = format!("a{}", "é".repeat(10_000));
    for bad in ["ghost", "70000", "", "a:b", "nobody\n", &long] {
        let (status, e) = d
            .json(
                Method::POST,
                &format!("{S}/{id}/exec"),
                json!({"shell": "id", "user": bad}),
            )
            .await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT"),
            "{bad:?}: {e}"
        );
        assert!(
            e.to_string().len() < 1000,
            "the refusal echoes a bounded name: {e}"
        );
    }

    d.json(Method::POST, &format!("{S}/{id}/pause"), Value::Null)
        .await;
    let (status, _) = d
        .json(Method::DELETE, &format!("{S}/{id}"), Value::Null)
        .await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "a paused session can be deleted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_mid_create_leaves_no_sandbox() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    for _ in 0..5 {
        let r = d
            .req(Method::POST, S, KEY1)
            .json(&json!({"language": "python"}))
            .timeout(Duration::from_millis(3))
            .send()
            .await;
        assert!(r.is_err() || r.unwrap().status() == StatusCode::CREATED);
    }
    let sandboxes = d.data_dir().join("jail/sandboxes");
    let (_, list) = d.json(Method::GET, S, Value::Null).await;
    let recorded = list["sessions"].as_array().unwrap().len();
    for _ in 0..100 {
        if std::fs::read_dir(&sandboxes).unwrap().count() == recorded {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{} sandboxes on disk for {recorded} recorded sessions",
        std::fs::read_dir(&sandboxes).unwrap().count()
    );
}

/// A daemon whose stderr is a file (a service manager's log, journald) writes plain text:
/// colour codes there would reach every log reader as `\x1b[..m` noise; with
/// `KODER_LOG_FORMAT=json` every log line is one JSON object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_on_a_file_are_plain_text_or_json_lines() {
    let Some(()) = root_or_skip() else { return };
    let info = ("RUST_LOG", "info");
    for json in [false, true] {
        let env: &[(&str, &str)] = match json {
            true => &[info, ("KODER_LOG_FORMAT", "json")],
            false => &[info],
        };
        let mut d = Daemon::start_logging(BASE_CONFIG, env).await;
        let id = d.create(json!({})).await;
        d.stop();
        let log = d.log();
        assert!(!log.contains('\u{1b}'), "escape codes in the log: {log}");
        let created = log.lines().find(|l| l.contains("session created"));
        let created = created.unwrap_or_else(|| panic!("no 'session created' line: {log}"));
        assert!(created.contains(&id), "{created}");
        if json {
            for line in log.lines().filter(|l| l.starts_with('{')) {
                serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            }
            let v: Value = serde_json::from_str(created).unwrap();
            assert_eq!(v["fields"]["message"], "session created", "{v}");
        }
    }
}
