//! Volumes and shared session layers in a jail sandbox: host directories mounted through an
//! id mapping onto the sandbox's own ids, so files stored with sandbox-relative ("neutral")
//! owners appear in every sandbox as those owners, whichever host range the sandbox runs in.
//!
//! The host side: each volume's root (or unpacked layer's, see `layers.rs`) is cloned as a
//! detached mount (`open_tree`), given the slot's id mapping, `nosuid` and `nodev` (and
//! `rdonly`: always for a layer) with `mount_setattr`, and attached at `<dir>/volumes/<n>`
//! (`<dir>/layers/<n>`), where the agent (a clone of the host's mount namespace) finds it and
//! clones it again before its pivot; it mounts a volume at its target itself and stacks a layer
//! into its root overlay. Once the agent has been cloned the host's copies are detached
//! ([`detach_host_mounts`]), so no sandbox mount stays visible on the host.
//!
//! Mount layout: `<dir>/volumes` (`<dir>/layers`) is a private bind of the directory onto
//! itself, and the mounts sit under it, for the reasons the top of `disk.rs` gives: mounts
//! directly under a shared parent would be copied into other namespaces, and the host's detach
//! would propagate into the sandbox's copies.
//!
//! Teardown never recurses into those directories ([`remove`] unmounts and only removes empty
//! directories): a volume still mounted there holds a user's files, a layer the files other
//! sandboxes share.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use koder_agent_protocol::init::InitVolume;
use koder_runtime::{RuntimeError, VolumeMount};
use rustix::io::Errno;
use rustix::mount::{MountPropagationFlags, MoveMountFlags, OpenTreeFlags};

use koder_hostkit::loopdev::unmount_all;

use crate::spawn::{self, IdMap};

/// Where a sandbox's volumes are attached on the host, relative to its directory.
pub const VOLUMES_DIR: &str = "volumes";
/// Where its shared session layers are attached.
pub const LAYERS_DIR: &str = "layers";

/// One user namespace per slot, carrying that slot's id mapping (which never changes), made on
/// first use and kept for the runtime's life: only the descriptor, no process, stays.
#[derive(Default)]
pub struct UserNamespaces(Mutex<HashMap<u32, OwnedFd>>);

impl UserNamespaces {
    /// A descriptor of the user namespace with `slot`'s mapping `ids`.
    pub fn for_slot(&self, slot: u32, ids: IdMap) -> Result<OwnedFd, RuntimeError> {
        let mut cache = self
            .0
            .lock()
            .map_err(|_| RuntimeError::Start("user namespace cache poisoned".into()))?;
        let fd = match cache.entry(slot) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(spawn::user_namespace(0, ids)?)
            }
        };
        fd.try_clone()
            .map_err(RuntimeError::io("duplicate user namespace descriptor"))
    }
}

/// Attaches every volume of a sandbox, id-mapped through `userns`, under `<dir>/volumes`, and
/// returns what the agent mounts. `owner` is the host uid/gid of the sandbox's root, which must
/// traverse to them. Whatever fails midway, [`remove`] cleans up.
pub fn attach(
    dir: &Path,
    volumes: &[VolumeMount],
    userns: BorrowedFd<'_>,
    owner: u32,
) -> Result<Vec<InitVolume>, RuntimeError> {
    let sources = volumes.iter().map(|v| {
        let what = format!("volume {} ({})", v.target, v.source.display());
        (v.source.as_path(), v.read_only, what)
    });
    let attached = attach_all(&dir.join(VOLUMES_DIR), sources, userns, owner)?;
    Ok(volumes
        .iter()
        .zip(attached)
        .map(|(volume, at)| InitVolume {
            source: at,
            target: volume.target.clone(),
            read_only: volume.read_only,
        })
        .collect())
}

/// Attaches unpacked layers (`trees`, in the order given), id-mapped through `userns` and
/// read-only, under `<dir>/layers`, and returns their host paths for the agent. As [`attach`].
pub fn attach_layers(
    dir: &Path,
    trees: &[&Path],
    userns: BorrowedFd<'_>,
    owner: u32,
) -> Result<Vec<String>, RuntimeError> {
    let sources = trees
        .iter()
        .map(|t| (*t, true, format!("layer {}", t.display())));
    attach_all(&dir.join(LAYERS_DIR), sources, userns, owner)
}

/// Makes `root` and attaches each `(source, read_only, what)` at `root/<n>`.
fn attach_all<'a>(
    root: &Path,
    sources: impl Iterator<Item = (&'a Path, bool, String)>,
    userns: BorrowedFd<'_>,
    owner: u32,
) -> Result<Vec<String>, RuntimeError> {
    make_private_dir(root, owner)?;
    sources
        .enumerate()
        .map(|(n, (source, read_only, what))| {
            let at = root.join(n.to_string());
            std::fs::create_dir(&at)
                .map_err(RuntimeError::io(format!("create {}", at.display())))?;
            attach_one(source, read_only, &what, userns, &at)?;
            Ok(at.to_string_lossy().into_owned())
        })
        .collect()
}

/// `<dir>/volumes`, owned by the sandbox's root, as a private self-bind.
fn make_private_dir(root: &Path, owner: u32) -> Result<(), RuntimeError> {
    let err = |what: &str| RuntimeError::io(format!("{what} {}", root.display()));
    std::fs::create_dir(root).map_err(err("create"))?;
    std::os::unix::fs::chown(root, Some(owner), Some(owner)).map_err(err("chown"))?;
    koder_hostkit::mode::set_mode(root, 0o700)?;
    let errno = |what: &str| {
        let e = err(what);
        move |x: Errno| e(io::Error::from(x))
    };
    rustix::mount::mount_bind(root, root).map_err(errno("bind-mount onto itself"))?;
    rustix::mount::mount_change(root, MountPropagationFlags::PRIVATE).map_err(errno("make private"))
}

