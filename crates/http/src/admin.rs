//! Operator endpoints (admin key only): tenants, their plan and quotas, and key issuance.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use koder_api_types::{codes, ErrorBody, IssuedKey, PutTenant, TenantInfo, TenantList};
use koder_store::Tenant;

use crate::error::ApiError;
use crate::extract::{AdminCaller, Json, Path};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

async fn info(s: &AppState, t: Tenant) -> ApiResult<TenantInfo> {
    let (live, minutes) = s.manager.tenant_usage(&t.id).await?;
    Ok(TenantInfo {
        id: t.id,
        name: t.name,
        plan: t.plan,
        max_sessions: t.max_sessions,
        daily_session_minutes: t.daily_session_minutes,
        created_at: t.created_at,
        live_sessions: live,
        session_minutes_today: minutes,
    })
}

async fn tenant(s: &AppState, id: &str) -> ApiResult<Tenant> {
    s.manager
        .store()
        .get_tenant(id)
        .await
        .map_err(koder_sessions::Error::from)?
        .ok_or_else(|| ApiError::new(404, codes::NOT_FOUND, format!("no tenant {id:?}")))
}

#[utoipa::path(get, path = "/v1/sandbox/admin/tenants", tag = "admin",
    responses((status = 200, body = TenantList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_tenants(
    State(s): State<AppState>,
    _: AdminCaller,
) -> ApiResult<axum::Json<TenantList>> {
    let all = s
        .manager
        .store()
        .list_tenants()
        .await
        .map_err(koder_sessions::Error::from)?;
    let mut tenants = Vec::with_capacity(all.len());
    for t in all {
        tenants.push(info(&s, t).await?);
    }
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
    let t = tenant(&s, &id).await?;
    Ok(axum::Json(info(&s, t).await?))
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
    if !koder_auth::valid_tenant(&id) {
        return Err(ApiError::invalid(
            "tenant id: 1-64 characters of [A-Za-z0-9_-]",
        ));
    }
    if req.plan.is_empty() || req.plan.len() > 64 {
        return Err(ApiError::invalid("plan must be 1-64 characters"));
    }
    let store = s.manager.store();
    let existing = store
        .get_tenant(&id)
        .await
        .map_err(koder_sessions::Error::from)?;
    let t = Tenant {
        name: req
            .name
            .or_else(|| existing.as_ref().map(|t| t.name.clone()))
            .unwrap_or_else(|| id.clone()),
        created_at: existing.map_or_else(Utc::now, |t| t.created_at),
        id,
        plan: req.plan,
        max_sessions: req.max_sessions,
        daily_session_minutes: req.daily_session_minutes,
    };
    store
        .upsert_tenant(&t)
        .await
        .map_err(koder_sessions::Error::from)?;
    Ok(axum::Json(info(&s, t).await?))
}

#[utoipa::path(post, path = "/v1/sandbox/admin/tenants/{id}/keys", tag = "admin",
    params(("id" = String, Path)),
    responses((status = 201, body = IssuedKey), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn issue_key(
    State(s): State<AppState>,
    _: AdminCaller,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, axum::Json<IssuedKey>)> {
    let t = tenant(&s, &id).await?;
    let key = koder_auth::generate_key();
    let hash = koder_auth::hash_key(&key);
    s.manager
        .store()
        .put_api_key(&hash, &t.id, "issued")
        .await
        .map_err(koder_sessions::Error::from)?;
    s.keys
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert_hash(hash, t.id.clone());
    Ok((
        StatusCode::CREATED,
        axum::Json(IssuedKey {
            tenant_id: t.id,
            api_key: key,
        }),
    ))
}
