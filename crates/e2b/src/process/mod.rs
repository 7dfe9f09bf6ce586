//! envd's `process.Process` service over the session manager.
//!
//! A process is a background exec (output buffered by the manager, stdin kept open), so it
//! outlives the stream that started it, as in envd: the stream can be left and re-joined with
//! `Connect`. Its time limit is the Start call's `connect-timeout-ms` (envd kills the process
//! at that deadline); without one, the server's maximum exec time. A process with `pty` runs on
//! the manager's terminal.

mod exec;
mod pty;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};

use crate::connect::{self, Code, MessageStream, RpcError};
use crate::envd::{SandboxCtx, Target};
use crate::proto::{
    b64, ProcessConfig, ProcessSelector, SelectRequest, SendInputRequest, SendSignalRequest,
    StartRequest, StreamInputRequest, UpdateRequest,
};

/// Keepalive period when the client names none (`Keepalive-Ping-Interval`, seconds).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);

/// A process started through E2B.
pub struct Proc {
    pub config: ProcessConfig,
    pub tag: Option<String>,
    pub kind: Kind,
}

#[derive(Clone)]
pub enum Kind {
    Exec(String),
    Pty(Arc<pty::PtyProc>),
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
    match req.pty {
        Some(pty) => {
            let size = pty.size.unwrap_or_default();
            let size = size_of(size.cols, size.rows)?;
            pty::start(t, cfg, req.tag, size, limit_ms, keepalive).await
        }
        None => {
            let stdin = req.stdin.unwrap_or(false);
            exec::start(t, cfg, req.tag, stdin, limit_ms, keepalive).await
        }
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
            tokio::spawn(exec::relay(sink, pid, follow, keepalive, false));
        }
        Kind::Pty(p) => p.follow(sink, pid, keepalive),
    }
    Ok(resp)
}

async fn list(t: Target) -> Result<Value, RpcError> {
    let snapshot: Vec<(u32, Value, Option<String>, Kind)> = t
        .ctx
        .procs
        .lock()
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
            Kind::Pty(p) => p.running(),
        };
        if !running {
            t.ctx.procs.lock().remove(&pid);
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
            let number = if signal == "SIGKILL" { 9 } else { 15 };
            p.signal(pid, number).await?;
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
    p.resize(cols, rows).await?;
    Ok(json!({}))
}

fn find(ctx: &SandboxCtx, sel: &ProcessSelector) -> Result<(u32, Kind), RpcError> {
    let procs = ctx.procs.lock();
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

fn stream_lost() -> RpcError {
    RpcError::new(
        Code::Unavailable,
        "the process' output ended without an exit status (the sandbox went away)",
    )
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
}
