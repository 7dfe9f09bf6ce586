//! The `sudo` command's side of the service: send the request with our stdio, relay the
//! signals we get while the command runs, and end as it ended.

use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

use super::wire::{encode_request, Request, Verdict, SOCKET_NAME, STDIO_FDS};

/// The signals sudo relays to its command; a terminal's ^C reaches our process group, not the
/// command's session, so without the relay it would never see it.
const RELAYED: &[i32] = &[
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
    libc::SIGALRM,
];

/// The write end of the self-pipe the signal handler reports to.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

pub fn run(req: Request) -> i32 {
    let program = req.program.clone();
    match relay(&req) {
        Ok(Verdict::Exited(code)) => code,
        Ok(Verdict::Signaled(sig)) => die_by(sig),
        Ok(Verdict::NotStarted(errno)) if errno == libc::ENOENT => {
            eprintln!("sudo: {program}: command not found");
            1
        }
        Ok(Verdict::NotStarted(errno)) => {
            let why = std::io::Error::from_raw_os_error(errno);
            eprintln!("sudo: unable to execute {program}: {why}");
            1
        }
        Err(e) => {
            eprintln!("sudo: the sandbox agent's sudo service: {e}");
            1
        }
    }
}

fn relay(req: &Request) -> std::io::Result<Verdict> {
    let addr = SocketAddr::from_abstract_name(SOCKET_NAME)?;
    let mut conn = UnixStream::connect_addr(&addr)?;
    let (signals, signal_writer) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    SIGNAL_PIPE.store(signal_writer.as_raw_fd(), Ordering::SeqCst);
    install_handlers();
    send_request(&conn, req)?;
    let mut answer = [0u8; 8];
    let mut have = 0;
    loop {
        let mut fds = [
            PollFd::new(&conn, PollFlags::IN),
            PollFd::new(&signals, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let (conn_ready, signal_ready) =
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if signal_ready {
            let mut sig = [0u8; 1];
            if rustix::io::read(&signals, &mut sig)? == 1 {
                // A command that just ended closed the service's end: its answer is still
                // there to read.
                let _ = conn.write_all(&i32::from(sig[0]).to_le_bytes());
            }
        }
        if conn_ready {
            let n = conn.read(&mut answer[have..])?;
            if n == 0 {
                return Err(std::io::Error::other("it closed without an answer"));
            }
            have += n;
            if have == answer.len() {
                return Verdict::decode(answer)
                    .ok_or_else(|| std::io::Error::other("it gave an answer not understood"));
            }
        }
    }
}

/// Sends the framed request with our stdin, stdout and stderr (/dev/null for any we lack).
fn send_request(conn: &UnixStream, req: &Request) -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let stdio: Vec<BorrowedFd<'_>> = (0..STDIO_FDS as i32)
        .map(|fd| {
            // SAFETY: F_GETFD only reads a descriptor's flags; 0-2 stay open while borrowed
            // (nothing here closes them).
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                null.as_fd()
            } else {
                // SAFETY: just checked open; we never close the standard descriptors.
                unsafe { BorrowedFd::borrow_raw(fd) }
            }
        })
        .collect();
    let framed = encode_request(req);
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(STDIO_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&stdio)) {
        return Err(std::io::Error::other("descriptors do not fit"));
    }
    let sent = rustix::net::sendmsg(
        conn,
        &[IoSlice::new(&framed)],
        &mut control,
        SendFlags::empty(),
    )?;
    // The descriptors went with the first bytes; the rest is plain data.
    (&*conn).write_all(&framed[sent..])
}

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    let byte = sig as u8;
    // SAFETY: write is async-signal-safe; a full pipe drops the signal (the command gets
    // plenty of others long before 64 KiB of them queue).
    unsafe {
        libc::write(fd, std::ptr::from_ref(&byte).cast(), 1);
    }
}

fn install_handlers() {
    for &sig in RELAYED {
        // SAFETY: sigaction with a zeroed struct, an empty mask and a handler that only
        // writes to a pipe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Ends this process by `sig`, as the command ended, so the shell that ran sudo sees the
/// same; 128 + `sig` when the signal does not end it.
fn die_by(sig: i32) -> i32 {
    // SAFETY: resetting a disposition, unblocking and raising: plain libc calls on integers.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    128 + sig
}
