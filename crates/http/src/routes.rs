//! Handlers: each one authenticates, parses, calls the session manager and shapes the answer.
//! No business logic lives here.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use koder_api_types::{
    CreateSession, ErrorBody, ExecRequest, ExecResult, ExecStarted, FileEntry, FileList,
    KilledProcesses, MakeDir, MoveFile, Session, SessionEventList, SessionList, SessionMetrics,
    SetTimeout,
};
use koder_sessions::LaterStdin;
use serde::Deserialize;

use crate::error::ApiError;
use crate::extract::{Caller, Json, Path, Query};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

#[utoipa::path(post, path = "/v1/sandbox/sessions", tag = "sessions",
    request_body = CreateSession,
    responses((status = 201, body = Session), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody, description = "`from_snapshot` names no snapshot of this tenant"),
              (status = 409, body = ErrorBody, description = "SANDBOX-VOLUME-BUSY: a volume asked for read-write is mounted read-write by another session; SANDBOX-CONFLICT: in a cluster, the volumes asked for live on two nodes"),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
              (status = 429, body = ErrorBody),
              (status = 501, body = ErrorBody, description = "volumes asked for on a Firecracker microVM (no file-share device), or on a server without volumes"),
              (status = 503, body = ErrorBody, description = "SANDBOX-RUNTIME-UNAVAILABLE-001 (the runtime asked for is not available here), or SANDBOX-IMAGE-NOT-READY: the image's ready command did not pass within its timeout (the sandbox was destroyed)")),
    security(("bearer" = [])))]
