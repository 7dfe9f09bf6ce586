//! Volumes: mounts the runtime prepared on the host (already id-mapped onto the sandbox's ids,
//! `nosuid`, `nodev`, maybe read-only) and the agent moves to their targets inside the root.
//!
//! Each is cloned ([`open_all`]) before the pivot, while the host path still resolves; the
//! clone keeps the id mapping, and its flags stay locked (the sandbox cannot remount a
//! read-only volume writable). After the pivot and every other mount, [`mount_all`] resolves
//! each target inside the root (symlinks the layers hold are followed, never out of it),
//! creates what is missing and attaches the volume there.
//!
//! In a microVM guest a volume is a virtio-fs share of the host ([`open_shares`]): mounted
//! detached from its tag with `nosuid`, `nodev` (and `rdonly`), then attached the same way.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use std::time::{Duration, Instant};

use koder_agent_protocol::init::{InitVolume, VmVolume};
use koder_agent_protocol::{check_mount_target, check_mount_targets};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags};

use crate::setup_error::{SetupError, Step};

/// A volume cloned from the host, waiting to be attached at `target`.
pub struct Volume {
    tree: OwnedFd,
    target: String,
}

/// Checks every target (again: the agent trusts no one's check) and clones every source.
pub fn open_all(volumes: &[InitVolume]) -> Result<Vec<Volume>, SetupError> {
    let targets: Vec<&str> = volumes.iter().map(|v| v.target.as_str()).collect();
    check_mount_targets(&targets)
        .map_err(invalid)
        .step("check volume targets")?;
    volumes
        .iter()
        .map(|v| {
            let tree = clone_mount(&v.source).step(format!("clone volume for {}", v.target))?;
            Ok(Volume {
                tree,
                target: v.target.clone(),
            })
        })
        .collect()
}

/// A share's device can still be probing when the agent asks for it.
const SHARE_WAIT: Duration = Duration::from_secs(10);

/// Checks every target and mounts every virtio-fs share of a microVM, detached.
pub fn open_shares(volumes: &[VmVolume]) -> Result<Vec<Volume>, SetupError> {
    let targets: Vec<&str> = volumes.iter().map(|v| v.target.as_str()).collect();
    check_mount_targets(&targets)
        .map_err(invalid)
        .step("check volume targets")?;
    volumes
        .iter()
        .map(|v| {
            let tree = mount_share(&v.tag, v.read_only)
                .step(format!("mount volume share {} for {}", v.tag, v.target))?;
            Ok(Volume {
                tree,
                target: v.target.clone(),
            })
        })
        .collect()
}

fn mount_share(tag: &str, read_only: bool) -> std::io::Result<OwnedFd> {
    let mut attrs = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    if read_only {
        attrs |= MountAttrFlags::MOUNT_ATTR_RDONLY;
    }
    let deadline = Instant::now() + SHARE_WAIT;
    loop {
        let fs = rustix::mount::fsopen("virtiofs", FsOpenFlags::FSOPEN_CLOEXEC)?;
        rustix::mount::fsconfig_set_string(&fs, "source", tag)?;
        match rustix::mount::fsconfig_create(&fs) {
            // No device of that tag (yet).
            Err(Errno::NOENT) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
            Ok(()) => {
                return Ok(rustix::mount::fsmount(
                    &fs,
                    FsMountFlags::FSMOUNT_CLOEXEC,
                    attrs,
                )?)
            }
        }
    }
}

/// A detached copy of the mount the runtime prepared at the host path `source` (which the
/// runtime made: no path of the sandbox's), with its id mapping and locked flags.
pub(super) fn clone_mount(source: &str) -> std::io::Result<OwnedFd> {
    Ok(rustix::mount::open_tree(
        rustix::fs::CWD,
        Path::new(source),
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::AT_RECURSIVE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )?)
}

/// Attaches every volume at its target inside the root `/` (call after the pivot).
pub fn mount_all(volumes: Vec<Volume>) -> Result<(), SetupError> {
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
    .step("open root for volumes")?;
    let targets: Vec<String> = volumes.iter().map(|v| v.target.clone()).collect();
    for (i, volume) in volumes.into_iter().enumerate() {
        let others = targets
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, t)| t.as_str());
        attach(root.as_fd(), &volume, others).step(format!("mount volume at {}", volume.target))?;
    }
    Ok(())
}

fn attach<'a>(
    root: BorrowedFd<'_>,
    volume: &Volume,
    others: impl Iterator<Item = &'a str>,
) -> std::io::Result<()> {
    let dir = make_dir_in_root(root, &volume.target)?;
    // A symlink in the layers may lead elsewhere inside the root: where it ends must obey the
    // same rules (not /proc, /sys or /dev; not inside or around another volume).
    let resolved = std::fs::read_link(format!("/proc/self/fd/{}", raw(&dir)))?;
    let resolved = resolved
        .to_str()
        .ok_or_else(|| invalid("resolved target is not UTF-8"))?;
    check_mount_target(resolved).map_err(invalid)?;
    let mut all: Vec<&str> = others.collect();
    all.push(resolved);
    check_mount_targets(&all).map_err(invalid)?;
    rustix::mount::move_mount(
        volume.tree.as_fd(),
        "",
        dir.as_fd(),
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )?;
    Ok(())
}

