//! Size-limited writable layer for a sandbox: a sparse ext4 image on a loop device.
//!
//! Each sandbox gets `<dir>/disk.img`, a sparse copy of a per-size ext4 template (built once with
//! `mkfs.ext4`, never per sandbox), attached to a loop device with `LOOP_CONFIGURE` and mounted at
//! `<dir>/disk`. The overlay's upper and work directories live inside it, so writing past the
//! size gives `ENOSPC` in the sandbox while the host spends at most that much disk.
//!
//! Lifetime: once the sandbox has been cloned, [`Disk::detach_host_mount`] lazily
//! unmounts the host's copy. From then on only the sandbox's mount namespace holds the
//! filesystem; when its last process dies the filesystem goes away and the loop device clears
//! itself (`LO_FLAGS_AUTOCLEAR`). [`remove`] cleans up whatever is left (failed starts, crashes).
//!
//! Mount layout at `<dir>/disk` on the host: a private bind of the directory onto itself with the
//! ext4 mount on top. Unmount (and mount) propagation is decided by the *parent* mount: on hosts
//! where the state dir sits on a shared mount (systemd's default), an ext4 mount placed directly
//! under it would be copied into every slave namespace on creation, and the host's lazy unmount
//! would propagate into the sandbox's still-peer copy and tear its disk away. The private
//! self-bind parent stops both; only an empty bind of the directory ever propagates.

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use koder_hostkit::mode::set_mode;
use koder_runtime::RuntimeError;
use rustix::io::Errno;
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

pub use koder_hostkit::ext4::{Templates as DiskTemplates, MAX_SIZE_MIB, MIN_SIZE_MIB};

/// The sandbox's image file, relative to its directory.
pub const IMAGE_NAME: &str = "disk.img";
/// Where the image is mounted on the host, relative to the sandbox's directory.
pub const MOUNT_NAME: &str = "disk";

/// `LO_FLAGS_*`, `LOOP_*` ioctls and their structs from `<linux/loop.h>`; libc lacks them.
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const LOOP_CONFIGURE: u32 = 0x4C0A;
const LOOP_CTL_GET_FREE: u32 = 0x4C82;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

// The kernel ABI sizes; a layout mistake here would make the ioctl read garbage.
const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// Another attacher can take the device `LOOP_CTL_GET_FREE` handed us before we configure it.
const ATTACH_ATTEMPTS: u32 = 32;
/// Mounts stacked at a mount point by us: the self-bind and the ext4 mount. More means
/// something else is going on; stop rather than loop.
const MAX_STACKED_MOUNTS: usize = 8;

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
        let (device, loop_device) = attach_loop(&file, &image)?;
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
        let mount_err = |what: &str| {
            let context = format!("{what} {}", mount_point.display());
            move |e: Errno| RuntimeError::io(context)(io::Error::from(e))
        };
        rustix::mount::mount_bind(&mount_point, &mount_point)
            .map_err(mount_err("bind-mount onto itself"))?;
        rustix::mount::mount_change(&mount_point, MountPropagationFlags::PRIVATE)
            .map_err(mount_err("make private"))?;
        rustix::mount::mount(
            &loop_device,
            &mount_point,
            "ext4",
            MountFlags::NOSUID | MountFlags::NODEV,
            MOUNT_OPTIONS,
        )
        .map_err(mount_err(&format!("mount {} on", loop_device.display())))?;
        // Its parent is private, so this is already private; stated so nothing mounted inside
        // it later propagates anywhere either.
        rustix::mount::mount_change(&mount_point, MountPropagationFlags::PRIVATE)
            .map_err(mount_err("make private"))?;
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

/// Best-effort removal of the disk of the sandbox in `dir`, for teardown and crash
/// reconciliation: unmounts `<dir>/disk` if the host still has it mounted, removes the mount
/// point and deletes the image. The loop device clears itself once the sandbox (if any) is
/// gone. `Ok` when there is no disk.
///
/// Removing the mount point also detaches copies of mounts on it in other mount namespaces,
/// a live sandbox's included: call this after the sandbox is dead.
pub fn remove(dir: &Path) -> Result<(), RuntimeError> {
    let mut problems = Vec::new();
    let mount_point = dir.join(MOUNT_NAME);
    match unmount_all(&mount_point) {
        Ok(_) => match std::fs::remove_dir(&mount_point) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                problems.push(format!("remove {}: {e}", mount_point.display()))
            }
            _ => {}
        },
        Err(e) => problems.push(format!("unmount {}: {e}", mount_point.display())),
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

