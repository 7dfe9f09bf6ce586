//! `runtime: "microvm"` through the normal API: real guests (QEMU `microvm`; TCG on hosts
//! without usable hardware KVM, such as CI), booted from the image `ksandbox image build` made
//! (`KODER_MICROVM_IMAGES`, default `target/microvm-images`; scripts/test.sh builds it).
//! Two boots in all: guests are slow under TCG. The first also exports its traces to the
//! test's collector: an exec's and a context run's in-guest spans, children of their requests'.

mod common;
#[path = "support/otlp.rs"]
mod otlp;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use futures::SinkExt;
use otlp::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const S: &str = "/v1/sandbox/sessions";
/// The traces of the first test: an exec, a context run.
const EXEC_TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4736";
const RUN_TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4737";

fn microvm_config() -> String {
    format!("{BASE_CONFIG}\n{}", microvm_section())
}

/// Host processes whose command line mentions `needle` (this test's own data dir).
fn processes_mentioning(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// The memory cgroup directory of a process (v1 `memory` hierarchy, else the v2 tree).
fn memory_cgroup_of(pid: i32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        if controllers.split(',').any(|c| c == "memory") {
            return PathBuf::from(format!("/sys/fs/cgroup/memory{path}"));
        }
    }
    let path = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    PathBuf::from(format!("/sys/fs/cgroup{path}"))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_session_runs_code_moves_files_and_leaves_nothing() {
    let Some(()) = root_or_skip() else { return };
    let (spans, url) = collector().await;
    let config = format!(
        "{}\n[telemetry]\notlp_endpoint = \"{url}\"\n",
        microvm_config()
    );
    let mut d = Daemon::start(&config).await;
    let vms = d.data_dir().join("microvm/vms");

    let (status, s) = d
        .json(
            Method::POST,
            S,
            json!({"runtime": "microvm", "language": "python", "limits": {"memory_mib": 96, "pids": 128, "disk_mib": 64}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    assert_eq!(s["runtime"], "microvm");
    let id = s["id"].as_str().unwrap().to_string();

    // Its own kernel: Debian's cloud kernel, not the host's.
    let r = d
        .exec(&id, json!({"shell": "uname -r; cat /proc/1/comm"}))
        .await;
    let out = r["stdout"].as_str().unwrap();
    assert!(out.contains("cloud-amd64"), "not the guest kernel: {r}");
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(!out.contains(host_release.trim()), "{r}");
    // The guest's `user` has sudo, served by the same agent as in a jail; root becomes any
    // account by `su`, as in a jail.
    let r = d
        .exec(
            &id,
            json!({"shell": "id -u; sudo id -u; sudo su - user -c 'id -un'", "user": "user"}),
        )
        .await;
    assert_eq!(r["stdout"], "1000\n0\nuser\n", "{r}");
    // Any other account of the guest's /etc/passwd, found through the same agent.
    let r = d
        .exec(
            &id,
            json!({"shell": "id -un; echo $HOME", "user": "nobody"}),
        )
        .await;
    assert_eq!(r["stdout"], "nobody\n/nonexistent\n", "{r}");

    let r = d
        .exec(
            &id,
            json!({"code": "import sys; print(sys.version_info[:2], 6 * 7)"}),
        )
        .await;
    assert_eq!(r["stdout"], "(3, 11) 42\n", "{r}");
    let r = d
        .exec(&id, json!({"cmd": ["/usr/bin/node", "-e", "console.log([1,2,3].map(x => x * 2).join(','))"]}))
        .await;
    assert_eq!(
        (r["exit_code"].as_i64(), r["stdout"].as_str()),
        (Some(0), Some("2,4,6\n")),
        "{r}"
    );

    // Files in, moved, read back by guest code and out again.
    let f = format!("{S}/{id}/files");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let resp = d
        .req(Method::PUT, &f, KEY1)
        .query(&[("path", "/workspace/in.bin")])
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{f}/move"),
            json!({"from": "/workspace/in.bin", "to": "/workspace/moved.bin"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{e}");
    let r = d
        .exec(&id, json!({"code": "import hashlib\nd = open('/workspace/moved.bin','rb').read()\nopen('/workspace/out.txt','w').write(hashlib.sha256(d).hexdigest())"}))
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let resp = d
        .req(Method::GET, &f, KEY1)
        .query(&[("path", "/workspace/out.txt")])
        .send()
        .await
        .unwrap();
    let digest = resp.text().await.unwrap();
    use sha2::Digest;
    assert_eq!(digest, hex::encode(sha2::Sha256::digest(&payload)));

    // Verdicts come from inside the guest: the agent's timeout and the guest cgroup's OOM kill.
    let r = d
        .exec(
            &id,
            // Room for a TCG guest on a loaded host to start the shell and print before the
            // timeout; the verdict is what is checked, not the time.
            json!({"shell": "echo before; sleep 30", "timeout_ms": 6000}),
        )
        .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-TIMEOUT", "{r}");
    assert_eq!(r["stdout"], "before\n");
    let r = d
        .exec(&id, json!({"code": "print('allocating', flush=True)\nchunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))"}))
        .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-KILLED-OOM", "{r}");
    assert_eq!(r["stdout"], "allocating\n");
    let (status, m) = d
        .json(Method::GET, &format!("{S}/{id}/metrics"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert!(m["oom_kills"].as_u64().unwrap() >= 1, "{m}");
    assert_eq!(m["memory_limit_kib"], 96 * 1024, "{m}");
    // The VM survives its process's OOM.
    assert_eq!(
        d.exec(&id, json!({"shell": "echo alive"})).await["stdout"],
        "alive\n"
    );

    // The disk quota is the size of the guest's scratch disk.
    let r = d
        .exec(&id, json!({"shell": "dd if=/dev/zero of=/workspace/fill bs=1M count=100 2>&1; rm -f /workspace/fill"}))
        .await;
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{r}"
    );

    // Interpreter contexts keep state inside the guest.
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
    d.json(Method::POST, &run, json!({"code": "x = 20"})).await;
    let resp = d
        .req(Method::POST, &run, KEY1)
        .header("traceparent", traceparent(RUN_TRACE))
        .json(&json!({"code": "import os\nprint(x + 22, os.environ['TRACEPARENT'])"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let context_run: Value = resp.json().await.unwrap();
    let (answer, run_saw) = context_run["stdout"]
        .as_str()
        .and_then(|o| o.trim().split_once(' '))
        .unwrap_or_else(|| panic!("{context_run}"));
    assert_eq!(answer, "42", "{context_run}");
    let run_saw = run_saw.to_string();

    // A traced exec: its in-guest span is the exec's child, its context the process's.
    let resp = d
        .req(Method::POST, &format!("{S}/{id}/exec"), KEY1)
        .header("traceparent", traceparent(EXEC_TRACE))
        .json(&json!({"shell": COMMAND}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let traced: Value = resp.json().await.unwrap();

    // Pause saves the VM with its memory (QEMU: nothing of it runs), resume starts it again
    // from there: the background process ticks on.
    d.exec(&id, json!({"shell": "nohup sh -c 'while :; do echo x >> /tmp/tick; sleep 0.05; done' >/dev/null 2>&1 &"})).await;
    let (status, p) = d
        .json(Method::POST, &format!("{S}/{id}/pause"), Value::Null)
        .await;
    assert_eq!(
        (status, p["state"].as_str()),
        (StatusCode::OK, Some("paused")),
        "{p}"
    );
    let (status, r) = d
        .json(Method::POST, &format!("{S}/{id}/resume"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let r = d.exec(&id, json!({"shell": "a=$(wc -l < /tmp/tick); sleep 0.5; b=$(wc -l < /tmp/tick); [ $b -gt $a ] && echo ticking"})).await;
    assert_eq!(r["stdout"], "ticking\n", "{r}");

    // A terminal: a PTY inside the guest, served by the same agent.
    let mut ws = connect(&d, &id, "").await;
    ws.send(Message::Binary(b"tty; echo $((6 * 7))x\n".to_vec().into()))
        .await
        .unwrap();
    let out = read_until(&mut ws, "42x").await;
    assert!(out.contains("/dev/pts/"), "{out}");
    ws.send(Message::Binary(b"exit 4\n".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(exit_message(&mut ws).await["exit_code"], 4);

    // Destroy: no VMM process, socket or directory of it remains.
    let vm_dirs: Vec<PathBuf> = std::fs::read_dir(&vms)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(vm_dirs.len(), 1);
    assert!(vm_dirs[0].join("agent.sock").exists());
    let needle = vm_dirs[0].to_string_lossy().into_owned();
    let vmm = processes_mentioning(&needle);
    assert!(!vmm.is_empty(), "no VMM process found");
    // The VMM processes sit in a host cgroup capping them: guest RAM (256 MiB + 160 MiB
    // overhead) plus 320 MiB for QEMU itself.
    let cgroups: Vec<PathBuf> = vmm.iter().map(|p| memory_cgroup_of(*p)).collect();
    assert!(cgroups.windows(2).all(|w| w[0] == w[1]), "{cgroups:?}");
    let limit: u64 = std::fs::read_to_string(cgroups[0].join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(cgroups[0].join("memory.max")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(limit, (256 + 160 + 320) << 20, "{}", cgroups[0].display());
    let (status, _) = d
        .json(Method::DELETE, &format!("{S}/{id}"), Value::Null)
        .await;
    assert!(status.is_success());
    wait_until_gone(&needle).await;
    assert!(!vm_dirs[0].exists(), "VM directory left behind");
    assert!(!cgroups[0].exists(), "VMM cgroup left behind");
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": "true"}),
        )
        .await;
    assert!(status.is_client_error(), "{status} {e}");

    // Stopping flushes what the batch exporter still holds.
    d.stop();
    let exec_route = "POST /v1/sandbox/sessions/{id}/exec";
    let all = spans_of(&spans, EXEC_TRACE, &[exec_route, "exec", "sandbox.exec"]).await;
    let (_, seen) = check_exec_tree(&all, EXEC_TRACE, exec_route, (&id, "awaited", "microvm"));
    assert_eq!(traced["stdout"].as_str().unwrap().trim(), seen, "{traced}");
    let run_route = "POST /v1/sandbox/sessions/{id}/contexts/{cid}/run";
    let all = spans_of(&spans, RUN_TRACE, &[run_route, "exec", "sandbox.run"]).await;
    let run = named(&all, "exec");
    assert_eq!(run.parent_span_id, named(&all, run_route).span_id);
    assert_eq!(attr(run, "runtime").as_deref(), Some("microvm"));
    let inside = named(&all, "sandbox.run");
    assert_eq!(inside.parent_span_id, run.span_id);
    assert_eq!(
        run_saw,
        format!("00-{RUN_TRACE}-{}-01", hex(&inside.span_id))
    );
}

/// A warm VM takes its session's limits at hand-out; a daemon that dies without cleaning up
/// leaves running VMs, and the next start kills them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_vm_then_restart_after_a_crash_removes_orphaned_vms() {
    let Some(()) = root_or_skip() else { return };
    let config = microvm_config().replace("pool = {}", "pool = {}\nmicrovm_pool = { bash = 1 }");
    let mut d = Daemon::start(&config).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !d
        .metrics()
        .await
        .contains("koder_pool_ready{image=\"host\",language=\"bash\"} 1")
    {
        assert!(Instant::now() < deadline, "no warm VM within 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let id = d
        .create(json!({"runtime": "microvm", "language": "bash", "limits": {"memory_mib": 64}}))
        .await;
    assert!(d
        .metrics()
        .await
        .contains("koder_sessions_created_total{source=\"pool\"} 1"));
    // 100 MiB fit the VM (256 MiB) but not the limit the warm VM took at hand-out.
    let r = d
        .exec(
            &id,
            json!({"cmd": ["/usr/bin/python3", "-c", "x = b'x' * (100 << 20)"]}),
        )
        .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-KILLED-OOM", "{r}");
    assert_eq!(
        d.exec(&id, json!({"shell": "echo up"})).await["stdout"],
        "up\n"
    );
    // The session's VM and the pool's replacement (booted or booting).
    let vms = d.data_dir().join("microvm/vms");
    let before: Vec<PathBuf> = std::fs::read_dir(&vms)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(!before.is_empty());
    d.crash();
    assert!(
        before
            .iter()
            .any(|dir| !processes_mentioning(&dir.to_string_lossy()).is_empty()),
        "the session's VM should outlive a crashed daemon"
    );
    d.launch().await;
    for dir in &before {
        wait_until_gone(&dir.to_string_lossy()).await;
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    let (status, _) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"shell": "true"}),
        )
        .await;
    assert!(status.is_client_error());
}

/// Firecracker needs hardware KVM; asked for where there is none, the runtime is unavailable
/// and says why (never a stand-in VMM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firecracker_without_hardware_kvm_is_unavailable() {
    let Some(()) = root_or_skip() else { return };
    if koder_microvm::kvm::kvm_usable().is_ok() {
        eprintln!("hardware KVM present: this host can run the Firecracker backend");
        return;
    }
    let config = microvm_config()
        .lines()
        .map(|l| {
            if l.starts_with("backend") {
                "backend = \"firecracker\""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let d = Daemon::start(&config).await;
    let (status, e) = d.json(Method::POST, S, json!({"runtime": "microvm"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    assert_eq!(e["error"]["code"], "SANDBOX-RUNTIME-UNAVAILABLE-001");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("firecracker") || message.contains("KVM"),
        "{e}"
    );
}

/// Without an image the runtime is unavailable, said with the reason and a typed 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_without_an_image_is_unavailable() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(&format!(
        "{BASE_CONFIG}\n[microvm]\nimages_dir = \"/nonexistent/images\"\n"
    ))
    .await;
    let (status, e) = d.json(Method::POST, S, json!({"runtime": "microvm"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    assert_eq!(e["error"]["code"], "SANDBOX-RUNTIME-UNAVAILABLE-001");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("image build"),
        "{e}"
    );
}
