//! Applying a layer archive onto a directory, as one more overlay layer stacked on what is
//! there.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;

use rustix::fs::{
    AtFlags, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Timespec, Timestamps, Uid,
};
use rustix::io::Errno;
use tar::Archive;

use crate::path::EntryPath;
use crate::reader::{self, Item, Kind, Meta, Stream};
use crate::xattrs::{self, OPAQUE};
use crate::{shown, ApplyOptions, Budget, LayerError, Owners, Stats};

/// Zero runs are detected per filesystem block, so holes line up with the disk's.
const BLOCK: usize = 4096;
const CHUNK: usize = 1024 * 1024;

/// Applies a stream onto the directory `root` as an overlay upper layer stacked on what is
/// there: an entry replaces what exists at its path; a directory merges with an existing one
/// unless it is opaque (then the old children go first). See the crate docs for what is
/// refused. On error the target holds a partial result: the caller discards it.
pub fn apply(
    root: BorrowedFd<'_>,
    input: impl Read,
    opts: &ApplyOptions,
) -> Result<Stats, LayerError> {
    let mut state = Apply {
        root,
        owners: opts.owners,
        budget: Budget::new(&opts.limits),
        created: HashSet::new(),
        open_dirs: Vec::new(),
        buf: vec![0; CHUNK],
    };
    let mut archive = Archive::new(input);
    {
        let mut stream = Stream::new(&mut archive)?;
        while let Some(item) = stream.next_item()? {
            state.budget.entry()?;
            state.leave_dirs(Some(&item.path))?;
            state.item(item)?;
        }
    }
    reader::check_end(archive.into_inner())?;
    state.leave_dirs(None)?;
    Ok(state.budget.stats)
}

struct Apply<'a> {
    root: BorrowedFd<'a>,
    owners: Owners,
    budget: Budget<'a>,
    /// Inodes (device, number) of the regular files this apply created: the only hard-link
    /// targets allowed. Inodes rather than paths: 16 bytes per file whatever the names, and a
    /// path replaced since by something else no longer matches.
    created: HashSet<(u64, u64)>,
    /// The directories the archive is inside of, outermost first, with the mode and mtime
    /// they get once their children are in place. Archives list a directory's children right
    /// after it (capture walks depth-first), so this stays at most `MAX_DEPTH` deep; an
    /// archive that comes back to a directory later only costs that directory its mtime.
    open_dirs: Vec<(EntryPath, u32, u64)>,
    buf: Vec<u8>,
}

