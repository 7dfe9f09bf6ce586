//! Operator endpoints (admin key only): tenants, their plan and quotas, and key issuance; the
//! nodes sharing the store.

use axum::extract::State;
use axum::http::StatusCode;
use koder_api_types::{ErrorBody, IssuedKey, NodeList, PutTenant, TenantInfo, TenantList};

use crate::error::ApiError;
use crate::extract::{AdminCaller, Json, Path};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

#[utoipa::path(get, path = "/v1/sandbox/admin/tenants", tag = "admin",
    responses((status = 200, body = TenantList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_tenants(
    State(s): State<AppState>,
    _: AdminCaller,
) -> ApiResult<axum::Json<TenantList>> {
    let tenants = s.manager.list_tenants().await?;
    Ok(axum::Json(TenantList { tenants }))
}

#[utoipa::path(get, path = "/v1/sandbox/admin/tenants/{id}", tag = "admin",
    params(("id" = String, Path)),
    responses((status = 200, body = TenantInfo), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_tenant(
    State(s): State<AppState>,
    _: AdminCaller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<TenantInfo>> {
    Ok(axum::Json(s.manager.get_tenant(&id).await?))
}

#[utoipa::path(put, path = "/v1/sandbox/admin/tenants/{id}", tag = "admin",
    params(("id" = String, Path)), request_body = PutTenant,
    responses((status = 200, body = TenantInfo), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_tenant(
    State(s): State<AppState>,
    _: AdminCaller,
    Path(id): Path<String>,
    Json(req): Json<PutTenant>,
) -> ApiResult<axum::Json<TenantInfo>> {
    Ok(axum::Json(s.manager.put_tenant(&id, req).await?))
}

#[utoipa::path(post, path = "/v1/sandbox/admin/tenants/{id}/keys", tag = "admin",
    params(("id" = String, Path)),
    description = "A new API key of the tenant, usable at once; the key is only in this answer.",
    responses((status = 201, body = IssuedKey), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody, description = "no such tenant"),
              (status = 409, body = ErrorBody, description = "static API keys are disabled on this server (`env = \"prod\"`)")),
    security(("bearer" = [])))]
pub async fn issue_key(
    State(s): State<AppState>,
    _: AdminCaller,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, axum::Json<IssuedKey>)> {
    let issued = s.manager.issue_key(&s.auth, &id).await?;
    Ok((StatusCode::CREATED, axum::Json(issued)))
}

#[utoipa::path(get, path = "/v1/sandbox/admin/nodes", tag = "admin",
    responses((status = 200, body = NodeList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_nodes(
    State(s): State<AppState>,
    _: AdminCaller,
) -> ApiResult<axum::Json<NodeList>> {
    let nodes = s.manager.list_nodes().await?;
    Ok(axum::Json(NodeList { nodes }))
}
