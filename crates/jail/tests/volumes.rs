//! Volumes in jail sandboxes: id-mapped mounts of host directories whose files keep neutral
//! (sandbox-relative) owners, whichever host range a sandbox runs in.

mod common;

use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{root_or_skip, run, runtime, shell, text, Env};
use koder_runtime::{Runtime, RuntimeError, Sandbox, SandboxSpec, VolumeMount};

/// The tests count this process's children and mounts: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A volume-like host directory: root owned by raw uid 1000 (the sandbox's `user`), mode 0755,
/// holding a file of raw uid 1000 and one of raw uid 0.
fn volume_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("kv-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    std::fs::write(dir.path().join("user-file"), "u").expect("write");
    std::fs::write(dir.path().join("root-file"), "r").expect("write");
    chown(dir.path().join("user-file"), Some(1000), Some(1000)).expect("chown");
    chown(dir.path(), Some(1000), Some(1000)).expect("chown");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

fn mount(source: &Path, target: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        source: source.to_path_buf(),
        target: target.into(),
        read_only,
    }
}

fn spec(volumes: Vec<VolumeMount>) -> SandboxSpec {
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    SandboxSpec {
        id: format!("v{}-{n}", std::process::id()),
        image: "host".into(),
        volumes,
        ..Default::default()
    }
}

async fn create(env: &Env, volumes: Vec<VolumeMount>) -> Arc<dyn Sandbox> {
    env.runtime
        .create(spec(volumes))
        .await
        .expect("create sandbox with volumes")
}

/// Runs `cmd` as the sandbox's `user` (1000).
async fn run_as_user(sb: &Arc<dyn Sandbox>, cmd: &str) -> koder_agent_protocol::ExecOutput {
    let mut req = shell(cmd);
    req.uid = Some(1000);
    req.gid = Some(1000);
    sb.agent().exec_collect(req).await.expect("exec")
}

/// Mount points of the host's mount namespace below `dir`.
fn host_mounts_under(dir: &Path) -> Vec<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let dir = dir.to_string_lossy();
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&*dir))
        .map(String::from)
        .collect()
}

/// Processes whose parent is this test process (agents, and any helper that was not reaped).
/// This process's children but the runtime's own helpers: the network namespaces it holds
/// ready are refilled in the background by short-lived `ip` and `nft` runs.
fn sandbox_children() -> Vec<String> {
    children()
        .into_iter()
        .filter(|stat| !stat.contains("(ip)") && !stat.contains("(nft)"))
        .collect()
}

fn children() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(me.as_str()) {
            found.push(stat);
        }
    }
    found
}

#[tokio::test]
async fn owners_are_neutral_inside_and_on_the_host() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("vol-own");
    let vol = volume_dir();
    let sb = create(&env, vec![mount(vol.path(), "/data", false)]).await;

    let out = run(&sb, "stat -c %u:%g /data /data/user-file /data/root-file").await;
    assert_eq!(
        text(&out.stdout),
        "1000:1000\n1000:1000\n0:0\n",
        "{}",
        text(&out.stderr)
    );
    let out = run_as_user(&sb, "id -u && echo hi > /data/new && stat -c %u /data/new").await;
    assert_eq!(out.exit.exit_code, Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "1000\n1000\n");
    // Sandbox root writes neutral 0.
    let out = run(&sb, "mkdir /data/by-root").await;
    assert_eq!(out.exit.exit_code, Some(0), "{}", text(&out.stderr));

    let new = std::fs::metadata(vol.path().join("new")).expect("written on the host");
    assert_eq!(
        (new.uid(), new.gid()),
        (1000, 1000),
        "not the sandbox's range"
    );
    let by_root = std::fs::metadata(vol.path().join("by-root")).expect("mkdir on the host");
    assert_eq!((by_root.uid(), by_root.gid()), (0, 0));
    assert_eq!(
        std::fs::read_to_string(vol.path().join("new")).expect("read"),
        "hi\n"
    );
    // No setuid or devices through a volume, and the host keeps none of the sandbox's mounts.
    let out = run(&sb, "grep ' /data ' /proc/self/mountinfo").await;
    let line = text(&out.stdout);
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    assert!(host_mounts_under(env.dir.path()).is_empty());
    sb.destroy().await.expect("destroy");
    assert!(
        vol.path().join("new").exists(),
        "teardown touched the volume"
    );
}