pub async fn create_session(
    State(s): State<AppState>,
    Caller(who): Caller,
    Json(req): Json<CreateSession>,
) -> ApiResult<(StatusCode, axum::Json<Session>)> {
    let session = s.manager.create(&who, req).await?;
    Ok((StatusCode::CREATED, axum::Json(session)))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions", tag = "sessions",
    responses((status = 200, body = SessionList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_sessions(
    State(s): State<AppState>,
    Caller(who): Caller,
) -> ApiResult<axum::Json<SessionList>> {
    Ok(axum::Json(SessionList {
        sessions: s.manager.list(&who).await?,
    }))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = Session), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_session(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Session>> {
    Ok(axum::Json(s.manager.get(&who, &id).await?))
}

/// Ends the session: answers once all its processes have exited (on jails the rest of the
/// teardown finishes just after; with volumes, before the answer).
#[utoipa::path(delete, path = "/v1/sandbox/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_session(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    s.manager.destroy(&who, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/timeout", tag = "sessions",
    params(("id" = String, Path)), request_body = SetTimeout,
    responses((status = 200, body = Session), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody),
              (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set_timeout(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Json(req): Json<SetTimeout>,
) -> ApiResult<axum::Json<Session>> {
    Ok(axum::Json(
        s.manager.set_timeout(&who, &id, req.timeout_s).await?,
    ))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/exec", tag = "exec",
    params(("id" = String, Path)), request_body = ExecRequest,
    // One 200 with both bodies: two 200 entries would leave only the last in the spec.
    responses((status = 200, description = "the result, or with Accept: text/event-stream the start, stdout, stderr and exit events",
               content((ExecResult = "application/json"), (String = "text/event-stream"))),
              (status = 202, body = ExecStarted, description = "background: true"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn exec(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ExecRequest>,
) -> ApiResult<Response> {
    if req.background {
        let exec_id = s
            .manager
            .exec_background(&who, &id, req, LaterStdin::Open)
            .await?
            .exec_id;
        return Ok((StatusCode::ACCEPTED, axum::Json(ExecStarted { exec_id })).into_response());
    }
    if crate::live::wants_sse(&headers) {
        let follow = s.manager.exec_streamed(&who, &id, req).await?;
        return Ok(crate::live::sse(follow).into_response());
    }
    Ok(axum::Json(s.manager.exec(&who, &id, req).await?).into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// Path inside the sandbox, at most 4096 bytes; relative paths are below /workspace.
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\x00]*$")]
    path: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\x00]*$")]
    path: String,
    /// Levels below `path` (default 1).
    #[serde(default = "one")]
    #[param(minimum = 1, maximum = 32)]
    depth: u32,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\x00]*$")]
    path: String,
    #[serde(default)]
    recursive: bool,
}

fn one() -> u32 {
    1
}

#[utoipa::path(put, path = "/v1/sandbox/sessions/{id}/files", tag = "files",
    params(("id" = String, Path), PathQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = FileEntry), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody), (status = 413, body = ErrorBody),
              (status = 507, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn upload(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<FileEntry>)> {
    let declared = crate::declared_length(&headers);
    let entry = s
        .manager
        .upload(&who, &id, &q.path, declared, body.into_data_stream(), None)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(entry)))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/files", tag = "files",
    params(("id" = String, Path), PathQuery),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn download(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Response> {
    let reader = s.manager.download(&who, &id, &q.path).await?;
    let stream = futures::stream::unfold(reader, |mut r| async move {
        match r.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(bytes::Bytes::from(chunk)), r)),
            Ok(None) => None,
            // The status line is gone already: failing the body makes the client see a broken
            // transfer instead of a silently short file.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), r)),
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/files/list", tag = "files",
    params(("id" = String, Path), ListQuery),
    responses((status = 200, body = FileList), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_files(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<axum::Json<FileList>> {
    Ok(axum::Json(
        s.manager.list_files(&who, &id, &q.path, q.depth).await?,
    ))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/files/stat", tag = "files",
    description = "The entry of one path (a symlink is described, not followed).",
    params(("id" = String, Path), PathQuery),
    responses((status = 200, body = FileEntry), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn stat_file(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<axum::Json<FileEntry>> {
    Ok(axum::Json(s.manager.stat_file(&who, &id, &q.path).await?))
}

#[utoipa::path(delete, path = "/v1/sandbox/sessions/{id}/files", tag = "files",
    params(("id" = String, Path), RemoveQuery),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn remove_file(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Query(q): Query<RemoveQuery>,
) -> ApiResult<StatusCode> {
    s.manager
        .remove_file(&who, &id, &q.path, q.recursive)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path)), request_body = MakeDir,
    responses((status = 201, body = FileEntry), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn make_dir(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Json(req): Json<MakeDir>,
) -> ApiResult<(StatusCode, axum::Json<FileEntry>)> {
    Ok((
        StatusCode::CREATED,
        axum::Json(s.manager.make_dir(&who, &id, &req.path, None).await?),
    ))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/files/move", tag = "files",
    params(("id" = String, Path)), request_body = MoveFile,
    responses((status = 200, body = FileEntry), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn move_file(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Json(req): Json<MoveFile>,
) -> ApiResult<axum::Json<FileEntry>> {
    Ok(axum::Json(
        s.manager.move_file(&who, &id, &req.from, &req.to).await?,
    ))
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/metrics", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionMetrics), (status = 404, body = ErrorBody), (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn session_metrics(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<SessionMetrics>> {
    Ok(axum::Json(s.manager.metrics_of(&who, &id).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Events numbered above this `seq` (default 0: from the oldest kept).
    after: Option<u64>,
    /// 1..=500, default 500.
    #[param(minimum = 1, maximum = 500)]
    limit: Option<usize>,
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/events", tag = "sessions",
    description = "The session's event log, oldest first: what its webhooks deliver (`session.created`, `session.paused`, `session.resumed`, `session.stopped`, `exec.verdict`), kept with its record (after it stopped too), the newest 500. Poll with `after` the last `seq` seen to follow it.",
    params(("id" = String, Path), EventsQuery),
    responses((status = 200, body = SessionEventList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn session_events(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<axum::Json<SessionEventList>> {
    let limit = q.limit.unwrap_or(koder_sessions::EVENTS_PAGE_MAX);
    let after = q.after.unwrap_or(0);
    let page = s.manager.session_events(&who, &id, after, limit).await?;
    Ok(axum::Json(page))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/kill-processes", tag = "sessions",
    description = "Kills every process in the session (a fork bomb, runaway children) and keeps the session running. Followed execs end with verdict SANDBOX-EXEC-KILLED; interpreter contexts restart on their next run.",
    params(("id" = String, Path)),
    responses((status = 200, body = KilledProcesses), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "the session is paused"),
              (status = 410, body = ErrorBody), (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn kill_processes(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<KilledProcesses>> {
    let killed = s.manager.kill_processes(&who, &id).await?;
    Ok(axum::Json(KilledProcesses { killed }))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/resume", tag = "sessions",
    description = "Thaws a memory pause, or boots a session paused to disk afresh on its files (needs a free session slot).",
    params(("id" = String, Path)),
    responses((status = 200, body = Session), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 410, body = ErrorBody), (status = 429, body = ErrorBody), (status = 501, body = ErrorBody), (status = 503, body = ErrorBody),
              (status = 504, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resume(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Session>> {
    Ok(axum::Json(s.manager.resume(&who, &id).await?))
}
