//! envd's `process.Process` service over the session manager.
//!
//! A process is a background exec (output buffered by the manager, stdin kept open), so it
//! outlives the stream that started it, as in envd: the stream can be left and re-joined with
//! `Connect`. Its time limit is the Start call's `connect-timeout-ms` (envd kills the process
//! at that deadline); without one, the server's maximum exec time. A process with `pty` runs on
//! the manager's terminal.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use koder_agent_protocol::{AgentStream, ExitInfo, FromAgent, StreamHandle, ToAgent, CHUNK_BYTES};
use koder_api_types::{codes, ExecRequest, ExecResult};
use koder_sessions::execs::{ExecEvent, Follow};
use serde_json::{json, Value};
use tokio::sync::{broadcast, oneshot};

use crate::connect::{self, Code, MessageStream, RpcError, Sink};
use crate::envd::{SandboxCtx, Target, User, SANDBOX_USER_UID};
use crate::lock;
use crate::proto::{
    b64, ProcessConfig, ProcessSelector, SelectRequest, SendInputRequest, SendSignalRequest,
    StartRequest, StreamInputRequest, UpdateRequest,
};

/// How long a new process may take to report its pid.
const START_WAIT: Duration = Duration::from_secs(10);
/// Keepalive period when the client names none (`Keepalive-Ping-Interval`, seconds).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);
/// Terminal output events a slow follower may lag behind.
const PTY_EVENTS: usize = 1024;
/// The terminal's first output: its shell's pid, so the SDK gets the real one (the
/// manager's terminal does not hand out the pid of the process it starts).
const PTY_PID_OSC: &[u8] = b"\x1b]7771;";
const PTY_PID_SCRIPT: &str = "printf '\\033]7771;%s\\007' \"$$\"; exec \"$@\"";

/// A process started through E2B.
pub struct Proc {
    pub config: ProcessConfig,
    pub tag: Option<String>,
    pub kind: Kind,
}

#[derive(Clone)]
pub enum Kind {
    Exec(String),
    Pty(Arc<PtyProc>),
}

pub struct PtyProc {
    input: StreamHandle,
    events: broadcast::Sender<PtyEvent>,
    exit: Mutex<Option<ExitInfo>>,
}

#[derive(Clone, Debug)]
enum PtyEvent {
    Data(Bytes),
    Exit(ExitInfo),
}

impl PtyProc {
    async fn send(&self, msg: ToAgent) -> Result<(), RpcError> {
        self.input
            .send(msg)
            .await
            .map_err(|_| RpcError::new(Code::NotFound, "the terminal has ended"))
    }

    async fn write(&self, data: &[u8]) -> Result<(), RpcError> {
        for chunk in data.chunks(CHUNK_BYTES) {
            self.send(ToAgent::Stdin(chunk.to_vec())).await?;
        }
        Ok(())
    }
}

pub async fn rpc(
    Path(method): Path<String>,
    t: Target,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match method.as_str() {
        "Start" => {
            connect::server_stream(&headers, body, |r: StartRequest| start(t, &headers, r)).await
        }
        "Connect" => {
            connect::server_stream(&headers, body, |r: SelectRequest| reconnect(t, &headers, r))
                .await
        }
        "List" => connect::unary(&headers, body, |_: Value| list(t)).await,
        "SendInput" => connect::unary(&headers, body, |r| send_input(t, r)).await,
        "StreamInput" => stream_input(t, &headers, body).await,
        "SendSignal" => connect::unary(&headers, body, |r| send_signal(t, r)).await,
        "CloseStdin" => connect::unary(&headers, body, |r| close_stdin(t, r)).await,
        "Update" => connect::unary(&headers, body, |r| update(t, r)).await,
        other => RpcError::new(
            Code::Unimplemented,
            format!("process.Process/{other} is not a method of this service"),
        )
        .into_response(),
    }
}

