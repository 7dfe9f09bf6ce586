//! Disks made ahead, so that a create with no warm sandbox to hand out only renames an image
//! into its sandbox's directory and attaches a filesystem already opened.
//!
//! Making one is the copy of the template (an extent walk of a sparse file, up to milliseconds
//! on a busy ext4), the loop device's set-up (a millisecond) and the filesystem's (another),
//! done on a thread of its own. How many are held follows demand: one per size at first, more
//! for a size whose creates came faster than one refill.

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use koder_runtime::RuntimeError;

use super::{DiskTemplates, OpenDisk, OVERLAY_UPPER};
use crate::{lock, upper};
use koder_hostkit::mode::set_mode;

/// How long after a create took a ready disk its refill starts: not beside that create, whose
/// mount, clone and agent start would share the cores and the loop driver with the copy.
const REFILL_DELAY: Duration = Duration::from_millis(30);

/// The most disks of one size held ready. A size's depth starts at one and doubles each time a
/// create of it finds none ready (creates arriving faster than the refill's delay), up to this.
const MAX_DEPTH: usize = 4;

/// How many sizes are stocked: the most recently asked. A tenant asking for many sizes in turn
/// must not make the daemon hold a loop device and a mounted filesystem for each.
const MAX_SIZES: usize = 4;

/// Disk images made ahead for the sizes creates asked for most recently, each attached to its
/// loop device with its filesystem opened. Nothing is mounted on the host meanwhile (the
/// filesystem's mount is detached: a descriptor, in no mount table) and the devices are
/// `AUTOCLEAR`: a daemon that dies unmounts and frees them with its descriptors; the images
/// left in `dir` go at the next start.
pub struct ReadyDisks {
    templates: DiskTemplates,
    dir: PathBuf,
    stock: Mutex<Vec<Size>>,
}

/// One stocked size; the stock lists them most recently asked first.
struct Size {
    mib: u64,
    /// How many to hold ready.
    depth: usize,
    ready: Vec<Ready>,
    /// A thread is making disks of this size.
    filling: bool,
}

impl Size {
    fn new(mib: u64) -> Self {
        Self {
            mib,
            depth: 1,
            ready: Vec::new(),
            filling: false,
        }
    }
}

struct Ready {
    image: PathBuf,
    disk: OpenDisk,
}

