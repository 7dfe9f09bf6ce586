//! Unpacking one OCI layer (a tar stream) onto an image's root tree, the archive treated as
//! hostile: an entry naming an absolute path or `..`, or whose parent is a symlink (planted by
//! an earlier entry or layer), is refused. Every parent is opened one component at a time,
//! relative to the one before, with `O_NOFOLLOW | O_DIRECTORY`, and every final name is
//! created, linked or removed relative to its parent without following it, so nothing outside
//! the tree is ever opened, whatever links the tree holds.
//!
//! Hand-written on `rustix` rather than with `cap-std`: cap-std confines a path to its
//! directory but follows symlinks that stay inside it, where a layer must not write through
//! any symlink at all; and `koder-layer`'s hardened apply speaks the overlay upper-dir format
//! (char-device whiteouts, shifted owners), not OCI's `.wh.` files.
//!
//! Each layer is read twice: a first pass checks every path and the layer's bounds from its
//! headers alone (a tar bomb is refused before a byte is written), hashes the stream against
//! its `diff_id`, and collects the whiteouts, which then apply to the lower layers only; the
//! second pass writes the entries.

use std::ffi::CStr;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use koder_runtime::SANDBOX_IDS;
use rustix::fs::{AtFlags, Dir, FileType, Gid, Mode, OFlags, Uid};
use rustix::io::Errno;
use sha2::{Digest as _, Sha256};
use tar::EntryType;

use crate::store::ImageError;

const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";
const MAX_NAME: usize = 255;
const MAX_DEPTH: usize = 256;

type Result<T> = std::result::Result<T, ImageError>;

/// Bounds on everything an import unpacks, all its layers together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Sum of the sizes of regular files, as their headers declare them.
    pub max_bytes: u64,
    /// Number of entries (directories, files, links, whiteouts...).
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: 8 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What is left of the [`Limits`] while layers are unpacked.
pub(super) struct Budget {
    limits: Limits,
    bytes: u64,
    entries: u64,
}

impl Budget {
    pub(super) fn new(limits: Limits) -> Self {
        Self {
            limits,
            bytes: 0,
            entries: 0,
        }
    }

    pub(super) fn entry(&mut self) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(ImageError::TooLarge(format!(
                "more than {} entries",
                self.limits.max_entries
            )));
        }
        Ok(())
    }

    pub(super) fn bytes(&mut self, n: u64, path: &[u8]) -> Result<()> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.limits.max_bytes {
            return Err(ImageError::TooLarge(format!(
                "more than {} bytes unpacked (at {})",
                self.limits.max_bytes,
                shown(path)
            )));
        }
        Ok(())
    }
}

/// What one layer did to the tree.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LayerStats {
    pub entries: u64,
    pub bytes: u64,
    pub whiteouts: u64,
    /// Device nodes, fifos and other entries an image never holds.
    pub dropped: u64,
}

/// A whiteout found by the first pass: the parent's components and the name it removes
/// (`None`: every child of the parent, an opaque directory).
struct Whiteout {
    parent: Vec<Vec<u8>>,
    name: Option<Vec<u8>>,
}

/// Checks a layer (first pass): every path, the budget from the headers, and the stream's
/// sha256 (returned, `sha256:<hex>`); returns its whiteouts too.
fn scan(input: impl Read, budget: &mut Budget) -> Result<(String, Vec<Whiteout>)> {
    let mut hashed = Hashing {
        inner: input,
        hash: Sha256::new(),
    };
    let mut whiteouts = Vec::new();
    {
        let mut archive = tar::Archive::new(&mut hashed);
        for entry in archive.entries().map_err(corrupt)? {
            let entry = entry.map_err(corrupt)?;
            budget.entry()?;
            let raw = entry.path_bytes();
            let parts = components(&raw)?;
            let kind = entry.header().entry_type();
            if is_file(kind) {
                budget.bytes(entry.size(), &raw)?;
            }
            if kind.is_hard_link() {
                let target = entry.link_name_bytes().unwrap_or_default();
                components(&target)?;
            }
            if let Some(w) = whiteout_of(&parts, &raw)? {
                whiteouts.push(w);
            }
        }
    }
    // The tar reader stops at the end-of-archive blocks: the rest of the stream is hashed too.
    io::copy(&mut hashed, &mut io::sink()).map_err(corrupt)?;
    let digest = format!("sha256:{}", hex::encode(hashed.hash.finalize()));
    Ok((digest, whiteouts))
}

