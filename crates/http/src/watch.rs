//! `GET .../fs/watch` (WebSocket): file events from inotify in the sandbox, as JSON text frames
//! `{"type": "created"|"modified"|"deleted"|"renamed", "path", "at", "from"?}`.

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use chrono::Utc;
use koder_sessions::{FsEventKind, Watch};
use serde::Deserialize;
use serde_json::json;

use crate::error::ApiError;
use crate::extract::{Caller, Path, Query};
use crate::gate::HeldStream;
use crate::AppState;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// Directory to watch (inside the sandbox).
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/fs/watch", tag = "live",
    params(("id" = String, Path), WatchQuery),
    responses((status = 101, description = "WebSocket of JSON file events"),
              (status = 400, body = koder_api_types::ErrorBody), (status = 404, body = koder_api_types::ErrorBody),
              (status = 409, body = koder_api_types::ErrorBody)),
    security(("bearer" = [])))]
pub async fn watch(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
    held: HeldStream,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    // Watching starts before the upgrade: a missing directory is a plain HTTP error.
    s.manager.get(&who, &id).await?;
    let ws = crate::extract::websocket(ws)?;
    let watch = s.manager.watch(&who, &id, &q.path, q.recursive).await?;
    Ok(ws.on_upgrade(move |socket| held.during(relay(socket, watch))))
}

async fn relay(mut socket: WebSocket, mut watch: Watch) {
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
            event = watch.next() => match event {
                Ok(ev) => {
                    let kind = match ev.kind {
                        FsEventKind::Created => "created",
                        FsEventKind::Modified => "modified",
                        FsEventKind::Deleted => "deleted",
                        FsEventKind::Renamed => "renamed",
                    };
                    let mut msg = json!({"type": kind, "path": ev.path, "at": Utc::now()});
                    if let Some(from) = ev.from {
                        msg["from"] = from.into();
                    }
                    if socket.send(Message::Text(msg.to_string().into())).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let msg = json!({"type": "error", "message": e.to_string()});
                    let _ = socket.send(Message::Text(msg.to_string().into())).await;
                    let _ = socket.send(Message::Close(Some(CloseFrame { code: 1011, reason: "watch ended".into() }))).await;
                    return;
                }
            }
        }
    }
}
