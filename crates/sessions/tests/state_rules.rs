//! The manager's rules for state that lasts, without root, against `MemoryRuntime` (whose fake
//! agent captures its file map as a layer): tenancy of snapshots, the snapshot-storage quota,
//! layers freed when nothing uses them, a disk pause surviving a new manager on the same store,
//! and fork's bounds.

use std::path::Path;
use std::sync::Arc;

use koder_api_types::{CreateSession, CreateSnapshot, ErrorCode, Lifecycle, SessionState};
use koder_auth::Identity;
use koder_runtime_memory::MemoryRuntime;
use koder_sessions::{Error, Manager, SessionConfig};
use koder_store::{Store, Tenant};

fn who(t: &str) -> Identity {
    Identity {
        tenant_id: t.into(),
    }
}

fn config(dir: &Path) -> SessionConfig {
    SessionConfig {
        pool: Default::default(),
        state_dir: Some(dir.to_path_buf()),
        snapshot_storage_mib: 1,
        ..SessionConfig::default()
    }
}

async fn store() -> Store {
    let store = Store::open_in_memory().await.unwrap();
    for id in ["a", "b"] {
        store
            .upsert_tenant(&Tenant {
                id: id.into(),
                name: id.into(),
                plan: "standard".into(),
                max_sessions: None,
                daily_session_minutes: None,
                created_at: chrono::Utc::now(),
            })
            .await
            .unwrap();
    }
    store
}

async fn manager(store: &Store, runtime: &MemoryRuntime, dir: &Path) -> Arc<Manager> {
    Manager::start(store.clone(), Arc::new(runtime.clone()), config(dir))
        .await
        .unwrap()
}

fn code_of<T: std::fmt::Debug>(r: Result<T, Error>) -> ErrorCode {
    r.expect_err("expected an error").code()
}

fn sandbox_of(runtime: &MemoryRuntime) -> Arc<koder_runtime_memory::MemorySandbox> {
    let ids = runtime.live();
    assert_eq!(ids.len(), 1, "{ids:?}");
    runtime.sandbox(&ids[0]).unwrap()
}

fn cache_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("layers")).map_or(0, |r| r.count())
}

#[tokio::test]
async fn snapshots_belong_to_their_tenant_and_build_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let m = manager(&store, &runtime, dir.path()).await;
    let s = m.create(&who("a"), CreateSession::default()).await.unwrap();
    sandbox_of(&runtime).put_file("/home/user/kept", b"state");
    let snap = m
        .snapshot(&who("a"), &s.id, CreateSnapshot::default())
        .await
        .unwrap();
    assert_eq!(snap.session_id.as_deref(), Some(s.id.as_str()));
    assert!(snap.size_bytes > 0);

    assert_eq!(
        code_of(m.get_snapshot(&who("b"), &snap.snapshot_id).await),
        ErrorCode::NotFound
    );
    assert!(m.list_snapshots(&who("b")).await.unwrap().is_empty());
    assert_eq!(
        code_of(m.delete_snapshot(&who("b"), &snap.snapshot_id).await),
        ErrorCode::NotFound
    );
    let from_b = CreateSession {
        from_snapshot: Some(snap.snapshot_id.clone()),
        ..Default::default()
    };
    assert_eq!(
        code_of(m.create(&who("b"), from_b.clone()).await),
        ErrorCode::NotFound
    );
    // Another tenant cannot snapshot the session either.
    assert_eq!(
        code_of(
            m.snapshot(&who("b"), &s.id, CreateSnapshot::default())
                .await
        ),
        ErrorCode::NotFound
    );

    let copy = m.create(&who("a"), from_b).await.unwrap();
    let sandbox = runtime
        .live()
        .into_iter()
        .filter_map(|id| runtime.sandbox(&id))
        .find(|sb| !sb.spec().layers.is_empty())
        .expect("a sandbox made from layers");
    assert_eq!(
        sandbox.file("/home/user/kept").as_deref(),
        Some(&b"state"[..])
    );
    assert_ne!(copy.id, s.id);
}

