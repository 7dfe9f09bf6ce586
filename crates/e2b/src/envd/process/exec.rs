//! Processes without a terminal: background execs of the session manager, whose output it
//! buffers, so a stream can leave and re-join with `Connect`.

use std::time::Duration;

use axum::response::Response;
use koder_api_types::{codes, ExecRequest, ExecResult};
use koder_auth::Identity;
use koder_sessions::execs::{ExecEvent, Follow};
use koder_sessions::{BackgroundExec, LaterStdin};
use tokio::sync::broadcast;

use super::events;
use super::table::{Kind, Proc, SIGKILL};
use crate::connect::{self, Code, RpcError, Sink};
use crate::envd::auth::Target;
use crate::proto::process::process_event::data_event::Output;
use crate::proto::process::{ProcessConfig, StartResponse};
use crate::E2b;

/// Starts `cfg` as a background exec of the manager and streams it.
pub(super) async fn start(
    t: Target,
    cfg: ProcessConfig,
    tag: Option<String>,
    stdin: bool,
    limit_ms: u64,
    keepalive: Duration,
) -> Result<Response, RpcError> {
    let m = t.e2b.manager();
    let argv = std::iter::once(cfg.cmd.clone())
        .chain(cfg.args.iter().cloned())
        .collect();
    let exec = ExecRequest {
        cmd: Some(argv),
        env: cfg.envs.clone(),
        cwd: Some(t.process_cwd(cfg.cwd.as_deref())),
        timeout_ms: Some(limit_ms),
        background: true,
        user: Some(t.user.name().into()),
        ..Default::default()
    };
    // envd gives a process without `stdin` an empty, closed one.
    let later = match stdin {
        true => LaterStdin::Open,
        false => LaterStdin::Closed,
    };
    let BackgroundExec { exec_id, pid } = m.exec_background(&t.who, &t.id, exec, later).await?;
    // Subscribing before anything else is what guarantees no output is missed.
    let follow = m.follow_exec(&t.who, &t.id, &exec_id).await?;
    let owner = Owner::of(&t, &exec_id);
    t.ctx.procs.lock().insert(
        pid,
        Proc {
            config: cfg,
            tag,
            kind: Kind::Exec(exec_id),
        },
    );
    let (sink, resp) = connect::stream_response();
    tokio::spawn(relay(sink, pid, follow, owner, keepalive, true));
    Ok(resp)
}

/// The exec a relay streams, to tell a process that was killed from one whose sandbox went
/// away under it: envd ends the latter's stream with UNAVAILABLE, so the SDK probes the
/// sandbox and reports it gone.
pub(super) struct Owner {
    e2b: E2b,
    who: Identity,
    id: String,
    exec_id: String,
}

impl Owner {
    pub(super) fn of(t: &Target, exec_id: &str) -> Self {
        Self {
            e2b: t.e2b.clone(),
            who: t.who.clone(),
            id: t.id.clone(),
            exec_id: exec_id.to_string(),
        }
    }

    /// The session leaves the manager's live set before its sandbox is torn down (and counts
    /// as ended from then on), so an exec that died with its sandbox finds it gone.
    async fn sandbox_gone(&self) -> bool {
        matches!(
            self.e2b
                .manager()
                .exec_status(&self.who, &self.id, &self.exec_id)
                .await,
            Err(koder_sessions::Error::NotFound)
        )
    }
}

fn exec_end(r: &ExecResult) -> (StartResponse, Option<RpcError>) {
    let why = r
        .verdict
        .as_ref()
        .map(|v| format!("{v}: {}", verdict_text(v)));
    let timed_out = r.verdict.as_deref() == Some(codes::EXEC_TIMEOUT);
    let deadline = timed_out.then(|| {
        RpcError::new(
            Code::DeadlineExceeded,
            "the process ran past its timeout and was killed",
        )
    });
    (events::end(r.exit_code, r.signal, why), deadline)
}

fn verdict_text(code: &str) -> &'static str {
    match code {
        codes::EXEC_TIMEOUT => "killed at its timeout",
        codes::EXEC_KILLED_OOM => "killed out of memory",
        codes::EXEC_KILLED_PIDS => "hit the process limit",
        codes::EXEC_KILLED_CPU => "killed for CPU use",
        _ => "killed",
    }
}

/// Streams an exec's events: start, output (the retained past too when `with_past`), then the
/// end event. Leaving the stream leaves the process running.
pub(super) async fn relay(
    sink: Sink,
    pid: u32,
    follow: Follow,
    owner: Owner,
    every: Duration,
    with_past: bool,
) {
    if !sink.send(&events::start(pid)).await {
        return;
    }
    let past = follow
        .replay
        .into_iter()
        .filter(|e| with_past || matches!(e, ExecEvent::Exit(_)));
    let mut live = follow.live;
    let mut past = past.collect::<Vec<_>>().into_iter();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        let event = match past.next() {
            Some(e) => e,
            None => {
                let Some(rx) = live.as_mut() else {
                    sink.sever().await;
                    return;
                };
                tokio::select! {
                    got = rx.recv() => match got {
                        Ok(e) => e,
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(pid, missed = n, "E2B process stream fell behind; output dropped");
                            continue;
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
                        continue;
                    }
                    () = sink.closed() => return,
                }
            }
        };
        let sent = match event {
            ExecEvent::Stdout(b) => sink.send(&events::data(Output::Stdout(b.to_vec()))).await,
            ExecEvent::Stderr(b) => sink.send(&events::data(Output::Stderr(b.to_vec()))).await,
            ExecEvent::Exit(r) => {
                if r.signal == Some(SIGKILL) && owner.sandbox_gone().await {
                    sink.sever().await;
                    return;
                }
                let (end, err) = exec_end(&r);
                if sink.send(&end).await {
                    sink.end(err).await;
                }
                return;
            }
        };
        if !sent {
            return;
        }
    }
}
