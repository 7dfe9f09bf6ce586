//! Volumes: a tenant's named, persistent directories, and their file API without a session.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use koder_api_types::{CreateVolume, ErrorBody, FileEntry, FileList, Volume, VolumeList};
use koder_sessions::{VolumeFile, VolumeMeta};
use serde::Deserialize;

use crate::error::ApiError;
use crate::extract::{Caller, Json, Path, Query};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Routes under `/v1/sandbox/volumes`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", post(create_volume).get(list_volumes))
        .route("/{volume}", get(get_volume).delete(delete_volume))
        .route(
            "/{volume}/files",
            get(download).put(upload).delete(remove).patch(set_metadata),
        )
        .route("/{volume}/files/list", get(list_files))
        .route("/{volume}/files/stat", get(stat))
        .route("/{volume}/files/mkdir", post(make_dir))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct VolumePath {
    /// Path inside the volume, from its root: `/notes/a.txt` (no `..` component).
    #[param(min_length = 1, max_length = 4096, pattern = "^/[^\\x00]*$")]
    path: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct VolumeListQuery {
    #[param(min_length = 1, max_length = 4096, pattern = "^/[^\\x00]*$")]
    path: String,
    /// 1–32 levels (default 1).
    #[serde(default = "one")]
    #[param(minimum = 1, maximum = 32)]
    depth: u32,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct UploadQuery {
    #[param(min_length = 1, max_length = 4096, pattern = "^/[^\\x00]*$")]
    path: String,
    /// Replace an existing file (default: refuse with 409).
    #[serde(default)]
    overwrite: bool,
    /// Owner inside sandboxes, 0..=65535 (default 1000, the sandbox's `user`).
    #[param(maximum = 65535)]
    uid: Option<u32>,
    #[param(maximum = 65535)]
    gid: Option<u32>,
    /// Permission bits, at most 0o7777 (default 0644).
    #[param(maximum = 4095)]
    mode: Option<u32>,
}

/// `POST .../files/mkdir`
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMakeDir {
    #[schema(min_length = 1, max_length = 4096, pattern = "^/[^\\x00]*$")]
    path: String,
    /// Create missing parents; an existing directory is then fine.
    #[serde(default)]
    parents: bool,
    /// Owner inside sandboxes, 0..=65535.
    #[schema(maximum = 65535)]
    uid: Option<u32>,
    #[schema(maximum = 65535)]
    gid: Option<u32>,
    /// Permission bits, at most 0o7777 (default 0755).
    #[schema(maximum = 4095)]
    mode: Option<u32>,
}

/// `PATCH .../files`: what is left out stays.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMetadata {
    /// Owner inside sandboxes, 0..=65535.
    #[schema(maximum = 65535)]
    uid: Option<u32>,
    #[schema(maximum = 65535)]
    gid: Option<u32>,
    /// Permission bits, at most 0o7777.
    #[schema(maximum = 4095)]
    mode: Option<u32>,
}

#[utoipa::path(post, path = "/v1/sandbox/volumes", tag = "volumes",
    description = "Creates an empty volume with a size quota (ext4 image or btrfs subvolume, per host).",
    request_body = CreateVolume,
    responses((status = 201, body = Volume), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody, description = "`from_volume` names no volume of this tenant"),
              (status = 409, body = ErrorBody, description = "a volume of that name exists"),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
              (status = 501, body = ErrorBody, description = "no volumes on this server"),
              (status = 507, body = ErrorBody, description = "SANDBOX-QUOTA-VOLUME-STORAGE: the tenant's volumes are at their quota")),
    security(("bearer" = [])))]
pub async fn create_volume(
    State(s): State<AppState>,
    Caller(who): Caller,
    Json(req): Json<CreateVolume>,
) -> ApiResult<(StatusCode, axum::Json<Volume>)> {
    Ok((
        StatusCode::CREATED,
        axum::Json(s.manager.create_volume(&who, req).await?),
    ))
}

#[utoipa::path(get, path = "/v1/sandbox/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList), (status = 401, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_volumes(
    State(s): State<AppState>,
    Caller(who): Caller,
) -> ApiResult<axum::Json<VolumeList>> {
    Ok(axum::Json(s.manager.list_volumes(&who).await?))
}

#[utoipa::path(get, path = "/v1/sandbox/volumes/{volume}", tag = "volumes",
    params(("volume" = String, Path, description = "volume id or name")),
    responses((status = 200, body = Volume), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_volume(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
) -> ApiResult<axum::Json<Volume>> {
    Ok(axum::Json(s.manager.get_volume(&who, &volume).await?))
}

#[utoipa::path(delete, path = "/v1/sandbox/volumes/{volume}", tag = "volumes",
    description = "Deletes a volume no session has mounted; its data is purged after the server's grace period.",
    params(("volume" = String, Path, description = "volume id or name")),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "SANDBOX-VOLUME-BUSY: a session has it mounted"), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_volume(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
) -> ApiResult<StatusCode> {
    s.manager.delete_volume(&who, &volume).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(put, path = "/v1/sandbox/volumes/{volume}/files", tag = "volumes",
    params(("volume" = String, Path), UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = FileEntry), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody, description = "no such volume, or the parent directory is missing"),
              (status = 409, body = ErrorBody, description = "the file exists and overwrite is false, or the path is a directory"),
              (status = 413, body = ErrorBody), (status = 501, body = ErrorBody),
              (status = 507, body = ErrorBody, description = "SANDBOX-FS-QUOTA-EXCEEDED: the volume is full")),
    security(("bearer" = [])))]
