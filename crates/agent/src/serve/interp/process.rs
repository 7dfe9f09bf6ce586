//! A running interpreter: started, owned (dropping it kills its group), ready or not.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use koder_agent_protocol::{AgentError, ErrorCode, CHUNK_BYTES};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::unix::pipe;

use super::control::{Event, Line, LineReader};
use super::lang::Lang;
use super::spawn::{driver_file, find_program, fork_exec};
use crate::serve::exec::kill_group;

/// How long a new interpreter may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Start-up stderr kept for the error message of an interpreter that failed to start.
const STARTUP_STDERR: usize = 4096;

/// One running interpreter. Dropping it kills its process group.
pub(super) struct Interp {
    pub(super) lang: Lang,
    pub(super) pid: i32,
    /// pidfd: readable once the interpreter has exited.
    pub(super) exited: Option<AsyncFd<OwnedFd>>,
    pub(super) requests: pipe::Sender,
    pub(super) events: LineReader,
    pub(super) stdout: pipe::Receiver,
    pub(super) stderr: pipe::Receiver,
}

impl Drop for Interp {
    fn drop(&mut self) {
        kill_group(self.pid, libc::SIGKILL);
    }
}

/// Kills a process group unless disarmed: covers the steps between fork and a complete
/// [`Interp`].
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0, libc::SIGKILL);
    }
}

impl Interp {
    pub(super) async fn start(
        lang: Lang,
        env: &[(String, String)],
        workdir: &str,
    ) -> Result<Self, AgentError> {
        let spawn_err = |m: String| AgentError::new(ErrorCode::SpawnFailed, m);
        let program = find_program(lang.program(), env).ok_or_else(|| {
            spawn_err(format!(
                "no {} interpreter in this sandbox's PATH",
                lang.program()
            ))
        })?;
        let cstr = |s: &[u8]| {
            CString::new(s).map_err(|_| spawn_err("environment contains a NUL byte".into()))
        };
        let prog = cstr(program.as_os_str().as_bytes())?;
        let mut argv = vec![cstr(lang.program().as_bytes())?];
        for a in lang.args() {
            argv.push(cstr(a.as_bytes())?);
        }
        let envp = env
            .iter()
            .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let cwd = cstr(workdir.as_bytes())?;
        let driver = driver_file(lang.driver())
            .map_err(|e| spawn_err(format!("driver source file: {e}")))?;
        let forked =
            tokio::task::spawn_blocking(move || fork_exec(&prog, &argv, &envp, &cwd, &driver))
                .await
                .map_err(|e| spawn_err(format!("interpreter start failed: {e}")))?
                .map_err(|e| spawn_err(format!("cannot start {}: {e}", lang.program())))?;
        let guard = GroupGuard(forked.pid);
        let io = |e: std::io::Error| spawn_err(format!("interpreter pipes: {e}"));
        let mut interp = Interp {
            lang,
            pid: forked.pid,
            // SAFETY: the OwnedFd keeps the pidfd open, unchanged, for the AsyncFd's lifetime.
            exited: forked.pidfd.and_then(|fd| unsafe {
                AsyncFd::register_with_interest(fd, Interest::READABLE).ok()
            }),
            requests: pipe::Sender::from_owned_fd(forked.requests).map_err(io)?,
            events: LineReader::new(pipe::Receiver::from_owned_fd(forked.events).map_err(io)?),
            stdout: pipe::Receiver::from_owned_fd(forked.stdout).map_err(io)?,
            stderr: pipe::Receiver::from_owned_fd(forked.stderr).map_err(io)?,
        };
        std::mem::forget(guard);
        interp.wait_ready(lang).await?;
        Ok(interp)
    }

    /// Waits for the driver's "ready", keeping the start of its stderr for the error message
    /// of an interpreter that fails to start (a broken image, a missing module...).
    async fn wait_ready(&mut self, lang: Lang) -> Result<(), AgentError> {
        let deadline = tokio::time::sleep(START_TIMEOUT);
        tokio::pin!(deadline);
        let mut errors = Vec::new();
        let mut buf = vec![0u8; CHUNK_BYTES];
        let mut sink = vec![0u8; CHUNK_BYTES];
        let (mut out_open, mut err_open) = (true, true);
        loop {
            tokio::select! {
                biased;
                line = self.events.next_line() => match line {
                    Ok(Some(Line::Full(bytes))) => {
                        if serde_json::from_slice::<Event>(&bytes).is_ok_and(|e| e.ev == "ready") {
                            return Ok(());
                        }
                    }
                    Ok(Some(Line::TooLong)) => {}
                    Ok(None) | Err(_) => break,
                },
                r = self.stderr.read(&mut buf), if err_open => match r {
                    Ok(n) if n > 0 => {
                        let room = STARTUP_STDERR.saturating_sub(errors.len());
                        errors.extend_from_slice(&buf[..n.min(room)]);
                    }
                    _ => err_open = false,
                },
                r = self.stdout.read(&mut sink), if out_open => {
                    if !matches!(r, Ok(n) if n > 0) {
                        out_open = false;
                    }
                }
                () = &mut deadline => {
                    return Err(AgentError::new(
                        ErrorCode::SpawnFailed,
                        format!("the {} interpreter did not start within {} s", lang.name(),
                            START_TIMEOUT.as_secs()),
                    ));
                }
            }
        }
        while errors.len() < STARTUP_STDERR {
            let Some(n) = super::run::read_now(&self.stderr, &mut buf) else {
                break;
            };
            let room = STARTUP_STDERR - errors.len();
            errors.extend_from_slice(&buf[..n.min(room)]);
        }
        Err(AgentError::new(
            ErrorCode::SpawnFailed,
            format!(
                "the {} interpreter exited during start-up: {}",
                lang.name(),
                String::from_utf8_lossy(&errors).trim()
            ),
        ))
    }

    pub(super) fn has_exited(&self) -> bool {
        match &self.exited {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.get_ref().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll reads and writes one pollfd we own; timeout 0 never blocks.
                unsafe { libc::poll(&mut p, 1, 0) > 0 }
            }
            // SAFETY: kill with signal 0 only checks for existence.
            None => unsafe { libc::kill(self.pid, 0) != 0 },
        }
    }
}
