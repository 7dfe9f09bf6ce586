//! A sandbox made from a snapshot: its captured layers either become shared read-only lower
//! layers of its root overlay ([`Trees`]: unpacked once per host, mounted id-mapped into every
//! sandbox that uses them) or, where that cannot be done, are applied into its fresh upper
//! layer ([`apply`]). Layers were made by sandboxes, so every entry is hostile; `koder-layer`
//! never writes outside the directory it unpacks into, and a failed apply fails the create
//! (whose cleanup removes the whole sandbox dir).
//!
//! An unpacked tree holds sandbox-relative ("neutral") owners, as volumes do, so one tree
//! serves every uid range; the slot's id mapping is given to each mount of it. Trees live in
//! `<state>/layers` (mode 0700: no host user but root reaches them, nothing on the host runs
//! from them), named after the layer file they came from and its inode, and are immutable
//! once renamed into place. A tree stays while a sandbox uses it ([`Lease`]) or its layer file
//! still exists (the next sandbox made from it starts without unpacking); once both are gone it
//! is deleted, the next time a lease is taken or given back or a sandbox is destroyed, and at
//! start-up
//! ([`Trees::reconcile`]) every tree goes.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use koder_layer::{ApplyOptions, LayerError, Limits, Owners};
use koder_runtime::{CopiedLayer, LayerBounds, RuntimeError};
use rustix::fs::{Mode, OFlags};

use crate::spawn::IdMap;
use crate::SANDBOX_IDS;
use std::os::fd::{AsFd, OwnedFd};

/// Entries one restored sandbox may hold (a million empty files is a hostile layer, not a
/// workspace).
const MAX_ENTRIES: u64 = 500_000;
/// Bytes of file content when the sandbox has no disk quota to bound them, and of one
/// unpacked tree (the tenant's snapshot storage bounded the layer when it was captured).
const MAX_BYTES_WITHOUT_DISK: u64 = 16 << 30;
/// Session layers one sandbox stacks as lower layers; a deeper stack is applied into its upper
/// layer instead, which also flattens it (the next capture holds the whole filesystem).
pub const MAX_LOWER_LAYERS: usize = 16;
/// Suffix of a tree being unpacked.
const PART: &str = ".part";

/// Applies `layers` (bottom first) into the fresh `upper`, owners shifted into `ids`.
pub fn apply(
    upper: &Path,
    layers: &[PathBuf],
    ids: IdMap,
    disk_mib: Option<u64>,
) -> Result<(), RuntimeError> {
    let owners = Owners::Shift {
        base: ids.host_base,
        size: ids.count,
    };
    let max_bytes = disk_mib.map_or(MAX_BYTES_WITHOUT_DISK, |m| m.saturating_mul(1 << 20));
    for layer in layers {
        unpack(upper, layer, owners, max_bytes)?;
    }
    Ok(())
}

/// Writes `layer` (a tar file, or a tree a fork copied with neutral owners) into `into`.
fn unpack(into: &Path, layer: &Path, owners: Owners, max_bytes: u64) -> Result<(), RuntimeError> {
    let root = open_dir(into)?;
    let opts = ApplyOptions {
        limits: Limits {
            max_bytes,
            max_entries: MAX_ENTRIES,
        },
        owners,
    };
    let applied = if is_tree(layer) {
        let neutral = Owners::Shift {
            base: 0,
            size: SANDBOX_IDS,
        };
        koder_layer::copy(open_dir(layer)?.as_fd(), neutral, root.as_fd(), &opts)
    } else {
        let file = File::open(layer)
            .map_err(RuntimeError::io(format!("open layer {}", layer.display())))?;
        koder_layer::apply(
            root.as_fd(),
            BufReader::with_capacity(256 * 1024, file),
            &opts,
        )
    };
    applied.map(drop).map_err(|e| {
        if e.is_quota() {
            RuntimeError::Exhausted(format!("restoring layer: {e}"))
        } else {
            RuntimeError::Start(format!("restoring layer: {e}"))
        }
    })
}

fn open_dir(path: &Path) -> Result<OwnedFd, RuntimeError> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::io(format!("open {}", path.display()))(e.into()))
}

/// A layer given as a directory: a fork's copy, already in a tree's form.
fn is_tree(layer: &Path) -> bool {
    std::fs::symlink_metadata(layer).is_ok_and(|m| m.is_dir())
}

