//! `CaptureLayer`: the sandbox's writable layer streamed to the daemon as a tar, for snapshots,
//! durable pauses and forks. The daemon freezes the sandbox's processes around it; the agent
//! stays outside the frozen group and reads the upper directory through the descriptor it
//! opened before the root was built (no sandbox path reaches that directory).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use koder_agent_protocol::{AgentError, ErrorCode, FromAgent, CHUNK_BYTES};
use koder_layer::{LayerError, Limits};
use tokio::sync::mpsc;

use crate::outbox::Outbox;

/// Chunks in flight between the archiver thread and the connection.
const QUEUE: usize = 4;

pub async fn capture(upper: Option<Arc<OwnedFd>>, max_bytes: u64, max_entries: u64, out: Outbox) {
    let Some(upper) = upper else {
        let err = AgentError::new(
            ErrorCode::InvalidRequest,
            "this sandbox has no writable layer",
        );
        let _ = out.send(FromAgent::Error(err)).await;
        return;
    };
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(QUEUE);
    let limits = Limits {
        max_bytes,
        max_entries,
    };
    let archiver = tokio::task::spawn_blocking(move || {
        let mut writer = ChunkWriter {
            buf: Vec::with_capacity(CHUNK_BYTES),
            tx,
        };
        let stats = koder_layer::capture(upper.as_fd(), &mut writer, &limits)?;
        writer.flush().map_err(|e| LayerError::Io {
            context: "send layer".into(),
            source: e,
        })?;
        Ok::<_, LayerError>(stats)
    });
    while let Some(chunk) = rx.recv().await {
        // The daemon went away or cancelled: dropping `rx` makes the archiver's next write
        // fail, which ends it.
        if out.send(FromAgent::FileChunk(chunk)).await.is_err() {
            return;
        }
    }
    let msg = match archiver.await {
        Ok(Ok(stats)) => FromAgent::LayerEnd {
            entries: stats.entries,
            bytes: stats.bytes,
        },
        Ok(Err(e)) => FromAgent::Error(to_agent_error(&e)),
        Err(e) => FromAgent::Error(AgentError::new(
            ErrorCode::Io,
            format!("layer capture task: {e}"),
        )),
    };
    let _ = out.send(msg).await;
}

fn to_agent_error(e: &LayerError) -> AgentError {
    let code = if e.is_quota() {
        ErrorCode::TooLarge
    } else {
        ErrorCode::Io
    };
    AgentError::new(code, e.to_string())
}

/// Cuts the archive into protocol-sized chunks and hands them to the connection, blocking the
/// archiver while the daemon is slower (back-pressure instead of buffering a whole layer).
struct ChunkWriter {
    buf: Vec<u8>,
    tx: mpsc::Sender<Vec<u8>>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES));
        self.tx
            .blocking_send(chunk)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "daemon gone"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(CHUNK_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK_BYTES {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_bounded_and_nothing_is_lost() {
        let (tx, mut rx) = mpsc::channel(1024);
        let mut w = ChunkWriter {
            buf: Vec::new(),
            tx,
        };
        let data: Vec<u8> = (0..(CHUNK_BYTES * 2 + 17)).map(|i| i as u8).collect();
        w.write_all(&data).unwrap();
        w.flush().unwrap();
        drop(w);
        let mut got = Vec::new();
        while let Ok(c) = rx.try_recv() {
            assert!(c.len() <= CHUNK_BYTES && !c.is_empty());
            got.extend(c);
        }
        assert_eq!(got, data);
    }

    #[test]
    fn a_gone_daemon_fails_the_write() {
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let mut w = ChunkWriter {
            buf: Vec::new(),
            tx,
        };
        let err = w.write_all(&vec![0u8; CHUNK_BYTES]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
    }
}
