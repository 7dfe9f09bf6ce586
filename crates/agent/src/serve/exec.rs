//! Running processes: spawn, stream output with bounds, enforce timeouts, reap.
//!
//! The agent is PID 1, so every orphan in the sandbox becomes its child. A single reaper collects
//! all exit statuses with `waitpid(-1)` and hands each to the exec waiting for that pid; statuses
//! nobody waits for (orphans) are simply discarded, so zombies never pile up.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use koder_agent_protocol::{
    AgentError, ErrorCode, ExecRequest, ExecTiming, ExitInfo, FromAgent, ToAgent, TraceContext,
    CHUNK_BYTES,
};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

use super::groups::Groups;
use crate::child;
use crate::outbox::Outbox;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Exited(i32),
    Signaled(i32),
}

/// After the main process exits, how long to keep draining pipes still held open by
/// backgrounded descendants before answering.
const DRAIN_GRACE: Duration = Duration::from_millis(100);

#[derive(Default)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<Status>>>,
}

impl Reaper {
    /// Starts collecting exit statuses on every SIGCHLD.
    pub fn start() -> std::io::Result<Arc<Self>> {
        let reaper = Arc::new(Self::default());
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        let r = reaper.clone();
        tokio::spawn(async move {
            while sigchld.recv().await.is_some() {
                r.reap();
            }
        });
        Ok(reaper)
    }

    fn reap(&self) {
        let mut waiters = self.waiters.lock();
        loop {
            let mut raw = 0;
            // SAFETY: waitpid writes only into `raw`.
            let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            let status = if libc::WIFSIGNALED(raw) {
                Status::Signaled(libc::WTERMSIG(raw))
            } else {
                Status::Exited(libc::WEXITSTATUS(raw))
            };
            if let Some(tx) = waiters.remove(&pid) {
                let _ = tx.send(status);
            }
        }
    }

    /// Spawns `cmd` and registers for its exit under the same lock the reaper takes, so an exit
    /// can never be reaped before someone waits for it.
    pub(crate) fn spawn(
        &self,
        cmd: &mut Command,
    ) -> std::io::Result<(std::process::Child, oneshot::Receiver<Status>)> {
        // SAFETY: before_exec is async-signal-safe (a write and a close_range). std has put the
        // child's stdio on 0-2 by the time pre_exec hooks run; nothing else may pass.
        unsafe {
            cmd.pre_exec(|| crate::child::before_exec(3));
        }
        self.register(|| {
            let child = cmd.spawn()?;
            let pid = child.id() as i32;
            Ok((child, pid))
        })
    }

    /// Runs `start` (which returns what it started and its pid) under the lock the reaper
    /// takes, and registers for that pid's exit.
    fn register<T>(
        &self,
        start: impl FnOnce() -> std::io::Result<(T, i32)>,
    ) -> std::io::Result<(T, oneshot::Receiver<Status>)> {
        let mut waiters = self.waiters.lock();
        let (started, pid) = start()?;
        let (tx, rx) = oneshot::channel();
        waiters.insert(pid, tx);
        Ok((started, rx))
    }
}

