//! Writing a directory tree as a layer archive.

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use tar::{Builder, EntryType, Header};

use crate::xattrs::{self, Xattr};
use crate::{shown, Budget, LayerError, Limits, Owners, Stats, MAX_DEPTH, MAX_PATH};

/// The id an owner outside a user namespace's mapping shows as inside it (the kernel's
/// default `overflowuid`/`overflowgid`): what a capture from inside would have recorded.
const OVERFLOW_ID: u32 = 65534;

/// Link targets longer than this do not fit the header and go to a PAX `linkpath` record.
const HEADER_LINK_MAX: usize = 100;

/// Writes the tree under the directory `root` (an fd; never follows symlinks, never leaves the
/// tree) as a tar stream. See the crate docs for what is recorded and guaranteed.
pub fn capture(
    root: BorrowedFd<'_>,
    out: impl Write,
    limits: &Limits,
) -> Result<Stats, LayerError> {
    capture_owned(root, out, limits, Owners::AsIs)
}

/// [`capture`] of a tree whose owners are `owners` of the archive's ids (as [`crate::apply`]
/// would write them): the archive records them as a capture inside that id range would
/// have, an owner outside it as the overflow id.
pub(crate) fn capture_owned(
    root: BorrowedFd<'_>,
    out: impl Write,
    limits: &Limits,
    owners: Owners,
) -> Result<Stats, LayerError> {
    let mut walk = Walk {
        owners,
        tar: Builder::new(BufWriter::with_capacity(256 * 1024, out)),
        budget: Budget::new(limits),
        links: HashMap::new(),
        path: Vec::new(),
    };
    walk.dir(root, 0)?;
    let written = walk.tar.into_inner().and_then(|mut w| w.flush());
    written.map_err(|e| LayerError::io("writing the archive", e))?;
    Ok(walk.budget.stats)
}

struct Walk<'a, W: Write> {
    owners: Owners,
    tar: Builder<W>,
    budget: Budget<'a>,
    /// First archive path of every inode with more than one link seen so far.
    links: HashMap<(u64, u64), Vec<u8>>,
    /// Archive path of the entry at hand.
    path: Vec<u8>,
}

