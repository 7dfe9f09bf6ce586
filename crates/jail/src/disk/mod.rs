//! Size-limited writable layer for a sandbox: a sparse ext4 image on a loop device.
//!
//! Each sandbox gets `<dir>/disk.img`, a sparse copy of a per-size ext4 template (built once with
//! `mkfs.ext4`, never per sandbox), attached to a loop device with `LOOP_CONFIGURE` and mounted at
//! `<dir>/disk` (both through [`koder_hostkit::loopdev`]). The overlay's upper and work
//! directories live inside it, so writing past the size gives `ENOSPC` in the sandbox while the host spends at most that much disk.
//!
//! Disks of the sizes creates ask for are made ahead ([`ReadyDisks`], in `ready`): copied,
//! attached and their filesystems opened, mounted nowhere.
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
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use koder_hostkit::loopdev::{self, unmount_all, DetachedFs};
use koder_hostkit::mode::set_mode;
use koder_runtime::{DiskClone, RuntimeError};
use rustix::io::Errno;
use rustix::ioctl;
use rustix::mount::MountAttrFlags;

mod ready;

pub use koder_hostkit::ext4::{Templates as DiskTemplates, MAX_SIZE_MIB, MIN_SIZE_MIB};
use koder_hostkit::ext4::{OVERLAY_UPPER, OVERLAY_WORK};
pub use ready::ReadyDisks;

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
    /// The host uid (and gid) its files are stored under for the sandbox's 0: the sandbox's
    /// own, or, on a fork's clone, that of the range the cloned disk was made for.
    pub stored_ids_base: u32,
    /// Its upper directory holds the directories sandbox code writes to (`upper::make`),
    /// owned by root still: a disk made ahead had them made then.
    pub upper_dirs_made: bool,
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
        let file = templates.instantiate(size_mib, &image)?;
        // Armed only now: an image that already existed is not ours to delete.
        let undo = Undo(Some(dir.to_path_buf()));
        let disk = OpenDisk::new(&file, &image)?;
        drop(file);
        Self::mount(dir, disk, size_mib, Start::Fresh(owner), undo)
    }

    /// The disk of a fork's copy in `dir` (which exists): a reflink of `clone`, attached and
    /// mounted as [`Disk::create`]'s are. Its files keep the owners they are stored with;
    /// `remap` (a user namespace mapping `clone.stored_ids_base..` onto the copy's range) shows
    /// them as the copy's own, through an id-mapped mount stacked on the disk's, where the
    /// ranges differ. On failure nothing is left behind.
    pub fn from_clone(
        clone: &DiskClone,
        dir: &Path,
        remap: Option<BorrowedFd<'_>>,
    ) -> Result<Disk, RuntimeError> {
        let image = dir.join(IMAGE_NAME);
        let source = File::open(&clone.image)
            .map_err(RuntimeError::io(format!("open {}", clone.image.display())))?;
        let file = create_image(&image)?;
        let undo = Undo(Some(dir.to_path_buf()));
        rustix::fs::ioctl_ficlone(&file, &source)
            .map_err(|e| RuntimeError::io(format!("clone {}", clone.image.display()))(e.into()))?;
        let disk = OpenDisk::new(&file, &image)?;
        drop(file);
        let start = Start::Clone {
            stored_ids_base: clone.stored_ids_base,
            remap,
        };
        Self::mount(dir, disk, clone.size_mib, start, undo)
    }

    /// [`Disk::create`] from a disk `ready` made ahead, when it holds one of this size (and
    /// asks it for the next either way).
    pub fn create_ready(
        ready: &Arc<ReadyDisks>,
        dir: &Path,
        size_mib: u64,
        owner: Option<(u32, u32)>,
    ) -> Result<Disk, RuntimeError> {
        let disk = match ready.take(size_mib, &dir.join(IMAGE_NAME)) {
            Some(disk) => {
                let undo = Undo(Some(dir.into()));
                Self::mount(dir, disk, size_mib, Start::Fresh(owner), undo)
            }
            // The first of its size also builds the template, which the next then copies.
            None => Self::create(ready.templates(), dir, size_mib, owner),
        };
        ready.refill(size_mib);
        disk
    }

    /// Attaches `disk` (the filesystem of `<dir>/disk.img`) at `<dir>/disk`; if anything
    /// fails, dropping it releases the device and `undo` removes the image.
    fn mount(
        dir: &Path,
        disk: OpenDisk,
        size_mib: u64,
        start: Start<'_>,
        mut undo: Undo,
    ) -> Result<Disk, RuntimeError> {
        let image = dir.join(IMAGE_NAME);
        let mount_point = dir.join(MOUNT_NAME);
        match std::fs::DirBuilder::new().mode(0o700).create(&mount_point) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                return Err(RuntimeError::io(format!(
                    "create {}",
                    mount_point.display()
                ))(e))
            }
            _ => {}
        }
        let OpenDisk {
            fs,
            loop_device,
            upper_dirs_made,
        } = disk;
        loopdev::attach_private(fs, &mount_point).map_err(RuntimeError::io(format!(
            "mount {} on {}",
            loop_device.display(),
            mount_point.display()
        )))?;

        let (owner, stored_ids_base) = match start {
            Start::Fresh(owner) => (owner, owner.map_or(0, |(uid, _)| uid)),
            Start::Clone {
                stored_ids_base,
                remap,
            } => {
                if let Some(userns) = remap {
                    crate::volumes::attach_one(
                        &mount_point,
                        false,
                        "a fork's disk",
                        userns,
                        &mount_point,
                    )?;
                }
                // The clone has its directories, owned as the cloned sandbox had them.
                (None, stored_ids_base)
            }
        };
        let (upper, work) = prepare_root(&mount_point, owner)?;
        undo.0 = None;
        Ok(Disk {
            mount_point,
            upper,
            work,
            loop_device,
            image,
            size_mib,
            stored_ids_base,
            upper_dirs_made,
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

/// A disk image's filesystem, opened on its loop device and mounted nowhere yet.
#[derive(Debug)]
struct OpenDisk {
    fs: DetachedFs,
    /// `/dev/loopN`, which the filesystem holds from now on.
    loop_device: PathBuf,
    /// See [`Disk::upper_dirs_made`].
    upper_dirs_made: bool,
}

impl OpenDisk {
    /// Attaches `file` (the image at `image`) to a loop device and opens its filesystem. The
    /// device is held open until the filesystem holds it, so AUTOCLEAR cannot fire before.
    fn new(file: &File, image: &Path) -> Result<Self, RuntimeError> {
        let device = loopdev::attach(file, image)?;
        let fs = loopdev::open_fs(
            device.path(),
            c"ext4",
            MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
            MOUNT_OPTIONS,
        )
        .map_err(RuntimeError::io(format!(
            "open the filesystem of {} on {}",
            image.display(),
            device.path().display()
        )))?;
        Ok(Self {
            fs,
            loop_device: device.path().to_path_buf(),
            upper_dirs_made: false,
        })
    }
}

/// What a disk starts as.
enum Start<'a> {
    /// A copy of the template, its overlay directories given to `owner`.
    Fresh(Option<(u32, u32)>),
    /// A fork's clone, its files stored under `stored_ids_base` and shown through `remap`.
    Clone {
        stored_ids_base: u32,
        remap: Option<BorrowedFd<'a>>,
    },
}

/// Clones the disk image `image` of a live sandbox into the new file `into`, with that disk's
/// filesystem (`fs`: a directory on it) frozen meanwhile: every write it accepted is in the
/// image, and none is half made, as after a clean unmount. `Unsupported` (with nothing left at
/// `into`) where the host filesystem cannot share blocks.
pub fn clone_frozen(fs: BorrowedFd<'_>, image: &Path, into: &Path) -> Result<(), RuntimeError> {
    let source =
        File::open(image).map_err(RuntimeError::io(format!("open {}", image.display())))?;
    let target = create_image(into)?;
    let cloned = Frozen::freeze(fs).and_then(|_thawed_on_drop| {
        rustix::fs::ioctl_ficlone(&target, &source).map_err(|e| match e {
            Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL => RuntimeError::Unsupported(format!(
                "the host filesystem under {} cannot share blocks: {e}",
                image.display()
            )),
            e => RuntimeError::io(format!("clone {}", image.display()))(e.into()),
        })
    });
    if cloned.is_err() {
        let _ = std::fs::remove_file(into);
    }
    cloned
}

/// A new disk image at `path`, the daemon's alone.
fn create_image(path: &Path) -> Result<File, RuntimeError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(RuntimeError::io(format!("create {}", path.display())))
}

