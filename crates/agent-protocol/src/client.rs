//! Host-side client of one agent connection.
//!
//! One reader task demultiplexes frames to per-stream queues and one writer task serialises
//! outgoing frames, so any number of operations can run at once over one socket. The reader never
//! waits for a stream's consumer: each stream has its own credit ([`crate::flow`]), so a consumer
//! that stops reading stalls only its stream and its queue stays within one window. Everything
//! the agent says is untrusted: frames are size-bounded by the codec, unknown stream ids are
//! dropped, a stream the agent floods beyond its credit ends with a protocol error, and collected
//! output is re-bounded here whatever the agent claims.

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
use crate::flow::{self, RecvWindow, SendCredit};
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

/// How long a one-shot request (health, file operations, usage...) may wait for its answer.
pub const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// What the reader delivers to one stream's consumer.
enum Delivery {
    Msg(FromAgent, u32),
    /// The agent sent beyond its credit; nothing more comes on this stream.
    Overrun,
}

/// The reader's end of one stream.
struct Route {
    /// Unbounded, but holds at most one window: [`RecvWindow::admit`] comes first.
    tx: mpsc::UnboundedSender<Delivery>,
    window: Arc<RecvWindow>,
    /// What this side may still send on the stream.
    credit: Arc<SendCredit>,
}

impl Drop for Route {
    fn drop(&mut self) {
        // Whoever waits to send on a stream that is gone stops waiting.
        self.credit.close();
    }
}

struct Shared {
    next_stream: AtomicU64,
    streams: Mutex<HashMap<u64, Route>>,
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

    /// Hands one frame to its stream without waiting: a credit is booked, a message queued
    /// within the stream's window, and a stream that overruns its window is ended.
    fn route(&self, frame: Frame<FromAgent>) {
        let cost = match frame.msg {
            FromAgent::Credit(units) => {
                if let Some(route) = self.streams.lock().get(&frame.stream) {
                    route.credit.grant(units);
                }
                return;
            }
            ref msg => flow::cost(msg),
        };
        let mut streams = self.streams.lock();
        let Some(route) = streams.get(&frame.stream) else {
            return; // a stream that ended here: late output nobody reads
        };
        if route.window.admit(cost).is_ok() {
            // The agent's last word on a stream: it grants no more credit, so a sender waiting
            // for some (an upload refused mid-way, stdin after the exit) must stop waiting.
            if matches!(frame.msg, FromAgent::Error(_) | FromAgent::Exited(_)) {
                route.credit.close();
            }
            // A consumer that went away is not an error: its stream is being dropped.
            let _ = route.tx.send(Delivery::Msg(frame.msg, cost));
        } else {
            tracing::warn!(
                stream = frame.stream,
                "agent sent beyond its credit; ending the stream"
            );
            let _ = route.tx.send(Delivery::Overrun);
            streams.remove(&frame.stream);
        }
    }

    /// Queues a frame that must not be lost (a cancel, a credit grant) without waiting: when
    /// the outgoing queue is full it goes out from a task.
    fn send_soon(&self, frame: Frame<ToAgent>) {
        if let Err(mpsc::error::TrySendError::Full(frame)) = self.outgoing.try_send(frame) {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                let outgoing = self.outgoing.clone();
                handle.spawn(async move {
                    let _ = outgoing.send(frame).await;
                });
            }
        }
    }
}

/// A cheap-to-clone handle on one agent connection.
#[derive(Clone)]
pub struct AgentClient {
    shared: Arc<Shared>,
}

impl AgentClient {
    /// Connects to an agent's unix socket (watched for reading only: [`crate::socket`]).
    pub async fn connect_unix(path: &Path) -> Result<Self> {
        let (r, w) = crate::socket::connect(path).await.map_err(CodecError::Io)?;
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
                shared.route(frame);
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
        let (tx, rx) = mpsc::unbounded_channel();
        let window = Arc::new(RecvWindow::default());
        let credit = Arc::new(SendCredit::default());
        {
            let mut streams = self.shared.streams.lock();
            if self.shared.closed.is_cancelled() {
                return Err(ClientError::Disconnected);
            }
            let route = Route {
                tx,
                window: window.clone(),
                credit: credit.clone(),
            };
            streams.insert(id, route);
        }
        let stream = AgentStream {
            id,
            client: self.clone(),
            rx,
            window,
            credit,
            finished: false,
        };
        // The opening message needs no credit.
        self.shared
            .outgoing
            .send(Frame {
                stream: id,
                msg: first,
            })
            .await
            .map_err(|_| ClientError::Disconnected)?;
        Ok(stream)
    }

