//! The manager's volume rules that need no sandbox: what a server without a data dir answers,
//! that microVM sessions refuse volumes, and that bad mount requests are refused before any
//! volume is looked up or claimed. (Real mounts are covered by crates/daemon/tests/volumes.rs.)

use std::sync::Arc;

use koder_api_types::{CreateSession, CreateVolume, ErrorCode, VolumeMountRequest};
use koder_auth::Identity;
use koder_runtime_memory::MemoryRuntime;
use koder_sessions::{quota, Manager, Runtimes, SessionConfig};
use koder_store::{Store, Tenant};

fn who() -> Identity {
    Identity {
        tenant_id: "a".into(),
    }
}

async fn manager(state_dir: Option<&std::path::Path>) -> Arc<Manager> {
    let store = Store::open_in_memory().await.unwrap();
    store
        .upsert_tenant(&Tenant {
            id: "a".into(),
            name: "a".into(),
            plan: "standard".into(),
            max_sessions: None,
            daily_session_minutes: None,
            created_at: chrono::Utc::now(),
        })
        .await
        .unwrap();
    let cfg = SessionConfig {
        pool: Default::default(),
        state_dir: state_dir.map(|d| d.to_path_buf()),
        ..SessionConfig::default()
    };
    let runtimes = Runtimes {
        jail: Arc::new(MemoryRuntime::new()),
        microvm: Ok(Arc::new(MemoryRuntime::new())),
    };
    Manager::start_with_runtimes(store, runtimes, cfg, quota::system_clock())
        .await
        .unwrap()
}

fn mount(name: &str, path: &str) -> VolumeMountRequest {
    VolumeMountRequest {
        name: name.into(),
        path: path.into(),
        read_only: false,
    }
}

#[tokio::test]
async fn without_a_data_dir_volumes_are_not_offered() {
    let m = manager(None).await;
    let create = CreateVolume {
        name: "data".into(),
        size_mib: None,
        from_volume: None,
    };
    let e = m.create_volume(&who(), create).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotImplemented, "{e}");
    let e = m.list_volumes(&who()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotImplemented, "{e}");
}

#[tokio::test]
async fn bad_mounts_are_refused_before_anything_is_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(Some(dir.path())).await;
    // MicroVMs mount volumes too (virtio-fs): the same rules refuse a missing one first.
    let microvm = CreateSession {
        runtime: Some("microvm".into()),
        volumes: vec![mount("data", "/data")],
        ..Default::default()
    };
    let e = m.create(&who(), microvm).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    for bad in [
        vec![mount("data", "/proc/x")],
        vec![mount("data", "/a"), mount("other", "/a/b")],
        vec![mount("data", "/a"), mount("data", "/b")],
        vec![mount("no-such-volume", "/data")],
    ] {
        let req = CreateSession {
            volumes: bad.clone(),
            ..Default::default()
        };
        let e = m.create(&who(), req).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{bad:?}: {e}");
    }
    assert!(m.list(&who()).await.unwrap().is_empty());
}
