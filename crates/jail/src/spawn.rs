//! Starting the agent as PID 1 of fresh namespaces.
//!
//! `clone` is called directly because no maintained crate offers a clone with CLONE_PIDFD and
//! namespace flags from a multi-threaded process. The agent is cloned sharing the daemon's
//! memory, on a stack of its own ([`clone_sharing_memory`]); only a start straight into a
//! cgroup-v2 directory takes a fork-like `clone3` (glibc has no wrapper that runs a function on
//! a new stack with `CLONE_INTO_CGROUP`). The child only makes async-signal-safe syscalls
//! (close, prctl, read, write, setresuid, setsid, dup2, close_range, sigprocmask, execve,
//! _exit) on memory prepared before the clone: it waits on a pipe until the parent has written
//! its uid/gid maps, then execs the agent, which does all the real set-up single-threaded.
//!
//! Where the agent cannot be cloned straight into its cgroup (cgroup v1), the child joins it
//! itself before its exec, through the group's `tasks` files: a thread moving itself is the
//! one move that skips the kernel's global threadgroup lock, which a move by pid takes and
//! which, after ~30 ms without a taker, waits for an RCU grace period (~6 ms here) — a wait
//! every create after a pause used to sit in. The agent thus runs in its cgroup from its first
//! instruction, and what its exec and start-up allocate is the sandbox's.
//!
//! Until its exec the child holds a copy of every descriptor the daemon had
//! (its HTTP listener among them), so it must never outlive a daemon that dies in that window:
//! it closes its copy of the pipe's write end first (a dead parent then reads as end-of-file,
//! not as a wait forever) and asks for SIGKILL when the creating thread dies. Only its stdio,
//! the listener (3), the config (4) and the cgroup join files (5..) survive its exec.
//!
//! A fork-like clone makes [`user_namespace`]s: a child that only waits while its id maps are
//! written and its namespace opened, then is killed and reaped.

use std::ffi::CString;
use std::io::{Read, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use koder_agent_protocol::init::{InitConfig, CONFIG_FD, LISTEN_FD, WORKLOAD_CGROUP_FD};
use koder_runtime::RuntimeError;

/// A contiguous uid/gid range of the host the sandbox's ids map onto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub host_base: u32,
    pub count: u32,
}

pub struct Spawned {
    pub pid: i32,
    pub pidfd: OwnedFd,
    /// Read end of the agent's stderr; closed by the agent once set-up is done.
    pub stderr: OwnedFd,
}

/// `struct clone_args` of linux/sched.h (glibc's libc crate does not export it).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as u64;

/// Descriptors handed to the child are first moved above this number, so the child's dup2
/// onto 0..=3 can never overwrite one it still has to dup.
const HIGH_FD: RawFd = 16;

/// How the agent gets into its cgroup.
pub enum Placement<'a> {
    /// It starts in this cgroup-v2 directory (`CLONE_INTO_CGROUP`), or stays in the daemon's
    /// (`None`: no cgroups, rootless).
    Into(Option<BorrowedFd<'a>>),
    /// The child joins its cgroup itself before its exec, through these join files (cgroup
    /// v1).
    Joins(Vec<OwnedFd>),
}

/// Where and as whom the agent starts.
pub struct Start<'a> {
    pub ids: IdMap,
    pub rootless: bool,
    pub placement: Placement<'a>,
    /// A network namespace made ahead to clone it into; `None`: a new one (`CLONE_NEWNET`).
    pub netns: Option<BorrowedFd<'a>>,
}

