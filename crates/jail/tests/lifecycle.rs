//! Sandbox lifecycle on the host: destroy and crash reconciliation leave nothing behind.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use koder_agent_protocol::ExecRequest;
use koder_jail::{JailConfig, JailRuntime};
use koder_runtime::{Limits, Runtime, RuntimeError, SandboxSpec};

/// The sandbox's cgroup directories, one per hierarchy (its name is `<runtime prefix>-<id>`).
fn cgroup_dirs(parent: &str, id: &str) -> Vec<PathBuf> {
    let suffix = format!("-{id}");
    let mut found = Vec::new();
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
        return found;
    };
    for c in controllers.flatten() {
        let Ok(groups) = std::fs::read_dir(c.path().join(parent)) else {
            continue;
        };
        found.extend(
            groups
                .flatten()
                .filter(|g| g.file_name().to_string_lossy().ends_with(&suffix))
                .map(|g| g.path()),
        );
    }
    found.sort();
    found
}

/// The pids hierarchy's directory of the sandbox's cgroup.
fn pids_dir(parent: &str, id: &str) -> Option<PathBuf> {
    cgroup_dirs(parent, id).into_iter().find(|d| {
        d.starts_with("/sys/fs/cgroup/pids")
            || d.parent().and_then(|p| p.parent()) == Some(std::path::Path::new("/sys/fs/cgroup"))
    })
}

/// The task the agent's spawner thread takes in the workload's pids limit: 1 on cgroup v1,
/// where that thread lives there, 0 on v2.
fn spawner_tasks(parent: &str, id: &str) -> u64 {
    let v1 = pids_dir(parent, id).is_some_and(|d| d.starts_with("/sys/fs/cgroup/pids"));
    u64::from(v1)
}

/// Host pids in one of the sandbox's cgroup leaves (`agent`, `workload`).
fn leaf_pids(parent: &str, id: &str, leaf: &str) -> Vec<i32> {
    pids_dir(parent, id)
        .and_then(|d| std::fs::read_to_string(d.join(leaf).join("cgroup.procs")).ok())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Host pids in the sandbox's cgroup: the agent's leaf and the workload's.
fn cgroup_pids(parent: &str, id: &str) -> Vec<i32> {
    let mut pids = leaf_pids(parent, id, "agent");
    pids.extend(leaf_pids(parent, id, "workload"));
    pids
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only running processes count as left behind.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

fn mounts_mentioning(path: &Path) -> usize {
    let needle = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_leaves_no_process_cgroup_mount_or_file() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("destroy");
    let parent = env.cgroup_parent.clone();
    let sb = sandbox(&env).await;
    let id = sb.id().to_string();
    run(
        &sb,
        "nohup sleep 300 >/dev/null 2>&1 & setsid sleep 301 >/dev/null 2>&1 & echo ok",
    )
    .await;
    let pids = cgroup_pids(&parent, &id);
    assert!(
        pids.len() >= 3,
        "agent and two sleeps expected, got {pids:?}"
    );
    // The agent alone sits above the workload, whose limits bind sandbox processes.
    let agent = leaf_pids(&parent, &id, "agent");
    assert_eq!(agent.len(), 1, "{agent:?}");
    assert!(leaf_pids(&parent, &id, "workload").len() >= 2);
    let top = pids_dir(&parent, &id).unwrap();
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap().trim().to_string();
    assert_eq!(read(top.join("cgroup.procs")), "");
    let workload: u64 = read(top.join("workload/pids.max")).parse().unwrap();
    let session = workload - spawner_tasks(&parent, &id);
    assert_eq!(read(top.join("pids.max")), (session + 32).to_string());
    assert!(!cgroup_dirs(&parent, &id).is_empty());
    let sandbox_dir = env.dir.path().join("sandboxes").join(&id);
    let socket = env.dir.path().join("run").join(format!("{id}.sock"));
    assert!(sandbox_dir.exists() && socket.exists());

    sb.destroy().await.unwrap();
    sb.destroy().await.expect("destroy is idempotent");
    for pid in &pids {
        assert!(!alive(*pid), "process {pid} survived destroy");
    }
    assert_eq!(cgroup_dirs(&parent, &id), Vec::<PathBuf>::new());
    assert!(!sandbox_dir.exists(), "writable layer left behind");
    assert!(!socket.exists(), "agent socket left behind");
    assert!(
        eventually(|| trash_entries(env.dir.path()) == 0).await,
        "the discarded layer is never deleted"
    );
    assert_eq!(
        mounts_mentioning(env.dir.path()),
        0,
        "a sandbox mount is visible on the host"
    );
}

/// The leaf (`agent`, `workload`) each of the agent's threads is in, by the pids hierarchy.
fn thread_leaves(pid: i32) -> Vec<(i32, String)> {
    let leaf = |cgroup: &str| -> Option<String> {
        let pids = |l: &&str| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "pids"))
        };
        let line = cgroup
            .lines()
            .find(pids)
            .or_else(|| cgroup.lines().find(|l| l.starts_with("0::")))?;
        Some(line.rsplit('/').next()?.to_string())
    };
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_str()?.parse().ok()?;
            Some((
                tid,
                leaf(&std::fs::read_to_string(t.path().join("cgroup")).ok()?)?,
            ))
        })
        .collect()
}