impl<W: Write> Walk<'_, W> {
    fn dir(&mut self, dir: BorrowedFd<'_>, depth: usize) -> Result<(), LayerError> {
        for name in self.sorted_names(dir)? {
            let parent_len = self.path.len();
            if !self.path.is_empty() {
                self.path.push(b'/');
            }
            self.path.extend_from_slice(name.to_bytes());
            if self.path.len() > MAX_PATH {
                return Err(LayerError::forbidden(&self.path, "path too long"));
            }
            if depth >= MAX_DEPTH {
                return Err(LayerError::forbidden(&self.path, "path too deep"));
            }
            self.entry(dir, &name, depth + 1)?;
            self.path.truncate(parent_len);
        }
        Ok(())
    }

    fn sorted_names(&self, dir: BorrowedFd<'_>) -> Result<Vec<std::ffi::CString>, LayerError> {
        let list = Dir::read_from(dir).map_err(|e| self.io("opening directory", e))?;
        let mut names = Vec::new();
        for entry in list {
            let entry = entry.map_err(|e| self.io("reading directory", e))?;
            let name = entry.file_name();
            if name != c"." && name != c".." {
                names.push(name.to_owned());
            }
        }
        names.sort_unstable();
        Ok(names)
    }

    fn entry(&mut self, dir: BorrowedFd<'_>, name: &CStr, depth: usize) -> Result<(), LayerError> {
        let mut st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| self.io("stat", e))?;
        st.st_uid = archive_id(self.owners, st.st_uid);
        st.st_gid = archive_id(self.owners, st.st_gid);
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                self.budget.entry()?;
                let child = self.open(dir, name, &st, OFlags::DIRECTORY)?;
                let xattrs = xattrs::read(child.as_fd(), &self.path)?;
                self.append(
                    &mut header(&st, EntryType::Directory),
                    &xattrs,
                    None,
                    io::empty(),
                )?;
                self.dir(child.as_fd(), depth)
            }
            FileType::RegularFile => self.file(dir, name, &st),
            FileType::Symlink => {
                self.budget.entry()?;
                let target = rustix::fs::readlinkat(dir, name, Vec::new())
                    .map_err(|e| self.io("reading symlink", e))?;
                let mut h = header(&st, EntryType::Symlink);
                self.append(&mut h, &[], Some(target.as_bytes()), io::empty())
            }
            FileType::Fifo => {
                self.budget.entry()?;
                self.append(&mut header(&st, EntryType::Fifo), &[], None, io::empty())
            }
            // An overlay whiteout; other devices have no place in a layer.
            FileType::CharacterDevice if st.st_rdev == 0 => {
                self.budget.entry()?;
                let mut h = header(&st, EntryType::Char);
                h.set_device_major(0)
                    .and_then(|()| h.set_device_minor(0))
                    .map_err(|e| self.io("header", e))?;
                self.append(&mut h, &[], None, io::empty())
            }
            _ => Ok(()),
        }
    }

    fn file(&mut self, dir: BorrowedFd<'_>, name: &CStr, st: &Stat) -> Result<(), LayerError> {
        self.budget.entry()?;
        let inode = (st.st_dev, st.st_ino);
        if st.st_nlink > 1 {
            if let Some(first) = self.links.get(&inode) {
                let first = first.clone();
                let mut h = header(st, EntryType::Link);
                return self.append(&mut h, &[], Some(&first), io::empty());
            }
            self.links.insert(inode, self.path.clone());
        }
        // From the apparent size, before a byte is read: a sparse 10 GB file fails here.
        let size = u64::try_from(st.st_size).unwrap_or(0);
        self.budget.bytes(&self.path, size)?;
        let file = File::from(self.open(dir, name, st, OFlags::NOCTTY | OFlags::NONBLOCK)?);
        let xattrs = xattrs::read(file.as_fd(), &self.path)?;
        let mut h = header(st, EntryType::Regular);
        h.set_size(size);
        self.append(&mut h, &xattrs, None, Exact { file, left: size })
    }

    /// Opens what `st` described, refusing anything that is no longer that inode.
    fn open(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        st: &Stat,
        flags: OFlags,
    ) -> Result<OwnedFd, LayerError> {
        let flags = flags | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, Mode::empty())
            .map_err(|e| self.io("opening", e))?;
        let now = rustix::fs::fstat(&fd).map_err(|e| self.io("stat", e))?;
        let same = (now.st_dev, now.st_ino, now.st_mode, now.st_size)
            == (st.st_dev, st.st_ino, st.st_mode, st.st_size);
        if !same {
            return Err(self.io("opening", io::Error::other("changed during the capture")));
        }
        Ok(fd)
    }

    fn append(
        &mut self,
        header: &mut Header,
        xattrs: &[Xattr],
        link: Option<&[u8]>,
        data: impl Read,
    ) -> Result<(), LayerError> {
        let mut pax: Vec<(String, &[u8])> = Vec::with_capacity(xattrs.len() + 1);
        for (name, value) in xattrs {
            let name = std::str::from_utf8(name)
                .map_err(|_| LayerError::forbidden(&self.path, "xattr name is not UTF-8"))?;
            pax.push((format!("{}{name}", xattrs::PAX_PREFIX), value));
        }
        match link {
            // Verbatim: `set_link_name` would normalise `a//b` or a trailing `/`.
            Some(target) if target.len() <= HEADER_LINK_MAX => header
                .set_link_name_literal(target)
                .map_err(|e| self.io("header", e))?,
            Some(target) => pax.push(("linkpath".to_owned(), target)),
            None => {}
        }
        let path = Path::new(OsStr::from_bytes(&self.path));
        let written = self
            .tar
            .append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), *v)))
            .and_then(|()| self.tar.append_data(header, path, data));
        written.map_err(|e| self.io("writing the archive at", e))
    }

    fn io(&self, what: &str, e: impl Into<io::Error>) -> LayerError {
        LayerError::io(format!("{what} {}", shown(&self.path)), e)
    }
}

fn archive_id(owners: Owners, id: u32) -> u32 {
    match owners {
        Owners::AsIs => id,
        Owners::Shift { base, size } => id
            .checked_sub(base)
            .filter(|n| *n < size)
            .unwrap_or(OVERFLOW_ID),
    }
}

fn header(st: &Stat, kind: EntryType) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid.into());
    h.set_gid(st.st_gid.into());
    h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
    h.set_size(0);
    h
}

/// Exactly `left` bytes of a file: the size already written in its header. A file that
/// shrank is an error, never a short entry that would shift the rest of the archive.
struct Exact {
    file: File,
    left: u64,
}

impl Read for Exact {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank during the capture",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}