/// Starts `agent init` in new namespaces, with `listener` as its fd 3, `config` to read on fd
/// 4 and the workload's join files (`workload_joins`) from fd 5 on (`config` counts them).
///
/// Into a network namespace made ahead, the clone is made by a thread of its own that entered
/// it first (a child starts in its creator's namespaces; `setns` moves only the calling
/// thread, which then ends with it). That thread stays until the agent has exec'd: the agent
/// dies with the thread that created it until its credentials change.
pub fn spawn_agent(
    agent: &Path,
    config: InitConfig,
    listener: OwnedFd,
    workload_joins: Vec<OwnedFd>,
    start: Start<'_>,
) -> Result<Spawned, RuntimeError> {
    let netns = start.netns;
    let here =
        move |namespaces| spawn_here(agent, config, listener, workload_joins, start, namespaces);
    let Some(netns) = netns else {
        return here(NAMESPACES);
    };
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("agent-spawn".into())
            .spawn_scoped(scope, move || {
                rustix::thread::move_into_link_name_space(
                    netns,
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| {
                    RuntimeError::Start(format!("enter the network namespace made ahead: {e}"))
                })?;
                here(NAMESPACES & !(libc::CLONE_NEWNET as u64))
            })
            .map_err(RuntimeError::io("start the agent's spawning thread"))?
            .join()
            .unwrap_or_else(|_| Err(RuntimeError::Start("the spawning thread panicked".into())))
    })
}

/// [`spawn_agent`] from the calling thread, into new `namespaces`.
fn spawn_here(
    agent: &Path,
    mut config: InitConfig,
    listener: OwnedFd,
    workload_joins: Vec<OwnedFd>,
    start: Start<'_>,
    namespaces: u64,
) -> Result<Spawned, RuntimeError> {
    let Start {
        ids,
        rootless,
        placement,
        ..
    } = start;
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| RuntimeError::InvalidSpec("NUL byte in agent argument".into()))
    };
    let path = cstr(&agent.to_string_lossy())?;
    let args = [cstr("koder-agent")?, cstr("init")?];
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];

    let io = |what: &'static str| RuntimeError::io(what);
    let (into_cgroup, own_joins) = match placement {
        Placement::Into(dir) => (dir, Vec::new()),
        Placement::Joins(files) => (None, files),
    };
    config.workload_cgroup_fds = workload_joins.len() as u32;
    let config_json = serde_json::to_string(&config)
        .map_err(|e| RuntimeError::Start(format!("encode agent config: {e}")))?;
    let (sync_r, sync_w) = cloexec_pipe().map_err(io("sync pipe"))?;
    let (err_r, err_w) = cloexec_pipe().map_err(io("exec status pipe"))?;
    let (stderr_r, stderr_w) = cloexec_pipe().map_err(io("agent stderr pipe"))?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(io("open /dev/null"))?;
    let null = high(null.into()).map_err(io("dup /dev/null"))?;
    let listener = high(listener).map_err(io("dup listener"))?;
    let stderr_w = high(stderr_w).map_err(io("dup stderr pipe"))?;
    let config = high(config_file(&config_json).map_err(io("agent config memfd"))?)
        .map_err(io("dup agent config"))?;
    let highs = |files: Vec<OwnedFd>| {
        files
            .into_iter()
            .map(high)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(io("dup cgroup join files"))
    };
    let (workload_joins, own_joins) = (highs(workload_joins)?, highs(own_joins)?);
    let own_joins_raw: Vec<RawFd> = own_joins.iter().map(AsRawFd::as_raw_fd).collect();
    // Built before the clone: the child must not allocate.
    let mut handed = vec![
        null.as_raw_fd(),
        null.as_raw_fd(),
        stderr_w.as_raw_fd(),
        listener.as_raw_fd(),
        config.as_raw_fd(),
    ];
    debug_assert_eq!(handed.len() as RawFd, WORKLOAD_CGROUP_FD);
    handed.extend(workload_joins.iter().map(AsRawFd::as_raw_fd));
    // Sources sit at HIGH_FD and above, so the child's dup2 onto 0.. never clobbers one.
    if handed.len() > HIGH_FD as usize {
        return Err(RuntimeError::Start(format!(
            "{} descriptors to hand the agent, at most {HIGH_FD}",
            handed.len()
        )));
    }
    let args = ChildArgs {
        sync: SyncFds {
            read: sync_r.as_raw_fd(),
            write: sync_w.as_raw_fd(),
        },
        err_w: err_w.as_raw_fd(),
        handed: &handed,
        joins: &own_joins_raw,
        rootless,
        path: &path,
        argv: &argv,
        envp: &envp,
        // SAFETY: sigset_t is plain data; sigemptyset initialises it.
        mask: unsafe {
            let mut mask: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut mask);
            mask
        },
    };
    let (pid, pidfd, stack) = match into_cgroup {
        // SAFETY: the child branch below only calls `child`, which keeps to async-signal-safe
        // syscalls on CStrings/fds prepared above and ends in execve or _exit.
        Some(dir) => match unsafe { clone_pidfd(namespaces, Some(dir)) } {
            // SAFETY: we are the fork-like child; this never returns.
            Ok(Cloned::Child) => unsafe { child(&args) },
            Ok(Cloned::Parent { pid, pidfd }) => (pid, pidfd, None),
            Err(e) => return Err(RuntimeError::Start(format!("clone3 failed: {e}"))),
        },
        // `args` and everything it points to stay untouched until the child has exec'd or
        // died: every path below waits for one or the other (`exec_status`, `kill_and_reap`)
        // before this frame goes and the child's stack is released.
        None => match clone_sharing_memory(namespaces, &args) {
            Ok((pid, pidfd, stack)) => (pid, pidfd, Some(stack)),
            Err(e) => return Err(RuntimeError::Start(format!("clone failed: {e}"))),
        },
    };
    drop((
        sync_r,
        err_w,
        stderr_w,
        listener,
        null,
        config,
        workload_joins,
        own_joins,
    ));

    // An unprivileged writer may only map its own ids, and only after giving up setgroups.
    let released = write_id_maps(pid, 0, ids, rootless)
        .and_then(|()| {
            koder_hostkit::crash::point("jail-before-release");
            send_byte(sync_w, "release agent")
        })
        .and_then(|()| exec_status(err_r));
    if released.is_err() {
        kill_and_reap(&pidfd);
    }
    if let Some(stack) = stack {
        stack.release();
    }
    released?;
    Ok(Spawned {
        pid,
        pidfd,
        stderr: stderr_r,
    })
}