/// Attaches `file` to a free loop device with autoclear; returns the open device (keep it open
/// until the filesystem is mounted) and its path.
fn attach_loop(file: &File, image: &Path) -> Result<(File, PathBuf), RuntimeError> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| RuntimeError::Unavailable(format!("/dev/loop-control: {e}")))?;
    let mut direct_io = true;
    let mut last = None;
    let mut attempt = 0;
    while attempt < ATTACH_ATTEMPTS {
        attempt += 1;
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(RuntimeError::io("find a free loop device")(
                io::Error::last_os_error(),
            ));
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let device = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(d) => d,
            // Removed by someone else between GET_FREE and open.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(RuntimeError::io(format!("open {}", path.display()))(e)),
        };
        let config = loop_config(file, image, direct_io);
        // SAFETY: `config` is a fully initialised `struct loop_config` that outlives the call;
        // the kernel only reads it.
        let rc = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_CONFIGURE as _,
                &config as *const LoopConfig,
            )
        };
        if rc == 0 {
            return Ok((device, path));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // Another attacher configured this device first, or it is being torn down.
            Some(libc::EBUSY) | Some(libc::ENXIO) => last = Some(err),
            // Direct I/O is an optimisation (no double caching of the image); some backing
            // filesystems or kernels refuse it.
            Some(libc::EINVAL) if direct_io => {
                direct_io = false;
                attempt -= 1;
                last = Some(err);
            }
            _ => {
                return Err(RuntimeError::io(format!(
                    "attach {} to {}",
                    image.display(),
                    path.display()
                ))(err))
            }
        }
    }
    Err(RuntimeError::Exhausted(format!(
        "no loop device could be attached after {ATTACH_ATTEMPTS} attempts: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

fn loop_config(file: &File, image: &Path, direct_io: bool) -> LoopConfig {
    let mut name = [0u8; LO_NAME_SIZE];
    // Diagnostics only (shown by losetup); the kernel's backing_file comes from the fd.
    let bytes = image.as_os_str().as_encoded_bytes();
    let n = bytes.len().min(LO_NAME_SIZE - 1);
    name[..n].copy_from_slice(&bytes[..n]);
    let mut flags = LO_FLAGS_AUTOCLEAR;
    if direct_io {
        flags |= LO_FLAGS_DIRECT_IO;
    }
    LoopConfig {
        fd: file.as_raw_fd() as u32,
        // 0 lets the kernel pick (the backing device's logical block size under direct I/O).
        block_size: 0,
        info: LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: flags,
            lo_file_name: name,
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        },
        reserved: [0; 8],
    }
}

/// Replaces mkfs's root contents with the overlay's `upper` and `work` directories.
fn prepare_root(
    root: &Path,
    owner: Option<(u32, u32)>,
) -> Result<(PathBuf, PathBuf), RuntimeError> {
    let lost = root.join("lost+found");
    match std::fs::remove_dir(&lost) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            return Err(RuntimeError::io(format!("remove {}", lost.display()))(e))
        }
        _ => {}
    }
    // Sandbox uids only need to pass through to their directories.
    set_mode(root, 0o711)?;
    let upper = root.join("upper");
    let work = root.join("work");
    // upper's mode becomes the mode of the sandbox's `/`.
    for (dir, mode) in [(&upper, 0o755), (&work, 0o700)] {
        std::fs::create_dir(dir).map_err(RuntimeError::io(format!("create {}", dir.display())))?;
        set_mode(dir, mode)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(RuntimeError::io(format!("chown {}", dir.display())))?;
        }
    }
    Ok((upper, work))
}

/// Lazily unmounts everything stacked at `path`; returns how many mounts went.
fn unmount_all(path: &Path) -> io::Result<usize> {
    for n in 0..MAX_STACKED_MOUNTS {
        match rustix::mount::unmount(path, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            Ok(()) => {}
            // Not (or no longer) a mount point, or no such path: nothing left to unmount.
            Err(Errno::INVAL | Errno::NOENT) => return Ok(n),
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::other(format!(
        "still a mount point after {MAX_STACKED_MOUNTS} unmounts"
    )))
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
