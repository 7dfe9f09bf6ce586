//! Serves the agent protocol on each accepted connection.
//!
//! The daemon is trusted to drive the agent, but the agent still validates every frame: a
//! malformed frame ends that connection, a stale message for a finished stream is dropped, the
//! number of concurrent streams per connection is capped, and a stream the daemon floods beyond
//! its credit ([`koder_agent_protocol::flow`]) ends with an error. The connection's reader never
//! waits for an operation: a process that does not read its stdin stalls only its own stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::{SinkExt, StreamExt};
use koder_agent_protocol::flow::{self, RecvWindow, SendCredit};
use koder_agent_protocol::{
    AgentError, Entry, ErrorCode, Frame, FrameCodec, FromAgent, HealthInfo, ReadFileRequest,
    ToAgent, WriteFileRequest, FILE_CHUNK_BYTES, PROTOCOL_VERSION,
};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::egress::{self, Egress};
use super::exec::{self, ExecDefaults, Reaper};
use super::fs::{Fs, PendingWrite};
use super::interp::{self, Contexts};
use super::{killall, layer, net, pty, watch};
use crate::confinement::Confinement;
use crate::guest_cgroup::SandboxCgroup;
use crate::outbox::Outbox;

/// Streams one connection may run at once; more are refused rather than queued.
pub const MAX_STREAMS: usize = 1024;

pub struct Agent {
    pub reaper: Arc<Reaper>,
    pub fs: Arc<Fs>,
    pub defaults: ExecDefaults,
    pub confinement: Confinement,
    pub contexts: Contexts,
    pub egress: Arc<Egress>,
    /// The sandbox cgroup when this agent is a microVM's init; `None` in a jail, whose cgroup
    /// the host drives.
    pub guest: Option<Arc<SandboxCgroup>>,
    /// The overlay's upper directory, opened before the root was built (snapshots read it).
    pub upper: Option<Arc<std::os::fd::OwnedFd>>,
    started: Instant,
    running_execs: AtomicU32,
}

impl Agent {
    pub fn new(
        reaper: Arc<Reaper>,
        fs: Fs,
        defaults: ExecDefaults,
        confinement: Confinement,
    ) -> Self {
        Self {
            reaper,
            fs: Arc::new(fs),
            contexts: Contexts::with_defaults(&defaults),
            defaults,
            egress: Arc::default(),
            guest: None,
            upper: None,
            confinement,
            started: Instant::now(),
            running_execs: AtomicU32::new(0),
        }
    }

    fn health(&self) -> HealthInfo {
        HealthInfo {
            protocol_version: PROTOCOL_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").into(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            no_new_privs: self.confinement.no_new_privs,
            seccomp: self.confinement.seccomp,
            landlock_abi: self.confinement.landlock_abi,
            running_execs: self.running_execs.load(Ordering::Relaxed),
        }
    }
}

pub async fn serve_listener(agent: Arc<Agent>, listener: tokio::net::UnixListener) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                tokio::spawn(serve_connection(agent.clone(), conn));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// The reader's end of one stream.
struct Route {
    /// Unbounded, but holds at most one window: [`RecvWindow::admit`] comes first.
    inbox: mpsc::UnboundedSender<(ToAgent, u32)>,
    window: Arc<RecvWindow>,
    /// What the operation's [`Outbox`] may still send.
    credit: Arc<SendCredit>,
}

type Streams = Arc<Mutex<HashMap<u64, Route>>>;
type Out = mpsc::Sender<Frame<FromAgent>>;

pub async fn serve_connection<S>(agent: Arc<Agent>, conn: S)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(conn);
    let mut frames = FramedRead::new(r, FrameCodec::<ToAgent, FromAgent>::default());
    let mut sink = FramedWrite::new(w, FrameCodec::<ToAgent, FromAgent>::default());
    let (tx, mut out_rx) = mpsc::channel::<Frame<FromAgent>>(256);
    let writer = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if sink.send(frame).await.is_err() {
                break;
            }
        }
    });
    let streams: Streams = Arc::default();
    while let Some(frame) = frames.next().await {
        let Ok(frame) = frame else {
            // Framing is lost after a bad frame; the daemon reconnects.
            break;
        };
        if streams.lock().contains_key(&frame.stream) {
            deliver(&streams, frame, &tx).await;
        } else if !frame.msg.is_follow_up() {
            // (A follow-up here is late, for a stream that already finished.)
            open(&agent, &streams, frame, &tx).await;
        }
    }
    // Dropping the routes tells every running operation its caller is gone, and nothing it
    // still sends can go out.
    for (_, route) in streams.lock().drain() {
        route.credit.close();
    }
    drop(tx);
    let _ = writer.await;
}

