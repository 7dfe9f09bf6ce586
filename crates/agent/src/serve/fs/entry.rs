//! `Entry` values from `statx`, never following the final symlink.

use std::os::fd::BorrowedFd;

use koder_agent_protocol::{Entry, EntryKind};
use rustix::fs::{self as rfs, AtFlags, FileType, Statx, StatxFlags};
use rustix::io::Errno;

pub(super) fn fd_statx(fd: BorrowedFd<'_>) -> Result<Statx, Errno> {
    rfs::statx(fd, c"", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS)
}

pub(super) fn file_type(st: &Statx) -> FileType {
    FileType::from_raw_mode(u32::from(st.stx_mode))
}

/// lstat-style entry of `name` in `dir`.
pub(super) fn entry_at<P: rustix::path::Arg + Copy>(
    dir: BorrowedFd<'_>,
    name: P,
    display_name: impl Into<String>,
    path: String,
) -> Result<Entry, Errno> {
    let st = rfs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    let target = if file_type(&st) == FileType::Symlink {
        rfs::readlinkat(dir, name, Vec::new())
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    Ok(entry_from(display_name.into(), path, &st, target))
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
    }
}
