//! A `std::io::Write` front for [`Blobs::put`](crate::Blobs::put), for producers that run on a
//! blocking thread (an archive writer in `spawn_blocking`).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::Stream;
use tokio::sync::mpsc;

/// Chunks handed to the upload; small writes (tar's 512-byte blocks) are gathered to this size.
const CHUNK: usize = 1 << 20;
/// Chunks queued between the producer and the upload: with [`CHUNK`], the writer holds at most
/// ~5 MiB whatever the producer does.
const QUEUE: usize = 4;

type Item = Result<Bytes, io::Error>;

/// The producer's end. Every `write` may block while the upload catches up, so use it only
/// off the async runtime (`spawn_blocking`, a plain thread): `blocking_send` panics inside
/// an async context.
///
/// Call [`BlobWriter::finish`] when the content is complete. Dropping the writer without it
/// (the producer failed or panicked) makes the upload fail, so a truncated object is never
/// stored.
pub struct BlobWriter {
    tx: mpsc::Sender<Item>,
    buf: BytesMut,
    finished: Arc<AtomicBool>,
}

impl BlobWriter {
    /// Sends what is buffered and marks the content complete; the upload future then
    /// finishes the object and tells its size and sha256.
    pub fn finish(mut self) -> io::Result<()> {
        io::Write::flush(&mut self)?;
        self.finished.store(true, Ordering::Release);
        Ok(())
    }

    fn send_buffered(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.tx.blocking_send(Ok(chunk)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the blob upload stopped (its future failed or was dropped)",
            )
        })
    }
}

impl io::Write for BlobWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.send_buffered()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buffered()
    }
}

/// A writer and the body stream it feeds; the stream ends with an error unless the writer
/// was finished.
pub(crate) fn channel() -> (BlobWriter, impl Stream<Item = Item> + Send + 'static) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let finished = Arc::new(AtomicBool::new(false));
    let writer = BlobWriter {
        tx,
        buf: BytesMut::with_capacity(CHUNK),
        finished: Arc::clone(&finished),
    };
    let body = futures::stream::unfold(Some(rx), move |rx| {
        let finished = Arc::clone(&finished);
        async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(item) => Some((item, Some(rx))),
                // Every sender is gone: `finish` stored the flag before dropping its sender.
                None if finished.load(Ordering::Acquire) => None,
                None => Some((
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the blob writer was dropped without finish()",
                    )),
                    None,
                )),
            }
        }
    });
    (writer, body)
}