/// On cgroup v1 one thread of the agent lives in the workload and clones every exec's process
/// there, so no process has to join it; the agent's main thread stays in its own leaf, outside
/// the workload's limits. On v2 no agent thread is in the workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_starts_processes_from_one_thread_in_the_workload() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("spawner");
    let parent = env.cgroup_parent.clone();
    let sb = sandbox(&env).await;
    let id = sb.id().to_string();
    let agent = leaf_pids(&parent, &id, "agent");
    assert_eq!(agent.len(), 1, "{agent:?}");
    let pid = agent[0];
    let leaves = thread_leaves(pid);
    let main = leaves.iter().find(|(tid, _)| *tid == pid);
    assert_eq!(main.map(|(_, l)| l.as_str()), Some("agent"), "{leaves:?}");
    let in_workload = leaves.iter().filter(|(_, l)| l == "workload").count();
    assert_eq!(
        in_workload as u64,
        spawner_tasks(&parent, &id),
        "{leaves:?}"
    );

    let out = run(&sb, "sleep 300 >/dev/null 2>&1 & echo started").await;
    assert_eq!(text(&out.stdout).trim(), "started");
    let others: Vec<i32> = leaf_pids(&parent, &id, "workload")
        .into_iter()
        .filter(|p| *p != pid)
        .collect();
    assert!(
        !others.is_empty(),
        "the exec's process is not in the workload"
    );
    assert!(
        !leaf_pids(&parent, &id, "agent")
            .iter()
            .any(|p| others.contains(p)),
        "an exec's process stayed in the agent's leaf"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_reconciles_what_a_crash_left() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("crash");
    let parent = env.cgroup_parent.clone();
    let sb = sandbox(&env).await;
    let id = sb.id().to_string();
    run(&sb, "nohup sleep 300 >/dev/null 2>&1 & echo ok").await;
    let pids = cgroup_pids(&parent, &id);
    assert!(pids.len() >= 2, "{pids:?}");
    // The daemon "crashes": the handle is gone without destroy, the sandbox keeps running.
    drop(sb);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(pids.iter().all(|p| alive(*p)));

    let mut cfg = JailConfig::new(env.dir.path(), agent_bin());
    cfg.cgroup_parent = parent.clone();
    let restarted = JailRuntime::new(cfg).unwrap();
    // A layer discarded just before the crash, still waiting to be deleted.
    let discarded = env.dir.path().join("trash/old.1.0/upper");
    std::fs::create_dir_all(&discarded).unwrap();
    std::fs::write(discarded.join("f"), "x").unwrap();
    let report = restarted.reconcile().await.unwrap();
    assert_eq!(trash_entries(env.dir.path()), 0);
    assert_eq!(report.sandboxes_removed, vec![id.clone()]);
    for pid in &pids {
        assert!(!alive(*pid), "process {pid} survived reconciliation");
    }
    // The agent was our child: reap its zombie so the test leaves nothing either.
    let agent = pids.iter().min().copied().unwrap();
    // SAFETY: reaps a child of this test; a null status pointer is allowed.
    unsafe { libc::waitpid(agent, std::ptr::null_mut(), libc::WNOHANG) };
    assert_eq!(cgroup_dirs(&parent, &id), Vec::<PathBuf>::new());
    assert!(!env.dir.path().join("sandboxes").join(&id).exists());
    assert!(!env
        .dir
        .path()
        .join("run")
        .join(format!("{id}.sock"))
        .exists());
    assert!(restarted
        .reconcile()
        .await
        .unwrap()
        .sandboxes_removed
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_cleans_up_and_says_why() {
    let Some(()) = root_or_skip() else { return };
    let dir = tempfile::Builder::new()
        .prefix("kj-")
        .tempdir_in("/tmp")
        .unwrap();
    let parent = format!("koder-test-fail-{}", std::process::id());
    let mut cfg = JailConfig::new(dir.path(), "/bin/false");
    cfg.cgroup_parent = parent.clone();
    let rt = JailRuntime::new(cfg).unwrap();
    let err = match rt
        .create(SandboxSpec {
            id: "will-fail".into(),
            image: "host".into(),
            ..Default::default()
        })
        .await
    {
        Ok(_) => panic!("a sandbox without an agent started"),
        Err(e) => e,
    };
    assert!(matches!(err, RuntimeError::Start(_)), "{err}");
    assert!(cgroup_dirs(&parent, "will-fail").is_empty());
    assert_eq!(
        std::fs::read_dir(dir.path().join("sandboxes"))
            .unwrap()
            .count(),
        0
    );
    // With the cgroups it made ahead for the next create, which its task removes a moment
    // after the drop: the parent goes once they are gone (seen left behind when removed at
    // once).
    drop(rt);
    let parent_gone = eventually(|| {
        std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|c| c.path().join(&parent))
            .filter(|dir| dir.exists())
            .all(|dir| std::fs::remove_dir(dir).is_ok())
    })
    .await;
    assert!(parent_gone, "cgroup parent {parent} left behind");
}

/// What waits in the state dir's trash to be deleted.
fn trash_entries(state: &Path) -> usize {
    std::fs::read_dir(state.join("trash")).map_or(0, |d| d.count())
}

/// Polls `done` for up to 10 s.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

/// Creates whose futures are dropped at every stage (a client gone, a timeout) leave nothing
/// behind and give their slots back: the blocking part runs to its end and its result tears
/// itself down, as does a start dropped while the agent sets up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_creates_leave_nothing() {
    let Some(()) = root_or_skip() else { return };
    let dir = tempfile::Builder::new()
        .prefix("kj-")
        .tempdir_in("/tmp")
        .unwrap();
    let parent = format!("koder-test-abandon-{}", std::process::id());
    let _parent_goes = RemoveCgroupParent(parent.clone());
    let mut cfg = JailConfig::new(dir.path(), agent_bin());
    cfg.cgroup_parent = parent.clone();
    // One slot per attempt: each is given back only after its teardown, which `clean` below
    // cannot observe.
    cfg.max_sandboxes = 8;
    let rt = JailRuntime::new(cfg).unwrap();
    let spec = |id: String| SandboxSpec {
        id,
        image: "host".into(),
        limits: Limits {
            disk_mib: Some(16),
            ..Default::default()
        },
        ..Default::default()
    };
    let clean = || {
        std::fs::read_dir(dir.path().join("sandboxes")).map_or(0, |d| d.count()) == 0
            && trash_entries(dir.path()) == 0
            && mounts_mentioning(dir.path()) == 0
            && (0..8).all(|n| cgroup_dirs(&parent, &format!("abandon-{n}")).is_empty())
    };
    let mut abandoned = 0;
    for (n, after_ms) in [0, 1, 2, 4, 8, 16, 32, 64].into_iter().enumerate() {
        let create = rt.create(spec(format!("abandon-{n}")));
        match tokio::time::timeout(Duration::from_millis(after_ms), create).await {
            Ok(Ok(sb)) => sb.destroy().await.unwrap(),
            Ok(Err(e)) => panic!("create abandon-{n} failed: {e}"),
            Err(_) => abandoned += 1,
        }
        assert!(
            eventually(clean).await,
            "create abandoned after {after_ms} ms left something"
        );
    }
    assert!(abandoned > 0, "every create finished within its deadline");
    // Every slot is free again (the last one a moment after its layer went).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = Vec::new();
    for n in 0..8 {
        let created = rt.create(spec(format!("again-{n}"))).await;
        again.push(created.unwrap_or_else(|e| panic!("slot {n}: {e}")));
    }
    for sb in again {
        sb.destroy().await.unwrap();
    }
}