/// Mounts a clone of the mount tree at `source`, id-mapped through `userns` (and read-only if
/// asked), at `at`: on top of whatever is mounted there already when `at` is `source`.
pub fn attach_one(
    source: &Path,
    read_only: bool,
    what: &str,
    userns: BorrowedFd<'_>,
    at: &Path,
) -> Result<(), RuntimeError> {
    let err = |step: &str| RuntimeError::io(format!("{what}: {step}"));
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        source,
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::AT_RECURSIVE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| err("clone")(e.into()))?;
    set_idmapped(tree.as_fd(), userns, read_only).map_err(err("id-map"))?;
    rustix::mount::move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        at,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| err(&format!("attach at {}", at.display()))(e.into()))
}

/// `mount_setattr(2)` on the detached tree `tree` (every mount in it): ids through `userns`'s
/// mapping, no setuid, no devices, read-only if asked. `noexec` is cleared: the host mounts
/// volumes `noexec` for its own sake, while sandbox code may run what it keeps there. rustix
/// has no binding for `mount_setattr`, so this is the raw syscall with libc's
/// `struct mount_attr`.
fn set_idmapped(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>, read_only: bool) -> io::Result<()> {
    let mut set = libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if read_only {
        set |= libc::MOUNT_ATTR_RDONLY;
    }
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: libc::MOUNT_ATTR_NOEXEC,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: both descriptors are open for the call, the path is a NUL-terminated empty string
    // and `attr` a fully initialised `struct mount_attr` whose size is passed; the kernel only
    // reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lazily unmounts the host's copies of the sandbox's volumes and layers (the self-binds and
/// everything under them). Call it once the agent has been cloned: the sandbox's mount
/// namespace keeps its own copies, which this does not reach.
pub fn detach_host_mounts(dir: &Path) -> Result<(), RuntimeError> {
    for sub in [VOLUMES_DIR, LAYERS_DIR] {
        let root = dir.join(sub);
        if root.exists() {
            unmount_all(&root).map_err(RuntimeError::io(format!("unmount {}", root.display())))?;
        }
    }
    Ok(())
}

/// Removes `<dir>/volumes` and `<dir>/layers` for teardown and crash reconciliation: unmounts
/// whatever the host still has there, then removes the (then empty) directories, never their
/// contents. `Ok` when there are none. An error means a volume or layer may still be attached:
/// the caller must not remove the sandbox's directory recursively.
pub fn remove(dir: &Path) -> Result<(), RuntimeError> {
    for sub in [VOLUMES_DIR, LAYERS_DIR] {
        remove_mounts(&dir.join(sub))?;
    }
    Ok(())
}

fn remove_mounts(root: &Path) -> Result<(), RuntimeError> {
    let fail = |what: &Path| {
        let context = format!("remove mount {}", what.display());
        move |e: io::Error| RuntimeError::Teardown(format!("{context}: {e}"))
    };
    unmount_all(root).map_err(fail(root))?;
    let entries = match std::fs::read_dir(root) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other.map_err(fail(root))?,
    };
    for entry in entries {
        let path: PathBuf = entry.map_err(fail(root))?.path();
        unmount_all(&path).map_err(fail(&path))?;
        std::fs::remove_dir(&path).map_err(fail(&path))?;
    }
    std::fs::remove_dir(root).map_err(fail(root))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mounted(path: &Path) -> bool {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let path = path.to_string_lossy();
        mountinfo
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(&*path))
    }

    /// What a crash between attach and detach leaves: `remove` (teardown, reconciliation)
    /// unmounts it and removes only the empty mount points.
    #[test]
    fn leftovers_are_unmounted_and_volumes_kept() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: idmapped mounts need root");
            return;
        }
        let dir = tempfile::tempdir_in("/tmp").expect("sandbox dir");
        let source = tempfile::tempdir_in("/tmp").expect("volume");
        std::fs::write(source.path().join("kept"), "x").expect("write");
        std::os::unix::fs::chown(source.path().join("kept"), Some(1000), Some(1000))
            .expect("chown");
        let ids = IdMap {
            host_base: 300_000,
            count: 65536,
        };
        let userns = spawn::user_namespace(0, ids).expect("user namespace");
        let volume = VolumeMount {
            source: source.path().into(),
            target: "/data".into(),
            read_only: false,
        };
        let init = attach(dir.path(), &[volume], userns.as_fd(), ids.host_base).expect("attach");
        let at = dir.path().join(VOLUMES_DIR).join("0");
        assert_eq!(init[0].source, at.to_string_lossy());
        assert!(mounted(&at));
        // Through the mapping, neutral 1000 is the sandbox range's 1000.
        let seen = std::fs::metadata(at.join("kept")).expect("through the mount");
        assert_eq!(seen.uid(), ids.host_base + 1000);

        remove(dir.path()).expect("remove");
        assert!(!mounted(&at) && !dir.path().join(VOLUMES_DIR).exists());
        assert!(source.path().join("kept").exists());
        remove(dir.path()).expect("idempotent");
    }

    /// Something that is not an empty mount point under `volumes/` stops teardown short of
    /// recursing into it.
    #[test]
    fn remove_never_deletes_contents() {
        let dir = tempfile::tempdir().expect("dir");
        let stray = dir.path().join(VOLUMES_DIR).join("0");
        std::fs::create_dir_all(&stray).expect("mkdir");
        std::fs::write(stray.join("file"), "x").expect("write");
        remove(dir.path()).expect_err("non-empty mount point removed");
        assert!(stray.join("file").exists());
    }
}
