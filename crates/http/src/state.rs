//! Snapshots, restore, pause (in memory or to disk), fork: state that outlives a sandbox.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use koder_api_types::{
    CreateSnapshot, ErrorBody, ForkResult, ForkSession, PauseSession, RestoreSnapshot, Session,
    Snapshot, SnapshotList,
};

use crate::error::ApiError;
use crate::extract::{Caller, Json, OptionalJson, Path};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Routes under `/v1/sandbox/sessions`.
pub fn session_routes() -> Router<AppState> {
    Router::new()
        .route("/{id}/snapshot", post(snapshot))
        .route("/{id}/restore", post(restore))
        .route("/{id}/fork", post(fork))
        .route("/{id}/pause", post(pause))
}

/// Routes under `/v1/sandbox/snapshots`.
pub fn snapshot_routes() -> Router<AppState> {
    Router::new()
        .route("/", get(list_snapshots))
        .route("/{id}", get(get_snapshot).delete(delete_snapshot))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/snapshot", tag = "snapshots",
    description = "Captures the session's filesystem (what it changed on top of its image) with its processes frozen for the capture.",
    params(("id" = String, Path)), request_body(content = Option<CreateSnapshot>, description = "optional"),
    responses((status = 201, body = Snapshot), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "the session has ended"), (status = 410, body = ErrorBody),
              (status = 501, body = ErrorBody, description = "no data directory for snapshots"), (status = 504, body = ErrorBody),
              (status = 507, body = ErrorBody, description = "SANDBOX-QUOTA-SNAPSHOT-STORAGE: the tenant's snapshot storage is full")),
    security(("bearer" = [])))]
pub async fn snapshot(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<CreateSnapshot>,
) -> ApiResult<(StatusCode, axum::Json<Snapshot>)> {
    let snap = s.manager.snapshot(&who, &id, req).await?;
    Ok((StatusCode::CREATED, axum::Json(snap)))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/restore", tag = "snapshots",
    description = "Restarts the session's sandbox on the snapshot's filesystem; its processes end, the session (id, limits, network, timeout) stays.",
    params(("id" = String, Path)), request_body = RestoreSnapshot,
    responses((status = 200, body = Session), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 429, body = ErrorBody),
              (status = 500, body = ErrorBody, description = "a stored layer failed its checksum"), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn restore(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Json(req): Json<RestoreSnapshot>,
) -> ApiResult<axum::Json<Session>> {
    Ok(axum::Json(
        s.manager.restore(&who, &id, &req.snapshot_id).await?,
    ))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/fork", tag = "snapshots",
    description = "Makes `count` (1-100) new sessions, each with a copy of the session's filesystem now and its settings; each has its own limits and counts against the quotas. All or nothing.",
    params(("id" = String, Path)), request_body(content = Option<ForkSession>, description = "optional"),
    responses((status = 201, body = ForkResult), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 429, body = ErrorBody),
              (status = 501, body = ErrorBody), (status = 503, body = ErrorBody), (status = 507, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn fork(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<ForkSessionBody>,
) -> ApiResult<(StatusCode, axum::Json<ForkResult>)> {
    let sessions = s.manager.fork(&who, &id, req.0.count).await?;
    Ok((StatusCode::CREATED, axum::Json(ForkResult { sessions })))
}

/// `ForkSession` with its documented default for an empty body.
pub struct ForkSessionBody(ForkSession);

impl Default for ForkSessionBody {
    fn default() -> Self {
        Self(ForkSession { count: 1 })
    }
}

impl<'de> serde::Deserialize<'de> for ForkSessionBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ForkSession::deserialize(d).map(Self)
    }
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/pause", tag = "sessions",
    description = "`memory: true` (default) freezes the processes in place (a jail's are lost if the daemon stops); `memory: false` captures the filesystem durably and stops the sandbox (resume boots it afresh; survives daemon restarts).",
    params(("id" = String, Path)), request_body(content = Option<PauseSession>, description = "optional"),
    responses((status = 200, body = Session), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 410, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 501, body = ErrorBody), (status = 504, body = ErrorBody), (status = 507, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pause(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<PauseSession>,
) -> ApiResult<axum::Json<Session>> {
    let memory = req.memory.unwrap_or(true);
    Ok(axum::Json(
        s.manager.pause_session(&who, &id, memory).await?,
    ))
}

#[utoipa::path(get, path = "/v1/sandbox/snapshots", tag = "snapshots",
    responses((status = 200, body = SnapshotList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_snapshots(
    State(s): State<AppState>,
    Caller(who): Caller,
) -> ApiResult<axum::Json<SnapshotList>> {
    let snapshots = s.manager.list_snapshots(&who).await?;
    Ok(axum::Json(SnapshotList { snapshots }))
}

#[utoipa::path(get, path = "/v1/sandbox/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 200, body = Snapshot), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_snapshot(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Snapshot>> {
    Ok(axum::Json(s.manager.get_snapshot(&who, &id).await?))
}

#[utoipa::path(delete, path = "/v1/sandbox/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_snapshot(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    s.manager.delete_snapshot(&who, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    /// Snapshot, fork and pause take an optional body: generated clients must not demand one.
    #[test]
    fn optional_bodies_are_documented_as_optional() {
        let spec = serde_json::to_value(crate::openapi()).unwrap();
        for op in ["snapshot", "fork", "pause"] {
            let body =
                &spec["paths"][format!("/v1/sandbox/sessions/{{id}}/{op}")]["post"]["requestBody"];
            assert!(body.is_object(), "{op}: {body}");
            assert_ne!(body["required"], true, "{op}: {body}");
        }
    }
}
