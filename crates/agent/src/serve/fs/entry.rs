//! `Entry` values from `statx` (with metadata), never following the final symlink.

use std::os::fd::{AsFd, BorrowedFd};

use koder_agent_protocol::{Entry, EntryKind};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Statx, StatxFlags};
use rustix::io::Errno;

use super::xattr;

pub(super) fn fd_statx(fd: BorrowedFd<'_>) -> Result<Statx, Errno> {
    rfs::statx(fd, c"", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS)
}

pub(super) fn file_type(st: &Statx) -> FileType {
    FileType::from_raw_mode(u32::from(st.stx_mode))
}

/// lstat-style entry of `name` in `dir`, with its metadata.
pub(super) fn entry_at<P: rustix::path::Arg + Copy>(
    dir: BorrowedFd<'_>,
    name: P,
    display_name: impl Into<String>,
    path: String,
) -> Result<Entry, Errno> {
    // One descriptor for every fact, so type, link target and metadata are of one inode.
    let fd = rfs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    entry_of_fd(fd.as_fd(), display_name.into(), path)
}

/// The entry of what the `O_PATH` descriptor `fd` holds.
pub(super) fn entry_of_fd(fd: BorrowedFd<'_>, name: String, path: String) -> Result<Entry, Errno> {
    let st = fd_statx(fd)?;
    let kind = file_type(&st);
    let target = if kind == FileType::Symlink {
        rfs::readlinkat(fd, c"", Vec::new())
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    let mut entry = entry_from(name, path, &st, target);
    // User xattrs exist on regular files and directories only.
    if matches!(kind, FileType::RegularFile | FileType::Directory) {
        entry.metadata = xattr::read(fd);
    }
    Ok(entry)
}

pub(super) fn entry_from(
    name: String,
    path: String,
    st: &Statx,
    symlink_target: Option<String>,
) -> Entry {
    let kind = match file_type(st) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let modified_ms = st
        .stx_mtime
        .tv_sec
        .saturating_mul(1000)
        .saturating_add(i64::from(st.stx_mtime.tv_nsec / 1_000_000));
    Entry {
        name,
        path,
        kind,
        size: st.stx_size,
        mode: u32::from(st.stx_mode) & 0o7777,
        modified_ms,
        symlink_target,
        uid: st.stx_uid,
        gid: st.stx_gid,
        metadata: Vec::new(),
    }
}
