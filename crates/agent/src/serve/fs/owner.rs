//! Owners requested for created files and directories.

use std::os::fd::BorrowedFd;

use koder_agent_protocol::{AgentError, ErrorCode};
use rustix::fs as rfs;
use rustix::io::Errno;

/// Sandbox uids and gids that exist (the size of a sandbox's id map).
const MAPPED_IDS: u32 = 65536;

/// Sandbox ids beyond the 65536 a sandbox maps would fail the chown with a puzzling EINVAL.
pub(super) fn check_owner(owner: Option<(u32, u32)>) -> Result<(), AgentError> {
    match owner {
        Some((uid, gid)) if uid >= MAPPED_IDS || gid >= MAPPED_IDS => Err(AgentError::new(
            ErrorCode::InvalidRequest,
            format!("owner {uid}:{gid}: sandbox ids are below {MAPPED_IDS}"),
        )),
        _ => Ok(()),
    }
}

pub(super) fn chown_fd(fd: BorrowedFd<'_>, (uid, gid): (u32, u32)) -> Result<(), Errno> {
    rfs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )
}
