//! Live exec output: SSE streams of followed execs, background exec control, the error ring.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use base64::Engine as _;
use bytes::Bytes;
use futures::Stream;
use koder_api_types::{
    ErrorBody, ErrorEntry, ErrorList, ExecList, ExecResult, ExecStatus, ReportError, SignalRequest,
};
use koder_sessions::execs::{CancelOnDrop, ExecEvent, Follow};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::error::ApiError;
use crate::extract::{Caller, Json, Path, Query};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Turns exec events into SSE: `start`, `stdout`/`stderr` (`data`, or `data_b64` for bytes
/// that are not UTF-8), `truncated` when this follower fell behind, and a final `exit`.
pub fn sse(follow: Follow) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let state = Relay {
        start: Some(follow.exec_id),
        replay: follow.replay.into_iter(),
        live: follow.live,
        stdout: Utf8Splitter::default(),
        stderr: Utf8Splitter::default(),
        pending: Vec::new(),
        done: false,
        _guard: follow.cancel_on_drop,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        let event = st.next_event().await?;
        Some((Ok(event), st))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

struct Relay {
    start: Option<String>,
    replay: std::vec::IntoIter<ExecEvent>,
    live: Option<tokio::sync::broadcast::Receiver<ExecEvent>>,
    stdout: Utf8Splitter,
    stderr: Utf8Splitter,
    /// Events produced by one input that still have to go out.
    pending: Vec<Event>,
    done: bool,
    /// Kills a foreground exec when the client goes away before it ends.
    _guard: Option<CancelOnDrop>,
}

impl Relay {
    async fn next_event(&mut self) -> Option<Event> {
        if let Some(id) = self.start.take() {
            return Some(json_event("start", json!({ "exec_id": id })));
        }
        loop {
            if !self.pending.is_empty() {
                return Some(self.pending.remove(0));
            }
            if self.done {
                return None;
            }
            let next = match self.replay.next() {
                Some(e) => Some(e),
                None => match self.live.as_mut() {
                    Some(rx) => match rx.recv().await {
                        Ok(e) => Some(e),
                        Err(RecvError::Lagged(n)) => {
                            self.pending
                                .push(json_event("truncated", json!({ "dropped_chunks": n })));
                            None
                        }
                        Err(RecvError::Closed) => {
                            self.done = true;
                            None
                        }
                    },
                    None => {
                        self.done = true;
                        None
                    }
                },
            };
            match next {
                Some(ExecEvent::Stdout(b)) => self
                    .pending
                    .extend(self.stdout.push(&b).map(|v| json_event("stdout", v))),
                Some(ExecEvent::Stderr(b)) => self
                    .pending
                    .extend(self.stderr.push(&b).map(|v| json_event("stderr", v))),
                Some(ExecEvent::Exit(result)) => {
                    self.pending
                        .extend(self.stdout.flush().map(|v| json_event("stdout", v)));
                    self.pending
                        .extend(self.stderr.flush().map(|v| json_event("stderr", v)));
                    self.pending.push(json_event("exit", exit_payload(&result)));
                    self.done = true;
                }
                None => {}
            }
        }
    }
}

/// Whether the client asked for Server-Sent Events.
pub(crate) fn wants_sse(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

pub(crate) fn json_event(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// The result without its output (which the stream already carried).
fn exit_payload(r: &ExecResult) -> Value {
    without_output(r)
}

/// A result as JSON without `stdout`/`stderr`, for the closing event of a stream that carried them.
pub(crate) fn without_output(r: &impl serde::Serialize) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("stdout");
        obj.remove("stderr");
    }
    v
}

/// Splits a byte stream into UTF-8 text events without breaking a character across two
/// chunks; bytes that are not UTF-8 go out base64-encoded.
#[derive(Default)]
struct Utf8Splitter {
    pending: Vec<u8>,
}

impl Utf8Splitter {
    fn push(&mut self, data: &[u8]) -> Option<Value> {
        self.pending.extend_from_slice(data);
        match std::str::from_utf8(&self.pending) {
            Ok(text) => {
                let v = json!({ "data": text });
                self.pending.clear();
                Some(v)
            }
            // An incomplete character at the end: send what is complete, keep the rest.
            Err(e) if e.error_len().is_none() => {
                let valid = e.valid_up_to();
                if valid == 0 {
                    return None;
                }
                let rest = self.pending.split_off(valid);
                let text = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending = rest;
                Some(json!({ "data": text }))
            }
            Err(_) => Some(
                json!({ "data_b64": base64::engine::general_purpose::STANDARD.encode(std::mem::take(&mut self.pending)) }),
            ),
        }
    }

    fn flush(&mut self) -> Option<Value> {
        (!self.pending.is_empty()).then(|| {
            json!({ "data_b64": base64::engine::general_purpose::STANDARD.encode(std::mem::take(&mut self.pending)) })
        })
    }
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/execs", tag = "exec",
    params(("id" = String, Path)),
    responses((status = 200, body = ExecList), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_execs(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<ExecList>> {
    Ok(axum::Json(ExecList {
        execs: s.manager.list_execs(&who, &id).await?,
    }))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/execs/{exec_id}", tag = "exec",
    params(("id" = String, Path), ("exec_id" = String, Path)),
    responses((status = 200, body = ExecStatus), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn exec_status(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path((id, exec_id)): Path<(String, String)>,
) -> ApiResult<axum::Json<ExecStatus>> {
    Ok(axum::Json(
        s.manager.exec_status(&who, &id, &exec_id).await?,
    ))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/execs/{exec_id}/stream", tag = "exec",
    params(("id" = String, Path), ("exec_id" = String, Path)),
    responses((status = 200, content_type = "text/event-stream", description = "replay, then live events"),
              (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn exec_stream(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path((id, exec_id)): Path<(String, String)>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    Ok(sse(s.manager.follow_exec(&who, &id, &exec_id).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct StdinQuery {
    /// Close stdin after writing the body.
    #[serde(default)]
    close: bool,
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/execs/{exec_id}/stdin", tag = "exec",
    params(("id" = String, Path), ("exec_id" = String, Path), StdinQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn exec_stdin(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path((id, exec_id)): Path<(String, String)>,
    Query(q): Query<StdinQuery>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> ApiResult<StatusCode> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                413,
                koder_api_types::codes::PAYLOAD_TOO_LARGE,
                "stdin writes are limited to 1 MiB per request",
            )
        } else {
            ApiError::invalid(e.body_text())
        }
    })?;
    s.manager
        .exec_stdin(&who, &id, &exec_id, body, q.close)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/execs/{exec_id}/signal", tag = "exec",
    params(("id" = String, Path), ("exec_id" = String, Path)), request_body = SignalRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn exec_signal(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path((id, exec_id)): Path<(String, String)>,
    Json(req): Json<SignalRequest>,
) -> ApiResult<StatusCode> {
    s.manager
        .exec_signal(&who, &id, &exec_id, &req.signal)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/errors", tag = "sessions",
    params(("id" = String, Path)), request_body = ReportError,
    responses((status = 201, body = ErrorEntry), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn report_error(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Json(req): Json<ReportError>,
) -> ApiResult<(StatusCode, axum::Json<ErrorEntry>)> {
    Ok((
        StatusCode::CREATED,
        axum::Json(s.manager.report_error(&who, &id, req)?),
    ))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/errors", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = ErrorList), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_errors(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<ErrorList>> {
    Ok(axum::Json(ErrorList {
        errors: s.manager.errors(&who, &id)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_chunks_is_rejoined() {
        let mut s = Utf8Splitter::default();
        let text = "héllo wörld";
        let bytes = text.as_bytes();
        let cut = 2; // inside 'é'
        assert_eq!(s.push(&bytes[..cut]).unwrap()["data"], "h");
        assert_eq!(s.push(&bytes[cut..]).unwrap()["data"], "éllo wörld");
        assert!(s.flush().is_none());
    }

    #[test]
    fn invalid_bytes_go_out_as_base64() {
        let mut s = Utf8Splitter::default();
        let v = s.push(&[0xff, 0xfe, b'a']).unwrap();
        assert_eq!(v["data_b64"], "//5h");
        // A dangling partial character at the end of the stream is flushed as base64.
        assert!(s.push(&[0xc3]).is_none());
        assert_eq!(s.flush().unwrap()["data_b64"], "ww==");
    }
}
