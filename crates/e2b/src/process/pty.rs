//! Processes on a terminal: the manager's terminal, its output fanned out to every stream
//! following the process.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use koder_sessions::{Terminal, TerminalEvent, TerminalInput, TerminalSpec};
use parking_lot::Mutex;
use tokio::sync::broadcast;

use super::{data_event, end_event, keepalive_event, not_found, start_event, stream_lost};
use super::{Kind, Proc};
use crate::connect::{self, Code, RpcError, Sink};
use crate::envd::{SandboxCtx, Target};
use crate::proto::ProcessConfig;

/// Terminal output events a slow follower may lag behind.
const PTY_EVENTS: usize = 1024;
const SIGKILL: i32 = 9;

pub struct PtyProc {
    input: TerminalInput,
    events: broadcast::Sender<PtyEvent>,
    exit: Mutex<Option<Exit>>,
}

#[derive(Clone, Copy, Debug)]
struct Exit {
    exit_code: Option<i32>,
    signal: Option<i32>,
}

#[derive(Clone, Debug)]
enum PtyEvent {
    Data(Bytes),
    Exit(Exit),
}

impl PtyProc {
    pub(super) fn running(&self) -> bool {
        self.exit.lock().is_none()
    }

    pub(super) async fn write(&self, data: &[u8]) -> Result<(), RpcError> {
        self.input.write(data).await.map_err(ended)
    }

    pub(super) async fn resize(&self, cols: u16, rows: u16) -> Result<(), RpcError> {
        self.input.resize(cols, rows).await.map_err(ended)
    }

    pub(super) async fn signal(&self, pid: u32, signal: i32) -> Result<(), RpcError> {
        if !self.running() {
            return Err(not_found(pid));
        }
        self.input.signal(signal).await.map_err(ended)
    }

    /// Streams the terminal to `sink` from now on (or just its end, if it ended).
    pub(super) fn follow(&self, sink: Sink, pid: u32, keepalive: Duration) {
        let rx = self.events.subscribe();
        let exited = *self.exit.lock();
        tokio::spawn(relay(sink, pid, rx, exited, keepalive));
    }
}

fn ended(e: koder_sessions::TerminalEnded) -> RpcError {
    RpcError::new(Code::NotFound, e.to_string())
}

pub(super) async fn start(
    t: Target,
    cfg: ProcessConfig,
    tag: Option<String>,
    (cols, rows): (u16, u16),
    limit_ms: u64,
    keepalive: Duration,
) -> Result<Response, RpcError> {
    let spec = TerminalSpec {
        argv: std::iter::once(cfg.cmd.clone())
            .chain(cfg.args.iter().cloned())
            .collect(),
        env: cfg.envs.clone(),
        cwd: Some(t.user.resolve(cfg.cwd.as_deref().unwrap_or(""))),
        user: Some(t.user.name().into()),
        cols,
        rows,
    };
    let term = t.e2b.manager().terminal(&t.who, &t.id, spec).await?;
    let pid = term.pid();
    // Subscribed before the pump runs: the first output reaches this stream.
    let (events, rx) = broadcast::channel(PTY_EVENTS);
    let proc = Arc::new(PtyProc {
        input: term.input(),
        events,
        exit: Mutex::new(None),
    });
    t.ctx.procs.lock().insert(
        pid,
        Proc {
            config: cfg,
            tag,
            kind: Kind::Pty(proc.clone()),
        },
    );
    tokio::spawn(pump(
        term,
        proc,
        t.ctx.clone(),
        Duration::from_millis(limit_ms),
    ));
    let (sink, resp) = connect::stream_response();
    tokio::spawn(relay(sink, pid, rx, None, keepalive));
    Ok(resp)
}

/// Owns the terminal: fans its output out to followers, kills it at its time limit, and
/// forgets it once it exited.
async fn pump(mut term: Terminal, proc: Arc<PtyProc>, ctx: Arc<SandboxCtx>, limit: Duration) {
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    let mut killed = false;
    let exit = loop {
        let event = tokio::select! {
            e = term.next() => e,
            () = &mut deadline, if !killed => {
                killed = true;
                let _ = proc.input.signal(SIGKILL).await;
                continue;
            }
        };
        match event {
            TerminalEvent::Output(data) => {
                let _ = proc.events.send(PtyEvent::Data(data));
            }
            TerminalEvent::Exit { exit_code, signal } => break Exit { exit_code, signal },
            TerminalEvent::Lost(_) => {
                break Exit {
                    exit_code: None,
                    signal: Some(SIGKILL),
                }
            }
        }
    };
    *proc.exit.lock() = Some(exit);
    let _ = proc.events.send(PtyEvent::Exit(exit));
    ctx.procs.lock().remove(&term.pid());
}

async fn relay(
    sink: Sink,
    pid: u32,
    mut rx: broadcast::Receiver<PtyEvent>,
    exited: Option<Exit>,
    every: Duration,
) {
    if !sink.send(&start_event(pid)).await {
        return;
    }
    if let Some(exit) = exited {
        if sink
            .send(&end_event(exit.exit_code, exit.signal, None))
            .await
        {
            sink.end(None).await;
        }
        return;
    }
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            got = rx.recv() => match got {
                Ok(PtyEvent::Data(b)) => {
                    if !sink.send(&data_event("pty", &b)).await {
                        return;
                    }
                }
                Ok(PtyEvent::Exit(exit)) => {
                    if sink.send(&end_event(exit.exit_code, exit.signal, None)).await {
                        sink.end(None).await;
                    }
                    return;
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(pid, missed = n, "E2B terminal stream fell behind; output dropped");
                }
                Err(broadcast::error::RecvError::Closed) => {
                    sink.end(Some(stream_lost())).await;
                    return;
                }
            },
            _ = tick.tick() => {
                if !sink.send(&keepalive_event()).await {
                    return;
                }
            }
            () = sink.closed() => return,
        }
    }
}