impl ReadyDisks {
    /// Made images in `dir` (emptied now: what a previous run left is not attached).
    pub fn new(templates: DiskTemplates, dir: PathBuf) -> Result<Arc<Self>, RuntimeError> {
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(RuntimeError::io(format!("empty {}", dir.display()))(e))
            }
            _ => {}
        }
        std::fs::create_dir_all(&dir)
            .map_err(RuntimeError::io(format!("create {}", dir.display())))?;
        set_mode(&dir, 0o700)?;
        Ok(Arc::new(Self {
            templates,
            dir,
            stock: Mutex::default(),
        }))
    }

    pub(super) fn templates(&self) -> &DiskTemplates {
        &self.templates
    }

    /// How many disks of `size_mib` are ready to be taken now.
    pub fn ready_count(&self, size_mib: u64) -> usize {
        find(&mut lock(&self.stock), size_mib).map_or(0, |s| s.ready.len())
    }

    /// A ready disk of `size_mib` moved to `image`, if there is one. Either way the size
    /// becomes the most recently asked (the least recent beyond [`MAX_SIZES`] is dropped, its
    /// disks released), and finding none deepens its stock.
    pub(super) fn take(&self, size_mib: u64, image: &Path) -> Option<OpenDisk> {
        let (taken, evicted) = {
            let mut stock = lock(&self.stock);
            let (size, taken) = match stock.iter().position(|s| s.mib == size_mib) {
                Some(at) => {
                    let mut size = stock.remove(at);
                    let taken = size.ready.pop();
                    if taken.is_none() {
                        size.depth = (size.depth * 2).min(MAX_DEPTH);
                    }
                    (size, taken)
                }
                // A size not asked lately: nothing to deepen.
                None => (Size::new(size_mib), None),
            };
            stock.insert(0, size);
            let kept = stock.len().min(MAX_SIZES);
            let evicted: Vec<Size> = stock.drain(kept..).collect();
            (taken, evicted)
        };
        discard_all(evicted);
        let ready = taken?;
        match std::fs::rename(&ready.image, image) {
            Ok(()) => Some(ready.disk),
            Err(e) => {
                tracing::warn!(image = %ready.image.display(), error = %e, "a ready disk could not be used");
                discard(ready);
                None
            }
        }
    }

    /// Starts a thread making disks of `size_mib` (asked by [`Self::take`] before) until its
    /// depth is ready, unless one is at it or nothing is missing.
    pub(super) fn refill(self: &Arc<Self>, size_mib: u64) {
        {
            let mut stock = lock(&self.stock);
            let Some(size) = find(&mut stock, size_mib) else {
                return;
            };
            if size.filling || size.ready.len() >= size.depth {
                return;
            }
            size.filling = true;
        }
        let me = Arc::downgrade(self);
        let started = std::thread::Builder::new()
            .name("ready-disk".into())
            .spawn(move || {
                std::thread::sleep(REFILL_DELAY);
                // A runtime dropped meanwhile (its state dir perhaps deleted) wants none.
                while let Some(me) = me.upgrade() {
                    if !me.still_wanted(size_mib) {
                        return;
                    }
                    match me.make(size_mib) {
                        Ok(ready) => me.put(size_mib, ready),
                        Err(e) => {
                            tracing::warn!(size_mib, error = %e, "making a disk ahead");
                            me.stop_filling(size_mib);
                            return;
                        }
                    }
                }
            });
        if started.is_err() {
            self.stop_filling(size_mib);
        }
    }

    /// Whether the filling thread of `size_mib` should make another; when not, it is done.
    fn still_wanted(&self, size_mib: u64) -> bool {
        let mut stock = lock(&self.stock);
        match find(&mut stock, size_mib) {
            Some(size) if size.ready.len() < size.depth => true,
            Some(size) => {
                size.filling = false;
                false
            }
            // Dropped from the stock meanwhile.
            None => false,
        }
    }

    fn stop_filling(&self, size_mib: u64) {
        if let Some(size) = find(&mut lock(&self.stock), size_mib) {
            size.filling = false;
        }
    }

    /// Adds a made disk to the stock, or releases it if its size is no longer wanted.
    fn put(&self, size_mib: u64, ready: Ready) {
        let unwanted = {
            let mut stock = lock(&self.stock);
            match find(&mut stock, size_mib) {
                Some(size) if size.ready.len() < size.depth => {
                    size.ready.push(ready);
                    None
                }
                _ => Some(ready),
            }
        };
        if let Some(ready) = unwanted {
            discard(ready);
        }
    }

    fn make(&self, size_mib: u64) -> Result<Ready, RuntimeError> {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let image = self.dir.join(format!(
            "{size_mib}m-{}.img",
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        let file = self.templates.instantiate(size_mib, &image)?;
        let made = OpenDisk::new(&file, &image).and_then(|mut disk| {
            // Made now so a create only gives them away; reached through the descriptor, as
            // the filesystem is mounted nowhere.
            let upper = format!(
                "/proc/self/fd/{}/{OVERLAY_UPPER}",
                disk.fs.as_fd().as_raw_fd()
            );
            upper::make(Path::new(&upper))
                .map_err(RuntimeError::io(format!("lay out {}", image.display())))?;
            disk.upper_dirs_made = true;
            Ok(disk)
        });
        match made {
            Ok(disk) => Ok(Ready { image, disk }),
            Err(e) => {
                let _ = std::fs::remove_file(&image);
                Err(e)
            }
        }
    }
}

impl Drop for ReadyDisks {
    fn drop(&mut self) {
        let sizes = std::mem::take(&mut *lock(&self.stock));
        sizes.into_iter().flat_map(|s| s.ready).for_each(discard);
    }
}

/// Releases the disks of sizes dropped from the stock on a thread of their own (each an
/// unmount), not on the create that dropped them.
fn discard_all(sizes: Vec<Size>) {
    let disks: Vec<Ready> = sizes.into_iter().flat_map(|s| s.ready).collect();
    if disks.is_empty() {
        return;
    }
    // Without a thread they are dropped here: their filesystems and devices go with them, their
    // images (in the stock's dir) at the next start.
    let _ = std::thread::Builder::new()
        .name("ready-disk-drop".into())
        .spawn(move || disks.into_iter().for_each(discard));
}

/// Unmounts the filesystem (the device, no longer held, clears itself) and deletes the image.
fn discard(ready: Ready) {
    let Ready { image, disk } = ready;
    drop(disk);
    if let Err(e) = std::fs::remove_file(&image) {
        tracing::warn!(image = %image.display(), error = %e, "removing a disk made ahead");
    }
}

/// The stocked size of `mib`, if it is stocked.
fn find(stock: &mut [Size], mib: u64) -> Option<&mut Size> {
    stock.iter_mut().find(|s| s.mib == mib)
}