async fn start(t: Target, headers: &HeaderMap, req: StartRequest) -> Result<Response, RpcError> {
    let cfg = req.process;
    if cfg.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd must name a program"));
    }
    let limit_ms = process_limit_ms(&t, connect::timeout_ms(headers));
    let keepalive = keepalive(headers);
    if let Some(pty) = req.pty {
        let size = pty.size.unwrap_or_default();
        return start_pty(
            t,
            cfg,
            req.tag,
            size_of(size.cols, size.rows)?,
            limit_ms,
            keepalive,
        )
        .await;
    }
    let m = t.e2b.manager();
    let argv = std::iter::once(cfg.cmd.clone())
        .chain(cfg.args.iter().cloned())
        .collect();
    let exec = ExecRequest {
        cmd: Some(argv),
        env: cfg.envs.clone(),
        cwd: Some(t.user.resolve(cfg.cwd.as_deref().unwrap_or(""))),
        timeout_ms: Some(limit_ms),
        background: true,
        user: Some(t.user.name().into()),
        ..Default::default()
    };
    let exec_id = m.exec_background(&t.who, &t.id, exec).await?;
    // Subscribing before anything else is what guarantees no output is missed.
    let follow = m.follow_exec(&t.who, &t.id, &exec_id).await?;
    if !req.stdin.unwrap_or(false) {
        // envd gives a process without `stdin` an empty, closed one. Failing here only means
        // the process already ended.
        let _ = m
            .exec_stdin(&t.who, &t.id, &exec_id, Bytes::new(), true)
            .await;
    }
    let pid = wait_for_pid(&t, &exec_id, &cfg.cmd).await?;
    lock(&t.ctx.procs).insert(
        pid,
        Proc {
            config: cfg,
            tag: req.tag,
            kind: Kind::Exec(exec_id),
        },
    );
    let (sink, resp) = connect::stream_response();
    tokio::spawn(relay_exec(sink, pid, follow, keepalive, true));
    Ok(resp)
}