/// What a fork-like `clone3` returned, in the process it returned in.
enum Cloned {
    Child,
    Parent { pid: i32, pidfd: OwnedFd },
}

/// `CLONE_INTO_CGROUP` of linux/sched.h (Linux 5.7), beyond the `int` of `clone(2)` flags.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Fork-like `clone3` (no stack, no `CLONE_VM`) into the new `namespaces`, with a pidfd; in
/// the cgroup-v2 directory `cgroup` if given.
///
/// # Safety
/// In the [`Cloned::Child`] branch the caller may only make async-signal-safe calls (the
/// process is a copy of a multi-threaded one) and must end in execve or _exit.
unsafe fn clone_pidfd(namespaces: u64, cgroup: Option<BorrowedFd<'_>>) -> std::io::Result<Cloned> {
    let mut pidfd: RawFd = -1;
    let mut args = CloneArgs {
        flags: namespaces | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    if let Some(cgroup) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = cgroup.as_raw_fd() as u64;
    }
    // SAFETY: `args` is a valid `struct clone_args` of the size given; fork-like, so the child
    // continues on a copy of this stack, and the caller keeps it to async-signal-safe calls.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match pid {
        0 => Ok(Cloned::Child),
        p if p < 0 => Err(std::io::Error::last_os_error()),
        p => Ok(Cloned::Parent {
            pid: p as i32,
            // SAFETY: CLONE_PIDFD stored a fresh descriptor we now own.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

/// A user namespace mapping its ids `inside..inside + ids.count` onto the host's
/// `ids.host_base..`, held by a descriptor alone: made by a short-lived child that only waits
/// while its maps are written and its namespace is opened, then is killed and reaped. Its
/// setgroups is denied: no process ever runs in it (idmapped mounts only use its mapping).
pub fn user_namespace(inside: u32, ids: IdMap) -> Result<OwnedFd, RuntimeError> {
    let (hold_r, hold_w) = cloexec_pipe().map_err(RuntimeError::io("user namespace pipe"))?;
    let hold = SyncFds {
        read: hold_r.as_raw_fd(),
        write: hold_w.as_raw_fd(),
    };
    // SAFETY: the child branch only calls `hold_until_released`, async-signal-safe throughout.
    let (pid, pidfd) = match unsafe { clone_pidfd(libc::CLONE_NEWUSER as u64, None) } {
        // SAFETY: we are the fork-like child; this never returns.
        Ok(Cloned::Child) => unsafe { hold_until_released(hold) },
        Ok(Cloned::Parent { pid, pidfd }) => (pid, pidfd),
        Err(e) => return Err(RuntimeError::Start(format!("clone3 (user namespace): {e}"))),
    };
    drop(hold_r);
    let ns = write_id_maps(pid, inside, ids, true).and_then(|()| {
        std::fs::File::open(format!("/proc/{pid}/ns/user"))
            .map(OwnedFd::from)
            .map_err(RuntimeError::io("open user namespace"))
    });
    kill_and_reap(&pidfd);
    drop(hold_w);
    ns
}

/// # Safety
/// Only in the fork-like child (async-signal-safe calls only); never returns.
unsafe fn hold_until_released(hold: SyncFds) -> ! {
    // SAFETY: close, prctl, read and _exit are async-signal-safe; the descriptors are ours.
    unsafe {
        // A dead parent must read as end-of-file, and its death kill us in any case.
        libc::close(hold.write);
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        let mut byte = 0u8;
        while libc::read(hold.read, (&mut byte as *mut u8).cast(), 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::_exit(0)
    }
}

/// The release pipe as the child sees it right after the clone.
#[derive(Clone, Copy)]
struct SyncFds {
    read: RawFd,
    write: RawFd,
}

/// What the agent's clone child reads: all of it prepared before the clone, none of it
/// written by either side until the child has exec'd or died.
struct ChildArgs<'a> {
    sync: SyncFds,
    err_w: RawFd,
    handed: &'a [RawFd],
    /// Join files of the agent's cgroup, written before the exec (above `handed`, so gone at
    /// the exec).
    joins: &'a [RawFd],
    rootless: bool,
    path: &'a CString,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    /// The signal mask the agent starts with (the clone sharing memory starts the child with
    /// every signal blocked).
    mask: libc::sigset_t,
}

/// How much stack the child sharing the daemon's memory runs on: a handful of syscalls deep.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// The stack a child sharing the daemon's memory runs on. Freed only by
/// [`ChildStack::release`], once the child has exec'd or died: a panic before that leaks it
/// rather than free memory the child may still be running on.
struct ChildStack(ManuallyDrop<Vec<u8>>);

impl ChildStack {
    fn release(self) {
        drop(ManuallyDrop::into_inner(self.0));
    }
}

/// Starts [`child`] with `clone(CLONE_VM)` on a stack of its own, returned to be released
/// once the child has exec'd or died. Sharing the daemon's memory instead of copying it (as a
/// fork-like clone does) spares each create the copy of the daemon's page tables, the
/// write-protection of its every anonymous page (a TLB shoot-down on the cores its threads
/// run on) and the copy-on-write faults its threads then take until the agent execs. Without
/// `CLONE_VFORK`: the parent must write the child's id maps while it waits.
///
/// The child starts with every signal blocked, so no handler of the daemon's runs on its
/// stack, and restores `args.mask` just before its exec. Its failed syscalls write errno where
/// the creating thread keeps its own (they share their thread-local storage): that thread reads
/// errno only right after a call of its own failed, so the most a race can do is put the
/// wrong errno in an error message.
fn clone_sharing_memory(
    namespaces: u64,
    args: &ChildArgs<'_>,
) -> std::io::Result<(i32, OwnedFd, ChildStack)> {
    extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the parent's `ChildArgs`, alive and unchanged until this child
        // has exec'd or died; `child` never returns.
        unsafe { child(&*arg.cast::<ChildArgs<'_>>().cast_const()) }
    }
    // Uninitialised: only the child writes it, as its stack, which grows down from the
    // (16-byte aligned) top.
    let mut stack = ManuallyDrop::new(Vec::<u8>::with_capacity(CHILD_STACK_BYTES));
    let top = stack
        .spare_capacity_mut()
        .as_mut_ptr()
        .wrapping_add(CHILD_STACK_BYTES);
    let top = top.wrapping_sub(top as usize % 16);
    let stack = ChildStack(stack);
    let flags = namespaces as libc::c_int | libc::CLONE_VM | libc::CLONE_PIDFD | libc::SIGCHLD;
    let mut pidfd: libc::c_int = -1;
    // SAFETY: sigset_t is plain data, filled by sigfillset before use; pthread_sigmask reads
    // `all` and writes `old`. The child runs `entry` on its own stack, reads only `args`
    // (see `ChildArgs`) and makes nothing but async-signal-safe calls; CLONE_PIDFD stores the
    // pidfd in `pidfd` before clone returns.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            entry,
            top.cast(),
            flags,
            std::ptr::from_ref(args).cast_mut().cast(),
            &mut pidfd as *mut libc::c_int,
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        pid
    };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        stack.release();
        return Err(e);
    }
    // SAFETY: CLONE_PIDFD stored a fresh descriptor we now own.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }, stack))
}

/// # Safety
/// Only to be called in the child of a clone (fork-like, or sharing memory as
/// [`clone_sharing_memory`] does); never returns.
unsafe fn child(args: &ChildArgs<'_>) -> ! {
    let ChildArgs {
        sync,
        err_w,
        handed,
        joins,
        rootless,
        path,
        argv,
        envp,
        ref mask,
    } = *args;
    // SAFETY: the caller guarantees we are the clone's child: only async-signal-safe
    // syscalls follow, on descriptors and C strings prepared before the clone.
    unsafe {
        // Only the parent may hold the write end, or its death would never read as end-of-file.
        libc::close(sync.write);
        // The creating thread blocks until the exec (or our death), so its exit means the daemon
        // is going: die with it. Credential changes below clear this again, which is fine.
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        let mut byte = 0u8;
        loop {
            let n = libc::read(sync.read, (&mut byte as *mut u8).cast(), 1);
            if n == 1 {
                break;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            // The parent gave up on us (pipe closed without the go byte).
            libc::_exit(1);
        }
        // Into our cgroup ("0": this thread, our only one) before anything is made for the
        // sandbox, so what the exec and the agent allocate is the sandbox's.
        for &join in joins {
            if libc::write(join, b"0".as_ptr().cast(), 1) < 0 {
                report_and_exit(err_w);
            }
        }
        // Become the namespace's root: our host credentials are unmapped in it, and without this
        // execve would drop every capability the agent needs to build the sandbox. Raw syscalls,
        // since glibc's wrappers would try to sync credentials with threads that only exist in the
        // parent.
        if libc::syscall(libc::SYS_setresgid, 0, 0, 0) < 0
            || (!rootless
                && libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0)
            || libc::syscall(libc::SYS_setresuid, 0, 0, 0) < 0
        {
            report_and_exit(err_w);
        }
        libc::setsid();
        for (target, &source) in handed.iter().enumerate() {
            if libc::dup2(source, target as RawFd) < 0 {
                report_and_exit(err_w);
            }
        }
        debug_assert_eq!(LISTEN_FD + 1, CONFIG_FD);
        debug_assert_eq!(CONFIG_FD + 1, WORKLOAD_CGROUP_FD);
        // Whatever else the daemon had open stays with the daemon, CLOEXEC or not.
        if libc::syscall(
            libc::SYS_close_range,
            handed.len() as u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) < 0
        {
            report_and_exit(err_w);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
        libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
        report_and_exit(err_w)
    }
}

/// # Safety
/// Only in the fork-like child (async-signal-safe calls only); never returns.
unsafe fn report_and_exit(err_w: RawFd) -> ! {
    // SAFETY: errno is thread-local and valid; `errno` outlives the write; _exit never returns.
    unsafe {
        let errno = *libc::__errno_location();
        libc::write(err_w, (&errno as *const i32).cast(), 4);
        libc::_exit(127)
    }
}

fn write_id_maps(
    pid: i32,
    inside: u32,
    ids: IdMap,
    deny_setgroups: bool,
) -> Result<(), RuntimeError> {
    let proc = format!("/proc/{pid}");
    let line = format!("{inside} {} {}\n", ids.host_base, ids.count);
    if deny_setgroups {
        std::fs::write(format!("{proc}/setgroups"), "deny")
            .map_err(RuntimeError::io("write setgroups"))?;
    }
    std::fs::write(format!("{proc}/uid_map"), &line).map_err(RuntimeError::io("write uid_map"))?;
    std::fs::write(format!("{proc}/gid_map"), &line).map_err(RuntimeError::io("write gid_map"))?;
    Ok(())
}

/// The go-ahead to exec on the pipe the child waits on (`what` for the error).
fn send_byte(pipe: OwnedFd, what: &'static str) -> Result<(), RuntimeError> {
    std::fs::File::from(pipe)
        .write_all(&[1])
        .map_err(RuntimeError::io(what))
}

/// Waits until the child's execve succeeded (the CLOEXEC status pipe closes) or failed (it
/// carries the errno).
fn exec_status(err_r: OwnedFd) -> Result<(), RuntimeError> {
    let mut status = Vec::new();
    std::fs::File::from(err_r)
        .read_to_end(&mut status)
        .map_err(RuntimeError::io("read exec status"))?;
    match <[u8; 4]>::try_from(status.as_slice()) {
        Err(_) if status.is_empty() => Ok(()),
        Ok(errno) => Err(RuntimeError::Start(format!(
            "cannot start the agent (its cgroup, credentials, descriptors or exec): {}",
            std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno))
        ))),
        Err(_) => Err(RuntimeError::Start(
            "agent start-up failed before exec".into(),
        )),
    }
}

/// SIGKILL through the pidfd (never a recycled pid) and reap. Killing PID 1 of a pid
/// namespace kills every process in it.
pub fn kill_and_reap(pidfd: &OwnedFd) {
    let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
    let _ = rustix::process::waitid(
        rustix::process::WaitId::PidFd(pidfd.as_fd()),
        rustix::process::WaitIdOptions::EXITED,
    );
}

/// The agent's configuration in an anonymous, sealed file read from its start: the agent
/// reads it from [`CONFIG_FD`] and closes it.
fn config_file(json: &str) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "koder-agent-config",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    std::fs::File::from(fd.try_clone()?).write_all(json.as_bytes())?;
    rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(0))?;
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    Ok(fd)
}