/// A filesystem frozen (`FIFREEZE`: its dirty data written, new writes held) until dropped.
/// Freezing needs `CAP_SYS_ADMIN` in the host's user namespace: only the daemon can, never a
/// sandbox.
struct Frozen<'a>(BorrowedFd<'a>);

const FIFREEZE: ioctl::Opcode = ioctl::opcode::read_write::<libc::c_int>(b'X', 119);
const FITHAW: ioctl::Opcode = ioctl::opcode::read_write::<libc::c_int>(b'X', 120);

impl<'a> Frozen<'a> {
    fn freeze(fs: BorrowedFd<'a>) -> Result<Self, RuntimeError> {
        // SAFETY: FIFREEZE takes no argument the kernel reads.
        unsafe { ioctl::ioctl(fs, ioctl::NoArg::<FIFREEZE>::new()) }
            .map_err(|e| RuntimeError::io("freeze a sandbox's disk")(e.into()))?;
        Ok(Self(fs))
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        // SAFETY: FITHAW takes no argument the kernel reads.
        if let Err(e) = unsafe { ioctl::ioctl(self.0, ioctl::NoArg::<FITHAW>::new()) } {
            tracing::error!(error = %e, "thawing a sandbox's disk");
        }
    }
}

/// Whether files in `dir` can share blocks (`FICLONE`), tried on two files made and removed.
pub fn can_clone_in(dir: &Path) -> bool {
    let probe = |name: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(dir.join(name))
    };
    let (a, b) = (".clone-probe-a", ".clone-probe-b");
    let shared = match (probe(a), probe(b)) {
        (Ok(src), Ok(dst)) => {
            use std::io::Write;
            (&src).write_all(&[0; 4096]).is_ok() && rustix::fs::ioctl_ficlone(&dst, &src).is_ok()
        }
        _ => false,
    };
    for name in [a, b] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    shared
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