/// Removes a test's cgroup parent in every hierarchy when the test ends, also when it fails
/// (a teardown finishing on a background thread may still hold a child for a moment).
struct RemoveCgroupParent(String);

impl Drop for RemoveCgroupParent {
    fn drop(&mut self) {
        let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        let dirs: Vec<PathBuf> = controllers
            .flatten()
            .map(|c| c.path().join(&self.0))
            .collect();
        for _ in 0..50 {
            let left = dirs
                .iter()
                .filter(|d| d.exists() && std::fs::remove_dir(d).is_err())
                .count();
            if left == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_are_refused_before_anything_is_created() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("spec");
    for (id, image) in [
        ("../escape", "host"),
        ("a/b", "host"),
        ("", "host"),
        ("ok-id", "no-such-image"),
    ] {
        let res = env
            .runtime
            .create(SandboxSpec {
                id: id.into(),
                image: image.into(),
                ..Default::default()
            })
            .await;
        let Err(e) = res else {
            panic!("{id:?}/{image:?} accepted")
        };
        assert!(matches!(e, RuntimeError::InvalidSpec(_)), "{e}");
    }
    assert_eq!(
        std::fs::read_dir(env.dir.path().join("sandboxes"))
            .unwrap()
            .count(),
        0
    );
}

/// Freeze stops every sandbox process but the agent, which keeps answering (a paused
/// session can still be captured); thaw lets them run on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeze_stops_the_sandbox_until_thawed() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("freeze");
    let sb = sandbox(&env).await;
    let res = sb.resources().expect("jail offers resource control");
    let ticker = ExecRequest {
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            "(while :; do echo x >> /tmp/tick; sleep 0.01; done) >/dev/null 2>&1 &".into(),
        ],
        output_limit_bytes: 1024,
        ..Default::default()
    };
    sb.agent().exec_collect(ticker).await.unwrap();
    let ticks = || async {
        sb.agent()
            .read_file("/tmp/tick", 1 << 20)
            .await
            .unwrap()
            .len()
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    res.freeze().await.unwrap();
    let h = tokio::time::timeout(Duration::from_secs(5), sb.agent().health()).await;
    assert!(
        matches!(h, Ok(Ok(_))),
        "frozen sandbox's agent silent: {h:?}"
    );
    let before = ticks().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ticks().await, before, "a frozen process ran");
    res.thaw().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(ticks().await > before, "a thawed process did not run");
    let usage = res.usage().await.unwrap();
    assert!(
        usage.memory_current_bytes > 0 && usage.pids_current >= 1,
        "{usage:?}"
    );
    sb.destroy().await.unwrap();
}

