//! The guest end of the agent channel on a virtio-serial port (the QEMU backend: unlike
//! vhost-user vsock, virtio-serial migrates, so a VM can be saved to a file and brought back).
//!
//! A port is one byte stream for the life of the guest, whether or not the host is connected:
//! the host may go (daemon restart, memory snapshot) and come back while stale bytes of a
//! half-sent frame still sit in either direction. Every connection therefore starts with the
//! handshake of [`koder_agent_protocol::init::sync`]: input is discarded up to a `KODER-SYNC`
//! line, answered with `KODER-READY` and the same nonce, and only then does a fresh codec see
//! the stream. A connection ends when the host goes (a read returns 0: no data and no host) or
//! when a marker shows up where a frame should start (the host reconnected before the guest
//! noticed); its writes then fail, so nothing of it reaches the next connection, and its
//! running operations are cancelled as when a vsock connection drops.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use koder_agent_protocol::init::sync::{self, LineScanner};
use koder_agent_protocol::MAX_FRAME_BYTES;
use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// While no host is connected a read returns 0 at once and poll reports a hang-up at once:
/// there is no readiness to wait for, so the handshake looks again this often.
const NO_HOST_POLL: Duration = Duration::from_millis(50);
const READ_CHUNK: usize = 64 * 1024;
/// Ports appear once the host has told the driver about them, shortly after it loads.
const PORT_WAIT: Duration = Duration::from_secs(10);

