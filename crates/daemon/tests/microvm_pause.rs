//! Memory pause of microVMs through the real daemon and real guests (QEMU `microvm`, TCG on
//! hosts without usable hardware KVM), booted from the image `ksandbox image build` made
//! (`KODER_MICROVM_IMAGES`, default `target/microvm-images`): the VM is saved to a file, its
//! VMM ends, the session outlives clean and killed daemons, and resumes with every process,
//! tmpfs file and interpreter variable as it was; a daemon killed while saving leaves the
//! session cleanly stopped and nothing on disk. Three boots in all (guests are slow under
//! TCG). The durations go to stderr (BENCHMARKS.md), unchecked.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";

/// One test at a time: TCG guests on a small CI host are slow enough one by one.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn config() -> String {
    format!("{BASE_CONFIG}\n{}", microvm_section())
}

async fn sh(d: &Daemon, id: &str, script: &str) -> String {
    let v = d.exec(id, json!({ "shell": script })).await;
    assert_eq!(v["exit_code"], 0, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().trim().to_string()
}

/// `POST path body` → (status, answer, how long it took).
async fn timed(d: &Daemon, path: &str, body: Value) -> (StatusCode, Value, Duration) {
    let start = Instant::now();
    let (status, v) = d.json(Method::POST, path, body).await;
    (status, v, start.elapsed())
}

/// Host processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline)
                .contains(needle)
                .then_some(pid)
        })
        .collect()
}

