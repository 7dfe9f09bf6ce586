//! State that lasts, through the real daemon and real jails: snapshots (take, list, create
//! from, restore, delete), durable pause across a daemon restart, auto-resume, fork, the
//! snapshot-storage quota, hostile contents, and crashes in the middle of a capture or restore.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const POST: Method = Method::POST;
const GET: Method = Method::GET;

async fn sh(d: &Daemon, id: &str, script: &str) -> String {
    let v = d.exec(id, json!({ "shell": script })).await;
    assert_eq!(v["exit_code"], 0, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

/// POST to a session's sub-resource (`"{id}/pause"`...), expecting 200.
async fn post_ok(d: &Daemon, path: &str, body: Value) -> Value {
    let (status, v) = d
        .json(POST, &format!("/v1/sandbox/sessions/{path}"), body)
        .await;
    assert_eq!(status, StatusCode::OK, "{path}: {v}");
    v
}

async fn snapshot(d: &Daemon, id: &str, body: Value) -> Value {
    let (status, v) = d
        .json(POST, &format!("/v1/sandbox/sessions/{id}/snapshot"), body)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v
}

/// What the test sandboxes write, and a digest of it to compare copies with.
const WRITE: &str = "set -e; mkdir -p /home/user/proj/sub; echo data > /home/user/proj/a.txt; \
     chown 1000:1000 /home/user/proj/a.txt; chmod 640 /home/user/proj/a.txt; \
     ln -s a.txt /home/user/proj/link; ln /home/user/proj/a.txt /home/user/proj/hard; \
     head -c 3000000 /dev/urandom > /home/user/proj/sub/blob; mkfifo /home/user/proj/fifo; \
     printf x > '/home/user/proj/na me\u{e4}'";
const DIGEST: &str = "cd /home/user/proj && sha256sum a.txt sub/blob && stat -c '%n %u %g %a %h %F' a.txt hard fifo && \
     readlink link && ls";

fn layer_files(d: &Daemon) -> Vec<String> {
    let mut found = Vec::new();
    for dir in ["blobs", "layers"] {
        let walk = walk(&d.data_dir().join(dir));
        found.extend(walk.into_iter().filter(|p| p.contains("lyr-")));
    }
    found
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_capture_restore_and_stay_with_their_tenant() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let a = d.create(json!({})).await;
    sh(&d, &a, WRITE).await;
    let want = sh(&d, &a, DIGEST).await;
    assert!(want.contains("na me\u{e4}"), "{want}");

    let snap = snapshot(&d, &a, json!({"name": "first"})).await;
    let sid = snap["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(snap["name"], "first");
    assert_eq!(snap["image"], "host");
    assert_eq!(snap["session_id"], a.as_str());
    assert!(snap["size_bytes"].as_u64().unwrap() > 3_000_000, "{snap}");
    assert!(snap["expires_at"].as_str().unwrap() > snap["created_at"].as_str().unwrap());
    // The source keeps running after the capture.
    assert_eq!(sh(&d, &a, "echo alive").await, "alive\n");

    let (status, list) = d.json(GET, "/v1/sandbox/snapshots", Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["snapshots"][0]["snapshot_id"], sid.as_str());
    let (status, one) = d
        .json(GET, &format!("/v1/sandbox/snapshots/{sid}"), Value::Null)
        .await;
    assert_eq!(
        (status, one["snapshot_id"].clone()),
        (StatusCode::OK, json!(sid))
    );

    // Another tenant sees nothing and cannot build on it.
    let (status, v) = d
        .json_as(
            KEY2,
            GET,
            &format!("/v1/sandbox/snapshots/{sid}"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );
    let (status, v) = d
        .json_as(
            KEY2,
            POST,
            "/v1/sandbox/sessions",
            json!({"from_snapshot": sid}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (_, v) = d
        .json_as(KEY2, GET, "/v1/sandbox/snapshots", Value::Null)
        .await;
    assert_eq!(v["snapshots"], json!([]));

    // A new session from the snapshot has every file, owner, link and whiteout.
    let b = d.create(json!({"from_snapshot": sid})).await;
    assert_eq!(sh(&d, &b, DIGEST).await, want);
    // Asking for another image than the snapshot's is refused.
    let (status, v) = d
        .json(
            POST,
            "/v1/sandbox/sessions",
            json!({"from_snapshot": sid, "language": "node"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT"),
        "{v}"
    );

    // Restore puts b back as it was, whatever it did since.
    sh(
        &d,
        &b,
        "echo changed > /home/user/proj/a.txt; touch /home/user/new; rm -r /home/user/proj/sub",
    )
    .await;
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{b}/restore"),
            json!({"snapshot_id": sid}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "running");
    assert_eq!(sh(&d, &b, DIGEST).await, want);
    assert_eq!(
        sh(&d, &b, "test ! -e /home/user/new && echo gone").await,
        "gone\n"
    );

    // Deleting the snapshot leaves the sessions built on it working.
    let resp = d
        .req(
            Method::DELETE,
            &format!("/v1/sandbox/snapshots/{sid}"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let (status, _) = d
        .json(GET, &format!("/v1/sandbox/snapshots/{sid}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(sh(&d, &b, DIGEST).await, want);

    // Bad input is typed.
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/snapshot"),
            json!({"name": "../x"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT")
    );
    let (status, _) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/restore"),
            json!({"snapshot_id": "snap-nope"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = d
        .json_as(
            KEY2,
            POST,
            &format!("/v1/sandbox/sessions/{a}/snapshot"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_pause_survives_a_restart_and_resumes_on_request() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start(BASE_CONFIG).await;
    let a = d.create(json!({})).await;
    let b = d.create(json!({"lifecycle": {"auto_resume": true}})).await;
    for id in [&a, &b] {
        sh(&d, id, "echo kept > /home/user/kept; (sleep 1000 &) ; true").await;
        d.pause_to_disk(id).await;
    }
    // Nothing of them runs any more.
    let sandboxes = d.data_dir().join("jail/sandboxes");
    assert_eq!(
        std::fs::read_dir(&sandboxes)
            .map(|r| r.count())
            .unwrap_or(0),
        0
    );

    d.stop();
    d.launch().await;
    let (_, list) = d.json(GET, "/v1/sandbox/sessions", Value::Null).await;
    let states: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["paused", "paused"], "{list}");

    // Without auto-resume a request is a conflict until resumed.
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/exec"),
            json!({"cmd": ["true"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/resume"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, v["state"].clone()),
        (StatusCode::OK, json!("running")),
        "{v}"
    );
    assert_eq!(sh(&d, &a, "cat /home/user/kept").await, "kept\n");
    // A fresh boot: the background process of before is gone.
    assert_eq!(sh(&d, &a, "pgrep -c sleep || true").await.trim(), "0");

    // With auto-resume the exec itself wakes it.
    assert_eq!(sh(&d, &b, "cat /home/user/kept").await, "kept\n");
    let (_, v) = d
        .json(GET, &format!("/v1/sandbox/sessions/{b}"), Value::Null)
        .await;
    assert_eq!(v["state"], "running");

    // A memory pause becomes a disk pause at a clean shutdown: the files outlive the daemon.
    sh(&d, &a, "echo more > /home/user/more").await;
    post_ok(&d, &format!("{a}/pause"), Value::Null).await;
    d.stop();
    d.launch().await;
    let (_, v) = d
        .json(GET, &format!("/v1/sandbox/sessions/{a}"), Value::Null)
        .await;
    assert_eq!(v["state"], "paused", "{v}");
    post_ok(&d, &format!("{a}/resume"), Value::Null).await;
    assert_eq!(sh(&d, &a, "cat /home/user/more").await, "more\n");

    // A memory pause does not survive a crash, and says why.
    post_ok(&d, &format!("{a}/pause"), Value::Null).await;
    d.crash();
    d.launch().await;
    let (_, v) = d
        .json(GET, &format!("/v1/sandbox/sessions/{a}"), Value::Null)
        .await;
    assert_eq!(v["state"], "stopped");
    assert!(
        v["end_reason"].as_str().unwrap().contains("memory pause"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_makes_independent_copies() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let a = d
        .create(json!({"limits": {"memory_mib": 256}, "metadata": {"k": "v"}}))
        .await;
    sh(&d, &a, "echo base > /home/user/f").await;
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/fork"),
            json!({"count": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let forks: Vec<String> = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(forks.len(), 3);
    assert_eq!(v["sessions"][0]["limits"]["memory_mib"], 256);
    assert_eq!(v["sessions"][0]["metadata"]["k"], "v");
    for f in &forks {
        assert_ne!(f, &a);
        assert_eq!(sh(&d, f, "cat /home/user/f").await, "base\n");
    }
    sh(&d, &forks[0], "echo mine > /home/user/f").await;
    assert_eq!(sh(&d, &forks[1], "cat /home/user/f").await, "base\n");
    assert_eq!(sh(&d, &a, "cat /home/user/f").await, "base\n");
    // An optional body may also be a JSON null: one default copy.
    let resp = d
        .req(POST, &format!("/v1/sandbox/sessions/{a}/fork"), KEY1)
        .header("content-type", "application/json")
        .body("null")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(1));
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/fork"),
            json!({"cuont": 2}),
        )
        .await;
    assert_eq!(
        (status, error_code(&v)),
        (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT")
    );
    for bad in [0, 101] {
        let (status, v) = d
            .json(
                POST,
                &format!("/v1/sandbox/sessions/{a}/fork"),
                json!({"count": bad}),
            )
            .await;
        assert_eq!(
            (status, error_code(&v)),
            (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_storage_quota_is_a_typed_507_and_leaves_nothing() {
    let Some(()) = root_or_skip() else { return };
    let config = format!("{BASE_CONFIG}[tenants.t1]\nsnapshot_storage_mib = 2\n");
    let d = Daemon::start(&config).await;
    let a = d.create(json!({})).await;
    sh(&d, &a, "head -c 3000000 /dev/urandom > /home/user/big").await;
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/snapshot"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    assert_eq!(error_code(&v), "SANDBOX-QUOTA-SNAPSHOT-STORAGE");
    // A fork stores nothing at first, but its layer is bounded by the same room (a copy may
    // have to store it later).
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/fork"),
            json!({"count": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    assert_eq!(error_code(&v), "SANDBOX-QUOTA-SNAPSHOT-STORAGE");
    assert!(fork_trees(&d).is_empty(), "{:?}", fork_trees(&d));
    // A sparse 10 GB file is refused from its size at once, not read.
    sh(
        &d,
        &a,
        "rm /home/user/big; truncate -s 10G /home/user/sparse",
    )
    .await;
    let started = std::time::Instant::now();
    let (status, _) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{a}/snapshot"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(layer_files(&d).is_empty(), "{:?}", layer_files(&d));
    let (_, v) = d.json(GET, "/v1/sandbox/snapshots", Value::Null).await;
    assert_eq!(v["snapshots"], json!([]));
    // The session was thawed and works.
    assert_eq!(sh(&d, &a, "echo ok").await, "ok\n");
    // Small enough fits.
    sh(&d, &a, "rm /home/user/sparse; echo small > /home/user/s").await;
    let snap = snapshot(&d, &a, Value::Null).await;
    let files = layer_files(&d);
    assert_eq!(files.len(), 2, "{files:?}");
    // The local blob and the host's layer cache are one file (a hard link), not two copies.
    use std::os::unix::fs::MetadataExt;
    let inode = |p: &String| std::fs::metadata(p).unwrap().ino();
    assert_eq!(inode(&files[0]), inode(&files[1]), "{files:?}");
    // Deleting the snapshot frees its storage at once: its layer was used by nothing else.
    let resp = d
        .req(
            Method::DELETE,
            &format!(
                "/v1/sandbox/snapshots/{}",
                snap["snapshot_id"].as_str().unwrap()
            ),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert!(layer_files(&d).is_empty(), "{:?}", layer_files(&d));

    // A fork's tree is stored when a copy's snapshot needs it, within the room left then:
    // here the source's own snapshot took most of it first.
    sh(&d, &a, "head -c 1500000 /dev/urandom > /home/user/mid").await;
    let copy = fork(&d, &a, 1).await.remove(0);
    snapshot(&d, &a, Value::Null).await;
    let stored = stored_layers(&d);
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{copy}/snapshot"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    assert_eq!(error_code(&v), "SANDBOX-QUOTA-SNAPSHOT-STORAGE");
    assert_eq!(stored_layers(&d), stored, "a half-stored layer was left");
    assert_eq!(sh(&d, &copy, "wc -c < /home/user/mid").await, "1500000\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_contents_restore_inside_the_session_only() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let a = d.create(json!({})).await;
    let canary = d.dir.path().join("canary");
    std::fs::write(&canary, "host").unwrap();
    let canary_s = canary.display().to_string();
    sh(
        &d,
        &a,
        &format!(
            "set -e; cd /home/user; ln -s /etc etc-link; ln -s {canary_s} canary; \
             ln -s ../../../../../../ up; printf 'line\\nbreak' > \"$(printf 'new\\nline')\"; \
             mkdir -p deep; for i in $(seq 1 2000); do : > deep/f$i; done"
        ),
    )
    .await;
    let snap = snapshot(&d, &a, Value::Null).await;
    let b = d
        .create(json!({"from_snapshot": snap["snapshot_id"]}))
        .await;
    const LIST: &str = "cd /home/user; readlink etc-link canary up; ls deep | wc -l; \
         cat \"$(printf 'new\\nline')\"";
    let want = format!("/etc\n{canary_s}\n../../../../../../\n2000\nline\nbreak");
    assert_eq!(sh(&d, &b, LIST).await, want);
    // Writing through the restored links changes the sandbox's files, never the host's.
    let v = d
        .exec(&b, json!({"shell": "echo pwned > /home/user/canary"}))
        .await;
    assert_ne!(v["exit_code"], 0, "{v}");
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "host");
    // A fork copies the same hostile tree on the host, and so does storing that copy.
    let copy = fork(&d, &a, 1).await.remove(0);
    assert_eq!(sh(&d, &copy, LIST).await, want);
    let stored = snapshot(&d, &copy, Value::Null).await;
    let c = d
        .create(json!({"from_snapshot": stored["snapshot_id"]}))
        .await;
    assert_eq!(sh(&d, &c, LIST).await, want);
    for s in [&copy, &c] {
        let v = d
            .exec(s, json!({"shell": "echo pwned > /home/user/canary"}))
            .await;
        assert_ne!(v["exit_code"], 0, "{v}");
    }
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_snapshot_or_mid_restore_leaves_no_half_state() {
    let Some(()) = root_or_skip() else { return };
    for point in ["layer-before-commit", "restore-before-install"] {
        let mut d = Daemon::start(BASE_CONFIG).await;
        let a = d.create(json!({})).await;
        sh(&d, &a, "echo x > /home/user/x").await;
        // A fork's tree does not outlive the daemon either.
        fork(&d, &a, 1).await;
        assert_eq!(fork_trees(&d).len(), 1);
        let sid = if point == "restore-before-install" {
            Some(snapshot(&d, &a, Value::Null).await["snapshot_id"].clone())
        } else {
            None
        };
        d.stop();
        d.launch_at("127.0.0.1:0", &[("KODER_TEST_CRASH_AT", point)])
            .await;
        let a = d.create(json!({})).await;
        sh(&d, &a, "echo y > /home/user/y").await;
        let req = match &sid {
            None => d
                .req(POST, &format!("/v1/sandbox/sessions/{a}/snapshot"), KEY1)
                .send(),
            Some(sid) => d
                .req(POST, &format!("/v1/sandbox/sessions/{a}/restore"), KEY1)
                .json(&json!({ "snapshot_id": sid }))
                .send(),
        };
        assert!(
            req.await.is_err(),
            "{point}: the daemon answered instead of crashing"
        );
        assert!(
            d.wait_exit(std::time::Duration::from_secs(10)).is_some(),
            "{point}"
        );
        d.launch().await;
        let (_, v) = d.json(GET, "/v1/sandbox/snapshots", Value::Null).await;
        let listed = v["snapshots"].as_array().unwrap().len();
        assert_eq!(listed, usize::from(sid.is_some()), "{point}: {v}");
        let (_, v) = d
            .json(GET, &format!("/v1/sandbox/sessions/{a}"), Value::Null)
            .await;
        assert_eq!(v["state"], "stopped", "{point}: {v}");
        if sid.is_none() {
            assert!(layer_files(&d).is_empty(), "{point}: {:?}", layer_files(&d));
        }
        assert!(fork_trees(&d).is_empty(), "{point}: {:?}", fork_trees(&d));
        let sandboxes = d.data_dir().join("jail/sandboxes");
        assert_eq!(
            std::fs::read_dir(&sandboxes)
                .map(|r| r.count())
                .unwrap_or(0),
            0,
            "{point}"
        );
    }
}

/// A file a session got from its snapshot and then deleted stays deleted in everything made
/// from the session afterwards: a fork, a snapshot, a pause to disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_restored_file_stays_deleted() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let a = d.create(json!({})).await;
    sh(
        &d,
        &a,
        "echo x > /home/user/gone.txt; echo y > /home/user/kept.txt",
    )
    .await;
    let snap = snapshot(&d, &a, Value::Null).await;
    let b = d
        .create(json!({"from_snapshot": snap["snapshot_id"]}))
        .await;
    sh(&d, &b, "rm /home/user/gone.txt").await;
    const CHECK: &str =
        "cat /home/user/kept.txt; test -e /home/user/gone.txt && echo back || echo gone";
    let (status, forks) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{b}/fork"),
            json!({"count": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{forks}");
    let f = forks["sessions"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(sh(&d, &f, CHECK).await, "y\ngone\n");
    let again = snapshot(&d, &b, Value::Null).await;
    let c = d
        .create(json!({"from_snapshot": again["snapshot_id"]}))
        .await;
    assert_eq!(sh(&d, &c, CHECK).await, "y\ngone\n");
    post_ok(&d, &format!("{b}/pause"), json!({"memory": false})).await;
    post_ok(&d, &format!("{b}/resume"), Value::Null).await;
    assert_eq!(sh(&d, &b, CHECK).await, "y\ngone\n");
}

/// Unpacked layers the jail runtime holds (one per layer it stacks below sandboxes).
/// The daemon's stored layers (cache files beside the blobs).
fn stored_layers(d: &Daemon) -> Vec<String> {
    layer_cache(d, |e| !e.path().is_dir())
}

/// Fork layers kept as trees only.
fn fork_trees(d: &Daemon) -> Vec<String> {
    layer_cache(d, |e| e.path().is_dir())
}

fn layer_cache(d: &Daemon, keep: impl Fn(&std::fs::DirEntry) -> bool) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d.data_dir().join("layers"))
        .map(|r| {
            r.flatten()
                .filter(|e| keep(e))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn trees(d: &Daemon) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d.data_dir().join("jail/layers"))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

async fn fork(d: &Daemon, id: &str, count: u32) -> Vec<String> {
    let (status, v) = d
        .json(
            POST,
            &format!("/v1/sandbox/sessions/{id}/fork"),
            json!({ "count": count }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

async fn delete_snapshot(d: &Daemon, sid: &str) {
    let resp = d
        .req(
            Method::DELETE,
            &format!("/v1/sandbox/snapshots/{sid}"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
}

/// A fork's copies stack the source's capture as one shared lower layer: each sees the
/// source's files and writes only its own; what a copy changes and deletes survives its
/// snapshots, pauses and restores; the source and its snapshots may go while copies run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forked_copies_share_one_layer_and_keep_their_own_changes() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let a = d.create(json!({})).await;
    sh(&d, &a, WRITE).await;
    let want = sh(&d, &a, DIGEST).await;
    let early = snapshot(&d, &a, Value::Null).await["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string();
    let stored = stored_layers(&d);
    let copies = fork(&d, &a, 3).await;
    // One tree for the three copies, copied on the host: nothing stored, nothing unpacked.
    assert_eq!(fork_trees(&d).len(), 1, "{:?}", fork_trees(&d));
    assert_eq!(stored_layers(&d), stored);
    assert!(trees(&d).is_empty(), "{:?}", trees(&d));
    for c in &copies {
        assert_eq!(sh(&d, c, DIGEST).await, want);
    }

    // A copy's changes are its own.
    const CHANGE: &str = "echo changed > /home/user/proj/a.txt; rm -r /home/user/proj/sub; \
         echo new > /home/user/proj/new.txt";
    const CHANGED: &str = "cat /home/user/proj/a.txt /home/user/proj/new.txt; \
         test -e /home/user/proj/sub && echo sub || echo no-sub";
    sh(&d, &copies[0], CHANGE).await;
    let changed = sh(&d, &copies[0], CHANGED).await;
    assert_eq!(changed, "changed\nnew\nno-sub\n");
    assert_eq!(sh(&d, &copies[1], DIGEST).await, want);
    assert_eq!(sh(&d, &a, DIGEST).await, want);

    // Its snapshot holds everything it sees: the shared layer and its own changes.
    let snap = snapshot(&d, &copies[0], Value::Null).await;
    let sid = snap["snapshot_id"].as_str().unwrap().to_string();
    // The shared layer was stored for it (once), beside the copy's own capture.
    assert_eq!(stored_layers(&d).len(), stored.len() + 2);
    let second = snapshot(&d, &copies[1], Value::Null).await["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(stored_layers(&d).len(), stored.len() + 3);
    let from = d.create(json!({ "from_snapshot": sid })).await;
    assert_eq!(sh(&d, &from, CHANGED).await, changed);
    // Restored into another copy, too.
    post_ok(
        &d,
        &format!("{}/restore", copies[1]),
        json!({ "snapshot_id": sid }),
    )
    .await;
    assert_eq!(sh(&d, &copies[1], CHANGED).await, changed);
    // And a fork of a copy.
    let grandchild = fork(&d, &copies[0], 1).await.remove(0);
    assert_eq!(sh(&d, &grandchild, CHANGED).await, changed);
    // A pause to disk of a copy keeps its changes on top of the shared layer.
    sh(&d, &copies[2], "echo paused > /home/user/p").await;
    post_ok(
        &d,
        &format!("{}/pause", copies[2]),
        json!({"memory": false}),
    )
    .await;
    post_ok(&d, &format!("{}/resume", copies[2]), Value::Null).await;
    assert_eq!(
        sh(&d, &copies[2], "cat /home/user/p /home/user/proj/a.txt").await,
        "paused\ndata\n"
    );

    // The source and its snapshots go; the copies keep working on their shared trees.
    let resp = d
        .req(Method::DELETE, &format!("/v1/sandbox/sessions/{a}"), KEY1)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    delete_snapshot(&d, &early).await;
    delete_snapshot(&d, &sid).await;
    delete_snapshot(&d, &second).await;
    let in_use = trees(&d);
    assert!(!in_use.is_empty());
    assert_eq!(sh(&d, &copies[2], DIGEST).await, want);
    assert_eq!(sh(&d, &grandchild, CHANGED).await, changed);

    // Once nothing uses them, their layers and trees go.
    for s in copies.iter().chain([&from, &grandchild]) {
        let resp = d
            .req(Method::DELETE, &format!("/v1/sandbox/sessions/{s}"), KEY1)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
    }
    // Deleting a snapshot runs the collector; the next destroy sweeps the trees.
    let last = d.create(json!({})).await;
    let sid = snapshot(&d, &last, Value::Null).await["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string();
    delete_snapshot(&d, &sid).await;
    let resp = d
        .req(
            Method::DELETE,
            &format!("/v1/sandbox/sessions/{last}"),
            KEY1,
        )
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    assert!(layer_files(&d).is_empty(), "{:?}", layer_files(&d));
    // The sweep is part of the sandbox's teardown, which finishes after the DELETE answered.
    assert!(comes_true(|| trees(&d).is_empty()).await, "{:?}", trees(&d));
}

/// Bytes the sandboxes' files share with each other on the daemon's btrfs data dir.
fn shared_bytes(d: &Daemon) -> u64 {
    let out = std::process::Command::new("btrfs")
        .args(["filesystem", "du", "-s", "--raw"])
        .arg(d.data_dir().join("jail/sandboxes"))
        .output()
        .expect("run btrfs filesystem du");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    last.split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected btrfs du output: {text}"))
}

/// Where the data dir's filesystem shares blocks, a fork clones the source's disk instead of
/// copying its files: the copies' disks share the source's blocks, each copy sees the files
/// with its own owners and writes only its own, and copies of copies, snapshots of copies and
/// forks of a session stacked on a snapshot's layers work as with copied forks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_on_a_filesystem_that_shares_blocks_clone_the_source_disk() {
    let Some(()) = root_or_skip() else { return };
    let Some(d) = Daemon::start_on_btrfs(BASE_CONFIG).await else {
        return;
    };
    let a = d.create(json!({})).await;
    sh(&d, &a, WRITE).await;
    sh(
        &d,
        &a,
        "head -c 20000000 /dev/urandom > /home/user/proj/big; chown 1000 /home/user/proj/big",
    )
    .await;
    const BIG: &str = "sha256sum /home/user/proj/big; stat -c '%u %s' /home/user/proj/big";
    let want = sh(&d, &a, DIGEST).await;
    let big = sh(&d, &a, BIG).await;
    let before = shared_bytes(&d);

    let copies = fork(&d, &a, 2).await;
    // No tree copied, no clone left behind: the copies' disks are clones of the source's
    // (an extent shared by several files counts once).
    assert!(fork_trees(&d).is_empty(), "{:?}", fork_trees(&d));
    assert!(
        shared_bytes(&d) >= before + 20_000_000,
        "{before} -> {}",
        shared_bytes(&d)
    );
    for c in &copies {
        assert_eq!(sh(&d, c, DIGEST).await, want);
        assert_eq!(sh(&d, c, BIG).await, big);
    }

    // Each writes its own blocks.
    const CHANGE: &str = "echo changed > /home/user/proj/a.txt; rm -r /home/user/proj/sub; \
         echo new > /home/user/proj/new.txt";
    const CHANGED: &str = "cat /home/user/proj/a.txt /home/user/proj/new.txt; \
         test -e /home/user/proj/sub && echo sub || echo no-sub; stat -c %u /home/user/proj/new.txt";
    sh(&d, &copies[0], CHANGE).await;
    let changed = sh(&d, &copies[0], CHANGED).await;
    assert_eq!(changed, "changed\nnew\nno-sub\n0\n");
    assert_eq!(sh(&d, &copies[1], DIGEST).await, want);
    sh(&d, &a, "echo source > /home/user/proj/a.txt").await;
    assert_eq!(sh(&d, &copies[1], DIGEST).await, want);

    // A copy of a copy (its files stored under the first source's ids), as the sandbox user.
    let grandchild = fork(&d, &copies[0], 1).await.remove(0);
    assert_eq!(sh(&d, &grandchild, CHANGED).await, changed);
    let v = d
        .exec(
            &grandchild,
            json!({"shell": "echo mine > /home/user/mine; stat -c %u /home/user/mine", "user": "user"}),
        )
        .await;
    assert_eq!(v["stdout"], "1000\n", "{v}");

    // A snapshot of a copy holds what the copy sees, deletions included.
    let sid = snapshot(&d, &copies[0], Value::Null).await["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string();
    let from = d.create(json!({ "from_snapshot": sid })).await;
    assert_eq!(sh(&d, &from, CHANGED).await, changed);

    // A session on a snapshot's layers (stacked below its disk) forks onto the same layers.
    sh(
        &d,
        &from,
        "rm /home/user/proj/new.txt; echo top > /home/user/top",
    )
    .await;
    let stacked = fork(&d, &from, 1).await.remove(0);
    assert_eq!(
        sh(
            &d,
            &stacked,
            "cat /home/user/top /home/user/proj/a.txt; test -e /home/user/proj/new.txt || echo gone"
        )
        .await,
        "top\nchanged\ngone\n"
    );
    assert!(fork_trees(&d).is_empty(), "{:?}", fork_trees(&d));
}