/// A hand-out's `set_limits` writes the groups only where the limits differ from what they
/// hold: equal limits (a warm sandbox made with the session's own) cost no cgroupfs write,
/// and any change is written in full, back and forth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_limits_writes_only_what_differs_from_the_groups() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("limits");
    let parent = env.cgroup_parent.clone();
    let made_with = Limits {
        cpu_millis: Some(1000),
        memory_mib: Some(256),
        pids: Some(100),
        disk_mib: None,
    };
    let sb = env
        .runtime
        .create(SandboxSpec {
            id: format!("lim{}", std::process::id()),
            image: "host".into(),
            limits: made_with,
            ..Default::default()
        })
        .await
        .expect("create");
    let pids_max = pids_dir(&parent, sb.id())
        .unwrap()
        .join("workload/pids.max");
    let spawner = spawner_tasks(&parent, sb.id());
    let read = || {
        let raw = std::fs::read_to_string(&pids_max).unwrap();
        (raw.trim().parse::<u64>().unwrap() - spawner).to_string()
    };
    assert_eq!(read(), "100");
    let rc = sb.resources().expect("cgroups");

    let other = Limits {
        pids: Some(50),
        ..made_with
    };
    rc.set_limits(&other).await.unwrap();
    assert_eq!(read(), "50");
    rc.set_limits(&made_with).await.unwrap();
    assert_eq!(read(), "100", "changed back");
    // Someone else's write shows what the next equal call does: nothing.
    std::fs::write(&pids_max, "77").unwrap();
    rc.set_limits(&made_with).await.unwrap();
    assert_eq!(
        read(),
        (77 - spawner).to_string(),
        "equal limits were written again"
    );
    rc.set_limits(&other).await.unwrap();
    assert_eq!(read(), "50");
    sb.destroy().await.unwrap();
}

/// Groups of this test's runtime made ahead, in the memory hierarchy (cgroup v1; `None` on v2,
/// where groups cannot be renamed and none are made ahead).
fn ready_groups(parent: &str) -> Option<Vec<String>> {
    let memory = Path::new("/sys/fs/cgroup/memory");
    if !memory.join("memory.limit_in_bytes").exists() {
        return None;
    }
    let names = std::fs::read_dir(memory.join(parent)).map_or(Vec::new(), |d| {
        d.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("-ready."))
            .collect()
    });
    Some(names)
}