/// A started exec: its pid and the agent's ends of its stdin, stdout and stderr.
struct Started {
    pid: i32,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

/// Settings every exec inherits.
pub struct ExecDefaults {
    pub env: Vec<(String, String)>,
    pub workdir: String,
}

pub async fn run(
    reaper: &Reaper,
    defaults: &ExecDefaults,
    req: ExecRequest,
    mut rx: mpsc::Receiver<ToAgent>,
    out: Outbox,
) {
    let received = Instant::now();
    let (child, exit_rx) = match validate(&req).and_then(|()| spawn(reaper, defaults, &req)) {
        Ok(c) => c,
        Err(e) => {
            let _ = out.send(FromAgent::Error(e)).await;
            return;
        }
    };
    let started = Instant::now();
    let Started {
        pid,
        stdin,
        stdout,
        stderr,
    } = child;
    // The first word on the stream, before any output: the daemon waits for it (or for the
    // error of a spawn that failed) before it hands a followed exec to its client.
    if !req.quiet
        && out
            .send(FromAgent::Started { pid: pid as u32 })
            .await
            .is_err()
        && !req.detached
    {
        kill_group(pid, libc::SIGKILL);
    }
    let limit = req.output_limit_bytes;
    let stdout_cut = Arc::new(AtomicBool::new(false));
    let stderr_cut = Arc::new(AtomicBool::new(false));
    let pump = |fd, cut: &Arc<AtomicBool>, wrap| {
        Pump {
            limit,
            out: out.clone(),
            cut: cut.clone(),
            wrap,
            drain_unread: req.detached,
        }
        .spawn(fd)
    };
    let pumps = [
        pump(stdout, &stdout_cut, FromAgent::Stdout),
        pump(stderr, &stderr_cut, FromAgent::Stderr),
    ];
    let mut stdin_tx = spawn_stdin(stdin, req.stdin, req.keep_stdin_open);

    let deadline = req
        .timeout_ms
        .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let mut timed_out = false;
    let mut control_open = true;
    tokio::pin!(exit_rx);
    let (status, exited) = loop {
        tokio::select! {
            st = &mut exit_rx => break (st.unwrap_or(Status::Signaled(libc::SIGKILL)), Instant::now()),
            () = sleep_until(deadline), if !timed_out => {
                timed_out = true;
                kill_group(pid, libc::SIGKILL);
            }
            msg = rx.recv(), if control_open => match msg {
                Some(ToAgent::Stdin(data)) => {
                    if let Some(tx) = &stdin_tx {
                        let _ = tx.send(data).await;
                    }
                }
                Some(ToAgent::CloseStdin) => stdin_tx = None,
                Some(ToAgent::Signal(sig)) if (1..=64).contains(&sig) => kill_group(pid, sig),
                // The connection is gone: a detached exec runs on, unread.
                None if req.detached => control_open = false,
                Some(ToAgent::Cancel) | None => {
                    // The caller is gone or gave up: nobody will read this exec's result.
                    control_open = false;
                    kill_group(pid, libc::SIGKILL);
                }
                Some(_) => {}
            }
        }
    };
    if timed_out {
        // Descendants that left the group's main process behind die with the exec.
        kill_group(pid, libc::SIGKILL);
    }
    drop(stdin_tx);
    for pump in pumps {
        let abort = pump.abort_handle();
        if tokio::time::timeout(DRAIN_GRACE, pump).await.is_err() {
            abort.abort();
        }
    }
    let (exit_code, signal) = match status {
        Status::Exited(c) => (Some(c), None),
        Status::Signaled(s) => (None, Some(s)),
    };
    let _ = out
        .send(FromAgent::Exited(ExitInfo {
            exit_code,
            signal,
            timed_out,
            stdout_truncated: stdout_cut.load(Ordering::Relaxed),
            stderr_truncated: stderr_cut.load(Ordering::Relaxed),
            // From the request's arrival: a process that ran before the spawn call returned
            // (the agent's thread descheduled on a busy host) is still counted whole.
            duration_ms: received.elapsed().as_millis() as u64,
            timing: ExecTiming {
                spawn_us: micros(started - received),
                run_us: micros(exited - started),
                since_exit_us: micros(exited.elapsed()),
            },
            pid: Some(pid as u32),
        }))
        .await;
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// `TRACEPARENT` for an exec's process or a context run when it is traced and its own
/// environment `env` names none (a caller's explicit value wins).
pub(crate) fn trace_env(
    trace: Option<TraceContext>,
    env: &[(String, String)],
) -> Option<(String, String)> {
    let cx = trace?;
    let named = env.iter().any(|(k, _)| k == TRACEPARENT);
    (!named).then(|| (TRACEPARENT.to_string(), cx.traceparent()))
}

const TRACEPARENT: &str = "TRACEPARENT";

fn validate(req: &ExecRequest) -> Result<(), AgentError> {
    let bad = |m: &str| Err(AgentError::new(ErrorCode::InvalidRequest, m));
    if req.argv.is_empty() || req.argv[0].is_empty() {
        return bad("argv must name a program");
    }
    let has_nul = |s: &str| s.contains('\0');
    if req.argv.iter().any(|a| has_nul(a))
        || req.env.iter().any(|(k, v)| has_nul(k) || has_nul(v))
        || req.cwd.as_deref().is_some_and(has_nul)
    {
        return bad("argv, env and cwd must not contain NUL bytes");
    }
    if req.env.iter().any(|(k, _)| k.is_empty() || k.contains('=')) {
        return bad("environment names must be non-empty and contain no '='");
    }
    Ok(())
}

/// Starts the exec in a new session (a process group of its own, so a timeout or signal
/// reaches every process it started) under its account, with `vfork_spawn`: no copy of the
/// agent's memory, whoever it runs as.
fn spawn(
    reaper: &Reaper,
    defaults: &ExecDefaults,
    req: &ExecRequest,
) -> Result<(Started, oneshot::Receiver<Status>), AgentError> {
    let cwd = req.cwd.as_deref().unwrap_or(&defaults.workdir);
    let trace = trace_env(req.trace, &req.env);
    let env: Vec<(&str, &str)> = defaults
        .env
        .iter()
        .chain(&trace)
        .chain(&req.env)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let started = child::Plan::new(&req.argv, &env, cwd).and_then(|plan| {
        let groups = supplementary(req.uid, req.gid);
        let plan = plan.run_as(req.uid, req.gid, groups);
        let plan = match sends_stdin(req) {
            true => plan,
            false => plan.without_stdin(),
        };
        reaper.register(|| {
            let c = child::vfork_spawn(plan)?;
            let started = Started {
                pid: c.pid,
                stdin: c.stdin,
                stdout: Some(c.stdout),
                stderr: Some(c.stderr),
            };
            Ok((started, c.pid))
        })
    });
    started.map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                ErrorCode::SpawnFailed
            }
            std::io::ErrorKind::InvalidInput => ErrorCode::InvalidRequest,
            _ => ErrorCode::SpawnFailed,
        };
        AgentError::new(code, format!("cannot start {:?}: {e}", req.argv[0]))
    })
}

