//! Egress routes: `PUT /v1/sandbox/sessions/{id}/network` replaces a running session's
//! policy; `/v1/sandbox/secrets` holds the values egress injects.

use axum::extract::State;
use axum::http::StatusCode;
use koder_api_types::{CreateSecret, ErrorBody, Network, Secret, SecretList, Session};

use crate::error::ApiError;
use crate::extract::{Caller, Json, Path};
use crate::AppState;

#[utoipa::path(put, path = "/v1/sandbox/sessions/{id}/network", tag = "network",
    description = "Replaces the session's network policy (mode, allow, deny: as on create). New connections and lookups are decided by it at once; open connections keep running. Audited (`proto: policy`).",
    params(("id" = String, Path)), request_body = Network,
    responses((status = 200, body = Session),
              (status = 400, body = ErrorBody, description = "SANDBOX-NETWORK-RULE: an entry is malformed, a loopback address (the sandbox's own loopback, never reachable through egress) or a private range outside the server's `[network] internal`; SANDBOX-INVALID-ARGUMENT: allow without mode allowlist, deny with mode none"),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "the session has ended, or was created with network mode none (its sandbox has no egress path)"),
              (status = 410, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set_network(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Json(req): Json<Network>,
) -> Result<axum::Json<Session>, ApiError> {
    Ok(axum::Json(s.manager.set_network(&who, &id, req).await?))
}

#[utoipa::path(post, path = "/v1/sandbox/secrets", tag = "network",
    description = "Creates or replaces the tenant's secret. The value is write-only (never returned) and stored encrypted. A session created with `\"secrets\": [name]` sees a random placeholder in its environment under the name; egress replaces it with the value in the request headers of plain-HTTP connections to the secret's hosts.",
    request_body = CreateSecret,
    responses((status = 201, body = Secret),
              (status = 400, body = ErrorBody, description = "SANDBOX-INVALID-ARGUMENT (name, value) or SANDBOX-NETWORK-RULE (a host entry)"),
              (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_secret(
    State(s): State<AppState>,
    Caller(who): Caller,
    Json(req): Json<CreateSecret>,
) -> Result<(StatusCode, axum::Json<Secret>), ApiError> {
    Ok((
        StatusCode::CREATED,
        axum::Json(s.manager.put_secret(&who, req).await?),
    ))
}

#[utoipa::path(get, path = "/v1/sandbox/secrets", tag = "network",
    responses((status = 200, body = SecretList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_secrets(
    State(s): State<AppState>,
    Caller(who): Caller,
) -> Result<axum::Json<SecretList>, ApiError> {
    Ok(axum::Json(SecretList {
        secrets: s.manager.list_secrets(&who).await?,
    }))
}

#[utoipa::path(delete, path = "/v1/sandbox/secrets/{name}", tag = "network",
    params(("name" = String, Path)),
    responses((status = 204), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody, description = "SANDBOX-SECRET-NOT-FOUND")),
    security(("bearer" = [])))]
pub async fn delete_secret(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.manager.delete_secret(&who, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub fn secret_routes() -> axum::Router<AppState> {
    use axum::routing::{delete, post};
    axum::Router::new()
        .route("/", post(put_secret).get(list_secrets))
        .route("/{name}", delete(delete_secret))
}
