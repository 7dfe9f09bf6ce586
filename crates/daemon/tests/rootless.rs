//! The daemon run by an unprivileged user: sandboxes still work (user namespaces), and the
//! limits it cannot enforce there are stated at start-up instead of pretended.

use std::io::Read;
use std::os::unix::fs::chown;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const NOBODY: u32 = 65534;

/// The daemon is stopped (SIGTERM, then waited for) however the test ends.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: plain syscall on a pid this test started; no memory is shared.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprivileged_daemon_runs_sandboxes_and_says_what_it_cannot_enforce() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/usr/bin/setpriv").exists() {
        eprintln!("skipped: needs root (to drop to nobody) and setpriv");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("kr-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Stopped(
        Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_koder-sandbox"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--api-key",
                "t1:key-one-1234",
                "--data-dir",
            ])
            .arg(dir.path().join("data"))
            .env("HOME", dir.path())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("setpriv"),
    );
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline, "rootless daemon did not come up");
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "rootless daemon exited"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resp = http
        .post(format!("{base}/v1/sandbox/sessions"))
        .bearer_auth("key-one-1234")
        .json(&json!({"language": "python"}))
        .send()
        .await
        .unwrap();
    let session: Value = resp.json().await.unwrap();
    let id = session["id"]
        .as_str()
        .unwrap_or_else(|| panic!("create failed: {session}"));
    let r: Value = http
        .post(format!("{base}/v1/sandbox/sessions/{id}/exec"))
        .bearer_auth("key-one-1234")
        .json(&json!({"shell": "cat /proc/self/uid_map; python3 -c 'print(6*7)'; touch /usr/x 2>&1; cat /etc/gshadow 2>&1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let out = r["stdout"].as_str().unwrap();
    let map: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        map,
        ["0", "65534", "1"],
        "sandbox root maps to the daemon's own uid: {r}"
    );
    assert!(out.contains("\n42\n"), "{r}");
    assert!(
        out.contains("Read-only file system") && out.contains("No such file"),
        "{r}"
    );
    let metrics = http
        .get(format!("{base}/v1/sandbox/sessions/{id}/metrics"))
        .bearer_auth("key-one-1234")
        .send()
        .await
        .unwrap();
    assert_eq!(
        metrics.status().as_u16(),
        501,
        "no cgroup, no usage figures: said, not faked"
    );

    let mut stderr_pipe = child.0.stderr.take().unwrap();
    drop(child); // SIGTERM and wait
    let mut stderr = String::new();
    stderr_pipe.read_to_string(&mut stderr).unwrap();
    for gap in [
        "NOT ENFORCED: memory, cpu and pids limits",
        "NOT ENFORCED: disk quota",
        "NOT ENFORCED: separate host uid range",
    ] {
        assert!(
            stderr.contains(gap),
            "start-up did not state {gap:?}:\n{stderr}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path().join("data/jail/sandboxes"))
            .unwrap()
            .count(),
        0,
        "sandboxes left behind"
    );
}
