//! A daemon killed with SIGKILL and restarted leaves no process, cgroup, mount or layer behind,
//! and its state is consistent.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn cgroup_children(parent: &str) -> Vec<String> {
    let mut found = Vec::new();
    for c in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        if let Ok(groups) = std::fs::read_dir(c.path().join(parent)) {
            found.extend(
                groups
                    .flatten()
                    .filter(|g| g.path().is_dir())
                    .map(|g| g.path().display().to_string()),
            );
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_leaves_nothing_behind() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start("[sessions]\nreap_interval = 0.2\npool = { bash = 1 }\n").await;
    let a = d.create(json!({})).await;
    let b = d.create(json!({"language": "python"})).await;
    d.exec(
        &a,
        json!({"shell": "nohup sleep 300 >/dev/null 2>&1 & echo ok"}),
    )
    .await;
    let sandboxes = d.data_dir().join("jail/sandboxes");
    let mut pids = Vec::new();
    let mut old_dirs = Vec::new();
    for entry in std::fs::read_dir(&sandboxes).unwrap().flatten() {
        // A warm sandbox may be half-way through its start: it has no pid yet.
        let Ok(pid) = std::fs::read_to_string(entry.path().join("agent.pid")) else {
            continue;
        };
        pids.push(pid.trim().parse::<i32>().unwrap());
        old_dirs.push(entry.path().display().to_string());
    }
    assert!(pids.len() >= 2, "{pids:?}");
    assert!(!cgroup_children(&d.cgroup_parent).is_empty());

    d.crash();
    assert!(
        pids.iter().all(|p| alive(*p)),
        "sandboxes should outlive a crashed daemon until it returns"
    );

    d.launch().await;
    for pid in &pids {
        assert!(!alive(*pid), "agent {pid} survived the restart");
    }
    let left: Vec<_> = std::fs::read_dir(&sandboxes)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    // Only the new warm-pool sandbox may exist now.
    assert!(
        left.len() <= 1 && left.iter().all(|n| n.to_string_lossy().starts_with('w')),
        "{left:?}"
    );
    // (The new daemon's warm sandbox may hold its disk mount for the moment of its start.)
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for dir in &old_dirs {
        assert!(
            !mounts.contains(dir.as_str()),
            "mount of {dir} left on the host"
        );
    }
    for id in [&a, &b] {
        let (status, s) = d
            .json(
                Method::GET,
                &format!("/v1/sandbox/sessions/{id}"),
                Value::Null,
            )
            .await;
        assert_eq!(
            (status, s["state"].as_str()),
            (StatusCode::OK, Some("stopped")),
            "{s}"
        );
    }
    let (_, list) = d
        .json(Method::GET, "/v1/sandbox/sessions", Value::Null)
        .await;
    assert!(list["sessions"].as_array().unwrap().is_empty());
    let c = d.create(json!({})).await;
    assert_eq!(
        d.exec(&c, json!({"shell": "echo alive"})).await["stdout"],
        "alive\n"
    );

    d.stop();
    assert!(
        cgroup_children(&d.cgroup_parent).is_empty(),
        "cgroups left after shutdown"
    );
    assert_eq!(
        std::fs::read_dir(&sandboxes).unwrap().count(),
        0,
        "layers left after shutdown"
    );
}
