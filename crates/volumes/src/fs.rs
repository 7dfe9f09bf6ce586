//! The file API on a volume without a session: host root working on content a sandbox wrote.
//!
//! Everything here treats the tree under `root` as hostile. Paths are resolved with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` from the volume's root,
//! so a symlink (absolute or `..`-laden) resolves inside the volume, never out of it; walks go
//! from directory fd to directory fd with single components that follow no symlink at all.
//! Non-regular files are never read (opened `O_NONBLOCK`, refused after `fstat`), and new files
//! are written unnamed (`O_TMPFILE`) and linked in only by [`NewFile::commit`], so a failed or
//! cancelled upload leaves nothing.
//!
//! Paths are volume-absolute (`/a/b.txt`; `/` is the root). Owners are the volume's neutral
//! uids (0 = sandbox root, 1000 = sandbox `user`), stored and reported as they are.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use koder_runtime::SANDBOX_IDS;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat, CWD};
use rustix::io::Errno;

use crate::VolumeError;

/// Longest path accepted, in bytes (the kernel's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most entries one [`list`] returns.
pub const MAX_LIST_ENTRIES: usize = 100_000;
/// Deepest directory [`list`] and [`remove`] descend to: each level holds a directory fd.
pub const MAX_DEPTH: u32 = 256;
/// Mode bits [`set_metadata`] and the creators accept: permissions, setuid, setgid, sticky.
pub const MAX_MODE: u32 = 0o7777;

/// Names [`remove`] reads from a directory at a time.
const REMOVE_BATCH: usize = 4096;