/// Opens the directory `target` (absolute, checked) inside `root`, creating missing components
/// (owned by the sandbox's root, mode 0755) one at a time. Every lookup starts from `root` and
/// stays inside it (`RESOLVE_IN_ROOT`; no magic links); a component that is not a directory
/// fails the lookup (`ENOTDIR`).
fn make_dir_in_root(root: BorrowedFd<'_>, target: &str) -> std::io::Result<OwnedFd> {
    let mut dir = rustix::io::fcntl_dupfd_cloexec(root, 0)?;
    let mut prefix = String::new();
    for name in target.split('/').filter(|c| !c.is_empty()) {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(name);
        dir = match open_in_root(root, &prefix) {
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                    // Ours: the mode must not depend on the umask.
                    Ok(()) => rustix::fs::chmodat(
                        &dir,
                        name,
                        Mode::from_raw_mode(0o755),
                        rustix::fs::AtFlags::empty(),
                    )?,
                    // A dangling symlink; the lookup below fails on it.
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                open_in_root(root, &prefix)?
            }
            other => other?,
        };
    }
    Ok(dir)
}

/// `RESOLVE_IN_ROOT` answers `EAGAIN` when a mount or rename anywhere on the host (another
/// sandbox starting) might have let a `..` escape; trying again is safe.
fn open_in_root(root: BorrowedFd<'_>, path: &str) -> Result<OwnedFd, Errno> {
    const RETRIES: usize = 64;
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(
            root,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(Errno::AGAIN | Errno::INTR) if tries < RETRIES => tries += 1,
            result => return result,
        }
    }
}

fn raw(fd: &OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

fn invalid(e: impl ToString) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    fn open_root(dir: &Path) -> OwnedFd {
        rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root")
    }

    #[test]
    fn creates_missing_components_with_mode_0755() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("existing")).expect("mkdir");
        let root = open_root(tmp.path());
        let old = rustix::process::umask(Mode::from_raw_mode(0o077));
        let made = make_dir_in_root(root.as_fd(), "/existing/a/b");
        rustix::process::umask(old);
        made.expect("created");
        for dir in ["existing/a", "existing/a/b"] {
            let meta = std::fs::metadata(tmp.path().join(dir)).expect(dir);
            assert!(meta.is_dir());
            assert_eq!(meta.permissions().mode() & 0o7777, 0o755, "{dir}");
            assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        }
        // Already there: opened, not created again.
        make_dir_in_root(root.as_fd(), "/existing/a/b").expect("reopened");
    }

    #[test]
    fn a_symlink_never_leads_out_of_the_root() {
        let outside = tempfile::tempdir().expect("outside");
        let tmp = tempfile::tempdir().expect("tempdir");
        // An absolute link to a real host directory, and a relative one climbing above the root.
        symlink(outside.path(), tmp.path().join("abs")).expect("symlink");
        symlink("../../../../..", tmp.path().join("up")).expect("symlink");
        // The absolute link's target as seen from inside the root.
        let inside_abs = tmp
            .path()
            .join(outside.path().strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(&inside_abs).expect("in-root counterpart");
        let root = open_root(tmp.path());
        make_dir_in_root(root.as_fd(), "/abs/x").expect("abs");
        make_dir_in_root(root.as_fd(), "/up/y").expect("up");
        assert!(
            std::fs::read_dir(outside.path())
                .expect("outside")
                .next()
                .is_none(),
            "created outside the root"
        );
        // Both resolved inside it: the absolute link against the root, `..` stopping at it.
        assert!(inside_abs.join("x").is_dir(), "{}", inside_abs.display());
        assert!(tmp.path().join("y").is_dir());
    }

    #[test]
    fn a_non_directory_component_fails() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join("file"), "x").expect("file");
        symlink("/proc/self/root", tmp.path().join("magic")).expect("symlink");
        symlink("/nowhere/at/all", tmp.path().join("dangling")).expect("symlink");
        let root = open_root(tmp.path());
        let err = make_dir_in_root(root.as_fd(), "/file/x").expect_err("through a file");
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
        make_dir_in_root(root.as_fd(), "/file").expect_err("a file as target");
        // /proc/self/root inside the root does not exist; either way nothing is created on the
        // host's /proc.
        make_dir_in_root(root.as_fd(), "/magic/x").expect_err("magic link");
        make_dir_in_root(root.as_fd(), "/dangling/x").expect_err("dangling link");
    }
}
