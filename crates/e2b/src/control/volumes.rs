//! E2B volumes over the manager's: the team volume API (`/volumes`) and the volume content API
//! (`/volumecontent/{volumeID}/...`), which authenticates with the volume's own token.
//!
//! Tokens are derived from the volume id with the daemon's secret of this run, like envd
//! tokens: a daemon restart rotates them, and `Volume.connect` / `get_info` hand out the new
//! one (docs/E2B-COMPAT.md).

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use koder_api_types::{CreateVolume, EntryType, Volume};
use koder_auth::Identity;
use koder_http::credentials;
use koder_sessions::{VolumeEntry, VolumeMeta};
use serde::Deserialize;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

use super::keys::ApiCaller;
use super::{body, unsupported};
use crate::error::HttpError;
use crate::state::E2b;

pub fn routes() -> Router<E2b> {
    Router::new()
        .route("/volumes", get(list).post(create).fallback(unsupported))
        .route(
            "/volumes/{id}",
            get(info).delete(destroy).fallback(unsupported),
        )
        .route(
            "/volumecontent/{id}/path",
            get(stat)
                .patch(update_metadata)
                .delete(remove)
                .fallback(unsupported),
        )
        .route(
            "/volumecontent/{id}/dir",
            get(list_dir).post(make_dir).fallback(unsupported),
        )
        .route(
            "/volumecontent/{id}/file",
            get(read_file).put(write_file).fallback(unsupported),
        )
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NewVolume {
    name: String,
}

fn volume_json(v: &Volume) -> Value {
    json!({"volumeID": v.volume_id, "name": v.name})
}

fn with_token(e2b: &E2b, v: &Volume) -> Value {
    json!({"volumeID": v.volume_id, "name": v.name, "token": e2b.volume_token(&v.volume_id)})
}

/// Only ids reach the E2B surface: the native API's name lookup must not let a name stand in
/// for the id the SDK passes.
async fn by_id(e2b: &E2b, who: &Identity, id: &str) -> Result<Volume, HttpError> {
    match e2b.manager().get_volume(who, id).await {
        Ok(v) if v.volume_id == id => Ok(v),
        Ok(_) | Err(koder_sessions::Error::VolumeNotFound) => {
            Err(HttpError::not_found(format!("volume {id} not found")))
        }
        Err(e) => Err(e.into()),
    }
}

async fn create(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: NewVolume = body(raw).await?;
    let v = e2b
        .manager()
        .create_volume(
            &who,
            CreateVolume {
                name: req.name,
                size_mib: None,
                from_volume: None,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, axum::Json(with_token(&e2b, &v))).into_response())
}

async fn list(State(e2b): State<E2b>, ApiCaller(who): ApiCaller) -> Result<Response, HttpError> {
    let all = e2b.manager().list_volumes(&who).await?;
    let out: Vec<Value> = all.volumes.iter().map(volume_json).collect();
    Ok(axum::Json(out).into_response())
}

async fn info(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let v = by_id(&e2b, &who, &id).await?;
    Ok(axum::Json(with_token(&e2b, &v)).into_response())
}

async fn destroy(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    by_id(&e2b, &who, &id).await?;
    e2b.manager().delete_volume(&who, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The tenant of the volume in the path, from `Authorization: Bearer <volume token>`.
struct VolumeCaller(Identity, String);

impl FromRequestParts<E2b> for VolumeCaller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, e2b: &E2b) -> Result<Self, HttpError> {
        let Path(id): Path<String> = Path::from_request_parts(parts, e2b)
            .await
            .map_err(|_| HttpError::bad_request("bad volume id"))?;
        let token = parts
            .headers
            .get(credentials::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| HttpError::unauthorized("missing the volume's bearer token"))?;
        if !bool::from(
            token
                .trim()
                .as_bytes()
                .ct_eq(e2b.volume_token(&id).as_bytes()),
        ) {
            return Err(HttpError::unauthorized("invalid volume token"));
        }
        match e2b.manager().volume_tenant(&id).await? {
            Some(who) => {
                e2b.app().limits.check_request(&who.tenant_id)?;
                Ok(VolumeCaller(who, id))
            }
            None => Err(HttpError::not_found(format!("volume {id} not found"))),
        }
    }
}

#[derive(Debug, Deserialize)]
struct PathQuery {
    path: String,
}

#[derive(Debug, Deserialize)]
struct DirQuery {
    path: String,
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct CreateQuery {
    path: String,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MetadataBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

/// `VolumeEntryStat`.
fn entry_json(e: &VolumeEntry) -> Value {
    let kind = match e.entry.kind {
        EntryType::File => "file",
        EntryType::Dir => "directory",
        EntryType::Symlink => "symlink",
        EntryType::Other => "unknown",
    };
    let mut v = json!({
        "name": e.entry.name,
        "type": kind,
        "path": e.entry.path,
        "size": e.entry.size,
        "mode": e.entry.mode,
        "uid": e.entry.uid,
        "gid": e.entry.gid,
        "atime": e.accessed_at.to_rfc3339(),
        "mtime": e.entry.modified_at.to_rfc3339(),
        "ctime": e.changed_at.to_rfc3339(),
    });
    if let Some(t) = &e.entry.symlink_target {
        v["target"] = t.clone().into();
    }
    v
}

async fn stat(
    State(e2b): State<E2b>,
    VolumeCaller(who, id): VolumeCaller,
    Query(q): Query<PathQuery>,
) -> Result<Response, HttpError> {
    let e = e2b.manager().volume_stat(&who, &id, &q.path).await?;
    Ok(axum::Json(entry_json(&e)).into_response())
}

async fn update_metadata(
    State(e2b): State<E2b>,
    VolumeCaller(who, id): VolumeCaller,
    Query(q): Query<PathQuery>,
    raw: Body,
) -> Result<Response, HttpError> {
    let b: MetadataBody = body(raw).await?;
    let meta = VolumeMeta {
        uid: b.uid,
        gid: b.gid,
        mode: b.mode,
    };
    let e = e2b
        .manager()
        .volume_set_metadata(&who, &id, &q.path, meta)
        .await?;
    Ok(axum::Json(entry_json(&e)).into_response())
}

async fn remove(
    State(e2b): State<E2b>,
    VolumeCaller(who, id): VolumeCaller,
    Query(q): Query<PathQuery>,
) -> Result<Response, HttpError> {
    e2b.manager().volume_remove(&who, &id, &q.path).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_dir(
    State(e2b): State<E2b>,
    VolumeCaller(who, id): VolumeCaller,
    Query(q): Query<DirQuery>,
) -> Result<Response, HttpError> {
    let entries = e2b
        .manager()
        .volume_list(&who, &id, &q.path, q.depth.unwrap_or(1))
        .await?;
    let out: Vec<Value> = entries.iter().map(entry_json).collect();
    Ok(axum::Json(out).into_response())
}

async fn make_dir(
    State(e2b): State<E2b>,
    VolumeCaller(who, id): VolumeCaller,
    Query(q): Query<CreateQuery>,
) -> Result<Response, HttpError> {
    let meta = VolumeMeta {
        uid: q.uid,
        gid: q.gid,
        mode: q.mode,
    };
    let e = e2b
        .manager()
        .volume_make_dir(&who, &id, &q.path, q.force.unwrap_or(false), meta)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(entry_json(&e))).into_response())
}

async fn read_file(
    State(e2b): State<E2b>,
    VolumeCaller(who, id): VolumeCaller,
    Query(q): Query<PathQuery>,
) -> Result<Response, HttpError> {
    let f = e2b.manager().volume_download(&who, &id, &q.path).await?;
    Ok(koder_http::volume_file_response(f))
}

async fn write_file(
    State(e2b): State<E2b>,
    VolumeCaller(who, id): VolumeCaller,
    Query(q): Query<CreateQuery>,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, HttpError> {
    let declared = koder_http::declared_length(&headers);
    let meta = VolumeMeta {
        uid: q.uid,
        gid: q.gid,
        mode: q.mode,
    };
    let e = e2b
        .manager()
        .volume_upload(
            &who,
            &id,
            &q.path,
            q.force.unwrap_or(false),
            meta,
            declared,
            raw.into_data_stream(),
        )
        .await?;
    Ok((StatusCode::CREATED, axum::Json(entry_json(&e))).into_response())
}
