//! The host end of the agent channel on a virtio-serial port (QEMU): a unix socket QEMU
//! listens on, one byte stream into the guest for as long as the guest lives. Every connection
//! starts with the handshake of [`koder_agent_protocol::init::sync`]: a fresh random nonce
//! goes in, and everything coming out is discarded until that nonce comes back, so bytes an
//! earlier connection left in the port (a half-sent frame of a daemon that was killed, or of a
//! VM saved to a file) never reach the new codec.
//!
//! What comes out of the guest is hostile: the discarding is bounded, and callers put a
//! deadline on the whole connect.

use std::io::{self, Read};
use std::path::Path;

use koder_agent_protocol::init::sync::{self, LineScanner};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;

/// Most a guest may send before its answer (stale frames of an earlier connection are at most
/// a few frames of 1 MiB).
const MAX_DISCARD: usize = 8 << 20;

/// The agent's stream after the handshake: what was read past the answer, then the socket.
pub type AgentReader = tokio::io::Chain<io::Cursor<Vec<u8>>, tokio::net::unix::OwnedReadHalf>;

/// Connects to the port's socket and resynchronises with the guest agent. Unbounded in time:
/// the caller bounds it (a guest whose agent is not serving yet never answers).
pub async fn connect(socket: &Path) -> io::Result<(AgentReader, OwnedWriteHalf)> {
    let mut stream = UnixStream::connect(socket).await?;
    let nonce = fresh_nonce()?;
    stream.write_all(sync::sync_line(&nonce).as_bytes()).await?;
    let (mut r, w) = stream.into_split();
    let rest = await_answer(&mut r, &nonce).await?;
    Ok((AsyncReadExt::chain(io::Cursor::new(rest), r), w))
}

/// Reads until `READY <nonce>`; returns what followed it.
async fn await_answer<R: AsyncRead + Unpin>(r: &mut R, nonce: &str) -> io::Result<Vec<u8>> {
    let mut scanner = LineScanner::new(sync::READY);
    let mut buf = vec![0u8; 64 * 1024];
    let mut discarded = 0usize;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the VMM closed the agent channel",
            ));
        }
        let mut chunk = &buf[..n];
        while let Some((answer, used)) = scanner.feed(chunk) {
            chunk = &chunk[used..];
            // An answer to an earlier connection's nonce is stale like the rest.
            if answer == nonce {
                return Ok(chunk.to_vec());
            }
        }
        discarded += n;
        if discarded > MAX_DISCARD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the guest sent too much before answering the handshake",
            ));
        }
    }
}

fn fresh_nonce() -> io::Result<String> {
    let mut bytes = [0u8; sync::NONCE_LEN / 2];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    /// A stand-in guest: stale bytes (a half frame, a stale answer, garbage lines), then the
    /// answer to this connection's nonce and a frame, which must arrive untouched.
    #[tokio::test]
    async fn stale_bytes_and_answers_are_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let guest = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(&[0, 0, 0, 200, 1, 2, 3]).await.unwrap();
            s.write_all(sync::ready_line(&"0".repeat(32)).as_bytes())
                .await
                .unwrap();
            s.write_all(&vec![b'z'; 100_000]).await.unwrap();
            let mut scanner = LineScanner::new(sync::SYNC);
            let mut buf = [0u8; 256];
            let nonce = loop {
                let n = s.read(&mut buf).await.unwrap();
                if let Some((nonce, _)) = scanner.feed(&buf[..n]) {
                    break nonce;
                }
            };
            let mut answer = sync::ready_line(&nonce).into_bytes();
            answer.extend([0, 0, 0, 2, 7, 7]);
            s.write_all(&answer).await.unwrap();
            s
        });
        let (mut r, _w) = connect(&path).await.unwrap();
        let mut frame = [0u8; 6];
        r.read_exact(&mut frame).await.unwrap();
        assert_eq!(frame, [0, 0, 0, 2, 7, 7]);
        drop(guest.await.unwrap());
    }

    #[tokio::test]
    async fn a_guest_that_never_answers_is_cut_off() {
        let (mut host, mut guest) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let junk = vec![b'\n'; 1 << 16];
            while guest.write_all(&junk).await.is_ok() {}
        });
        let err = await_answer(&mut host, &"1".repeat(32)).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let (mut host, guest) = tokio::io::duplex(64);
        drop(guest);
        let err = await_answer(&mut host, &"1".repeat(32)).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
