//! Issue 14, sandbox side, through the real daemon: what reaches sandbox processes
//! (descriptors, address families), for jails and microVM guests.

mod common;

use common::*;
use futures::SinkExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const S: &str = "/v1/sandbox/sessions";

/// Prints the process's descriptors and those of them that are listening sockets.
const FD_PROBE: &str = "import os, socket
fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))
def listening(fd):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    with s:
        return bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
print('fds', fds, 'listening', [fd for fd in fds if listening(fd)])
";

/// Opens one socket of each kind; refused families print their errno.
const FAMILY_PROBE: &str = "import socket
def attempt(*args):
    try:
        socket.socket(*args).close()
        return 'ok'
    except OSError as e:
        return str(e.errno)
print(attempt(socket.AF_VSOCK, socket.SOCK_STREAM), attempt(socket.AF_PACKET, socket.SOCK_DGRAM),
      attempt(socket.AF_INET, socket.SOCK_STREAM), attempt(socket.AF_UNIX, socket.SOCK_STREAM))
";

/// vsock and packet refused (EAFNOSUPPORT), inet and unix work.
const FAMILY_VERDICT: &str = "97 97 ok ok\n";

/// 0-2 and the directory `listdir` holds, no listener.
const EXEC_FDS: &str = "fds [0, 1, 2, 3] listening []\n";

async fn python(d: &Daemon, id: &str, code: &str) -> String {
    let r = d.exec(id, json!({ "code": code })).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    r["stdout"].as_str().unwrap_or_default().to_string()
}