    /// The agent's health; an agent speaking another protocol version is refused.
    pub async fn health(&self) -> Result<HealthInfo> {
        let mut s = self.open(ToAgent::Health).await?;
        match s.recv_final().await? {
            FromAgent::Health(h) if h.protocol_version == PROTOCOL_VERSION => Ok(h),
            FromAgent::Health(h) => Err(ClientError::Protocol(format!(
                "the agent speaks protocol version {}, this daemon {PROTOCOL_VERSION}",
                h.protocol_version
            ))),
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
        let mut s = self.exec(ExecRequest { quiet: true, ..req }).await?;
        let mut out = ExecOutput::default();
        loop {
            match s.recv().await? {
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
            chunk: Vec::new(),
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
    rx: mpsc::UnboundedReceiver<Delivery>,
    window: Arc<RecvWindow>,
    credit: Arc<SendCredit>,
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
            credit: self.credit.clone(),
        }
    }

    /// The next message; an agent-side error becomes `Err(ClientError::Agent)`. Cancel-safe.
    pub async fn recv(&mut self) -> Result<FromAgent> {
        let delivery = self.rx.recv().await;
        self.take(delivery)
    }

    /// A message already queued, if any.
    fn try_recv(&mut self) -> Option<Result<FromAgent>> {
        let delivery = self.rx.try_recv().ok()?;
        Some(self.take(Some(delivery)))
    }

    /// Accounts for a consumed delivery (granting credit back when due) and interprets it.
    fn take(&mut self, delivery: Option<Delivery>) -> Result<FromAgent> {
        let msg = match delivery {
            Some(Delivery::Msg(msg, cost)) => {
                if let Some(units) = self.window.consumed(cost) {
                    self.client.shared.send_soon(Frame {
                        stream: self.id,
                        msg: ToAgent::Credit(units),
                    });
                }
                msg
            }
            Some(Delivery::Overrun) => {
                return Err(ClientError::Protocol(
                    "the agent sent beyond its credit on this stream".into(),
                ))
            }
            None => return Err(ClientError::Disconnected),
        };
        match msg {
            FromAgent::Error(e) => {
                self.finished = true;
                Err(ClientError::Agent(e))
            }
            FromAgent::Exited(e) => {
                self.finished = true;
                Ok(FromAgent::Exited(e))
            }
            m => Ok(m),
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
        // Lost, the cancel would leave the agent's operation open until the connection ends.
        self.client.shared.send_soon(Frame {
            stream: self.id,
            msg: ToAgent::Cancel,
        });
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
    credit: Arc<SendCredit>,
}

impl StreamHandle {
    /// Sends `msg`, first waiting (on this stream alone) for the credit it costs.
    pub async fn send(&self, msg: ToAgent) -> Result<()> {
        let permit = if flow::is_exempt(&msg) {
            None
        } else {
            // A stream that ended here has no credit to wait for: what is sent then is late,
            // and the agent drops it.
            self.credit.reserve(flow::cost(&msg)).await.ok()
        };
        self.outgoing
            .send(Frame {
                stream: self.id,
                msg,
            })
            .await
            .map_err(|_| ClientError::Disconnected)?;
        if let Some(permit) = permit {
            permit.forget();
        }
        Ok(())
    }
}

/// An upload in progress. Bytes are gathered into chunks of [`FILE_CHUNK_BYTES`], whatever
/// sizes the caller writes.
pub struct FileWriter {
    stream: AgentStream,
    chunk: Vec<u8>,
}

impl FileWriter {
    /// Takes `data`, sending every chunk it fills. Fails early if the agent already refused the
    /// upload (quota, size limit, bad path).
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let take = data.len().min(FILE_CHUNK_BYTES - self.chunk.len());
            self.chunk.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.chunk.len() == FILE_CHUNK_BYTES {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if let Some(answer) = self.stream.try_recv() {
            return Err(match answer {
                Err(e) => e,
                Ok(other) => unexpected(&other),
            });
        }
        // Only an upload that filled a chunk gets a whole one reserved up front.
        let chunk = std::mem::replace(&mut self.chunk, Vec::with_capacity(FILE_CHUNK_BYTES));
        self.stream.send(ToAgent::FileChunk(chunk)).await
    }

    /// Commits the upload and returns the new file's entry.
    pub async fn finish(mut self) -> Result<Entry> {
        if !self.chunk.is_empty() {
            self.flush().await?;
        }
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

    /// The agent's end of a connection, played by the test.
    struct Peer {
        frames: FramedRead<
            tokio::io::ReadHalf<tokio::io::DuplexStream>,
            FrameCodec<ToAgent, FromAgent>,
        >,
        sink: FramedWrite<
            tokio::io::WriteHalf<tokio::io::DuplexStream>,
            FrameCodec<ToAgent, FromAgent>,
        >,
    }

    impl Peer {
        fn new(io: tokio::io::DuplexStream) -> Self {
            let (r, w) = tokio::io::split(io);
            Self {
                frames: FramedRead::new(r, FrameCodec::default()),
                sink: FramedWrite::new(w, FrameCodec::default()),
            }
        }

        async fn next(&mut self) -> Frame<ToAgent> {
            let wait = std::time::Duration::from_secs(10);
            let frame = tokio::time::timeout(wait, self.frames.next()).await;
            frame.expect("no frame from the client").unwrap().unwrap()
        }

        /// The next frame that is not a credit grant.
        async fn next_request(&mut self) -> Frame<ToAgent> {
            loop {
                let frame = self.next().await;
                if !matches!(frame.msg, ToAgent::Credit(_)) {
                    return frame;
                }
            }
        }

        async fn send(&mut self, stream: u64, msg: FromAgent) {
            self.sink.send(Frame { stream, msg }).await.unwrap();
        }

        /// Answers the next request, which must be a health check.
        async fn answer_health(&mut self) {
            let frame = self.next_request().await;
            assert_eq!(frame.msg, ToAgent::Health);
            let info = HealthInfo {
                protocol_version: PROTOCOL_VERSION,
                ..HealthInfo::default()
            };
            self.send(frame.stream, FromAgent::Health(info)).await;
        }
    }

    fn small_chunk(i: usize) -> FromAgent {
        FromAgent::FileChunk(vec![i as u8; 1024])
    }

    /// Small chunks filling one window exactly (many more than any fixed queue held before).
    fn chunks_per_window() -> usize {
        (flow::STREAM_WINDOW / flow::cost(&small_chunk(0))) as usize
    }

    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(10), f)
            .await
            .expect("stalled")
    }

    #[tokio::test]
    async fn a_stream_nobody_reads_stalls_neither_the_connection_nor_its_data() {
        let (client, agent) = pair();
        let mut peer = Peer::new(agent);
        let mut unread = client.open(ToAgent::ListeningPorts).await.unwrap();
        let id = peer.next().await.stream;
        let n = chunks_per_window();
        assert!(n > 1000);
        for i in 0..n {
            peer.send(id, small_chunk(i)).await;
        }
        // A whole window queued for a consumer that reads nothing; other operations go on.
        let health = tokio::spawn({
            let client = client.clone();
            async move { client.health().await }
        });
        peer.answer_health().await;
        within(health).await.unwrap().unwrap();
        // The stalled stream got everything, in order, and grants credit as it drains.
        for i in 0..n {
            assert_eq!(unread.recv().await.unwrap(), small_chunk(i));
        }
        let mut granted = 0u64;
        while granted < u64::from(flow::STREAM_WINDOW) / 2 {
            match peer.next().await {
                Frame {
                    stream,
                    msg: ToAgent::Credit(units),
                } if stream == id => granted += u64::from(units),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(granted <= u64::from(flow::STREAM_WINDOW));
    }

    #[tokio::test]
    async fn an_agent_overrunning_its_credit_ends_that_stream_only() {
        let (client, agent) = pair();
        let mut peer = Peer::new(agent);
        let mut flooded = client.open(ToAgent::ListeningPorts).await.unwrap();
        let id = peer.next().await.stream;
        let n = chunks_per_window();
        // A hostile agent: a flood far beyond its credit on one stream.
        for i in 0..n * 4 {
            peer.send(id, small_chunk(i)).await;
        }
        // What stays queued is one window, the rest was dropped; then the stream is broken.
        for i in 0..n {
            assert_eq!(flooded.recv().await.unwrap(), small_chunk(i));
        }
        assert!(matches!(
            flooded.recv().await,
            Err(ClientError::Protocol(m)) if m.contains("credit")
        ));
        assert!(!client.shared.streams.lock().contains_key(&id));
        // Dropping the broken stream cancels the agent's operation.
        drop(flooded);
        loop {
            let frame = peer.next().await;
            if frame.stream == id && frame.msg == ToAgent::Cancel {
                break;
            }
        }
        // The connection and its other streams live on.
        assert!(!client.is_closed());
        let health = tokio::spawn({
            let client = client.clone();
            async move { client.health().await }
        });
        peer.answer_health().await;
        within(health).await.unwrap().unwrap();
    }

    fn upload_request() -> WriteFileRequest {
        WriteFileRequest {
            path: "/f".into(),
            mode: None,
            create_parents: false,
            max_bytes: None,
            owner: None,
            metadata: Vec::new(),
        }
    }

    #[tokio::test]
    async fn an_upload_refused_while_it_waits_for_credit_ends_at_once() {
        let (client, agent) = pair();
        let mut peer = Peer::new(agent);
        let upload = tokio::spawn({
            let client = client.clone();
            async move {
                let mut w = client.write_file(upload_request()).await?;
                // Far more than a window: the writer is left waiting for credit.
                w.write(&vec![7u8; 3 * flow::STREAM_WINDOW as usize])
                    .await?;
                w.finish().await
            }
        });
        let id = peer.next().await.stream;
        let chunk_cost = flow::cost(&ToAgent::FileChunk(vec![0; FILE_CHUNK_BYTES]));
        for _ in 0..flow::STREAM_WINDOW / chunk_cost {
            assert!(matches!(peer.next().await.msg, ToAgent::FileChunk(_)));
        }
        // The agent refuses (a full disk, say) and grants nothing back.
        let refusal = AgentError::new(ErrorCode::NoSpace, "quota");
        peer.send(id, FromAgent::Error(refusal)).await;
        let ended = within(upload).await.unwrap();
        assert!(
            matches!(ended, Err(ClientError::Agent(ref e)) if e.code == ErrorCode::NoSpace),
            "{:?}",
            ended.map(|_| ())
        );
        // The chunk that was waiting went out late, without credit; the agent drops such
        // frames. Nothing else follows on that stream, and the connection serves others.
        let health = tokio::spawn({
            let client = client.clone();
            async move { client.health().await }
        });
        let mut frame = peer.next_request().await;
        while frame.stream == id {
            assert!(
                matches!(frame.msg, ToAgent::FileChunk(_)),
                "{:?}",
                frame.msg
            );
            frame = peer.next_request().await;
        }
        assert_eq!(frame.msg, ToAgent::Health);
        let info = HealthInfo {
            protocol_version: PROTOCOL_VERSION,
            ..HealthInfo::default()
        };
        peer.send(frame.stream, FromAgent::Health(info)).await;
        within(health).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn an_upload_without_credit_waits_on_its_own_stream() {
        let (client, agent) = pair();
        let mut peer = Peer::new(agent);
        let req = upload_request();
        let data: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let upload = tokio::spawn({
            let (client, data) = (client.clone(), data.clone());
            async move {
                let mut w = client.write_file(req).await?;
                w.write(&data).await?;
                w.finish().await
            }
        });
        let id = peer.next().await.stream;
        // An agent that grants nothing gets one window and no more.
        let mut got = Vec::new();
        let mut sent_cost = 0u64;
        while sent_cost + u64::from(flow::cost(&ToAgent::FileChunk(vec![0; FILE_CHUNK_BYTES])))
            <= u64::from(flow::STREAM_WINDOW)
        {
            let frame = peer.next().await;
            assert_eq!(frame.stream, id);
            sent_cost += u64::from(flow::cost(&frame.msg));
            let ToAgent::FileChunk(c) = frame.msg else {
                panic!("expected a chunk")
            };
            got.extend_from_slice(&c);
        }
        let more = tokio::time::timeout(std::time::Duration::from_millis(200), peer.next());
        assert!(more.await.is_err(), "sent beyond its credit");
        assert!(!upload.is_finished());
        // Meanwhile the connection serves other streams.
        let health = tokio::spawn({
            let client = client.clone();
            async move { client.health().await }
        });
        peer.answer_health().await;
        within(health).await.unwrap().unwrap();
        // Credit lets the rest through.
        peer.send(id, FromAgent::Credit(sent_cost as u32)).await;
        loop {
            let frame = peer.next().await;
            match frame.msg {
                ToAgent::FileChunk(c) => {
                    let units = flow::cost(&ToAgent::FileChunk(c.clone()));
                    got.extend_from_slice(&c);
                    peer.send(id, FromAgent::Credit(units)).await;
                }
                ToAgent::FileEnd => break,
                ToAgent::Credit(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(got == data, "upload corrupted");
        let entry = Entry {
            name: "f".into(),
            path: "/f".into(),
            kind: EntryKind::File,
            size: data.len() as u64,
            mode: 0o644,
            modified_ms: 0,
            symlink_target: None,
            uid: 0,
            gid: 0,
            metadata: Vec::new(),
        };
        peer.send(id, FromAgent::Entry(entry.clone())).await;
        assert_eq!(within(upload).await.unwrap().unwrap(), entry);
    }

    #[tokio::test]
    async fn an_agent_of_another_protocol_version_is_refused() {
        let (client, agent) = pair();
        let mut peer = Peer::new(agent);
        let health = tokio::spawn({
            let client = client.clone();
            async move { client.health().await }
        });
        let frame = peer.next().await;
        let info = HealthInfo {
            protocol_version: PROTOCOL_VERSION - 1,
            ..HealthInfo::default()
        };
        peer.send(frame.stream, FromAgent::Health(info)).await;
        assert!(matches!(
            within(health).await.unwrap(),
            Err(ClientError::Protocol(m)) if m.contains("version")
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
