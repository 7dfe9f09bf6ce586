//! The host side of virtio-vsock in the convention Firecracker uses (Firecracker guests only):
//! the VMM listens on a unix socket; a host process connects, writes `CONNECT <port>\n` and,
//! once the guest accepted, reads `OK <host port>\n`. After that the socket is the stream.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The acknowledgement is a short line; anything longer is not the convention.
const MAX_ACK: usize = 64;

/// Connects to guest `port` through the VMM's socket at `uds`. Fails fast when nothing in the
/// guest listens yet (the VMM closes the connection), so callers retry until the boot deadline.
pub async fn connect(uds: &Path, port: u32) -> std::io::Result<UnixStream> {
    let mut stream = UnixStream::connect(uds).await?;
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await?;
    let ack = tokio::time::timeout(Duration::from_secs(5), read_line(&mut stream))
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "no vsock acknowledgement")
        })??;
    parse_ack(&ack)?;
    Ok(stream)
}

/// Reads up to and including `\n`, one byte at a time: whatever follows belongs to the agent.
async fn read_line(stream: &mut UnixStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    loop {
        let b = stream.read_u8().await?;
        if b == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        if line.len() >= MAX_ACK {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "vsock acknowledgement too long",
            ));
        }
        line.push(b);
    }
}

fn parse_ack(line: &str) -> std::io::Result<u32> {
    line.strip_prefix("OK ")
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("vsock connect refused: {line:?}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    #[test]
    fn acknowledgements() {
        assert_eq!(parse_ack("OK 1073741824").unwrap(), 1073741824);
        for bad in ["", "OK", "OK x", "NO 5", "ok 5"] {
            assert!(parse_ack(bad).is_err(), "{bad:?}");
        }
    }

    /// A stand-in VMM socket: answers the handshake, then echoes; the bytes after the
    /// acknowledgement must reach the caller untouched.
    #[tokio::test]
    async fn handshake_then_stream() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 13];
            s.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"CONNECT 1024\n");
            s.write_all(b"OK 77\nhello").await.unwrap();
        });
        let mut s = connect(&path, 1024).await.unwrap();
        let mut rest = [0u8; 5];
        s.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"hello");
    }

    #[tokio::test]
    async fn refused_when_guest_is_not_listening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            drop(s);
        });
        assert!(connect(&path, 1024).await.is_err());
    }
}
