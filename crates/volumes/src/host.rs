//! [`VolumeHost`]: where volumes live on the host and how they are mounted there.
//!
//! Layout under the volumes directory (every directory 0700, so nothing on a volume is
//! reachable by other host users):
//! - `volumes/<id>.img` (ext4) or `volumes/<id>` (btrfs subvolume): the volumes;
//! - `mnt/<id>`: where an ext4 volume is mounted while the host has it;
//! - `tmp/`: volumes being built, renamed into `volumes/` when complete (a crash leaves only
//!   `tmp/` leftovers, removed by the next [`VolumeHost::open`]);
//! - `trash/<id>.<unix-ts>[.<n>]`: deleted volumes, until [`VolumeHost::purge_trash`].
//!
//! One superblock per ext4 image: the host mount of a volume is made once and kept (across
//! attachments, and across a daemon restart, when it is found again), and when the image is
//! still attached to a loop device (a sandbox's idmapped clone outliving the host mount), that
//! device is mounted again rather than a second one attached.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use koder_hostkit::ext4::{self, Templates};
use koder_hostkit::loopdev;
use parking_lot::Mutex;
use rustix::fs::{RenameFlags, CWD};
use rustix::io::Errno;
use rustix::mount::MountAttrFlags;

use crate::{btrfs, validate_id, Backend, Usage, VolumeError};

const VOLUMES: &str = "volumes";
const MNT: &str = "mnt";
const TMP: &str = "tmp";
const TRASH: &str = "trash";

/// The neutral owner of a volume's root: the sandbox's `user`.
const ROOT_OWNER: (u32, u32) = (1000, 1000);
const ROOT_MODE: u32 = 0o755;

/// Host mounts of volumes: a setuid file owned by neutral uid 0 would be host root's.
const MOUNT_FLAGS: MountAttrFlags = MountAttrFlags::MOUNT_ATTR_NOSUID
    .union(MountAttrFlags::MOUNT_ATTR_NODEV)
    .union(MountAttrFlags::MOUNT_ATTR_NOEXEC);
/// Never panic the host or keep writing to a damaged filesystem. Unlike the jail's scratch
/// disks, volumes keep write barriers: their content must survive a host crash.
const MOUNT_OPTIONS: &CStr = c"errors=remount-ro";

/// The volumes of one host. Cheap to share behind an `Arc`; every method blocks.
#[derive(Debug)]
pub struct VolumeHost {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    backend: Backend,
    templates: Templates,
    slots: Mutex<HashMap<String, Slot>>,
    quota_enabled: AtomicBool,
}

/// In-memory state of a volume that is attached or in an exclusive operation.
#[derive(Debug, Default)]
struct Slot {
    attached: usize,
    exclusive: bool,
}

/// A volume in use: its root stays available on the host while any clone of this lives.
/// Dropping the last one keeps an ext4 volume's host mount for the next attachment.
#[derive(Debug, Clone)]
pub struct Attachment {
    inner: Arc<AttachInner>,
}

#[derive(Debug)]
struct AttachInner {
    shared: Arc<Shared>,
    id: String,
    root: PathBuf,
}

impl Attachment {
    /// The host directory of the volume's root (owned by the neutral 1000:1000).
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    pub fn id(&self) -> &str {
        &self.inner.id
    }
}

impl Drop for AttachInner {
    fn drop(&mut self) {
        let mut slots = self.shared.slots.lock();
        if let Some(slot) = slots.get_mut(&self.id) {
            slot.attached = slot.attached.saturating_sub(1);
            if slot.attached == 0 && !slot.exclusive {
                slots.remove(&self.id);
            }
        }
    }
}

