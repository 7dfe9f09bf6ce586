//! Shared set-up for the jail integration tests: a runtime on a fresh state dir, using the
//! workspace's freshly built agent.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::sync::Arc;

use koder_agent_protocol::{ExecOutput, ExecRequest};
use koder_jail::{JailConfig, JailRuntime};
use koder_runtime::{Runtime, Sandbox, SandboxSpec};

pub fn agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("KODER_AGENT_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test> → target/<profile>/koder-agent
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = profile_dir.join("koder-agent");
    assert!(
        bin.exists(),
        "{} missing: build it first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

/// Skips (returns None) unless running as root, which real namespaces and cgroups need here.
pub fn root_or_skip() -> Option<()> {
    if rustix::process::geteuid().is_root() {
        Some(())
    } else {
        eprintln!("skipped: jail integration tests need root");
        None
    }
}

pub struct Env {
    pub runtime: JailRuntime,
    pub dir: tempfile::TempDir,
    /// The runtime's cgroup parent, unique to the test.
    pub cgroup_parent: String,
}

/// A runtime with its own state dir under /tmp and its own cgroup parent, so parallel test
/// binaries never reconcile each other's sandboxes away.
pub fn runtime(tag: &str) -> Env {
    let dir = tempfile::Builder::new()
        .prefix("kj-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let mut cfg = JailConfig::new(dir.path(), agent_bin());
    cfg.cgroup_parent = format!("koder-test-{tag}-{}", std::process::id());
    let cgroup_parent = cfg.cgroup_parent.clone();
    let runtime = JailRuntime::new(cfg).expect("jail runtime");
    Env {
        runtime,
        dir,
        cgroup_parent,
    }
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub async fn sandbox(env: &Env) -> Arc<dyn Sandbox> {
    sandbox_with(env, SandboxSpec::default()).await
}

/// A sandbox of `spec` (its limits, egress, ...) under a fresh id, on the `host` image.
pub async fn sandbox_with(env: &Env, spec: SandboxSpec) -> Arc<dyn Sandbox> {
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    env.runtime
        .create(SandboxSpec {
            id: format!("t{}-{n}", std::process::id()),
            image: "host".into(),
            ..spec
        })
        .await
        .expect("create sandbox")
}

pub fn shell(cmd: &str) -> ExecRequest {
    ExecRequest {
        argv: vec!["/bin/bash".into(), "-c".into(), cmd.into()],
        output_limit_bytes: 1 << 20,
        timeout_ms: Some(20_000),
        ..Default::default()
    }
}

pub async fn run(sb: &Arc<dyn Sandbox>, cmd: &str) -> ExecOutput {
    sb.agent().exec_collect(shell(cmd)).await.expect("exec")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Drop for Env {
    /// The runtime leaves its cgroup parent in place for the next run; a test's parent is
    /// unique, so it is removed here once every sandbox in it is gone.
    fn drop(&mut self) {
        // A failed assertion skips the test's own destroy: reconcile kills whatever is left.
        // It runs on a separate thread because a runtime cannot be entered from within one.
        std::thread::scope(|s| {
            s.spawn(|| {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    let _ = rt.block_on(self.runtime.reconcile());
                }
            });
        });
        let parent = &self.cgroup_parent;
        let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        for c in controllers.flatten() {
            let _ = std::fs::remove_dir(c.path().join(parent));
        }
        let _ = std::fs::remove_dir(std::path::Path::new("/sys/fs/cgroup").join(parent));
    }
}
