//! The WebSocket terminal: a real PTY in the sandbox, resize, argv override, exit status.

mod common;

use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_sees_resizes_and_reports_its_exit() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let mut ws = connect(&d, &id, "").await;
    ws.send(Message::Text(
        json!({"type": "resize", "cols": 123, "rows": 41})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    ws.send(Message::Binary(b"stty size; tty\n".to_vec().into()))
        .await
        .unwrap();
    // `tty` answers after `stty`: one read up to its answer holds both (they may come in one
    // message, so waiting for each in turn could wait for output already read).
    let out = read_until(&mut ws, "/dev/pts/").await;
    assert!(out.contains("41 123"), "{out}");
    ws.send(Message::Text("{\"type\": \"bogus\"}".into()))
        .await
        .unwrap();
    read_until(&mut ws, "bad control message").await;
    ws.send(Message::Binary(b"exit 3\n".to_vec().into()))
        .await
        .unwrap();
    let exit = exit_message(&mut ws).await;
    assert_eq!(exit["exit_code"], 3, "{exit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argv_override_runs_without_a_shell() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let mut ws = connect(&d, &id, "?cmd=/bin/echo&arg=hello%20world&arg=%24HOME%3Bid").await;
    let out = read_until(&mut ws, "hello world $HOME;id").await;
    assert!(
        !out.contains("uid="),
        "the argument went through a shell: {out}"
    );
    assert_eq!(exit_message(&mut ws).await["exit_code"], 0);

    // A program that cannot start is an HTTP error before any upgrade.
    let resp = d
        .req(
            reqwest::Method::GET,
            &format!("/v1/sandbox/sessions/{id}/terminal?cmd=/no/such"),
            KEY1,
        )
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = d
        .req(
            reqwest::Method::GET,
            &format!("/v1/sandbox/sessions/{id}/terminal?bogus=1"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_socket_ends_the_terminal_process() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let mut ws = connect(
        &d,
        &id,
        "?cmd=/bin/bash&arg=-c&arg=exec%20-a%20koder-tty%20sleep%2060",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let count = "cat /proc/*/cmdline | tr '\\0' '\\n' | grep -c '^koder-tt[y]'";
    assert_eq!(d.exec(&id, json!({"shell": count})).await["stdout"], "1\n");
    ws.close(None).await.unwrap();
    drop(ws);
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if d.exec(&id, json!({"shell": count})).await["stdout"] == "0\n" {
            return;
        }
    }
    panic!("terminal process outlived its socket");
}

async fn next_event(ws: &mut Socket) -> Value {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("a file event")
        {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(&t).unwrap(),
            Some(Ok(_)) => {}
            other => panic!("watch closed: {other:?}"),
        }
    }
}

/// Opens the session's file watch on `path` (recursive).
async fn watch(d: &Daemon, id: &str, path: &str) -> Socket {
    let url = format!(
        "{}/v1/sandbox/sessions/{id}/fs/watch?path={path}&recursive=true",
        d.base.replace("http://", "ws://")
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY1}").parse().unwrap());
    tokio_tungstenite::connect_async(req)
        .await
        .expect("websocket")
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reports_a_burst_of_one_command_in_order() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    d.exec(&id, json!({"shell": "mkdir /workspace/b"})).await;
    let mut ws = watch(&d, &id, "/workspace/b").await;

    // Four changes within microseconds: none is lost or merged into another, in their order,
    // the rename as one event naming both sides.
    d.exec(
        &id,
        json!({"shell": "cd /workspace/b && echo x > w; mkdir d; mv w w2; rm w2"}),
    )
    .await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let ev = next_event(&mut ws).await;
        seen.push((
            ev["type"].as_str().unwrap().to_string(),
            ev["path"].as_str().unwrap().to_string(),
            ev["from"].as_str().map(str::to_string),
        ));
    }
    let b = |p: &str| format!("/workspace/b/{p}");
    assert_eq!(
        seen,
        [
            ("created".into(), b("w"), None),
            ("created".into(), b("d"), None),
            ("renamed".into(), b("w2"), Some(b("w"))),
            ("deleted".into(), b("w2"), None),
        ]
    );
    let extra = tokio::time::timeout(Duration::from_millis(300), ws.next()).await;
    assert!(extra.is_err(), "unexpected extra event: {extra:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_what_execs_do_to_files() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let mut ws = watch(&d, &id, "/workspace").await;

    let steps: [(&str, &[(&str, &str)]); 4] = [
        (
            "mkdir /workspace/d && echo a > /workspace/d/f",
            &[("created", "/workspace/d"), ("created", "/workspace/d/f")],
        ),
        (
            "for i in 1 2 3 4 5; do echo $i >> /workspace/d/f; done",
            &[("modified", "/workspace/d/f")],
        ),
        (
            "mv /workspace/d/f /workspace/d/g",
            &[("renamed", "/workspace/d/g")],
        ),
        ("rm /workspace/d/g", &[("deleted", "/workspace/d/g")]),
    ];
    for (cmd, expected) in steps {
        d.exec(&id, json!({"shell": cmd})).await;
        for (kind, path) in expected {
            let ev = next_event(&mut ws).await;
            assert_eq!(
                (ev["type"].as_str(), ev["path"].as_str()),
                (Some(*kind), Some(*path)),
                "after {cmd:?}: {ev}"
            );
            assert!(ev["at"].is_string());
            if *kind == "renamed" {
                assert_eq!(ev["from"], "/workspace/d/f");
            }
        }
    }
    // Five appends were debounced into the one modified event above: nothing else is queued.
    let extra = tokio::time::timeout(Duration::from_millis(300), ws.next()).await;
    assert!(extra.is_err(), "unexpected extra event: {extra:?}");

    let url = format!(
        "{}/v1/sandbox/sessions/{id}/fs/watch?path=/workspace/none",
        d.base.replace("http://", "ws://")
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY1}").parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 404)
        }
        other => panic!("watching a missing directory: {other:?}"),
    }
    // A plain request to a WebSocket endpoint is a typed 400.
    let resp = d
        .req(
            reqwest::Method::GET,
            &format!("/v1/sandbox/sessions/{id}/fs/watch?path=/workspace"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        error_code(&resp.json().await.unwrap()),
        "SANDBOX-INVALID-ARGUMENT"
    );
}