fn whiteout_of(parts: &[&[u8]], raw: &[u8]) -> Result<Option<Whiteout>> {
    let Some((name, parent)) = parts.split_last() else {
        return Ok(None);
    };
    let Some(target) = name.strip_prefix(WHITEOUT) else {
        return Ok(None);
    };
    let parent = parent.iter().map(|p| p.to_vec()).collect();
    if *name == OPAQUE {
        return Ok(Some(Whiteout { parent, name: None }));
    }
    if target.is_empty() || target == b"." || target == b".." {
        return Err(forbidden(raw, "whiteout of no name"));
    }
    Ok(Some(Whiteout {
        parent,
        name: Some(target.to_vec()),
    }))
}

/// Unpacks the layer `open` reads onto `root`: checked and hashed first (it must hash to
/// `diff_id` when one is given), then its whiteouts applied, then its entries written.
pub(super) fn unpack_layer<R: Read>(
    root: BorrowedFd<'_>,
    mut open: impl FnMut() -> Result<R>,
    diff_id: Option<&str>,
    budget: &mut Budget,
) -> Result<LayerStats> {
    let (digest, whiteouts) = scan(open()?, budget)?;
    if let Some(want) = diff_id.filter(|want| *want != digest) {
        return Err(ImageError::InvalidArchive(format!(
            "a layer hashes to {digest}, its config says {want}"
        )));
    }
    let mut stats = LayerStats::default();
    for w in &whiteouts {
        let parent: Vec<&[u8]> = w.parent.iter().map(Vec::as_slice).collect();
        let Some(dir) = open_dir(root, &parent, false, &w.parent.concat())? else {
            continue;
        };
        match &w.name {
            Some(name) => remove(dir.as_fd(), name)?,
            None => clear(dir.as_fd())?,
        }
        stats.whiteouts += 1;
    }
    let mut archive = tar::Archive::new(open()?);
    for entry in archive.entries().map_err(corrupt)? {
        let entry = entry.map_err(corrupt)?;
        write_entry(root, entry, &mut stats)?;
    }
    Ok(stats)
}

fn write_entry<R: Read>(
    root: BorrowedFd<'_>,
    mut entry: tar::Entry<'_, R>,
    stats: &mut LayerStats,
) -> Result<()> {
    let raw = entry.path_bytes().into_owned();
    let parts = components(&raw)?;
    let Some((name, parent)) = parts.split_last() else {
        return Ok(()); // the root itself: it keeps the mode the store gives it
    };
    if name.starts_with(WHITEOUT) {
        return Ok(()); // applied before the entries
    }
    let kind = entry.header().entry_type();
    let mode = entry.header().mode().map_err(corrupt)? & 0o1777;
    let owner = owner_of(entry.header());
    let dir = match open_dir(root, parent, true, &raw)? {
        Some(dir) => dir,
        None => return Err(forbidden(&raw, "parent missing")),
    };
    let dir = dir.as_fd();
    stats.entries += 1;
    match kind {
        EntryType::Directory => make_dir(dir, name, mode, owner, &raw),
        kind if is_file(kind) => {
            remove(dir, name)?;
            let fd = rustix::fs::openat(
                dir,
                *name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::RUSR | Mode::WUSR,
            )
            .map_err(|e| io_at("create", &raw, e))?;
            let mut file = std::fs::File::from(fd);
            let size = entry.size();
            stats.bytes += io::copy(&mut (&mut entry).take(size), &mut file)
                .map_err(|e| io_at("write", &raw, e))?;
            own(&file, mode, owner, &raw)
        }
        EntryType::Symlink => {
            let target = entry.link_name_bytes().unwrap_or_default();
            if target.is_empty() || target.contains(&0) {
                return Err(forbidden(&raw, "symlink to no target"));
            }
            remove(dir, name)?;
            rustix::fs::symlinkat(&*target, dir, *name).map_err(|e| io_at("symlink", &raw, e))?;
            let (uid, gid) = owner;
            rustix::fs::chownat(dir, *name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io_at("chown", &raw, e))
        }
        EntryType::Link => {
            let target = entry.link_name_bytes().unwrap_or_default().into_owned();
            hard_link(root, dir, name, &target, &raw)
        }
        _ => {
            stats.entries -= 1;
            stats.dropped += 1;
            Ok(())
        }
    }
}

