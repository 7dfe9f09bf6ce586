//! What every process the agent starts (exec, terminal, interpreter) goes through between fork
//! and exec, in one place so no spawn path can forget a step.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use koder_agent_protocol::init::MAX_WORKLOAD_CGROUP_FDS;

const SLOTS: usize = MAX_WORKLOAD_CGROUP_FDS as usize;

/// The files a process joins the workload cgroup through (a jail's `workload` group: its
/// `tasks`, one per v1 hierarchy, or `cgroup.procs` on v2; a guest's `sandbox` group), open
/// for writing; -1 in unused slots. Process-wide integers on purpose: the forked child uses
/// them where nothing may lock or allocate. The descriptors are close-on-exec, so no sandbox
/// process ever holds one and none can move itself back into the agent's group.
static WORKLOAD_JOINS: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

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

/// Makes every later child join the group whose join files these are (kept open for
/// the agent's lifetime). Called once, before the first child.
pub fn set_workload_cgroup(joins: Vec<OwnedFd>) -> Result<(), WorkloadCgroupError> {
    if joins.len() > SLOTS {
        return Err(WorkloadCgroupError::TooMany { given: joins.len() });
    }
    if WORKLOAD_JOINS[0].load(Ordering::Relaxed) >= 0 {
        return Err(WorkloadCgroupError::AlreadySet);
    }
    for (slot, fd) in WORKLOAD_JOINS.iter().zip(joins) {
        let kept =
            rustix::io::fcntl_dupfd_cloexec(&fd, KEEP_FROM).map_err(WorkloadCgroupError::Dup)?;
        slot.store(kept.into_raw_fd(), Ordering::Relaxed);
    }
    Ok(())
}

/// The thread [`vfork_spawn`] clones every child from once [`start_spawner`] made it.
static SPAWNER: OnceLock<Spawner> = OnceLock::new();

/// The spawner thread's side of a clone: the plan back (for a retry) and what came of it.
type Outcome = (Plan, Cloned);

/// The serving thread's ends of the spawner's two channels, made once and held together: a
/// caller sends a plan and receives its outcome under the lock, so outcomes never cross and no
/// exec allocates a channel of its own.
struct Spawner {
    ends: parking_lot::Mutex<(mpsc::Sender<Plan>, mpsc::Receiver<Outcome>)>,
}

/// Starts a thread that moves itself into the workload's groups (writing `0` into each
/// `tasks` file moves the writing thread alone), then clones every later [`vfork_spawn`]
/// child: a child starts in the groups of the thread that cloned it, so it joins nothing
/// itself, and the five `tasks` writes (~35 µs of every exec on a v1 host, a quarter of the
/// agent's own share) are paid once per sandbox.
///
/// Only for v1 `tasks` files, where a group may hold one thread of a process without the
/// others; on v2 the join files are `cgroup.procs`, where `0` would move the whole agent.
/// Called once the agent is confined: a thread inherits its creator's seccomp filter,
/// Landlock domain, capabilities and ids, and its children inherit its own.
pub fn start_spawner() -> std::io::Result<()> {
    let (jobs, queue) = mpsc::channel::<Plan>();
    let (done, outcomes) = mpsc::channel::<Outcome>();
    let (joined_tx, joined) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("spawner".into())
        .spawn(move || {
            // Signals for the agent go to its serving thread, never to this one.
            block_all_signals();
            let result = join_workload_cgroup();
            let ok = result.is_ok();
            let _ = joined_tx.send(result);
            if ok {
                for plan in queue {
                    let cloned = clone_child(&plan, false);
                    if done.send((plan, cloned)).is_err() {
                        return;
                    }
                }
            }
        })?;
    joined
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread ended before it joined"))??;
    SPAWNER
        .set(Spawner {
            ends: parking_lot::Mutex::new((jobs, outcomes)),
        })
        .map_err(|_| std::io::Error::other("the spawner is already started"))
}

impl Spawner {
    /// Has the spawner thread clone `plan`'s child; blocks until it has (as a vfork does).
    fn start(&self, plan: Plan) -> std::io::Result<Outcome> {
        let gone = || std::io::Error::other("the spawner thread is gone");
        let ends = self.ends.lock();
        ends.0.send(plan).map_err(|_| gone())?;
        ends.1.recv().map_err(|_| gone())
    }
}