impl Apply<'_> {
    fn item<R: Read>(&mut self, mut item: Item<'_, R>) -> Result<(), LayerError> {
        let owner = self.owner(&item.path, &item.meta)?;
        if let Kind::File = item.kind {
            self.budget.bytes(item.path.as_bytes(), item.size)?;
        }
        if let Kind::HardLink(target) = &item.kind {
            self.check_link_target(&item.path, target)?;
        }
        let (owned, name) = self.parent_of(&item.path, &item.path)?;
        let dir = owned.as_ref().map_or(self.root, |fd| fd.as_fd());
        let name = cstring(name, &item.path)?;
        let old = match rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(FileType::from_raw_mode(st.st_mode)),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(io_at("stat", &item.path, e)),
        };
        let at = At {
            dir,
            name: &name,
            path: &item.path,
        };
        match (old, &item.kind) {
            (_, Kind::Dir) | (None, _) => {}
            (Some(old), _) => at.remove(old)?,
        }
        match &item.kind {
            Kind::Dir => self.dir(&at, old, &item.meta, owner),
            Kind::File => self.file(&at, &mut item.data, item.size, &item.meta, owner),
            Kind::HardLink(target) => self.hard_link(&at, target),
            Kind::Symlink(target) => {
                rustix::fs::symlinkat(target.as_slice(), dir, &name)
                    .map_err(|e| io_at("creating symlink", at.path, e))?;
                at.own_by_name(owner, item.meta.mtime)
            }
            Kind::Fifo => {
                rustix::fs::mkfifoat(dir, &name, Mode::RUSR | Mode::WUSR)
                    .map_err(|e| io_at("creating fifo", at.path, e))?;
                // Read-only and non-blocking: opening a fifo so never waits for a writer.
                let fd = at.open(OFlags::RDONLY | OFlags::NONBLOCK)?;
                own_fd(fd.as_fd(), at.path, owner, item.meta.mode, item.meta.mtime)
            }
            Kind::Whiteout => {
                // As overlayfs makes them: char 0:0, mode 0.
                let dev = rustix::fs::makedev(0, 0);
                rustix::fs::mknodat(dir, &name, FileType::CharacterDevice, Mode::empty(), dev)
                    .map_err(|e| io_at("creating whiteout", at.path, e))?;
                at.own_by_name(owner, item.meta.mtime)
            }
        }
    }

    fn owner(&self, path: &EntryPath, meta: &Meta) -> Result<(Uid, Gid), LayerError> {
        let map = |id: u64| -> Option<u32> {
            let id = u32::try_from(id).ok()?;
            let host = match self.owners {
                Owners::AsIs => Some(id),
                Owners::Shift { base, size } => (id < size).then(|| base.checked_add(id)).flatten(),
            }?;
            // -1 means "leave unchanged" to chown: the file would stay the daemon's.
            (host != u32::MAX).then_some(host)
        };
        match (map(meta.uid), map(meta.gid)) {
            (Some(uid), Some(gid)) => Ok((Uid::from_raw(uid), Gid::from_raw(gid))),
            _ => Err(LayerError::forbidden(
                path.as_bytes(),
                "owner outside the id range",
            )),
        }
    }

    fn check_link_target(&self, path: &EntryPath, target: &EntryPath) -> Result<(), LayerError> {
        let refused = || {
            LayerError::forbidden(
                path.as_bytes(),
                "hard link to a file this layer did not create",
            )
        };
        if target == path {
            return Err(refused());
        }
        let (owned, name) = self.parent_of(target, path)?;
        let dir = owned.as_ref().map_or(self.root, |fd| fd.as_fd());
        let st = rustix::fs::statat(
            dir,
            cstring(name, target)?.as_c_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|_| refused())?;
        let ours = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
            && self.created.contains(&(st.st_dev, st.st_ino));
        if !ours {
            return Err(refused());
        }
        Ok(())
    }

    /// The parent of `path` (`None`: the root itself) and the final name.
    fn parent_of<'p>(
        &self,
        path: &'p EntryPath,
        entry: &EntryPath,
    ) -> Result<(Option<OwnedFd>, &'p [u8]), LayerError> {
        let (parent, name) = path.split();
        let dir = if parent.is_empty() {
            None
        } else {
            Some(self.resolve(parent, entry)?)
        };
        Ok((dir, name))
    }

    /// The directory at `path`, resolved inside the root without following any symlink or
    /// crossing a mount.
    fn resolve(&self, path: &[u8], entry: &EntryPath) -> Result<OwnedFd, LayerError> {
        let how = ResolveFlags::IN_ROOT
            | ResolveFlags::NO_SYMLINKS
            | ResolveFlags::NO_MAGICLINKS
            | ResolveFlags::NO_XDEV;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        rustix::fs::openat2(self.root, path, flags, Mode::empty(), how).map_err(|e| {
            let e = match e {
                Errno::LOOP => return LayerError::forbidden(entry.as_bytes(), "symlink in path"),
                Errno::NOTDIR => {
                    return LayerError::forbidden(entry.as_bytes(), "parent is no directory")
                }
                Errno::XDEV => {
                    return LayerError::forbidden(entry.as_bytes(), "path crosses a mount")
                }
                Errno::NOENT => {
                    return LayerError::Corrupt(format!(
                        "{}: parent missing",
                        shown(entry.as_bytes())
                    ))
                }
                e => e,
            };
            io_at("resolving", entry, e)
        })
    }

    fn dir(
        &mut self,
        at: &At<'_>,
        old: Option<FileType>,
        meta: &Meta,
        owner: (Uid, Gid),
    ) -> Result<(), LayerError> {
        let opaque = meta.xattrs.iter().any(|(n, v)| n == OPAQUE && v == b"y");
        let merge = old == Some(FileType::Directory);
        match old {
            Some(FileType::Directory) => {}
            Some(other) => at.remove(other)?,
            None => {}
        }
        if !merge {
            rustix::fs::mkdirat(at.dir, at.name, Mode::RWXU)
                .map_err(|e| io_at("creating directory", at.path, e))?;
        }
        let fd = at.open(OFlags::RDONLY | OFlags::DIRECTORY)?;
        if merge && opaque {
            clear(fd.as_fd(), at.path)?;
        }
        if merge {
            xattrs::replace(fd.as_fd(), at.path.as_bytes(), &meta.xattrs)?;
        } else {
            xattrs::set(fd.as_fd(), at.path.as_bytes(), &meta.xattrs)?;
        }
        chown(fd.as_fd(), at.path, owner)?;
        self.open_dirs
            .push((at.path.clone(), meta.mode, meta.mtime));
        Ok(())
    }

    fn file(
        &mut self,
        at: &At<'_>,
        data: &mut impl Read,
        size: u64,
        meta: &Meta,
        owner: (Uid, Gid),
    ) -> Result<(), LayerError> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let fd = rustix::fs::openat(
            at.dir,
            at.name,
            flags | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| io_at("creating", at.path, e))?;
        let file = File::from(fd);
        let st = rustix::fs::fstat(&file).map_err(|e| io_at("stat", at.path, e))?;
        self.created.insert((st.st_dev, st.st_ino));
        write_sparse(&file, data, size, &mut self.buf, at.path)?;
        xattrs::set(file.as_fd(), at.path.as_bytes(), &meta.xattrs)?;
        own_fd(file.as_fd(), at.path, owner, meta.mode, meta.mtime)
    }

    fn hard_link(&self, at: &At<'_>, target: &EntryPath) -> Result<(), LayerError> {
        let (owned, name) = self.parent_of(target, at.path)?;
        let dir = owned.as_ref().map_or(self.root, |fd| fd.as_fd());
        let name = cstring(name, target)?;
        rustix::fs::linkat(dir, &name, at.dir, at.name, AtFlags::empty())
            .map_err(|e| io_at("linking", at.path, e))
    }

    /// Gives the directories `next` is not inside of their final mode and mtime (all of
    /// them at the end of the archive).
    fn leave_dirs(&mut self, next: Option<&EntryPath>) -> Result<(), LayerError> {
        while let Some((path, mode, mtime)) = self.open_dirs.last() {
            if next.is_some_and(|n| n != path && n.is_within(path)) {
                break;
            }
            let fd = self.resolve(path.as_bytes(), path)?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(*mode))
                .map_err(|e| io_at("chmod", path, e))?;
            rustix::fs::futimens(&fd, &times(*mtime))
                .map_err(|e| io_at("setting times of", path, e))?;
            self.open_dirs.pop();
        }
        Ok(())
    }
}

