//! envd's `process.Process` service over the session manager.
//!
//! A process is a background exec (output buffered by the manager, stdin kept open), so it
//! outlives the stream that started it, as in envd: the stream can be left and re-joined with
//! `Connect`. Its time limit is the Start call's `connect-timeout-ms` (envd kills the process
//! at that deadline); without one, the server's maximum exec time. A process with `pty` runs on
//! the manager's terminal.

mod events;
mod exec;
mod pty;
pub mod table;

use std::time::Duration;

use axum::body::Body;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::auth::Target;
use super::sandbox::SandboxCtx;
use crate::connect::{self, Code, MessageStream, RpcError};
use crate::proto::process::{
    process_input::Input, process_selector::Selector, stream_input_request, CloseStdinRequest,
    CloseStdinResponse, ConnectRequest, ListRequest, ListResponse, ProcessInfo, ProcessInput,
    ProcessSelector, SendInputRequest, SendInputResponse, SendSignalRequest, SendSignalResponse,
    Signal, StartRequest, StreamInputRequest, StreamInputResponse, UpdateRequest, UpdateResponse,
};
use stream_input_request::Event;
use table::{not_found, Kind, SIGKILL, SIGTERM};

/// Keepalive period when the client names none (`Keepalive-Ping-Interval`, seconds).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);

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
            connect::server_stream(&headers, body, |r: ConnectRequest| {
                reconnect(t, &headers, r)
            })
            .await
        }
        "List" => connect::unary(&headers, body, |_: ListRequest| list(t)).await,
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
    let cfg = req.process.unwrap_or_default();
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
    req: ConnectRequest,
) -> Result<Response, RpcError> {
    let keepalive = keepalive(headers);
    let (pid, kind) = find(&t.ctx, req.process.as_ref())?;
    let (sink, resp) = connect::stream_response();
    match kind {
        Kind::Exec(exec_id) => {
            let follow = t
                .e2b
                .manager()
                .follow_exec(&t.who, &t.id, &exec_id)
                .await
                .map_err(|_| not_found(pid))?;
            let owner = exec::Owner::of(&t, &exec_id);
            tokio::spawn(exec::relay(sink, pid, follow, owner, keepalive, false));
        }
        Kind::Pty(p) => pty::follow(&p, sink, pid, keepalive),
    }
    Ok(resp)
}

async fn list(t: Target) -> Result<ListResponse, RpcError> {
    let snapshot: Vec<(ProcessInfo, Kind)> = t
        .ctx
        .procs
        .lock()
        .iter()
        .map(|(pid, p)| {
            let info = ProcessInfo {
                config: Some(p.config.clone()),
                pid: *pid,
                tag: p.tag.clone(),
            };
            (info, p.kind.clone())
        })
        .collect();
    let mut processes = Vec::new();
    for (info, kind) in snapshot {
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
            t.ctx.procs.lock().remove(&info.pid);
            continue;
        }
        processes.push(info);
    }
    processes.sort_by_key(|p| p.pid);
    Ok(ListResponse { processes })
}

async fn send_input(t: Target, req: SendInputRequest) -> Result<SendInputResponse, RpcError> {
    let (pid, kind) = find(&t.ctx, req.process.as_ref())?;
    deliver(&t, pid, &kind, input_bytes(req.input)?).await?;
    Ok(SendInputResponse {})
}