const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    Symlink,
    /// Fifos, sockets, device nodes.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The last component (`/` for the root). Names that are not UTF-8 are shown lossily.
    pub name: String,
    /// Volume-absolute and normalized.
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits, setuid, setgid and sticky (`& 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// A symlink's target as stored (never resolved).
    pub target: Option<String>,
}

/// `lstat` of `path`: a symlink is reported as one, with its target.
pub fn stat(root: &Path, path: &str) -> Result<Entry, VolumeError> {
    let path = VolPath::parse(path)?;
    let root = open_root(root)?;
    let fd = path.open(&root, OFlags::PATH | OFlags::NOFOLLOW)?;
    entry_of_fd(&fd, &path.text())
}

/// The entries under the directory `path`, `depth` levels deep (1: its children), depth first
/// in name order. Symlinks are listed, never descended.
pub fn list(root: &Path, path: &str, depth: u32) -> Result<Vec<Entry>, VolumeError> {
    if !(1..=MAX_DEPTH).contains(&depth) {
        return Err(VolumeError::InvalidArgument(format!(
            "depth {depth} is outside 1..={MAX_DEPTH}"
        )));
    }
    let path = VolPath::parse(path)?;
    let root = open_root(root)?;
    let dir = path.open(&root, OFlags::RDONLY | OFlags::DIRECTORY)?;
    let mut out = Vec::new();
    list_into(&dir, &path.text(), depth, &mut out)?;
    Ok(out)
}

fn list_into(
    dir: &OwnedFd,
    dir_path: &str,
    depth: u32,
    out: &mut Vec<Entry>,
) -> Result<(), VolumeError> {
    for name in listed_names(dir, dir_path)? {
        let path = join(dir_path, &name);
        let st = statat_nofollow(dir, &name, &path)?;
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(VolumeError::TooLarge(format!(
                "{dir_path} holds more than {MAX_LIST_ENTRIES} entries at this depth; list a smaller depth or a subdirectory"
            )));
        }
        let entry = entry_of(&st, dir, &name, path)?;
        let descend = depth > 1 && entry.kind == Kind::Directory;
        let path = entry.path.clone();
        out.push(entry);
        if descend {
            let child = open_child(dir, &name, OFlags::RDONLY | OFlags::DIRECTORY, &path)?;
            list_into(&child, &path, depth - 1, out)?;
        }
    }
    Ok(())
}

/// Creates the directory `path`. With `parents`, missing ancestors are created too and an
/// existing directory is fine (`mkdir -p`); `owner` applies to every directory created, `mode`
/// (default 0755) to the last.
pub fn make_dir(
    root: &Path,
    path: &str,
    parents: bool,
    owner: Option<(u32, u32)>,
    mode: Option<u32>,
) -> Result<Entry, VolumeError> {
    check_owner(owner.map(|o| o.0), owner.map(|o| o.1))?;
    let mode = check_mode(mode)?.unwrap_or(DIR_MODE);
    let path = VolPath::parse(path)?;
    let rootfd = open_root(root)?;
    let n = path.comps.len();
    if n == 0 && !parents {
        return Err(VolumeError::AlreadyExists(path.text()));
    }
    let first = if parents { 1 } else { n };
    for i in first..=n {
        let here = path.prefix(i);
        let parent = here
            .parent()
            .open(&rootfd, OFlags::PATH | OFlags::DIRECTORY)?;
        let name = here.name();
        match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => {
                let dir = open_child(
                    &parent,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY,
                    &here.text(),
                )?;
                apply(
                    &dir,
                    owner,
                    if i == n { mode } else { DIR_MODE },
                    &here.text(),
                )?;
            }
            // An existing directory (or a symlink to one inside the volume) will do.
            Err(Errno::EXIST) if parents => {
                here.open(&rootfd, OFlags::PATH | OFlags::DIRECTORY)?;
            }
            Err(e) => return Err(VolumeError::errno(here.text(), e)),
        }
    }
    stat(root, &path.text())
}

/// A file being written: unnamed until [`NewFile::commit`] links it in at its path; dropped
/// uncommitted, it vanishes.
#[derive(Debug)]
pub struct NewFile {
    file: File,
    dir: OwnedFd,
    name: String,
    path: String,
    overwrite: bool,
}

impl NewFile {
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn file_mut(&mut self) -> &mut File {
        &mut self.file
    }

    /// Syncs the content and links it in at its path: only if nothing is there without
    /// `overwrite`, else atomically replacing whatever non-directory is there.
    pub fn commit(self) -> Result<Entry, VolumeError> {
        self.file
            .sync_all()
            .map_err(|e| VolumeError::io(self.path.clone(), e))?;
        if self.overwrite {
            let tmp = self.link_as_temp()?;
            if let Err(e) = rustix::fs::renameat(&self.dir, &tmp, &self.dir, &self.name) {
                let _ = rustix::fs::unlinkat(&self.dir, &tmp, AtFlags::empty());
                return Err(VolumeError::errno(self.path, e));
            }
        } else {
            link_empty(&self.file, &self.dir, &self.name)
                .map_err(|e| VolumeError::errno(self.path.clone(), e))?;
        }
        let st = statat_nofollow(&self.dir, &self.name, &self.path)?;
        entry_of(&st, &self.dir, &self.name, self.path)
    }

    /// Links the file under a fresh hidden name next to its destination, for the rename over
    /// it (a link cannot replace).
    fn link_as_temp(&self) -> Result<String, VolumeError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let tmp = format!(
                ".koder-upload.{}.{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            match link_empty(&self.file, &self.dir, &tmp) {
                Ok(()) => return Ok(tmp),
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(VolumeError::errno(self.path.clone(), e)),
            }
        }
    }
}

/// `linkat(file, "", dir, name, AT_EMPTY_PATH)`: names an `O_TMPFILE` file (needs
/// `CAP_DAC_READ_SEARCH`, which the daemon as root has).
fn link_empty(file: &File, dir: &OwnedFd, name: &str) -> Result<(), Errno> {
    rustix::fs::linkat(file, "", dir, name, AtFlags::EMPTY_PATH)
}

/// Starts writing the regular file `path`, whose parent directory must exist. Without
/// `overwrite` an existing entry is refused; with it any non-directory is replaced on commit.
/// `owner` defaults to the daemon's (0:0, sandbox root), `mode` to 0644.
pub fn create_file(
    root: &Path,
    path: &str,
    overwrite: bool,
    owner: Option<(u32, u32)>,
    mode: Option<u32>,
) -> Result<NewFile, VolumeError> {
    check_owner(owner.map(|o| o.0), owner.map(|o| o.1))?;
    let mode = check_mode(mode)?.unwrap_or(FILE_MODE);
    let path = VolPath::parse(path)?;
    if path.comps.is_empty() {
        return Err(VolumeError::IsADirectory(path.text()));
    }
    let rootfd = open_root(root)?;
    let dir = path
        .parent()
        .open(&rootfd, OFlags::PATH | OFlags::DIRECTORY)?;
    let name = path.name();
    // Early answers only: commit decides for real.
    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) if !overwrite => return Err(VolumeError::AlreadyExists(path.text())),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            return Err(VolumeError::IsADirectory(path.text()))
        }
        Ok(_) | Err(Errno::NOENT) => {}
        Err(e) => return Err(VolumeError::errno(path.text(), e)),
    }
    let fd = rustix::fs::openat2(
        &dir,
        ".",
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
        RESOLVE,
    )
    .map_err(|e| VolumeError::errno(path.text(), e))?;
    apply(&fd, owner, mode, &path.text())?;
    Ok(NewFile {
        file: File::from(fd),
        dir,
        name: name.to_owned(),
        path: path.text(),
        overwrite,
    })
}

/// Opens the regular file `path` for reading (a final symlink is followed, inside the volume);
/// returns it with its size.
pub fn open_file(root: &Path, path: &str) -> Result<(File, u64), VolumeError> {
    let path = VolPath::parse(path)?;
    let rootfd = open_root(root)?;
    // O_NONBLOCK: opening a fifo must not wait for a writer; it is refused just below.
    let fd = path.open(&rootfd, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
    let st = rustix::fs::fstat(&fd).map_err(|e| VolumeError::errno(path.text(), e))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => return Err(VolumeError::IsADirectory(path.text())),
        _ => return Err(VolumeError::NotRegular(path.text())),
    }
    // Back to blocking reads; for a regular file the flag only matters to odd filesystems.
    rustix::fs::fcntl_setfl(&fd, OFlags::empty())
        .map_err(|e| VolumeError::errno(path.text(), e))?;
    Ok((File::from(fd), st.st_size as u64))
}

/// Removes `path`, a directory with everything in it. Symlinks are removed, never followed.
pub fn remove(root: &Path, path: &str) -> Result<(), VolumeError> {
    let path = VolPath::parse(path)?;
    if path.comps.is_empty() {
        return Err(VolumeError::InvalidPath {
            path: path.text(),
            why: "the root cannot be removed",
        });
    }
    let rootfd = open_root(root)?;
    let dir = path
        .parent()
        .open(&rootfd, OFlags::PATH | OFlags::DIRECTORY)?;
    remove_at(&dir, OsStr::new(path.name()), &path.text(), 0)
}

fn remove_at(dir: &OwnedFd, name: &OsStr, path: &str, depth: u32) -> Result<(), VolumeError> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| VolumeError::errno(path, e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty())
            .map_err(|e| VolumeError::errno(path, e));
    }
    if depth >= MAX_DEPTH {
        return Err(VolumeError::TooLarge(format!(
            "{path} is nested deeper than {MAX_DEPTH} directories"
        )));
    }
    let child = open_child(dir, name, OFlags::RDONLY | OFlags::DIRECTORY, path)?;
    // In batches: a directory may hold more names than are worth holding at once. Every name
    // of a batch is removed or the walk fails, so each pass makes progress.
    loop {
        let batch = read_names(&child, path, REMOVE_BATCH)?;
        if batch.is_empty() {
            break;
        }
        for entry in batch {
            let entry_path = join(path, &entry.to_string_lossy());
            remove_at(&child, &entry, &entry_path, depth + 1)?;
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).map_err(|e| VolumeError::errno(path, e))
}

/// Changes the owner and/or mode of `path` itself (a symlink's owner; symlinks have no mode).
/// The owner goes first: a chown clears setuid/setgid, a mode given with it is kept.
pub fn set_metadata(
    root: &Path,
    path: &str,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) -> Result<Entry, VolumeError> {
    check_owner(uid, gid)?;
    let mode = check_mode(mode)?;
    let path = VolPath::parse(path)?;
    let rootfd = open_root(root)?;
    let fd = path.open(&rootfd, OFlags::PATH | OFlags::NOFOLLOW)?;
    let text = path.text();
    if uid.is_some() || gid.is_some() {
        rustix::fs::chownat(
            &fd,
            "",
            uid.map(rustix::fs::Uid::from_raw),
            gid.map(rustix::fs::Gid::from_raw),
            AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| VolumeError::errno(text.clone(), e))?;
    }
    if let Some(mode) = mode {
        let st = rustix::fs::fstat(&fd).map_err(|e| VolumeError::errno(text.clone(), e))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            return Err(VolumeError::InvalidArgument(format!(
                "{text}: a symlink has no mode"
            )));
        }
        chmod_path_fd(&fd, mode).map_err(|e| VolumeError::errno(text.clone(), e))?;
    }
    entry_of_fd(&fd, &text)
}

/// chmod of an `O_PATH` fd (no `fchmod` on those, and `fchmodat2` is too new to rely on):
/// through its `/proc/self/fd` link, which names exactly that inode. Never called on a
/// symlink, whose link would be followed.
fn chmod_path_fd(fd: &OwnedFd, mode: u32) -> Result<(), Errno> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::chmodat(
        CWD,
        link.as_str(),
        Mode::from_raw_mode(mode),
        AtFlags::empty(),
    )
}

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);
/// Tries of an `openat2` that a concurrent mount or rename made answer `EAGAIN`.
const OPENAT2_RETRIES: usize = 64;

/// One step down from a directory fd: a single component, no symlink followed anywhere.
fn open_child<P: rustix::path::Arg>(
    dir: &OwnedFd,
    name: P,
    flags: OFlags,
    path: &str,
) -> Result<OwnedFd, VolumeError> {
    rustix::fs::openat2(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
    )
    .map_err(|e| VolumeError::errno(path, e))
}

fn open_root(root: &Path) -> Result<OwnedFd, VolumeError> {
    rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| VolumeError::host(format!("open volume root {}", root.display()))(e.into()))
}

/// Up to `limit` names in a directory (raw bytes), without `.` and `..`.
fn read_names(dir: &OwnedFd, path: &str, limit: usize) -> Result<Vec<OsString>, VolumeError> {
    let mut names = Vec::new();
    let entries = rustix::fs::Dir::read_from(dir).map_err(|e| VolumeError::errno(path, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| VolumeError::errno(path, e))?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        if names.len() == limit {
            break;
        }
        names.push(OsStr::from_bytes(bytes).to_owned());
    }
    Ok(names)
}

/// The names [`list`] shows, sorted. Non-UTF-8 names are skipped: they could not be named
/// back through this API.
fn listed_names(dir: &OwnedFd, path: &str) -> Result<Vec<String>, VolumeError> {
    let raw = read_names(dir, path, MAX_LIST_ENTRIES + 1)?;
    if raw.len() > MAX_LIST_ENTRIES {
        return Err(VolumeError::TooLarge(format!(
            "{path} holds more than {MAX_LIST_ENTRIES} entries"
        )));
    }
    let mut names: Vec<String> = raw
        .into_iter()
        .filter_map(|n| match n.into_string() {
            Ok(name) => Some(name),
            Err(_) => {
                tracing::debug!(dir = path, "skipped a name that is not UTF-8");
                None
            }
        })
        .collect();
    names.sort_unstable();
    Ok(names)
}

fn statat_nofollow(dir: &OwnedFd, name: &str, path: &str) -> Result<Stat, VolumeError> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| VolumeError::errno(path, e))
}

fn entry_of_fd(fd: &OwnedFd, path: &str) -> Result<Entry, VolumeError> {
    let st = rustix::fs::fstat(fd).map_err(|e| VolumeError::errno(path, e))?;
    entry_of(&st, fd, "", path.to_owned())
}

/// `at`/`name`: where to read the symlink's target (`name` empty: `at` is the link itself).
fn entry_of(st: &Stat, at: &OwnedFd, name: &str, path: String) -> Result<Entry, VolumeError> {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Directory,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Unknown,
    };
    let target = if kind == Kind::Symlink {
        let raw = rustix::fs::readlinkat(at, name, Vec::new())
            .map_err(|e| VolumeError::errno(path.clone(), e))?;
        Some(String::from_utf8_lossy(raw.as_bytes()).into_owned())
    } else {
        None
    };
    let last = path.rsplit('/').next().unwrap_or_default();
    Ok(Entry {
        name: if last.is_empty() {
            "/".into()
        } else {
            last.into()
        },
        kind,
        size: st.st_size as u64,
        mode: st.st_mode & MAX_MODE,
        uid: st.st_uid,
        gid: st.st_gid,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        target,
        path,
    })
}

fn time(secs: i64, nsecs: impl TryInto<u32>) -> SystemTime {
    let nsecs = nsecs.try_into().unwrap_or(0);
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(secs.unsigned_abs(), nsecs)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
            + Duration::from_nanos(u64::from(nsecs))
    }
}

/// An owner a sandbox can see: a neutral id past the sandbox's id range would show as the
/// overflow id (`nobody`) in every sandbox, and `u32::MAX` would mean "unchanged" to chown.
fn check_owner(uid: Option<u32>, gid: Option<u32>) -> Result<(), VolumeError> {
    match uid.into_iter().chain(gid).find(|&id| id >= SANDBOX_IDS) {
        Some(id) => Err(VolumeError::InvalidArgument(format!(
            "owner id {id} is outside a sandbox's ids 0..{SANDBOX_IDS}"
        ))),
        None => Ok(()),
    }
}

fn check_mode(mode: Option<u32>) -> Result<Option<u32>, VolumeError> {
    match mode {
        Some(m) if m > MAX_MODE => Err(VolumeError::InvalidArgument(format!(
            "mode {m:o} has bits beyond {MAX_MODE:o}"
        ))),
        _ => Ok(mode),
    }
}

/// Owner first, then mode: a chown clears setuid/setgid.
fn apply(
    fd: &OwnedFd,
    owner: Option<(u32, u32)>,
    mode: u32,
    path: &str,
) -> Result<(), VolumeError> {
    if let Some((uid, gid)) = owner {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| VolumeError::errno(path, e))?;
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(|e| VolumeError::errno(path, e))
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// A checked volume-absolute path, split into components (empty and `.` ones dropped).
struct VolPath<'a> {
    comps: Vec<&'a str>,
}

impl<'a> VolPath<'a> {
    fn parse(path: &'a str) -> Result<Self, VolumeError> {
        let bad = |why| {
            Err(VolumeError::InvalidPath {
                path: path.chars().take(256).collect(),
                why,
            })
        };
        if !path.starts_with('/') {
            return bad("not absolute");
        }
        if path.contains('\0') {
            return bad("contains NUL");
        }
        if path.len() > MAX_PATH_BYTES {
            return bad("longer than 4096 bytes");
        }
        let comps: Vec<&str> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if comps.contains(&"..") {
            return bad("contains '..'");
        }
        Ok(VolPath { comps })
    }

    fn text(&self) -> String {
        format!("/{}", self.comps.join("/"))
    }

    fn prefix(&self, n: usize) -> VolPath<'a> {
        VolPath {
            comps: self.comps[..n].to_vec(),
        }
    }

    /// The parent of a non-root path (the root's parent is the root).
    fn parent(&self) -> VolPath<'a> {
        self.prefix(self.comps.len().saturating_sub(1))
    }

    fn name(&self) -> &'a str {
        self.comps.last().copied().unwrap_or(".")
    }

    /// Resolves the path under the volume root `root`.
    fn open(&self, root: &OwnedFd, flags: OFlags) -> Result<OwnedFd, VolumeError> {
        let rel = if self.comps.is_empty() {
            ".".to_owned()
        } else {
            self.comps.join("/")
        };
        // `RESOLVE_IN_ROOT` answers `EAGAIN` when a rename or mount anywhere on the host (a
        // sandbox starting) might have let a `..` of a symlink escape; trying again is safe.
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(
                root.as_fd(),
                OsStr::from_bytes(rel.as_bytes()),
                flags | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            ) {
                Err(Errno::AGAIN | Errno::INTR) if tries < OPENAT2_RETRIES => tries += 1,
                result => return result.map_err(|e| VolumeError::errno(self.text(), e)),
            }
        }
    }
}