/// The final component of an entry, relative to its resolved parent.
struct At<'a> {
    dir: BorrowedFd<'a>,
    name: &'a CString,
    path: &'a EntryPath,
}

impl At<'_> {
    fn remove(&self, old: FileType) -> Result<(), LayerError> {
        remove(self.dir, self.name, old, self.path)
    }

    fn open(&self, flags: OFlags) -> Result<OwnedFd, LayerError> {
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat(self.dir, self.name, flags, Mode::empty())
            .map_err(|e| io_at("opening", self.path, e))
    }

    /// Owner and mtime of what cannot be opened (symlinks, whiteouts), never following it.
    fn own_by_name(&self, (uid, gid): (Uid, Gid), mtime: u64) -> Result<(), LayerError> {
        rustix::fs::chownat(
            self.dir,
            self.name,
            Some(uid),
            Some(gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io_at("chown", self.path, e))?;
        rustix::fs::utimensat(
            self.dir,
            self.name,
            &times(mtime),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io_at("setting times of", self.path, e))
    }
}

fn chown(fd: BorrowedFd<'_>, path: &EntryPath, (uid, gid): (Uid, Gid)) -> Result<(), LayerError> {
    rustix::fs::fchown(fd, Some(uid), Some(gid)).map_err(|e| io_at("chown", path, e))
}