async fn wait_until_gone(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_mentioning(needle);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "VMM processes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn vm_dirs(d: &Daemon) -> Vec<PathBuf> {
    std::fs::read_dir(d.data_dir().join("microvm/vms"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

async fn state_of(d: &Daemon, id: &str) -> Value {
    let (status, v) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// Pauses `id` with its memory and checks that nothing of its VM runs: its directory holds
/// the saved state, no process mentions it. Returns the VM's directory and how long it took.
async fn pause_saved(d: &Daemon, id: &str) -> (PathBuf, Duration) {
    let (status, v, took) = timed(d, &format!("{S}/{id}/pause"), json!({"memory": true})).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("paused")),
        "{v}"
    );
    let dirs = vm_dirs(d);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let dir = dirs[0].clone();
    assert!(dir.join("memory.snap").is_file(), "no saved state");
    assert!(!dir.join("memory.partial").exists());
    wait_until_gone(&dir.to_string_lossy()).await;
    (dir, took)
}

fn listed_state(list: &Value, id: &str) -> Option<String> {
    list.as_array()
        .or_else(|| list["sessions"].as_array())?
        .iter()
        .find(|s| s["id"] == id)
        .and_then(|s| s["state"].as_str().map(String::from))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_memory_pause_survives_restarts_and_kills() {
    let Some(()) = root_or_skip() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let mut d = Daemon::start(&config()).await;
    let id = d
        .create(json!({"runtime": "microvm", "language": "python", "limits": {"memory_mib": 128}}))
        .await;
    // The counter is renamed into place: a read never finds it truncated and not yet written
    // (a VM saved between the two showed an empty file after its resume).
    let pid = sh(
        &d,
        &id,
        "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/c.n; mv /tmp/c.n /tmp/c; sleep 0.2; done' \
         >/dev/null 2>&1 & echo $!; echo kept > /tmp/note",
    )
    .await;
    let (status, c) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/contexts"),
            json!({"language": "python"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{c}");
    let run = format!(
        "{S}/{id}/contexts/{}/run",
        c["context_id"].as_str().unwrap()
    );
    d.json(Method::POST, &run, json!({"code": "x = 41"})).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before: u64 = sh(&d, &id, "cat /tmp/c").await.parse().unwrap();
    assert!(before >= 2, "the counter does not count: {before}");

    // Saved: nothing of the VM runs; the answer is the paused session.
    let (dir, save_took) = pause_saved(&d, &id).await;
    let state_bytes = std::fs::metadata(dir.join("memory.snap")).unwrap().len();
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": "true"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{e}");

    // A clean restart keeps it paused, with its saved state.
    d.stop();
    assert!(
        dir.join("memory.snap").is_file(),
        "a clean stop removed the saved VM"
    );
    d.launch().await;
    let (_, list) = d.json(Method::GET, S, Value::Null).await;
    assert_eq!(
        listed_state(&list, &id).as_deref(),
        Some("paused"),
        "{list}"
    );
    let (status, v, restore_took) = timed(&d, &format!("{S}/{id}/resume"), Value::Null).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("running")),
        "{v}"
    );
    assert!(!dir.join("memory.snap").exists(), "the used state stayed");

    // The same process counts on from where it was (the guest's clock stood still while it
    // was saved), the tmpfs file and the interpreter's variable are there.
    let after: u64 = sh(&d, &id, &format!("kill -0 {pid} && cat /tmp/c"))
        .await
        .parse()
        .unwrap();
    assert!(
        after >= before && after < before + 50,
        "counter {before} → {after}"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let later: u64 = sh(&d, &id, "cat /tmp/c").await.parse().unwrap();
    assert!(
        later > after,
        "the process stopped counting: {after} → {later}"
    );
    assert_eq!(sh(&d, &id, "cat /tmp/note").await, "kept");
    let (status, r) = d
        .json(Method::POST, &run, json!({"code": "print(x + 1)"}))
        .await;
    assert_eq!(
        (status, r["stdout"].as_str()),
        (StatusCode::OK, Some("42\n")),
        "{r}"
    );

    // Killed (SIGKILL) right after a pause: after the restart it resumes just the same.
    let (dir, _) = pause_saved(&d, &id).await;
    d.crash();
    d.launch().await;
    assert_eq!(state_of(&d, &id).await["state"], "paused");
    let (status, v, _) = timed(&d, &format!("{S}/{id}/resume"), Value::Null).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("running")),
        "{v}"
    );
    let again: u64 = sh(&d, &id, &format!("kill -0 {pid} && cat /tmp/c"))
        .await
        .parse()
        .unwrap();
    assert!(again >= later, "counter {later} → {again}");

    // Ending a saved session removes its files.
    let (dir2, _) = pause_saved(&d, &id).await;
    assert_eq!(dir2, dir);
    let (status, _) = d
        .json(Method::DELETE, &format!("{S}/{id}"), Value::Null)
        .await;
    assert!(status.is_success());
    assert!(!dir.exists(), "the saved VM of a deleted session stayed");

    eprintln!(
        "microvm memory pause (guest 256+160 MiB, 128 MiB limit, python context): save \
         {save_took:?} ({} MiB state file), resume after a daemon restart {restore_took:?}",
        state_bytes >> 20
    );
}

/// A daemon killed while it saves a VM (state written, not yet complete; or complete, the
/// session not yet recorded as paused) leaves the session stopped and nothing on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_while_saving_a_vm_leaves_no_half_snapshot() {
    let Some(()) = root_or_skip() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let mut d = Daemon::start(&config()).await;
    let mut ids = Vec::new();
    for point in ["vm-suspend-before-commit", "vm-pause-before-record"] {
        d.crash();
        d.launch_at("127.0.0.1:0", &[("KODER_TEST_CRASH_AT", point)])
            .await;
        let id = d
            .create(json!({"runtime": "microvm", "language": "bash"}))
            .await;
        sh(&d, &id, "echo up").await;
        let sent = d
            .req(Method::POST, &format!("{S}/{id}/pause"), KEY1)
            .json(&json!({"memory": true}))
            .send()
            .await;
        assert!(
            sent.is_err() || sent.is_ok_and(|r| r.status().is_server_error()),
            "the pause at {point} answered"
        );
        assert!(
            d.wait_exit(Duration::from_secs(30)).is_some(),
            "no crash at {point}"
        );
        ids.push(id);
    }
    d.launch().await;
    for id in &ids {
        let v = state_of(&d, id).await;
        assert_eq!(v["state"], "stopped", "{v}");
    }
    let dirs = vm_dirs(&d);
    assert!(dirs.is_empty(), "left behind: {dirs:?}");
    wait_until_gone(&d.data_dir().join("microvm/vms").to_string_lossy()).await;
}
