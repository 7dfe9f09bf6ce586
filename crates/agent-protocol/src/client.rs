//! Host-side client of one agent connection.
//!
//! One reader task demultiplexes frames to per-stream channels and one writer task serialises
//! outgoing frames, so any number of operations can run at once over one socket. Everything the
//! agent says is untrusted: frames are size-bounded by the codec, unknown stream ids are dropped,
//! and collected output is re-bounded here whatever the agent claims.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

use crate::codec::{CodecError, FrameCodec};
use crate::messages::*;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("agent connection closed")]
    Disconnected,
    /// The agent did not answer within [`REQUEST_DEADLINE`] (it may be wedged or starved).
    #[error("the sandbox agent did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("agent protocol violation: {0}")]
    Protocol(String),
    #[error(transparent)]
    Codec(#[from] CodecError),
}

type Result<T> = std::result::Result<T, ClientError>;

/// Frames a stream may have queued before the connection reader waits for its consumer.
const STREAM_QUEUE: usize = 32;

/// How long a one-shot request (health, file operations, usage...) may wait for its answer.
pub const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

struct Shared {
    next_stream: AtomicU64,
    streams: Mutex<HashMap<u64, mpsc::Sender<FromAgent>>>,
    outgoing: mpsc::Sender<Frame<ToAgent>>,
    /// Cancelled, under the `streams` lock, once either direction of the connection ends: a
    /// stream opened afterwards would wait for an answer no reader will ever deliver.
    closed: CancellationToken,
}

impl Shared {
    fn close(&self) {
        let mut streams = self.streams.lock();
        self.closed.cancel();
        streams.clear();
    }
}

/// A cheap-to-clone handle on one agent connection.
#[derive(Clone)]
pub struct AgentClient {
    shared: Arc<Shared>,
}

