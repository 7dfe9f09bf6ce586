//! E2B snapshots and forks over the manager's state that lasts: a snapshot is a captured
//! filesystem the SDK uses as a template id (`Sandbox.create(snapshot_id)`) and deletes as a
//! template (`DELETE /templates/{id}`); a fork is a new sandbox on a copy of one's filesystem.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use koder_api_types::{CreateSnapshot, Snapshot};
use koder_auth::Identity;
use serde::Deserialize;
use serde_json::{json, Value};

use super::keys::ApiCaller;
use super::{body, live_session, page, sandbox_json, TEMPLATES};
use crate::error::HttpError;
use crate::state::E2b;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NewSnapshot {
    name: Option<String>,
    memory: Option<bool>,
}

/// `SnapshotInfo`: the id is what create takes as `templateID`; `names` lists the name given.
pub fn snapshot_json(s: &Snapshot) -> Value {
    let names: Vec<&str> = s.name.as_deref().into_iter().collect();
    json!({ "snapshotID": s.snapshot_id, "names": names })
}

/// `POST /sandboxes/{id}/snapshots {name?, memory?}` → 201 `SnapshotInfo`. Snapshots keep the
/// filesystem only, so `memory: true` is refused rather than silently downgraded.
pub async fn create(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: NewSnapshot = body(raw).await?;
    if req.memory == Some(true) {
        return Err(HttpError::bad_request(
            "memory snapshots are not supported: a koder-sandbox snapshot keeps the filesystem",
        ));
    }
    live_session(&e2b, &who, &id).await?;
    let snap = e2b
        .manager()
        .snapshot(&who, &id, CreateSnapshot { name: req.name })
        .await?;
    Ok((StatusCode::CREATED, axum::Json(snapshot_json(&snap))).into_response())
}

/// `GET /snapshots?sandboxID&name&limit&nextToken`: the tenant's snapshots, newest first.
pub async fn list(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<Response, HttpError> {
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let (sandbox, name) = (param("sandboxID"), param("name"));
    let mut all: Vec<Snapshot> = e2b
        .manager()
        .list_snapshots(&who)
        .await?
        .into_iter()
        .filter(|s| sandbox.is_none_or(|id| s.session_id.as_deref() == Some(id)))
        .filter(|s| name.is_none_or(|n| s.name.as_deref() == Some(n)))
        .collect();
    all.sort_by(|a, b| (b.created_at, &b.snapshot_id).cmp(&(a.created_at, &a.snapshot_id)));
    let (items, next) = page::page(
        all,
        |s| page::key(s.created_at, &s.snapshot_id),
        &params,
        false,
    )?;
    Ok(page::response(
        items.iter().map(snapshot_json).collect(),
        next,
    ))
}

/// `DELETE /templates/{id}`: how the SDK deletes a snapshot. 404 for an unknown one (the SDK
/// reads it as "already gone"); the built-in templates cannot be deleted.
pub async fn delete_template(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    if TEMPLATES.iter().any(|(t, _)| *t == id) {
        return Err(HttpError::bad_request(format!(
            "{id:?} is a built-in template of koder-sandbox and cannot be deleted"
        )));
    }
    if super::templates::remove(&e2b, &who, &id).await? {
        return Ok(StatusCode::NO_CONTENT);
    }
    match e2b.manager().delete_snapshot(&who, &id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(koder_sessions::Error::SnapshotNotFound) => Err(HttpError::not_found(format!(
            "template or snapshot {id:?} not found"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The snapshot a create's `templateID` names, if it names one of the tenant's.
pub async fn snapshot_template(
    e2b: &E2b,
    who: &Identity,
    template: &str,
) -> Result<Option<String>, HttpError> {
    match e2b.manager().get_snapshot(who, template).await {
        Ok(s) => Ok(Some(s.snapshot_id)),
        Err(koder_sessions::Error::SnapshotNotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct ForkRequest {
    timeout: Option<u64>,
    count: u32,
}

impl Default for ForkRequest {
    fn default() -> Self {
        Self {
            timeout: None,
            count: 1,
        }
    }
}

/// `POST /sandboxes/{id}/fork {timeout?, count?}` → 201 `[{sandbox}]`. The manager forks all
/// or nothing, so a failure is the whole answer's error rather than per-fork entries.
pub async fn fork(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: ForkRequest = body(raw).await?;
    live_session(&e2b, &who, &id).await?;
    let mut forks = e2b.manager().fork(&who, &id, req.count).await?;
    if let Some(timeout) = req.timeout {
        for s in &mut forks {
            *s = e2b.manager().set_timeout(&who, &s.id, timeout).await?;
        }
    }
    let results: Vec<Value> = forks
        .iter()
        .map(|s| json!({ "sandbox": sandbox_json(&e2b, s) }))
        .collect();
    Ok((StatusCode::CREATED, axum::Json(results)).into_response())
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn snap(name: Option<&str>) -> Snapshot {
        Snapshot {
            snapshot_id: "snap-1".into(),
            name: name.map(Into::into),
            size_bytes: 0,
            image: "host".into(),
            language: "bash".into(),
            runtime: "jail".into(),
            session_id: Some("s1".into()),
            created_at: Utc::now(),
            expires_at: Utc::now(),
        }
    }

    #[test]
    fn snapshot_info_wire() {
        assert_eq!(
            snapshot_json(&snap(Some("nightly"))),
            json!({"snapshotID": "snap-1", "names": ["nightly"]})
        );
        assert_eq!(
            snapshot_json(&snap(None)),
            json!({"snapshotID": "snap-1", "names": []})
        );
    }

    #[test]
    fn request_bodies_as_the_sdk_sends_them() {
        let s: NewSnapshot = serde_json::from_str(r#"{"name":"n","memory":false}"#).unwrap();
        assert_eq!((s.name.as_deref(), s.memory), (Some("n"), Some(false)));
        let f: ForkRequest = serde_json::from_str(r#"{"timeout":60}"#).unwrap();
        assert_eq!((f.timeout, f.count), (Some(60), 1));
        let f: ForkRequest = serde_json::from_str(r#"{"timeout":300,"count":2}"#).unwrap();
        assert_eq!(f.count, 2);
    }
}
