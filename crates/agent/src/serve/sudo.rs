//! The sudo service: what lets a sandbox process run a command as another account of the
//! sandbox (root, usually) without a setuid binary, which no_new_privs and the image store
//! (setuid bits stripped) both rule out.
//!
//! The agent, which runs as the sandbox's root, listens on an abstract socket in the
//! sandbox's network namespace; the `sudo` command (the agent's own binary under that name,
//! see [`crate::sudo`]) sends one request with its stdin, stdout and stderr, and the agent
//! starts the command on them, in a session of its own, under the same walls as every
//! sandbox process (no_new_privs, the bounding set, Landlock, seccomp, the workload cgroup).
//! The client stays until the command ends, relaying the signals it gets, and exits as the
//! command did; when the client goes (an exec killed with its process group), the command's
//! group is killed too, so nothing it started outlives the exec that ran `sudo`.
//!
//! This grants nothing a sandbox process could not reach already: the sandbox's own root is
//! inside the walls, and the API runs commands as root anyway. Sandbox accounts are a
//! convenience inside the sandbox; the sandbox is the boundary.

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, Semaphore};

use super::exec::{kill_group, Reaper, Status};
use crate::sudo::wire::{framed_len, Request, Verdict, HANDSHAKE_TIMEOUT, SOCKET_NAME, STDIO_FDS};

/// Commands run through the service at once; a connection beyond is closed unanswered (the
/// client says so). Each holds a sandbox process anyway, which the pids limit bounds.
const MAX_RUNNING: usize = 256;

/// Binds the service's socket and serves it for the agent's lifetime.
pub fn start(reaper: Arc<Reaper>) -> std::io::Result<()> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(SOCKET_NAME)?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    listener.set_nonblocking(true)?;
    let listener = UnixListener::from_std(listener)?;
    tokio::spawn(accept_loop(listener, reaper));
    Ok(())
}

async fn accept_loop(listener: UnixListener, reaper: Arc<Reaper>) {
    let running = Arc::new(Semaphore::new(MAX_RUNNING));
    loop {
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(_) => {
                // EMFILE and kin: give the table a moment rather than spin.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = running.clone().try_acquire_owned() else {
            continue;
        };
        let reaper = reaper.clone();
        tokio::spawn(async move {
            serve_one(conn, &reaper).await;
            drop(permit);
        });
    }
}

async fn serve_one(mut conn: UnixStream, reaper: &Reaper) {
    let Ok(Ok((req, stdio))) = tokio::time::timeout(HANDSHAKE_TIMEOUT, read_request(&conn)).await
    else {
        return; // malformed, too slow or too big: closed unanswered
    };
    if req.problem().is_some() {
        return answer(&mut conn, Verdict::NotStarted(libc::EINVAL)).await;
    }
    if let Some(why) = no_directory(&req.cwd) {
        return answer(&mut conn, why).await;
    }
    let (pid, exit) = match spawn(reaper, &req, stdio) {
        Ok(started) => started,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            return answer(&mut conn, Verdict::NotStarted(errno)).await;
        }
    };
    let status = relay(&mut conn, pid, exit).await;
    let verdict = match status {
        Status::Exited(c) => Verdict::Exited(c),
        Status::Signaled(s) => Verdict::Signaled(s),
    };
    answer(&mut conn, verdict).await;
}

async fn answer(conn: &mut UnixStream, verdict: Verdict) {
    let _ = conn.write_all(&verdict.encode()).await;
}

/// Why the command could not start in `cwd`, checked as the agent (the sandbox's root) before
/// the spawn, so that a missing program and a missing directory are told apart.
fn no_directory(cwd: &str) -> Option<Verdict> {
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some(Verdict::NoDirectory(libc::ENOTDIR)),
        Err(e) => Some(Verdict::NoDirectory(
            e.raw_os_error().unwrap_or(libc::ENOENT),
        )),
    }
}