async fn context_run(d: &Daemon, id: &str, cid: &str, code: &str) -> String {
    let path = format!("{S}/{id}/contexts/{cid}/run");
    let (status, r): (StatusCode, Value) =
        d.json(Method::POST, &path, json!({ "code": code })).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r["stdout"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jail_processes_get_only_their_own_descriptors_and_families() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    assert_eq!(python(&d, &id, FD_PROBE).await, EXEC_FDS);
    let r = d
        .exec(&id, json!({"shell": "ls /proc/self/fd | tr '\\n' ' '"}))
        .await;
    assert_eq!(r["stdout"], "0 1 2 3 ", "{r}");
    assert_eq!(python(&d, &id, FAMILY_PROBE).await, FAMILY_VERDICT);

    // The terminal's shell: the pty on 0-2 and bash's own copy of it on 255.
    let mut ws = connect(&d, &id, "").await;
    ws.send(Message::Binary(
        b"ls /proc/$$/fd >/tmp/fds; e=E; echo FD$(tr '\\n' , </tmp/fds)${e}ND\n"
            .to_vec()
            .into(),
    ))
    .await
    .unwrap();
    let out = read_until(&mut ws, "END\r\n").await;
    assert!(out.contains("FD0,1,2,255,END"), "{out:?}");

    // An interpreter context: no listener in the interpreter, nothing inherited by its children.
    let (status, c) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/contexts"),
            json!({"language": "python"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{c}");
    let cid = c["context_id"].as_str().unwrap();
    assert!(context_run(&d, &id, cid, FD_PROBE)
        .await
        .ends_with("listening []\n"));
    let child = "import subprocess; print(subprocess.run(['/usr/bin/ls', '/proc/self/fd'], \
                 capture_output=True, close_fds=False, text=True).stdout.split())";
    assert_eq!(
        context_run(&d, &id, cid, child).await,
        "['0', '1', '2', '3']\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_processes_get_only_their_own_descriptors_and_no_vsock() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!("{BASE_CONFIG}\n{}", microvm_section())).await;
    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"runtime": "microvm", "language": "python", "limits": {"memory_mib": 96}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let id = s["id"].as_str().unwrap();
    assert_eq!(python(&d, id, FD_PROBE).await, EXEC_FDS);
    assert_eq!(python(&d, id, FAMILY_PROBE).await, FAMILY_VERDICT);
    // The agent still serves over its vsock listener after refusing new vsock sockets.
    let r = d.exec(id, json!({"shell": "echo still-served"})).await;
    assert_eq!(r["stdout"], "still-served\n", "{r}");
}

/// A free loopback address: bound and released, so the daemon can take it (a later restart
/// must get the very same one back).
fn free_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_crash_mid_create_leaves_no_copy_of_the_daemon() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start(BASE_CONFIG).await;
    d.stop();
    let listen = free_address();
    d.launch_at(&listen, &[("KODER_TEST_CRASH_AT", "jail-before-release")])
        .await;
    // The create's clone3 child is placed and waiting for release when the daemon aborts.
    let create = d
        .req(Method::POST, S, KEY1)
        .json(&json!({}))
        .timeout(std::time::Duration::from_secs(30))
        .send()
        .await;
    assert!(create.is_err(), "the daemon answered instead of crashing");
    let status = d.wait_exit(std::time::Duration::from_secs(30));
    assert!(status.is_some(), "the daemon did not reach its crash point");

    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_koder-sandbox"));
    let data = d.data_dir().display().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !processes_of(binary, &data).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "a copy of the daemon outlived it: {:?}",
            processes_of(binary, &data)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Same address: nothing holds the old listener any more.
    d.launch_at(&listen, &[]).await;
    // The crashed create had mounted the session's disk on the host (it is detached only after
    // the release): start-up reconciliation must have unmounted it.
    let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&data))
        .map(str::to_string)
        .collect();
    assert!(mounts.is_empty(), "left mounted: {mounts:#?}");
    let id = d.create(json!({})).await;
    let r = d.exec(&id, json!({"shell": "echo served"})).await;
    assert_eq!(r["stdout"], "served\n", "{r}");
    let ours = d.child.as_ref().map(|c| c.id() as i32);
    let strays: Vec<i32> = processes_of(binary, &data)
        .into_iter()
        .filter(|p| Some(*p) != ours)
        .collect();
    assert!(strays.is_empty(), "{strays:?}");
}

async fn session_status(d: &Daemon, id: &str) -> Value {
    let (status, s) = d.json(Method::GET, &format!("{S}/{id}"), Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{s}");
    s["state"].clone()
}

/// Issue 14 item 7: tmpfs pages are charged to the writer's cgroup and outlive it, so filling a
/// tmpfs used to OOM-kill the agent (the biggest process in the group) and end the session.
/// The agent now sits outside the workload's OOM domain. The sandbox comes from the warm pool
/// (started with the default 512 MiB), so this also proves the hand-out limits the workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_a_tmpfs_is_an_oom_verdict_and_the_session_lives_on() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start("[sessions]\nreap_interval = 0.2\npool = { python = 1 }\n").await;
    let ready = "koder_pool_ready{image=\"host\",language=\"python\"} 1";
    for _ in 0..100 {
        if d.metrics().await.contains(ready) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let id = d
        .create(json!({"language": "python", "limits": {"memory_mib": 64}}))
        .await;
    assert!(d
        .metrics()
        .await
        .contains("koder_sessions_created_total{source=\"pool\"} 1"));
    // 200 MiB fit /tmp (256 MiB) but not the 64 MiB memory limit; /dev/shm (64 MiB) may run out
    // of space first, which is the other acceptable ending.
    for (file, may_be_full) in [("/tmp/fill", false), ("/dev/shm/fill", true)] {
        let r = d
            .exec(
                &id,
                json!({"cmd": ["/usr/bin/dd", "if=/dev/zero", format!("of={file}"), "bs=1M", "count=200"]}),
            )
            .await;
        let full = r["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("No space left"));
        if !(may_be_full && full) {
            assert_eq!(r["verdict"], "SANDBOX-EXEC-KILLED-OOM", "{file}: {r}");
        }
        assert_eq!(session_status(&d, &id).await, "running", "{file}");
        // The file keeps its pages charged to the workload until it goes; the agent removes it.
        let path = format!("{S}/{id}/files?path={file}");
        let status = d
            .req(Method::DELETE, &path, KEY1)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::NO_CONTENT, "{file}");
        let r = d.exec(&id, json!({"shell": "echo alive"})).await;
        assert_eq!(r["stdout"], "alive\n", "{file}: {r}");
    }
    // A plain memory hog still gets its verdict.
    let r = d
        .exec(&id, json!({"code": "x = bytearray(300 * 1024 * 1024)"}))
        .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-KILLED-OOM", "{r}");
    assert_eq!(session_status(&d, &id).await, "running");
}

/// Strings of the interpreter drivers' sources that no command line may carry.
const DRIVER_MARKERS: [&str; 2] = ["ctl_in = os.fdopen", "require('net')"];

/// Every command line inside the sandbox, NUL-separated arguments joined by spaces.
const CMDLINES: &str = "import os
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            print(open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())
        except OSError:
            pass
";

/// Issue 14 item 8: nothing a sandbox process can read names a host path (mountinfo carried the
/// overlay's host layer paths), and no command line carries an interpreter driver's source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_host_paths_or_driver_sources_are_visible() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    for lang in ["python", "node"] {
        let (status, c) = d
            .json(
                Method::POST,
                &format!("{S}/{id}/contexts"),
                json!({"language": lang}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{c}");
        let cid = c["context_id"].as_str().unwrap();
        // Starts the interpreter.
        context_run(&d, &id, cid, "1").await;
    }
    let mountinfo = d
        .exec(
            &id,
            json!({"cmd": ["/usr/bin/cat", "/proc/self/mountinfo"]}),
        )
        .await["stdout"]
        .as_str()
        .unwrap()
        .to_string();
    let cmdlines = python(&d, &id, CMDLINES).await;
    assert!(
        cmdlines.contains("koder-driver"),
        "no interpreter seen: {cmdlines}"
    );
    let data_dir = d.data_dir().to_string_lossy().into_owned();
    for (what, text) in [("mountinfo", &mountinfo), ("cmdlines", &cmdlines)] {
        // The overlay's own option is `upperdir=`; its value must not name the layer.
        for needle in [data_dir.as_str(), "/sandboxes/", "/upper", "=upper"] {
            assert!(!text.contains(needle), "{what} names {needle}:\n{text}");
        }
        for marker in DRIVER_MARKERS {
            assert!(!text.contains(marker), "{what} carries driver source");
        }
    }
    assert!(mountinfo.contains("lowerdir="), "{mountinfo}");

    // On the host: the agent's command line is bare, and no process shows a driver's source.
    let data_dir = d.data_dir();
    let agents: Vec<Vec<u8>> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|p| {
            std::fs::read_link(p.path().join("exe"))
                .is_ok_and(|exe| exe.starts_with(&data_dir) && exe.ends_with("koder-agent"))
        })
        .map(|p| std::fs::read(p.path().join("cmdline")).unwrap_or_default())
        .collect();
    assert!(!agents.is_empty(), "no agent of this daemon found");
    for cmdline in agents {
        assert_eq!(cmdline, b"koder-agent\0init\0");
    }
    let ps = std::process::Command::new("ps")
        .args(["-e", "-ww", "-o", "args="])
        .output()
        .unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        ps.contains("koder-driver"),
        "no interpreter seen on the host"
    );
    for marker in DRIVER_MARKERS {
        assert!(!ps.contains(marker), "host ps shows driver source");
    }
    assert!(!ps.contains("\"root_target\""), "host ps shows agent JSON");
}
