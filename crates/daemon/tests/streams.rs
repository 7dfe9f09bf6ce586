//! One slow consumer on a session's agent connection stalls only its own stream: a download
//! whose HTTP body nobody reads leaves the session's execs and file operations answering, and
//! still arrives whole once it is read.

mod common;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;

const S: &str = "/v1/sandbox/sessions";

/// Lines of `seq 1 LINES`: about 63 MB, far more than any socket buffer and stream window.
const LINES: u32 = 8_000_000;

/// Generous: this is about answering at all, not about speed.
const PROMPTLY: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_download_leaves_the_session_answering_and_completes_when_read() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let made = d
        .exec(
            &id,
            json!({"shell": format!("seq 1 {LINES} > /workspace/big && wc -c < /workspace/big")}),
        )
        .await;
    assert_eq!(made["exit_code"], 0, "{made}");
    let expected: Vec<u8> = (1..=LINES)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    assert_eq!(
        made["stdout"].as_str().map(str::trim),
        Some(expected.len().to_string().as_str())
    );

    let download = d
        .req(Method::GET, &format!("{S}/{id}/files"), KEY1)
        .query(&[("path", "/workspace/big")])
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), StatusCode::OK);
    // The body is not read: the socket, the daemon's stream window and the agent's reader fill
    // and stop.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let exec = tokio::time::timeout(PROMPTLY, d.exec(&id, json!({"shell": "echo still here"})))
        .await
        .expect("an exec stalled behind an unread download");
    assert_eq!(exec["stdout"], "still here\n", "{exec}");
    let listed = tokio::time::timeout(
        PROMPTLY,
        d.json(
            Method::GET,
            &format!("{S}/{id}/files/list?path=/workspace"),
            serde_json::Value::Null,
        ),
    )
    .await
    .expect("a listing stalled behind an unread download");
    assert_eq!(listed.0, StatusCode::OK, "{}", listed.1);

    let body = tokio::time::timeout(Duration::from_secs(60), download.bytes())
        .await
        .expect("the stalled download never finished")
        .unwrap();
    assert_eq!(body.len(), expected.len());
    assert!(body == expected, "the download was corrupted");
}
