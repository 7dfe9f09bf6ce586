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

/// `[retention]`: at start (and hourly), a stopped session past its age goes with its event
/// log, and so do old audit entries; younger ones, live sessions and the daemon's own fresh
/// writes stay. Time passing is the test editing the store while the daemon is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_past_their_retention_are_pruned_at_start() {
    let Some(()) = root_or_skip() else { return };
    let mut d = Daemon::start(
        "[sessions]\npool = {}\n[retention]\nstopped_session_days = 2\nnetwork_audit_days = 1\n",
    )
    .await;
    let old = d.create(json!({})).await;
    let recent = d.create(json!({})).await;
    let live = d.create(json!({})).await;
    let (status, _) = d
        .json(
            Method::DELETE,
            &format!("/v1/sandbox/sessions/{recent}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // A crash, not a shutdown: `old` stays recorded as running, so the test can end it days ago.
    d.crash();

    let store = koder_store::Store::open_sqlite(&d.data_dir().join("state.db"))
        .await
        .unwrap();
    let now = chrono::Utc::now();
    store
        .set_session_state_at(
            &old,
            koder_api_types::SessionState::Stopped,
            Some("test"),
            now - chrono::TimeDelta::days(3),
        )
        .await
        .unwrap();
    for (dest, age) in [("127.0.0.2", 2), ("127.0.0.3", 0)] {
        store
            .insert_audit(&koder_store::AuditRecord {
                id: 0,
                at: now - chrono::TimeDelta::days(age),
                tenant_id: "t1".into(),
                session_id: live.clone(),
                proto: "tcp".into(),
                dest: dest.into(),
                port: 80,
                name: None,
                allowed: false,
                reason: "test".into(),
            })
            .await
            .unwrap();
    }
    store.close().await;

    d.launch().await;
    let get = |id: String| {
        let d = &d;
        async move {
            d.json(
                Method::GET,
                &format!("/v1/sandbox/sessions/{id}"),
                Value::Null,
            )
            .await
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while get(old.clone()).await.0 != StatusCode::NOT_FOUND {
        assert!(
            std::time::Instant::now() < deadline,
            "the old session was not pruned"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, _) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/sessions/{old}/events"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "its log went with it");
    let (status, s) = get(recent.clone()).await;
    assert_eq!(
        (status, s["state"].as_str()),
        (StatusCode::OK, Some("stopped"))
    );
    let (_, events) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/sessions/{recent}/events"),
            Value::Null,
        )
        .await;
    assert!(!events["events"].as_array().unwrap().is_empty(), "{events}");
    // The restarted daemon ended `live`, which the crash left running: stopped now, kept.
    assert_eq!(get(live.clone()).await.0, StatusCode::OK);
    let (_, audit) = d
        .json(
            Method::GET,
            &format!("/v1/sandbox/audit/network?session_id={live}"),
            Value::Null,
        )
        .await;
    let dests: Vec<_> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["dest"].as_str().unwrap())
        .collect();
    assert_eq!(dests, ["127.0.0.3"], "{audit}");
    let metrics = d.metrics().await;
    for line in [
        "koder_retention_pruned_total{kind=\"sessions\"} 1",
        "koder_retention_pruned_total{kind=\"audit\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    d.stop();
}