impl AgentClient {
    pub async fn connect_unix(path: &Path) -> Result<Self> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(CodecError::Io)?;
        let (r, w) = stream.into_split();
        Ok(Self::new(r, w))
    }

    /// Wraps any byte transport (unix socket, vsock, in-memory pipe in tests).
    pub fn new<R, W>(reader: R, writer: W) -> Self
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (outgoing, mut out_rx) = mpsc::channel::<Frame<ToAgent>>(64);
        let shared = Arc::new(Shared {
            next_stream: AtomicU64::new(1),
            streams: Mutex::new(HashMap::new()),
            outgoing,
            closed: CancellationToken::new(),
        });
        let mut sink = FramedWrite::new(writer, FrameCodec::<FromAgent, ToAgent>::default());
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            while let Some(frame) = out_rx.recv().await {
                if let Err(e) = sink.send(frame).await {
                    tracing::debug!(error = %e, "agent connection write failed");
                    break;
                }
            }
            if let Some(shared) = weak.upgrade() {
                shared.close();
            }
        });
        let weak = Arc::downgrade(&shared);
        let mut frames = FramedRead::new(reader, FrameCodec::<FromAgent, ToAgent>::default());
        tokio::spawn(async move {
            while let Some(frame) = frames.next().await {
                let frame = match frame {
                    Ok(f) => f,
                    Err(CodecError::Io(e)) => {
                        tracing::debug!(error = %e, "agent connection closed");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "agent sent a bad frame; closing connection");
                        break;
                    }
                };
                let Some(shared) = weak.upgrade() else { break };
                let tx = shared.streams.lock().get(&frame.stream).cloned();
                drop(shared);
                if let Some(tx) = tx {
                    // A consumer that went away is not an error: its stream is being dropped.
                    let _ = tx.send(frame.msg).await;
                }
            }
            if let Some(shared) = weak.upgrade() {
                shared.close();
            }
        });
        Self { shared }
    }

    /// Whether the connection has ended (the agent exited or broke the protocol).
    pub fn is_closed(&self) -> bool {
        self.shared.closed.is_cancelled()
    }

    /// Resolves once the connection has ended; holds no reference to the connection.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.shared.closed.clone().cancelled_owned()
    }

    /// Opens a new stream and sends its first message.
    pub async fn open(&self, first: ToAgent) -> Result<AgentStream> {
        let id = self.shared.next_stream.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        {
            let mut streams = self.shared.streams.lock();
            if self.shared.closed.is_cancelled() {
                return Err(ClientError::Disconnected);
            }
            streams.insert(id, tx);
        }
        let stream = AgentStream {
            id,
            client: self.clone(),
            rx,
            finished: false,
        };
        stream.send(first).await?;
        Ok(stream)
    }

    pub async fn health(&self) -> Result<HealthInfo> {
        let mut s = self.open(ToAgent::Health).await?;
        match s.recv_final().await? {
            FromAgent::Health(h) => Ok(h),
            other => Err(unexpected(&other)),
        }
    }

    /// Starts an exec and returns its event stream.
    pub async fn exec(&self, req: ExecRequest) -> Result<AgentStream> {
        self.open(ToAgent::Exec(req)).await
    }

    /// Runs an exec to completion, keeping at most `output_limit_bytes` per stream.
    pub async fn exec_collect(&self, req: ExecRequest) -> Result<ExecOutput> {
        let limit = usize::try_from(req.output_limit_bytes).unwrap_or(usize::MAX);
        let mut s = self.exec(req).await?;
        let mut out = ExecOutput::default();
        loop {
            match s.recv().await? {
                FromAgent::Started { pid } => out.pid = Some(pid),
                FromAgent::Stdout(d) => {
                    out.stdout_truncated |= append_bounded(&mut out.stdout, &d, limit)
                }
                FromAgent::Stderr(d) => {
                    out.stderr_truncated |= append_bounded(&mut out.stderr, &d, limit)
                }
                FromAgent::Exited(exit) => {
                    s.finished = true;
                    out.stdout_truncated |= exit.stdout_truncated;
                    out.stderr_truncated |= exit.stderr_truncated;
                    out.exit = exit;
                    return Ok(out);
                }
                other => return Err(unexpected(&other)),
            }
        }
    }

    /// Opens a file for streaming; chunks come from [`FileReader::next_chunk`].
    pub async fn open_read(&self, path: &str, max_bytes: u64) -> Result<FileReader> {
        let stream = self
            .open(ToAgent::ReadFile(ReadFileRequest {
                path: path.into(),
                max_bytes: Some(max_bytes),
            }))
            .await?;
        let mut reader = FileReader {
            stream,
            remaining: max_bytes,
            first: None,
        };
        // The first message tells whether the open worked, so errors surface here and a caller
        // can still choose its response status.
        reader.first = Some(
            tokio::time::timeout(REQUEST_DEADLINE, reader.recv_chunk())
                .await
                .map_err(|_| ClientError::Timeout(REQUEST_DEADLINE))??,
        );
        Ok(reader)
    }

    /// Reads a whole file, refusing files over `max_bytes`.
    pub async fn read_file(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let mut reader = self.open_read(path, max_bytes).await?;
        let mut data = Vec::new();
        while let Some(chunk) = reader.next_chunk().await? {
            data.extend_from_slice(&chunk);
        }
        Ok(data)
    }

    /// Starts an atomic upload; feed it with [`FileWriter::write`] and commit with
    /// [`FileWriter::finish`]. Dropping the writer without finishing discards the upload.
    pub async fn write_file(&self, req: WriteFileRequest) -> Result<FileWriter> {
        Ok(FileWriter {
            stream: self.open(ToAgent::WriteFile(req)).await?,
        })
    }

    pub async fn list(&self, path: &str, depth: u32) -> Result<(Vec<Entry>, bool)> {
        let mut s = self
            .open(ToAgent::List {
                path: path.into(),
                depth,
            })
            .await?;
        match s.recv_final().await? {
            FromAgent::Entries { entries, truncated } => Ok((entries, truncated)),
            other => Err(unexpected(&other)),
        }
    }

    /// (total, used) bytes of the sandbox's writable filesystem.
    pub async fn disk_usage(&self) -> Result<(u64, u64)> {
        let mut s = self.open(ToAgent::DiskUsage).await?;
        match s.recv_final().await? {
            FromAgent::DiskUsage {
                total_bytes,
                used_bytes,
            } => Ok((total_bytes, used_bytes)),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn stat(&self, path: &str) -> Result<Entry> {
        self.entry_op(ToAgent::Stat { path: path.into() }).await
    }

    pub async fn make_dir(&self, path: &str, owner: Option<(u32, u32)>) -> Result<Entry> {
        self.entry_op(ToAgent::MakeDir {
            path: path.into(),
            owner,
        })
        .await
    }

    pub async fn rename(&self, from: &str, to: &str) -> Result<Entry> {
        self.entry_op(ToAgent::Move {
            from: from.into(),
            to: to.into(),
        })
        .await
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let mut s = self
            .open(ToAgent::Remove {
                path: path.into(),
                recursive,
            })
            .await?;
        match s.recv_final().await? {
            FromAgent::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// MicroVM guests: applies limits to the guest's sandbox cgroup.
    pub async fn guest_limits(&self, limits: GuestLimits) -> Result<()> {
        self.done_op(ToAgent::GuestLimits(limits)).await
    }

    /// MicroVM guests: freezes or thaws every sandbox process.
    pub async fn guest_freeze(&self, frozen: bool) -> Result<()> {
        self.done_op(ToAgent::GuestFreeze(frozen)).await
    }

    pub async fn guest_usage(&self) -> Result<GuestUsage> {
        let mut s = self.open(ToAgent::GuestUsage).await?;
        match s.recv_final().await? {
            FromAgent::GuestUsage(u) => Ok(u),
            other => Err(unexpected(&other)),
        }
    }

    /// Kills every process in the sandbox except the agent; returns how many were signalled.
    pub async fn kill_all(&self) -> Result<u32> {
        let mut s = self.open(ToAgent::KillAll).await?;
        match s.recv_final().await? {
            FromAgent::KilledAll { processes } => Ok(processes),
            other => Err(unexpected(&other)),
        }
    }

    /// Starts streaming the sandbox's writable layer as a tar (see [`ToAgent::CaptureLayer`]).
    pub async fn capture_layer(&self, max_bytes: u64, max_entries: u64) -> Result<LayerCapture> {
        let stream = self
            .open(ToAgent::CaptureLayer {
                max_bytes,
                max_entries,
            })
            .await?;
        Ok(LayerCapture {
            stream,
            // Headers and PAX records come on top of file content; whatever the agent claims,
            // it cannot send more than this.
            remaining: max_bytes.saturating_add(max_entries.saturating_mul(LAYER_ENTRY_OVERHEAD)),
            end: None,
        })
    }

    async fn done_op(&self, msg: ToAgent) -> Result<()> {
        let mut s = self.open(msg).await?;
        match s.recv_final().await? {
            FromAgent::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    async fn entry_op(&self, msg: ToAgent) -> Result<Entry> {
        let mut s = self.open(msg).await?;
        match s.recv_final().await? {
            FromAgent::Entry(e) => Ok(e),
            other => Err(unexpected(&other)),
        }
    }
}

/// The collected result of [`AgentClient::exec_collect`].
#[derive(Debug, Default, Clone)]
pub struct ExecOutput {
    pub pid: Option<u32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub exit: ExitInfo,
}

/// One operation's view of the connection. Dropping an unfinished stream cancels the operation.
pub struct AgentStream {
    id: u64,
    client: AgentClient,
    rx: mpsc::Receiver<FromAgent>,
    finished: bool,
}

impl AgentStream {
    pub async fn send(&self, msg: ToAgent) -> Result<()> {
        self.handle().send(msg).await
    }

    /// A cloneable sender into this stream (stdin, signals), usable while another task
    /// receives.
    pub fn handle(&self) -> StreamHandle {
        StreamHandle {
            id: self.id,
            outgoing: self.client.shared.outgoing.clone(),
        }
    }

    /// The next message; an agent-side error becomes `Err(ClientError::Agent)`.
    pub async fn recv(&mut self) -> Result<FromAgent> {
        match self.rx.recv().await {
            Some(FromAgent::Error(e)) => {
                self.finished = true;
                Err(ClientError::Agent(e))
            }
            Some(FromAgent::Exited(e)) => {
                self.finished = true;
                Ok(FromAgent::Exited(e))
            }
            Some(m) => Ok(m),
            None => Err(ClientError::Disconnected),
        }
    }

    /// Receives the single answer of a one-shot request, waiting at most [`REQUEST_DEADLINE`].
    async fn recv_final(&mut self) -> Result<FromAgent> {
        let m = tokio::time::timeout(REQUEST_DEADLINE, self.recv())
            .await
            .map_err(|_| ClientError::Timeout(REQUEST_DEADLINE))??;
        self.finished = true;
        Ok(m)
    }

    /// Marks the operation as complete so dropping the stream does not cancel it.
    pub fn mark_finished(&mut self) {
        self.finished = true;
    }
}

impl Drop for AgentStream {
    fn drop(&mut self) {
        self.client.shared.streams.lock().remove(&self.id);
        if self.finished {
            return;
        }
        let cancel = Frame {
            stream: self.id,
            msg: ToAgent::Cancel,
        };
        // A full queue must not lose the cancel (the agent would keep the operation open
        // until the connection ends), so it then goes out from a task.
        if let Err(mpsc::error::TrySendError::Full(cancel)) =
            self.client.shared.outgoing.try_send(cancel)
        {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                let outgoing = self.client.shared.outgoing.clone();
                handle.spawn(async move {
                    let _ = outgoing.send(cancel).await;
                });
            }
        }
    }
}

/// A file being read; `None` from [`FileReader::next_chunk`] is the end.
pub struct FileReader {
    stream: AgentStream,
    remaining: u64,
    first: Option<Option<Vec<u8>>>,
}

impl FileReader {
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        match self.first.take() {
            Some(first) => Ok(first),
            None => self.recv_chunk().await,
        }
    }

    async fn recv_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        if self.stream.finished {
            return Ok(None);
        }
        match self.stream.recv().await? {
            FromAgent::FileChunk(c) => {
                self.remaining = self.remaining.checked_sub(c.len() as u64).ok_or_else(|| {
                    ClientError::Protocol("file exceeds its announced bound".into())
                })?;
                Ok(Some(c))
            }
            FromAgent::FileEnd => {
                self.stream.finished = true;
                Ok(None)
            }
            other => Err(unexpected(&other)),
        }
    }
}

/// Archive bytes allowed per entry beyond file content: tar headers, long names, PAX xattrs.
const LAYER_ENTRY_OVERHEAD: u64 = 16 * 1024;

/// A layer capture in progress; `None` from [`LayerCapture::next_chunk`] is the end, after
/// which [`LayerCapture::end`] has the agent's (entries, bytes).
pub struct LayerCapture {
    stream: AgentStream,
    remaining: u64,
    end: Option<(u64, u64)>,
}

impl LayerCapture {
    /// Each chunk must come within the request deadline: a stalled agent fails the capture
    /// instead of holding the sandbox frozen.
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        if self.stream.finished {
            return Ok(None);
        }
        let msg = tokio::time::timeout(REQUEST_DEADLINE, self.stream.recv())
            .await
            .map_err(|_| ClientError::Timeout(REQUEST_DEADLINE))??;
        match msg {
            FromAgent::FileChunk(c) => {
                self.remaining = self.remaining.checked_sub(c.len() as u64).ok_or_else(|| {
                    ClientError::Protocol("layer exceeds its announced bound".into())
                })?;
                Ok(Some(c))
            }
            FromAgent::LayerEnd { entries, bytes } => {
                self.stream.finished = true;
                self.end = Some((entries, bytes));
                Ok(None)
            }
            other => Err(unexpected(&other)),
        }
    }

    pub fn end(&self) -> Option<(u64, u64)> {
        self.end
    }
}

/// Splices a byte stream with an agent relay stream (`Connect`, `EgressAttach`): what `io`
/// reads goes to the agent as `Stdin`, the agent's `Stdout` is written to `io`; each side's
/// end is passed on as a half-close.
pub async fn relay<S>(io: S, mut stream: AgentStream)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let to_agent = stream.handle();
    let (mut r, mut w) = tokio::io::split(io);
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut reading = true;
    loop {
        tokio::select! {
            n = r.read(&mut buf), if reading => match n {
                Ok(n) if n > 0 => {
                    if to_agent.send(ToAgent::Stdin(buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
                _ => {
                    reading = false;
                    let _ = to_agent.send(ToAgent::CloseStdin).await;
                }
            },
            msg = stream.recv() => match msg {
                Ok(FromAgent::Stdout(data)) => {
                    if w.write_all(&data).await.is_err() {
                        return;
                    }
                }
                Ok(FromAgent::Closed) | Err(_) => {
                    stream.mark_finished();
                    let _ = w.shutdown().await;
                    return;
                }
                Ok(_) => {}
            }
        }
    }
}

/// Sends follow-up messages on a stream someone else is reading.
#[derive(Clone)]
pub struct StreamHandle {
    id: u64,
    outgoing: mpsc::Sender<Frame<ToAgent>>,
}

impl StreamHandle {
    pub async fn send(&self, msg: ToAgent) -> Result<()> {
        self.outgoing
            .send(Frame {
                stream: self.id,
                msg,
            })
            .await
            .map_err(|_| ClientError::Disconnected)
    }
}

/// An upload in progress.
pub struct FileWriter {
    stream: AgentStream,
}

impl FileWriter {
    /// Sends `data` in protocol-sized chunks. Fails early if the agent already refused the upload
    /// (quota, size limit, bad path).
    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        for chunk in data.chunks(CHUNK_BYTES) {
            if let Ok(msg) = self.stream.rx.try_recv() {
                return Err(match msg {
                    FromAgent::Error(e) => {
                        self.stream.finished = true;
                        ClientError::Agent(e)
                    }
                    other => unexpected(&other),
                });
            }
            self.stream.send(ToAgent::FileChunk(chunk.to_vec())).await?;
        }
        Ok(())
    }

    /// Commits the upload and returns the new file's entry.
    pub async fn finish(mut self) -> Result<Entry> {
        self.stream.send(ToAgent::FileEnd).await?;
        match self.stream.recv_final().await? {
            FromAgent::Entry(e) => Ok(e),
            other => Err(unexpected(&other)),
        }
    }
}

fn append_bounded(buf: &mut Vec<u8>, data: &[u8], limit: usize) -> bool {
    let room = limit.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
    data.len() > room
}

fn unexpected(msg: &FromAgent) -> ClientError {
    let name = format!("{msg:?}");
    let name: String = name.chars().take(60).collect();
    ClientError::Protocol(format!("unexpected message {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose agent end is handed to the test.
    fn pair() -> (AgentClient, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let (r, w) = tokio::io::split(ours);
        (AgentClient::new(r, w), theirs)
    }

    #[tokio::test]
    async fn a_closed_connection_fails_pending_and_later_operations_at_once() {
        let (client, agent) = pair();
        let pending = tokio::spawn({
            let client = client.clone();
            async move { client.health().await }
        });
        tokio::task::yield_now().await;
        drop(agent);
        client.closed().await;
        assert!(client.is_closed());
        assert!(matches!(
            pending.await.unwrap(),
            Err(ClientError::Disconnected)
        ));
        // Every kind of later operation, not only the one that was waiting.
        assert!(matches!(
            client.health().await,
            Err(ClientError::Disconnected)
        ));
        assert!(matches!(
            client.stat("/").await,
            Err(ClientError::Disconnected)
        ));
        assert!(matches!(
            client.open(ToAgent::ListeningPorts).await,
            Err(ClientError::Disconnected)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_agent_answers_one_shot_requests_with_a_timeout() {
        // The agent end stays open and reads nothing back: a wedged agent.
        let (client, _agent) = pair();
        let started = tokio::time::Instant::now();
        assert!(matches!(
            client.disk_usage().await,
            Err(ClientError::Timeout(_))
        ));
        assert!(started.elapsed() >= REQUEST_DEADLINE);
        assert!(matches!(
            client.open_read("/f", 1).await,
            Err(ClientError::Timeout(_))
        ));
        assert!(!client.is_closed());
    }
}
