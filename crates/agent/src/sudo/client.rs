//! The `sudo` command's side of the service: send the request with our stdio, relay the
//! signals we get while the command runs, and end as it ended. At a terminal the command gets
//! a terminal of its own, joined to ours, as sudo's `use_pty` gives it (see [`Terminal`]).

use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use rustix::termios::{OptionalActions, Termios};

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

/// How long the command's last output may take to arrive from its terminal once it ended.
const DRAIN_MS: i64 = 100;

pub fn run(mut req: Request) -> i32 {
    let (program, cwd) = (req.program.clone(), req.cwd.clone());
    let mut terminal = Terminal::open();
    req.terminal = terminal.is_some();
    let verdict = relay(&req, terminal.as_mut());
    // Our terminal's settings come back before anything else is printed.
    drop(terminal);
    match verdict {
        Ok(Verdict::Exited(code)) => code,
        Ok(Verdict::Signaled(sig)) => die_by(sig),
        Ok(Verdict::NoDirectory(errno)) => {
            let why = std::io::Error::from_raw_os_error(errno);
            eprintln!("sudo: unable to change directory to {cwd}: {why}");
            1
        }
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

/// The command's own terminal, when our stdin is a terminal whose foreground we are: it takes
/// our terminal's settings and size, ours goes raw while the command runs (its keys, ^C
/// included, reach the command's terminal as bytes, whose line discipline acts on them for the
/// command), and the two are joined until it ends. Dropping it gives ours its settings back.
struct Terminal {
    master: OwnedFd,
    /// Ours until the request carries it to the command.
    slave: Option<OwnedFd>,
    saved: Termios,
}

impl Terminal {
    fn open() -> Option<Self> {
        let tty = stdio(0);
        if !rustix::termios::isatty(tty) {
            return None;
        }
        let foreground = rustix::termios::tcgetpgrp(tty).ok()?;
        if foreground != rustix::process::getpgrp() {
            return None; // in the background: making it raw would stop us (SIGTTOU)
        }
        let saved = rustix::termios::tcgetattr(tty).ok()?;
        use rustix::pty::OpenptFlags;
        let master =
            rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
                .ok()?;
        rustix::pty::grantpt(&master).ok()?;
        rustix::pty::unlockpt(&master).ok()?;
        let name = rustix::pty::ptsname(&master, Vec::new()).ok()?;
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC;
        let slave = rustix::fs::open(name.as_c_str(), flags, Mode::empty()).ok()?;
        rustix::termios::tcsetattr(&slave, OptionalActions::Now, &saved).ok()?;
        copy_size(tty, &slave);
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(tty, OptionalActions::Now, &raw).ok()?;
        Some(Terminal {
            master,
            slave: Some(slave),
            saved,
        })
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(stdio(0), OptionalActions::Now, &self.saved);
    }
}

fn copy_size(from: BorrowedFd<'_>, to: impl AsFd) {
    if let Ok(size) = rustix::termios::tcgetwinsize(from) {
        let _ = rustix::termios::tcsetwinsize(to, size);
    }
}

/// Standard descriptor `fd`, which this process never closes.
fn stdio(fd: i32) -> BorrowedFd<'static> {
    // SAFETY: 0-2 are never closed by this process; a closed one only makes calls fail.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

fn relay(req: &Request, terminal: Option<&mut Terminal>) -> std::io::Result<Verdict> {
    let addr = SocketAddr::from_abstract_name(SOCKET_NAME)?;
    let mut conn = UnixStream::connect_addr(&addr)?;
    let (signals, signal_writer) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    SIGNAL_PIPE.store(signal_writer.as_raw_fd(), Ordering::SeqCst);
    install_handlers();
    let (slave, master) = match terminal {
        Some(t) => (t.slave.take(), Some(t.master.as_fd())),
        None => (None, None),
    };
    send_request(&conn, req, slave.as_ref())?;
    // The command holds its terminal now; ours would keep its end from ever closing.
    drop(slave);
    // Where the command's terminal shows: ours (stdout unless only stderr is one).
    let screen = stdio(
        match rustix::termios::isatty(stdio(1)) || !rustix::termios::isatty(stdio(2)) {
            true => 1,
            false => 2,
        },
    );
    let mut keys_open = master.is_some();
    let mut output_open = master.is_some();
    let mut answer = [0u8; 8];
    let mut have = 0;
    loop {
        let mut fds = vec![
            PollFd::new(&conn, PollFlags::IN),
            PollFd::new(&signals, PollFlags::IN),
        ];
        if let Some(m) = master.filter(|_| output_open) {
            fds.push(PollFd::from_borrowed_fd(m, PollFlags::IN));
        }
        if keys_open {
            fds.push(PollFd::from_borrowed_fd(stdio(0), PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        if ready[1] {
            let mut sig = [0u8; 1];
            if rustix::io::read(&signals, &mut sig)? == 1 {
                if let (Some(m), libc::SIGWINCH) = (master, i32::from(sig[0])) {
                    copy_size(stdio(0), m);
                }
                // A command that just ended closed the service's end: its answer is still
                // there to read.
                let _ = conn.write_all(&i32::from(sig[0]).to_le_bytes());
            }
        }
        if let Some(m) = master {
            let mut next = 2;
            if output_open {
                if ready[next] {
                    output_open = pass(m, screen);
                }
                next += 1;
            }
            if keys_open && ready[next] {
                keys_open = pass(stdio(0), m);
            }
        }
        if ready[0] {
            let n = conn.read(&mut answer[have..])?;
            if n == 0 {
                return Err(std::io::Error::other("it closed without an answer"));
            }
            have += n;
            if have == answer.len() {
                if let Some(m) = master.filter(|_| output_open) {
                    drain(m, screen);
                }
                return Verdict::decode(answer)
                    .ok_or_else(|| std::io::Error::other("it gave an answer not understood"));
            }
        }
    }
}

/// Copies what `from` has to `to`; false once `from` is done (end of file, or EIO: a
/// terminal's master whose every slave closed) or `to` is gone.
fn pass(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> bool {
    let mut buf = [0u8; 4096];
    match rustix::io::read(from, &mut buf) {
        Ok(0) | Err(_) => false,
        Ok(n) => write_all(to, &buf[..n]).is_ok(),
    }
}

fn write_all(to: BorrowedFd<'_>, mut data: &[u8]) -> rustix::io::Result<()> {
    while !data.is_empty() {
        match rustix::io::write(to, data) {
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The command's last output, still in its terminal when its answer came.
fn drain(master: BorrowedFd<'_>, screen: BorrowedFd<'_>) {
    let wait = Timespec {
        tv_sec: 0,
        tv_nsec: DRAIN_MS * 1_000_000,
    };
    loop {
        let mut fds = [PollFd::from_borrowed_fd(master, PollFlags::IN)];
        match poll(&mut fds, Some(&wait)) {
            Ok(0) | Err(_) => return,
            Ok(_) if !pass(master, screen) => return,
            Ok(_) => {}
        }
    }
}

/// Sends the framed request with our stdin, stdout and stderr (the command's terminal in
/// place of each that is a terminal, when it has one; /dev/null for any we lack).
fn send_request(
    conn: &UnixStream,
    req: &Request,
    terminal: Option<&OwnedFd>,
) -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let stdio: Vec<BorrowedFd<'_>> = (0..STDIO_FDS as i32)
        .map(|fd| {
            let ours = stdio(fd);
            match terminal {
                Some(t) if rustix::termios::isatty(ours) => t.as_fd(),
                // SAFETY: F_GETFD only reads a descriptor's flags.
                _ if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 => null.as_fd(),
                _ => ours,
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
