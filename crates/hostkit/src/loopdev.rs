//! Loop devices and the mounts on them: attaching an image file read-write with autoclear
//! (`LOOP_CONFIGURE`), finding the device that already backs an image, and mounting a device
//! under a private self-bind so the mount never propagates.
//!
//! Why the self-bind: mount (and unmount) propagation is decided by the *parent* mount. On hosts
//! where the state dir sits on a shared mount (systemd's default), a filesystem mounted directly
//! under it would be copied into every slave mount namespace cloned afterwards (a sandbox's),
//! and a later host unmount would propagate into such a still-peer copy. A private bind of the
//! mount point onto itself, with the filesystem mounted on top, stops both: only an empty bind of
//! the directory ever propagates.

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use koder_runtime::RuntimeError;
use rustix::fs::CWD;
use rustix::io::Errno;
use rustix::mount::{
    fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, move_mount,
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountPropagationFlags, MoveMountFlags, UnmountFlags,
};

/// `LO_FLAGS_*`, `LOOP_*` ioctls and their structs from `<linux/loop.h>`; libc lacks them.
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const LOOP_GET_STATUS64: u32 = 0x4C05;
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

impl LoopInfo64 {
    const ZERO: LoopInfo64 = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: 0,
        lo_file_name: [0; LO_NAME_SIZE],
        lo_crypt_name: [0; LO_NAME_SIZE],
        lo_encrypt_key: [0; LO_KEY_SIZE],
        lo_init: [0; 2],
    };
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
/// Mounts stacked at a mount point by us: the self-bind and the filesystem. More means
/// something else is going on; stop rather than loop.
const MAX_STACKED_MOUNTS: usize = 8;

/// An attached loop device, held open. Autoclear fires once nothing holds the device: keep this
/// until the filesystem on it is mounted, then drop it and the mount keeps the device alive.
#[derive(Debug)]
pub struct LoopDevice {
    /// Never read: held open only, so that autoclear waits for the filesystem.
    _device: File,
    path: PathBuf,
}

impl LoopDevice {
    /// `/dev/loopN`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Attaches `image` (open read-write) to a free loop device, read-write with autoclear and,
/// where the backing filesystem allows it, direct I/O. `name` is only a label (`losetup` shows
/// it); the kernel identifies the backing file by the fd.
pub fn attach(image: &File, name: &Path) -> Result<LoopDevice, RuntimeError> {
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
        let config = loop_config(image, name, direct_io);
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
            return Ok(LoopDevice {
                _device: device,
                path,
            });
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
                    name.display(),
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
            lo_flags: flags,
            lo_file_name: name,
            ..LoopInfo64::ZERO
        },
        reserved: [0; 8],
    }
}

/// The loop device whose backing file is `image` (same device and inode), if one is attached.
/// Mounting that device again reuses its filesystem's superblock instead of creating a second
/// one on the same image.
pub fn find_backing(image: &Path) -> io::Result<Option<PathBuf>> {
    let meta = std::fs::metadata(image)?;
    let entries = match std::fs::read_dir("/sys/block") {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("loop")) else {
            continue;
        };
        // `loop/` exists only while the device is bound to a file.
        if !entry.path().join("loop").exists() {
            continue;
        }
        let device = Path::new("/dev").join(name);
        match backing_of(&device) {
            Ok(Some((dev, ino))) if dev == meta.dev() && ino == meta.ino() => {
                return Ok(Some(device))
            }
            // Unbound meanwhile, or no node for it in this /dev: not ours either way.
            Ok(_) | Err(_) => {}
        }
    }
    Ok(None)
}