/// Hands a message to its running stream without waiting for the operation.
async fn deliver(streams: &Streams, frame: Frame<ToAgent>, tx: &Out) {
    let id = frame.stream;
    let overrun = {
        let mut streams = streams.lock();
        let Some(route) = streams.get(&id) else {
            return;
        };
        match frame.msg {
            ToAgent::Credit(units) => {
                route.credit.grant(units);
                return;
            }
            ToAgent::Cancel => {
                // The last word on the stream: the operation sees it after what came before, and
                // winds down without waiting for credit.
                route.credit.lift();
                let _ = route.inbox.send((ToAgent::Cancel, 0));
                streams.remove(&id);
                return;
            }
            msg => {
                let cost = flow::cost(&msg);
                let admitted = route.window.admit(cost).is_ok();
                if admitted {
                    let _ = route.inbox.send((msg, cost));
                } else {
                    // The operation sees its caller gone (after what it queued) and can send
                    // nothing more: the error below is the stream's end.
                    route.credit.close();
                    streams.remove(&id);
                }
                !admitted
            }
        }
    };
    if overrun {
        let err = AgentError::new(
            ErrorCode::InvalidRequest,
            "the daemon sent beyond its credit on this stream",
        );
        let _ = tx
            .send(Frame {
                stream: id,
                msg: FromAgent::Error(err),
            })
            .await;
    }
}

/// Starts the operation a stream's first message asks for.
async fn open(agent: &Arc<Agent>, streams: &Streams, frame: Frame<ToAgent>, tx: &Out) {
    let credit = Arc::new(SendCredit::default());
    let out = Outbox::new(frame.stream, tx.clone(), credit.clone());
    if streams.lock().len() >= MAX_STREAMS {
        let _ = out
            .send(FromAgent::Error(AgentError::new(
                ErrorCode::InvalidRequest,
                "too many concurrent operations on this connection",
            )))
            .await;
        return;
    }
    let window = Arc::new(RecvWindow::default());
    let (inbox, inbox_rx) = mpsc::unbounded_channel();
    let route = Route {
        inbox,
        window: window.clone(),
        credit,
    };
    streams.lock().insert(frame.stream, route);
    // One message in hand at a time: everything else waits in the inbox, within the window.
    let (op_tx, op_rx) = mpsc::channel(1);
    let (agent, streams, tx) = (agent.clone(), streams.clone(), tx.clone());
    tokio::spawn(async move {
        let id = out.stream();
        let run = async {
            handle(&agent, frame.msg, op_rx, out).await;
            streams.lock().remove(&id);
        };
        tokio::join!(run, forward(id, inbox_rx, op_tx, &window, &tx));
    });
}

/// Moves a stream's queued messages to its operation as it takes them, granting the daemon
/// credit for what was taken. Ends when the stream's route or its operation is gone.
async fn forward(
    id: u64,
    mut inbox: mpsc::UnboundedReceiver<(ToAgent, u32)>,
    op: mpsc::Sender<ToAgent>,
    window: &RecvWindow,
    tx: &Out,
) {
    while let Some((msg, cost)) = inbox.recv().await {
        if op.send(msg).await.is_err() {
            return;
        }
        if let Some(units) = window.consumed(cost) {
            let credit = Frame {
                stream: id,
                msg: FromAgent::Credit(units),
            };
            if tx.send(credit).await.is_err() {
                return;
            }
        }
    }
}