/// Copies the writable layer of a running sandbox into `into` with neutral owners, as
/// [`Trees`] hold them. The agent (`pid`) holds the only reference to that layer once the
/// host's mount of the sandbox's disk is gone, so the host reaches it through the agent's
/// descriptor; `upper` ((device, inode), recorded when the sandbox started) tells which one,
/// so a descriptor the sandbox swapped in could name nothing but the layer itself.
pub fn copy_writable(
    pid: i32,
    upper: (u64, u64),
    ids: IdMap,
    into: &Path,
    bounds: LayerBounds,
) -> Result<CopiedLayer, RuntimeError> {
    let source = open_agents_dir(pid, upper)?;
    let opts = ApplyOptions {
        limits: Limits {
            max_bytes: bounds.max_bytes,
            max_entries: bounds.max_entries,
        },
        owners: Owners::Shift {
            base: 0,
            size: SANDBOX_IDS,
        },
    };
    let from = Owners::Shift {
        base: ids.host_base,
        size: ids.count,
    };
    match koder_layer::copy(source.as_fd(), from, open_dir(into)?.as_fd(), &opts) {
        Ok(stats) => Ok(CopiedLayer {
            entries: stats.entries,
            bytes: stats.bytes,
        }),
        Err(e) if e.is_quota() => Err(RuntimeError::Exhausted(e.to_string())),
        Err(e) => Err(copy_error(e)),
    }
}

fn copy_error(e: LayerError) -> RuntimeError {
    RuntimeError::io("copying the writable layer")(std::io::Error::other(e))
}

/// The directory `(device, inode)` among the open descriptors of process `pid`.
pub(crate) fn open_agents_dir(pid: i32, want: (u64, u64)) -> Result<OwnedFd, RuntimeError> {
    let fds = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&fds).map_err(RuntimeError::io(format!("list {fds}")))?;
    for entry in entries.flatten() {
        // Following the descriptor's magic link is the point; anything but a directory (a
        // fifo would block without NONBLOCK) is refused by the open itself.
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let Ok(fd) = rustix::fs::open(entry.path(), flags, Mode::empty()) else {
            continue;
        };
        let found = rustix::fs::fstat(&fd).is_ok_and(|st| (st.st_dev, st.st_ino) == want);
        if found {
            return Ok(fd);
        }
    }
    Err(RuntimeError::io("find the sandbox's writable layer")(
        std::io::Error::from(std::io::ErrorKind::NotFound),
    ))
}

/// The host's unpacked layers. Shared with the [`Lease`]s it hands out.
pub struct Trees {
    dir: PathBuf,
    /// Where removed trees go to be deleted in the background.
    trash: PathBuf,
    known: Mutex<HashMap<String, Tree>>,
}

struct Tree {
    /// The layer file it was unpacked from, and that file's (device, inode) then.
    layer: PathBuf,
    inode: (u64, u64),
    /// Sandboxes using it (or about to).
    users: u32,
    /// Held while it is being unpacked: the sandboxes of one fork wait for one unpack.
    unpacking: Arc<Mutex<()>>,
}

/// One sandbox's use of one tree: while it lives, the tree stays. A fork's tree (given as a
/// directory) is its maker's to keep and delete: its lease counts nothing.
pub struct Lease {
    trees: Arc<Trees>,
    key: Option<String>,
    path: PathBuf,
}

impl Lease {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(key) = &self.key else {
            return;
        };
        let mut known = self.trees.lock();
        if let Some(t) = known.get_mut(key) {
            t.users = t.users.saturating_sub(1);
        }
        self.trees.collect(&mut known);
    }
}