/// Blocks every signal on the calling thread for good.
fn block_all_signals() {
    // SAFETY: sigset_t is plain data, filled in by sigfillset before use.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
    }
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
    for slot in &WORKLOAD_JOINS {
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

/// What [`vfork_spawn`] starts: argv, environment and working directory, checked and turned
/// into C strings before the child exists (it may not allocate).
pub(crate) struct Plan {
    /// Paths `execve` tries in turn, as `execvp` would: argv[0] itself when it names a path
    /// (has a slash), else each `PATH` entry joined with it (an empty entry: the working
    /// directory, i.e. the bare name).
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    /// The account it runs as (default: the agent's own) and, with an account, its groups.
    uid: Option<u32>,
    gid: Option<u32>,
    groups: Arc<[libc::gid_t]>,
    /// A pipe for its stdin; without, it reads end-of-file from /dev/null.
    stdin_pipe: bool,
}

/// `execvp`'s search path when the environment has no `PATH` (glibc's `_CS_PATH`).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// How much stack the child runs on: a handful of syscalls deep.
const CHILD_STACK_BYTES: usize = 64 * 1024;

impl Plan {
    /// `env` in order, a later value of a name replacing an earlier one; `PATH` is the one the
    /// program will see.
    pub(crate) fn new(argv: &[String], env: &[(&str, &str)], cwd: &str) -> std::io::Result<Self> {
        let c = |s: &str| {
            CString::new(s).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
        };
        let program = argv
            .first()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let env: BTreeMap<&str, &str> = env.iter().copied().collect();
        let candidates = if program.contains('/') {
            vec![c(program)?]
        } else {
            let path = env.get("PATH").copied().unwrap_or(DEFAULT_PATH);
            path.split(':')
                .map(|dir| match dir {
                    "" => c(program),
                    dir => c(&format!("{}/{program}", dir.trim_end_matches('/'))),
                })
                .collect::<Result<_, _>>()?
        };
        Ok(Self {
            candidates,
            argv: argv.iter().map(|a| c(a)).collect::<Result<_, _>>()?,
            env: env
                .iter()
                .map(|(k, v)| c(&format!("{k}={v}")))
                .collect::<Result<_, _>>()?,
            cwd: c(cwd)?,
            uid: None,
            gid: None,
            groups: Arc::new([]),
            stdin_pipe: true,
        })
    }

    /// Gives the program /dev/null as its stdin instead of a pipe, for an exec that has
    /// nothing to send it: what it reads is end-of-file either way, and a pipe costs a
    /// `pipe2` and two `close`s per exec.
    pub(crate) fn without_stdin(mut self) -> Self {
        self.stdin_pipe = false;
        self
    }

    /// Runs the program as `uid`/`gid` (each `None`: the agent's own), in `groups` (its
    /// supplementary groups, taken with a `uid` only).
    pub(crate) fn run_as(
        mut self,
        uid: Option<u32>,
        gid: Option<u32>,
        groups: Arc<[libc::gid_t]>,
    ) -> Self {
        self.uid = uid;
        self.gid = gid;
        self.groups = groups;
        self
    }
}

/// A child started by [`vfork_spawn`]: its pid and the parent's ends of its stdio pipes
/// (no stdin pipe for a plan [`Plan::without_stdin`]).
pub(crate) struct Spawned {
    pub(crate) pid: i32,
    pub(crate) stdin: Option<OwnedFd>,
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
}

/// What the child reads (all of it prepared and owned by the parent, which is suspended until
/// the child has exec'd or exited) and the one thing it writes back: why it failed.
struct ChildArgs {
    stdio: [RawFd; 3],
    cwd: *const libc::c_char,
    candidates: *const *const libc::c_char,
    argv: *const *const libc::c_char,
    /// `/bin/sh`, a free slot for the candidate, then argv[1..]: `execvp`'s fallback for a
    /// file without an executable format.
    sh_argv: *mut *const libc::c_char,
    envp: *const *const libc::c_char,
    uid: Option<u32>,
    gid: Option<u32>,
    groups: *const [libc::gid_t],
    /// [`signals_to_reset`].
    reset_signals: &'static [libc::c_int],
    /// Whether the child joins the workload's groups (not when the spawner thread, which is
    /// in them, cloned it).
    join: bool,
    errno: AtomicI32,
}

/// Starts `plan` with `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does: the child borrows
/// the agent's memory until it execs, so nothing of the agent's address space is copied (a
/// fork's page-table copy and the copy-on-write faults after it are most of what an exec costs
/// the agent). The child takes the same steps as [`before_exec`] (workload cgroup,
/// close-on-exec above its stdio) plus a new session, its stdio pipes, its account and working
/// directory; cloned by the spawner thread ([`start_spawner`]) it is in the workload already.
/// The caller gets control back once the program runs; a failure before that is the child's
/// errno, and its zombie is left to the reaper.
///
/// A program file still open for writing somewhere cannot be executed (ETXTBSY). A file just
/// written is, for a moment, whenever any other child is cloned meanwhile (it holds a copy of
/// the writer's descriptor until its own exec), so that error is retried a few times.
pub(crate) fn vfork_spawn(mut plan: Plan) -> std::io::Result<Spawned> {
    for wait in TEXT_BUSY_WAITS {
        match spawn_once(plan)? {
            (again, Err(e)) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                plan = again;
                std::thread::sleep(wait);
            }
            (_, spawned) => return spawned,
        }
    }
    spawn_once(plan)?.1
}