impl VolumeHost {
    /// Opens (creating, mode 0700) the volumes directory `dir`; ext4 templates are built in
    /// `templates_dir`. Leftovers of builds a crashed daemon did not finish are removed.
    pub fn open(dir: &Path, templates_dir: &Path) -> Result<Self, VolumeError> {
        for sub in [None, Some(VOLUMES), Some(MNT), Some(TMP), Some(TRASH)] {
            let path = sub.map_or_else(|| dir.to_path_buf(), |s| dir.join(s));
            make_private_dir(&path)?;
        }
        let statfs = rustix::fs::statfs(dir)
            .map_err(|e| VolumeError::host(format!("statfs {}", dir.display()))(e.into()))?;
        #[allow(clippy::unnecessary_cast)] // f_type's type differs between architectures
        let backend = if statfs.f_type as u64 == btrfs::SUPER_MAGIC {
            Backend::Btrfs
        } else {
            Backend::Ext4Image
        };
        let host = VolumeHost {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                backend,
                templates: Templates::journaled(templates_dir),
                slots: Mutex::new(HashMap::new()),
                quota_enabled: AtomicBool::new(false),
            }),
        };
        host.clean_tmp();
        tracing::info!(dir = %dir.display(), ?backend, "volumes opened");
        Ok(host)
    }

    pub fn backend(&self) -> Backend {
        self.shared.backend
    }

    /// Creates the empty volume `id` of `size_mib` MiB. Nothing is visible until it is
    /// complete; an existing id is `VolumeExists`.
    pub fn create(&self, id: &str, size_mib: u64) -> Result<(), VolumeError> {
        validate_id(id)?;
        let bytes = ext4::size_bytes(size_mib)?;
        let dest = self.volume_path(id);
        if exists(&dest)? {
            return Err(VolumeError::VolumeExists(id.into()));
        }
        let tmp = self.tmp_path(id);
        match self.shared.backend {
            Backend::Btrfs => {
                let guard = OnDrop::new(|| remove_built(Backend::Btrfs, &tmp));
                btrfs::subvolume_create(&tmp)?;
                prepare_root(&tmp)?;
                self.enable_quota()?;
                btrfs::qgroup_limit(bytes, &tmp)?;
                install(&tmp, &dest, id)?;
                guard.disarm();
            }
            Backend::Ext4Image => {
                let guard = OnDrop::new(|| remove_built(Backend::Ext4Image, &tmp));
                let file = self.shared.templates.instantiate(size_mib, &tmp)?;
                drop(file);
                prepare_image_root(&tmp)?;
                sync_file(&tmp)?;
                install(&tmp, &dest, id)?;
                guard.disarm();
            }
        }
        sync_dir(&self.shared.dir.join(VOLUMES));
        Ok(())
    }

    /// Moves the detached volume `id` to the trash (`Busy` while attached); its space is
    /// freed by [`VolumeHost::purge_trash`].
    pub fn delete(&self, id: &str) -> Result<(), VolumeError> {
        validate_id(id)?;
        let _exclusive = self.exclusive(id, "attached")?;
        let src = self.volume_path(id);
        if !exists(&src)? {
            return Err(VolumeError::VolumeNotFound(id.into()));
        }
        if self.shared.backend == Backend::Ext4Image {
            self.unmount(id)?;
        }
        let secs = unix_secs(SystemTime::now());
        for n in 0u32.. {
            let name = match n {
                0 => format!("{id}.{secs}"),
                n => format!("{id}.{secs}.{n}"),
            };
            match rename_noreplace(&src, &self.shared.dir.join(TRASH).join(name)) {
                Ok(()) => break,
                Err(Errno::EXIST) => continue,
                Err(e) => {
                    return Err(VolumeError::host(format!("trash {}", src.display()))(
                        e.into(),
                    ))
                }
            }
        }
        tracing::info!(volume = id, "volume moved to the trash");
        Ok(())
    }

    /// Removes what was deleted at least `grace` ago; returns how many volumes went.
    pub fn purge_trash(&self, grace: Duration) -> Result<usize, VolumeError> {
        let trash = self.shared.dir.join(TRASH);
        let cutoff = unix_secs(SystemTime::now()).saturating_sub(grace.as_secs());
        let mut purged = 0;
        for name in dir_names(&trash)? {
            let Some(deleted) = name.split('.').nth(1).and_then(|s| s.parse::<u64>().ok()) else {
                tracing::warn!(name, "unexpected entry in the volume trash");
                continue;
            };
            if deleted > cutoff {
                continue;
            }
            let path = trash.join(&name);
            match self.shared.backend {
                Backend::Btrfs => btrfs::subvolume_delete(&path)?,
                Backend::Ext4Image => std::fs::remove_file(&path)
                    .map_err(VolumeError::host(format!("remove {}", path.display())))?,
            }
            purged += 1;
        }
        if purged > 0 && self.shared.backend == Backend::Btrfs {
            btrfs::qgroup_clear_stale(&self.shared.dir);
        }
        Ok(purged)
    }

    /// Makes `new_id` a copy of `id` with the same size. btrfs snapshots any time; an ext4
    /// volume must be detached (`Busy` otherwise), its image is copied sharing extents where
    /// the host filesystem can, else sparse.
    pub fn snapshot(&self, id: &str, new_id: &str) -> Result<(), VolumeError> {
        validate_id(id)?;
        validate_id(new_id)?;
        let src = self.volume_path(id);
        let dest = self.volume_path(new_id);
        if !exists(&src)? {
            return Err(VolumeError::VolumeNotFound(id.into()));
        }
        if exists(&dest)? {
            return Err(VolumeError::VolumeExists(new_id.into()));
        }
        let tmp = self.tmp_path(new_id);
        match self.shared.backend {
            Backend::Btrfs => {
                let guard = OnDrop::new(|| remove_built(Backend::Btrfs, &tmp));
                btrfs::subvolume_snapshot(&src, &tmp)?;
                if let (_, Some(limit)) = btrfs::qgroup_usage(&src)? {
                    btrfs::qgroup_limit(limit, &tmp)?;
                }
                install(&tmp, &dest, new_id)?;
                guard.disarm();
            }
            Backend::Ext4Image => {
                let _exclusive = self.exclusive(id, "attached; snapshot it detached")?;
                // A consistent copy needs the filesystem unmounted everywhere: the host's mount
                // goes now, and a device still bound means a sandbox holds it still.
                self.unmount(id)?;
                if loopdev::find_backing(&src)
                    .map_err(VolumeError::host(format!("find the loop device of {id}")))?
                    .is_some()
                {
                    return Err(VolumeError::Busy {
                        id: id.into(),
                        why: "still mounted by a sandbox",
                    });
                }
                let guard = OnDrop::new(|| remove_built(Backend::Ext4Image, &tmp));
                copy_image(&src, &tmp)?;
                install(&tmp, &dest, new_id)?;
                guard.disarm();
            }
        }
        sync_dir(&self.shared.dir.join(VOLUMES));
        Ok(())
    }

    /// Makes the volume's root available on the host; `Busy` during a delete or snapshot.
    pub fn attach(&self, id: &str) -> Result<Attachment, VolumeError> {
        validate_id(id)?;
        let mut slots = self.shared.slots.lock();
        if slots.get(id).is_some_and(|s| s.exclusive) {
            return Err(VolumeError::Busy {
                id: id.into(),
                why: "being deleted or copied",
            });
        }
        // Mounting under the lock: a concurrent first attach of the same volume must find this
        // mount, not make its own.
        let root = match self.shared.backend {
            Backend::Btrfs => {
                let root = self.volume_path(id);
                if !exists(&root)? {
                    return Err(VolumeError::VolumeNotFound(id.into()));
                }
                root
            }
            Backend::Ext4Image => self.ensure_mounted(id)?,
        };
        slots.entry(id.to_owned()).or_default().attached += 1;
        Ok(Attachment {
            inner: Arc::new(AttachInner {
                shared: self.shared.clone(),
                id: id.to_owned(),
                root,
            }),
        })
    }

    /// Space used and the size of volume `id` (an ext4 volume gets mounted for it).
    pub fn usage(&self, id: &str) -> Result<Usage, VolumeError> {
        validate_id(id)?;
        match self.shared.backend {
            Backend::Btrfs => {
                let root = self.volume_path(id);
                if !exists(&root)? {
                    return Err(VolumeError::VolumeNotFound(id.into()));
                }
                // qgroup numbers are updated when a transaction commits.
                let dir = File::open(&root)
                    .map_err(VolumeError::host(format!("open {}", root.display())))?;
                rustix::fs::syncfs(&dir)
                    .map_err(|e| VolumeError::host(format!("sync {}", root.display()))(e.into()))?;
                let (used, limit) = btrfs::qgroup_usage(&root)?;
                Ok(Usage {
                    used_bytes: used,
                    size_bytes: limit.unwrap_or(0),
                })
            }
            Backend::Ext4Image => {
                let attachment = self.attach(id)?;
                let root = File::open(attachment.root())
                    .map_err(VolumeError::host(format!("open volume {id}")))?;
                let st = rustix::fs::fstatvfs(&root)
                    .map_err(|e| VolumeError::host(format!("statvfs volume {id}"))(e.into()))?;
                let size = std::fs::metadata(self.volume_path(id))
                    .map_err(VolumeError::host(format!("stat volume {id}")))?
                    .len();
                Ok(Usage {
                    used_bytes: st.f_blocks.saturating_sub(st.f_bfree) * st.f_frsize,
                    size_bytes: size,
                })
            }
        }
    }

    /// Every volume's id, sorted.
    pub fn list_ids(&self) -> Result<Vec<String>, VolumeError> {
        let mut ids: Vec<String> = dir_names(&self.shared.dir.join(VOLUMES))?
            .into_iter()
            .filter_map(|name| match self.shared.backend {
                Backend::Btrfs => Some(name),
                Backend::Ext4Image => name.strip_suffix(".img").map(str::to_owned),
            })
            .filter(|id| validate_id(id).is_ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Unmounts every host mount of a volume: for the daemon's stop, once no session runs.
    pub fn shutdown(&self) -> Result<(), VolumeError> {
        let _slots = self.shared.slots.lock();
        for name in dir_names(&self.shared.dir.join(MNT))? {
            if validate_id(&name).is_ok() {
                self.unmount(&name)?;
            }
        }
        Ok(())
    }

    fn volume_path(&self, id: &str) -> PathBuf {
        let volumes = self.shared.dir.join(VOLUMES);
        match self.shared.backend {
            Backend::Btrfs => volumes.join(id),
            Backend::Ext4Image => volumes.join(format!("{id}.img")),
        }
    }

    fn tmp_path(&self, id: &str) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        self.shared.dir.join(TMP).join(format!(
            "{id}.{}.{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Marks `id` taken by an exclusive operation until the guard drops.
    fn exclusive(&self, id: &str, why: &'static str) -> Result<Exclusive<'_>, VolumeError> {
        let mut slots = self.shared.slots.lock();
        let slot = slots.entry(id.to_owned()).or_default();
        if slot.attached > 0 || slot.exclusive {
            let why = if slot.exclusive {
                "being deleted or copied"
            } else {
                why
            };
            return Err(VolumeError::Busy { id: id.into(), why });
        }
        slot.exclusive = true;
        Ok(Exclusive {
            host: self,
            id: id.to_owned(),
        })
    }

    /// The host mount of ext4 volume `id`, made now unless it exists (from an earlier
    /// attachment or a previous daemon).
    fn ensure_mounted(&self, id: &str) -> Result<PathBuf, VolumeError> {
        let image = self.volume_path(id);
        if !exists(&image)? {
            return Err(VolumeError::VolumeNotFound(id.into()));
        }
        let mount_point = self.shared.dir.join(MNT).join(id);
        let backing = loopdev::find_backing(&image)
            .map_err(VolumeError::host(format!("find the loop device of {id}")))?;
        if let Some(device) = &backing {
            if is_mounted_from(&mount_point, device) {
                return Ok(mount_point);
            }
        }
        // Whatever else is there (a bind left by a crash mid-mount) goes.
        loopdev::unmount_all(&mount_point).map_err(VolumeError::host(format!(
            "unmount {}",
            mount_point.display()
        )))?;
        make_private_dir(&mount_point)?;
        mount_image(&image, &mount_point, backing.as_deref())?;
        tracing::debug!(volume = id, "volume mounted on the host");
        Ok(mount_point)
    }

    fn unmount(&self, id: &str) -> Result<(), VolumeError> {
        let mount_point = self.shared.dir.join(MNT).join(id);
        loopdev::unmount_all(&mount_point).map_err(VolumeError::host(format!(
            "unmount {}",
            mount_point.display()
        )))?;
        match std::fs::remove_dir(&mount_point) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(VolumeError::host(format!(
                "remove {}",
                mount_point.display()
            ))(e)),
            _ => Ok(()),
        }
    }

    fn enable_quota(&self) -> Result<(), VolumeError> {
        if !self.shared.quota_enabled.load(Ordering::Acquire) {
            btrfs::quota_enable(&self.shared.dir)?;
            self.shared.quota_enabled.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Removes what unfinished builds left in `tmp/`. One daemon per volumes directory, so
    /// nothing there is anyone's work in progress.
    fn clean_tmp(&self) {
        let tmp = self.shared.dir.join(TMP);
        let Ok(names) = dir_names(&tmp) else { return };
        for name in names {
            let path = tmp.join(&name);
            remove_built(self.shared.backend, &path);
            tracing::info!(path = %path.display(), "removed an unfinished volume build");
        }
    }
}

struct Exclusive<'a> {
    host: &'a VolumeHost,
    id: String,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        let mut slots = self.host.shared.slots.lock();
        if let Some(slot) = slots.get_mut(&self.id) {
            slot.exclusive = false;
            if slot.attached == 0 {
                slots.remove(&self.id);
            }
        }
    }
}

/// Mounts the ext4 `image` at `mount_point`: through `device` when one already backs it (its
/// superblock is reused), else through a fresh loop device.
fn mount_image(image: &Path, mount_point: &Path, device: Option<&Path>) -> Result<(), VolumeError> {
    if let Some(device) = device {
        match loopdev::mount_private(device, mount_point, c"ext4", MOUNT_FLAGS, MOUNT_OPTIONS) {
            Ok(()) => return Ok(()),
            // Cleared between the look-up and the mount: attach afresh.
            Err(e) => {
                tracing::debug!(device = %device.display(), error = %e, "reuse of a loop device")
            }
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(VolumeError::host(format!("open {}", image.display())))?;
    // Held until mounted: autoclear must not fire before the mount holds the device.
    let device = loopdev::attach(&file, image)?;
    loopdev::mount_private(
        device.path(),
        mount_point,
        c"ext4",
        MOUNT_FLAGS,
        MOUNT_OPTIONS,
    )
    .map_err(VolumeError::host(format!(
        "mount {} on {}",
        device.path().display(),
        mount_point.display()
    )))
}

/// Whether the filesystem at `mount_point` is the one on block device `device`.
fn is_mounted_from(mount_point: &Path, device: &Path) -> bool {
    match (std::fs::metadata(mount_point), std::fs::metadata(device)) {
        (Ok(mp), Ok(dev)) => mp.dev() == dev.rdev(),
        _ => false,
    }
}

/// Mounts a freshly copied template once to give its root the neutral owner and mode and drop
/// mkfs's `lost+found`.
fn prepare_image_root(image: &Path) -> Result<(), VolumeError> {
    let mount_point = image.with_extension("mnt");
    make_private_dir(&mount_point)?;
    let _cleanup = OnDrop::new(|| {
        let _ = loopdev::unmount_all(&mount_point);
        let _ = std::fs::remove_dir(&mount_point);
    });
    mount_image(image, &mount_point, None)?;
    let lost = mount_point.join("lost+found");
    match std::fs::remove_dir(&lost) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            return Err(VolumeError::host(format!("remove {}", lost.display()))(e))
        }
        _ => {}
    }
    prepare_root(&mount_point)?;
    let root = File::open(&mount_point)
        .map_err(VolumeError::host(format!("open {}", mount_point.display())))?;
    rustix::fs::syncfs(&root)
        .map_err(|e| VolumeError::host(format!("sync {}", mount_point.display()))(e.into()))
}

fn prepare_root(root: &Path) -> Result<(), VolumeError> {
    std::os::unix::fs::chown(root, Some(ROOT_OWNER.0), Some(ROOT_OWNER.1))
        .map_err(VolumeError::host(format!("chown {}", root.display())))?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(ROOT_MODE))
        .map_err(VolumeError::host(format!("chmod {}", root.display())))
}

fn copy_image(src: &Path, dest: &Path) -> Result<(), VolumeError> {
    let from = File::open(src).map_err(VolumeError::host(format!("open {}", src.display())))?;
    let len = from
        .metadata()
        .map_err(VolumeError::host(format!("stat {}", src.display())))?
        .len();
    let to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)
        .map_err(VolumeError::host(format!("create {}", dest.display())))?;
    ext4::clone_or_copy_sparse(&from, &to, len)
        .and_then(|()| to.sync_all())
        .map_err(VolumeError::host(format!(
            "copy {} to {}",
            src.display(),
            dest.display()
        )))
}

/// Renames a complete build into place; an id taken meanwhile is `VolumeExists`.
fn install(tmp: &Path, dest: &Path, id: &str) -> Result<(), VolumeError> {
    match rename_noreplace(tmp, dest) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => Err(VolumeError::VolumeExists(id.into())),
        Err(e) => Err(VolumeError::host(format!("install {}", dest.display()))(
            e.into(),
        )),
    }
}