impl Trees {
    /// `dir` (made here, mode 0700) holds the trees; `trash` is the runtime's trash dir.
    pub fn new(dir: PathBuf, trash: PathBuf) -> Result<Arc<Self>, RuntimeError> {
        std::fs::create_dir_all(&dir)
            .map_err(RuntimeError::io(format!("create {}", dir.display())))?;
        koder_hostkit::mode::set_mode(&dir, 0o700)?;
        Ok(Arc::new(Self {
            dir,
            trash,
            known: Mutex::default(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Tree>> {
        // A panic while holding it leaves counts that are still whole numbers: carry on.
        crate::lock(&self.known)
    }

    /// The tree of each of `layers` (in order), unpacked now where this host has none yet.
    /// Blocks (unpacking takes as long as an apply): call it on a blocking thread.
    pub fn lease(self: &Arc<Self>, layers: &[PathBuf]) -> Result<Vec<Lease>, RuntimeError> {
        layers.iter().map(|l| self.lease_one(l)).collect()
    }

    fn lease_one(self: &Arc<Self>, layer: &Path) -> Result<Lease, RuntimeError> {
        if is_tree(layer) {
            return Ok(Lease {
                trees: self.clone(),
                key: None,
                path: layer.to_path_buf(),
            });
        }
        let meta = std::fs::metadata(layer)
            .map_err(RuntimeError::io(format!("open layer {}", layer.display())))?;
        let inode = (meta.dev(), meta.ino());
        let key = tree_name(layer, inode);
        let unpacking = {
            let mut known = self.lock();
            self.collect(&mut known);
            let tree = known.entry(key.clone()).or_insert_with(|| Tree {
                layer: layer.to_path_buf(),
                inode,
                users: 0,
                unpacking: Arc::default(),
            });
            tree.users += 1;
            tree.unpacking.clone()
        };
        // Counted from here on: dropping it gives the use back, whatever fails below.
        let lease = Lease {
            trees: self.clone(),
            path: self.dir.join(&key),
            key: Some(key),
        };
        let _one_at_a_time = crate::lock(&unpacking);
        if !lease.path.is_dir() {
            self.unpack(layer, &lease.path)?;
        }
        Ok(lease)
    }

    /// Unpacks `layer` into a fresh directory renamed to `path` once complete.
    fn unpack(&self, layer: &Path, path: &Path) -> Result<(), RuntimeError> {
        let mut part = path.as_os_str().to_owned();
        part.push(PART);
        let part = PathBuf::from(part);
        self.discard(&part);
        std::fs::create_dir(&part)
            .map_err(RuntimeError::io(format!("create {}", part.display())))?;
        // The mode of the layer's root never matters (the overlay's root is its upper dir's).
        koder_hostkit::mode::set_mode(&part, 0o755)?;
        let owners = Owners::Shift {
            base: 0,
            size: SANDBOX_IDS,
        };
        let unpacked = unpack(&part, layer, owners, MAX_BYTES_WITHOUT_DISK).and_then(|()| {
            std::fs::rename(&part, path)
                .map_err(RuntimeError::io(format!("commit {}", path.display())))
        });
        if unpacked.is_err() {
            self.discard(&part);
        }
        unpacked
    }

    /// Deletes every tree no sandbox uses whose layer file is gone.
    pub fn sweep(&self) {
        self.collect(&mut self.lock());
    }

    /// Forgets and deletes every tree no sandbox uses whose layer file is gone (or replaced).
    fn collect(&self, known: &mut HashMap<String, Tree>) {
        let gone: Vec<String> = known
            .iter()
            .filter(|(_, t)| t.users == 0 && !t.layer_exists())
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            known.remove(&key);
            self.discard(&self.dir.join(&key));
        }
    }

    /// At start-up (no sandbox of this runtime runs): every tree not in use goes; the next
    /// sandbox that needs one unpacks it again.
    pub fn reconcile(&self) {
        let known = self.lock();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if known.get(&name).is_none_or(|t| t.users == 0) {
                self.discard(&entry.path());
            }
        }
    }

    /// Moves `path` into the trash (deleted in the background) or deletes it here.
    fn discard(&self, path: &Path) {
        if !path.exists() {
            return;
        }
        if let Err(e) = crate::discard(path, &self.trash) {
            tracing::warn!(tree = %path.display(), error = %e, "delete unpacked layer");
        }
    }
}

impl Tree {
    fn layer_exists(&self) -> bool {
        std::fs::metadata(&self.layer).is_ok_and(|m| (m.dev(), m.ino()) == self.inode)
    }
}

/// A tree's directory name: the layer file's name (its id, where the daemon made it) when that
/// is a plain name, and the file's inode, so two layers never share a tree.
fn tree_name(layer: &Path, (dev, ino): (u64, u64)) -> String {
    let stem: String = layer
        .file_stem()
        .map(|s| s.to_string_lossy())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect();
    format!("{stem}.{dev:x}.{ino:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_names_are_plain_and_differ_by_inode() {
        let a = tree_name(Path::new("/d/layers/lyr-0abc.tar"), (8, 42));
        assert_eq!(a, "lyr-0abc.8.2a");
        assert_ne!(a, tree_name(Path::new("/d/layers/lyr-0abc.tar"), (8, 43)));
        let odd = tree_name(Path::new("/d/../we ird\n/..name.tar"), (1, 1));
        assert_eq!(odd, "name.1.1");
    }
}