#[tokio::test]
async fn read_only_volumes_stay_read_only() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("vol-ro");
    let vol = volume_dir();
    let sb = create(&env, vec![mount(vol.path(), "/data", true)]).await;

    let out = run(&sb, "cat /data/user-file; echo x > /data/user-file").await;
    assert_eq!(text(&out.stdout), "u");
    assert!(
        text(&out.stderr).contains("Read-only file system"),
        "{}",
        text(&out.stderr)
    );
    let out = run(
        &sb,
        "mount -o remount,rw /data; touch /data/x 2>&1 | grep -c Read-only",
    )
    .await;
    assert_eq!(text(&out.stdout), "1\n", "{}", text(&out.stderr));
    // Through the agent's file API too.
    let upload = async {
        let req = koder_agent_protocol::WriteFileRequest {
            path: "/data/api".into(),
            mode: None,
            create_parents: false,
            max_bytes: None,
            owner: None,
            metadata: Vec::new(),
        };
        let mut writer = sb.agent().write_file(req).await?;
        writer.write(b"x").await?;
        writer.finish().await
    };
    let written = upload.await;
    assert!(written.is_err(), "wrote through the agent: {written:?}");
    assert_eq!(
        std::fs::read_to_string(vol.path().join("user-file")).expect("read"),
        "u"
    );
    assert!(!vol.path().join("x").exists() && !vol.path().join("api").exists());
    sb.destroy().await.expect("destroy");
}

#[tokio::test]
async fn two_sandboxes_share_one_directory() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("vol-two");
    let vol = volume_dir();
    let a = create(&env, vec![mount(vol.path(), "/data", false)]).await;
    let b = create(&env, vec![mount(vol.path(), "/workspace/shared", false)]).await;

    let out = run_as_user(&a, "echo from-a > /data/a").await;
    assert_eq!(out.exit.exit_code, Some(0), "{}", text(&out.stderr));
    let out = run_as_user(
        &b,
        "cat /workspace/shared/a && echo from-b > /workspace/shared/b",
    )
    .await;
    assert_eq!(text(&out.stdout), "from-a\n", "{}", text(&out.stderr));
    for (sb, dir) in [(&a, "/data"), (&b, "/workspace/shared")] {
        let out = run(sb, &format!("stat -c %u {dir}/a {dir}/b {dir}/root-file")).await;
        assert_eq!(
            text(&out.stdout),
            "1000\n1000\n0\n",
            "{}",
            text(&out.stderr)
        );
    }
    for name in ["a", "b"] {
        let meta = std::fs::metadata(vol.path().join(name)).expect(name);
        assert_eq!(meta.uid(), 1000, "{name}");
    }
    a.destroy().await.expect("destroy a");
    // The other sandbox's mount is its own.
    let out = run(&b, "cat /workspace/shared/b").await;
    assert_eq!(text(&out.stdout), "from-b\n");
    b.destroy().await.expect("destroy b");
}

/// A layer holding `workspace/evil -> /proc` and `workspace/up -> ../../..`.
fn hostile_layer(dir: &Path) -> PathBuf {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("workspace")).expect("mkdir");
    std::os::unix::fs::symlink("/proc", tree.join("workspace/evil")).expect("symlink");
    std::os::unix::fs::symlink("../../..", tree.join("workspace/up")).expect("symlink");
    let root = std::fs::File::open(&tree).expect("open tree");
    let tar = dir.join("layer.tar");
    let out = std::fs::File::create(&tar).expect("create tar");
    let limits = koder_layer::Limits {
        max_bytes: 1 << 20,
        max_entries: 100,
    };
    use std::os::fd::AsFd;
    koder_layer::capture(root.as_fd(), out, &limits).expect("capture");
    tar
}

async fn refused(env: &Env, spec: SandboxSpec) -> RuntimeError {
    match env.runtime.create(spec).await {
        Ok(sb) => {
            let _ = sb.destroy().await;
            panic!("sandbox with a hostile volume target was created")
        }
        Err(e) => e,
    }
}