/// Best-effort removal of a build in `tmp/` (or its leftover mount point).
fn remove_built(backend: Backend, path: &Path) {
    let result = if path.extension().is_some_and(|e| e == "mnt") {
        let _ = loopdev::unmount_all(path);
        std::fs::remove_dir(path).map_err(|e| e.to_string())
    } else if backend == Backend::Btrfs && path.is_dir() {
        btrfs::subvolume_delete(path).map_err(|e| e.to_string())
    } else {
        std::fs::remove_file(path).map_err(|e| e.to_string())
    };
    if let Err(e) = result {
        if path.exists() {
            tracing::warn!(path = %path.display(), error = e, "remove an unfinished volume build");
        }
    }
}

fn rename_noreplace(from: &Path, to: &Path) -> Result<(), Errno> {
    rustix::fs::renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE)
}

fn make_private_dir(path: &Path) -> Result<(), VolumeError> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Err(e) if e.kind() != ErrorKind::AlreadyExists => {
            return Err(VolumeError::host(format!("create {}", path.display()))(e))
        }
        _ => {}
    }
    // An existing directory may have been made with a laxer mode.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(VolumeError::host(format!("chmod {}", path.display())))
}

fn exists(path: &Path) -> Result<bool, VolumeError> {
    path.try_exists()
        .map_err(VolumeError::host(format!("stat {}", path.display())))
}

fn dir_names(dir: &Path) -> Result<Vec<String>, VolumeError> {
    let entries =
        std::fs::read_dir(dir).map_err(VolumeError::host(format!("read {}", dir.display())))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(VolumeError::host(format!("read {}", dir.display())))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    Ok(names)
}

fn sync_file(path: &Path) -> Result<(), VolumeError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(VolumeError::host(format!("sync {}", path.display())))
}

fn sync_dir(dir: &Path) {
    if let Ok(dir) = File::open(dir) {
        let _ = dir.sync_all();
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs a clean-up unless disarmed.
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnDrop<F> {
    fn new(f: F) -> Self {
        OnDrop(Some(f))
    }

    fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

// Sessions keep attachments across tasks and threads, and share the host.
const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<Attachment>();
    shareable::<VolumeHost>();
};