/// Relays the client's signals to the command's process group until the command ends; kills
/// the group when the client goes first.
async fn relay(conn: &mut UnixStream, pgid: i32, exit: oneshot::Receiver<Status>) -> Status {
    tokio::pin!(exit);
    let mut word = [0u8; 4];
    let mut have = 0;
    let mut client_gone = false;
    loop {
        tokio::select! {
            status = &mut exit => return status.unwrap_or(Status::Signaled(libc::SIGKILL)),
            read = conn.read(&mut word[have..]), if !client_gone => match read {
                Ok(0) | Err(_) => {
                    client_gone = true;
                    kill_group(pgid, libc::SIGKILL);
                }
                Ok(n) => {
                    have += n;
                    if have == word.len() {
                        have = 0;
                        let sig = i32::from_le_bytes(word);
                        // SIGKILL and SIGSTOP are never relayed: a client cannot catch them.
                        if (1..=64).contains(&sig) && sig != libc::SIGKILL && sig != libc::SIGSTOP {
                            kill_group(pgid, sig);
                        }
                    }
                }
            }
        }
    }
}

/// Reads the framed request and the descriptors that came with it: exactly
/// [`STDIO_FDS`], all on the request's bytes; anything else is refused.
async fn read_request(conn: &UnixStream) -> std::io::Result<(Request, Vec<OwnedFd>)> {
    let refused = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string());
    let mut buf = Vec::new();
    let mut fds = Vec::new();
    let mut want = 4;
    while buf.len() < want {
        let mut chunk = vec![0u8; (want - buf.len()).min(64 * 1024)];
        let (n, got) = recv_with_fds(conn, &mut chunk).await?;
        if n == 0 {
            return Err(refused("closed before the whole request"));
        }
        fds.extend(got);
        if fds.len() > STDIO_FDS {
            return Err(refused("too many descriptors"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if want == 4 && buf.len() >= 4 {
            let prefix = [buf[0], buf[1], buf[2], buf[3]];
            want = framed_len(prefix).ok_or_else(|| refused("request too large"))?;
        }
    }
    if fds.len() != STDIO_FDS {
        return Err(refused("stdio descriptors missing"));
    }
    let req = serde_json::from_slice(&buf[4..]).map_err(|e| refused(&e.to_string()))?;
    Ok((req, fds))
}

/// One `recvmsg`: the bytes read and the descriptors that came with them (close-on-exec); a
/// truncated control message (more descriptors than fit, which the kernel then closes) is an
/// error.
async fn recv_with_fds(
    conn: &UnixStream,
    buf: &mut [u8],
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    loop {
        conn.readable().await?;
        let got = conn.try_io(Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(STDIO_FDS))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let msg = rustix::net::recvmsg(
                conn,
                &mut [IoSliceMut::new(buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            )?;
            if msg.flags.contains(ReturnFlags::CTRUNC) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "too many descriptors",
                ));
            }
            let mut fds = Vec::new();
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = message {
                    fds.extend(received);
                }
            }
            Ok((msg.bytes, fds))
        });
        match got {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// Starts the command on the client's stdio, in a session of its own (its group is what
/// signals and the final kill reach; its stdin its controlling terminal when the request says
/// it is one), under the requested account.
fn spawn(
    reaper: &Reaper,
    req: &Request,
    stdio: Vec<OwnedFd>,
) -> std::io::Result<(i32, oneshot::Receiver<Status>)> {
    let mut stdio = stdio.into_iter().map(Stdio::from);
    let mut next = || stdio.next().unwrap_or_else(Stdio::null);
    let mut cmd = Command::new(&req.program);
    cmd.arg0(&req.argv[0])
        .args(&req.argv[1..])
        .env_clear()
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        .stdin(next())
        .stdout(next())
        .stderr(next());
    super::exec::run_as(&mut cmd, Some(req.uid), Some(req.gid), &req.cwd)?;
    super::exec::in_own_session(&mut cmd, req.terminal);
    let (child, exit) = reaper.spawn(&mut cmd)?;
    let pid = child.id() as i32;
    drop(child);
    Ok((pid, exit))
}