/// The exec's pid once the agent reported it started. The manager records it as the first
/// event of the exec arrives (its background API does not return it).
async fn wait_for_pid(t: &Target, exec_id: &str, cmd: &str) -> Result<u32, RpcError> {
    let deadline = tokio::time::Instant::now() + START_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        let st = t.e2b.manager().exec_status(&t.who, &t.id, exec_id).await?;
        if let Some(pid) = st.pid {
            return Ok(pid);
        }
        if st.result.is_some() {
            return Err(RpcError::invalid(format!(
                "{cmd:?} could not be started (no such program, or the working directory does not exist)"
            )));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RpcError::new(
                Code::DeadlineExceeded,
                "the process did not start in time",
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Re-attaches to a process: only what it prints from now on, as envd does.
async fn reconnect(
    t: Target,
    headers: &HeaderMap,
    req: SelectRequest,
) -> Result<Response, RpcError> {
    let keepalive = keepalive(headers);
    let (pid, kind) = find(&t.ctx, &req.process)?;
    let (sink, resp) = connect::stream_response();
    match kind {
        Kind::Exec(exec_id) => {
            let follow = t
                .e2b
                .manager()
                .follow_exec(&t.who, &t.id, &exec_id)
                .await
                .map_err(|_| not_found(pid))?;
            tokio::spawn(relay_exec(sink, pid, follow, keepalive, false));
        }
        Kind::Pty(p) => {
            let rx = p.events.subscribe();
            let exited = lock(&p.exit).clone();
            tokio::spawn(relay_pty(sink, pid, rx, exited, keepalive));
        }
    }
    Ok(resp)
}

async fn list(t: Target) -> Result<Value, RpcError> {
    let snapshot: Vec<(u32, Value, Option<String>, Kind)> = lock(&t.ctx.procs)
        .iter()
        .map(|(pid, p)| (*pid, p.config.to_json(), p.tag.clone(), p.kind.clone()))
        .collect();
    let mut processes = Vec::new();
    for (pid, config, tag, kind) in snapshot {
        let running = match &kind {
            Kind::Exec(exec_id) => t
                .e2b
                .manager()
                .exec_status(&t.who, &t.id, exec_id)
                .await
                .is_ok_and(|s| s.result.is_none()),
            Kind::Pty(p) => lock(&p.exit).is_none(),
        };
        if !running {
            lock(&t.ctx.procs).remove(&pid);
            continue;
        }
        let mut info = json!({"config": config, "pid": pid});
        if let Some(tag) = tag {
            info["tag"] = tag.into();
        }
        processes.push(info);
    }
    processes.sort_by_key(|p| p["pid"].as_u64());
    Ok(json!({ "processes": processes }))
}

async fn send_input(t: Target, req: SendInputRequest) -> Result<Value, RpcError> {
    let (pid, kind) = find(&t.ctx, &req.process)?;
    let (data, _) = req.input.into_parts()?;
    deliver(&t, pid, &kind, data).await?;
    Ok(json!({}))
}

async fn deliver(t: &Target, pid: u32, kind: &Kind, data: Vec<u8>) -> Result<(), RpcError> {
    match kind {
        Kind::Exec(exec_id) => t
            .e2b
            .manager()
            .exec_stdin(&t.who, &t.id, exec_id, Bytes::from(data), false)
            .await
            .map_err(|e| exited_is_not_found(e, pid)),
        Kind::Pty(p) => p.write(&data).await,
    }
}

/// Client streaming: `{start: {process}}`, then `{data: {input}}`s (and keepalives) in order.
async fn stream_input(t: Target, headers: &HeaderMap, body: Body) -> Response {
    if let Err(e) = connect::check_content_type(headers, true) {
        return connect::unsupported_media_type(true, e);
    }
    let mut msgs = MessageStream::new(body);
    let result = async {
        let first: StreamInputRequest = msgs
            .next()
            .await?
            .ok_or_else(|| RpcError::invalid("the input stream is empty"))?;
        let start = first
            .start
            .ok_or_else(|| RpcError::invalid("the first message of an input stream is start"))?;
        let (pid, kind) = find(&t.ctx, &start.process)?;
        while let Some(msg) = msgs.next::<StreamInputRequest>().await? {
            if msg.start.is_some() {
                return Err(RpcError::invalid("an input stream has one start message"));
            }
            if let Some(data) = msg.data {
                let (bytes, _) = data.input.into_parts()?;
                deliver(&t, pid, &kind, bytes).await?;
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            let mut body = connect::message_frame(&json!({})).to_vec();
            body.extend_from_slice(&connect::end_frame(None));
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    connect::STREAM_CONTENT_TYPE,
                )],
                body,
            )
                .into_response()
        }
        Err(e) => connect::stream_error(e),
    }
}

async fn send_signal(t: Target, req: SendSignalRequest) -> Result<Value, RpcError> {
    let signal = req.signal_name()?;
    let (pid, kind) = find(&t.ctx, &req.process)?;
    match kind {
        Kind::Exec(exec_id) => t
            .e2b
            .manager()
            .exec_signal(&t.who, &t.id, &exec_id, signal)
            .await
            .map_err(|e| exited_is_not_found(e, pid))?,
        Kind::Pty(p) => {
            if lock(&p.exit).is_some() {
                return Err(not_found(pid));
            }
            let number = if signal == "SIGKILL" { 9 } else { 15 };
            p.send(ToAgent::Signal(number)).await?;
        }
    }
    Ok(json!({}))
}

async fn close_stdin(t: Target, req: SelectRequest) -> Result<Value, RpcError> {
    let (pid, kind) = find(&t.ctx, &req.process)?;
    match kind {
        Kind::Exec(exec_id) => t
            .e2b
            .manager()
            .exec_stdin(&t.who, &t.id, &exec_id, Bytes::new(), true)
            .await
            .map_err(|e| exited_is_not_found(e, pid))?,
        Kind::Pty(_) => {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                "a terminal has no stdin to close; send Ctrl+D (0x04) instead",
            ))
        }
    }
    Ok(json!({}))
}

async fn update(t: Target, req: UpdateRequest) -> Result<Value, RpcError> {
    let (_, kind) = find(&t.ctx, &req.process)?;
    let Kind::Pty(p) = kind else {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            "only a process started with a pty can be resized",
        ));
    };
    let size = req
        .pty
        .and_then(|p| p.size)
        .ok_or_else(|| RpcError::invalid("update needs pty.size"))?;
    let (cols, rows) = size_of(size.cols, size.rows)?;
    p.send(ToAgent::Resize { cols, rows }).await?;
    Ok(json!({}))
}

fn find(ctx: &SandboxCtx, sel: &ProcessSelector) -> Result<(u32, Kind), RpcError> {
    let procs = lock(&ctx.procs);
    let found = match (sel.pid, &sel.tag) {
        (Some(pid), _) => procs.get(&pid).map(|p| (pid, p.kind.clone())),
        (None, Some(tag)) => procs
            .iter()
            .find(|(_, p)| p.tag.as_deref() == Some(tag))
            .map(|(pid, p)| (*pid, p.kind.clone())),
        (None, None) => return Err(RpcError::invalid("process needs a pid or a tag")),
    };
    found.ok_or_else(|| match (sel.pid, &sel.tag) {
        (Some(pid), _) => not_found(pid),
        (_, tag) => RpcError::new(
            Code::NotFound,
            format!(
                "process with tag {:?} not found",
                tag.as_deref().unwrap_or("")
            ),
        ),
    })
}