/// The bytes of an input, whether meant for stdin or a terminal (envd does not tell them
/// apart either).
fn input_bytes(input: Option<ProcessInput>) -> Result<Vec<u8>, RpcError> {
    match input.and_then(|i| i.input) {
        Some(Input::Stdin(data) | Input::Pty(data)) => Ok(data),
        None => Err(RpcError::invalid("input needs one of stdin or pty")),
    }
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
        let Some(Event::Start(start)) = first.event else {
            return Err(RpcError::invalid(
                "the first message of an input stream is start",
            ));
        };
        let (pid, kind) = find(&t.ctx, start.process.as_ref())?;
        while let Some(msg) = msgs.next::<StreamInputRequest>().await? {
            match msg.event {
                Some(Event::Start(_)) => {
                    return Err(RpcError::invalid("an input stream has one start message"))
                }
                Some(Event::Data(data)) => {
                    deliver(&t, pid, &kind, input_bytes(data.input)?).await?;
                }
                Some(Event::Keepalive(_)) | None => {}
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            let mut body = connect::message_frame(&StreamInputResponse {}).to_vec();
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

async fn send_signal(t: Target, req: SendSignalRequest) -> Result<SendSignalResponse, RpcError> {
    let signal = match Signal::try_from(req.signal) {
        Ok(Signal::Sigkill) => "SIGKILL",
        Ok(Signal::Sigterm) => "SIGTERM",
        _ => {
            return Err(RpcError::invalid(
                "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM",
            ))
        }
    };
    let (pid, kind) = find(&t.ctx, req.process.as_ref())?;
    match kind {
        Kind::Exec(exec_id) => t
            .e2b
            .manager()
            .exec_signal(&t.who, &t.id, &exec_id, signal)
            .await
            .map_err(|e| exited_is_not_found(e, pid))?,
        Kind::Pty(p) => {
            let number = if signal == "SIGKILL" {
                SIGKILL
            } else {
                SIGTERM
            };
            p.signal(pid, number).await?;
        }
    }
    Ok(SendSignalResponse {})
}

async fn close_stdin(t: Target, req: CloseStdinRequest) -> Result<CloseStdinResponse, RpcError> {
    let (pid, kind) = find(&t.ctx, req.process.as_ref())?;
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
    Ok(CloseStdinResponse {})
}

async fn update(t: Target, req: UpdateRequest) -> Result<UpdateResponse, RpcError> {
    let (_, kind) = find(&t.ctx, req.process.as_ref())?;
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
    Ok(UpdateResponse {})
}

fn find(ctx: &SandboxCtx, sel: Option<&ProcessSelector>) -> Result<(u32, Kind), RpcError> {
    let procs = ctx.procs.lock();
    match sel.and_then(|s| s.selector.as_ref()) {
        Some(Selector::Pid(pid)) => procs
            .get(pid)
            .map(|p| (*pid, p.kind.clone()))
            .ok_or_else(|| not_found(*pid)),
        Some(Selector::Tag(tag)) => procs
            .iter()
            .find(|(_, p)| p.tag.as_deref() == Some(tag))
            .map(|(pid, p)| (*pid, p.kind.clone()))
            .ok_or_else(|| {
                RpcError::new(
                    Code::NotFound,
                    format!("process with tag {tag:?} not found"),
                )
            }),
        None => Err(RpcError::invalid("process needs a pid or a tag")),
    }
}

/// An exec that ended (or was forgotten) is a process that no longer exists, for envd.
fn exited_is_not_found(e: koder_sessions::Error, pid: u32) -> RpcError {
    match e {
        koder_sessions::Error::ExecExited | koder_sessions::Error::FileNotFound(_) => {
            not_found(pid)
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::parse;
    use crate::proto::process::{pty, SendSignalRequest};

    #[test]
    fn start_request_in_the_sdk_shape() {
        let raw = br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false,"pty":{"size":{"cols":80,"rows":"24"}},"futureField":1}"#;
        let r: StartRequest = parse(raw).unwrap();
        let cfg = r.process.unwrap();
        assert_eq!(cfg.args, ["-l", "-c", "echo hi"]);
        assert_eq!(cfg.envs["A"], "1");
        assert_eq!(cfg.cwd.as_deref(), Some("/tmp"));
        assert_eq!(r.stdin, Some(false));
        let size = r.pty.unwrap().size.unwrap();
        assert_eq!(size, pty::Size { cols: 80, rows: 24 });
    }

    #[test]
    fn selectors_and_inputs() {
        let r: SendInputRequest =
            parse(br#"{"process":{"pid":"42"},"input":{"stdin":"aGkK"}}"#).unwrap();
        assert_eq!(r.process.unwrap().selector, Some(Selector::Pid(42)));
        assert_eq!(input_bytes(r.input).unwrap(), b"hi\n");
        // URL-safe and unpadded base64 are protobuf JSON too.
        let r: SendInputRequest = parse(br#"{"input":{"pty":"aGk_Pz4-"}}"#).unwrap();
        assert_eq!(input_bytes(r.input).unwrap(), b"hi??>>");
        let r: SendInputRequest = parse(br#"{"input":{"stdin":"aA"}}"#).unwrap();
        assert_eq!(input_bytes(r.input).unwrap(), b"h");
        let r: SendInputRequest = parse(br#"{"process":{"tag":"t"},"input":{}}"#).unwrap();
        assert_eq!(r.process.unwrap().selector, Some(Selector::Tag("t".into())));
        assert!(input_bytes(r.input).is_err());
        for bad in [
            r#"{"input":{"stdin":"***"}}"#,
            r#"{"input":{"stdin":"aGkK","pty":"aGkK"}}"#,
            r#"{"process":{"pid":-1}}"#,
            r#"{"process":{"pid":99999999999}}"#,
        ] {
            assert!(parse::<SendInputRequest>(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn signals_by_name_or_number() {
        for (raw, want) in [
            (r#""SIGNAL_SIGKILL""#, Some(Signal::Sigkill)),
            ("15", Some(Signal::Sigterm)),
            (r#""SIGNAL_UNSPECIFIED""#, Some(Signal::Unspecified)),
            ("7", None),
            (r#""SIGHUP""#, None),
        ] {
            let r = parse::<SendSignalRequest>(format!(r#"{{"signal":{raw}}}"#).as_bytes());
            assert_eq!(r.ok().map(|r| r.signal()), want, "{raw}");
        }
    }

    #[test]
    fn input_streams_are_oneofs() {
        let r: StreamInputRequest = parse(br#"{"start":{"process":{"pid":7}}}"#).unwrap();
        assert!(matches!(r.event, Some(Event::Start(_))));
        let r: StreamInputRequest = parse(br#"{"keepalive":{}}"#).unwrap();
        assert!(matches!(r.event, Some(Event::Keepalive(_))));
    }
}
