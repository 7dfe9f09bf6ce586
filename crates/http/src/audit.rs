//! `GET /v1/sandbox/audit/network`: the tenant's record of sandbox connection attempts.

use axum::extract::State;
use koder_api_types::{AuditEntry, AuditPage, ErrorBody};
use serde::Deserialize;

use crate::error::ApiError;
use crate::extract::{Caller, Query};
use crate::AppState;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    session_id: Option<String>,
    allowed: Option<bool>,
    /// Entries older than this id (from `next_before` of the previous page).
    before: Option<i64>,
    /// 1..=1000, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

#[utoipa::path(get, path = "/v1/sandbox/audit/network", tag = "network",
    params(AuditQuery),
    responses((status = 200, body = AuditPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn network(
    State(s): State<AppState>,
    Caller(who): Caller,
    Query(q): Query<AuditQuery>,
) -> Result<axum::Json<AuditPage>, ApiError> {
    let limit = q.limit.unwrap_or(100);
    let records = s
        .manager
        .network_audit(&who, q.session_id.as_deref(), q.allowed, q.before, limit)
        .await?;
    let next_before = (records.len() == limit as usize)
        .then(|| records.last().map(|r| r.id))
        .flatten();
    Ok(axum::Json(AuditPage {
        entries: records
            .into_iter()
            .map(|r| AuditEntry {
                id: r.id,
                at: r.at,
                session_id: r.session_id,
                proto: r.proto,
                dest: r.dest,
                port: r.port,
                name: r.name,
                allowed: r.allowed,
                reason: r.reason,
            })
            .collect(),
        next_before,
    }))
}
