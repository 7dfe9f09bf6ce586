//! Size-limited writable layer for a sandbox: a sparse ext4 image on a loop device.
//!
//! Each sandbox gets `<dir>/disk.img`, a sparse copy of a per-size ext4 template (built once with
//! `mkfs.ext4`, never per sandbox), attached to a loop device with `LOOP_CONFIGURE` and mounted at
//! `<dir>/disk` (both through [`koder_hostkit::loopdev`]). The overlay's upper and work
//! directories live inside it, so writing past the size gives `ENOSPC` in the sandbox while the host spends at most that much disk.
//!
//! Lifetime: once the sandbox has been cloned, [`Disk::detach_host_mount`] lazily
//! unmounts the host's copy. From then on only the sandbox's mount namespace holds the
//! filesystem; when its last process dies the filesystem goes away and the loop device clears
//! itself (`LO_FLAGS_AUTOCLEAR`). [`remove`] cleans up whatever is left (failed starts, crashes).
//!
//! Mount layout at `<dir>/disk` on the host: a private bind of the directory onto itself with the
//! ext4 mount on top ([`loopdev::mount_private`] says why), so the host's lazy unmount never
//! propagates into the sandbox's copy.

use std::ffi::CStr;
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use koder_hostkit::loopdev::{self, unmount_all};
use koder_hostkit::mode::set_mode;
use koder_runtime::RuntimeError;
use rustix::mount::MountFlags;

pub use koder_hostkit::ext4::{Templates as DiskTemplates, MAX_SIZE_MIB, MIN_SIZE_MIB};
use koder_hostkit::ext4::{OVERLAY_UPPER, OVERLAY_WORK};

/// The sandbox's image file, relative to its directory.
pub const IMAGE_NAME: &str = "disk.img";
/// Where the image is mounted on the host, relative to the sandbox's directory.
pub const MOUNT_NAME: &str = "disk";

/// ext4 mount options:
/// - `noinit_itable`: the image's unused inode tables are holes that already read as zeros, so
///   the background zeroing thread would only burn I/O;
/// - `nobarrier`: the disk is scratch space deleted at teardown and worthless after a host
///   crash, so a sandbox's `fsync` need not force host cache flushes (which a loop of fsyncs
///   would otherwise turn into host-wide I/O pressure);
/// - `errors=remount-ro`: never panic the host or keep writing to a damaged filesystem.
///
/// Delayed allocation stays on: ext4 reserves blocks at `write()` time, so `ENOSPC` is still
/// reported by the write that does not fit, and builds keep their speed.
const MOUNT_OPTIONS: &CStr = c"noinit_itable,nobarrier,errors=remount-ro";

/// A sandbox's mounted disk. Dropping it changes nothing: the mount lives until
/// [`Disk::detach_host_mount`] (and the sandbox's end) or [`remove`].
#[derive(Debug, Clone)]
pub struct Disk {
    /// `<dir>/disk`: the filesystem's root on the host until detached.
    pub mount_point: PathBuf,
    /// The overlay upper directory.
    pub upper: PathBuf,
    /// The overlay work directory.
    pub work: PathBuf,
    /// `/dev/loopN`; it clears itself once nothing holds the filesystem.
    pub loop_device: PathBuf,
    /// `<dir>/disk.img`, the sparse backing file.
    pub image: PathBuf,
    pub size_mib: u64,
}