/// Regular files, also GNU sparse ones (the tar reader fills their holes in).
pub(super) fn is_file(kind: EntryType) -> bool {
    matches!(
        kind,
        EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse
    )
}

/// The owner an entry's header names, as the sandbox sees it: an id no sandbox has (65536 or
/// more) is root's, and so is one the header leaves blank (some tools write none). The store
/// mounts the tree id-mapped, so these are each sandbox's own ids.
fn owner_of(header: &tar::Header) -> (Uid, Gid) {
    let id = |raw: io::Result<u64>| -> u32 {
        raw.ok()
            .and_then(|id| u32::try_from(id).ok())
            .filter(|&id| id < SANDBOX_IDS)
            .unwrap_or(0)
    };
    (
        Uid::from_raw(id(header.uid())),
        Gid::from_raw(id(header.gid())),
    )
}

/// Gives a file or directory its owner, then its mode (a chown would clear set-id bits).
fn own(fd: impl AsFd, mode: u32, (uid, gid): (Uid, Gid), raw: &[u8]) -> Result<()> {
    rustix::fs::fchown(&fd, Some(uid), Some(gid)).map_err(|e| io_at("chown", raw, e))?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| io_at("chmod", raw, e))
}

fn make_dir(
    dir: BorrowedFd<'_>,
    name: &[u8],
    mode: u32,
    owner: (Uid, Gid),
    raw: &[u8],
) -> Result<()> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
        Ok(_) => {
            remove(dir, name)?;
            mkdir(dir, name, raw)?;
        }
        Err(Errno::NOENT) => mkdir(dir, name, raw)?,
        Err(e) => return Err(io_at("stat", raw, e)),
    }
    let fd = open_child_dir(dir, name, raw)?;
    own(&fd, mode, owner, raw)
}

fn mkdir(dir: BorrowedFd<'_>, name: &[u8], raw: &[u8]) -> Result<()> {
    match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(io_at("mkdir", raw, e)),
    }
}

/// A hard link at `dir`/`name` to `target`, which must be a regular file already in the tree.
fn hard_link(
    root: BorrowedFd<'_>,
    dir: BorrowedFd<'_>,
    name: &[u8],
    target: &[u8],
    raw: &[u8],
) -> Result<()> {
    let parts = components(target)?;
    let Some((tname, tparent)) = parts.split_last() else {
        return Err(forbidden(raw, "hard link to the root"));
    };
    let Some(tdir) = open_dir(root, tparent, false, raw)? else {
        return Err(forbidden(raw, "hard link to a missing file"));
    };
    match rustix::fs::statat(&tdir, *tname, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {}
        _ => return Err(forbidden(raw, "hard link to no regular file")),
    }
    if parts == components(raw)? {
        return Err(forbidden(raw, "hard link to itself"));
    }
    remove(dir, name)?;
    rustix::fs::linkat(&tdir, *tname, dir, name, AtFlags::empty())
        .map_err(|e| io_at("hard link", raw, e))
}