/// The pauses before the retries of a spawn whose program file was busy (15 ms in all).
const TEXT_BUSY_WAITS: [Duration; 4] = [
    Duration::from_millis(1),
    Duration::from_millis(2),
    Duration::from_millis(4),
    Duration::from_millis(8),
];

/// One spawn of `plan`, which comes back for another try.
fn spawn_once(plan: Plan) -> std::io::Result<(Plan, std::io::Result<Spawned>)> {
    let Some(spawner) = SPAWNER.get() else {
        let cloned = clone_child(&plan, true)?;
        return Ok((plan, cloned));
    };
    let (plan, cloned) = spawner.start(plan)?;
    Ok(match cloned {
        // The workload's pids limit is full: the spawner's clone failed. Cloned from the
        // agent's group, whose limit has headroom, the child joins the workload past its limit
        // (a v1 move is never refused for it), so an exec (a `pkill`) still starts in a
        // saturated sandbox.
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
            let cloned = clone_child(&plan, true)?;
            (plan, cloned)
        }
        cloned => (plan, cloned?),
    })
}

/// What [`clone_child`] gives: `Err` when no child came to be (its pipes or the clone
/// failed), else the child's own outcome.
type Cloned = std::io::Result<std::io::Result<Spawned>>;

/// The clone behind [`vfork_spawn`], on the calling thread; the child joins the workload's
/// groups itself when `join`.
fn clone_child(plan: &Plan, join: bool) -> Cloned {
    let (stdin_r, stdin) = match plan.stdin_pipe {
        true => pipe().map(|(r, w)| (Some(r), Some(w)))?,
        false => (None, None),
    };
    let stdin_source = match &stdin_r {
        Some(r) => r.as_raw_fd(),
        None => null_device()?,
    };
    let (stdout, stdout_w) = pipe()?;
    let (stderr, stderr_w) = pipe()?;
    let ends = (stdin_r, stdout_w, stderr_w);
    let nul_terminated = |v: &[CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let candidates = nul_terminated(&plan.candidates);
    let argv = nul_terminated(&plan.argv);
    let envp = nul_terminated(&plan.env);
    let mut sh_argv: Vec<*const libc::c_char> = [c"/bin/sh".as_ptr(), std::ptr::null()]
        .into_iter()
        .chain(argv.iter().skip(1).copied())
        .collect();
    let args = ChildArgs {
        stdio: [stdin_source, ends.1.as_raw_fd(), ends.2.as_raw_fd()],
        cwd: plan.cwd.as_ptr(),
        candidates: candidates.as_ptr(),
        argv: argv.as_ptr(),
        sh_argv: sh_argv.as_mut_ptr(),
        envp: envp.as_ptr(),
        uid: plan.uid,
        gid: plan.gid,
        groups: &raw const *plan.groups,
        reset_signals: signals_to_reset(),
        join,
        errno: AtomicI32::new(0),
    };
    // Uninitialised memory: only the child writes it, as its stack, which grows down from
    // the (16-byte aligned) top.
    let mut stack = Vec::<u8>::with_capacity(CHILD_STACK_BYTES);
    let top = stack
        .spare_capacity_mut()
        .as_mut_ptr()
        .wrapping_add(CHILD_STACK_BYTES);
    let top = top.wrapping_sub(top as usize % 16);
    let pid = with_signals_blocked(|| {
        // SAFETY: the child runs `vfork_child` on its own stack in our memory while this thread
        // is suspended (CLONE_VFORK), reads only `args` and what it points to (alive until
        // clone returns), writes only `args.errno` and a slot of `sh_argv`, and makes nothing
        // but async-signal-safe calls; it starts with every signal blocked, so none of our
        // handlers can run on its stack.
        unsafe {
            libc::clone(
                vfork_child,
                top.cast(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::from_ref(&args).cast_mut().cast(),
            )
        }
    });
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(ends);
    Ok(match args.errno.load(Ordering::Relaxed) {
        0 => Ok(Spawned {
            pid,
            stdin,
            stdout,
            stderr,
        }),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    })
}

/// /dev/null opened for reading, kept for the agent's lifetime above the hand-over numbers
/// (close-on-exec: a child only gets it as its stdin).
fn null_device() -> std::io::Result<RawFd> {
    static NULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_raw_fd());
    }
    let fd = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let kept = rustix::io::fcntl_dupfd_cloexec(&fd, KEEP_FROM)?;
    Ok(NULL.get_or_init(|| kept).as_raw_fd())
}

