//! Processes on a terminal: the manager's terminal, its output fanned out to every stream
//! following the process.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use koder_sessions::{Terminal, TerminalEvent, TerminalSpec};
use parking_lot::Mutex;
use tokio::sync::broadcast;

use super::events;
use super::table::{Exit, Kind, Proc, PtyEvent, PtyProc, SIGKILL};
use crate::connect::{self, RpcError, Sink};
use crate::envd::auth::Target;
use crate::envd::sandbox::SandboxCtx;
use crate::proto::process::process_event::data_event::Output;
use crate::proto::process::ProcessConfig;

/// Terminal output events a slow follower may lag behind.
const PTY_EVENTS: usize = 1024;

/// Streams the terminal to `sink` from now on (or just its end, if it ended).
pub(super) fn follow(p: &PtyProc, sink: Sink, pid: u32, keepalive: Duration) {
    let rx = p.events.subscribe();
    let exited = *p.exit.lock();
    tokio::spawn(relay(sink, pid, rx, exited, keepalive));
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
        cwd: Some(t.process_cwd(cfg.cwd.as_deref())),
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
    if !sink.send(&events::start(pid)).await {
        return;
    }
    if let Some(exit) = exited {
        if sink
            .send(&events::end(exit.exit_code, exit.signal, None))
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
                    if !sink.send(&events::data(Output::Pty(b.to_vec()))).await {
                        return;
                    }
                }
                Ok(PtyEvent::Exit(exit)) => {
                    if sink.send(&events::end(exit.exit_code, exit.signal, None)).await {
                        sink.end(None).await;
                    }
                    return;
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(pid, missed = n, "E2B terminal stream fell behind; output dropped");
                }
                Err(broadcast::error::RecvError::Closed) => {
                    sink.sever().await;
                    return;
                }
            },
            _ = tick.tick() => {
                if !sink.send(&events::keepalive()).await {
                    return;
                }
            }
            () = sink.closed() => return,
        }
    }
}
