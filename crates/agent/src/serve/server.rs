//! Serves the agent protocol on each accepted connection.
//!
//! The daemon is trusted to drive the agent, but the agent still validates every frame: a
//! malformed frame ends that connection, a stale message for a finished stream is dropped, and
//! the number of concurrent streams per connection is capped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::{SinkExt, StreamExt};
use koder_agent_protocol::{
    AgentError, ErrorCode, Frame, FrameCodec, FromAgent, HealthInfo, ReadFileRequest, ToAgent,
    WriteFileRequest, CHUNK_BYTES, PROTOCOL_VERSION,
};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::egress::{self, Egress};
use super::exec::{self, ExecDefaults, Reaper};
use super::fs::Fs;
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

type Streams = Arc<Mutex<HashMap<u64, mpsc::Sender<ToAgent>>>>;

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
        let existing = streams.lock().get(&frame.stream).cloned();
        if let Some(op) = existing {
            let _ = op.send(frame.msg).await;
            continue;
        }
        let out = Outbox::new(frame.stream, tx.clone());
        if frame.msg.is_follow_up() {
            continue; // late message for a stream that already finished
        }
        if streams.lock().len() >= MAX_STREAMS {
            let _ = out
                .send(FromAgent::Error(AgentError::new(
                    ErrorCode::InvalidRequest,
                    "too many concurrent operations on this connection",
                )))
                .await;
            continue;
        }
        let (op_tx, op_rx) = mpsc::channel(16);
        streams.lock().insert(frame.stream, op_tx);
        let (agent, streams) = (agent.clone(), streams.clone());
        tokio::spawn(async move {
            let id = out.stream();
            handle(&agent, frame.msg, op_rx, out).await;
            streams.lock().remove(&id);
        });
    }
    // Dropping the stream senders tells every running operation its caller is gone.
    streams.lock().clear();
    drop(tx);
    let _ = writer.await;
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
        ToAgent::ReadFile(req) => return read_file(fs, req, out).await,
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

async fn read_file(fs: Arc<Fs>, req: ReadFileRequest, out: Outbox) {
    let opened = blocking(move || fs.open_read(&req.path, req.max_bytes)).await;
    let file = match opened {
        Ok(f) => f,
        Err(e) => {
            let _ = out.send(FromAgent::Error(e)).await;
            return;
        }
    };
    let mut file = tokio::fs::File::from_std(file);
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        match file.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if out
                    .send(FromAgent::FileChunk(buf[..n].to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Err(e) => {
                let err = AgentError::new(ErrorCode::Io, format!("read failed: {e}"));
                let _ = out.send(FromAgent::Error(err)).await;
                return;
            }
        }
    }
    let _ = out.send(FromAgent::FileEnd).await;
}

async fn write_file(
    fs: Arc<Fs>,
    req: WriteFileRequest,
    mut rx: mpsc::Receiver<ToAgent>,
    out: Outbox,
) {
    let result = async {
        let mut pending = blocking(move || fs.begin_write(&req)).await?;
        loop {
            match rx.recv().await {
                Some(ToAgent::FileChunk(data)) => {
                    pending = blocking(move || pending.write(&data).map(|()| pending)).await?;
                }
                Some(ToAgent::FileEnd) => {
                    return blocking(move || pending.commit()).await.map(Some)
                }
                // Cancelled or caller gone: dropping `pending` discards the upload.
                Some(ToAgent::Cancel) | None => return Ok(None),
                Some(other) => {
                    return Err(AgentError::new(
                        ErrorCode::InvalidRequest,
                        format!("unexpected {} during upload", other.kind()),
                    ))
                }
            }
        }
    }
    .await;
    let msg = match result {
        Ok(Some(entry)) => FromAgent::Entry(entry),
        Ok(None) => return,
        Err(e) => FromAgent::Error(e),
    };
    let _ = out.send(msg).await;
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
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(AgentError::new(
            ErrorCode::Io,
            format!("file operation failed: {e}"),
        ))
    })
}