/// A close-on-exec pipe whose ends are both above the stdio numbers (the agent runs with 2
/// closed, so a pipe could land there and be clobbered by the child's `dup2`s).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let above = |fd: OwnedFd| -> std::io::Result<OwnedFd> {
        if fd.as_raw_fd() > 2 {
            return Ok(fd);
        }
        Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
    };
    Ok((above(r)?, above(w)?))
}

/// Runs `f` with every signal blocked on this thread, so a child cloned meanwhile starts with
/// them blocked too.
fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data, filled in by sigfillset before use; pthread_sigmask only
    // reads `all` and writes `old`.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let out = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        out
    }
}

/// The child's side of [`vfork_spawn`]: only ever returns by `_exit`.
extern "C" fn vfork_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive and unchanged until this child has
    // exec'd or exited.
    let args = unsafe { &*arg.cast::<ChildArgs>().cast_const() };
    // SAFETY: as `vfork_spawn` requires of the child: async-signal-safe calls only.
    let errno = unsafe { child_steps(args) };
    args.errno.store(errno, Ordering::Relaxed);
    // SAFETY: _exit never returns and runs nothing of the parent's (no atexit handlers).
    unsafe { libc::_exit(127) }
}

fn errno() -> libc::c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Everything between clone and exec; returns the errno of what failed.
///
/// # Safety
/// Only in the child of `vfork_spawn`, with `args` from it.
unsafe fn child_steps(args: &ChildArgs) -> libc::c_int {
    // SAFETY: plain syscalls on prepared, NUL-terminated strings and arrays.
    unsafe {
        default_signal_handlers(args.reset_signals);
        if args.join {
            if let Err(e) = join_workload_cgroup() {
                return e.raw_os_error().unwrap_or(libc::EIO);
            }
        }
        libc::setsid();
        for (target, &fd) in args.stdio.iter().enumerate() {
            if libc::dup2(fd, target as RawFd) < 0 {
                return errno();
            }
        }
        if let Err(e) = switch_account(args.uid, args.gid, &*args.groups) {
            return e;
        }
        // After the switch, as std does: the directory must be the account's to enter.
        if libc::chdir(args.cwd) < 0 {
            return errno();
        }
        if let Err(e) = mark_cloexec_from(3) {
            return e.raw_os_error().unwrap_or(libc::EIO);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        exec_first(args)
    }
}

/// Becomes `gid` and `uid` as a login does (a root caller takes `groups` as the supplementary
/// groups first, where std's `Command::uid` would drop them all), by raw syscalls: libc's
/// wrappers would make every thread of the agent, whose memory a `vfork_spawn` child shares,
/// switch too (glibc's set*id broadcast).
///
/// # Safety
/// Only in a child between its clone or fork and its exec.
pub(crate) unsafe fn switch_account(
    uid: Option<u32>,
    gid: Option<u32>,
    groups: &[libc::gid_t],
) -> Result<(), libc::c_int> {
    let check = |ret: libc::c_long| if ret < 0 { Err(errno()) } else { Ok(()) };
    // SAFETY: set*id and getuid syscalls on plain integers; setgroups reads `groups`.
    unsafe {
        if let Some(gid) = gid {
            check(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
        }
        if let Some(uid) = uid {
            if libc::syscall(libc::SYS_getuid) == 0 {
                check(libc::syscall(
                    libc::SYS_setgroups,
                    groups.len(),
                    groups.as_ptr(),
                ))?;
            }
            check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
        }
    }
    Ok(())
}

/// The signals a spawned child gives back their default disposition before it unblocks
/// signals: those the agent handles (a handler is the agent's code, and would run on the
/// child's stack in the agent's memory, which the child shares until it execs, which resets
/// them anyway) and SIGPIPE, which the agent ignores (as std does for its children; other
/// ignored signals stay ignored across exec, as they always did).
///
/// Scanned once, at the first spawn, instead of by every child (64 `sigaction` calls each, as
/// glibc's `posix_spawn` makes): the agent installs all its handlers before it serves (std's at
/// start, the reaper's SIGCHLD), and a debug build checks that at every spawn.
fn signals_to_reset() -> &'static [libc::c_int] {
    static SCANNED: OnceLock<Vec<libc::c_int>> = OnceLock::new();
    let scanned = SCANNED.get_or_init(scan_signals);
    debug_assert_eq!(
        *scanned,
        scan_signals(),
        "a signal handler was installed after the agent's first spawn"
    );
    scanned
}

fn scan_signals() -> Vec<libc::c_int> {
    (1..=libc::SIGRTMAX())
        .filter(|&sig| {
            // SAFETY: sigaction only writes the current disposition into a plain struct;
            // signals that cannot be queried are skipped.
            let old = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    return false;
                }
                old
            };
            let keep = old.sa_sigaction == libc::SIG_DFL
                || (old.sa_sigaction == libc::SIG_IGN && sig != libc::SIGPIPE);
            !keep
        })
        .collect()
}

