//! State that lasts on microVMs, through the real daemon and real guests (QEMU `microvm`; TCG
//! on hosts without usable hardware KVM), booted from the image `ksandbox image build` made
//! (`KODER_MICROVM_IMAGES`, default `target/microvm-images`): a snapshot of a microVM session,
//! a new microVM session from it, a fork, a pause to disk across a daemon restart, a layer that
//! fails to apply. Five boots in all (the last one fails): guests are slow under TCG. The
//! durations go to stderr (BENCHMARKS.md), unchecked.

mod common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";
const POST: Method = Method::POST;

/// What the first guest writes: owners, modes, a symlink, a hard link, a fifo, 2 MiB of noise
/// and the deletion of an image file (a whiteout in the layer).
const WRITE: &str = "set -e; rmdir /home/user; \
     mkdir -p /workspace/proj/sub; echo data > /workspace/proj/a.txt; \
     chown 1000:1000 /workspace/proj/a.txt; chmod 640 /workspace/proj/a.txt; \
     ln -s a.txt /workspace/proj/link; ln /workspace/proj/a.txt /workspace/proj/hard; \
     head -c 2097152 /dev/urandom > /workspace/proj/sub/blob; mkfifo /workspace/proj/fifo";
const DIGEST: &str = "cd /workspace/proj && sha256sum a.txt sub/blob && \
     stat -c '%n %s %u %g %a %h %F' a.txt hard link fifo sub/blob && readlink link && ls -A && \
     if test -e /home/user; then echo home back; else echo home gone; fi";

fn config() -> String {
    format!("{BASE_CONFIG}\n{}", microvm_section())
}

async fn sh(d: &Daemon, id: &str, script: &str) -> String {
    let v = d.exec(id, json!({ "shell": script })).await;
    assert_eq!(v["exit_code"], 0, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

/// `POST path body`, expecting `want`; the answer and how long it took.
async fn timed(d: &Daemon, path: &str, body: Value, want: StatusCode) -> (Value, Duration) {
    let start = Instant::now();
    let (status, v) = d.json(POST, path, body).await;
    let took = start.elapsed();
    assert_eq!(status, want, "{path}: {v}");
    (v, took)
}

/// The daemon's local copies of every layer.
fn cached_layers(d: &Daemon) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(d.data_dir().join("layers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

fn contains(file: &std::path::Path, needle: &[u8]) -> bool {
    std::fs::read(file)
        .unwrap()
        .windows(needle.len())
        .any(|w| w == needle)
}

async fn runtime_of(d: &Daemon, id: &str) -> Value {
    let (status, v) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["runtime"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_sessions_snapshot_restore_fork_and_pause_to_disk() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start(&config()).await;
    let limits = json!({"memory_mib": 128, "disk_mib": 128});
    let (a, create_took) = timed(
        &d,
        S,
        json!({"runtime": "microvm", "limits": limits}),
        StatusCode::CREATED,
    )
    .await;
    let a = a["id"].as_str().unwrap().to_string();
    sh(&d, &a, WRITE).await;
    let want = sh(&d, &a, DIGEST).await;
    assert!(
        want.contains("a.txt 5 1000 1000 640 2 regular file")
            && want.contains("sub/blob 2097152 0 0")
            && want.contains("fifo")
            && want.ends_with("home gone\n"),
        "{want}"
    );

    let (snap, snapshot_took) = timed(
        &d,
        &format!("{S}/{a}/snapshot"),
        Value::Null,
        StatusCode::CREATED,
    )
    .await;
    let sid = snap["snapshot_id"].as_str().unwrap().to_string();
    assert!(snap["size_bytes"].as_u64().unwrap() > 2_097_152, "{snap}");

    // A new microVM from the snapshot starts with every file, owner, link and whiteout.
    let (b, restore_took) = timed(
        &d,
        S,
        json!({"runtime": "microvm", "from_snapshot": sid, "limits": limits}),
        StatusCode::CREATED,
    )
    .await;
    let b = b["id"].as_str().unwrap().to_string();
    assert_eq!(runtime_of(&d, &b).await, "microvm");
    assert_eq!(sh(&d, &b, DIGEST).await, want);

    // A fork copies b as it is now and goes its own way.
    // The directory made over the whiteout is opaque, in the xattr the layer format carries.
    sh(&d, &b, "echo forked > /workspace/b.txt; mkdir /home/user").await;
    let (forks, fork_took) = timed(
        &d,
        &format!("{S}/{b}/fork"),
        json!({"count": 1}),
        StatusCode::CREATED,
    )
    .await;
    let f = forks["sessions"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(runtime_of(&d, &f).await, "microvm");
    assert_eq!(sh(&d, &f, "cat /workspace/b.txt").await, "forked\n");
    let want = want.replace("home gone", "home back");
    assert_eq!(sh(&d, &f, DIGEST).await, want);
    assert!(
        cached_layers(&d)
            .iter()
            .any(|l| contains(l, b"SCHILY.xattr.user.overlay.opaque")),
        "no layer has an opaque directory"
    );
    sh(&d, &f, "echo mine > /workspace/b.txt").await;
    assert_eq!(sh(&d, &b, "cat /workspace/b.txt").await, "forked\n");

    // Paused to disk, the fork's VM goes; after a daemon restart it boots again on its layers.
    let (v, pause_took) = timed(
        &d,
        &format!("{S}/{f}/pause"),
        json!({"memory": false}),
        StatusCode::OK,
    )
    .await;
    assert_eq!(v["state"], "paused", "{v}");
    d.stop();
    d.launch().await;
    let (v, resume_took) = timed(&d, &format!("{S}/{f}/resume"), Value::Null, StatusCode::OK).await;
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(sh(&d, &f, "cat /workspace/b.txt").await, "mine\n");
    assert_eq!(sh(&d, &f, DIGEST).await, want);

    // A layer that does not apply fails the boot, and the create says why.
    for path in cached_layers(&d) {
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..512].fill(0xff);
        std::fs::write(&path, bytes).unwrap();
    }
    let (status, v) = d
        .json(
            POST,
            S,
            json!({"runtime": "microvm", "from_snapshot": sid, "limits": limits}),
        )
        .await;
    assert!(status.is_server_error(), "{status} {v}");
    assert!(v.to_string().contains("restore layer 1 of 1"), "{v}");

    eprintln!(
        "microvm state (2 MiB workspace): create empty {create_took:?}, snapshot {snapshot_took:?}, create from snapshot \
         {restore_took:?}, fork x1 {fork_took:?}, pause to disk {pause_took:?}, resume after \
         restart {resume_took:?}"
    );
}