#[tokio::test]
async fn the_storage_quota_refuses_and_deleting_frees() {
    let dir = tempfile::tempdir().unwrap();
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let m = manager(&store, &runtime, dir.path()).await;
    let s = m.create(&who("a"), CreateSession::default()).await.unwrap();
    let sb = sandbox_of(&runtime);
    sb.put_file("/home/user/big", &vec![7u8; 2 << 20]);
    assert_eq!(
        code_of(
            m.snapshot(&who("a"), &s.id, CreateSnapshot::default())
                .await
        ),
        ErrorCode::QuotaSnapshotStorage
    );
    assert!(!sb.is_frozen(), "a refused capture must thaw the sandbox");
    assert_eq!(cache_files(dir.path()), 0);
    assert_eq!(store.tenant_layer_bytes("a").await.unwrap(), 0);

    sb.put_file("/home/user/big", &vec![7u8; 600 << 10]);
    let snap = m
        .snapshot(&who("a"), &s.id, CreateSnapshot::default())
        .await
        .unwrap();
    // The tenant's room is now mostly used: a second capture of the same does not fit.
    assert_eq!(
        code_of(
            m.snapshot(&who("a"), &s.id, CreateSnapshot::default())
                .await
        ),
        ErrorCode::QuotaSnapshotStorage
    );
    m.delete_snapshot(&who("a"), &snap.snapshot_id)
        .await
        .unwrap();
    assert_eq!(store.tenant_layer_bytes("a").await.unwrap(), 0);
    assert_eq!(cache_files(dir.path()), 0);
    m.snapshot(&who("a"), &s.id, CreateSnapshot::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_disk_pause_outlives_its_manager_and_resumes_with_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let m = manager(&store, &runtime, dir.path()).await;
    let s = m
        .create(
            &who("a"),
            CreateSession {
                lifecycle: Some(Lifecycle {
                    auto_resume: true,
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    sandbox_of(&runtime).put_file("/home/user/kept", b"yes");
    let paused = m.pause_session(&who("a"), &s.id, false).await.unwrap();
    assert_eq!(paused.state, SessionState::Paused);
    assert!(runtime.live().is_empty(), "a disk pause holds no sandbox");
    drop(m);

    // A new manager on the same store (a daemon restart) keeps it paused.
    let runtime2 = MemoryRuntime::new();
    let m2 = manager(&store, &runtime2, dir.path()).await;
    assert_eq!(
        m2.get(&who("a"), &s.id).await.unwrap().state,
        SessionState::Paused
    );
    assert_eq!(
        code_of(m2.resume(&who("b"), &s.id).await),
        ErrorCode::NotFound
    );
    // auto_resume: a file read wakes it.
    let data = m2.download(&who("a"), &s.id, "/home/user/kept").await;
    assert!(data.is_ok(), "{:?}", data.err());
    assert_eq!(
        m2.get(&who("a"), &s.id).await.unwrap().state,
        SessionState::Running
    );
    assert_eq!(
        sandbox_of(&runtime2).file("/home/user/kept").as_deref(),
        Some(&b"yes"[..])
    );
}

/// Memory's answer for a running session matches the store's, and it says nothing for any
/// session that is not running here, so a caller falls back to the store (which wakes it).
#[tokio::test]
async fn the_owner_of_a_running_session_is_known_without_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let m = manager(&store, &runtime, dir.path()).await;
    let s = m.create(&who("a"), CreateSession::default()).await.unwrap();
    let tenant = |o: Option<Identity>| o.map(|o| o.tenant_id);
    assert_eq!(tenant(m.owner_of_running(&s.id)), Some("a".into()));
    assert_eq!(
        tenant(m.owner_of_active(&s.id).await.unwrap()),
        Some("a".into())
    );
    assert_eq!(tenant(m.owner_of_running("no-such-session")), None);

    for memory in [true, false] {
        m.pause_session(&who("a"), &s.id, memory).await.unwrap();
        assert_eq!(tenant(m.owner_of_running(&s.id)), None, "memory {memory}");
        assert_eq!(
            tenant(m.owner_of_active(&s.id).await.unwrap()),
            Some("a".into())
        );
        m.resume(&who("a"), &s.id).await.unwrap();
        assert_eq!(tenant(m.owner_of_running(&s.id)), Some("a".into()));
    }

    // Mid-teardown (the sandbox still up, its record not yet stopped) the session is ended
    // to both, so a stream cut by the teardown is never probed as alive.
    let sandbox = sandbox_of(&runtime);
    sandbox.hold_teardown(true);
    let destroy = tokio::spawn({
        let (m, id) = (m.clone(), s.id.clone());
        async move { m.destroy(&who("a"), &id).await }
    });
    while m.owner_of_running(&s.id).is_some() {
        tokio::task::yield_now().await;
    }
    assert_eq!(tenant(m.owner_of_active(&s.id).await.unwrap()), None);
    assert!(!sandbox.is_destroyed());
    sandbox.hold_teardown(false);
    destroy.await.unwrap().unwrap();
    assert!(sandbox.is_destroyed());
    assert_eq!(tenant(m.owner_of_running(&s.id)), None);
    assert_eq!(tenant(m.owner_of_active(&s.id).await.unwrap()), None);
}

#[tokio::test]
async fn fork_is_bounded_and_copies_each_time() {
    let dir = tempfile::tempdir().unwrap();
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let m = manager(&store, &runtime, dir.path()).await;
    let s = m.create(&who("a"), CreateSession::default()).await.unwrap();
    sandbox_of(&runtime).put_file("/home/user/f", b"1");
    for bad in [0, 101] {
        assert_eq!(
            code_of(m.fork(&who("a"), &s.id, bad).await),
            ErrorCode::InvalidArgument
        );
    }
    assert_eq!(
        code_of(m.fork(&who("b"), &s.id, 1).await),
        ErrorCode::NotFound
    );
    let forks = m.fork(&who("a"), &s.id, 3).await.unwrap();
    assert_eq!(forks.len(), 3);
    assert_eq!(runtime.live().len(), 4);
    for f in &forks {
        assert_eq!(f.tenant_id, "a");
    }
}

#[tokio::test]
async fn without_a_state_dir_snapshots_are_not_offered() {
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let cfg = SessionConfig {
        pool: Default::default(),
        ..SessionConfig::default()
    };
    let m = Manager::start(store, Arc::new(runtime), cfg).await.unwrap();
    let s = m.create(&who("a"), CreateSession::default()).await.unwrap();
    assert_eq!(
        code_of(
            m.snapshot(&who("a"), &s.id, CreateSnapshot::default())
                .await
        ),
        ErrorCode::NotImplemented
    );
    assert_eq!(
        code_of(m.pause_session(&who("a"), &s.id, false).await),
        ErrorCode::NotImplemented
    );
}

#[tokio::test]
async fn a_timeout_pauses_in_memory_or_to_disk_as_the_lifecycle_says() {
    let dir = tempfile::tempdir().unwrap();
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let m = manager(&store, &runtime, dir.path()).await;
    let lifecycle = |keep_memory| CreateSession {
        lifecycle: Some(Lifecycle {
            on_timeout: koder_api_types::OnTimeout::Pause,
            auto_resume: false,
            keep_memory,
        }),
        ..Default::default()
    };
    let mem = m.create(&who("a"), lifecycle(true)).await.unwrap();
    let frozen = sandbox_of(&runtime);
    let disk = m.create(&who("a"), lifecycle(false)).await.unwrap();
    let plain = m.create(&who("a"), CreateSession::default()).await.unwrap();
    for s in [&mem, &disk, &plain] {
        m.expire_now(&who("a"), &s.id).await.unwrap();
    }
    m.reap_expired().await;
    assert_eq!(
        m.get(&who("a"), &mem.id).await.unwrap().state,
        SessionState::Paused
    );
    assert!(frozen.is_frozen() && !frozen.is_destroyed());
    assert_eq!(
        m.get(&who("a"), &disk.id).await.unwrap().state,
        SessionState::Paused
    );
    assert_eq!(
        runtime.live().len(),
        1,
        "only the memory pause holds a sandbox"
    );
    let ended = m.get(&who("a"), &plain.id).await.unwrap();
    assert_eq!(
        (ended.state, ended.end_reason.as_deref()),
        (SessionState::Stopped, Some("expired"))
    );
    // A paused session's timeout is the retention: the next sweep leaves both alone.
    m.reap_expired().await;
    assert_eq!(
        m.get(&who("a"), &mem.id).await.unwrap().state,
        SessionState::Paused
    );
}

/// A layer missing from this host's cache is fetched back from the blob store and checked: a
/// corrupted blob fails the create instead of being applied.
#[tokio::test]
async fn a_missing_cache_is_refetched_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let m = manager(&store, &runtime, dir.path()).await;
    let s = m.create(&who("a"), CreateSession::default()).await.unwrap();
    sandbox_of(&runtime).put_file("/home/user/kept", b"fetched");
    let snap = m
        .snapshot(&who("a"), &s.id, CreateSnapshot::default())
        .await
        .unwrap();
    let clear_cache = || {
        for e in std::fs::read_dir(dir.path().join("layers"))
            .unwrap()
            .flatten()
        {
            std::fs::remove_file(e.path()).unwrap();
        }
    };
    let from = CreateSession {
        from_snapshot: Some(snap.snapshot_id.clone()),
        ..Default::default()
    };
    clear_cache();
    let copy = m.create(&who("a"), from.clone()).await.unwrap();
    let made = runtime
        .live()
        .into_iter()
        .filter_map(|id| runtime.sandbox(&id))
        .find(|sb| !sb.spec().layers.is_empty())
        .expect("a sandbox made from the layer");
    assert_eq!(
        made.file("/home/user/kept").as_deref(),
        Some(&b"fetched"[..])
    );
    m.destroy(&who("a"), &copy.id).await.unwrap();

    clear_cache();
    let blob = walk_files(&dir.path().join("blobs"))
        .into_iter()
        .find(|p| p.to_string_lossy().contains("lyr-"))
        .expect("the layer's blob");
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    assert_eq!(
        code_of(m.create(&who("a"), from).await),
        ErrorCode::Internal
    );
    assert_eq!(
        cache_files(dir.path()),
        0,
        "a failed fetch leaves no cache file"
    );
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn time_paused_to_disk_does_not_use_session_minutes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store().await;
    store
        .upsert_tenant(&Tenant {
            id: "m".into(),
            name: "m".into(),
            plan: "standard".into(),
            max_sessions: None,
            daily_session_minutes: Some(10),
            created_at: chrono::Utc::now(),
        })
        .await
        .unwrap();
    let start = chrono::Utc::now()
        .date_naive()
        .and_hms_opt(1, 0, 0)
        .unwrap()
        .and_utc();
    let now = Arc::new(std::sync::Mutex::new(start));
    let clock = now.clone();
    let m = Manager::start_with_clock(
        store.clone(),
        Arc::new(MemoryRuntime::new()),
        SessionConfig {
            max_timeout_s: 24 * 3600,
            ..config(dir.path())
        },
        Arc::new(move || *clock.lock().unwrap()),
    )
    .await
    .unwrap();
    let long = || CreateSession {
        timeout_s: Some(12 * 3600),
        ..Default::default()
    };
    let s = m.create(&who("m"), long()).await.unwrap();
    *now.lock().unwrap() = start + chrono::Duration::minutes(2);
    m.pause_session(&who("m"), &s.id, false).await.unwrap();
    // An hour on disk: the tenant has used 2 of its 10 minutes, not 62.
    *now.lock().unwrap() = start + chrono::Duration::minutes(62);
    let other = m.create(&who("m"), long()).await;
    assert!(other.is_ok(), "{:?}", other.err());
    m.destroy(&who("m"), &other.unwrap().id).await.unwrap();
    // Running again, it counts again.
    m.resume(&who("m"), &s.id).await.unwrap();
    *now.lock().unwrap() = start + chrono::Duration::minutes(75);
    assert_eq!(
        code_of(m.create(&who("m"), long()).await),
        ErrorCode::QuotaMinutes
    );
}

/// A snapshot whose request goes away while the session is frozen for its capture (the
/// client hung up) still thaws the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_dropped_midway_leaves_the_session_thawed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, runtime) = (store().await, MemoryRuntime::new());
    let cfg = SessionConfig {
        snapshot_storage_mib: 1024,
        ..config(dir.path())
    };
    let m = Manager::start(store.clone(), Arc::new(runtime.clone()), cfg)
        .await
        .unwrap();
    let s = m.create(&who("a"), CreateSession::default()).await.unwrap();
    let sandbox = sandbox_of(&runtime);
    // Large enough that the capture is still streaming when the request is dropped.
    sandbox.put_file("/home/user/big", &vec![7u8; 64 << 20]);
    let (m2, id) = (m.clone(), s.id.clone());
    let snapshot =
        tokio::spawn(async move { m2.snapshot(&who("a"), &id, CreateSnapshot::default()).await });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sandbox.is_frozen() {
        assert!(
            !snapshot.is_finished(),
            "the capture ended before it was seen frozen"
        );
        assert!(std::time::Instant::now() < deadline, "never frozen");
        tokio::task::yield_now().await;
    }
    snapshot.abort();
    assert!(snapshot.await.unwrap_err().is_cancelled());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sandbox.is_frozen() {
        assert!(
            std::time::Instant::now() < deadline,
            "the session stayed frozen"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