async fn handle(agent: &Agent, first: ToAgent, rx: mpsc::Receiver<ToAgent>, out: Outbox) {
    let fs = agent.fs.clone();
    let answer = match first {
        ToAgent::Health => Ok(FromAgent::Health(agent.health())),
        ToAgent::Exec(req) => {
            agent.running_execs.fetch_add(1, Ordering::Relaxed);
            exec::run(&agent.reaper, &agent.defaults, req, rx, out).await;
            agent.running_execs.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        ToAgent::ReadFile(req) => return read_file(fs, req, rx, out).await,
        ToAgent::WriteFile(req) => return write_file(fs, req, rx, out).await,
        ToAgent::List { path, depth } => {
            blocking(move || {
                fs.list(&path, depth)
                    .map(|(entries, truncated)| FromAgent::Entries { entries, truncated })
            })
            .await
        }
        ToAgent::Stat { path } => blocking(move || fs.stat(&path).map(FromAgent::Entry)).await,
        ToAgent::MakeDir { path, owner } => {
            blocking(move || fs.make_dir(&path, owner).map(FromAgent::Entry)).await
        }
        ToAgent::Remove { path, recursive } => {
            blocking(move || fs.remove(&path, recursive).map(|()| FromAgent::Done)).await
        }
        ToAgent::DiskUsage => blocking(disk_usage).await,
        ToAgent::GuestLimits(limits) => {
            guest_op(agent, move |cg| {
                cg.set_limits(&limits).map(|()| FromAgent::Done)
            })
            .await
        }
        ToAgent::GuestUsage => guest_op(agent, |cg| cg.usage().map(FromAgent::GuestUsage)).await,
        ToAgent::GuestFreeze(frozen) => {
            guest_op(agent, move |cg| cg.freeze(frozen).map(|()| FromAgent::Done)).await
        }
        ToAgent::KillAll => killall::kill_all()
            .await
            .map(|processes| FromAgent::KilledAll { processes }),
        ToAgent::CaptureLayer {
            max_bytes,
            max_entries,
        } => return layer::capture(agent.upper.clone(), max_bytes, max_entries, out).await,
        ToAgent::ListeningPorts => blocking(net::listening_ports).await,
        ToAgent::EgressSubscribe => return egress::subscribe(&agent.egress, rx, out).await,
        ToAgent::EgressAttach { conn } => {
            return egress::attach(&agent.egress, conn, rx, out).await
        }
        ToAgent::Connect { port } => return net::relay(port, rx, out).await,
        ToAgent::Watch { path, recursive } => {
            return watch::run(fs, path, recursive, rx, out).await;
        }
        ToAgent::PtyStart(req) => {
            agent.running_execs.fetch_add(1, Ordering::Relaxed);
            pty::run(&agent.reaper, &agent.defaults, req, rx, out).await;
            agent.running_execs.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        msg @ (ToAgent::ContextCreate { .. }
        | ToAgent::ContextRun { .. }
        | ToAgent::ContextList
        | ToAgent::ContextDelete { .. }
        | ToAgent::ContextRestart { .. }) => {
            return interp::handle(&agent.contexts, msg, rx, out).await;
        }
        ToAgent::Move { from, to } => {
            blocking(move || fs.rename(&from, &to).map(FromAgent::Entry)).await
        }
        other => Err(AgentError::new(
            ErrorCode::InvalidRequest,
            format!("{} cannot start an operation", other.kind()),
        )),
    };
    let _ = out.send(answer.unwrap_or_else(FromAgent::Error)).await;
}

async fn read_file(
    fs: Arc<Fs>,
    req: ReadFileRequest,
    mut rx: mpsc::Receiver<ToAgent>,
    out: Outbox,
) {
    let opened = blocking(move || fs.open_read(&req.path, req.max_bytes)).await;
    let file = match opened {
        Ok(f) => f,
        Err(e) => {
            let _ = out.send(FromAgent::Error(e)).await;
            return;
        }
    };
    // One blocking reader per download, a couple of chunks ahead of the daemon's credit.
    let (chunks_tx, mut chunks) = mpsc::channel(2);
    tokio::task::spawn_blocking(move || read_chunks(file, &chunks_tx));
    while let Some(chunk) = chunks.recv().await {
        let (msg, last) = match chunk {
            Ok(data) => (FromAgent::FileChunk(data), false),
            Err(e) => (FromAgent::Error(e), true),
        };
        // Returning drops `chunks`, which stops the reader.
        if out.send(msg).await.is_err() || last || cancelled(&mut rx) {
            return;
        }
    }
    let _ = out.send(FromAgent::FileEnd).await;
}

/// Whether the daemon gave up on this stream (cancelled it or went away).
fn cancelled(rx: &mut mpsc::Receiver<ToAgent>) -> bool {
    use tokio::sync::mpsc::error::TryRecvError;
    loop {
        match rx.try_recv() {
            Ok(ToAgent::Cancel) | Err(TryRecvError::Disconnected) => return true,
            Ok(_) => {} // nothing else means anything to a download
            Err(TryRecvError::Empty) => return false,
        }
    }
}

/// Reads `file` in whole chunks until its end, a read error or the sender's end going away.
fn read_chunks(file: std::fs::File, chunks: &mpsc::Sender<Result<Vec<u8>, AgentError>>) {
    use std::io::Read;
    let mut file = file.take(0);
    loop {
        let mut buf = Vec::with_capacity(FILE_CHUNK_BYTES);
        file.set_limit(FILE_CHUNK_BYTES as u64);
        // read_to_end fills the spare capacity without zeroing it first.
        let chunk = match file.read_to_end(&mut buf) {
            Ok(0) => return,
            Ok(_) => Ok(buf),
            Err(e) => Err(AgentError::new(ErrorCode::Io, format!("read failed: {e}"))),
        };
        let more = matches!(&chunk, Ok(b) if b.len() == FILE_CHUNK_BYTES);
        if chunks.blocking_send(chunk).is_err() || !more {
            return;
        }
    }
}

/// What the upload's blocking writer is fed.
enum Upload {
    Chunk(Vec<u8>),
    Commit,
}

async fn write_file(fs: Arc<Fs>, req: WriteFileRequest, rx: mpsc::Receiver<ToAgent>, out: Outbox) {
    let msg = match upload(fs, req, rx).await {
        Ok(Some(entry)) => FromAgent::Entry(entry),
        Ok(None) => return,
        Err(e) => FromAgent::Error(e),
    };
    let _ = out.send(msg).await;
}

/// Feeds one blocking writer per upload; `None` when the upload was cancelled (and so
/// discarded).
async fn upload(
    fs: Arc<Fs>,
    req: WriteFileRequest,
    mut rx: mpsc::Receiver<ToAgent>,
) -> Result<Option<Entry>, AgentError> {
    let pending = blocking(move || fs.begin_write(&req)).await?;
    let (chunks, chunks_rx) = mpsc::channel(2);
    let writer = tokio::task::spawn_blocking(move || write_chunks(pending, chunks_rx));
    loop {
        let item = match rx.recv().await {
            Some(ToAgent::FileChunk(data)) => Upload::Chunk(data),
            Some(ToAgent::FileEnd) => Upload::Commit,
            // Cancelled or caller gone: the writer discards the upload once `chunks` is gone.
            Some(ToAgent::Cancel) | None => break,
            Some(other) => {
                drop(chunks);
                let _ = writer.await;
                return Err(AgentError::new(
                    ErrorCode::InvalidRequest,
                    format!("unexpected {} during upload", other.kind()),
                ));
            }
        };
        let commit = matches!(item, Upload::Commit);
        // A send fails once the writer has stopped on an error; it reports that error below.
        if chunks.send(item).await.is_err() || commit {
            break;
        }
    }
    drop(chunks);
    writer.await.unwrap_or_else(|e| Err(failed(e)))
}

/// Writes what arrives until the commit; an upload whose feed ends before is discarded (by
/// dropping `pending`).
fn write_chunks(
    mut pending: PendingWrite,
    mut chunks: mpsc::Receiver<Upload>,
) -> Result<Option<Entry>, AgentError> {
    while let Some(item) = chunks.blocking_recv() {
        match item {
            Upload::Chunk(data) => pending.write(&data)?,
            Upload::Commit => return pending.commit().map(Some),
        }
    }
    Ok(None)
}

/// statvfs of the root: on an overlay root it reports the upper (writable) layer's filesystem,
/// which is the session's disk quota.
fn disk_usage() -> Result<FromAgent, AgentError> {
    let st = rustix::fs::statvfs("/")
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("statvfs: {e}")))?;
    let block = st.f_frsize;
    Ok(FromAgent::DiskUsage {
        total_bytes: st.f_blocks.saturating_mul(block),
        used_bytes: st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(block),
    })
}

/// Runs a cgroup operation of a microVM guest; a jail's agent has no cgroup of its own to drive.
async fn guest_op(
    agent: &Agent,
    f: impl FnOnce(&SandboxCgroup) -> Result<FromAgent, AgentError> + Send + 'static,
) -> Result<FromAgent, AgentError> {
    let Some(cg) = agent.guest.clone() else {
        return Err(AgentError::new(
            ErrorCode::InvalidRequest,
            "guest resource control exists only inside a microVM",
        ));
    };
    blocking(move || f(&cg)).await
}

/// Runs filesystem work off the async thread; a panic there is reported, not propagated.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(failed(e)))
}

fn failed(e: tokio::task::JoinError) -> AgentError {
    AgentError::new(ErrorCode::Io, format!("file operation failed: {e}"))
}