/// Finds the port called `name` (`/sys/class/virtio-ports/*/name`: the guest has no udev to
/// make `/dev/virtio-ports/<name>`) and opens its device node. Call before the root is
/// switched: the sandbox's sealed /dev has no such node.
pub fn open(name: &str) -> io::Result<OwnedFd> {
    let deadline = Instant::now() + PORT_WAIT;
    loop {
        if let Some(node) = find_port(name).filter(|n| n.exists()) {
            let fd = rustix::fs::open(
                &node,
                rustix::fs::OFlags::RDWR
                    | rustix::fs::OFlags::NONBLOCK
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            return Ok(fd);
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("virtio-serial port {name:?} did not appear"),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn find_port(name: &str) -> Option<PathBuf> {
    let class = Path::new("/sys/class/virtio-ports");
    std::fs::read_dir(class).ok()?.flatten().find_map(|e| {
        let dev = e.file_name();
        let named =
            std::fs::read_to_string(class.join(&dev).join("name")).is_ok_and(|n| n.trim() == name);
        named.then(|| Path::new("/dev").join(dev))
    })
}

/// The port, shared by the handshake and the connection of the moment.
pub struct Port {
    fd: AsyncFd<OwnedFd>,
    /// The connection allowed to write; bumped at every handshake.
    current: AtomicU64,
    /// Bytes a connection read past its end (a marker and what follows): the handshake's.
    carry: Mutex<Vec<u8>>,
    /// Told once per connection, when its reads have ended.
    ended: tokio::sync::Notify,
}

enum Read {
    Data(usize),
    /// No host (a read of 0): everything it sent has been read.
    NoHost,
}

impl Port {
    pub fn new(fd: OwnedFd) -> io::Result<Arc<Self>> {
        // SAFETY: an OwnedFd is a valid open descriptor that stays open, and always the same,
        // until the AsyncFd owning it is dropped.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        Ok(Arc::new(Self {
            fd,
            current: AtomicU64::new(0),
            carry: Mutex::default(),
            ended: tokio::sync::Notify::new(),
        }))
    }

    fn poll_read_raw(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<Read>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            match rustix::io::read(self.fd.get_ref(), &mut *buf) {
                Ok(0) => return Poll::Ready(Ok(Read::NoHost)),
                Ok(n) => return Poll::Ready(Ok(Read::Data(n))),
                Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
    }

    async fn read_raw(&self, buf: &mut [u8]) -> io::Result<Read> {
        std::future::poll_fn(|cx| self.poll_read_raw(cx, buf)).await
    }

    fn poll_write_raw(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match rustix::io::write(self.fd.get_ref().as_fd(), buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
    }

    async fn write_all_raw(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = std::future::poll_fn(|cx| self.poll_write_raw(cx, buf)).await?;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// Waits for a host's `KODER-SYNC`, answers it and returns the next connection with the
    /// bytes that followed the marker. Everything before the marker is discarded; no host yet
    /// is waited out (the guest may wait for days while its daemon is away).
    pub async fn accept(self: &Arc<Self>) -> io::Result<Connection> {
        let mut scanner = LineScanner::new(sync::SYNC);
        let mut input = std::mem::take(&mut *self.carry.lock());
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            if let Some((nonce, used)) = scanner.feed(&input) {
                let id = self.current.fetch_add(1, Ordering::SeqCst) + 1;
                self.write_all_raw(sync::ready_line(&nonce).as_bytes())
                    .await?;
                return Ok(Connection {
                    port: self.clone(),
                    id,
                    pending: input.split_off(used),
                    gate: FrameGate::default(),
                    ended: false,
                });
            }
            input.clear();
            match self.read_raw(&mut buf).await? {
                Read::Data(n) => input.extend_from_slice(&buf[..n]),
                Read::NoHost => tokio::time::sleep(NO_HOST_POLL).await,
            }
        }
    }
}

/// What to do with the bytes at the head of a connection's input.
#[derive(Debug, PartialEq, Eq)]
enum Gate {
    /// Pass this many bytes on: they belong to the frame being read.
    Pass(usize),
    /// A frame starts but its length is not complete yet.
    NeedMore,
    /// A marker where a frame should start: the connection is over.
    Resync,
}

/// Follows frame boundaries (4-byte big-endian length, then that many bytes) so a marker is
/// recognised exactly where a frame would start, and never inside one.
#[derive(Debug, Default)]
struct FrameGate {
    /// Bytes of the current frame (length included) not passed on yet.
    remaining: usize,
}

impl FrameGate {
    fn next(&mut self, input: &[u8]) -> Gate {
        if self.remaining == 0 {
            let Some(&head) = input.first() else {
                return Gate::NeedMore;
            };
            if sync::is_marker_start(head) {
                return Gate::Resync;
            }
            let Some(len) = input.get(..4) else {
                return Gate::NeedMore;
            };
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            // The codec refuses longer frames, ending the connection just the same.
            self.remaining = 4 + len.min(MAX_FRAME_BYTES + 1);
        }
        Gate::Pass(self.remaining.min(input.len()))
    }

    fn passed(&mut self, n: usize) {
        self.remaining -= n;
    }
}

/// One connection over the port: reads end (0) when it is over, writes fail once a newer
/// connection has begun.
pub struct Connection {
    port: Arc<Port>,
    id: u64,
    /// Read from the port, not yet handed on.
    pending: Vec<u8>,
    gate: FrameGate,
    ended: bool,
}

impl Connection {
    fn end(&mut self, carry: Vec<u8>) {
        if !self.ended {
            self.ended = true;
            *self.port.carry.lock() = carry;
            self.port.ended.notify_one();
        }
    }

    fn is_current(&self) -> bool {
        self.port.current.load(Ordering::SeqCst) == self.id
    }
}

/// A connection its server dropped before its reads ended (a frame that did not decode) is
/// over too; what it had read but not passed on goes back to the handshake.
impl Drop for Connection {
    fn drop(&mut self) {
        let carry = std::mem::take(&mut self.pending);
        self.end(carry);
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.ended {
                return Poll::Ready(Ok(()));
            }
            match me.gate.next(&me.pending) {
                Gate::Pass(n) if n > 0 => {
                    let n = n.min(out.remaining());
                    out.put_slice(&me.pending[..n]);
                    me.pending.drain(..n);
                    me.gate.passed(n);
                    return Poll::Ready(Ok(()));
                }
                Gate::Resync => {
                    let carry = std::mem::take(&mut me.pending);
                    me.end(carry);
                    return Poll::Ready(Ok(()));
                }
                Gate::Pass(_) | Gate::NeedMore => {}
            }
            let mut buf = [0u8; 16 * 1024];
            match ready!(me.port.poll_read_raw(cx, &mut buf)) {
                Ok(Read::Data(n)) => me.pending.extend_from_slice(&buf[..n]),
                Ok(Read::NoHost) => {
                    me.end(Vec::new());
                    return Poll::Ready(Ok(()));
                }
                Err(e) => {
                    me.end(Vec::new());
                    return Poll::Ready(Err(e));
                }
            }
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if !self.is_current() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        self.port.poll_write_raw(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Serves connections on the port one after the other, for ever: each is handed to `serve`
/// on a task of its own, and the next handshake starts as soon as its reads have ended (the
/// port is read by one of them at a time; the old connection's operations may still be
/// winding down, but whatever they write is refused).
pub async fn serve_forever<F, Fut>(port: Arc<Port>, serve: F) -> io::Error
where
    F: Fn(Connection) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let conn = match port.accept().await {
            Ok(conn) => conn,
            Err(e) => return e,
        };
        tokio::spawn(serve(conn));
        port.ended.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut v = (payload.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn frames_pass_whole_and_a_marker_at_a_boundary_ends_the_connection() {
        let mut gate = FrameGate::default();
        let nonce = "0123456789abcdef0123456789abcdef";
        let mut input = frame(b"hello");
        // A marker inside a frame's payload is payload.
        input.extend(frame(sync::sync_line(nonce).as_bytes()));
        input.extend(sync::sync_line(nonce).as_bytes());
        let mut passed = 0;
        loop {
            match gate.next(&input[passed..]) {
                Gate::Pass(n) => {
                    let n = n.min(3);
                    gate.passed(n);
                    passed += n;
                }
                Gate::Resync => break,
                Gate::NeedMore => panic!("stalled at {passed}"),
            }
        }
        assert_eq!(passed, 9 + 4 + sync::sync_line(nonce).len());
    }

    #[test]
    fn a_partial_length_waits_and_an_oversized_one_passes_to_the_codec() {
        let mut gate = FrameGate::default();
        assert_eq!(gate.next(&[0, 0]), Gate::NeedMore);
        assert_eq!(gate.next(&[]), Gate::NeedMore);
        // 0x00ffffff is no marker but more than a frame may be: the codec refuses it.
        assert_eq!(gate.next(&[0, 0xff, 0xff, 0xff, 1]), Gate::Pass(5));
        gate.passed(5);
        assert_eq!(gate.remaining, 4 + MAX_FRAME_BYTES + 1 - 5);
    }
}