/// The directory `parts` below `root`, each component opened without following a symlink;
/// missing ones are made (0755) when `create`, else the answer is `None`.
fn open_dir(
    root: BorrowedFd<'_>,
    parts: &[&[u8]],
    create: bool,
    raw: &[u8],
) -> Result<Option<OwnedFd>> {
    let mut cur = rustix::fs::openat(root, c".", dir_flags(), Mode::empty())
        .map_err(|e| io_at("open the root", raw, e))?;
    for part in parts {
        let next = match rustix::fs::openat(&cur, *part, dir_flags(), Mode::empty()) {
            Err(Errno::NOENT) if create => {
                mkdir(cur.as_fd(), part, raw)?;
                open_child_dir(cur.as_fd(), part, raw)?
            }
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP | Errno::NOTDIR) => return Err(not_a_dir(cur.as_fd(), part, raw)),
            Err(e) => return Err(io_at("open", raw, e)),
            Ok(fd) => fd,
        };
        cur = next;
    }
    Ok(Some(cur))
}

fn open_child_dir(dir: BorrowedFd<'_>, name: &[u8], raw: &[u8]) -> Result<OwnedFd> {
    rustix::fs::openat(dir, name, dir_flags(), Mode::empty()).map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => not_a_dir(dir, name, raw),
        e => io_at("open", raw, e),
    })
}

fn not_a_dir(dir: BorrowedFd<'_>, name: &[u8], raw: &[u8]) -> ImageError {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
            forbidden(raw, "writes through a symlink")
        }
        _ => forbidden(raw, "a parent is no directory"),
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Removes `name` from `dir` (a directory with everything below it), never following a link.
fn remove(dir: BorrowedFd<'_>, name: &[u8]) -> Result<()> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io_at("stat", name, e)),
    };
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        clear(open_child_dir(dir, name, name)?.as_fd())?;
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).map_err(|e| io_at("rmdir", name, e))
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(|e| io_at("unlink", name, e))
    }
}

/// Removes every child of `dir`.
fn clear(dir: BorrowedFd<'_>) -> Result<()> {
    let mut names = Vec::new();
    let mut list = Dir::read_from(dir).map_err(|e| io_at("list", b"", e))?;
    while let Some(entry) = list.read() {
        let entry = entry.map_err(|e| io_at("list", b"", e))?;
        let name: &CStr = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_bytes().to_vec());
        }
    }
    for name in names {
        remove(dir, &name)?;
    }
    Ok(())
}

/// An entry's path as its components: relative, no `..`, no empty or `.` components.
pub(super) fn components(raw: &[u8]) -> Result<Vec<&[u8]>> {
    if raw.first() == Some(&b'/') {
        return Err(forbidden(raw, "absolute path"));
    }
    let mut parts = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(forbidden(raw, "`..` in the path")),
            p if p.contains(&0) => return Err(forbidden(raw, "NUL in the path")),
            p if p.len() > MAX_NAME => return Err(forbidden(raw, "name too long")),
            p => parts.push(p),
        }
    }
    if parts.len() > MAX_DEPTH {
        return Err(forbidden(raw, "nested too deep"));
    }
    Ok(parts)
}

struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// A path as messages show it: archive names are attacker-chosen bytes.
pub(super) fn shown(path: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(path))
}

pub(super) fn forbidden(path: &[u8], why: &'static str) -> ImageError {
    ImageError::Forbidden {
        path: shown(path),
        why,
    }
}

pub(super) fn corrupt(e: io::Error) -> ImageError {
    ImageError::InvalidArchive(format!("unreadable layer: {e}"))
}

fn io_at(what: &str, path: &[u8], e: impl Into<io::Error>) -> ImageError {
    ImageError::Io {
        context: format!("{what} {}", shown(path)),
        source: e.into(),
    }
}