fn not_found(pid: u32) -> RpcError {
    RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
}

/// An exec that ended (or was forgotten) is a process that no longer exists, for envd.
fn exited_is_not_found(e: koder_sessions::Error, pid: u32) -> RpcError {
    match e {
        koder_sessions::Error::Conflict(m) if m.contains("exited") => not_found(pid),
        koder_sessions::Error::FileNotFound(_) => not_found(pid),
        other => other.into(),
    }
}

/// The process' time limit: the Start call's deadline, within the server's exec maximum.
fn process_limit_ms(t: &Target, deadline_ms: Option<u64>) -> u64 {
    let max = t.e2b.sessions_cfg().max_exec_timeout_ms;
    deadline_ms.unwrap_or(max).min(max)
}

fn keepalive(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| (1..=3600).contains(s))
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs)
}

fn size_of(cols: u32, rows: u32) -> Result<(u16, u16), RpcError> {
    match (u16::try_from(cols), u16::try_from(rows)) {
        (Ok(c), Ok(r)) if c > 0 && r > 0 => Ok((c, r)),
        _ => Err(RpcError::invalid(
            "pty size needs cols and rows in 1..=65535",
        )),
    }
}

fn start_event(pid: u32) -> Value {
    json!({"event": {"start": {"pid": pid}}})
}

fn keepalive_event() -> Value {
    json!({"event": {"keepalive": {}}})
}

fn data_event(kind: &str, data: &[u8]) -> Value {
    json!({"event": {"data": { kind: b64(data) }}})
}

/// envd's end event: Go's `ProcessState` as `exitCode` (-1 when signalled), `exited`,
/// `status` ("exit status 1", "signal: killed") and an `error` for anything but success.
fn end_event(exit_code: Option<i32>, signal: Option<i32>, why: Option<String>) -> Value {
    let status = match (exit_code, signal) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("signal: {}", signal_text(s)),
        (None, None) => "unknown".to_string(),
    };
    let mut end = json!({
        "exitCode": exit_code.unwrap_or(-1),
        "exited": exit_code.is_some(),
        "status": status,
    });
    if exit_code != Some(0) {
        end["error"] = why.unwrap_or(status).into();
    }
    json!({"event": {"end": end}})
}