impl Disk {
    /// Creates, attaches and mounts a `size_mib` disk for the sandbox in `dir` (which exists),
    /// with `upper` and `work` owned by `owner` (host uid/gid of the sandbox's root; `None`
    /// leaves them to root). On failure nothing is left behind.
    pub fn create(
        templates: &DiskTemplates,
        dir: &Path,
        size_mib: u64,
        owner: Option<(u32, u32)>,
    ) -> Result<Disk, RuntimeError> {
        let image = dir.join(IMAGE_NAME);
        let mount_point = dir.join(MOUNT_NAME);

        let file = templates.instantiate(size_mib, &image)?;
        // Armed only now: an image that already existed is not ours to delete.
        let mut undo = Undo(Some(dir.to_path_buf()));

        // Holding the device open keeps AUTOCLEAR from firing until the mount holds it; if
        // anything below fails, closing it releases the device.
        let device = loopdev::attach(&file, &image)?;
        drop(file);

        match std::fs::DirBuilder::new().mode(0o700).create(&mount_point) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                return Err(RuntimeError::io(format!(
                    "create {}",
                    mount_point.display()
                ))(e))
            }
            _ => {}
        }
        loopdev::mount_private(
            device.path(),
            &mount_point,
            c"ext4",
            MountFlags::NOSUID | MountFlags::NODEV,
            MOUNT_OPTIONS,
        )
        .map_err(RuntimeError::io(format!(
            "mount {} on {}",
            device.path().display(),
            mount_point.display()
        )))?;
        let loop_device = device.path().to_path_buf();
        drop(device);

        let (upper, work) = prepare_root(&mount_point, owner)?;
        undo.0 = None;
        Ok(Disk {
            mount_point,
            upper,
            work,
            loop_device,
            image,
            size_mib,
        })
    }

    /// Lazily unmounts the host's copy of the disk, leaving the sandbox's mount namespace the
    /// only holder. Call it once the sandbox has been cloned: any time after that is safe (the
    /// unmount does not propagate into the sandbox's copy, whatever the host's propagation);
    /// before, it destroys the disk. Does not remove the mount point: see [`remove`].
    pub fn detach_host_mount(&self) -> Result<(), RuntimeError> {
        unmount_all(&self.mount_point)
            .map(drop)
            .map_err(RuntimeError::io(format!(
                "unmount {}",
                self.mount_point.display()
            )))
    }
}

/// Best-effort removal of the disk of the sandbox in `dir`, for failed creations: [`unmount`],
/// then delete the image. The loop device clears itself once the sandbox (if any) is gone.
/// `Ok` when there is no disk.
pub fn remove(dir: &Path) -> Result<(), RuntimeError> {
    let mut problems = Vec::new();
    if let Err(e) = unmount(dir) {
        problems.push(e.to_string());
    }
    let image = dir.join(IMAGE_NAME);
    match std::fs::remove_file(&image) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            problems.push(format!("remove {}: {e}", image.display()))
        }
        _ => {}
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::Teardown(problems.join("; ")))
    }
}

/// Unmounts `<dir>/disk` if the host still has it mounted and removes the mount point, for
/// teardown and crash reconciliation, which delete the image with the sandbox's directory.
/// `Ok` when there is no disk.
///
/// Removing the mount point also detaches copies of mounts on it in other mount namespaces,
/// a live sandbox's included: call this after the sandbox is dead.
pub fn unmount(dir: &Path) -> Result<(), RuntimeError> {
    let mount_point = dir.join(MOUNT_NAME);
    let problem = match unmount_all(&mount_point) {
        Ok(_) => match std::fs::remove_dir(&mount_point) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                format!("remove {}: {e}", mount_point.display())
            }
            _ => return Ok(()),
        },
        Err(e) => format!("unmount {}: {e}", mount_point.display()),
    };
    Err(RuntimeError::Teardown(problem))
}

/// Gives the disk's root the overlay's `upper` and `work` directories, owned by `owner`. An
/// overlay template ([`DiskTemplates::overlay`]) has them already, so then this only chowns;
/// other templates still have mkfs's `lost+found`, which goes.
fn prepare_root(
    root: &Path,
    owner: Option<(u32, u32)>,
) -> Result<(PathBuf, PathBuf), RuntimeError> {
    let upper = root.join(OVERLAY_UPPER);
    let work = root.join(OVERLAY_WORK);
    if !upper.is_dir() {
        lay_out(root, &upper, &work)?;
    }
    if let Some((uid, gid)) = owner {
        for dir in [&upper, &work] {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(RuntimeError::io(format!("chown {}", dir.display())))?;
        }
    }
    Ok((upper, work))
}

/// What [`DiskTemplates::overlay`] bakes in, for a disk made from a plain template.
fn lay_out(root: &Path, upper: &Path, work: &Path) -> Result<(), RuntimeError> {
    let lost = root.join("lost+found");
    match std::fs::remove_dir(&lost) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            return Err(RuntimeError::io(format!("remove {}", lost.display()))(e))
        }
        _ => {}
    }
    // Sandbox uids only need to pass through to their directories.
    set_mode(root, 0o711)?;
    // upper's mode becomes the mode of the sandbox's `/`.
    for (dir, mode) in [(upper, 0o755), (work, 0o700)] {
        std::fs::create_dir(dir).map_err(RuntimeError::io(format!("create {}", dir.display())))?;
        set_mode(dir, mode)?;
    }
    Ok(())
}

/// Removes a half-built disk when `create` fails.
struct Undo(Option<PathBuf>);

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            if let Err(e) = remove(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cleanup after failed disk creation");
            }
        }
    }
}
