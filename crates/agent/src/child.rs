//! What every process the agent starts (exec, terminal, interpreter) goes through between fork
//! and exec, in one place so no spawn path can forget a step.

use std::os::fd::RawFd;

/// Called in the forked child once its explicit descriptors sit at `0..keep`: joins the
/// workload cgroup and marks every other descriptor close-on-exec, so nothing the agent holds
/// (its listener, other execs' pipes, connections) reaches sandbox code whatever flags it was
/// opened with. Async-signal-safe.
pub fn before_exec(keep: RawFd) -> std::io::Result<()> {
    crate::guest::join_sandbox_cgroup()?;
    mark_cloexec_from(keep)
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
