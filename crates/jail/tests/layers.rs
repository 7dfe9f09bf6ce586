//! Sandboxes made from captured layers: each layer is unpacked once per host into a tree with
//! neutral owners and stacked, id-mapped and read-only, below every such sandbox's own upper
//! layer.

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::{chown, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{root_or_skip, run, runtime, text, Env};
use koder_runtime::{Runtime, RuntimeError, Sandbox, SandboxSpec};

/// The tests count mounts and trees of one runtime each, but share loop devices and cgroups:
/// one at a time keeps failures readable.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

const LIMITS: koder_layer::Limits = koder_layer::Limits {
    max_bytes: 64 << 20,
    max_entries: 10_000,
};

fn spec(layers: &[PathBuf]) -> SandboxSpec {
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    SandboxSpec {
        id: format!("l{}-{n}", std::process::id()),
        image: "host".into(),
        layers: layers.to_vec(),
        limits: koder_runtime::Limits {
            disk_mib: Some(64),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn create(env: &Env, layers: &[PathBuf]) -> Arc<dyn Sandbox> {
    env.runtime
        .create(spec(layers))
        .await
        .expect("create sandbox from layers")
}

/// Captures the directory `tree` into `<dir>/<name>.tar`.
fn capture(tree: &Path, dir: &Path, name: &str) -> PathBuf {
    let root = std::fs::File::open(tree).expect("open tree");
    let tar = dir.join(format!("{name}.tar"));
    let out = std::fs::File::create(&tar).expect("create tar");
    koder_layer::capture(root.as_fd(), out, &LIMITS).expect("capture");
    tar
}

/// A layer as a sandbox's upper layer would hold it: a workspace of `user` (1000), a root-owned
/// file, links to host paths and out of the root, a whiteout of an image file and an opaque
/// directory over one of the image's.
fn base_layer(dir: &Path) -> PathBuf {
    let tree = dir.join("base");
    let ws = tree.join("home/user/proj");
    std::fs::create_dir_all(&ws).expect("mkdir");
    std::fs::write(ws.join("a.txt"), "data\n").expect("write");
    std::fs::write(tree.join("home/user/root-file"), "r").expect("write");
    for p in ["home/user", "home/user/proj", "home/user/proj/a.txt"] {
        chown(tree.join(p), Some(1000), Some(1000)).expect("chown");
    }
    std::os::unix::fs::symlink("/etc", ws.join("etc-link")).expect("symlink");
    std::os::unix::fs::symlink("../../../../..", ws.join("up")).expect("symlink");
    std::fs::create_dir_all(tree.join("etc/ssl")).expect("mkdir");
    std::fs::write(tree.join("etc/ssl/only"), "o").expect("write");
    rustix::fs::setxattr(
        tree.join("etc/ssl"),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .expect("opaque");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        tree.join("etc/hostname"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        rustix::fs::makedev(0, 0),
    )
    .expect("whiteout");
    capture(&tree, dir, "lyr-base")
}

fn trees(env: &Env) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(env.dir.path().join("layers"))
        .expect("trees dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

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

async fn sh(sb: &Arc<dyn Sandbox>, cmd: &str) -> String {
    let out = run(sb, cmd).await;
    assert_eq!(out.exit.exit_code, Some(0), "{cmd}: {}", text(&out.stderr));
    text(&out.stdout)
}

#[tokio::test]
async fn a_layer_is_a_shared_read_only_lower_layer() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("lyr-lower");
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let layer = base_layer(dir.path());
    let a = create(&env, std::slice::from_ref(&layer)).await;
    // Time for the next disk to be made ahead, with the directories a bare upper layer gets,
    // which one above layers must not have: b gets it.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let b = create(&env, std::slice::from_ref(&layer)).await;
    assert!(a.layers_below() && b.layers_below());
    // One tree for both, and nothing of either mounted on the host.
    let unpacked = trees(&env);
    assert_eq!(unpacked.len(), 1, "{unpacked:?}");
    assert!(unpacked[0].starts_with("lyr-base."), "{unpacked:?}");
    assert!(host_mounts_under(env.dir.path()).is_empty());
    // Neutral owners on the host, the sandbox's own inside.
    let tree = env.dir.path().join("layers").join(&unpacked[0]);
    assert_eq!(
        std::fs::metadata(tree.join("home/user/proj/a.txt"))
            .expect("tree")
            .uid(),
        1000
    );

    for sb in [&a, &b] {
        let seen = sh(
            sb,
            "cd /home/user/proj; stat -c '%n %u %g' a.txt ../root-file; readlink etc-link up; \
             ls /etc/ssl; test -e /etc/hostname && echo hostname || echo no-hostname",
        )
        .await;
        assert_eq!(
            seen,
            "a.txt 1000 1000\n../root-file 0 0\n/etc\n../../../../..\nonly\nno-hostname\n"
        );
        // The overlay's options name no host path.
        let mounts = sh(sb, "cat /proc/self/mountinfo").await;
        assert!(
            !mounts.contains(&*env.dir.path().to_string_lossy()),
            "{mounts}"
        );
    }

    // Writes (a change, a deletion, a write as `user`) go to a's upper layer only.
    sh(
        &a,
        "echo mine > /home/user/proj/a.txt; rm /home/user/root-file",
    )
    .await;
    let mut as_user = common::shell("echo u > /home/user/proj/new");
    as_user.uid = Some(1000);
    as_user.gid = Some(1000);
    let out = a.agent().exec_collect(as_user).await.expect("exec");
    assert_eq!(out.exit.exit_code, Some(0), "{}", text(&out.stderr));
    assert_eq!(
        sh(&a, "cat /home/user/proj/a.txt; ls /home/user").await,
        "mine\nproj\n"
    );
    assert_eq!(
        sh(
            &b,
            "cat /home/user/proj/a.txt; ls /home/user; ls /home/user/proj"
        )
        .await,
        "data\nproj\nroot-file\na.txt\netc-link\nup\n"
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("home/user/proj/a.txt")).expect("tree"),
        "data\n"
    );
    assert!(tree.join("home/user/root-file").exists());
    // Through the host-path link: inside the sandbox's /etc (read-only image), never the host's.
    let out = run(&a, "echo pwned > /home/user/proj/etc-link/pwned").await;
    assert_ne!(out.exit.exit_code, Some(0));
    assert!(!Path::new("/etc/pwned").exists());

    // a's own changes, captured, stack onto the layer: deletions stay deleted.
    let delta = {
        let mut cap = a
            .agent()
            .capture_layer(1 << 20, 1000)
            .await
            .expect("capture");
        let mut bytes = Vec::new();
        while let Some(chunk) = cap.next_chunk().await.expect("chunk") {
            bytes.extend(chunk);
        }
        let path = dir.path().join("lyr-delta.tar");
        std::fs::write(&path, bytes).expect("write delta");
        path
    };
    let c = create(&env, &[layer.clone(), delta]).await;
    assert_eq!(
        sh(
            &c,
            "cat /home/user/proj/a.txt /home/user/proj/new; ls /home/user"
        )
        .await,
        "mine\nu\nproj\n"
    );
    assert_eq!(trees(&env).len(), 2);

    // The layer file goes (its snapshot deleted) while sandboxes use it: its tree stays until
    // the last of them ends.
    std::fs::remove_file(&layer).expect("remove layer");
    a.destroy().await.expect("destroy a");
    assert_eq!(sh(&b, "cat /home/user/proj/a.txt").await, "data\n");
    b.destroy().await.expect("destroy b");
    assert_eq!(trees(&env).len(), 2, "c still uses the base tree");
    assert_eq!(sh(&c, "cat /home/user/proj/a.txt").await, "mine\n");
    c.destroy().await.expect("destroy c");
    // Only the delta's tree is left: its layer file still exists.
    let left = trees(&env);
    assert!(
        left.len() == 1 && left[0].starts_with("lyr-delta."),
        "{left:?}"
    );
    assert!(host_mounts_under(env.dir.path()).is_empty());
    // At start-up every tree goes.
    env.runtime.reconcile().await.expect("reconcile");
    assert!(trees(&env).is_empty(), "{:?}", trees(&env));
}

/// A tar with a device node (what no capture writes): unpacking it fails the create and leaves
/// no tree, mount or sandbox dir behind.
fn device_layer(dir: &Path) -> PathBuf {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_path("home").expect("path");
    h.set_mode(0o755);
    h.set_size(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    tar.append(&h, std::io::empty()).expect("dir");
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Char);
    h.set_path("home/null").expect("path");
    h.set_device_major(1).expect("major");
    h.set_device_minor(3).expect("minor");
    h.set_mode(0o666);
    h.set_size(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    tar.append(&h, std::io::empty()).expect("device");
    let path = dir.join("lyr-device.tar");
    std::fs::write(&path, tar.into_inner().expect("tar")).expect("write");
    path
}

#[tokio::test]
async fn a_hostile_layer_fails_the_create_and_leaves_nothing() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("lyr-hostile");
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let layer = device_layer(dir.path());
    match env.runtime.create(spec(&[layer])).await {
        Ok(sb) => {
            let _ = sb.destroy().await;
            panic!("a layer with a device node was used");
        }
        Err(e) => assert!(
            matches!(&e, RuntimeError::Start(m) if m.contains("home/null")),
            "{e}"
        ),
    }
    assert!(trees(&env).is_empty(), "{:?}", trees(&env));
    assert!(host_mounts_under(env.dir.path()).is_empty());
    let sandboxes = std::fs::read_dir(env.dir.path().join("sandboxes")).expect("sandboxes");
    assert_eq!(sandboxes.count(), 0);
}

/// Beyond the lower layers one sandbox stacks, the layers are applied into its upper layer:
/// the same files, and the sandbox says its capture is the whole filesystem.
#[tokio::test]
async fn a_deep_stack_is_applied_instead() {
    let Some(()) = root_or_skip() else { return };
    let _serial = SERIAL.lock().await;
    let env = runtime("lyr-deep");
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let mut stack = vec![base_layer(dir.path())];
    for i in 0..koder_jail::MAX_LOWER_LAYERS {
        let tree = dir.path().join(format!("t{i}"));
        std::fs::create_dir_all(tree.join("home/user")).expect("mkdir");
        std::fs::write(tree.join("home/user/last"), i.to_string()).expect("write");
        stack.push(capture(&tree, dir.path(), &format!("lyr-{i}")));
    }
    let sb = create(&env, &stack).await;
    assert!(!sb.layers_below());
    assert!(trees(&env).is_empty());
    let last = koder_jail::MAX_LOWER_LAYERS - 1;
    assert_eq!(
        sh(
            &sb,
            "cat /home/user/last; echo; cat /home/user/proj/a.txt; ls /etc/ssl"
        )
        .await,
        format!("{last}\ndata\nonly\n")
    );
    sb.destroy().await.expect("destroy");
}