pub async fn upload(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
    Query(q): Query<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<FileEntry>)> {
    let declared = crate::declared_length(&headers);
    let meta = VolumeMeta {
        uid: q.uid,
        gid: q.gid,
        mode: q.mode,
    };
    let e = s
        .manager
        .volume_upload(
            &who,
            &volume,
            &q.path,
            q.overwrite,
            meta,
            declared,
            body.into_data_stream(),
        )
        .await?;
    Ok((StatusCode::CREATED, axum::Json(e.entry)))
}

#[utoipa::path(get, path = "/v1/sandbox/volumes/{volume}/files", tag = "volumes",
    params(("volume" = String, Path), VolumePath),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn download(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
    Query(q): Query<VolumePath>,
) -> ApiResult<Response> {
    let f = s.manager.volume_download(&who, &volume, &q.path).await?;
    Ok(file_response(f))
}

/// A volume file as an `application/octet-stream` answer of its length (the E2B surface
/// answers its downloads the same way).
pub fn file_response(f: VolumeFile) -> Response {
    let size = f.size;
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(f.into_stream()),
    )
        .into_response()
}

#[utoipa::path(delete, path = "/v1/sandbox/volumes/{volume}/files", tag = "volumes",
    description = "Removes a file, a symlink or a directory with everything in it.",
    params(("volume" = String, Path), VolumePath),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn remove(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
    Query(q): Query<VolumePath>,
) -> ApiResult<StatusCode> {
    s.manager.volume_remove(&who, &volume, &q.path).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(patch, path = "/v1/sandbox/volumes/{volume}/files", tag = "volumes",
    params(("volume" = String, Path), VolumePath), request_body = VolumeMetadata,
    responses((status = 200, body = FileEntry), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set_metadata(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
    Query(q): Query<VolumePath>,
    Json(req): Json<VolumeMetadata>,
) -> ApiResult<axum::Json<FileEntry>> {
    let meta = VolumeMeta {
        uid: req.uid,
        gid: req.gid,
        mode: req.mode,
    };
    let e = s
        .manager
        .volume_set_metadata(&who, &volume, &q.path, meta)
        .await?;
    Ok(axum::Json(e.entry))
}

#[utoipa::path(get, path = "/v1/sandbox/volumes/{volume}/files/list", tag = "volumes",
    params(("volume" = String, Path), VolumeListQuery),
    responses((status = 200, body = FileList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_files(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
    Query(q): Query<VolumeListQuery>,
) -> ApiResult<axum::Json<FileList>> {
    let entries = s
        .manager
        .volume_list(&who, &volume, &q.path, q.depth)
        .await?;
    Ok(axum::Json(FileList {
        entries: entries.into_iter().map(|e| e.entry).collect(),
        truncated: false,
    }))
}

#[utoipa::path(get, path = "/v1/sandbox/volumes/{volume}/files/stat", tag = "volumes",
    params(("volume" = String, Path), VolumePath),
    responses((status = 200, body = FileEntry), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn stat(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
    Query(q): Query<VolumePath>,
) -> ApiResult<axum::Json<FileEntry>> {
    Ok(axum::Json(
        s.manager.volume_stat(&who, &volume, &q.path).await?.entry,
    ))
}

#[utoipa::path(post, path = "/v1/sandbox/volumes/{volume}/files/mkdir", tag = "volumes",
    params(("volume" = String, Path)), request_body = VolumeMakeDir,
    responses((status = 201, body = FileEntry), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "it exists (without parents), or a parent is not a directory"), (status = 501, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn make_dir(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(volume): Path<String>,
    Json(req): Json<VolumeMakeDir>,
) -> ApiResult<(StatusCode, axum::Json<FileEntry>)> {
    let meta = VolumeMeta {
        uid: req.uid,
        gid: req.gid,
        mode: req.mode,
    };
    let e = s
        .manager
        .volume_make_dir(&who, &volume, &req.path, req.parents, meta)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(e.entry)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_volume_route_is_documented_with_its_error_statuses() {
        let spec = serde_json::to_value(crate::openapi()).unwrap();
        let paths = &spec["paths"];
        for (path, methods) in [
            ("/v1/sandbox/volumes", &["post", "get"][..]),
            ("/v1/sandbox/volumes/{volume}", &["get", "delete"]),
            (
                "/v1/sandbox/volumes/{volume}/files",
                &["get", "put", "delete", "patch"],
            ),
            ("/v1/sandbox/volumes/{volume}/files/list", &["get"]),
            ("/v1/sandbox/volumes/{volume}/files/stat", &["get"]),
            ("/v1/sandbox/volumes/{volume}/files/mkdir", &["post"]),
        ] {
            for m in methods {
                let op = &paths[path][m];
                assert!(op.is_object(), "{m} {path} is not documented");
                for status in ["401", "404", "501"] {
                    if path == "/v1/sandbox/volumes" && status == "404" {
                        continue;
                    }
                    assert!(
                        op["responses"][status].is_object(),
                        "{m} {path} lacks {status}"
                    );
                }
            }
        }
        let sessions = &paths["/v1/sandbox/sessions"]["post"]["responses"];
        assert!(sessions["409"].is_object() && sessions["501"].is_object());
        let create = &paths["/v1/sandbox/volumes"]["post"]["responses"];
        assert!(create["507"].is_object() && create["409"].is_object());
        assert!(spec["components"]["schemas"]["Volume"].is_object());
    }
}