fn cloexec_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

fn high(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, HIGH_FD)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    /// A cgroup made for a test, in whichever hierarchy takes a process (v1 memory or v2),
    /// removed on drop.
    struct TestGroup(PathBuf);

    impl TestGroup {
        fn new(name: &str) -> Option<TestGroup> {
            if !rustix::process::geteuid().is_root() {
                return None;
            }
            [
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/unified",
                "/sys/fs/cgroup",
            ]
            .into_iter()
            .filter_map(|root| {
                let dir = Path::new(root).join(name);
                let group = std::fs::create_dir(&dir)
                    .is_ok()
                    .then_some(TestGroup(dir))?;
                // A directory on the tmpfs that holds v1 hierarchies is no cgroup (and goes).
                group.0.join("cgroup.procs").exists().then_some(group)
            })
            .next()
        }
    }

    impl Drop for TestGroup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    /// Runs `script` as the agent, handed `workload_joins`, its clone joining its own cgroup
    /// through `own_joins`; returns what spawning said and what the script wrote to stderr.
    fn spawn_script(
        script: &str,
        workload_joins: Vec<OwnedFd>,
        own_joins: Vec<OwnedFd>,
    ) -> (Result<(), RuntimeError>, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let agent = dir.path().join("agent");
        std::fs::write(&agent, script).expect("write script");
        // Run by the sandbox's root, an unprivileged host uid.
        for (path, mode) in [(dir.path(), 0o755), (agent.as_path(), 0o755)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        let listener = std::fs::File::open("/dev/null").expect("/dev/null").into();
        let ids = IdMap {
            host_base: 3_900_000_000,
            count: 65536,
        };
        let spawned = spawn_agent(
            &agent,
            InitConfig::default(),
            listener,
            workload_joins,
            Start {
                ids,
                rootless: false,
                placement: Placement::Joins(own_joins),
                netns: None,
            },
        );
        match spawned {
            Ok(spawned) => {
                let mut stderr = String::new();
                let _ = std::fs::File::from(spawned.stderr).read_to_string(&mut stderr);
                kill_and_reap(&spawned.pidfd);
                (Ok(()), stderr)
            }
            Err(e) => (Err(e), String::new()),
        }
    }

    /// Given its cgroup's join files, the agent is in that cgroup from its first instruction
    /// (its clone joined before the exec), the files themselves gone; the workload's are handed
    /// over from fd 5 on, counted in its config, and left alone.
    #[test]
    fn the_agent_starts_in_the_cgroup_its_clone_joined() {
        let name = format!("koder-test-join-{}", std::process::id());
        let Some(group) = TestGroup::new(&name) else {
            eprintln!("skipped: needs root and a cgroup hierarchy");
            return;
        };
        let join_file = ["tasks", "cgroup.procs"]
            .into_iter()
            .map(|f| group.0.join(f))
            .find(|p| p.exists())
            .expect("a join file");
        let open_write = |p: &Path| -> OwnedFd {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .expect("open")
                .into()
        };
        // A stand-in workload file: the agent must leave it alone.
        let workload = tempfile::NamedTempFile::new().expect("temp file");
        let script = r#"#!/bin/sh
cat /proc/self/cgroup >&2
case $(cat <&4) in *'"workload_cgroup_fds":1'*) ;; *) echo "config: no workload files" >&2 ;; esac
[ -e /proc/self/fd/5 ] || echo "no fd 5" >&2
[ -e /proc/self/fd/6 ] && echo "fd 6 survived the exec" >&2
exit 0
"#;
        let (spawned, stderr) = spawn_script(
            script,
            vec![open_write(workload.path())],
            vec![open_write(&join_file)],
        );
        assert!(spawned.is_ok(), "{spawned:?}");
        assert!(
            !stderr.contains("config") && !stderr.contains("fd "),
            "{stderr}"
        );
        assert!(
            stderr.lines().any(|l| l.ends_with(&format!(":/{name}"))),
            "not in its cgroup: {stderr}"
        );
        assert_eq!(std::fs::read(workload.path()).expect("read"), b"");
    }

    /// Where the host has a cgroup-v2 hierarchy (here or beside v1 ones), a child cloned into
    /// one of its groups is a member from its first instruction.
    #[test]
    fn clone_into_cgroup_starts_the_child_in_the_group() {
        let Some((root, _)) = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(Path::new)
            .map(|p| (p, rustix::fs::statfs(p)))
            .find(|(_, s)| {
                s.as_ref()
                    .is_ok_and(|s| s.f_type == libc::CGROUP2_SUPER_MAGIC)
            })
        else {
            eprintln!("skipped: no cgroup v2 hierarchy");
            return;
        };
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let name = format!("koder-test-clone-{}", std::process::id());
        let group = root.join(&name);
        std::fs::create_dir(&group).expect("create cgroup");
        let dir = std::fs::File::open(&group).expect("open cgroup");
        let (hold_r, hold_w) = cloexec_pipe().expect("pipe");
        let hold = SyncFds {
            read: hold_r.as_raw_fd(),
            write: hold_w.as_raw_fd(),
        };
        // SAFETY: the child branch only calls `hold_until_released`, async-signal-safe.
        let cloned = match unsafe { clone_pidfd(0, Some(dir.as_fd())) } {
            // SAFETY: we are the fork-like child; this never returns.
            Ok(Cloned::Child) => unsafe { hold_until_released(hold) },
            other => other,
        };
        let membership = match &cloned {
            Ok(Cloned::Parent { pid, .. }) => {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup of child")
            }
            _ => String::new(),
        };
        if let Ok(Cloned::Parent { pidfd, .. }) = &cloned {
            kill_and_reap(pidfd);
        }
        drop((hold_r, hold_w));
        std::fs::remove_dir(&group).expect("remove cgroup");
        assert!(cloned.is_ok(), "clone3: {:?}", cloned.err());
        assert!(
            membership.lines().any(|l| l == format!("0::/{name}")),
            "{membership}"
        );
    }
}
