//! E2B's secrets API (`/secrets`), which the SDK's `Secret` class calls: create, list (paged),
//! get, update (a new version) and destroy, a secret named by its id (`sec_...`) or its name.
//! Values are write-only: no answer carries one.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use koder_sessions::E2bSecret;
use serde::Deserialize;
use serde_json::{json, Value};

use super::keys::ApiCaller;
use super::{body, page, time, unsupported};
use crate::error::HttpError;
use crate::state::E2b;

pub fn routes() -> Router<E2b> {
    Router::new()
        .route("/secrets", get(list).post(create).fallback(unsupported))
        .route(
            "/secrets/{id}",
            get(info).post(update).delete(destroy).fallback(unsupported),
        )
}

/// `NewSecret`, and `SecretUpdate` without its name.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SecretBody {
    name: Option<String>,
    value: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
}

impl SecretBody {
    fn value(&self) -> Result<&str, HttpError> {
        self.value
            .as_deref()
            .ok_or_else(|| HttpError::bad_request("a secret needs a value"))
    }
}

/// E2B's `Secret`: everything but the value; `metadata` always there.
fn secret_json(s: &E2bSecret) -> Value {
    json!({
        "secretID": s.id,
        "name": s.name,
        "currentVersion": s.version,
        "metadata": s.metadata,
        "createdAt": time(s.created_at),
        "updatedAt": time(s.updated_at),
    })
}

/// `POST /secrets {name, value, metadata?}` → 201; a name the tenant has is 409.
async fn create(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: SecretBody = body(raw).await?;
    let name = req
        .name
        .as_deref()
        .ok_or_else(|| HttpError::bad_request("a secret needs a name"))?;
    let secret = e2b
        .manager()
        .create_e2b_secret(
            &who,
            name,
            req.value()?,
            req.metadata.clone().unwrap_or_default(),
        )
        .await?;
    Ok((StatusCode::CREATED, axum::Json(secret_json(&secret))).into_response())
}

/// `GET /secrets?limit&nextToken`: the tenant's secrets, oldest first.
async fn list(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<Response, HttpError> {
    let all = e2b.manager().e2b_secrets(&who).await?;
    let (items, next) = page::page(all, |s| page::key(s.created_at, &s.id), &params, true)?;
    Ok(page::response(
        items.iter().map(secret_json).collect(),
        next,
    ))
}

async fn info(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let secret = e2b.manager().e2b_secret(&who, &id).await?;
    Ok(axum::Json(secret_json(&secret)).into_response())
}

/// `POST /secrets/{id} {value, metadata?}`: the value as the next version; metadata, when
/// given, replaces the secret's.
async fn update(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: SecretBody = body(raw).await?;
    if req.name.is_some() {
        return Err(HttpError::bad_request("a secret's name cannot be changed"));
    }
    let secret = e2b
        .manager()
        .update_e2b_secret(&who, &id, req.value()?, req.metadata.clone())
        .await?;
    Ok(axum::Json(secret_json(&secret)).into_response())
}

async fn destroy(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    e2b.manager().delete_e2b_secret(&who, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
