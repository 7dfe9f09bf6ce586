//! `GET .../terminal`: a WebSocket onto a PTY in the sandbox. Binary frames carry the
//! terminal's bytes both ways; text frames carry JSON control (`resize` in, `exit` out).

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use koder_sessions::{Terminal, TerminalEvent, TerminalSpec};
use serde::Deserialize;
use serde_json::json;

use crate::error::ApiError;
use crate::extract::{Caller, Path, Query};
use crate::gate::HeldStream;
use crate::AppState;

/// Terminal size before the client's first resize.
const DEFAULT_SIZE: (u16, u16) = (80, 24);

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Control {
    Resize { cols: u16, rows: u16 },
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/terminal", tag = "live",
    description = "A browser, which cannot set headers on a WebSocket, may offer its key as the subprotocol `koder.bearer.<base64url key>` beside `koder.terminal.v1` (selected in the answer) instead of the Authorization header.",
    params(("id" = String, Path),
           ("cmd" = Option<String>, Query, description = "program to run instead of the login shell (exec'd directly, never through a shell)"),
           ("arg" = Option<Vec<String>>, Query, description = "its arguments, in order; repeatable"),
           ("cols" = Option<u16>, Query), ("rows" = Option<u16>, Query), ("cwd" = Option<String>, Query)),
    responses((status = 101, description = "WebSocket: binary frames = terminal bytes; text frames = JSON control"),
              (status = 400, body = koder_api_types::ErrorBody), (status = 404, body = koder_api_types::ErrorBody)),
    security(("bearer" = [])))]
pub async fn terminal(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
    held: HeldStream,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let mut cmd = None;
    let mut args = Vec::new();
    let (mut cols, mut rows) = DEFAULT_SIZE;
    let mut cwd = None;
    let number = |k: &str, v: &str| {
        v.parse::<u16>()
            .map_err(|_| ApiError::invalid(format!("{k} must be 1..65535")))
    };
    for (k, v) in params {
        match k.as_str() {
            "cmd" => cmd = Some(v),
            "arg" => args.push(v),
            "cols" => cols = number(&k, &v)?,
            "rows" => rows = number(&k, &v)?,
            "cwd" => cwd = Some(v),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?}"
                )))
            }
        }
    }
    let argv = match cmd {
        Some(c) => std::iter::once(c).chain(args).collect(),
        None if args.is_empty() => Vec::new(),
        None => return Err(ApiError::invalid("arg needs cmd")),
    };
    s.manager.get(&who, &id).await?;
    let ws = crate::extract::websocket(ws)?.protocols([crate::credentials::TERMINAL_PROTOCOL]);
    // The process starts before the upgrade, so a bad command is a plain HTTP error.
    let spec = TerminalSpec {
        argv,
        cwd,
        cols,
        rows,
        ..Default::default()
    };
    let term = s.manager.terminal(&who, &id, spec).await?;
    Ok(ws.on_upgrade(move |socket| held.during(bridge(socket, term))))
}

async fn bridge(mut socket: WebSocket, mut term: Terminal) {
    let input = term.input();
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Binary(data))) => {
                    if input.write(&data).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<Control>(&text) {
                    Ok(Control::Resize { cols, rows }) => {
                        let _ = input.resize(cols, rows).await;
                    }
                    Err(e) => {
                        let err = json!({"type": "error", "message": format!("bad control message: {e}")});
                        let _ = socket.send(Message::Text(err.to_string().into())).await;
                    }
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                // Client gone: dropping the stream kills the terminal's process.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
            },
            event = term.next() => match event {
                TerminalEvent::Output(data) => {
                    if socket.send(Message::Binary(data)).await.is_err() {
                        return;
                    }
                }
                TerminalEvent::Exit { exit_code, signal } => {
                    let msg = json!({"type": "exit", "exit_code": exit_code, "signal": signal});
                    let _ = socket.send(Message::Text(msg.to_string().into())).await;
                    let _ = socket.send(Message::Close(Some(CloseFrame { code: 1000, reason: "exited".into() }))).await;
                    return;
                }
                TerminalEvent::Lost(why) => {
                    let msg = json!({"type": "error", "message": why});
                    let _ = socket.send(Message::Text(msg.to_string().into())).await;
                    let _ = socket.send(Message::Close(Some(CloseFrame { code: 1011, reason: "sandbox error".into() }))).await;
                    return;
                }
            }
        }
    }
}
