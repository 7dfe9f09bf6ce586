//! What a hostile program inside a jail sandbox can and cannot do. Each test first checks the
//! host-side fact it relies on (so it fails if the isolation were missing), then probes from
//! inside a real sandbox.

mod common;

use std::io::Read;
use std::net::TcpListener;

use common::*;
use koder_agent_protocol::ExecRequest;
use koder_runtime::Runtime;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_node_run() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("langs");
    let sb = sandbox(&env).await;
    let py = run(
        &sb,
        "/usr/bin/python3 -c 'import sys; print(6*7, sys.version_info[:2])'",
    )
    .await;
    assert_eq!(
        text(&py.stdout).trim(),
        "42 (3, 11)",
        "stderr: {}",
        text(&py.stderr)
    );
    // Debian has no `python`: the host image's shim, last in the image's PATH, is python3.
    let shim = run(&sb, "command -v python; python -c 'print(6*7)'").await;
    assert_eq!(
        text(&shim.stdout),
        format!("{}/python\n42\n", koder_image::SHIM_DIR),
        "stderr: {}",
        text(&shim.stderr)
    );
    let node = run(&sb, "/usr/bin/node -e 'console.log(6*7)'").await;
    assert_eq!(
        text(&node.stdout).trim(),
        "42",
        "stderr: {}",
        text(&node.stderr)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_is_read_only_and_writes_stay_in_the_session() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("ro");
    let sb = sandbox(&env).await;
    let probe = format!("koder-ro-probe-{}", std::process::id());
    let out = run(&sb, &format!("touch /usr/bin/{probe}; echo $?; echo x >> /etc/passwd; echo $?; touch /{probe}; echo $?")).await;
    let codes: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    assert_eq!(codes, ["1", "1", "1"], "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("Read-only file system"),
        "{}",
        text(&out.stderr)
    );
    assert!(!std::path::Path::new(&format!("/usr/bin/{probe}")).exists());

    let ok = run(&sb, "echo data > /workspace/kept && cat /workspace/kept").await;
    assert_eq!(text(&ok.stdout), "data\n");
    let layer = env.dir.path().join("images/host");
    assert!(
        !layer.join("workspace/kept").exists(),
        "write leaked into the shared image"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_processes_and_secrets_are_invisible() {
    let Some(()) = root_or_skip() else { return };
    let me = std::process::id();
    assert!(std::path::Path::new(&format!("/proc/{me}")).exists());
    assert!(
        std::path::Path::new("/etc/shadow").exists(),
        "host has /etc/shadow"
    );
    let secret = format!("/root/koder-secret-{me}");
    std::fs::write(&secret, "top secret").unwrap();

    let env = runtime("hide");
    let sb = sandbox(&env).await;
    let out = run(
        &sb,
        &format!(
            "ls /proc | grep -c '^[0-9]'; test -e /proc/{me} && echo sees-host-pid; \
             cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'carg[o]'; \
             cat {secret} 2>&1; cut -d: -f1,2 /etc/shadow; ls /sys 2>&1; echo end"
        ),
    )
    .await;
    let _ = std::fs::remove_file(&secret);
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let procs: u32 = lines[0].trim().parse().unwrap();
    assert!(procs <= 6, "sandbox sees {procs} processes:\n{stdout}");
    assert!(!stdout.contains("sees-host-pid"), "{stdout}");
    assert_eq!(lines[1].trim(), "0", "host command lines visible: {stdout}");
    assert!(!stdout.contains("top secret"), "{stdout}");
    assert!(
        stdout.contains(&format!("cat: {secret}: No such file or directory")),
        "{stdout}"
    );
    // The image's own shadow file: its accounts, none with a password; not the host's.
    assert!(stdout.contains("\nroot:*\nuser:*\nnobody:*\n"), "{stdout}");
    assert!(stdout.contains("ls: cannot access '/sys'"), "{stdout}");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cannot_mount_unshare_or_touch_cgroups() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("mount");
    let sb = sandbox(&env).await;
    let script = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(rc):
    return ctypes.get_errno() if rc != 0 else 0
print("mount", errno_of(libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)))
print("cgroup", errno_of(libc.mount(b"cgroup", b"/mnt", b"cgroup", 0, b"memory")))
print("unshare", errno_of(libc.unshare(0x10000000)))
print("keyctl", errno_of(libc.syscall(250, 0, 0, 0, 0, 0)))
print("bpf", errno_of(libc.syscall(321, 0, 0, 0)))
print("io_uring", errno_of(libc.syscall(425, 1, 0)))
print("cgroupns", open("/proc/self/cgroup").read().strip().splitlines()[0].split(":")[-1])
def memory_cgroup(pid):
    return [l.split(":")[-1] for l in open(f"/proc/{pid}/cgroup") if ":memory:" in l][0]
print("agent", memory_cgroup(1))
print("workload", memory_cgroup("self"))
"#;
    let out = run(&sb, &format!("/usr/bin/python3 -c '{script}'")).await;
    let stdout = text(&out.stdout);
    for line in [
        "mount 1",
        "cgroup 1",
        "unshare 1",
        "keyctl 1",
        "bpf 1",
        "io_uring 1",
        "cgroupns /",
        // The agent's cgroup is its cgroup namespace's root (made once the agent had joined
        // it), the workload's beside it.
        "agent /",
        "workload /../workload",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing {line:?} in:\n{stdout}\n{}",
            text(&out.stderr)
        );
    }
    // The cgroup limits the host set are what the cgroup still says.
    let usage_before = sb.resources().unwrap().usage().await.unwrap();
    assert!(usage_before.pids_current >= 1);
    let escape = run(
        &sb,
        "echo 999999999999 > /sys/fs/cgroup/memory/memory.limit_in_bytes; echo $?",
    )
    .await;
    assert_eq!(text(&escape.stdout).trim(), "1");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cannot_reach_the_host_loopback() {
    let Some(()) = root_or_skip() else { return };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // The listener really is reachable from the host.
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    drop(listener.accept().unwrap());
    let mut buf = [0u8; 1];
    let _ = c.read(&mut buf);

    let env = runtime("net");
    let sb = sandbox(&env).await;
    let script = format!(
        "import socket\ns=socket.socket(); s.settimeout(2)\ntry:\n    s.connect((\"127.0.0.1\", {port})); print(\"connected\")\nexcept Exception as e:\n    print(type(e).__name__)\nprint(sorted(n for _, n in socket.if_nameindex()))"
    );
    let out = sb
        .agent()
        .exec_collect(ExecRequest {
            argv: vec!["/usr/bin/python3".into(), "-c".into(), script],
            output_limit_bytes: 4096,
            timeout_ms: Some(10_000),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        text(&out.stdout),
        "ConnectionRefusedError\n['lo']\n",
        "{}",
        text(&out.stderr)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uids_map_to_an_unprivileged_range() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("uid");
    let sb = sandbox(&env).await;
    let out = run(&sb, "cat /proc/self/uid_map; touch /workspace/owned").await;
    let map: Vec<u64> = text(&out.stdout)
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(map[0], 0);
    assert!(
        map[1] >= 200_000,
        "sandbox root maps to host uid {}",
        map[1]
    );
    assert_eq!(map[2], 65536);
    let upper = env
        .dir
        .path()
        .join("sandboxes")
        .join(sb.id())
        .join("upper/workspace/owned");
    let meta = std::fs::metadata(&upper).unwrap();
    assert_eq!(
        u64::from(std::os::unix::fs::MetadataExt::uid(&meta)),
        map[1]
    );
    let agent_pid = std::fs::read_to_string(
        env.dir
            .path()
            .join("sandboxes")
            .join(sb.id())
            .join("agent.pid"),
    )
    .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent_pid.trim())).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line
            .split_whitespace()
            .skip(1)
            .all(|u| u == map[1].to_string()),
        "{uid_line}"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_do_not_see_each_other() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("pair");
    let a = sandbox(&env).await;
    let b = sandbox(&env).await;
    let marker = format!("koder-pair-{}", std::process::id());
    run(
        &a,
        &format!("echo secret > /workspace/{marker}; echo t > /tmp/{marker}"),
    )
    .await;
    let bg = a
        .agent()
        .exec_collect(ExecRequest {
            argv: vec![
                "/bin/bash".into(),
                "-c".into(),
                format!("exec -a {marker} sleep 300 & echo started"),
            ],
            output_limit_bytes: 1024,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(text(&bg.stdout), "started\n");
    // `[p]` keeps the probe's own command line from matching.
    let pattern = marker.replacen("pair", "[p]air", 1);
    let seen_in_a = run(
        &a,
        &format!("cat /proc/*/cmdline | tr '\\0' '\\n' | grep -c '{pattern}'; ls /workspace"),
    )
    .await;
    let in_a = text(&seen_in_a.stdout);
    assert!(
        in_a.starts_with("1\n") && in_a.contains(&marker),
        "a lost its own state: {in_a}"
    );
    let seen_in_b = run(
        &b,
        &format!("cat /proc/*/cmdline | tr '\\0' '\\n' | grep -c '{pattern}'; ls /workspace /tmp"),
    )
    .await;
    let stdout = text(&seen_in_b.stdout);
    assert!(stdout.starts_with("0\n"), "b sees a's process: {stdout}");
    assert!(!stdout.contains(&marker), "b sees a's files: {stdout}");
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_reports_its_walls() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("health");
    let sb = sandbox(&env).await;
    let h = sb.agent().health().await.unwrap();
    assert!(h.no_new_privs && h.seccomp, "{h:?}");
    assert!(h.landlock_abi >= 1, "landlock not in force: {h:?}");
    let caps = run(
        &sb,
        "grep -E '^(CapBnd|NoNewPrivs|Seccomp):' /proc/self/status",
    )
    .await;
    let s = text(&caps.stdout);
    assert!(s.contains("NoNewPrivs:\t1"), "{s}");
    assert!(s.contains("Seccomp:\t2"), "{s}");
    let bnd = s.lines().find(|l| l.starts_with("CapBnd")).unwrap();
    let bits = u64::from_str_radix(bnd.split_whitespace().nth(1).unwrap(), 16).unwrap();
    assert_eq!(
        bits & (1 << 21),
        0,
        "CAP_SYS_ADMIN still in the bounding set"
    );
    assert_eq!(
        bits & (1 << 19),
        0,
        "CAP_SYS_PTRACE still in the bounding set"
    );
    // The agent (PID 1) cannot be ptraced or have its memory read by sandbox code.
    let trace = run(&sb, "cat /proc/1/environ >/dev/null 2>&1; echo $?; cat /proc/1/mem 2>&1 | head -c 100 >/dev/null; echo done").await;
    assert!(
        text(&trace.stdout).starts_with("1\n"),
        "{}",
        text(&trace.stdout)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_group_and_keeps_partial_output() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("timeout");
    let sb = sandbox(&env).await;
    let mut req = shell("echo before; (sleep 200; echo never) & sleep 100");
    req.timeout_ms = Some(400);
    let out = sb.agent().exec_collect(req).await.unwrap();
    assert!(out.exit.timed_out, "{:?}", out.exit);
    assert_eq!(out.exit.signal, Some(9));
    assert_eq!(text(&out.stdout), "before\n");
    let left = run(&sb, "ls /proc | grep -c '^[0-9]'").await;
    // Only the agent and this probe's shell, ls and grep remain.
    assert!(
        text(&left.stdout).trim().parse::<u32>().unwrap() <= 4,
        "{}",
        text(&left.stdout)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_bounded_and_flagged() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("bound");
    let sb = sandbox(&env).await;
    let mut req = shell("head -c 300000 /dev/zero; echo err >&2");
    req.output_limit_bytes = 1000;
    let out = sb.agent().exec_collect(req).await.unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout_truncated && !out.stderr_truncated);
    assert_eq!(text(&out.stderr), "err\n");
    assert_eq!(out.exit.exit_code, Some(0));
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_env_and_cwd_reach_the_process() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("stdin");
    let sb = sandbox(&env).await;
    let out = sb
        .agent()
        .exec_collect(ExecRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "pwd; echo $GREETING; tr a-z A-Z".into(),
            ],
            env: vec![("GREETING".into(), "héllo".into())],
            cwd: Some("/tmp".into()),
            stdin: b"from stdin".to_vec(),
            output_limit_bytes: 1024,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), "/tmp\nhéllo\nFROM STDIN");
    let missing = sb
        .agent()
        .exec_collect(ExecRequest {
            argv: vec!["no-such-program".into()],
            output_limit_bytes: 10,
            ..Default::default()
        })
        .await;
    assert!(
        matches!(missing, Err(koder_agent_protocol::ClientError::Agent(e)) if e.code == koder_agent_protocol::ErrorCode::SpawnFailed)
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_quota_gives_enospc_and_spares_the_host() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("disk");
    let sb = env
        .runtime
        .create(koder_runtime::SandboxSpec {
            id: format!("disk{}", std::process::id()),
            image: "host".into(),
            limits: koder_runtime::Limits {
                disk_mib: Some(48),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .expect("create");
    let out = run(&sb, "dd if=/dev/zero of=/workspace/fill bs=1M count=200 2>&1; ls -l /workspace/fill | awk '{print $5}'; df -k / | tail -1").await;
    let stdout = text(&out.stdout);
    assert!(stdout.contains("No space left on device"), "{stdout}");
    let size: u64 = stdout
        .lines()
        .find(|l| l.chars().all(|c| c.is_ascii_digit()) && !l.is_empty())
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        size < 48 * 1024 * 1024 && size > 30 * 1024 * 1024,
        "filled {size} bytes"
    );
    // The host holds only the sparse image, at most the quota, and no mount.
    let image = env
        .dir
        .path()
        .join("sandboxes")
        .join(sb.id())
        .join("disk.img");
    let allocated =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&image).unwrap()) * 512;
    assert!(
        allocated <= 50 * 1024 * 1024,
        "image uses {allocated} bytes of host disk"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&env.dir.path().display().to_string()),
        "sandbox disk mounted on the host"
    );
    // The sandbox still works after hitting the quota, and freeing space helps.
    let again = run(
        &sb,
        "rm /workspace/fill && echo ok > /workspace/small && cat /workspace/small",
    )
    .await;
    assert_eq!(text(&again.stdout), "ok\n");
    sb.destroy().await.unwrap();
    assert!(!image.exists());
}
