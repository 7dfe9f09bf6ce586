//! The daemon's end of an agent's unix socket, watched by the reactor for reading only.
//!
//! Tokio's `UnixStream` asks epoll for write readiness as well, and the kernel signals write
//! space every time the peer reads: each time the agent took a request off the socket, the
//! daemon's reactor woke for an event nobody waited on (once per exec, a thread woken and put
//! back to sleep). Here a write goes straight to the socket; only a write that finds it full
//! watches a second descriptor of it for write space, until that write went out. (The agent's
//! end stays a tokio stream: it sends the bulk of downloads, and watching for room anew at
//! each full socket cost a quarter of the download rate in a measured A/B.)
// By hand because neither tokio nor mio registers a stream for one direction only.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustix::io::Errno;
use rustix::net::{SendFlags, Shutdown};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// Connects to the agent's socket at `path`.
pub(crate) async fn connect(path: &Path) -> io::Result<(ReadHalf, WriteHalf)> {
    let stream = tokio::net::UnixStream::connect(path).await?;
    split(taken_back(stream)?)
}

/// The stream's descriptor, deregistered from tokio's reactor, still non-blocking.
fn taken_back(stream: tokio::net::UnixStream) -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(stream.into_std()?))
}

/// Splits a connected, non-blocking stream socket into its halves.
fn split(fd: OwnedFd) -> io::Result<(ReadHalf, WriteHalf)> {
    let socket = Arc::new(watch(fd, Interest::READABLE)?);
    Ok((ReadHalf(socket.clone()), WriteHalf { socket, full: None }))
}

/// Registers `fd` with the reactor for `interest` alone.
fn watch(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` stays open, naming the same file, until the `AsyncFd` drops it.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(io::Error::from)
}

pub(crate) struct ReadHalf(Arc<AsyncFd<OwnedFd>>);

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            // SAFETY: `read` only writes into the room it is given; what it reports filled is
            // marked initialised below, nothing more.
            let room = unsafe { buf.unfilled_mut() };
            let read = guard.try_io(|fd| {
                rustix::io::read(fd.get_ref(), room)
                    .map(|(filled, _)| filled.len())
                    .map_err(io::Error::from)
            });
            match read {
                Ok(Ok(n)) => {
                    // SAFETY: the kernel wrote these `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

pub(crate) struct WriteHalf {
    socket: Arc<AsyncFd<OwnedFd>>,
    /// A second descriptor of the socket watched for write space while a write waits for it.
    full: Option<AsyncFd<OwnedFd>>,
}

impl WriteHalf {
    fn send(&self, data: &[u8]) -> io::Result<usize> {
        loop {
            // NOSIGNAL: an agent gone mid-write is an error here, not a SIGPIPE.
            match rustix::net::send(self.socket.get_ref(), data, SendFlags::NOSIGNAL) {
                Err(Errno::INTR) => continue,
                sent => return sent.map_err(io::Error::from),
            }
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            match self.send(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => {
                    self.full = None;
                    return Poll::Ready(done);
                }
            }
            if self.full.is_none() {
                let dup = self.socket.get_ref().try_clone()?;
                self.full = Some(watch(dup, Interest::WRITABLE)?);
            }
            let this = &*self;
            let Some(full) = &this.full else { continue };
            let mut guard = ready!(full.poll_write_ready(cx))?;
            // A send that finds it full again clears the readiness, and the loop waits anew.
            if let Ok(done) = guard.try_io(|_| this.send(data)) {
                drop(guard);
                self.full = None;
                return Poll::Ready(done);
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(shutdown_write(&self.socket))
    }
}

impl Drop for WriteHalf {
    /// The agent reads the end of what the daemon sends, as from tokio's own write half.
    fn drop(&mut self) {
        let _ = shutdown_write(&self.socket);
    }
}

fn shutdown_write(socket: &AsyncFd<OwnedFd>) -> io::Result<()> {
    match rustix::net::shutdown(socket.get_ref(), Shutdown::Write) {
        // The peer is already gone: nothing left to end.
        Err(Errno::NOTCONN) => Ok(()),
        done => done.map_err(io::Error::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pair() -> ((ReadHalf, WriteHalf), tokio::net::UnixStream) {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        theirs.set_nonblocking(true).unwrap();
        (
            split(OwnedFd::from(ours)).unwrap(),
            tokio::net::UnixStream::from_std(theirs).unwrap(),
        )
    }

    #[tokio::test]
    async fn bytes_cross_both_ways() {
        let ((mut r, mut w), mut peer) = pair();
        w.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        peer.write_all(b"pong").await.unwrap();
        r.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
    }

    #[tokio::test]
    async fn a_write_larger_than_the_socket_holds_waits_for_room_and_arrives_whole() {
        let ((_r, mut w), mut peer) = pair();
        let data: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let expected = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&data).await.unwrap();
            assert!(w.full.is_none(), "the write-space watch outlived the write");
        });
        // Read only once the writer found the socket full.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut got = vec![0u8; expected.len()];
        peer.read_exact(&mut got).await.unwrap();
        writer.await.unwrap();
        assert!(got == expected, "the bytes differ");
    }

    #[tokio::test]
    async fn dropping_the_writer_ends_what_the_peer_reads_and_a_gone_peer_ends_reads() {
        let ((mut r, w), mut peer) = pair();
        drop(w);
        let mut buf = [0u8; 8];
        assert_eq!(peer.read(&mut buf).await.unwrap(), 0);
        drop(peer);
        assert_eq!(r.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_write_to_a_gone_peer_fails_without_a_signal() {
        let ((_r, mut w), peer) = pair();
        drop(peer);
        let err = w.write_all(b"late").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