/// Gives `signals` ([`signals_to_reset`]) their default disposition.
///
/// # Safety
/// Only in the child of `vfork_spawn` (its signal dispositions are its own copy).
unsafe fn default_signal_handlers(signals: &[libc::c_int]) {
    // SAFETY: sigaction on a plain struct; a failure leaves that signal as it was.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for &sig in signals {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }
}

/// `execvp`'s search over the prepared candidates: on to the next one where the file is not
/// there (or not permitted: EACCES is reported if nothing else works), a shell for a file
/// without an executable format, any other error at once.
///
/// # Safety
/// Only in the child of `vfork_spawn`, with `args` from it.
unsafe fn exec_first(args: &ChildArgs) -> libc::c_int {
    let mut denied = false;
    let mut last = libc::ENOENT;
    // SAFETY: the arrays are NUL-terminated, their strings alive; `sh_argv[1]` is the slot
    // kept for the candidate.
    unsafe {
        let mut next = args.candidates;
        while !(*next).is_null() {
            let candidate = *next;
            libc::execve(candidate, args.argv, args.envp);
            last = errno();
            if last == libc::ENOEXEC {
                *args.sh_argv.add(1) = candidate;
                libc::execve(*args.sh_argv, args.sh_argv.cast_const(), args.envp);
                last = errno();
            }
            match last {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return last,
            }
            next = next.add(1);
        }
    }
    if denied {
        libc::EACCES
    } else {
        last
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;

    /// These tests spawn one at a time and wait for their children themselves (no reaper runs
    /// in this test binary). A failed spawn's zombie stays: only an any-pid wait could reap it,
    /// and that would take the children of tests running beside them (their waits then fail
    /// with ECHILD, as `egress_rules`' once did).
    pub(crate) static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    /// Runs `argv` through `vfork_spawn` and returns (exit code, stdout).
    fn run(argv: &[&str], env: &[(&str, &str)], cwd: &Path) -> std::io::Result<(i32, String)> {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        let plan = Plan::new(&argv, env, cwd.to_str().unwrap())?;
        let child = vfork_spawn(plan)?;
        drop(child.stdin);
        let mut out = String::new();
        std::fs::File::from(child.stdout)
            .read_to_string(&mut out)
            .unwrap();
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        let waited = unsafe { libc::waitpid(child.pid, &mut status, 0) };
        assert_eq!(waited, child.pid);
        Ok((libc::WEXITSTATUS(status), out))
    }

    fn script(path: &Path, body: &str) {
        std::fs::write(path, body).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A plan without stdin gives the program /dev/null (end-of-file at once), one with it a
    /// pipe.
    #[test]
    fn stdin_is_a_pipe_unless_the_plan_has_nothing_to_send() {
        let _serial = SERIAL.lock();
        let argv = ["/bin/readlink".to_string(), "/proc/self/fd/0".to_string()];
        for (pipe, expect) in [(true, "pipe:"), (false, "/dev/null")] {
            let plan = Plan::new(&argv, &[], "/").unwrap();
            let plan = if pipe { plan } else { plan.without_stdin() };
            let child = vfork_spawn(plan).unwrap();
            assert_eq!(child.stdin.is_some(), pipe);
            let mut out = String::new();
            std::fs::File::from(child.stdout)
                .read_to_string(&mut out)
                .unwrap();
            // SAFETY: waitpid with a null status pointer.
            unsafe { libc::waitpid(child.pid, std::ptr::null_mut(), 0) };
            assert!(out.starts_with(expect), "{out}");
        }
    }

    /// The test harness ignores SIGPIPE, as the agent does: its children must not.
    #[test]
    fn a_child_gets_sigpipe_back_and_keeps_other_ignored_signals() {
        let _serial = SERIAL.lock();
        assert!(signals_to_reset().contains(&libc::SIGPIPE));
        // SAFETY: changes this process's disposition of SIGUSR2, which nothing here handles.
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
        let status = run(&["/bin/cat", "/proc/self/status"], &[], Path::new("/"));
        // SAFETY: as above.
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_DFL) };
        let (code, out) = status.unwrap();
        assert_eq!(code, 0);
        let ignored = out
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no SigIgn in {out}"));
        let bit = |sig: libc::c_int| 1u64 << (sig - 1);
        assert_eq!(ignored & bit(libc::SIGPIPE), 0, "{ignored:x}");
        assert_ne!(ignored & bit(libc::SIGUSR2), 0, "{ignored:x}");
    }

    #[test]
    fn the_program_is_searched_on_the_environments_path_in_order() {
        let _serial = SERIAL.lock();
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        script(&b.join("prog"), "#!/bin/sh\necho from-b \"$@\"\n");
        let path = format!(
            "/nonexistent:{}:{}/:/usr/bin:/bin",
            a.display(),
            b.display()
        );
        let env = [("PATH", "/usr/bin"), ("PATH", path.as_str())];
        assert_eq!(
            run(&["prog", "x"], &env, tmp.path()).unwrap(),
            (0, "from-b x\n".into())
        );
        // The first match wins.
        script(&a.join("prog"), "#!/bin/sh\necho from-a\n");
        assert_eq!(
            run(&["prog"], &env, tmp.path()).unwrap(),
            (0, "from-a\n".into())
        );
        // Without PATH, execvp's default.
        assert_eq!(
            run(&["echo", "hi"], &[], tmp.path()).unwrap(),
            (0, "hi\n".into())
        );
    }

    #[test]
    fn a_missing_program_is_not_found_and_a_forbidden_one_denied() {
        let _serial = SERIAL.lock();
        let tmp = tempfile::tempdir().unwrap();
        let env = [("PATH", "/nonexistent:/usr/bin")];
        let err = run(&["no-such-program"], &env, tmp.path()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        // A directory of that name is skipped, and EACCES reported only when nothing ran.
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        std::fs::write(tmp.path().join("sub/noexec"), "#!/bin/sh\n").unwrap();
        let path = format!("{}/sub", tmp.path().display());
        let err = run(&["noexec"], &[("PATH", path.as_str())], tmp.path()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
        let err = run(&["/bin/true"], &[], &tmp.path().join("gone")).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    }

    #[test]
    fn names_with_a_slash_and_empty_path_entries_are_relative_to_the_working_directory() {
        let _serial = SERIAL.lock();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("bin")).unwrap();
        script(&tmp.path().join("bin/here"), "#!/bin/sh\necho relative\n");
        script(&tmp.path().join("local"), "#!/bin/sh\necho local\n");
        // A slash: no search, even with a PATH that would find something else.
        let env = [("PATH", "/usr/bin:/bin")];
        assert_eq!(
            run(&["bin/here"], &env, tmp.path()).unwrap(),
            (0, "relative\n".into())
        );
        assert_eq!(
            run(&["./local"], &env, tmp.path()).unwrap(),
            (0, "local\n".into())
        );
        // An empty entry (leading, trailing or doubled) is the working directory.
        for path in [":/usr/bin", "/nonexistent::/usr/bin", "/nonexistent:"] {
            assert_eq!(
                run(&["local"], &[("PATH", path)], tmp.path()).unwrap(),
                (0, "local\n".into()),
                "{path:?}"
            );
        }
        // Without one, the working directory is not searched.
        let err = run(&["local"], &env, tmp.path()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }

    /// A program whose file is still open for writing for a moment (as a file just written
    /// is while another child is being cloned) starts once it is closed; one held open for good
    /// fails as before.
    #[test]
    fn a_program_file_busy_for_a_moment_still_starts() {
        let _serial = SERIAL.lock();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("busy");
        script(&path, "#!/bin/sh\necho started\n");
        let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(3));
            drop(writer);
        });
        let argv = [path.to_str().unwrap()];
        assert_eq!(
            run(&argv, &[], tmp.path()).unwrap(),
            (0, "started\n".into())
        );
        release.join().unwrap();
        let _held = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let err = run(&argv, &[], tmp.path()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ETXTBSY));
    }

    #[test]
    fn a_file_without_an_executable_format_runs_in_the_shell() {
        let _serial = SERIAL.lock();
        let tmp = tempfile::tempdir().unwrap();
        script(&tmp.path().join("plain"), "echo shell \"$0\" \"$1\"\n");
        let path = format!("{}", tmp.path().display());
        assert_eq!(
            run(&["plain", "arg"], &[("PATH", path.as_str())], tmp.path()).unwrap(),
            (0, format!("shell {}/plain arg\n", tmp.path().display()))
        );
    }

    #[test]
    fn the_child_gets_its_session_environment_and_nothing_else_open() {
        let _serial = SERIAL.lock();
        let tmp = tempfile::tempdir().unwrap();
        // A descriptor of ours without close-on-exec must not reach the program either.
        let leaked = std::fs::File::open("/dev/null").unwrap();
        let raw = leaked.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(raw, libc::F_SETFD, 0) };
        let env = [("PATH", "/usr/bin:/bin"), ("A", "1"), ("A", "2")];
        let (code, out) = run(
            &[
                "/bin/sh",
                "-c",
                "echo $A; ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; \
                 echo $$ $$; cut -d' ' -f5,6 /proc/$$/stat",
            ],
            &env,
            tmp.path(),
        )
        .unwrap();
        assert_eq!(code, 0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "2", "{out}");
        // 0-2, and the one `ls` itself opens for /proc/self/fd.
        let fds: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(&fds[..3], ["0", "1", "2"], "{out}");
        assert!(fds.len() <= 4, "{out}");
        // Its process group and session are its own (pgrp and sid are its pid).
        assert_eq!(lines[2], lines[3], "a session and group of its own: {out}");
        drop(leaked);
    }
}