/// What the first read of an output pipe asks for; each read that fills its room doubles the
/// next one's, up to `CHUNK_BYTES`. Most execs write a few bytes or none, and a 64 KiB buffer
/// for each pipe of every exec made the allocator grow and trim its heap (four `brk` calls per
/// exec).
const FIRST_READ_BYTES: usize = 4096;

/// Forwards one output pipe of an exec to its stream, up to `limit` bytes (the rest is read
/// and dropped, flagged in `cut`).
struct Pump {
    limit: u64,
    out: Outbox,
    cut: Arc<AtomicBool>,
    wrap: fn(Vec<u8>) -> FromAgent,
    /// Once the stream is gone, keep reading (and dropping) what the process writes, so a
    /// detached exec never blocks on, or dies of, a pipe nobody reads.
    drain_unread: bool,
}

impl Pump {
    fn spawn(self, fd: Option<OwnedFd>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let Some(mut r) = fd.and_then(|fd| receiver(fd).ok()) else {
                return;
            };
            let mut sent = 0u64;
            let mut stream_open = true;
            let mut room = FIRST_READ_BYTES;
            loop {
                // Read into fresh room left uninitialised and sent as it is: nothing zeroed,
                // no copy of a full chunk.
                let mut chunk = Vec::with_capacity(room);
                let n = match r.read_buf(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if n == chunk.capacity() {
                    room = (room * 2).min(CHUNK_BYTES);
                }
                let room = self.limit.saturating_sub(sent);
                let take = (n as u64).min(room) as usize;
                if take < n {
                    self.cut.store(true, Ordering::Relaxed);
                }
                if take > 0 && stream_open {
                    sent += take as u64;
                    chunk.truncate(take);
                    // A small chunk does not hold 64 KiB while it waits in the outbox.
                    if chunk.capacity() > 2 * take {
                        chunk.shrink_to_fit();
                    }
                    // Awaiting here is the back-pressure: a slow reader stops us reading the
                    // pipe, and the process blocks on its own writes instead of the agent
                    // buffering.
                    stream_open = self.out.send((self.wrap)(chunk)).await.is_ok();
                    if !stream_open && !self.drain_unread {
                        return;
                    }
                }
            }
        })
    }
}

/// The read end of an output pipe `vfork_spawn` made: one `fcntl` where tokio's checked
/// constructor would also `fstat` it and read its flags first.
fn receiver(fd: OwnedFd) -> std::io::Result<pipe::Receiver> {
    rustix::fs::fcntl_setfl(&fd, rustix::fs::OFlags::NONBLOCK)?;
    pipe::Receiver::from_owned_fd_unchecked(fd)
}

/// Whether the exec has anything for its process's stdin: bytes now, or more later.
fn sends_stdin(req: &ExecRequest) -> bool {
    !req.stdin.is_empty() || req.keep_stdin_open
}

/// Feeds stdin: the initial bytes, then (when kept open) whatever arrives on the returned
/// channel; dropping the sender closes the process's stdin. No pipe (`fd` is `None`) for an
/// exec with nothing to send: it reads end-of-file from /dev/null ([`sends_stdin`]).
fn spawn_stdin(
    fd: Option<OwnedFd>,
    initial: Vec<u8>,
    keep_open: bool,
) -> Option<mpsc::Sender<Vec<u8>>> {
    let fd = fd?;
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(async move {
        let Ok(mut w) = pipe::Sender::from_owned_fd(fd) else {
            return;
        };
        if w.write_all(&initial).await.is_err() {
            return;
        }
        while let Some(data) = rx.recv().await {
            if w.write_all(&data).await.is_err() {
                return;
            }
        }
    });
    keep_open.then_some(tx)
}

/// Sleeps until `deadline`; without one, forever (a `select!` branch that never fires).
pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

