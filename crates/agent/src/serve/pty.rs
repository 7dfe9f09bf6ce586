//! Interactive processes on a pseudo-terminal (the API's WebSocket terminal).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use koder_agent_protocol::{
    AgentError, ErrorCode, ExitInfo, FromAgent, PtyRequest, ToAgent, CHUNK_BYTES,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::exec::{kill_group, ExecDefaults, Reaper, Status};
use crate::outbox::Outbox;

const DEFAULT_SHELL: &[&str] = &["/bin/bash", "-l"];

pub async fn run(
    reaper: &Reaper,
    defaults: &ExecDefaults,
    req: PtyRequest,
    mut rx: mpsc::Receiver<ToAgent>,
    out: Outbox,
) {
    let started = Instant::now();
    let (master, exit_rx, pid) = match start(reaper, defaults, &req) {
        Ok(s) => s,
        Err(e) => {
            let _ = out.send(FromAgent::Error(e)).await;
            return;
        }
    };
    // SAFETY: `master` is owned by the AsyncFd for its whole life and closed only by it.
    let master = match unsafe { AsyncFd::register(master) } {
        Ok(fd) => fd,
        Err(e) => {
            kill_group(pid, libc::SIGKILL);
            let _ = out
                .send(FromAgent::Error(AgentError::new(
                    ErrorCode::Io,
                    format!("pty: {e}"),
                )))
                .await;
            return;
        }
    };
    if out
        .send(FromAgent::Started { pid: pid as u32 })
        .await
        .is_err()
    {
        kill_group(pid, libc::SIGKILL);
    }
    tokio::pin!(exit_rx);
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut control_open = true;
    let status = loop {
        tokio::select! {
            st = &mut exit_rx => break st.unwrap_or(Status::Signaled(libc::SIGKILL)),
            readable = master.readable() => {
                let Ok(mut guard) = readable else { continue };
                match guard.try_io(|fd| read(fd.get_ref(), &mut buf)) {
                    Ok(Ok(n)) if n > 0 => {
                        // Awaiting the daemon is the back-pressure of a fast-printing program.
                        if out.send(FromAgent::Stdout(buf[..n].to_vec())).await.is_err() {
                            kill_group(pid, libc::SIGKILL);
                        }
                    }
                    // EIO: every slave end is closed; the exit status follows.
                    Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(_would_block) => {}
                }
            }
            msg = rx.recv(), if control_open => match msg {
                Some(ToAgent::Stdin(data)) => write_all(&master, &data).await,
                Some(ToAgent::Resize { cols, rows }) => set_size(master.get_ref(), cols, rows),
                Some(ToAgent::Signal(sig)) if (1..=64).contains(&sig) => kill_group(pid, sig),
                Some(ToAgent::Cancel) | None => {
                    control_open = false;
                    kill_group(pid, libc::SIGKILL);
                }
                Some(_) => {}
            }
        }
    };
    drain(&master, &mut buf, &out).await;
    let (exit_code, signal) = match status {
        Status::Exited(c) => (Some(c), None),
        Status::Signaled(s) => (None, Some(s)),
    };
    let _ = out
        .send(FromAgent::Exited(ExitInfo {
            exit_code,
            signal,
            duration_ms: started.elapsed().as_millis() as u64,
            pid: Some(pid as u32),
            ..Default::default()
        }))
        .await;
}

fn start(
    reaper: &Reaper,
    defaults: &ExecDefaults,
    req: &PtyRequest,
) -> Result<(OwnedFd, tokio::sync::oneshot::Receiver<Status>, i32), AgentError> {
    let bad = |m: String| AgentError::new(ErrorCode::InvalidRequest, m);
    let argv: Vec<String> = if req.argv.is_empty() {
        DEFAULT_SHELL.iter().map(|s| s.to_string()).collect()
    } else {
        req.argv.clone()
    };
    if argv[0].is_empty() || argv.iter().any(|a| a.contains('\0')) {
        return Err(bad(
            "argv must name a program and contain no NUL bytes".into()
        ));
    }
    if req
        .env
        .iter()
        .any(|(k, v)| k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0'))
    {
        return Err(bad("invalid environment variable".into()));
    }
    let pty = rustix::pty::openpt(
        rustix::pty::OpenptFlags::RDWR
            | rustix::pty::OpenptFlags::NOCTTY
            | rustix::pty::OpenptFlags::CLOEXEC,
    )
    .and_then(|m| {
        rustix::pty::grantpt(&m)?;
        rustix::pty::unlockpt(&m)?;
        Ok(m)
    })
    .map_err(|e| AgentError::new(ErrorCode::Io, format!("openpt: {e}")))?;
    let name = rustix::pty::ptsname(&pty, Vec::new())
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("ptsname: {e}")))?;
    set_size(&pty, req.cols, req.rows);
    let slave: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(std::ffi::OsStr::from_bytes(name.as_bytes()))
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("open pty slave: {e}")))?
        .into();
    let io = |fd: &OwnedFd| {
        fd.try_clone()
            .map(Stdio::from)
            .map_err(|e| AgentError::new(ErrorCode::Io, format!("pty: {e}")))
    };
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(defaults.env.iter().map(|(k, v)| (k, v)))
        .env("TERM", "xterm-256color")
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        .stdin(io(&slave)?)
        .stdout(io(&slave)?)
        .stderr(io(&slave)?);
    let cwd = req.cwd.as_deref().unwrap_or(&defaults.workdir);
    super::exec::run_as(&mut cmd, req.uid, req.gid, cwd).map_err(|e| {
        AgentError::new(
            ErrorCode::SpawnFailed,
            format!("working directory {cwd:?}: {e}"),
        )
    })?;
    super::exec::in_own_session(&mut cmd, true);
    let (child, exit_rx) = reaper.spawn(&mut cmd).map_err(|e| {
        AgentError::new(
            ErrorCode::SpawnFailed,
            format!("cannot start {:?}: {e}", argv[0]),
        )
    })?;
    let pid = child.id() as i32;
    drop(child);
    drop(slave);
    rustix::io::ioctl_fionbio(&pty, true)
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("pty: {e}")))?;
    Ok((pty, exit_rx, pid))
}

fn read(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
    match rustix::io::read(fd, buf) {
        Ok(n) => Ok(n),
        Err(rustix::io::Errno::AGAIN) => Err(std::io::ErrorKind::WouldBlock.into()),
        // EIO once the last slave closed: the terminal is done.
        Err(rustix::io::Errno::IO) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

async fn write_all(master: &AsyncFd<OwnedFd>, mut data: &[u8]) {
    while !data.is_empty() {
        let Ok(mut guard) = master.writable().await else {
            return;
        };
        match guard.try_io(|fd| match rustix::io::write(fd.get_ref(), data) {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN) => Err(std::io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(e.into()),
        }) {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(_)) => return,
            Err(_would_block) => {}
        }
    }
}

/// Output still queued in the terminal after the process exited.
async fn drain(master: &AsyncFd<OwnedFd>, buf: &mut [u8], out: &Outbox) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
    while let Ok(Ok(mut guard)) = tokio::time::timeout_at(deadline, master.readable()).await {
        match guard.try_io(|fd| read(fd.get_ref(), buf)) {
            Ok(Ok(n)) if n > 0 => {
                if out
                    .send(FromAgent::Stdout(buf[..n].to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Ok(_) => return,
            Err(_would_block) => {}
        }
    }
}

fn set_size(fd: &OwnedFd, cols: u16, rows: u16) {
    let ws = libc::winsize {
        ws_row: rows.max(1),
        ws_col: cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize we own; a failure only leaves the old size.
    unsafe {
        libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws);
    }
}
