//! Forking an interpreter with its hand-overs at fixed descriptors and its driver in a sealed
//! memfd.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::lang::DRIVER_FD;

/// `program` as an executable file: as given when it has a slash, else the first match along
/// the PATH of `env`.
pub(super) fn find_program(program: &str, env: &[(String, String)]) -> Option<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p).then_some(p);
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", |(_, v)| v.as_str());
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join(program))
        .find(|p| executable(p))
}

pub(super) struct Forked {
    pub(super) pid: i32,
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) requests: OwnedFd,
    pub(super) events: OwnedFd,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
}

/// A close-on-exec pipe whose ends sit at fd 10 or above, so the child's `dup2`s onto fds 0-4
/// can never overwrite a pipe end it has yet to move.
fn high_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((
        rustix::io::fcntl_dupfd_cloexec(&r, 10)?,
        rustix::io::fcntl_dupfd_cloexec(&w, 10)?,
    ))
}

/// The driver's source in an anonymous, sealed file: the interpreter reads it from
/// [`DRIVER_FD`].
pub(super) fn driver_file(source: &str) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "koder-driver",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut written = 0;
    while written < source.len() {
        written += rustix::io::write(&fd, &source.as_bytes()[written..])?;
    }
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    // Above the fds the child moves its hand-overs onto, like the pipes.
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 10)?)
}

/// Forks and execs the interpreter with requests on fd 3, events on fd 4, its driver's source on
/// fd 5, output pipes on fds 1/2 and an empty stdin, in a new session. A plain fork rather than `Command`: the agent's
/// reaper collects every child's status, so nothing here may wait for the child (std's spawn
/// does when exec fails), and `Command` cannot place descriptors at fixed numbers without
/// `pre_exec`. Exec failures come back through a close-on-exec pipe instead.
pub(super) fn fork_exec(
    prog: &CString,
    argv: &[CString],
    envp: &[CString],
    cwd: &CString,
    driver: &OwnedFd,
) -> std::io::Result<Forked> {
    let (req_r, req_w) = high_pipe()?;
    let (ev_r, ev_w) = high_pipe()?;
    let (out_r, out_w) = high_pipe()?;
    let (err_r, err_w) = high_pipe()?;
    let (in_r, in_w) = high_pipe()?;
    let (fail_r, fail_w) = high_pipe()?;
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_ptrs: Vec<*const libc::c_char> = envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let fds = ChildFds {
        stdin: in_r.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        requests: req_r.as_raw_fd(),
        events: ev_w.as_raw_fd(),
        driver: driver.as_raw_fd(),
        fail: fail_w.as_raw_fd(),
    };
    // SAFETY: the child only makes async-signal-safe calls on memory prepared before the fork
    // (no allocation, no locks) and ends in execve or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; every pointer stays valid in the child's copy of this frame.
        unsafe {
            exec_child(
                &fds,
                prog.as_ptr(),
                argv_ptrs.as_ptr(),
                envp_ptrs.as_ptr(),
                cwd.as_ptr(),
            )
        }
    }
    drop((req_r, ev_w, out_w, err_w, in_r, in_w, fail_w));
    // SAFETY: pidfd_open takes plain integers; the child cannot have been reaped yet unless it
    // already died, in which case this fails and the exec report says why.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative result is a new descriptor that nothing else owns.
    let pidfd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as RawFd) });
    let mut report = [0u8; 4];
    let mut got = 0;
    while got < report.len() {
        match rustix::io::read(&fail_r, &mut report[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    if got == report.len() {
        // The child has exited; the reaper collects it.
        return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(
            report,
        )));
    }
    Ok(Forked {
        pid,
        pidfd,
        requests: req_w,
        events: ev_r,
        stdout: out_r,
        stderr: err_r,
    })
}

struct ChildFds {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    requests: RawFd,
    events: RawFd,
    driver: RawFd,
    fail: RawFd,
}

/// Runs in the forked child: never returns.
///
/// # Safety
/// Only between fork and exec; the pointers must be NUL-terminated arrays of C strings.
unsafe fn exec_child(
    fds: &ChildFds,
    prog: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
) -> ! {
    // SAFETY: the caller guarantees we are between fork and exec with valid C string arrays;
    // only async-signal-safe calls follow.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // The agent ignores SIGPIPE; an ignored disposition would survive exec.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::setsid();
        let moves = [
            (fds.stdin, 0),
            (fds.stdout, 1),
            (fds.stderr, 2),
            (fds.requests, 3),
            (fds.events, 4),
            (fds.driver, DRIVER_FD),
        ];
        for (from, to) in moves {
            if libc::dup2(from, to) < 0 {
                fail_child(fds.fail);
            }
        }
        // Requests, events and the driver on 3-5 are the interpreter's explicit hand-over (the
        // bootstrap closes 5); nothing else passes.
        if crate::child::before_exec(DRIVER_FD + 1).is_err() {
            fail_child(fds.fail);
        }
        if libc::chdir(cwd) != 0 {
            fail_child(fds.fail);
        }
        libc::execve(prog, argv, envp);
        fail_child(fds.fail)
    }
}

/// # Safety
/// Only in the forked child.
unsafe fn fail_child(fd: RawFd) -> ! {
    // SAFETY: errno is thread-local and valid; `bytes` outlives the write; _exit never returns.
    unsafe {
        let errno = *libc::__errno_location();
        let bytes = errno.to_ne_bytes();
        libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    }
}
