//! What every process the agent starts (exec, terminal, interpreter) goes through between fork
//! and exec, in one place so no spawn path can forget a step.

use std::os::fd::{IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use koder_agent_protocol::init::MAX_WORKLOAD_CGROUP_FDS;

const SLOTS: usize = MAX_WORKLOAD_CGROUP_FDS as usize;

/// `cgroup.procs` files of the workload cgroup (a jail's `workload` group, one file per v1
/// hierarchy; a guest's `sandbox` group), open for writing; -1 in unused slots. Process-wide
/// integers on purpose: the forked child uses them where nothing may lock or allocate. The
/// descriptors are close-on-exec, so no sandbox process ever holds one and none can move
/// itself back into the agent's group.
static WORKLOAD_PROCS: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

#[derive(Debug, thiserror::Error)]
pub enum WorkloadCgroupError {
    #[error("{given} workload cgroup descriptors given, at most {SLOTS} are supported")]
    TooMany { given: usize },
    #[error("the workload cgroup is already set")]
    AlreadySet,
    #[error("keeping a workload cgroup descriptor: {0}")]
    Dup(rustix::io::Errno),
}

/// Lowest descriptor the kept files move to: children place their hand-overs on fixed low
/// numbers (an interpreter's driver on 5), which must never land on one of these.
const KEEP_FROM: RawFd = 10;

/// Makes every later child join the group whose `cgroup.procs` files these are (kept open for
/// the agent's lifetime). Called once, before the first child.
pub fn set_workload_cgroup(procs: Vec<OwnedFd>) -> Result<(), WorkloadCgroupError> {
    if procs.len() > SLOTS {
        return Err(WorkloadCgroupError::TooMany { given: procs.len() });
    }
    if WORKLOAD_PROCS[0].load(Ordering::Relaxed) >= 0 {
        return Err(WorkloadCgroupError::AlreadySet);
    }
    for (slot, fd) in WORKLOAD_PROCS.iter().zip(procs) {
        let kept =
            rustix::io::fcntl_dupfd_cloexec(&fd, KEEP_FROM).map_err(WorkloadCgroupError::Dup)?;
        slot.store(kept.into_raw_fd(), Ordering::Relaxed);
    }
    Ok(())
}

/// Called in the forked child once its explicit descriptors sit at `0..keep`: joins the
/// workload cgroup and marks every other descriptor close-on-exec, so nothing the agent holds
/// (its listener, the cgroup files, other execs' pipes, connections) reaches sandbox code
/// whatever flags it was opened with. Async-signal-safe.
pub fn before_exec(keep: RawFd) -> std::io::Result<()> {
    join_workload_cgroup()?;
    mark_cloexec_from(keep)
}

/// Moves the calling process into the workload cgroup; a no-op without one. Async-signal-safe.
fn join_workload_cgroup() -> std::io::Result<()> {
    for slot in &WORKLOAD_PROCS {
        let fd = slot.load(Ordering::Relaxed);
        if fd < 0 {
            break;
        }
        // SAFETY: write(2) of a 1-byte static buffer to a descriptor the agent keeps open
        // forever ("0" = the writer itself).
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Marks every descriptor from `first` up close-on-exec. Async-signal-safe.
pub fn mark_cloexec_from(first: RawFd) -> std::io::Result<()> {
    let first = u32::try_from(first).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: close_range only changes descriptor flags; it touches no memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