/// On cgroup v1 a create takes a group made ahead (renamed to its sandbox's name, leaves and
/// all) instead of making fifteen directories; the stock refills after it, and reconciliation
/// (start, final sweep) leaves none behind and makes no more until a create asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_take_cgroups_made_ahead() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("ahead");
    let parent = env.cgroup_parent.clone();
    let Some(none) = ready_groups(&parent) else {
        eprintln!("skipped: cgroups are v2 here (no rename, nothing made ahead)");
        return;
    };
    assert!(none.is_empty(), "{none:?}");
    let first = sandbox(&env).await;
    assert!(eventually(|| ready_groups(&parent).is_some_and(|r| r.len() == 1)).await);
    let made = ready_groups(&parent).unwrap_or_default().remove(0);

    let second = sandbox(&env).await;
    let id = second.id().to_string();
    for c in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        assert!(
            !c.path().join(&parent).join(&made).exists(),
            "{made} still in {c:?}"
        );
    }
    // Its group is the renamed one, with both leaves: the agent in one, the workload in the
    // other.
    assert_eq!(
        cgroup_dirs(&parent, &id).len(),
        5,
        "{:?}",
        cgroup_dirs(&parent, &id)
    );
    assert_eq!(leaf_pids(&parent, &id, "agent").len(), 1);
    let out = run(&second, "sleep 5 & echo started").await;
    assert_eq!(text(&out.stdout).trim(), "started");
    assert!(!leaf_pids(&parent, &id, "workload").is_empty());
    assert!(eventually(|| ready_groups(&parent).is_some_and(|r| r.len() == 1)).await);

    env.runtime.reconcile().await.unwrap();
    assert_eq!(ready_groups(&parent), Some(Vec::new()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        ready_groups(&parent),
        Some(Vec::new()),
        "made again without a create"
    );
    for sb in [first, second] {
        sb.destroy().await.unwrap();
    }
}

/// A create clones its agent into a network namespace made ahead when one of its kind (with
/// or without egress) is ready: set up by the runtime, which opened its low ports to every user
/// (what no sandbox could do to its own namespace, so it tells the two apart), loopback up, and
/// with egress the default routes and the redirect that carry a connection to the agent's
/// listener. The first create of each kind finds none and sets its own up, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_take_network_namespaces_made_ahead() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("netns");
    // Low ports, default routes, and a TCP connection to an address outside the sandbox
    // (nothing leaves it: its namespace has loopback alone): with egress the redirect hands it
    // to the agent's listener, without it has no route.
    let probe = "cat /proc/sys/net/ipv4/ip_unprivileged_port_start; \
        grep -c '^lo\t00000000' /proc/net/route; \
        /usr/bin/python3 -c 'import socket; s=socket.socket(); s.settimeout(5)
try: s.connect((\"192.0.2.1\", 80)); print(\"connected\")
except OSError as e: print(type(e).__name__)'";
    for egress in [false, true] {
        let routes = if egress { "1" } else { "0" };
        let reached = if egress { "connected" } else { "OSError" };
        let first = probe_a_sandbox(&env, egress, probe).await;
        let mut seen = vec![first.clone()];
        // Creates past the stock's pause until two took a namespace made ahead: a loaded
        // host may need longer than one pause to make the next.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut made_ahead = 0;
        while made_ahead < 2 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let later = probe_a_sandbox(&env, egress, probe).await;
            let word = |i: usize| later.get(i).map(String::as_str);
            assert_eq!(word(1), Some(routes), "egress {egress}: {later:?}");
            if word(0) == Some("0") {
                made_ahead += 1;
            } else {
                assert!(
                    std::time::Instant::now() < deadline,
                    "egress {egress}: no create took a namespace made ahead: {seen:?}"
                );
            }
            seen.push(later);
        }
        assert_eq!(first[..2], ["1024", routes], "egress {egress}: {seen:?}");
        for probe in &seen {
            assert_eq!(probe.get(2).map(String::as_str), Some(reached), "{seen:?}");
        }
    }
}

/// The words `probe` prints in a new sandbox with or without `egress`, destroyed after.
async fn probe_a_sandbox(env: &Env, egress: bool, probe: &str) -> Vec<String> {
    let sb = sandbox_with(
        env,
        SandboxSpec {
            egress,
            ..Default::default()
        },
    )
    .await;
    let out = run(&sb, probe).await;
    sb.destroy().await.unwrap();
    text(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}
