//! Live execs over the real daemon: SSE as output is produced, background execs with replay,
//! stdin and signals, bounded memory for slow followers, the error ring.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_output_arrives_as_it_is_produced() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let sent = Instant::now();
    let resp = d
        .req(Method::POST, &format!("{S}/{id}/exec"), KEY1)
        .header("accept", "text/event-stream")
        .json(&json!({"shell": "echo a; sleep 2; echo b; printf '\\377\\376' >&2"}))
        .send()
        .await
        .unwrap();
    let events = read_sse(resp).await;
    assert_eq!(events[0].name, "start");
    assert!(events[0].data["exec_id"].is_string());
    let first = events.iter().find(|e| e.name == "stdout").unwrap();
    let exit = events.last().unwrap();
    assert_eq!(exit.name, "exit");
    assert!(
        first.at.duration_since(sent) < Duration::from_millis(1500),
        "first chunk after {:?}",
        first.at.duration_since(sent)
    );
    assert!(exit.at.duration_since(sent) >= Duration::from_secs(2));
    assert_eq!(stdout_of(&events), "a\nb\n");
    let stderr = events.iter().find(|e| e.name == "stderr").unwrap();
    assert_eq!(
        stderr.data["data_b64"], "//4=",
        "non-UTF-8 output goes as base64"
    );
    assert_eq!(exit.data["exit_code"], 0);
    assert!(
        exit.data.get("stdout").is_none(),
        "exit carries the result minus output"
    );

    // A program that cannot start is a bad request on every path, as for an awaited exec.
    for (accept, body) in [
        ("text/event-stream", json!({"cmd": ["/no/such/program"]})),
        (
            "application/json",
            json!({"cmd": ["/no/such/program"], "background": true}),
        ),
        ("application/json", json!({"cmd": ["/no/such/program"]})),
    ] {
        let resp = d
            .req(Method::POST, &format!("{S}/{id}/exec"), KEY1)
            .header("accept", accept)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
        let e: Value = resp.json().await.unwrap();
        assert_eq!(error_code(&e), "SANDBOX-INVALID-ARGUMENT", "{body}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_execs_replay_follow_stdin_and_signals() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let counter = start_bg(
        &d,
        &id,
        json!({"shell": "for i in 1 2 3 4; do echo $i; sleep 0.4; done", "background": true}),
    )
    .await;
    let cat = start_bg(&d, &id, json!({"cmd": ["cat"], "background": true})).await;
    let sleeper = start_bg(
        &d,
        &id,
        json!({"cmd": ["sleep", "100"], "background": true}),
    )
    .await;

    let (_, status) = d
        .json(
            Method::GET,
            &format!("{S}/{id}/execs/{counter}"),
            Value::Null,
        )
        .await;
    assert_eq!(status["state"], "running");
    assert!(
        status["pid"].is_number(),
        "handed out once it runs: {status}"
    );
    let (_, list) = d
        .json(Method::GET, &format!("{S}/{id}/execs"), Value::Null)
        .await;
    assert_eq!(list["execs"].as_array().unwrap().len(), 3);

    // A late follower gets what was printed before it came, then the rest live.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let resp = d
        .req(
            Method::GET,
            &format!("{S}/{id}/execs/{counter}/stream"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    let events = read_sse(resp).await;
    assert_eq!(stdout_of(&events), "1\n2\n3\n4\n");
    let (_, done) = d
        .json(
            Method::GET,
            &format!("{S}/{id}/execs/{counter}"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (done["state"].as_str(), done["result"]["stdout"].as_str()),
        (Some("exited"), Some("1\n2\n3\n4\n")),
        "{done}"
    );
    // Following a finished exec replays everything and ends.
    let resp = d
        .req(
            Method::GET,
            &format!("{S}/{id}/execs/{counter}/stream"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stdout_of(&read_sse(resp).await), "1\n2\n3\n4\n");

    let stdin = |body: &'static str, close: bool| {
        d.req(Method::POST, &format!("{S}/{id}/execs/{cat}/stdin"), KEY1)
            .query(&[("close", if close { "true" } else { "false" })])
            .body(body)
            .send()
    };
    assert_eq!(
        stdin("hello ", false).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        stdin("world\n", true).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let resp = d
        .req(Method::GET, &format!("{S}/{id}/execs/{cat}/stream"), KEY1)
        .send()
        .await
        .unwrap();
    let events = read_sse(resp).await;
    assert_eq!(stdout_of(&events), "hello world\n");
    assert_eq!(events.last().unwrap().data["exit_code"], 0);
    // Over the per-request bound: a typed 413, on a connection of its own (the server does
    // not read the rest of the body).
    let big = reqwest::Client::new()
        .post(format!("{}{S}/{id}/execs/{cat}/stdin", d.base))
        .bearer_auth(KEY1)
        .body(vec![b'x'; 1024 * 1024 + 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        error_code(&big.json().await.unwrap()),
        "SANDBOX-PAYLOAD-TOO-LARGE"
    );
    let late = stdin("more", false).await.unwrap();
    assert_eq!(late.status(), StatusCode::CONFLICT);

    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/execs/{sleeper}/signal"),
            json!({"signal": "SIGFOO"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT")
    );
    let (status, _) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/execs/{sleeper}/signal"),
            json!({"signal": "SIGTERM"}),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let resp = d
        .req(
            Method::GET,
            &format!("{S}/{id}/execs/{sleeper}/stream"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    let events = read_sse(resp).await;
    assert_eq!(events.last().unwrap().data["signal"], 15);

    // A SIGKILL answers once the process is gone, even one whose exit takes a while (200 MiB
    // to unmap): the exec is over when the answer comes, and its pid names nothing.
    let big = start_bg(
        &d,
        &id,
        json!({"cmd": ["/usr/bin/python3", "-c",
            "import time; b = b'x' * (200 << 20); print('ready', flush=True); time.sleep(100)"],
            "background": true}),
    )
    .await;
    let (_, status) = d
        .json(Method::GET, &format!("{S}/{id}/execs/{big}"), Value::Null)
        .await;
    let pid = status["pid"].as_u64().unwrap();
    let resp = d
        .req(Method::GET, &format!("{S}/{id}/execs/{big}/stream"), KEY1)
        .send()
        .await
        .unwrap();
    let mut ready = resp.bytes_stream();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("ready") {
        seen.extend_from_slice(&ready.next().await.unwrap().unwrap());
    }
    let (status, _) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/execs/{big}/signal"),
            json!({"signal": "KILL"}),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, status) = d
        .json(Method::GET, &format!("{S}/{id}/execs/{big}"), Value::Null)
        .await;
    assert_eq!(status["state"], "exited", "{status}");
    assert_eq!(status["result"]["signal"], 9, "{status}");
    let (_, v) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": format!("kill -0 {pid}")}),
        )
        .await;
    assert_ne!(v["exit_code"], 0, "{v}");

    let (status, e) = d
        .json(Method::GET, &format!("{S}/{id}/execs/nope"), Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );
    let (status, _) = d
        .json_as(
            KEY2,
            Method::GET,
            &format!("{S}/{id}/execs/{counter}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

async fn start_bg(d: &Daemon, id: &str, body: Value) -> String {
    let (status, v) = d.json(Method::POST, &format!("{S}/{id}/exec"), body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    v["exec_id"].as_str().unwrap().to_string()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_follower_does_not_grow_daemon_memory() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let pid = d.child.as_ref().unwrap().id();
    let (_, v) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": "head -c 300000000 /dev/zero", "background": true}),
        )
        .await;
    let exec_id = v["exec_id"].as_str().unwrap().to_string();
    // A follower that connects and then does not read.
    let stalled = d
        .req(
            Method::GET,
            &format!("{S}/{id}/execs/{exec_id}/stream"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    let before = rss_kib(pid);
    let mut status = Value::Null;
    for _ in 0..300 {
        status = d
            .json(
                Method::GET,
                &format!("{S}/{id}/execs/{exec_id}"),
                Value::Null,
            )
            .await
            .1;
        if status["state"] == "exited" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status["state"], "exited",
        "300 MB of output did not drain: {status}"
    );
    let grown = rss_kib(pid).saturating_sub(before);
    assert!(
        grown < 64 * 1024,
        "daemon grew {grown} KiB while 300 MB passed a stalled follower"
    );
    assert_eq!(
        status["result"]["stdout_truncated"], true,
        "dropped output must be flagged"
    );
    // The stalled follower, when it reads, learns it missed output.
    let events = read_sse(stalled).await;
    assert!(
        events.iter().any(|e| e.name == "truncated"),
        "no truncated event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_sse_stream_kills_its_exec() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let resp = d
        .req(Method::POST, &format!("{S}/{id}/exec"), KEY1)
        .header("accept", "text/event-stream")
        .json(&json!({"shell": "exec -a koder-orphan sleep 60"}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let start = body.next().await.unwrap().unwrap(); // the start event
    let start = String::from_utf8_lossy(&start);
    let exec_id = start
        .split("\"exec_id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no exec id in {start}"))
        .to_string();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = d
        .exec(
            &id,
            json!({"shell": "cat /proc/*/cmdline | tr '\\0' '\\n' | grep -c '^koder-orpha[n]'"}),
        )
        .await;
    assert_eq!(seen["stdout"], "1\n");
    drop(body);
    let mut left = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = d.exec(&id, json!({"shell": "cat /proc/*/cmdline | tr '\\0' '\\n' | grep -c '^koder-orpha[n]'"})).await["stdout"].as_str().unwrap().to_string();
        if left == "0\n" {
            // Its record says it was killed, not that it exited by a signal of its own.
            let path = format!("{S}/{id}/execs/{exec_id}");
            let mut status = Value::Null;
            for _ in 0..50 {
                status = d.json(Method::GET, &path, Value::Null).await.1;
                if status["state"] == "exited" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(
                status["result"]["verdict"], "SANDBOX-EXEC-KILLED",
                "{status}"
            );
            return;
        }
    }
    panic!("exec survived its SSE client: {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_ring_keeps_the_last_fifty() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let p = format!("{S}/{id}/errors");
    for i in 0..55 {
        let (status, e) = d
            .json(
                Method::POST,
                &p,
                json!({"source": "browser", "message": format!("boom {i}"), "stack": "at x"}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{e}");
    }
    let (_, list) = d.json(Method::GET, &p, Value::Null).await;
    let errors = list["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 50);
    assert_eq!(errors[0]["message"], "boom 5");
    assert_eq!(errors[49]["message"], "boom 54");
    let (status, _) = d
        .json(Method::POST, &p, json!({"source": "x", "message": ""}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = d
        .json(
            Method::POST,
            &p,
            json!({"source": "x", "message": "m", "extra": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = d.json_as(KEY2, Method::GET, &p, Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Every accepted connection has TCP_NODELAY: without it each small write of a streamed answer
/// after the first waits for the client's delayed ACK (~40 ms on Linux). Streamed and JSON execs
/// of `/bin/true` alternate on one keep-alive connection each, so machine load slows both alike;
/// only a stall of tens of milliseconds per streamed answer can open the gap asserted here.
#[tokio::test]
async fn a_streamed_exec_is_not_delayed_by_nagle() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let body = json!({"cmd": ["/bin/true"]});
    let (mut streamed, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let began = Instant::now();
        let resp = d
            .req(Method::POST, &format!("{S}/{id}/exec"), KEY1)
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
            .await
            .unwrap();
        let events = read_sse(resp).await;
        assert_eq!(events.last().map(|e| e.name.as_str()), Some("exit"));
        streamed.push(began.elapsed());
        let began = Instant::now();
        let out = d.exec(&id, body.clone()).await;
        assert_eq!(out["exit_code"], 0, "{out}");
        plain.push(began.elapsed());
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (s, p) = (median(&mut streamed), median(&mut plain));
    assert!(
        s < p + Duration::from_millis(25),
        "streamed exec median {s:?} vs JSON {p:?}: small writes wait for ACKs"
    );
}