pub(crate) fn kill_group(pgid: i32, sig: i32) {
    if pgid <= 0 {
        return; // -0 and -(-1) would reach far more than one process group
    }
    // SAFETY: kill takes plain integers. ESRCH (already gone) is the expected race.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// The supplementary groups of a child run as `uid`: none when it runs as the agent does.
fn supplementary(uid: Option<u32>, gid: Option<u32>) -> Arc<[libc::gid_t]> {
    match uid {
        Some(uid) => Groups::sandbox().of(uid, gid.unwrap_or(0)),
        None => Arc::new([]),
    }
}

/// The sandbox account a `Command`'s child runs as (default: the sandbox's root) and its
/// working directory `cwd`, entered as that account; shared by PTYs and sudo. The switch is
/// the child's own (std's `Command::uid` would drop the account's supplementary groups), so
/// is the `chdir` after it: the directory must be the account's to enter.
pub(super) fn run_as(
    cmd: &mut Command,
    uid: Option<u32>,
    gid: Option<u32>,
    cwd: &str,
) -> std::io::Result<()> {
    if uid.is_none() {
        cmd.current_dir(cwd);
        if let Some(gid) = gid {
            cmd.gid(gid);
        }
        return Ok(());
    }
    let groups = supplementary(uid, gid);
    let cwd = std::ffi::CString::new(cwd)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: between fork and exec: raw set*id syscalls on prepared data, and chdir on a
    // prepared C string; nothing allocates.
    unsafe {
        cmd.pre_exec(move || {
            child::switch_account(uid, gid, &groups).map_err(std::io::Error::from_raw_os_error)?;
            if libc::chdir(cwd.as_ptr()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Starts `cmd` in a session of its own (a PTY's shell, a sudo command); with `terminal`, its
/// stdin (a terminal) becomes the session's controlling terminal, as a login shell expects (job
/// control, ^C to the foreground group).
pub(super) fn in_own_session(cmd: &mut Command, terminal: bool) {
    // SAFETY: setsid and ioctl are async-signal-safe. TIOCSCTTY with 0 never takes a terminal
    // that is another session's already.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spawns fail alike under any account: a missing program, a missing working directory
    /// and a non-executable file give the same typed errors.
    #[test]
    fn spawn_failures_are_typed_alike_under_any_account() {
        let _serial = crate::child::tests::SERIAL.lock();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("data"), "x").unwrap();
        let reaper = Reaper::default();
        let defaults = ExecDefaults {
            env: vec![("PATH".into(), "/nonexistent:/usr/bin:/bin".into())],
            workdir: tmp.path().to_string_lossy().into_owned(),
        };
        let root = own_uid();
        for (argv, cwd) in [
            ("no-such-program", None),
            ("./data", None),
            ("/bin/true", Some("/nonexistent-dir")),
        ] {
            let req = |uid| ExecRequest {
                argv: vec![argv.into()],
                cwd: cwd.map(String::from),
                uid,
                ..Default::default()
            };
            let own = spawn(&reaper, &defaults, &req(None)).err().expect("fails");
            let named = spawn(&reaper, &defaults, &req(Some(root)))
                .err()
                .expect("fails");
            assert_eq!(own.code, ErrorCode::SpawnFailed, "{argv}: {own:?}");
            assert_eq!((own.code, &own.message), (named.code, &named.message));
        }
        // SAFETY: waitpid with a null status pointer: the failed children's zombies.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    }

    /// An exec under another account runs as it (its supplementary groups dropped), and the
    /// switch is the child's alone though it shares the agent's memory: the agent keeps its
    /// own ids.
    #[test]
    fn an_exec_runs_as_its_account_and_the_agent_stays_itself() {
        if own_uid() != 0 {
            return; // only root may become another account
        }
        let _serial = crate::child::tests::SERIAL.lock();
        let reaper = Reaper::default();
        let defaults = ExecDefaults {
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            workdir: "/".into(),
        };
        let req = ExecRequest {
            argv: ["/bin/sh", "-c", "id -u; id -g; id -G"]
                .map(String::from)
                .to_vec(),
            uid: Some(65534),
            gid: Some(65533),
            ..Default::default()
        };
        let (started, _exit) = spawn(&reaper, &defaults, &req).expect("spawns");
        let mut out = String::new();
        let stdout = started.stdout.expect("stdout");
        std::io::Read::read_to_string(&mut std::fs::File::from(stdout), &mut out).unwrap();
        assert_eq!(out, "65534\n65533\n65533\n");
        assert_eq!(own_uid(), 0, "the agent switched too");
        // SAFETY: getgid has no failure mode.
        assert_eq!(unsafe { libc::getgid() }, 0, "the agent switched too");
        // SAFETY: waitpid with a null status pointer reaps the child.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    }

    fn own_uid() -> u32 {
        // SAFETY: getuid has no failure mode.
        unsafe { libc::getuid() }
    }
}