/// `(st_dev, st_ino)` of the file backing `device`; `None` when it is unbound.
fn backing_of(device: &Path) -> io::Result<Option<(u64, u64)>> {
    let file = File::open(device)?;
    let mut info = LoopInfo64::ZERO;
    // SAFETY: LOOP_GET_STATUS64 writes one `struct loop_info64` into `info`, which is valid,
    // writable and of the kernel's size (checked above).
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            LOOP_GET_STATUS64 as _,
            &mut info as *mut LoopInfo64,
        )
    };
    if rc == 0 {
        // The kernel reports the backing file's device in the same encoding stat(2) uses.
        return Ok(Some((info.lo_device, info.lo_inode)));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// Mounts `device` (a filesystem of type `fstype`) at `mount_point` (an existing directory) on
/// top of a private bind of `mount_point` onto itself; see the module docs. On failure the
/// bind is undone.
pub fn mount_private(
    device: &Path,
    mount_point: &Path,
    fstype: &CStr,
    flags: MountAttrFlags,
    options: &CStr,
) -> io::Result<()> {
    attach_private(open_fs(device, fstype, flags, options)?, mount_point)
}

/// A filesystem opened and mounted nowhere yet (`fsopen`, `fsconfig`, `fsmount`): the
/// expensive part of a mount (reading the superblock and group descriptors, a millisecond or
/// more for ext4) is done, attaching it is cheap. Closing it unmounts the filesystem, so one
/// held by a daemon that dies leaves nothing mounted behind.
#[derive(Debug)]
pub struct DetachedFs(OwnedFd);

/// Its root, for `*at` calls (or `/proc/self/fd/N/...` paths) before it is attached anywhere.
impl AsFd for DetachedFs {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Opens the `fstype` filesystem on `device` with `options` (`key` or `key=value`, comma
/// separated, as mount(2) takes them) into a [`DetachedFs`] whose mount has `flags`.
pub fn open_fs(
    device: &Path,
    fstype: &CStr,
    flags: MountAttrFlags,
    options: &CStr,
) -> io::Result<DetachedFs> {
    let context = fsopen(fstype, FsOpenFlags::FSOPEN_CLOEXEC)?;
    fsconfig_set_string(&context, "source", device)?;
    let options = options.to_str().map_err(io::Error::other)?;
    // What mount(2) itself does with its data string: split on commas, then at the first `=`.
    for option in options.split(',').filter(|o| !o.is_empty()) {
        match option.split_once('=') {
            Some((key, value)) => fsconfig_set_string(&context, key, value)?,
            None => fsconfig_set_flag(&context, option)?,
        }
    }
    fsconfig_create(&context)?;
    let mount = fsmount(&context, FsMountFlags::FSMOUNT_CLOEXEC, flags)?;
    Ok(DetachedFs(mount))
}

/// Attaches `fs` at `mount_point` (an existing directory) on top of a private bind of
/// `mount_point` onto itself; see the module docs. On failure the bind is undone (and `fs`,
/// dropped, unmounted).
pub fn attach_private(fs: DetachedFs, mount_point: &Path) -> io::Result<()> {
    rustix::mount::mount_bind(mount_point, mount_point)?;
    let stacked = rustix::mount::mount_change(mount_point, MountPropagationFlags::PRIVATE)
        .and_then(|()| {
            move_mount(
                fs.0.as_fd(),
                "",
                CWD,
                mount_point,
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
        })
        // Its parent is private, so this is already private; stated so nothing mounted inside
        // it later propagates anywhere either.
        .and_then(|()| rustix::mount::mount_change(mount_point, MountPropagationFlags::PRIVATE));
    if let Err(e) = stacked {
        let _ = unmount_all(mount_point);
        return Err(e.into());
    }
    Ok(())
}

/// Lazily unmounts everything stacked at `path`; returns how many mounts went.
pub fn unmount_all(path: &Path) -> io::Result<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        rustix::process::geteuid().is_root() && Path::new("/dev/loop-control").exists()
    }

    #[test]
    fn an_attached_image_is_found_by_its_inode_and_cleared_on_close() {
        if !root() {
            eprintln!("skipped: needs root and loop devices");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("img");
        let other = tmp.path().join("other");
        for p in [&image, &other] {
            File::create(p).unwrap().set_len(1 << 20).unwrap();
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&image)
            .unwrap();
        let device = attach(&file, &image).unwrap();
        assert_eq!(
            find_backing(&image).unwrap().as_deref(),
            Some(device.path())
        );
        assert_eq!(find_backing(&other).unwrap(), None);
        let path = device.path().to_path_buf();
        drop(device);
        drop(file);
        // Autoclear: the last close unbinds the device (asynchronously on some kernels).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while find_backing(&image).unwrap().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} still bound",
                path.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