/// Go's signal descriptions for the signals processes usually die of.
fn signal_text(sig: i32) -> String {
    match sig {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

fn exec_end(r: &ExecResult) -> (Value, Option<RpcError>) {
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
    (end_event(r.exit_code, r.signal, why), deadline)
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
async fn relay_exec(sink: Sink, pid: u32, follow: Follow, every: Duration, with_past: bool) {
    if !sink.send(&start_event(pid)).await {
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
                    sink.end(Some(stream_lost())).await;
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
                            sink.end(Some(stream_lost())).await;
                            return;
                        }
                    },
                    _ = tick.tick() => {
                        if !sink.send(&keepalive_event()).await {
                            return;
                        }
                        continue;
                    }
                    () = sink.closed() => return,
                }
            }
        };
        let sent = match event {
            ExecEvent::Stdout(b) => sink.send(&data_event("stdout", &b)).await,
            ExecEvent::Stderr(b) => sink.send(&data_event("stderr", &b)).await,
            ExecEvent::Exit(r) => {
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

fn stream_lost() -> RpcError {
    RpcError::new(
        Code::Unavailable,
        "the process' output ended without an exit status (the sandbox went away)",
    )
}

async fn start_pty(
    t: Target,
    cfg: ProcessConfig,
    tag: Option<String>,
    size: (u16, u16),
    limit_ms: u64,
    keepalive: Duration,
) -> Result<Response, RpcError> {
    let argv = pty_argv(t.user, &cfg)?;
    let cwd = t.user.resolve(cfg.cwd.as_deref().unwrap_or(""));
    let stream = t
        .e2b
        .manager()
        .terminal(&t.who, &t.id, argv, Some(cwd), size)
        .await?;
    let (events, rx) = broadcast::channel(PTY_EVENTS);
    let proc = Arc::new(PtyProc {
        input: stream.handle(),
        events,
        exit: Mutex::new(None),
    });
    let (pid_tx, pid_rx) = oneshot::channel();
    tokio::spawn(pump_pty(
        stream,
        proc.clone(),
        t.ctx.clone(),
        pid_tx,
        Duration::from_millis(limit_ms),
    ));
    let pid = match tokio::time::timeout(START_WAIT, pid_rx).await {
        Ok(Ok(Ok(pid))) => pid,
        Ok(Ok(Err(why))) => return Err(RpcError::invalid(why)),
        _ => {
            let _ = proc.send(ToAgent::Signal(9)).await;
            return Err(RpcError::new(
                Code::DeadlineExceeded,
                "the terminal did not start in time",
            ));
        }
    };
    lock(&t.ctx.procs).insert(
        pid,
        Proc {
            config: cfg,
            tag,
            kind: Kind::Pty(proc.clone()),
        },
    );
    let (sink, resp) = connect::stream_response();
    tokio::spawn(relay_pty(sink, pid, rx, None, keepalive));
    Ok(resp)
}

/// The terminal's argv: environment and user are applied by `env` and `setpriv` in front of
/// the command (the manager's terminal takes neither), and a shell reports its pid first.
fn pty_argv(user: User, cfg: &ProcessConfig) -> Result<Vec<String>, RpcError> {
    let mut env = cfg.envs.clone();
    if user == User::User {
        for (k, v) in [
            ("HOME", "/home/user"),
            ("USER", "user"),
            ("LOGNAME", "user"),
        ] {
            env.entry(k.into()).or_insert_with(|| v.into());
        }
    }
    let mut argv = vec!["/usr/bin/env".to_string()];
    for (k, v) in &env {
        let bad_name = k.is_empty() || k.contains(['=', '\0']) || k.starts_with('-');
        if bad_name || v.contains('\0') {
            return Err(RpcError::invalid(format!(
                "environment variable {k:?}: names are non-empty, without '=' or a leading '-', and nothing holds NUL"
            )));
        }
        argv.push(format!("{k}={v}"));
    }
    if user == User::User {
        argv.extend(
            [
                "/usr/bin/setpriv",
                &format!("--reuid={SANDBOX_USER_UID}"),
                &format!("--regid={SANDBOX_USER_UID}"),
                "--init-groups",
                "--",
            ]
            .map(String::from),
        );
    }
    argv.extend(["/bin/bash", "-c", PTY_PID_SCRIPT, "koder-pty"].map(String::from));
    argv.push(cfg.cmd.clone());
    argv.extend(cfg.args.iter().cloned());
    Ok(argv)
}

/// Where the pid report stands in the terminal's first output.
#[derive(Debug, PartialEq, Eq)]
enum PidReport {
    Incomplete,
    Found { pid: u32, rest: usize },
    Missing,
}

fn pid_report(buf: &[u8]) -> PidReport {
    let n = buf.len().min(PTY_PID_OSC.len());
    if buf[..n] != PTY_PID_OSC[..n] {
        return PidReport::Missing;
    }
    if buf.len() <= PTY_PID_OSC.len() {
        return PidReport::Incomplete;
    }
    let digits = &buf[PTY_PID_OSC.len()..];
    match digits.iter().position(|&b| b == 0x07) {
        Some(end) => std::str::from_utf8(&digits[..end])
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .map_or(PidReport::Missing, |pid| PidReport::Found {
                pid,
                rest: PTY_PID_OSC.len() + end + 1,
            }),
        None if digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) => PidReport::Missing,
        None => PidReport::Incomplete,
    }
}

/// Owns the terminal: reads its pid report, fans its output out to followers, kills it at
/// its time limit, and forgets it once it exited.
async fn pump_pty(
    mut stream: AgentStream,
    proc: Arc<PtyProc>,
    ctx: Arc<SandboxCtx>,
    pid_tx: oneshot::Sender<Result<u32, String>>,
    limit: Duration,
) {
    let mut pid_tx = Some(pid_tx);
    let mut pid = None;
    let mut head = Vec::new();
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    let mut killed = false;
    let exit = loop {
        let msg = tokio::select! {
            m = stream.recv() => m,
            () = &mut deadline, if !killed => {
                killed = true;
                let _ = proc.input.send(ToAgent::Signal(9)).await;
                continue;
            }
        };
        match msg {
            Ok(FromAgent::Stdout(data) | FromAgent::Stderr(data)) => {
                if pid.is_some() {
                    let _ = proc.events.send(PtyEvent::Data(Bytes::from(data)));
                    continue;
                }
                head.extend_from_slice(&data);
                match pid_report(&head) {
                    PidReport::Incomplete => {}
                    PidReport::Found { pid: p, rest } => {
                        pid = Some(p);
                        if let Some(tx) = pid_tx.take() {
                            let _ = tx.send(Ok(p));
                        }
                        if rest < head.len() {
                            let _ = proc
                                .events
                                .send(PtyEvent::Data(Bytes::copy_from_slice(&head[rest..])));
                        }
                    }
                    PidReport::Missing => {
                        if let Some(tx) = pid_tx.take() {
                            let shown = String::from_utf8_lossy(&head)
                                .chars()
                                .take(200)
                                .collect::<String>();
                            let _ = tx.send(Err(format!("the terminal failed to start: {shown}")));
                        }
                        let _ = proc.input.send(ToAgent::Signal(9)).await;
                    }
                }
            }
            Ok(FromAgent::Exited(exit)) => break exit,
            Ok(_) => {}
            Err(_) => {
                break ExitInfo {
                    signal: Some(9),
                    ..Default::default()
                }
            }
        }
    };
    if let Some(tx) = pid_tx.take() {
        let shown = String::from_utf8_lossy(&head)
            .chars()
            .take(200)
            .collect::<String>();
        let _ = tx.send(Err(format!(
            "the terminal exited before it started: {shown}"
        )));
    }
    *lock(&proc.exit) = Some(exit.clone());
    let _ = proc.events.send(PtyEvent::Exit(exit));
    if let Some(pid) = pid {
        lock(&ctx.procs).remove(&pid);
    }
}

async fn relay_pty(
    sink: Sink,
    pid: u32,
    mut rx: broadcast::Receiver<PtyEvent>,
    exited: Option<ExitInfo>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_follow_gos_process_state() {
        let ok = end_event(Some(0), None, None);
        assert_eq!(
            ok,
            json!({"event": {"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}}})
        );
        let failed = end_event(Some(3), None, None);
        assert_eq!(failed["event"]["end"]["error"], "exit status 3");
        let killed = end_event(None, Some(9), Some("SANDBOX-EXEC-KILLED: killed".into()));
        assert_eq!(killed["event"]["end"]["exitCode"], -1);
        assert_eq!(killed["event"]["end"]["exited"], false);
        assert_eq!(killed["event"]["end"]["status"], "signal: killed");
        assert_eq!(
            killed["event"]["end"]["error"],
            "SANDBOX-EXEC-KILLED: killed"
        );
    }

    #[test]
    fn data_events_are_base64_in_a_oneof() {
        assert_eq!(
            data_event("stdout", b"hi\n"),
            json!({"event": {"data": {"stdout": "aGkK"}}})
        );
    }

    #[test]
    fn terminal_pid_reports() {
        assert_eq!(pid_report(b"\x1b]77"), PidReport::Incomplete);
        assert_eq!(pid_report(b"\x1b]7771;12"), PidReport::Incomplete);
        assert_eq!(
            pid_report(b"\x1b]7771;123\x07$ "),
            PidReport::Found { pid: 123, rest: 11 }
        );
        assert_eq!(pid_report(b"setpriv: failed"), PidReport::Missing);
        assert_eq!(pid_report(b"\x1b]7771;12x"), PidReport::Missing);
        assert_eq!(pid_report(b"\x1b]7771;99999999999\x07"), PidReport::Missing);
    }

    #[test]
    fn terminal_argv_applies_env_and_user() {
        let cfg = ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-i".into(), "-l".into()],
            envs: [("TERM".to_string(), "xterm".to_string())].into(),
            cwd: None,
        };
        let argv = pty_argv(User::User, &cfg).unwrap();
        assert_eq!(argv[0], "/usr/bin/env");
        assert!(argv.contains(&"TERM=xterm".to_string()));
        assert!(argv.contains(&"HOME=/home/user".to_string()));
        assert!(argv.contains(&"--reuid=1000".to_string()));
        assert_eq!(&argv[argv.len() - 3..], ["/bin/bash", "-i", "-l"]);
        let root = pty_argv(User::Root, &cfg).unwrap();
        assert!(!root.iter().any(|a| a.contains("setpriv")));
        let mut bad = cfg.clone();
        bad.envs.insert("-u".into(), "x".into());
        assert!(pty_argv(User::Root, &bad).is_err());
    }
}