/// Mode after owner: chown clears setuid and setgid.
fn own_fd(
    fd: BorrowedFd<'_>,
    path: &EntryPath,
    owner: (Uid, Gid),
    mode: u32,
    mtime: u64,
) -> Result<(), LayerError> {
    chown(fd, path, owner)?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(|e| io_at("chmod", path, e))?;
    rustix::fs::futimens(fd, &times(mtime)).map_err(|e| io_at("setting times of", path, e))
}

fn times(mtime: u64) -> Timestamps {
    let t = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Removes `name` (a whole tree for a directory) without following any symlink.
fn remove(
    dir: BorrowedFd<'_>,
    name: &CString,
    kind: FileType,
    path: &EntryPath,
) -> Result<(), LayerError> {
    if kind != FileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty())
            .map_err(|e| io_at("removing", path, e));
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let child = rustix::fs::openat(dir, name, flags, Mode::empty())
        .map_err(|e| io_at("opening", path, e))?;
    clear(child.as_fd(), path)?;
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).map_err(|e| io_at("removing", path, e))
}

/// Empties a directory.
fn clear(dir: BorrowedFd<'_>, path: &EntryPath) -> Result<(), LayerError> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir).map_err(|e| io_at("listing", path, e))? {
        let entry = entry.map_err(|e| io_at("listing", path, e))?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    for name in names {
        let st = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_at("stat", path, e))?;
        remove(dir, &name, FileType::from_raw_mode(st.st_mode), path)?;
    }
    Ok(())
}

/// Writes exactly `size` bytes from `data`, leaving every all-zero block a hole, so a sparse
/// file stays sparse.
fn write_sparse(
    file: &File,
    data: &mut impl Read,
    size: u64,
    buf: &mut [u8],
    path: &EntryPath,
) -> Result<(), LayerError> {
    let mut offset = 0u64;
    while offset < size {
        let want = buf
            .len()
            .min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let got = read_full(data, &mut buf[..want])?;
        if got == 0 {
            break;
        }
        write_data_blocks(file, &buf[..got], offset).map_err(|e| io_at("writing", path, e))?;
        offset += got as u64;
    }
    if offset != size {
        return Err(LayerError::Corrupt(format!(
            "{}: content truncated",
            shown(path.as_bytes())
        )));
    }
    // Extends the file over a trailing hole.
    file.set_len(size).map_err(|e| io_at("writing", path, e))
}

/// Writes the runs of non-zero blocks of `chunk` (which starts at `offset`, block-aligned).
fn write_data_blocks(file: &File, chunk: &[u8], offset: u64) -> io::Result<()> {
    let mut run: Option<usize> = None;
    for (i, block) in chunk.chunks(BLOCK).enumerate() {
        let start = i * BLOCK;
        match (is_zero(block), run) {
            (false, None) => run = Some(start),
            (true, Some(from)) => {
                file.write_all_at(&chunk[from..start], offset + from as u64)?;
                run = None;
            }
            _ => {}
        }
    }
    match run {
        Some(from) => file.write_all_at(&chunk[from..], offset + from as u64),
        None => Ok(()),
    }
}

fn is_zero(block: &[u8]) -> bool {
    // No early exit: a branch-free fold vectorises, and a block is only 4 KiB.
    block.iter().fold(0, |acc, b| acc | b) == 0
}

fn read_full(data: &mut impl Read, buf: &mut [u8]) -> Result<usize, LayerError> {
    let mut got = 0;
    while got < buf.len() {
        match data.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(reader::read_error(e)),
        }
    }
    Ok(got)
}

fn cstring(name: &[u8], path: &EntryPath) -> Result<CString, LayerError> {
    CString::new(name).map_err(|_| LayerError::forbidden(path.as_bytes(), "NUL in path"))
}

fn io_at(what: &str, path: &EntryPath, e: impl Into<io::Error>) -> LayerError {
    LayerError::io(format!("{what} {}", shown(path.as_bytes())), e)
}