#[tokio::test]
async fn hostile_targets_are_refused() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("vol-bad");
    let vol = volume_dir();
    for bad in ["/proc/self", "/dev", "/", "/a/../b", "relative"] {
        let e = refused(&env, spec(vec![mount(vol.path(), bad, false)])).await;
        assert!(matches!(e, RuntimeError::InvalidSpec(_)), "{bad}: {e}");
    }
    let e = refused(
        &env,
        spec(vec![
            mount(vol.path(), "/data", false),
            mount(vol.path(), "/data/x", false),
        ]),
    )
    .await;
    assert!(matches!(e, RuntimeError::InvalidSpec(_)), "{e}");

    // At boot: a symlink in the image (/bin -> usr/bin) resolves inside the root, onto the
    // read-only /usr; one to a file is no directory; links planted in a layer may not lead
    // onto /proc or climb out of the root.
    let layer_dir = tempfile::tempdir().expect("tempdir");
    let layer = hostile_layer(layer_dir.path());
    for (target, why) in [
        ("/bin/vol", "Read-only"),
        ("/etc/localtime/vol", "Not a directory"),
        ("/workspace/evil", "/proc"),
        ("/workspace/evil/x", "/workspace/evil/x"),
    ] {
        let mut s = spec(vec![mount(vol.path(), target, false)]);
        s.layers = vec![layer.clone()];
        let e = refused(&env, s).await.to_string();
        assert!(e.contains(target) && e.contains(why), "{target}: {e}");
    }
    // `..` stops at the root: the volume lands at /vol inside, nowhere on the host.
    let mut s = spec(vec![mount(vol.path(), "/workspace/up/vol", false)]);
    s.layers = vec![layer.clone()];
    let sb = env.runtime.create(s).await.expect("create");
    let out = run(&sb, "stat -c %u /vol/user-file").await;
    assert_eq!(text(&out.stdout), "1000\n", "{}", text(&out.stderr));
    sb.destroy().await.expect("destroy");
    assert!(!Path::new("/vol").exists());
    // Nothing of the failed starts is left.
    assert!(host_mounts_under(env.dir.path()).is_empty());
    let sandboxes = std::fs::read_dir(env.dir.path().join("sandboxes")).expect("sandboxes");
    assert_eq!(sandboxes.count(), 0);
}

#[tokio::test]
async fn nothing_remains_after_destroy() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("vol-gone");
    let vol = volume_dir();
    let other = volume_dir();
    let volumes = vec![
        mount(vol.path(), "/data", false),
        mount(other.path(), "/srv/ro", true),
    ];
    let sb = create(&env, volumes.clone()).await;
    let again = create(&env, volumes).await;
    assert!(host_mounts_under(env.dir.path()).is_empty());
    // The user namespaces behind the id mappings are held by descriptors alone.
    let sandboxes = sandbox_children();
    assert!(
        sandboxes.iter().all(|stat| stat.contains("(koder-agent)")),
        "{sandboxes:?}"
    );
    sb.destroy().await.expect("destroy");
    again.destroy().await.expect("destroy");
    assert!(host_mounts_under(env.dir.path()).is_empty());
    assert!(sandbox_children().is_empty(), "{:?}", sandbox_children());
    let out = env.runtime.reconcile().await.expect("reconcile");
    assert!(out.sandboxes_removed.is_empty(), "{out:?}");
    for v in [&vol, &other] {
        assert!(
            v.path().join("user-file").exists(),
            "volume content removed"
        );
    }
}

/// The host mounts volumes `noexec` for its own sake; inside, their programs run (still without
/// setuid).
#[tokio::test]
async fn programs_on_a_noexec_host_mount_run_inside() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("vol-exec");
    let vol = tempfile::Builder::new()
        .prefix("kv-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    rustix::mount::mount(
        "tmpfs",
        vol.path(),
        "tmpfs",
        rustix::mount::MountFlags::NOEXEC
            | rustix::mount::MountFlags::NOSUID
            | rustix::mount::MountFlags::NODEV,
        c"mode=755,uid=1000,gid=1000,size=1m",
    )
    .expect("mount tmpfs");
    let script = vol.path().join("hello");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let created = env
        .runtime
        .create(spec(vec![mount(vol.path(), "/data", false)]))
        .await;
    let out = match &created {
        Ok(sb) => Some(run(sb, "/data/hello").await),
        Err(_) => None,
    };
    if let Ok(sb) = &created {
        sb.destroy().await.expect("destroy");
    }
    rustix::mount::unmount(vol.path(), rustix::mount::UnmountFlags::DETACH).expect("unmount");
    let out = out.unwrap_or_else(|| panic!("create: {:?}", created.err()));
    assert_eq!(text(&out.stdout), "ran\n", "{}", text(&out.stderr));
}
